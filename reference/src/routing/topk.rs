//! Step 2: group-limited top-k selection with ties toward the lower index.

use std::cmp::Ordering;

use ndarray::{Array2, ArrayView1};

use super::config::GroupLimit;

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

/// The group scores `σ_q = Σ (the min(2, E/G) largest u[e], e in group q)` of one token's
/// selection scores `u (E,)`, with groups of `E/G` consecutive experts. The two terms are
/// added largest first.
pub fn group_scores(u: &[f64], groups: usize) -> Vec<f64> {
    let per = u.len() / groups;
    (0..groups)
        .map(|q| {
            let vals = &u[q * per..(q + 1) * per];
            let top = top_k_of(vals, 0..per, per.min(2));
            top.iter().map(|&i| vals[i]).sum()
        })
        .collect()
}

/// The kept groups of one token: `true` for the `TG` groups with the largest
/// [`group_scores`] (equal scores: the lower group index is kept).
pub fn kept_groups(u: &[f64], limit: GroupLimit) -> Vec<bool> {
    let scores = group_scores(u, limit.groups);
    let mut keep = vec![false; limit.groups];
    for q in top_k_of(&scores, 0..limit.groups, limit.topk_groups) {
        keep[q] = true;
    }
    keep
}

/// Step 2 for all tokens: `indices (T, K)` in selection order and, with a group limit, the
/// kept-group mask `(T, G)`. Reads the selection scores `u (T, E)` (`s + b`).
pub fn select(
    u: &Array2<f64>,
    topk: usize,
    groups: Option<GroupLimit>,
) -> (Array2<usize>, Option<Array2<bool>>) {
    let (t, e) = u.dim();
    // Rows as slices: a Fortran-order array (strided rows) is copied once into row order.
    let u = u.as_standard_layout();
    let mut indices = Array2::zeros((t, topk));
    let mut mask = groups.map(|g| Array2::from_elem((t, g.groups), false));
    for ti in 0..t {
        let row: ArrayView1<f64> = u.row(ti);
        let row = row.as_slice().expect("standard layout");
        let picked = match groups {
            None => top_k_of(row, 0..e, topk),
            Some(limit) => {
                let keep = kept_groups(row, limit);
                let per = e / limit.groups;
                if let Some(m) = mask.as_mut() {
                    keep.iter().enumerate().for_each(|(q, &k)| m[[ti, q]] = k);
                }
                top_k_of(row, (0..e).filter(|&x| keep[x / per]), topk)
            }
        };
        for (j, x) in picked.into_iter().enumerate() {
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
        assert_eq!(group_scores(&u, 2), vec![5.0, 8.0]);
        let keep = kept_groups(
            &u,
            GroupLimit {
                groups: 2,
                topk_groups: 1,
            },
        );
        assert_eq!(keep, vec![false, true]);
    }
}
