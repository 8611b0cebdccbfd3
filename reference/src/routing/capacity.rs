//! Step 4: capacity dropping, per assignment, with the three public policies.

use std::cmp::Ordering;

use ndarray::{Array2, ArrayView2};

use super::config::{Capacity, DropPolicy};

/// MaxText `generate_masks`: the capacity of each expert within one sequence of `seq_len`
/// tokens, `int(max(ceil(S·K/E)·cf, cf))`, evaluated as Python does (`S·K/E` a float
/// division, `ceil` to an integer, the product in f64, `int` truncating).
///
/// ```
/// use moecheck_reference::routing::position_capacity;
/// assert_eq!(position_capacity(8, 2, 4, 1.0), 4);
/// assert_eq!(position_capacity(8, 2, 4, 1.25), 5); // int(4 * 1.25)
/// assert_eq!(position_capacity(1, 1, 64, 0.5), 0); // int(max(1 * 0.5, 0.5))
/// ```
pub fn position_capacity(seq_len: usize, topk: usize, experts: usize, cf: f64) -> usize {
    let base = ((seq_len * topk) as f64 / experts as f64).ceil();
    (base * cf).max(cf).trunc() as usize
}

/// Megatron `get_capacity(num_tokens = T·K, num_experts = E, capacity_factor = cf)`:
/// `ceil((T·K)/E · cf)`, the division and product in f64.
///
/// ```
/// use moecheck_reference::routing::probs_capacity;
/// assert_eq!(probs_capacity(8, 2, 4, 1.0), 4);
/// assert_eq!(probs_capacity(8, 2, 4, 1.1), 5); // ceil(4.4)
/// ```
pub fn probs_capacity(tokens: usize, topk: usize, experts: usize, cf: f64) -> usize {
    ((tokens * topk) as f64 / experts as f64 * cf).ceil() as usize
}

/// The outcome of capacity dropping.
#[derive(Debug, Clone, PartialEq)]
pub struct CapacityResult {
    /// `kept[t, j]`: assignment `(t, j)` survives.
    pub kept: Array2<bool>,
    /// The capacity `C` per expert (per sequence for `position`).
    pub capacity: usize,
}

/// Applies `cap` to the assignments `indices (T, K)` of `experts` experts, ranking by
/// `weights (T, K)` for the `probs` policy (the weights after normalisation and scaling, as
/// Megatron's `routing_probs`). Reads both; `T` must be a multiple of the sequence length
/// (validated by [`super::RoutingConfig::validate`]).
///
/// * `position`: per sequence of `S` tokens and per expert, the first `C` assignments in
///   token-major, slot-minor order are kept.
/// * `probs`: per expert, the `C` assignments with the largest weight are kept; equal
///   weights: lower token index first (a token selects an expert at most once).
/// * `token-order`: per expert, the `C` assignments of the lowest token indices are kept
///   (`C` as for `probs`).
///
/// With `prefer` (an implementation's `kept (T, K)`, for [`Ties::Any`](super::Ties::Any)),
/// the choices among equal values follow it: under `probs` between equal weights, under
/// `token-order` between any of the expert's assignments (Megatron ranks them with
/// `torch.topk` over a 0/1 map, all equal). `position` has no ties: its order is fixed.
pub fn apply_capacity(
    indices: &Array2<usize>,
    weights: &Array2<f64>,
    experts: usize,
    cap: &Capacity,
    prefer: Option<ArrayView2<bool>>,
) -> CapacityResult {
    let (t, k) = indices.dim();
    let mut kept = Array2::from_elem((t, k), false);
    // Whether the implementation kept (t, j): preferred first among equals.
    let first = |a: (usize, usize), b: (usize, usize)| match prefer {
        Some(p) => p[b].cmp(&p[a]),
        None => Ordering::Equal,
    };
    match cap.policy {
        DropPolicy::Position => {
            let s = cap.seq_len.unwrap_or(t).max(1);
            let c = position_capacity(s, k, experts, cap.factor);
            for start in (0..t).step_by(s) {
                let mut count = vec![0usize; experts];
                for ti in start..(start + s).min(t) {
                    for j in 0..k {
                        let e = indices[[ti, j]];
                        count[e] += 1;
                        kept[[ti, j]] = count[e] <= c;
                    }
                }
            }
            CapacityResult { kept, capacity: c }
        }
        DropPolicy::Probs | DropPolicy::TokenOrder => {
            let c = probs_capacity(t, k, experts, cap.factor);
            let mut per_expert: Vec<Vec<(usize, usize)>> = vec![Vec::new(); experts];
            for ti in 0..t {
                for j in 0..k {
                    per_expert[indices[[ti, j]]].push((ti, j));
                }
            }
            for list in &mut per_expert {
                list.sort_by(|&a, &b| {
                    let by_weight = match cap.policy {
                        DropPolicy::Probs => weights[b]
                            .partial_cmp(&weights[a])
                            .unwrap_or(Ordering::Equal),
                        _ => Ordering::Equal,
                    };
                    by_weight.then(first(a, b)).then(a.0.cmp(&b.0))
                });
                for &(ti, j) in list.iter().take(c) {
                    kept[[ti, j]] = true;
                }
            }
            CapacityResult { kept, capacity: c }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    /// Known answers of both capacity formulas, worked by hand.
    #[test]
    fn capacity_known_answers() {
        // int(max(ceil(S·K/E)·cf, cf)).
        assert_eq!(position_capacity(8, 2, 4, 1.0), 4); // ceil(16/4) = 4
        assert_eq!(position_capacity(8, 2, 4, 1.25), 5); // int(4·1.25)
        assert_eq!(position_capacity(5, 2, 4, 1.0), 3); // ceil(10/4 = 2.5)
        assert_eq!(position_capacity(3, 1, 4, 2.0), 2); // ceil(0.75)·2
        assert_eq!(position_capacity(6, 1, 4, 0.7), 1); // int(2·0.7 = 1.4)
        assert_eq!(position_capacity(1, 1, 64, 0.5), 0); // int(max(0.5, 0.5))
        assert_eq!(position_capacity(0, 1, 4, 2.5), 2); // int(max(0, 2.5))
                                                        // ceil((T·K)/E·cf).
        assert_eq!(probs_capacity(8, 2, 4, 1.0), 4);
        assert_eq!(probs_capacity(8, 2, 4, 1.1), 5); // ceil(4.4)
        assert_eq!(probs_capacity(3, 2, 4, 1.0), 2); // ceil(1.5)
        assert_eq!(probs_capacity(7, 1, 2, 0.5), 2); // ceil(1.75)
        assert_eq!(probs_capacity(6, 1, 4, 2.0), 3); // ceil(1.5·2)
    }

    /// Capacity 2 with experts below, at and above it: an expert with fewer assignments than
    /// `C` keeps them all, the `C+1`-th is dropped, per sequence.
    #[test]
    fn position_policy_keeps_up_to_capacity() {
        // E = 4, K = 2, S = 4: C = ceil(8/4) = 2. Sequence 0: expert 0 gets 3 assignments
        // (the third dropped), expert 1 two, expert 2 one, expert 3 none.
        let idx = array![
            [0usize, 1],
            [0, 1],
            [0, 2],
            [3, 2],
            [0, 1],
            [0, 1],
            [0, 1],
            [2, 3]
        ];
        let w = Array2::from_elem((8, 2), 0.5);
        let cap = Capacity {
            factor: 1.0,
            policy: DropPolicy::Position,
            seq_len: Some(4),
        };
        let r = apply_capacity(&idx, &w, 4, &cap, None);
        assert_eq!(r.capacity, 2);
        assert_eq!(
            r.kept,
            array![
                [true, true],
                [true, true],
                [false, true],
                [true, true],
                [true, true],
                [true, true],
                [false, false],
                [true, true]
            ]
        );
    }

    /// The worked example in MaxText's `generate_masks`: E = 4, K = 2, tokens routed to
    /// [0, 1] and [1, 3], capacity 1: the second token's assignment to expert 1 is dropped.
    #[test]
    fn position_policy_matches_the_maxtext_example() {
        let idx = array![[0usize, 1], [1, 3]];
        let w = array![[0.5, 0.5], [0.5, 0.5]];
        let cap = Capacity {
            factor: 1.0,
            policy: DropPolicy::Position,
            seq_len: None,
        };
        // S·K/E = 1, so C = 1.
        let r = apply_capacity(&idx, &w, 4, &cap, None);
        assert_eq!(r.capacity, 1);
        assert_eq!(r.kept, array![[true, true], [false, true]]);
    }

    #[test]
    fn position_policy_counts_per_sequence() {
        let idx = array![[0usize], [0], [0], [0]];
        let w = array![[1.0], [1.0], [1.0], [1.0]];
        let cap = Capacity {
            factor: 1.0,
            policy: DropPolicy::Position,
            seq_len: Some(2),
        };
        // Per sequence of 2 tokens, E = 2: C = ceil(2/2) = 1.
        let r = apply_capacity(&idx, &w, 2, &cap, None);
        assert_eq!(r.kept, array![[true], [false], [true], [false]]);
    }

    #[test]
    fn probs_policy_keeps_the_largest_weights_ties_to_the_lower_token() {
        let idx = array![[0usize], [0], [0], [1]];
        let w = array![[0.2], [0.9], [0.2], [0.5]];
        let cap = Capacity {
            factor: 1.0,
            policy: DropPolicy::Probs,
            seq_len: None,
        };
        // C = ceil(4·1/2) = 2: token 1 (0.9) and token 0 (0.2, lower index than token 2).
        let r = apply_capacity(&idx, &w, 2, &cap, None);
        assert_eq!(r.capacity, 2);
        assert_eq!(r.kept, array![[true], [true], [false], [true]]);
    }
}
