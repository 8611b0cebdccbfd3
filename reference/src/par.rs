//! Work spread over all cores: [`map_by_cost`].
//!
//! The reference's parallel loops (the grouped GEMM's jobs, the comparison's groups) have
//! items of very different sizes — a hot expert with thousands of rows beside experts with a
//! handful — so a plain split in equal counts leaves one core idle at the end. Items are
//! sorted by cost; even-numbered workers take the largest remaining item and odd-numbered ones
//! the smallest, so the compute-bound large items run beside the memory-bound small ones
//! rather than all small items together at the end.

use std::collections::VecDeque;
use std::sync::Mutex;

/// Total cost below which the items run on the calling thread: starting threads costs tens of
/// microseconds, more than the work of a small case (a property campaign runs thousands).
pub const SERIAL_BELOW: usize = 1 << 20;

/// `f(item)` for every item, on all available cores, largest `cost` first (see the module
/// docs). The results come back in the order of `items`, whatever the schedule.
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
    let mut order: Vec<(usize, T)> = items.into_iter().enumerate().collect();
    order.sort_by_key(|(i, item)| (std::cmp::Reverse(cost(item)), *i));
    let total = order
        .iter()
        .fold(0usize, |t, (_, item)| t.saturating_add(cost(item)));
    let threads = if total < SERIAL_BELOW {
        1
    } else {
        std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(count)
    };
    let mut results: Vec<Option<R>> = (0..count).map(|_| None).collect();
    if threads <= 1 {
        for (i, item) in order {
            results[i] = Some(f(item));
        }
    } else {
        let queue = Mutex::new(VecDeque::from(order));
        let done = Mutex::new(Vec::with_capacity(count));
        std::thread::scope(|scope| {
            for worker in 0..threads {
                let (queue, done, f) = (&queue, &done, &f);
                scope.spawn(move || loop {
                    let next = {
                        let mut q = queue.lock().unwrap_or_else(|e| e.into_inner());
                        if worker % 2 == 0 {
                            q.pop_front()
                        } else {
                            q.pop_back()
                        }
                    };
                    let Some((i, item)) = next else { break };
                    let r = f(item);
                    done.lock().unwrap_or_else(|e| e.into_inner()).push((i, r));
                });
            }
        });
        for (i, r) in done.into_inner().unwrap_or_else(|e| e.into_inner()) {
            results[i] = Some(r);
        }
    }
    results
        .into_iter()
        .map(|r| r.expect("every item was mapped"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
