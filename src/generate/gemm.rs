//! Generated grouped-GEMM cases for `moecheck gemm`: tokens spread over experts and values
//! that look like real activations and weights.
//!
//! Rows: `M = tokens · topk` (one row per (token, slot) assignment, already permuted by
//! expert). The last `round(drop_frac · M)` rows are dropped tokens (the tail). `empty` experts
//! get no rows, chosen to include the first, the last and one in the middle, so the
//! "offset after an empty group" and "scale of the wrong expert" failure modes are exercised.
//! The kept rows go to the other experts by `spread`.
//!
//! Values are mixed-sign and exactly representable in the declared dtype: uniform in (-1, 1)
//! times a per-expert power of two for the weights (magnitudes that differ by up to 2^12 across
//! experts, so a scale or expert mix-up cannot hide), rounded to nearest-even in the dtype.
//! `dout` on tail rows is non-zero, so an implementation that lets it leak into `drhs` fails.

use std::ops::Range;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use half::bf16;
use moecheck_reference::format::Format;
use moecheck_reference::gemm::shard::Shard;
use moecheck_reference::gemm::weights::bf16_of;
use moecheck_reference::gemm::{Gemm, GroupedGemmCase, Passes, TailContract, Weights};

#[cfg(test)]
use super::fill::unit_range;
use super::fill::{fill, Scales};
use super::ParamError;
use crate::pipeline::{Generate, Generated, ShardSource};

/// How kept rows are spread over the non-empty experts (`--routing`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Spread {
    /// Every non-empty expert equally likely.
    Uniform,
    /// Zipf-like (`p ∝ 1/rank^1.2`, ranks shuffled): a few hot experts, many small ones.
    Skewed,
    /// Every kept row to one expert (the others empty).
    OneExpert,
}

/// Everything that defines a generated case.
#[derive(Debug, Clone)]
pub struct GemmSpec {
    pub experts: usize,
    pub tokens: usize,
    pub topk: usize,
    /// K
    pub hidden: usize,
    /// N
    pub ffn: usize,
    pub dtype: Format,
    pub out_dtype: Format,
    pub spread: Spread,
    pub empty: usize,
    pub drop_frac: f64,
    pub seed: u64,
    pub tail: TailContract,
    /// The passes asked.
    pub passes: Passes,
}

impl GemmSpec {
    /// Checks the parameters against each other; the error names the parameter.
    pub fn validate(&self) -> Result<(), ParamError> {
        if self.experts == 0 {
            return Err(ParamError::new("experts", "must be at least 1"));
        }
        if self.topk == 0 {
            return Err(ParamError::new("topk", "must be at least 1"));
        }
        if self.topk > self.experts {
            return Err(ParamError::new(
                "topk",
                format!("{} exceeds the {} experts", self.topk, self.experts),
            ));
        }
        if self.empty > self.experts {
            return Err(ParamError::new(
                "empty",
                format!("{} exceeds the {} experts", self.empty, self.experts),
            ));
        }
        if !(0.0..=1.0).contains(&self.drop_frac) {
            return Err(ParamError::new(
                "drop-frac",
                format!("{} is not in [0, 1]", self.drop_frac),
            ));
        }
        if self.empty == self.experts && self.drop_frac < 1.0 && self.tokens > 0 {
            return Err(ParamError::new(
                "empty",
                format!(
                    "{} makes every expert empty, so every row is dropped: pass --drop-frac 1",
                    self.empty
                ),
            ));
        }
        for (param, f) in [("dtype", self.dtype), ("out-dtype", self.out_dtype)] {
            if matches!(f, Format::E4m3 | Format::E5m2) {
                return Err(ParamError::new(
                    param,
                    format!("{f}: FP8 inputs need scaling (use --dtype fp8); outputs are f32, bf16 or f16"),
                ));
            }
        }
        if self.passes.is_empty() {
            return Err(ParamError::new("passes", "is empty"));
        }
        // Sizes are 64-bit everywhere; only a shape whose element count overflows is refused
        // here (what fits in memory is the memory guard's question).
        // The error names the flags whose product overflows.
        let wide = if self.hidden >= self.ffn {
            "hidden"
        } else {
            "ffn"
        };
        let too_large = |param, product: String| {
            Err(ParamError::new(
                param,
                format!("the shape is too large: {product} overflows 64 bits"),
            ))
        };
        match self.tokens.checked_mul(self.topk) {
            None => return too_large("tokens", "--tokens × --topk (the rows)".into()),
            Some(m) if m.checked_mul(self.hidden.max(self.ffn)).is_none() => {
                return too_large("tokens", format!("--tokens × --topk × --{wide}"));
            }
            _ => {}
        }
        let weights = self
            .experts
            .checked_mul(self.hidden)
            .and_then(|x| x.checked_mul(self.ffn));
        if weights.is_none() {
            return too_large(
                "experts",
                "--experts × --hidden × --ffn (the weights)".into(),
            );
        }
        Ok(())
    }

    pub fn rows(&self) -> usize {
        self.tokens * self.topk
    }

    /// Multiply-adds of one pass.
    pub fn work(&self) -> u64 {
        (self.rows() as u64) * (self.hidden as u64) * (self.ffn as u64)
    }
}

impl Generate<Gemm> for GemmSpec {
    fn work(&self) -> u64 {
        GemmSpec::work(self)
    }
    fn generate(
        &self,
        _: &dyn Fn(&GroupedGemmCase) -> moecheck_reference::gemm::Precision,
    ) -> anyhow::Result<Generated<Gemm>> {
        self.validate().map_err(|e| anyhow::anyhow!(e.as_flag()))?;
        Ok(Generated::once(generate(self), self.passes))
    }
    fn shards(&self) -> Option<Box<dyn ShardSource<Gemm> + '_>> {
        Some(Box::new(InShards::with(self.clone(), self.dtype)))
    }
}

/// `spec`'s case made a shard of experts at a time ([`Generate::shards`]), its weights'
/// values in `weights` (as [`generate_with`]) and the rest in `spec.dtype`.
pub(crate) struct InShards {
    spec: GemmSpec,
    weights: Format,
    layout: Layout,
}

impl InShards {
    pub(crate) fn with(spec: GemmSpec, weights: Format) -> InShards {
        InShards {
            layout: Layout::of(&spec),
            spec,
            weights,
        }
    }

    pub(crate) fn spec(&self) -> &GemmSpec {
        &self.spec
    }

    /// The group sizes of the whole case.
    pub(crate) fn sizes(&self) -> &[usize] {
        &self.layout.sizes
    }

    /// The whole case's shapes, group sizes, formats and contract ([`ShardSource::header`]):
    /// its arrays are allocated zeroed and never written.
    pub(crate) fn header_case(&self) -> anyhow::Result<GroupedGemmCase> {
        let spec = &self.spec;
        spec.validate().map_err(|e| anyhow::anyhow!(e.as_flag()))?;
        let (m, k, n, g) = (spec.rows(), spec.hidden, spec.ffn, spec.experts);
        // Zeroed allocations are fresh pages that nothing here writes.
        let rhs = match self.weights {
            Format::Bf16 => Weights::Bf16(bf16_zeros((g, k, n))),
            _ => Weights::F32(ndarray::Array3::zeros((g, k, n))),
        };
        Ok(GroupedGemmCase {
            lhs: ndarray::Array2::zeros((m, k)),
            rhs,
            group_sizes: self.layout.sizes.clone(),
            dout: Some(ndarray::Array2::zeros((m, n))),
            dtype: spec.dtype,
            out_dtype: spec.out_dtype,
            tail: spec.tail,
        })
    }

    /// Experts `shard` of the case, made directly ([`ShardSource::shard`]).
    pub(crate) fn case(&self, shard: &Shard) -> GroupedGemmCase {
        let (experts, rows) = (shard.experts.clone(), shard.rows.clone());
        make(&self.spec, self.weights, &self.layout, experts, rows)
    }
}

impl ShardSource<Gemm> for InShards {
    fn header(&self) -> anyhow::Result<Generated<Gemm>> {
        Ok(Generated::once(self.header_case()?, self.spec.passes))
    }

    fn shard(&self, shard: &Shard) -> GroupedGemmCase {
        self.case(shard)
    }
}

/// The group sizes of a spec (deterministic in `seed`).
pub fn group_sizes(spec: &GemmSpec, rng: &mut ChaCha8Rng) -> Vec<usize> {
    let m = spec.rows();
    let dropped = ((spec.drop_frac * m as f64).round() as usize).min(m);
    let kept = m - dropped;
    let e = spec.experts;
    let mut is_empty = vec![false; e];
    // First, last, middle, then random.
    let mut order: Vec<usize> = vec![0, e - 1, e / 2];
    let mut rest: Vec<usize> = (0..e).collect();
    shuffle(&mut rest, rng);
    order.extend(rest);
    let mut n_empty = 0;
    for g in order {
        if n_empty == spec.empty {
            break;
        }
        if !is_empty[g] {
            is_empty[g] = true;
            n_empty += 1;
        }
    }
    let live: Vec<usize> = (0..e).filter(|g| !is_empty[*g]).collect();
    let mut sizes = vec![0usize; e];
    if live.is_empty() || kept == 0 {
        return sizes;
    }
    let weights: Vec<f64> = match spec.spread {
        Spread::Uniform => vec![1.0; live.len()],
        Spread::OneExpert => {
            let mut w = vec![0.0; live.len()];
            w[rng.random_range(0..live.len())] = 1.0;
            w
        }
        Spread::Skewed => {
            let mut ranks: Vec<usize> = (1..=live.len()).collect();
            shuffle(&mut ranks, rng);
            ranks.iter().map(|r| (*r as f64).powf(-1.2)).collect()
        }
    };
    let total: f64 = weights.iter().sum();
    let cdf: Vec<f64> = weights
        .iter()
        .scan(0.0, |acc, w| {
            *acc += w / total;
            Some(*acc)
        })
        .collect();
    for _ in 0..kept {
        let u: f64 = rng.random();
        let i = cdf.partition_point(|c| *c <= u).min(live.len() - 1);
        sizes[live[i]] += 1;
    }
    sizes
}

fn shuffle<T>(v: &mut [T], rng: &mut ChaCha8Rng) {
    for i in (1..v.len()).rev() {
        v.swap(i, rng.random_range(0..=i));
    }
}

/// The group sizes [`generate`] gives `spec`'s case, without making the case (they are its
/// stream's first draws).
pub fn sizes_of(spec: &GemmSpec) -> Vec<usize> {
    group_sizes(spec, &mut ChaCha8Rng::seed_from_u64(spec.seed))
}

/// Generates the case of `spec`, with `dout` (the backward passes may be asked).
///
/// The values are those of one ChaCha8 stream read in order — the group sizes, `lhs` row by
/// row, the experts' scales, `rhs` expert by expert, `dout` — but the long arrays are filled
/// in parallel: each value takes one 32-bit word of the stream ([`unit_range`]), so a chunk
/// starting at value `i` seeks to its word position instead of drawing everything before it.
/// A test checks the result against drawing the stream sequentially.
pub fn generate(spec: &GemmSpec) -> GroupedGemmCase {
    generate_with(spec, spec.dtype)
}

/// [`generate`] with the weights' values in `weights` (held in bf16 when that is bf16) and
/// the rest in `spec.dtype`: the same stream, each value rounded to its own format.
pub fn generate_with(spec: &GemmSpec, weights: Format) -> GroupedGemmCase {
    let layout = Layout::of(spec);
    make(spec, weights, &layout, 0..spec.experts, 0..spec.rows())
}

/// Where each array of `spec`'s case starts in its stream, and the experts' scales: what
/// the whole case, or any shard of its experts, is filled from.
struct Layout {
    sizes: Vec<usize>,
    /// The stream, to be cloned and set to a position.
    rng: ChaCha8Rng,
    lhs: u128,
    scales: Vec<f64>,
    rhs: u128,
    dout: u128,
}

impl Layout {
    /// The stream's order: the group sizes, `lhs` row by row, the experts' scales, `rhs`
    /// expert by expert, `dout` row by row.
    fn of(spec: &GemmSpec) -> Layout {
        let mut rng = ChaCha8Rng::seed_from_u64(spec.seed);
        let sizes = group_sizes(spec, &mut rng);
        let (m, k, n, g) = (spec.rows(), spec.hidden, spec.ffn, spec.experts);
        let lhs = rng.get_word_pos();
        rng.set_word_pos(lhs + (m * k) as u128);
        let scales: Vec<f64> = (0..g)
            .map(|_| 2f64.powi(rng.random_range(-6..=6)))
            .collect();
        let rhs = rng.get_word_pos();
        Layout {
            sizes,
            rng,
            lhs,
            scales,
            rhs,
            dout: rhs + (g * k * n) as u128,
        }
    }
}

/// Experts `experts` of `spec`'s case with rows `rows` of its `lhs` and `dout`: each value
/// the one the whole case holds there (read from its own position in the stream).
fn make(
    spec: &GemmSpec,
    weights: Format,
    layout: &Layout,
    experts: Range<usize>,
    rows: Range<usize>,
) -> GroupedGemmCase {
    let (k, n) = (spec.hidden, spec.ffn);
    let (m, g) = (rows.len(), experts.len());
    let dtype = spec.dtype;
    let value = |x: f64| x as f32;
    let unscaled = Scales {
        of: &[1.0],
        per: usize::MAX,
    };
    let mut lhs = ndarray::Array2::<f32>::zeros((m, k));
    let at = layout.lhs + (rows.start * k) as u128;
    fill(&layout.rng, at, slice(&mut lhs), &unscaled, dtype, value);
    let per_expert = Scales {
        of: &layout.scales[experts.clone()],
        per: (k * n).max(1),
    };
    let at = layout.rhs + (experts.start * k * n) as u128;
    // bf16 weights are made and held in bf16 (every value is one): half the bytes.
    let rhs = if weights == Format::Bf16 {
        let mut w = bf16_zeros((g, k, n));
        fill(&layout.rng, at, slice(&mut w), &per_expert, weights, |x| {
            bf16_of(x as f32)
        });
        Weights::Bf16(w)
    } else {
        let mut w = ndarray::Array3::<f32>::zeros((g, k, n));
        fill(&layout.rng, at, slice(&mut w), &per_expert, weights, value);
        Weights::F32(w)
    };
    let mut dout = ndarray::Array2::<f32>::zeros((m, n));
    let at = layout.dout + (rows.start * n) as u128;
    fill(&layout.rng, at, slice(&mut dout), &unscaled, dtype, value);
    GroupedGemmCase {
        lhs,
        rhs,
        group_sizes: layout.sizes[experts].to_vec(),
        dout: Some(dout),
        dtype,
        out_dtype: spec.out_dtype,
        tail: spec.tail,
    }
}

/// A `shape` array of bf16 zeros, allocated zeroed: the memory is not written here (freshly
/// mapped pages read as zero), so the parallel fill that follows is the first to touch it,
/// on every core, instead of one core clearing 7.5 GB for DeepSeek-V3 first.
fn bf16_zeros(shape: (usize, usize, usize)) -> ndarray::Array3<bf16> {
    let len = shape.0 * shape.1 * shape.2;
    let mut bits = std::mem::ManuallyDrop::new(vec![0u16; len]);
    let (ptr, cap) = (bits.as_mut_ptr() as *mut bf16, bits.capacity());
    // SAFETY: bf16 is a transparent wrapper of u16 (same size and alignment) whose every bit
    // pattern is a value, and 0 is +0.0; the allocation is handed over whole, once.
    let values = unsafe { Vec::from_raw_parts(ptr, len, cap) };
    ndarray::Array3::from_shape_vec(shape, values).expect("len elements")
}

/// A freshly made standard-layout array as one slice.
fn slice<T, D: ndarray::Dimension>(a: &mut ndarray::Array<T, D>) -> &mut [T] {
    a.as_slice_mut().expect("a new array is in standard layout")
}

#[cfg(test)]
#[path = "gemm_tests.rs"]
mod tests;
