//! Step 2: group-limited top-k selection, with ties toward the lower index or following an
//! implementation's choice among exactly equal scores.

use std::cmp::Ordering;

use ndarray::{Array2, ArrayView1, ArrayView2};

use super::config::RoutingConfig;

/// The selection order: larger value first, equal values by lower index first. `a` and `b` are
/// `(value, index)`; values are finite (validated), and `-0.0 == 0.0`.
pub fn descending_lower_index_first(a: (f64, usize), b: (f64, usize)) -> Ordering {
    b.0.partial_cmp(&a.0)
        .unwrap_or(Ordering::Equal)
        .then(a.1.cmp(&b.1))
}

/// The `k` indices among `candidates` with the largest `values[i]`, in selection order
/// ([`descending_lower_index_first`]). Reads `values`; `k <= candidates.len()`.
pub fn top_k_of(values: &[f64], candidates: impl Iterator<Item = usize>, k: usize) -> Vec<usize> {
    let mut c: Vec<usize> = candidates.collect();
    c.sort_by(|&a, &b| descending_lower_index_first((values[a], a), (values[b], b)));
    c.truncate(k);
    c
}

/// The group scores of one token's selection scores `u (E,)`, with `groups` groups of `E/G`
/// consecutive experts: the sum of each group's `terms` largest scores
/// ([`GroupScore::terms`]), added largest first.
pub fn group_scores(u: &[f64], groups: usize, terms: usize) -> Vec<f64> {
    let per = u.len() / groups;
    (0..groups)
        .map(|q| {
            let vals = &u[q * per..(q + 1) * per];
            let top = top_k_of(vals, 0..per, terms.min(per));
            top.iter().map(|&i| vals[i]).sum()
        })
        .collect()
}

/// How many scores [`group_scores`] sums per group under `config` (which has a group limit).
pub fn group_terms(config: &RoutingConfig, experts: usize) -> usize {
    let g = config.groups.expect("a group limit");
    config
        .group_score
        .terms(experts / g.groups, config.topk, g.topk_groups)
}

/// The kept groups of one token under `config` (which has a group limit): `true` for the
/// `TG` groups with the largest [`group_scores`] (equal scores: the lower group index is
/// kept).
pub fn kept_groups(u: &[f64], config: &RoutingConfig) -> Vec<bool> {
    kept_groups_preferring(u, config, None)
}

/// [`kept_groups`], with equal group scores broken toward the groups holding an expert of
/// `prefer` (an implementation's selection), then toward the groups whose largest score is
/// smallest (they are the ones that cannot displace a preferred expert), then the lower index.
fn kept_groups_preferring(
    u: &[f64],
    config: &RoutingConfig,
    prefer: Option<&[usize]>,
) -> Vec<bool> {
    let limit = config.groups.expect("a group limit");
    let scores = group_scores(u, limit.groups, group_terms(config, u.len()));
    let per = u.len() / limit.groups;
    let mut order: Vec<usize> = (0..limit.groups).collect();
    let holds = |q: usize| prefer.is_some_and(|p| p.iter().any(|&e| e / per == q));
    let top = |q: usize| {
        u[q * per..(q + 1) * per]
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max)
    };
    order.sort_by(|&a, &b| {
        let by_score = scores[b].partial_cmp(&scores[a]).unwrap_or(Ordering::Equal);
        match prefer {
            None => by_score.then(a.cmp(&b)),
            Some(_) => by_score
                .then(holds(b).cmp(&holds(a)))
                .then(top(a).partial_cmp(&top(b)).unwrap_or(Ordering::Equal))
                .then(a.cmp(&b)),
        }
    });
    let mut keep = vec![false; limit.groups];
    for &q in order.iter().take(limit.topk_groups) {
        keep[q] = true;
    }
    keep
}

/// Step 2 for all tokens: `indices (T, K)` in selection order and, with a group limit, the
/// kept-group mask `(T, G)`. Reads the selection scores `u (T, E)` (`s + b`).
///
/// Exact ties go to the lower index, or with `prefer` (an implementation's `indices (T, K)`,
/// for [`Ties::Any`](super::Ties::Any)) to the implementation's choice: among equal scores
/// its experts come first, in its order. Where its selection is one that some tie order
/// gives, the result is its selection; otherwise the two differ and the comparison says so.
pub fn select(
    u: &Array2<f64>,
    config: &RoutingConfig,
    prefer: Option<ArrayView2<usize>>,
) -> (Array2<usize>, Option<Array2<bool>>) {
    let (t, e) = u.dim();
    let topk = config.topk;
    // Rows as slices: a Fortran-order array (strided rows) is copied once into row order.
    let u = u.as_standard_layout();
    let mut indices = Array2::zeros((t, topk));
    let mut mask = config
        .groups
        .map(|g| Array2::from_elem((t, g.groups), false));
    for ti in 0..t {
        let row: ArrayView1<f64> = u.row(ti);
        let row = row.as_slice().expect("standard layout");
        let want: Option<Vec<usize>> =
            prefer.map(|p| p.row(ti).iter().copied().filter(|&x| x < e).collect());
        // The tie rank of expert x: its slot in the preferred selection, else after them all.
        let rank = |x: usize| match &want {
            Some(w) => w.iter().position(|&y| y == x).unwrap_or(topk + x),
            None => x,
        };
        let allowed: Vec<usize> = match config.groups {
            None => (0..e).collect(),
            Some(limit) => {
                let keep = kept_groups_preferring(row, config, want.as_deref());
                let per = e / limit.groups;
                if let Some(m) = mask.as_mut() {
                    keep.iter().enumerate().for_each(|(q, &k)| m[[ti, q]] = k);
                }
                (0..e).filter(|&x| keep[x / per]).collect()
            }
        };
        let mut picked = allowed;
        picked.sort_by(|&a, &b| {
            row[b]
                .partial_cmp(&row[a])
                .unwrap_or(Ordering::Equal)
                .then(rank(a).cmp(&rank(b)))
        });
        for (j, &x) in picked.iter().take(topk).enumerate() {
            indices[[ti, j]] = x;
        }
    }
    (indices, mask)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ties_go_to_the_lower_index() {
        assert_eq!(top_k_of(&[1.0, 2.0, 2.0, 1.0], 0..4, 3), vec![1, 2, 0]);
        assert_eq!(top_k_of(&[0.0, -0.0], 0..2, 1), vec![0]);
    }

    #[test]
    fn group_score_is_the_top_two_sum() {
        // Group 0: one high expert (top-1 = 5, top-2 sum = 5); group 1: two medium (4 + 4 = 8).
        let u = [5.0, 0.0, 4.0, 4.0];
        assert_eq!(group_scores(&u, 2, 2), vec![5.0, 8.0]);
        let mut config = RoutingConfig::new(2, super::super::ScoreFunction::Sigmoid);
        config.groups = Some(super::super::GroupLimit {
            groups: 2,
            topk_groups: 1,
        });
        assert_eq!(kept_groups(&u, &config), vec![false, true]);
        // Scored by their maximum, group 0 wins.
        config.group_score = super::super::GroupScore::Max;
        assert_eq!(kept_groups(&u, &config), vec![true, false]);
    }
}
