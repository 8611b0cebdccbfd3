//! `emulate` for routing: a CPU **model** of a fused routing kernel, written independently of
//! the reference, with optional planted bugs ([`RouteBug`]). Never a GPU result.
//!
//! The model works the way a kernel does: per token, scores in registers (f64 here), top-k by
//! `K` rounds of arg-max over the still-unpicked allowed experts (a strict `>` keeps the first,
//! i.e. the lower index, on ties), groups scored by the sum of their largest scores, capacity by
//! MaxText's one-hot cumulative count (`position`), a per-expert sort (`probs`) or a per-expert
//! running count over the batch (`token-order`).

use moecheck_reference::format::Format;
use moecheck_reference::op::{Implementation, RunError};
use moecheck_reference::routing::{
    position_capacity, probs_capacity, DropPolicy, GroupScore, Route, RouteOutputs, RoutePrecision,
    RoutingCase, ScoreFunction,
};
use ndarray::Array2;

use crate::impls::{model_name, PlantedBug};

/// A routing defect that can be planted in [`RouteEmulate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RouteBug {
    /// The gates are read from the biased selection scores `s + b` instead of `s`.
    BiasedCombineWeights,
    /// After dropping, the surviving weights of a token are renormalised to the sum they had.
    RenormaliseSurvivors,
    /// One assignment more than the capacity is kept per expert.
    CapacityOffByOne,
    /// Equal scores are broken toward the higher expert (and group) index.
    TieTowardHigherIndex,
    /// Groups are scored by their top-1 instead of their top-2 sum.
    GroupScoreTop1,
    /// Without a configured capacity, the kernel still drops with its default capacity
    /// factor 1.0 (`position`, one sequence).
    DefaultCapacityDrop,
    /// Sigmoid weights are normalised at `K = 1` even under `sigmoid_norm = skip-k1`.
    NormaliseSigmoidAtK1,
    /// Sigmoid weights are normalised (at `K > 1`) even under `sigmoid_norm = never`.
    NormaliseSigmoidDespiteNever,
}

impl PlantedBug for RouteBug {
    const ALL: &'static [RouteBug] = &[
        RouteBug::BiasedCombineWeights,
        RouteBug::RenormaliseSurvivors,
        RouteBug::CapacityOffByOne,
        RouteBug::TieTowardHigherIndex,
        RouteBug::GroupScoreTop1,
        RouteBug::DefaultCapacityDrop,
        RouteBug::NormaliseSigmoidAtK1,
        RouteBug::NormaliseSigmoidDespiteNever,
    ];

    fn name(self) -> &'static str {
        match self {
            RouteBug::BiasedCombineWeights => "combine-from-biased-scores",
            RouteBug::RenormaliseSurvivors => "renormalise-survivors",
            RouteBug::CapacityOffByOne => "capacity-off-by-one",
            RouteBug::TieTowardHigherIndex => "tie-toward-higher-index",
            RouteBug::GroupScoreTop1 => "group-score-top1",
            RouteBug::DefaultCapacityDrop => "default-capacity-drop",
            RouteBug::NormaliseSigmoidAtK1 => "normalise-sigmoid-at-k1",
            RouteBug::NormaliseSigmoidDespiteNever => "normalise-sigmoid-despite-never",
        }
    }

    fn description(self) -> &'static str {
        match self {
            RouteBug::BiasedCombineWeights => "combine weights taken from the biased scores",
            RouteBug::RenormaliseSurvivors => "surviving weights renormalised after dropping",
            RouteBug::CapacityOffByOne => "one assignment more than the capacity is kept",
            RouteBug::TieTowardHigherIndex => "ties broken toward the higher expert index",
            RouteBug::GroupScoreTop1 => "groups scored by their top-1 instead of top-2 sum",
            RouteBug::DefaultCapacityDrop => {
                "drops with capacity factor 1.0 when no capacity is configured"
            }
            RouteBug::NormaliseSigmoidAtK1 => {
                "sigmoid weights normalised at K = 1 although skip-k1 is declared"
            }
            RouteBug::NormaliseSigmoidDespiteNever => {
                "sigmoid weights normalised at K > 1 although never is declared"
            }
        }
    }
}

/// The routing model.
#[derive(Debug, Clone, Copy, Default)]
pub struct RouteEmulate {
    pub inject: Option<RouteBug>,
}

impl RouteEmulate {
    pub fn with_bug(inject: Option<RouteBug>) -> RouteEmulate {
        RouteEmulate { inject }
    }
    fn has(&self, b: RouteBug) -> bool {
        self.inject == Some(b)
    }
    /// `a` beats `b` (values `va`, `vb`, indices `a`, `b`).
    fn beats(&self, va: f64, a: usize, vb: f64, b: usize) -> bool {
        if va != vb {
            va > vb
        } else if self.has(RouteBug::TieTowardHigherIndex) {
            a > b
        } else {
            a < b
        }
    }
    /// `k` rounds of arg-max over the allowed entries of `vals`.
    fn argmax_k(&self, vals: &[f64], allowed: &[bool], k: usize) -> Vec<usize> {
        let mut taken = vec![false; vals.len()];
        let mut out = Vec::with_capacity(k);
        for _ in 0..k {
            let mut best: Option<usize> = None;
            for (i, &v) in vals.iter().enumerate() {
                if !allowed[i] || taken[i] {
                    continue;
                }
                best = match best {
                    Some(b) if !self.beats(v, i, vals[b], b) => Some(b),
                    _ => Some(i),
                };
            }
            let b = best.expect("k <= allowed experts (validated)");
            taken[b] = true;
            out.push(b);
        }
        out
    }
}

fn softmax_in_place(v: &mut [f64]) {
    let m = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mut sum = 0.0;
    for x in v.iter_mut() {
        *x = (*x - m).exp();
        sum += *x;
    }
    v.iter_mut().for_each(|x| *x /= sum);
}

impl Implementation<Route> for RouteEmulate {
    fn name(&self) -> String {
        model_name(self.inject)
    }
    fn is_model(&self) -> bool {
        true
    }
    fn precision(&self, _case: &RoutingCase) -> RoutePrecision {
        RoutePrecision {
            compute: Format::F64,
            output: Format::F64,
        }
    }
    fn run(&self, case: &RoutingCase, _: ()) -> Result<RouteOutputs, RunError> {
        let cfg = &case.config;
        let (t, e, k) = (case.tokens(), case.experts(), cfg.topk);
        let mut indices = Array2::zeros((t, k));
        let mut weights = Array2::zeros((t, k));
        for ti in 0..t {
            let mut s: Vec<f64> = case.logits.row(ti).to_vec();
            match cfg.score {
                ScoreFunction::Softmax => softmax_in_place(&mut s),
                ScoreFunction::Sigmoid => s.iter_mut().for_each(|x| *x = 1.0 / (1.0 + (-*x).exp())),
                ScoreFunction::TopkSoftmax => {}
            }
            let u: Vec<f64> = match &case.bias {
                Some(b) => s.iter().zip(b.iter()).map(|(x, y)| x + y).collect(),
                None => s.clone(),
            };
            let mut allowed = vec![true; e];
            if let Some(g) = cfg.groups {
                let per = e / g.groups;
                // A group's score: the sum of its `terms` largest selection scores.
                let terms = match cfg.group_score {
                    _ if self.has(RouteBug::GroupScoreTop1) => 1,
                    GroupScore::Top2 => 2,
                    GroupScore::TopKPerGroup => k / g.topk_groups,
                    GroupScore::Max => 1,
                };
                let scores: Vec<f64> = (0..g.groups)
                    .map(|q| {
                        let mut v = u[q * per..(q + 1) * per].to_vec();
                        v.sort_by(|a, b| b.partial_cmp(a).unwrap_or(std::cmp::Ordering::Equal));
                        v.iter().take(terms).sum()
                    })
                    .collect();
                let keep = self.argmax_k(&scores, &vec![true; g.groups], g.topk_groups);
                allowed = (0..e).map(|x| keep.contains(&(x / per))).collect();
            }
            let picked = self.argmax_k(&u, &allowed, k);
            let src = if self.has(RouteBug::BiasedCombineWeights) {
                &u
            } else {
                &s
            };
            let mut g: Vec<f64> = picked.iter().map(|&x| src[x]).collect();
            if cfg.score == ScoreFunction::TopkSoftmax {
                softmax_in_place(&mut g);
            }
            let normalise = match cfg.score {
                ScoreFunction::Sigmoid => {
                    cfg.normalises()
                        || (k == 1 && self.has(RouteBug::NormaliseSigmoidAtK1))
                        || (k > 1 && self.has(RouteBug::NormaliseSigmoidDespiteNever))
                }
                _ => cfg.norm_topk,
            };
            if normalise {
                let d: f64 = g.iter().sum::<f64>() + cfg.norm_eps;
                g.iter_mut().for_each(|x| *x /= d);
            }
            for (j, (&x, w)) in picked.iter().zip(g).enumerate() {
                indices[[ti, j]] = x;
                weights[[ti, j]] = w * cfg.scaling_factor;
            }
        }
        let mut kept = Array2::from_elem((t, k), true);
        let cap = cfg.capacity.or(if self.has(RouteBug::DefaultCapacityDrop) {
            Some(moecheck_reference::routing::Capacity {
                factor: 1.0,
                policy: DropPolicy::Position,
                seq_len: None,
            })
        } else {
            None
        });
        if let Some(cap) = cap {
            let extra = usize::from(self.has(RouteBug::CapacityOffByOne));
            match cap.policy {
                DropPolicy::Position => {
                    let s = cap.seq_len.unwrap_or(t).max(1);
                    let c = position_capacity(s, k, e, cap.factor) + extra;
                    // MaxText: one-hot of the (token, slot) assignments, cumulative sum along the
                    // flattened sequence, keep where the running count <= C.
                    let mut running = vec![0usize; e];
                    for ti in 0..t {
                        if ti % s == 0 {
                            running.iter_mut().for_each(|c| *c = 0);
                        }
                        for j in 0..k {
                            let x = indices[[ti, j]];
                            running[x] += 1;
                            kept[[ti, j]] = running[x] <= c;
                        }
                    }
                }
                DropPolicy::TokenOrder => {
                    // Megatron's position policy: per expert, the first C tokens over the batch.
                    let c = probs_capacity(t, k, e, cap.factor) + extra;
                    let mut count = vec![0usize; e];
                    for ti in 0..t {
                        for j in 0..k {
                            let x = indices[[ti, j]];
                            count[x] += 1;
                            kept[[ti, j]] = count[x] <= c;
                        }
                    }
                }
                DropPolicy::Probs => {
                    let c = probs_capacity(t, k, e, cap.factor) + extra;
                    for x in 0..e {
                        let mut list: Vec<(usize, usize)> = (0..t)
                            .flat_map(|ti| (0..k).map(move |j| (ti, j)))
                            .filter(|&(ti, j)| indices[[ti, j]] == x)
                            .collect();
                        list.sort_by(|&(ta, ja), &(tb, jb)| {
                            weights[[tb, jb]]
                                .partial_cmp(&weights[[ta, ja]])
                                .unwrap_or(std::cmp::Ordering::Equal)
                                .then(ta.cmp(&tb))
                        });
                        for (rank, &(ti, j)) in list.iter().enumerate() {
                            kept[[ti, j]] = rank < c;
                        }
                    }
                }
            }
            for ti in 0..t {
                let before: f64 = weights.row(ti).sum();
                for j in 0..k {
                    if !kept[[ti, j]] {
                        weights[[ti, j]] = 0.0;
                    }
                }
                let after: f64 = weights.row(ti).sum();
                if self.has(RouteBug::RenormaliseSurvivors) && after > 0.0 && after != before {
                    weights
                        .row_mut(ti)
                        .iter_mut()
                        .for_each(|w| *w *= before / after);
                }
            }
        }
        let mut group_sizes = vec![0usize; e];
        for ((ti, j), &x) in indices.indexed_iter() {
            if kept[[ti, j]] {
                group_sizes[x] += 1;
            }
        }
        Ok(RouteOutputs {
            indices,
            weights,
            kept,
            group_sizes,
            weights_format: None,
        })
    }
}
