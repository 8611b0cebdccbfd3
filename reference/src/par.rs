//! Work spread over all cores: [`map_by_cost`].
//!
//! The reference's parallel loops (the grouped GEMM's jobs, the comparison's groups) have
//! items of very different sizes — a hot expert with thousands of rows beside experts with a
//! handful — so a plain split in equal counts leaves one core idle at the end. Items are
//! sorted by cost, largest first, and handed to rayon's pool one at a time (its idle threads
//! steal what is left), so the largest start first and the small ones fill in at the end.
//! rayon replaced a pool of scoped threads started per call (even-numbered workers taking the
//! largest remaining item, odd-numbered ones the smallest): on the mid-size case it measured
//! faster (docs/performance.md).

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rayon::prelude::*;

/// Total cost below which the items run on the calling thread: starting threads costs tens of
/// microseconds, more than the work of a small case (a property campaign runs thousands).
pub const SERIAL_BELOW: usize = 1 << 20;

/// How far the outermost [`map_by_cost`] call running now has got: the cost of the items
/// done, out of its total, and the time since it started. What a progress display reads
/// ([`meter`]); calls made from inside a mapped item do not move it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Meter {
    pub done: u64,
    pub total: u64,
    pub elapsed: Duration,
}

/// When the outermost call started, and its total cost.
static STARTED: Mutex<Option<(Instant, u64)>> = Mutex::new(None);
static DONE: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Whether this thread is inside a [`map_by_cost`] call (its caller or one of its workers).
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// The latest outermost [`map_by_cost`] call's progress (`None` before the first one).
pub fn meter() -> Option<Meter> {
    let started = *STARTED.lock().unwrap_or_else(|e| e.into_inner());
    started.map(|(at, total)| Meter {
        done: DONE.load(Ordering::Relaxed).min(total),
        total,
        elapsed: at.elapsed(),
    })
}

/// Marks this thread as inside a call until dropped (restoring what it was).
struct Inside(bool);

impl Inside {
    fn enter() -> Inside {
        Inside(INSIDE.with(|i| i.replace(true)))
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        INSIDE.with(|i| i.set(self.0));
    }
}

/// `f(item)` for every item, on all available cores, largest `cost` first (see the module
/// docs). The results come back in the order of `items`, whatever the schedule. The
/// outermost call reports its progress to [`meter`].
///
/// ```
/// let squares = moecheck_reference::par::map_by_cost(vec![3usize, 1, 2], |x| *x, |x| x * x);
/// assert_eq!(squares, vec![9, 1, 4]);
/// ```
pub fn map_by_cost<T, R, C, F>(items: Vec<T>, cost: C, f: F) -> Vec<R>
where
    T: Send,
    R: Send,
    C: Fn(&T) -> usize,
    F: Fn(T) -> R + Sync,
{
    let count = items.len();
    let mut order: Vec<(usize, usize, T)> = items
        .into_iter()
        .enumerate()
        .map(|(i, item)| (i, cost(&item), item))
        .collect();
    order.sort_by_key(|&(i, c, _)| (std::cmp::Reverse(c), i));
    let total = order
        .iter()
        .fold(0usize, |t, &(_, c, _)| t.saturating_add(c));
    let outer = !INSIDE.with(Cell::get);
    if outer {
        DONE.store(0, Ordering::Relaxed);
        *STARTED.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), total as u64));
    }
    let _inside = Inside::enter();
    let advance = |c: usize| {
        if outer {
            DONE.fetch_add(c as u64, Ordering::Relaxed);
        }
    };
    let threads = if total < SERIAL_BELOW {
        1
    } else {
        std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(count)
    };
    let mut results: Vec<Option<R>> = (0..count).map(|_| None).collect();
    if threads <= 1 {
        for (i, c, item) in order {
            results[i] = Some(f(item));
            advance(c);
        }
    } else {
        // rayon's pool (started once per process, its threads reused by every call) takes
        // the items largest first, one at a time (`with_max_len(1)`), and steals the rest.
        let done: Vec<(usize, R)> = order
            .into_par_iter()
            .with_max_len(1)
            .map(|(i, c, item)| {
                let _inside = Inside::enter();
                let r = f(item);
                advance(c);
                (i, r)
            })
            .collect();
        for (i, r) in done {
            results[i] = Some(r);
        }
    }
    results
        .into_iter()
        .map(|r| r.expect("every item was mapped"))
        .collect()
}

/// `f(dst_rows, src_rows)` over matching blocks of rows of `dst` and `src` (the same number
/// of rows), the blocks in parallel ([`map_by_cost`], each about 64 Ki elements): for
/// element-wise work on large arrays (quantising an operand).
///
/// # Panics
/// When the row counts differ.
pub fn zip_rows<A: Send, B: Sync>(
    mut dst: ndarray::ArrayViewMut2<A>,
    src: ndarray::ArrayView2<B>,
    f: impl Fn(ndarray::ArrayViewMut2<A>, ndarray::ArrayView2<B>) + Sync,
) {
    assert_eq!(dst.nrows(), src.nrows(), "zip_rows: row counts");
    let rows = (65_536 / src.ncols().max(1)).max(1);
    let blocks: Vec<_> = dst
        .axis_chunks_iter_mut(ndarray::Axis(0), rows)
        .zip(src.axis_chunks_iter(ndarray::Axis(0), rows))
        .collect();
    // A step of larger work: it does not move the progress meter.
    let _inside = Inside::enter();
    map_by_cost(blocks, |(_, s)| s.len(), |(d, s)| f(d, s));
}

/// Every element of `data` set to `value`, blocks of 64 Ki elements in parallel
/// ([`map_by_cost`]): a large freshly allocated array is first touched by every core at once
/// (on a virtual machine the host backs each new page as it is first written, which one core
/// alone does at well under the speed of the work that follows).
pub fn fill<T: Copy + Send + Sync>(data: &mut [T], value: T) {
    let blocks: Vec<&mut [T]> = data.chunks_mut(65_536).collect();
    // A step of larger work: it does not move the progress meter.
    let _inside = Inside::enter();
    map_by_cost(blocks, |b| b.len(), |b| b.fill(value));
}

/// Whether `ok` holds for every block of `data` (blocks of 64 Ki elements, in parallel through
/// [`map_by_cost`]): one read of a large array on every core. `ok` sees a whole block, so it
/// can test it without stopping at the first failure (a loop the compiler vectorises).
pub fn all<T: Sync>(data: &[T], ok: impl Fn(&[T]) -> bool + Sync) -> bool {
    let blocks: Vec<&[T]> = data.chunks(65_536).collect();
    // A step of larger work: it does not move the progress meter.
    let _inside = Inside::enter();
    map_by_cost(blocks, |b| b.len(), ok).into_iter().all(|b| b)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every element is set, across block edges and in the last partial block.
    #[test]
    fn fill_sets_every_element() {
        // Past SERIAL_BELOW the blocks run on several threads.
        for len in [0, 1, 65_535, 65_536, 65_537, 300_001, SERIAL_BELOW + 70_001] {
            let mut v = vec![1.5f32; len];
            v.iter_mut().step_by(7).for_each(|x| *x = -2.0);
            fill(&mut v, f32::NAN);
            assert!(v.iter().all(|x| x.is_nan()), "{len}");
        }
    }

    /// `all` is the serial answer, whichever block holds the one failing element (past
    /// SERIAL_BELOW the blocks run on several threads).
    #[test]
    fn all_finds_a_failure_in_any_block() {
        let len = SERIAL_BELOW + 70_001;
        let mut v = vec![1u8; len];
        assert!(all(&v, |b| b.iter().all(|x| *x == 1)));
        for bad in [0, 65_535, 65_536, len / 2, len - 1] {
            v[bad] = 0;
            assert!(!all(&v, |b| b.iter().all(|x| *x == 1)), "{bad}");
            v[bad] = 1;
        }
        assert!(all(&[] as &[u8], |_| false));
    }

    /// Every row pair is visited once, in blocks that match row for row, tail block included.
    #[test]
    fn zip_rows_visits_every_row_once() {
        for (rows, cols) in [(0, 3), (1, 1), (5000, 300), (40_000, 33), (3, 0)] {
            let src = ndarray::Array2::from_shape_fn((rows, cols), |(r, c)| (r * 7 + c) as u64);
            let mut dst = ndarray::Array2::<u64>::zeros((rows, cols));
            zip_rows(dst.view_mut(), src.view(), |mut d, s| {
                d.zip_mut_with(&s, |x, &y| *x += y + 1);
            });
            assert_eq!(dst, src.mapv(|v| v + 1), "{rows} x {cols}");
        }
    }

    /// Results are in input order whatever the costs, with every item mapped exactly once, on
    /// the calling thread (small total cost) and on several.
    #[test]
    fn results_keep_the_input_order() {
        let items: Vec<usize> = (0..1000).map(|i| (i * 7919) % 1000).collect();
        for scale in [1, 10_000] {
            let calls = std::sync::atomic::AtomicUsize::new(0);
            let here = std::thread::current().id();
            let elsewhere = std::sync::atomic::AtomicBool::new(false);
            let out = map_by_cost(
                items.clone(),
                |x| *x * scale,
                |x| {
                    calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if std::thread::current().id() != here {
                        elsewhere.store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                    x + 1
                },
            );
            assert_eq!(out, items.iter().map(|x| x + 1).collect::<Vec<_>>());
            assert_eq!(calls.into_inner(), 1000);
            let parallel = std::thread::available_parallelism().map_or(1, |n| n.get()) > 1;
            assert_eq!(
                elsewhere.into_inner(),
                scale > 1 && parallel,
                "scale {scale}"
            );
        }
        assert!(map_by_cost(Vec::<u8>::new(), |_| 0, |x| x).is_empty());
    }

    /// The outermost call's meter ends at its total; a call from inside an item does not
    /// move it. (Tests run in parallel and share the meter, so only what this test's calls
    /// alone decide is asserted, inside one item of a large outer call.)
    #[test]
    fn the_meter_follows_the_outermost_call() {
        let items: Vec<usize> = vec![1 << 21, 3, 5];
        let inner = map_by_cost(
            items.clone(),
            |x| *x,
            |x| {
                let before = INSIDE.with(Cell::get);
                // A nested call: runs, but is not the outermost.
                let nested = map_by_cost(vec![1usize, 2], |x| *x, |x| x * 2);
                (before, nested, INSIDE.with(Cell::get), x)
            },
        );
        for (before, nested, after, _) in &inner {
            assert!(*before && *after, "items run inside the call");
            assert_eq!(nested, &vec![2, 4]);
        }
        assert!(!INSIDE.with(Cell::get), "the caller is outside again");
        let m = meter().expect("a call has run");
        assert!(m.done <= m.total);
    }
}
