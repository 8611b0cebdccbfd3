//! Capacity decisions between weights equal within rounding: not failures.

use super::bound::{weight_bound, RouteOutputs, RoutePrecision};
use super::config::DropPolicy;
use super::route::{Routing, RoutingCase};

/// Under the `probs` policy, the assignments whose `kept` the implementation decided the other
/// way **only between weights that are equal within rounding**: per expert (with equal indices
/// on every token that selects it), the implementation keeps as many as the reference, and
/// every assignment it keeps but the reference drops is within the sum of the two weight
/// bounds of every assignment the reference keeps but it drops. Weights that are equal in
/// exact arithmetic (the same scores summed in another order) differ in their last bits from
/// one implementation to the next, so which of them wins a capacity boundary cannot decide.
pub(super) fn probs_near_ties(
    case: &RoutingCase,
    want: &Routing,
    got: &RouteOutputs,
    precision: RoutePrecision,
) -> std::collections::HashSet<(usize, usize)> {
    let mut near = std::collections::HashSet::new();
    let is_probs = matches!(
        case.config.capacity,
        Some(c) if c.policy == DropPolicy::Probs
    );
    if !is_probs {
        return near;
    }
    let (t, k) = want.indices.dim();
    let same: Vec<bool> = (0..t)
        .map(|ti| want.indices.row(ti) == got.indices.row(ti))
        .collect();
    for x in 0..case.experts() {
        let mut clean = true;
        let (mut only_ref, mut only_got) = (Vec::new(), Vec::new());
        for (ti, &same_row) in same.iter().enumerate() {
            let selects = want.indices.row(ti).iter().any(|&e| e == x)
                || got.indices.row(ti).iter().any(|&e| e == x);
            if !same_row {
                clean &= !selects;
                continue;
            }
            for j in 0..k {
                if want.indices[[ti, j]] != x {
                    continue;
                }
                match (want.kept[[ti, j]], got.kept[[ti, j]]) {
                    (true, false) => only_ref.push((ti, j)),
                    (false, true) => only_got.push((ti, j)),
                    _ => {}
                }
            }
        }
        if !clean || only_ref.is_empty() || only_ref.len() != only_got.len() {
            continue;
        }
        let w = |&(ti, j): &(usize, usize)| want.weights[[ti, j]];
        let b = |a: &(usize, usize)| {
            let sel: Vec<usize> = want.indices.row(a.0).to_vec();
            weight_bound(case, precision, a.0, &sel, w(a))
        };
        let tied = only_ref
            .iter()
            .all(|a| only_got.iter().all(|c| (w(a) - w(c)).abs() <= b(a) + b(c)));
        if tied {
            near.extend(only_ref);
            near.extend(only_got);
        }
    }
    near
}
