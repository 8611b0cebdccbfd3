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
    quantize_operands, AmaxHistory, Fp8Gemm, Fp8GemmCase, Fp8Recipe, GivenScales, Quantized,
    ScalingKind,
};
use moecheck_reference::gemm::shard::Shard;
use moecheck_reference::gemm::{GroupedGemmCase, Passes, Precision};

use crate::generate::gemm::{generate_with, GemmSpec, InShards};
use crate::pipeline::{Generate, Generated, ShardSource};

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
    fn shards(&self) -> Option<Box<dyn ShardSource<Fp8Gemm> + '_>> {
        self.in_shards()
    }
}

impl Fp8Spec {
    /// The case made a shard of experts at a time, where every shard's scales are its own
    /// under current scaling ([`Fp8Recipe::shard_local`]). Given (delayed) scales come from
    /// the whole case's amax, so such a case is made whole and cut.
    fn in_shards(&self) -> Option<Box<dyn ShardSource<Fp8Gemm> + '_>> {
        if matches!(self.recipe.scaling, ScalingKind::Delayed { .. })
            || self.recipe.shard_local().is_some()
        {
            return None;
        }
        let spec = GemmSpec {
            dtype: Format::F32,
            ..self.gemm.clone()
        };
        let gemm = InShards::with(spec, Format::Bf16);
        let shaping = Shaping::of(gemm.spec(), gemm.sizes());
        Some(Box::new(Fp8InShards {
            gemm,
            shaping,
            recipe: self.recipe,
        }))
    }
}

/// What makes the routed case an FP8 one (module docs), drawn for the whole case: each
/// group's powers of two for its `lhs` and `dout` rows, the group whose `lhs` is zero and
/// the group whose first `lhs` element is the outlier. Applied to any shard of experts.
struct Shaping {
    factors: Vec<(f32, f32)>,
    zeroed: Option<usize>,
    outlier: Option<usize>,
}

impl Shaping {
    fn of(spec: &GemmSpec, sizes: &[usize]) -> Shaping {
        let mut rng = ChaCha8Rng::seed_from_u64(spec.seed ^ 0xf8f8_f8f8);
        let mut power = || 2f32.powi(rng.random_range(-8..=8));
        let factors = sizes.iter().map(|_| (power(), power())).collect();
        let mut live = (0..sizes.len()).filter(|g| sizes[*g] > 0);
        let first = live.next();
        Shaping {
            factors,
            zeroed: live.next(),
            outlier: first.filter(|_| spec.hidden > 0),
        }
    }

    /// Shapes `gemm`, the routed case of the experts from `first` on (0: the whole case).
    fn apply(&self, gemm: &mut GroupedGemmCase, first: usize) {
        let off = gemm.offsets();
        let groups = gemm.groups();
        let rows = |g: usize| ndarray::s![off[g]..off[g + 1], ..];
        for (g, &(a, d)) in self.factors[first..first + groups].iter().enumerate() {
            gemm.lhs.slice_mut(rows(g)).mapv_inplace(|v| v * a);
            if let Some(dout) = gemm.dout.as_mut() {
                dout.slice_mut(rows(g)).mapv_inplace(|v| v * d);
            }
        }
        let here = |g: Option<usize>| g?.checked_sub(first).filter(|l| *l < groups);
        if let Some(g) = here(self.zeroed) {
            gemm.lhs.slice_mut(rows(g)).fill(0.0);
        }
        if let Some(g) = here(self.outlier) {
            gemm.lhs[(off[g], 0)] *= 4096.0;
        }
    }
}

/// An FP8 case made a shard of experts at a time ([`Fp8Spec::in_shards`]).
struct Fp8InShards {
    gemm: InShards,
    shaping: Shaping,
    recipe: Fp8Recipe,
}

impl Fp8InShards {
    fn case(&self, gemm: GroupedGemmCase) -> Fp8GemmCase {
        Fp8GemmCase {
            gemm,
            recipe: self.recipe,
            given_scales: None,
        }
    }
}

impl ShardSource<Fp8Gemm> for Fp8InShards {
    fn header(&self) -> anyhow::Result<Generated<Fp8Gemm>> {
        let header = self.case(self.gemm.header_case()?);
        Ok(Generated::once(header, self.gemm.spec().passes))
    }

    fn shard(&self, shard: &Shard) -> Fp8GemmCase {
        let mut gemm = self.gemm.case(shard);
        self.shaping.apply(&mut gemm, shard.experts.start);
        self.case(gemm)
    }
}

/// The FP8 case of `spec` (whose dtype must be f32) under `recipe`.
pub fn generate_fp8(spec: &GemmSpec, recipe: Fp8Recipe) -> Fp8GemmCase {
    let mut gemm: GroupedGemmCase = generate_with(spec, Format::Bf16);
    Shaping::of(spec, &gemm.group_sizes).apply(&mut gemm, 0);
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

#[cfg(test)]
mod tests {
    use moecheck_reference::fp8::{AmaxAlgo, ScopeKind};
    use moecheck_reference::gemm::shard::plan;
    use moecheck_reference::gemm::TailContract;

    use super::*;
    use crate::generate::gemm::Spread;

    fn spec(tokens: usize, hidden: usize) -> Fp8Spec {
        Fp8Spec {
            gemm: GemmSpec {
                experts: 16,
                tokens,
                topk: 2,
                hidden,
                ffn: 5,
                dtype: Format::Bf16,
                out_dtype: Format::F32,
                spread: Spread::Skewed,
                empty: 3,
                drop_frac: 0.1,
                seed: 11,
                tail: TailContract::Zero,
                passes: Passes::ALL,
            },
            recipe: Fp8Recipe::default(),
        }
    }

    /// Every shard made on its own is the whole FP8 case's shard: each group's powers of
    /// two, the zeroed group and the outlier where the whole case has them (empty experts
    /// first, a tail, a hot expert, K = 0); the header has the whole case's shapes.
    #[test]
    fn shards_made_alone_are_the_whole_cases_shards() {
        for (tokens, hidden) in [(100, 8), (300, 33), (50, 0)] {
            let s = spec(tokens, hidden);
            let whole = <Fp8Spec as Generate<Fp8Gemm>>::generate(&s, &|_| unreachable!())
                .unwrap()
                .case;
            let source = s.in_shards().expect("current per-group scaling");
            for parts in [1, 2, 3, 16] {
                for shard in plan(&whole.gemm, parts) {
                    let made = source.shard(&shard);
                    assert!(made == whole.shard(&shard), "K={hidden} {shard} of {parts}");
                }
            }
            let header = source.header().unwrap();
            let (h, w) = (&header.case.gemm, &whole.gemm);
            assert_eq!((h.m(), h.k(), h.n()), (w.m(), w.k(), w.n()));
            assert_eq!((&h.group_sizes, h.dtype), (&w.group_sizes, w.dtype));
            assert_eq!(h.rhs.shape(), w.rhs.shape());
            assert_eq!(header.case.recipe, whole.recipe);
        }
    }

    /// Against the routed case it is made from: every group's `lhs` rows are scaled by one
    /// power of two in `2^-8 ..= 2^8` (not all the same), the second non-empty group's are
    /// zero, and the first non-empty group's first element is 2^12 times its row's scale.
    #[test]
    fn the_case_has_its_fp8_features() {
        let s = spec(300, 33);
        let gemm = GemmSpec {
            dtype: Format::F32,
            ..s.gemm.clone()
        };
        let (case, base) = (
            generate_fp8(&gemm, s.recipe).gemm,
            generate_with(&gemm, Format::Bf16),
        );
        let off = case.offsets();
        let live: Vec<usize> = (0..16).filter(|g| case.group_sizes[*g] > 0).collect();
        let ratio = |r: usize, c: usize| case.lhs[(r, c)] / base.lhs[(r, c)];
        let mut seen = Vec::new();
        for &g in &live {
            let rows = off[g]..off[g + 1];
            if g == live[1] {
                assert!(rows
                    .clone()
                    .all(|r| case.lhs.row(r).iter().all(|v| *v == 0.0)));
                continue;
            }
            let a = ratio(rows.start, 1);
            assert!(
                a.log2().fract() == 0.0 && a.log2().abs() <= 8.0,
                "group {g}: {a}"
            );
            for r in rows.clone() {
                for c in 0..33 {
                    let outlier = g == live[0] && r == rows.start && c == 0;
                    let want = if outlier { a * 4096.0 } else { a };
                    assert_eq!(ratio(r, c), want, "group {g} row {r} column {c}");
                }
            }
            seen.push(a);
        }
        assert!(seen.iter().any(|a| *a != seen[0]), "{seen:?}");
    }

    /// Scales that come from the whole case (delayed scaling, a tensor scope under current
    /// scaling) are not made in shards.
    #[test]
    fn whole_case_scales_are_not_made_in_shards() {
        let mut s = spec(100, 8);
        s.recipe.rhs.scope = ScopeKind::Tensor;
        assert!(s.in_shards().is_none());
        let mut s = spec(100, 8);
        s.recipe.scaling = ScalingKind::Delayed {
            history_len: 4,
            algo: AmaxAlgo::Max,
            margin: 0,
        };
        assert!(s.in_shards().is_none());
    }
}
