//! The FP8 grouped GEMM checked a shard of consecutive experts at a time
//! ([`crate::gemm::shard`]), for the in-process models.
//!
//! A shard of an FP8 case is the shard of its grouped GEMM under the same recipe. That is the
//! whole case's slice only where every scale is the shard's own: a per-group `lhs`/`dout` scale
//! and a per-expert `rhs` scale depend on that group's rows or that expert's weight alone, and
//! given (delayed) scales are sliced with their scopes. A tensor scope under current scaling
//! takes its amax over every row or expert of the case, so such a case is checked whole
//! ([`Fp8Recipe::shard_local`]).
//!
//! The shards' reports merge into the whole case's ([`merge_fp8`]): the recipe-exact report as
//! the grouped GEMM's ([`merge_case`]); the comparison with the unquantised GEMM from each
//! pass's sums (the same statistics, summed in another order); the model-based check's groups,
//! renumbered, for the passes the merged recipe-exact report leaves undecided (each of those
//! passes admits an all-zero output in every shard, so every shard ran the check on it).

use super::case::{Fp8GemmCase, Fp8Recipe, GivenScales, ScalingKind, ScopeKind};
use super::compare::{undecided, Fp8Expected, Fp8Report};
use super::gemm::Fp8Operands;
use super::high_precision::merge_high_precision;
use super::model::ModelCheck;
use super::op::Fp8Gemm;
use crate::gemm::shard::{merge_case, Shard, Sharded};
use crate::gemm::{ByMode, GroupedGemmCase, ReferenceResult, Verify};

impl Fp8Recipe {
    /// `None` when a shard of experts keeps every scale of the whole case (module docs);
    /// otherwise why the case must be checked whole.
    pub fn shard_local(&self) -> Option<String> {
        if matches!(self.scaling, ScalingKind::Delayed { .. }) {
            return None;
        }
        let tensor = [
            ("lhs", self.lhs.scope),
            ("rhs", self.rhs.scope),
            ("dout", self.dout.scope),
        ]
        .into_iter()
        .find(|(_, s)| *s == ScopeKind::Tensor)?;
        Some(format!(
            "{} is scaled per tensor under current scaling (its amax is over the whole case), so the FP8 case is checked whole",
            tensor.0
        ))
    }
}

impl Fp8GemmCase {
    /// The case of `shard`'s experts alone, under the same recipe; given scales are sliced
    /// with their scopes (a tensor scope's one scale is kept). Only the whole case's slice
    /// when [`Fp8Recipe::shard_local`] says so.
    pub fn shard(&self, shard: &Shard) -> Fp8GemmCase {
        let r = &self.recipe;
        let slice = |s: &[f32], per_group: bool| -> Vec<f32> {
            // An operand without scales (no dout for a forward-only case) has none to slice.
            if per_group && !s.is_empty() {
                s[shard.experts.clone()].to_vec()
            } else {
                s.to_vec()
            }
        };
        Fp8GemmCase {
            gemm: self.gemm.shard(shard),
            recipe: self.recipe,
            given_scales: self.given_scales.as_ref().map(|g| GivenScales {
                lhs: slice(&g.lhs, r.lhs.scope == ScopeKind::Group),
                rhs: slice(&g.rhs, r.rhs.scope == ScopeKind::Expert),
                dout: slice(&g.dout, r.dout.scope == ScopeKind::Group),
            }),
        }
    }
}

/// The report of the whole FP8 case from its shards' (module docs), in shard order.
///
/// # Panics
/// When `parts` is empty.
pub fn merge_fp8(case: &Fp8GemmCase, parts: &[(Shard, Fp8Report)]) -> Fp8Report {
    let exact: Vec<_> = parts
        .iter()
        .map(|(s, r)| (s.clone(), r.recipe_exact.clone()))
        .collect();
    let recipe_exact = merge_case(&case.gemm, &exact);
    let high: Vec<_> = parts
        .iter()
        .map(|(_, r)| r.high_precision.as_slice())
        .collect();
    let undecided = undecided(case, &recipe_exact);
    let model = (!undecided.is_empty()).then(|| {
        let mut groups: Vec<_> = parts
            .iter()
            .flat_map(|(s, r)| {
                let groups = r.model.iter().flat_map(|m| m.groups.iter());
                groups
                    .filter(|g| undecided.contains(&g.pass))
                    .map(move |g| super::model::ModelGroupCheck {
                        group: g.group + s.experts.start,
                        ..g.clone()
                    })
            })
            .collect();
        // Pass by pass, then by group, as the whole case lists them.
        groups.sort_by_key(|g| (g.pass, g.group));
        ModelCheck { groups }
    });
    // The covering comparison, where some shard made one: a shard without one passed its
    // nominal bound, hence the covering one, and counts with its nominal report.
    let cover = parts.iter().any(|(_, r)| r.cover.is_some()).then(|| {
        let covers: Vec<_> = parts
            .iter()
            .map(|(s, r)| {
                (
                    s.clone(),
                    r.cover.clone().unwrap_or_else(|| r.recipe_exact.clone()),
                )
            })
            .collect();
        merge_case(&case.gemm, &covers)
    });
    Fp8Report {
        recipe_exact,
        high_precision: merge_high_precision(&high),
        model,
        cover,
    }
}

impl Sharded for Fp8Gemm {
    fn grouped(case: &Fp8GemmCase) -> &GroupedGemmCase {
        &case.gemm
    }
    fn shard(case: &Fp8GemmCase, shard: &Shard) -> Fp8GemmCase {
        case.shard(shard)
    }
    fn merge(case: &Fp8GemmCase, parts: &[(Shard, Fp8Report)]) -> Fp8Report {
        merge_fp8(case, parts)
    }
    /// Empty references and operands: a report reads neither.
    fn unheld(check: Verify) -> ByMode<Fp8Expected> {
        let empty = || ReferenceResult {
            value: Default::default(),
            magnitude: Default::default(),
        };
        ByMode::unheld(
            check,
            Fp8Expected {
                recipe_exact: empty(),
                high_precision: empty(),
                operands: Fp8Operands::empty(),
                cover: None,
            },
        )
    }
}
