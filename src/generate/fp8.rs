//! Generated FP8 grouped-GEMM cases for `moecheck gemm --dtype fp8`.
//!
//! The routed case of [`crate::generate::gemm::generate`] (float32 values, per-expert weight
//! magnitudes over 2^±6, empty experts first/last/middle, dropped tail rows), with the weights'
//! values on the bf16 grid, as training stacks hold weights before quantising them (float32
//! values all the same, written as float32; held in bf16, half the bytes: DeepSeek-V3's are
//! 7.5 GB instead of 15), then:
//! every group's `lhs` rows and `dout` rows are multiplied by their own power of two in
//! `2^-8 ..= 2^8` (so per-group scales differ and a scale taken from the wrong group shows),
//! the `lhs` rows of one non-empty group (the second) are set to zero (amax 0 -> scale 1), and
//! one `lhs` element of the first non-empty group is a 2^12 outlier.
//!
//! For delayed scaling, the history of each scope holds `history_len` earlier steps of a
//! growing tensor: the newest amax is half the current one and each older one `2^-1/4` smaller,
//! so the stale scale is about twice the current one and the largest values saturate.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use moecheck_reference::format::Format;
use moecheck_reference::fp8::{
    quantize_operands, AmaxHistory, Fp8Gemm, Fp8GemmCase, Fp8GemmFast, Fp8Recipe, GivenScales,
    Quantized, ScalingKind,
};
use moecheck_reference::gemm::{GroupedGemmCase, Passes, Precision};

use crate::generate::gemm::{generate_with, GemmSpec};
use crate::pipeline::{Generate, Generated};

/// Everything that defines a generated FP8 case: the grouped GEMM's spec (its `dtype` is
/// ignored: FP8 inputs are float32) and the recipe.
#[derive(Debug, Clone)]
pub struct Fp8Spec {
    pub gemm: GemmSpec,
    pub recipe: Fp8Recipe,
}

impl Generate<Fp8Gemm> for Fp8Spec {
    fn work(&self) -> u64 {
        self.gemm.work()
    }
    fn generate(
        &self,
        _: &dyn Fn(&Fp8GemmCase) -> Precision,
    ) -> anyhow::Result<Generated<Fp8Gemm>> {
        let gemm = GemmSpec {
            dtype: Format::F32,
            ..self.gemm.clone()
        };
        gemm.validate().map_err(|e| anyhow::anyhow!(e.as_flag()))?;
        Ok(Generated::once(
            generate_fp8(&gemm, self.recipe),
            gemm.passes,
        ))
    }
}

/// The same case, checked fast (`--verify fast`).
impl Generate<Fp8GemmFast> for Fp8Spec {
    fn work(&self) -> u64 {
        self.gemm.work()
    }
    fn generate(
        &self,
        precision: &dyn Fn(&Fp8GemmCase) -> Precision,
    ) -> anyhow::Result<Generated<Fp8GemmFast>> {
        let g = <Fp8Spec as Generate<Fp8Gemm>>::generate(self, precision)?;
        Ok(Generated::once(g.case, g.ask))
    }
}

/// The FP8 case of `spec` (whose dtype must be f32) under `recipe`.
pub fn generate_fp8(spec: &GemmSpec, recipe: Fp8Recipe) -> Fp8GemmCase {
    let mut gemm: GroupedGemmCase = generate_with(spec, Format::Bf16);
    let mut rng = ChaCha8Rng::seed_from_u64(spec.seed ^ 0xf8f8_f8f8);
    let off = gemm.offsets();
    let live: Vec<usize> = (0..gemm.groups())
        .filter(|g| gemm.group_sizes[*g] > 0)
        .collect();
    for g in 0..gemm.groups() {
        let (lo, hi) = (off[g], off[g + 1]);
        let a = 2f32.powi(rng.random_range(-8..=8));
        let d = 2f32.powi(rng.random_range(-8..=8));
        gemm.lhs
            .slice_mut(ndarray::s![lo..hi, ..])
            .mapv_inplace(|v| v * a);
        if let Some(dout) = gemm.dout.as_mut() {
            dout.slice_mut(ndarray::s![lo..hi, ..])
                .mapv_inplace(|v| v * d);
        }
    }
    if let Some(&g) = live.get(1) {
        gemm.lhs
            .slice_mut(ndarray::s![off[g]..off[g + 1], ..])
            .fill(0.0);
    }
    if let (Some(&g), true) = (live.first(), gemm.k() > 0) {
        gemm.lhs[(off[g], 0)] *= 4096.0;
    }
    gemm.dtype = Format::F32;
    let mut case = Fp8GemmCase {
        gemm,
        recipe,
        given_scales: None,
    };
    if let ScalingKind::Delayed {
        history_len,
        algo,
        margin,
    } = recipe.scaling
    {
        let current = quantize_operands(&case, Passes::ALL);
        let scales = |q: &Quantized, f: Format| -> Vec<f32> {
            q.amax
                .iter()
                .map(|a| {
                    let mut h = AmaxHistory::new(history_len, algo, margin);
                    for i in (0..history_len).rev() {
                        h.push(a * 2f32.powf(-1.0 - i as f32 / 4.0));
                    }
                    h.scale(f)
                })
                .collect()
        };
        let given = GivenScales {
            lhs: scales(&current.lhs, recipe.lhs.format),
            rhs: scales(&current.rhs, recipe.rhs.format),
            dout: current
                .dout
                .as_ref()
                .map_or(Vec::new(), |d| scales(d, recipe.dout.format)),
        };
        case.given_scales = Some(given);
    }
    case
}
