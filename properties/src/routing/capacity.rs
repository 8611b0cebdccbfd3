//! The capacity properties of routing: the survivors of capacity dropping are exactly the
//! declared policy's (`capacity-survivors`), and dropping never renormalises the survivors'
//! weights (`no-renormalisation`).

use moecheck_reference::op::Implementation;
use moecheck_reference::routing::{
    apply_capacity, weight_bound, DropPolicy, Route, RouteOutputs, Ties,
};
use ndarray::Array2;

use super::outputs::{run, valid_case, without_capacity};
use super::strategies::RouteArgs;

pub(super) fn capacity_survivors(
    imp: &dyn Implementation<Route>,
    args: &RouteArgs,
) -> Result<(), String> {
    let case = valid_case(args)?;
    let cap = case.config.capacity.ok_or("the case has no capacity")?;
    let got = run(imp, &case)?;
    let free = run(imp, &without_capacity(&case))?;
    if got.indices != free.indices {
        return Err("capacity changed which experts were selected".into());
    }
    let want = apply_capacity(&free.indices, &free.weights, case.experts(), &cap, None);
    let (t, k) = got.indices.dim();
    // Kept per expert (per sequence for position) must not exceed the capacity.
    let seq = match cap.policy {
        DropPolicy::Position => cap.seq_len.unwrap_or(t).max(1),
        DropPolicy::Probs | DropPolicy::TokenOrder => t.max(1),
    };
    for start in (0..t).step_by(seq) {
        let mut count = vec![0usize; case.experts()];
        for ti in start..(start + seq).min(t) {
            for j in 0..k {
                if got.kept[[ti, j]] {
                    count[got.indices[[ti, j]]] += 1;
                }
            }
        }
        if let Some((x, &n)) = count.iter().enumerate().find(|(_, &n)| n > want.capacity) {
            return Err(format!(
                "expert {x} keeps {n} assignments in tokens {start}.., capacity is {}",
                want.capacity
            ));
        }
    }
    // Under ties any, Megatron-Core ranks an expert's assignments by a top-k over their
    // weights (probs) or over the 0/1 routing map (token-order, its "position"): equal values
    // may be kept in any order.
    let any_tie = case.config.ties == Ties::Any && cap.policy != DropPolicy::Position;
    if any_tie {
        let ranked = match cap.policy {
            DropPolicy::Probs => free.weights.clone(),
            _ => Array2::ones(free.weights.dim()),
        };
        survivors_any_tie(&got, &ranked, want.capacity, case.experts())?;
    }
    for ((ti, j), &w) in want.kept.indexed_iter() {
        if any_tie {
            break;
        }
        if got.kept[[ti, j]] != w {
            return Err(format!(
                "assignment (token {ti}, slot {j}) to expert {}: kept = {}, the {} policy \
                 (capacity {}) says {w}",
                got.indices[[ti, j]],
                got.kept[[ti, j]],
                cap.policy.name(),
                want.capacity
            ));
        }
    }
    let mut sizes = vec![0usize; case.experts()];
    for ((ti, j), &x) in got.indices.indexed_iter() {
        sizes[x] += usize::from(got.kept[[ti, j]]);
    }
    if sizes != got.group_sizes {
        return Err(format!(
            "group_sizes {:?} do not count the kept assignments {sizes:?}",
            got.group_sizes
        ));
    }
    Ok(())
}

/// A ranked drop policy under ties any: each expert keeps `min(capacity, assigned)`
/// assignments, and none it drops ranks higher (in `weights`) than one it keeps (equal ranks
/// may go either way).
fn survivors_any_tie(
    got: &RouteOutputs,
    weights: &Array2<f64>,
    capacity: usize,
    experts: usize,
) -> Result<(), String> {
    for x in 0..experts {
        let (mut kept, mut dropped) = (Vec::new(), Vec::new());
        for ((ti, j), &y) in got.indices.indexed_iter() {
            if y == x {
                let w = weights[[ti, j]];
                if got.kept[[ti, j]] {
                    kept.push(w);
                } else {
                    dropped.push(((ti, j), w));
                }
            }
        }
        let assigned = kept.len() + dropped.len();
        if kept.len() != assigned.min(capacity) {
            return Err(format!(
                "expert {x} keeps {} of its {assigned} assignments, the policy (capacity {capacity}) keeps {}",
                kept.len(),
                assigned.min(capacity)
            ));
        }
        let lightest = kept.iter().copied().fold(f64::INFINITY, f64::min);
        if let Some(((ti, j), _)) = dropped.iter().find(|(_, w)| *w > lightest) {
            return Err(format!(
                "assignment (token {ti}, slot {j}) to expert {x} is dropped although it outranks a kept one"
            ));
        }
    }
    Ok(())
}

pub(super) fn no_renormalisation(
    imp: &dyn Implementation<Route>,
    args: &RouteArgs,
) -> Result<(), String> {
    let case = valid_case(args)?;
    let got = run(imp, &case)?;
    let free = run(imp, &without_capacity(&case))?;
    let precision = imp.precision(&case);
    for ti in 0..case.tokens() {
        let sel: Vec<usize> = free.indices.row(ti).to_vec();
        if got.indices.row(ti).to_vec() != sel {
            return Err(format!("token {ti}: capacity changed the selected experts"));
        }
        for (j, &x) in sel.iter().enumerate() {
            let (a, b) = (got.weights[[ti, j]], free.weights[[ti, j]]);
            if !got.kept[[ti, j]] {
                if a != 0.0 {
                    return Err(format!(
                        "token {ti} slot {j} (expert {x}) is dropped but has weight {a:e}"
                    ));
                }
                continue;
            }
            let bound = 2.0 * weight_bound(&case, precision, ti, &sel, b);
            if (a - b).abs() > bound || a.is_nan() {
                return Err(format!(
                    "token {ti} slot {j} (expert {x}) survives with weight {a:e}, but its weight \
                     without dropping is {b:e}: survivors were renormalised"
                ));
            }
        }
    }
    Ok(())
}
