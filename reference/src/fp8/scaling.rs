//! Scaling scopes (whole tensor, per group of rows, per expert), the row-wise and
//! column-wise copies, and delayed scaling with an amax history.
//!
//! ## Layout of the scale arrays
//! A [`Quantized`] tensor has one `amax`, `scale` and `scale_inv` entry **per scope, empty or
//! not**, in scope order. Transformer Engine v2.8's grouped quantize FFI stores `scale_inv`
//! compacted over the non-empty groups while still advancing the data pointer over every
//! group; a consumer that indexes it by group number then pairs every group after an empty one
//! with the wrong scale. moecheck never compacts, and its generators place empty groups before
//! groups of very different magnitudes so that such a pairing is visible.

use ndarray::{s, Array2, ArrayView2, ArrayView3};
use serde::{Deserialize, Serialize};

use super::bulk::{quantize_scopes, scope_amaxes};
use super::recipe::{amax, compute_scale, dequantize_f32, dequantize_value};
use crate::format::{Format, Overflow};
use crate::gemm::case::offsets;

/// Which rows share one scale.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Every row of the array: one scale.
    Tensor,
    /// Consecutive groups of rows with these sizes (`Σ <= rows`): one scale per group. Rows
    /// past the sum are in no scope (not quantised, bytes 0).
    Rows(Vec<usize>),
}

impl Scope {
    /// Prefix sums `[0, …, end]` of the scopes over `rows` rows.
    pub fn offsets(&self, rows: usize) -> Vec<usize> {
        match self {
            Scope::Tensor => vec![0, rows],
            Scope::Rows(sizes) => offsets(sizes),
        }
    }
}

/// A row-wise quantised 2-D tensor with its per-scope scale arrays.
#[derive(Debug, Clone, PartialEq)]
pub struct Quantized {
    pub format: Format,
    pub overflow: Overflow,
    /// `(rows, cols)` FP8 bytes; rows outside every scope are 0.
    pub q: Array2<u8>,
    /// `[0, …]`: scope `i` owns rows `offsets[i]..offsets[i+1]`.
    pub offsets: Vec<usize>,
    /// Per scope: `max |x|` (0 for an empty scope; NaN when the scope holds NaN).
    pub amax: Vec<f32>,
    pub scale: Vec<f32>,
    pub scale_inv: Vec<f32>,
}

impl Quantized {
    /// Number of scopes.
    pub fn scopes(&self) -> usize {
        self.scale.len()
    }

    /// The scope of row `r`, `None` for rows past the last scope.
    pub fn scope_of_row(&self, r: usize) -> Option<usize> {
        (0..self.scopes()).find(|&i| self.offsets[i] <= r && r < self.offsets[i + 1])
    }

    /// Exact dequantised values `decode(q) · scale_inv` as f64 (0 outside every scope).
    pub fn dequantize(&self) -> Array2<f64> {
        let mut out = Array2::<f64>::zeros(self.q.dim());
        for i in 0..self.scopes() {
            let (lo, hi) = (self.offsets[i], self.offsets[i + 1]);
            let si = self.scale_inv[i];
            out.slice_mut(s![lo..hi, ..])
                .zip_mut_with(&self.q.slice(s![lo..hi, ..]), |o, &b| {
                    *o = dequantize_value(b, si, self.format)
                });
        }
        out
    }

    /// `fl32(decode(q) · scale_inv)` (0 outside every scope).
    pub fn dequantize_f32(&self) -> Array2<f32> {
        self.dequantize_with(|b, si| dequantize_f32(b, si, self.format))
    }

    fn dequantize_with(&self, f: impl Fn(u8, f32) -> f32) -> Array2<f32> {
        let mut out = Array2::<f32>::zeros(self.q.dim());
        for i in 0..self.scopes() {
            let (lo, hi) = (self.offsets[i], self.offsets[i + 1]);
            let si = self.scale_inv[i];
            out.slice_mut(s![lo..hi, ..])
                .zip_mut_with(&self.q.slice(s![lo..hi, ..]), |o, &b| *o = f(b, si));
        }
        out
    }

    /// The column-wise copy: the transpose of the same bytes, sharing `scale_inv` (what
    /// wgrad reads).
    pub fn columnwise(&self) -> ColumnWise {
        ColumnWise {
            qt: self.q.t().to_owned(),
            offsets: self.offsets.clone(),
            scale_inv: self.scale_inv.clone(),
        }
    }
}

/// A column-wise copy `(cols, rows)`: column `r` of `qt` is row `r` of the row-wise copy, and
/// scope `i` (columns `offsets[i]..offsets[i+1]`) shares the row-wise `scale_inv[i]`.
#[derive(Debug, Clone, PartialEq)]
pub struct ColumnWise {
    pub qt: Array2<u8>,
    pub offsets: Vec<usize>,
    pub scale_inv: Vec<f32>,
}

impl ColumnWise {
    /// Whether this copy is exactly the transpose of `row` with the same `scale_inv`; the
    /// first disagreement otherwise.
    pub fn agrees_with(&self, row: &Quantized) -> Result<(), String> {
        if self.qt.dim() != (row.q.ncols(), row.q.nrows()) {
            return Err(format!(
                "column-wise copy has shape {:?}, the row-wise copy {:?}",
                self.qt.shape(),
                row.q.shape()
            ));
        }
        if self.offsets != row.offsets || self.scale_inv.len() != row.scale_inv.len() {
            return Err("column-wise copy has a different scope layout".into());
        }
        for (i, (a, b)) in self.scale_inv.iter().zip(&row.scale_inv).enumerate() {
            if a.to_bits() != b.to_bits() {
                return Err(format!(
                    "scope {i}: column-wise scale_inv {a:e} != row-wise {b:e}"
                ));
            }
        }
        for ((r, c), b) in row.q.indexed_iter() {
            let t = self.qt[(c, r)];
            if t != *b {
                return Err(format!(
                    "byte [{r}, {c}]: row-wise {b:#04x}, column-wise {t:#04x}"
                ));
            }
        }
        Ok(())
    }
}

/// Quantises `x (rows, cols)` with current scaling per scope.
///
/// Per scope: [`amax`] over its rows (0 and scale 1 when it has none), [`compute_scale`]
/// (margin 0), `scale_inv = 1/scale`, and every element [`quantize_value`]. Reads `x`; returns
/// new arrays. Rows outside every scope are 0 bytes.
///
/// # Panics
/// If a [`Scope::Rows`] layout sums past `rows`.
pub fn quantize_rows(
    x: ArrayView2<f32>,
    scope: &Scope,
    format: Format,
    overflow: Overflow,
) -> Quantized {
    let off = scope.offsets(x.nrows());
    let amaxes = scope_amaxes(x, &off);
    let scales: Vec<f32> = amaxes
        .iter()
        .map(|a| a.map_or(1.0, |a| compute_scale(a, format, 0)))
        .collect();
    let amax_vals = amaxes.iter().map(|a| a.unwrap_or(0.0)).collect();
    quantize_with_scales(x, &off, &scales, amax_vals, format, overflow)
}

/// Quantises `x` with given per-scope `scales` (delayed scaling); `amax` is recorded as
/// computed from `x` (what goes into the history). Scale 0 is not allowed.
pub fn quantize_rows_with_scales(
    x: ArrayView2<f32>,
    scope: &Scope,
    scales: &[f32],
    format: Format,
    overflow: Overflow,
) -> Quantized {
    let off = scope.offsets(x.nrows());
    let amax_vals = scope_amaxes(x, &off)
        .into_iter()
        .map(|a| a.unwrap_or(0.0))
        .collect();
    quantize_with_scales(x, &off, scales, amax_vals, format, overflow)
}

fn quantize_with_scales(
    x: ArrayView2<f32>,
    off: &[usize],
    scales: &[f32],
    amax: Vec<f32>,
    format: Format,
    overflow: Overflow,
) -> Quantized {
    assert!(
        *off.last().unwrap_or(&0) <= x.nrows(),
        "scopes cover {} rows, the array has {}",
        off.last().unwrap_or(&0),
        x.nrows()
    );
    assert_eq!(scales.len() + 1, off.len(), "one scale per scope");
    let q = quantize_scopes(x, off, scales, format, overflow);
    Quantized {
        format,
        overflow,
        q,
        offsets: off.to_vec(),
        amax,
        scale: scales.to_vec(),
        scale_inv: scales
            .iter()
            .map(|s| super::recipe::scale_inv(*s))
            .collect(),
    }
}

/// Quantises expert weights `w (G, K, N)` with one scale per expert: the same as
/// [`quantize_rows`] on the `(G·K, N)` view with scopes of `K` rows. An expert with `K = 0` or
/// `N = 0` has no values (amax 0, scale 1).
pub fn quantize_experts(w: ArrayView3<f32>, format: Format, overflow: Overflow) -> Quantized {
    let (g, k, n) = w.dim();
    let flat = w
        .as_standard_layout()
        .into_owned()
        .into_shape_with_order((g * k, n))
        .expect("contiguous");
    quantize_rows(flat.view(), &Scope::Rows(vec![k; g]), format, overflow)
}

/// How a delayed-scaling history is reduced to one amax.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AmaxAlgo {
    /// The largest amax in the history (TE's default).
    Max,
    /// The amax of the previous step.
    MostRecent,
}

/// One scope's delayed-scaling state: the amaxes of the last `len` steps, newest first.
///
/// ```
/// use moecheck_reference::fp8::{AmaxAlgo, AmaxHistory};
/// use moecheck_reference::format::Format;
/// let mut h = AmaxHistory::new(2, AmaxAlgo::Max, 0);
/// assert_eq!(h.scale(Format::E4m3), 1.0); // empty history: amax 0 -> scale 1
/// h.push(4.0);
/// h.push(2.0);
/// assert_eq!(h.scale(Format::E4m3), 112.0); // 448 / max(2, 4)
/// h.push(1.0); // 4 falls out
/// assert_eq!(h.scale(Format::E4m3), 224.0);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct AmaxHistory {
    pub len: usize,
    pub algo: AmaxAlgo,
    pub margin: i32,
    /// Newest first, at most `len` entries.
    pub history: Vec<f32>,
}

impl AmaxHistory {
    pub fn new(len: usize, algo: AmaxAlgo, margin: i32) -> AmaxHistory {
        AmaxHistory {
            len: len.max(1),
            algo,
            margin,
            history: Vec::new(),
        }
    }

    /// The reduced amax: `max` of the history or its newest entry (0 when empty;
    /// NaN-propagating like [`amax`]).
    pub fn reduced(&self) -> f32 {
        match self.algo {
            AmaxAlgo::MostRecent => self.history.first().copied().unwrap_or(0.0),
            AmaxAlgo::Max => amax(self.history.iter().copied()).unwrap_or(0.0),
        }
    }

    /// The scale for the next step: [`compute_scale`] of [`reduced`](Self::reduced) with
    /// this margin.
    pub fn scale(&self, format: Format) -> f32 {
        compute_scale(self.reduced(), format, self.margin)
    }

    /// Records the amax of the step just quantised (after quantising), dropping the oldest.
    pub fn push(&mut self, amax: f32) {
        self.history.insert(0, amax);
        self.history.truncate(self.len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::decode_fp8;
    use ndarray::{array, Array3};

    #[test]
    fn per_group_scales_keep_their_slots() {
        let x = array![[1.0f32, -2.0], [8.0, 0.5], [100.0, 3.0], [7.0, 7.0]];
        let q = quantize_rows(
            x.view(),
            &Scope::Rows(vec![1, 0, 2]),
            Format::E4m3,
            Overflow::Saturate,
        );
        assert_eq!(q.amax, vec![2.0, 0.0, 100.0]);
        assert_eq!(q.scale, vec![224.0, 1.0, 4.48]);
        assert_eq!(q.q.row(3).to_vec(), vec![0, 0]); // tail row
        assert_eq!(q.scope_of_row(1), Some(2));
        assert_eq!(q.scope_of_row(3), None);
        // The element that set the amax maps to ±448.
        assert_eq!(decode_fp8(q.q[(0, 1)], Format::E4m3), -448.0);
        assert_eq!(decode_fp8(q.q[(2, 0)], Format::E4m3), 448.0);
    }

    #[test]
    fn columnwise_is_transpose_sharing_scale_inv() {
        let x = array![[1.0f32, -2.0, 3.0], [8.0, 0.5, 0.25]];
        let q = quantize_rows(x.view(), &Scope::Tensor, Format::E5m2, Overflow::Saturate);
        let c = q.columnwise();
        assert_eq!(c.qt.dim(), (3, 2));
        c.agrees_with(&q).unwrap();
        let mut bad = c.clone();
        bad.scale_inv[0] *= 2.0;
        assert!(bad.agrees_with(&q).is_err());
    }

    #[test]
    fn experts_scale_independently_and_k_zero_is_scale_one() {
        let mut w = Array3::<f32>::zeros((3, 2, 2));
        w[(0, 0, 0)] = 1.0;
        w[(2, 1, 1)] = -1024.0;
        let q = quantize_experts(w.view(), Format::E4m3, Overflow::Saturate);
        assert_eq!(q.scale, vec![448.0, 1.0, 0.4375]);
        assert_eq!(q.amax, vec![1.0, 0.0, 1024.0]);
        let q0 = quantize_experts(
            Array3::<f32>::zeros((2, 0, 3)).view(),
            Format::E4m3,
            Overflow::Saturate,
        );
        assert_eq!(q0.scale, vec![1.0, 1.0]);
    }

    #[test]
    fn nan_scope_gets_scale_one_and_nan_byte() {
        let x = array![[1.0f32, f32::NAN], [2.0, 4.0]];
        let q = quantize_rows(
            x.view(),
            &Scope::Rows(vec![1, 1]),
            Format::E4m3,
            Overflow::Saturate,
        );
        assert!(q.amax[0].is_nan());
        assert_eq!(q.scale[0], 1.0);
        assert_eq!(q.q[(0, 1)], 0x7f);
        assert_eq!(q.scale[1], 112.0);
    }

    /// A sequence of steps: with `max` and constant input magnitude, the delayed scale equals
    /// the current scale from step 1 on; a jump in amax saturates for exactly `len` steps under
    /// `max` and one step under `most_recent`.
    #[test]
    fn delayed_sequence() {
        for (algo, stale_steps) in [(AmaxAlgo::Max, 3usize), (AmaxAlgo::MostRecent, 1)] {
            let mut h = AmaxHistory::new(3, algo, 0);
            let amaxes = [1.0f32, 1.0, 8.0, 1.0, 1.0, 1.0, 1.0];
            let mut low_scale_steps = 0;
            for (t, &a) in amaxes.iter().enumerate() {
                let s = h.scale(Format::E4m3);
                if t == 0 {
                    assert_eq!(s, 1.0);
                } else if t == 2 {
                    // The jump: the stale scale (448) saturates the new amax.
                    assert_eq!(s, 448.0);
                    let x = array![[a]];
                    let q = quantize_rows_with_scales(
                        x.view(),
                        &Scope::Tensor,
                        &[s],
                        Format::E4m3,
                        Overflow::Saturate,
                    );
                    assert_eq!(decode_fp8(q.q[(0, 0)], Format::E4m3), 448.0);
                } else if t > 2 && s == 56.0 {
                    low_scale_steps += 1;
                }
                h.push(a);
            }
            assert_eq!(low_scale_steps, stale_steps, "{algo:?}");
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// A multi-step sequence: at every step the delayed scale is the recipe's scale of the
        /// reduction of the previous `len` amaxes (read before the step, updated after), and
        /// after `len` steps of a constant amax it equals the current-scaling scale.
        #[test]
        fn delayed_scale_follows_the_history(
            len in 1usize..6,
            most_recent in proptest::bool::ANY,
            margin in 0i32..3,
            exps in proptest::collection::vec(-20i32..20, 1..24),
        ) {
            let algo = if most_recent { AmaxAlgo::MostRecent } else { AmaxAlgo::Max };
            let mut h = AmaxHistory::new(len, algo, margin);
            let amaxes: Vec<f32> = exps.iter().map(|e| 1.5 * 2f32.powi(*e)).collect();
            for (t, &a) in amaxes.iter().enumerate() {
                let past = &amaxes[t.saturating_sub(len)..t];
                let reduced = match algo {
                    AmaxAlgo::MostRecent => past.last().copied().unwrap_or(0.0),
                    AmaxAlgo::Max => past.iter().copied().fold(0.0, f32::max),
                };
                proptest::prop_assert_eq!(h.scale(Format::E4m3), compute_scale(reduced, Format::E4m3, margin));
                h.push(a);
                proptest::prop_assert!(h.history.len() <= len);
            }
            let last = *amaxes.last().unwrap();
            for _ in 0..len {
                h.push(last);
            }
            proptest::prop_assert_eq!(h.scale(Format::E5m2), compute_scale(last, Format::E5m2, margin));
        }
    }
}
