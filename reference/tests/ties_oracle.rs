//! A brute-force oracle for `ties = any`: on small cases, every candidate output (every ordered
//! tuple of experts, duplicates included; every kept mask) is compared, and the comparison must
//! pass exactly when some tie order gives that output. The tests take about two minutes in a
//! debug build, so they are `#[ignore]`d in CI; run them after touching the tie logic with
//! `cargo test -p moecheck-reference --test ties_oracle -- --ignored`.

use moecheck_reference::format::Format;
use moecheck_reference::routing::scores::{gates, normalise_and_scale, scores};
use moecheck_reference::routing::topk::{group_scores, group_terms};
use moecheck_reference::routing::{
    apply_capacity, compare_routing, route, Capacity, DropPolicy, GroupLimit, GroupScore,
    RouteOutputs, RoutePrecision, RoutingCase, RoutingConfig, ScoreFunction, Ties,
};
use ndarray::{Array1, Array2};

const F64P: RoutePrecision = RoutePrecision {
    compute: Format::F64,
    output: Format::F64,
};

fn tuples(e: usize, k: usize) -> Vec<Vec<usize>> {
    let mut out = vec![vec![]];
    for _ in 0..k {
        let mut next = vec![];
        for t in &out {
            for x in 0..e {
                if !t.contains(&x) {
                    let mut n = t.clone();
                    n.push(x);
                    next.push(n);
                }
            }
        }
        out = next;
    }
    out
}

fn subsets(n: usize, k: usize) -> Vec<Vec<usize>> {
    (0u32..(1 << n))
        .filter(|m| m.count_ones() as usize == k)
        .map(|m| (0..n).filter(|i| m >> i & 1 == 1).collect())
        .collect()
}

/// Some tie order selects `x` (in this slot order) from selection scores `u`.
fn valid_selection(u: &[f64], cfg: &RoutingConfig, x: &[usize]) -> bool {
    let e = u.len();
    let sets: Vec<Vec<bool>> = match cfg.groups {
        None => vec![vec![true; e]],
        Some(g) => {
            let per = e / g.groups;
            let sc = group_scores(u, g.groups, group_terms(cfg, e));
            subsets(g.groups, g.topk_groups)
                .into_iter()
                .filter(|s| {
                    let lo = s.iter().map(|&q| sc[q]).fold(f64::INFINITY, f64::min);
                    let hi = (0..g.groups)
                        .filter(|q| !s.contains(q))
                        .map(|q| sc[q])
                        .fold(f64::NEG_INFINITY, f64::max);
                    lo >= hi
                })
                .map(|s| (0..e).map(|y| s.contains(&(y / per))).collect())
                .collect()
        }
    };
    let distinct = x.iter().enumerate().all(|(i, a)| !x[..i].contains(a));
    distinct
        && sets.iter().any(|allowed| {
            x.iter().all(|&y| allowed[y])
                && x.windows(2).all(|w| u[w[0]] >= u[w[1]])
                && (0..e)
                    .filter(|y| allowed[*y] && !x.contains(y))
                    .all(|y| u[y] <= u[*x.last().unwrap()])
        })
}

fn outputs(case: &RoutingCase, idx: &Array2<usize>, kept: &Array2<bool>) -> RouteOutputs {
    let s = scores(&case.logits, case.config.score);
    let g = gates(&s, idx, case.config.score);
    let (w, _) = normalise_and_scale(&g, &case.config);
    let weights = ndarray::Zip::from(&w)
        .and(kept)
        .map_collect(|&w, &k| if k { w } else { 0.0 });
    let mut sizes = vec![0; case.experts()];
    ndarray::Zip::from(idx)
        .and(kept)
        .for_each(|&e, &k| sizes[e] += usize::from(k));
    RouteOutputs {
        indices: idx.clone(),
        weights,
        kept: kept.clone(),
        group_sizes: sizes,
        weights_format: None,
    }
}

fn check(case: &RoutingCase, got: &RouteOutputs) -> bool {
    let want = route(case).unwrap();
    compare_routing(case, &want, got, F64P).passed()
}

/// Every vector of length `len` over `vals` (repeats allowed).
fn product<T: Clone>(len: usize, vals: &[T]) -> Vec<Vec<T>> {
    let mut out = vec![vec![]];
    for _ in 0..len {
        let mut next = vec![];
        for r in &out {
            for v in vals {
                let mut n = r.clone();
                n.push(v.clone());
                next.push(n);
            }
        }
        out = next;
    }
    out
}

/// Rows of `e` logits over `vals`.
fn rows(e: usize, vals: &[f64]) -> Vec<Vec<f64>> {
    product(e, vals)
}

/// Group-limited `score` routing with `ties = any`, when valid for one token of `e` experts.
fn grouped_any(
    score: ScoreFunction,
    e: usize,
    (k, g, tg): (usize, usize, usize),
    gs: GroupScore,
) -> Option<RoutingConfig> {
    let mut cfg = RoutingConfig::new(k, score);
    cfg.groups = Some(GroupLimit {
        groups: g,
        topk_groups: tg,
    });
    cfg.group_score = gs;
    cfg.ties = Ties::Any;
    cfg.validate(1, e).ok().map(|()| cfg)
}

/// Every candidate selection in `candidates` of the one-token `case` (selection scores `u`)
/// must pass exactly when some tie order gives it; a disagreement is pushed to `failures`,
/// described by `what`.
fn check_selections(
    case: &RoutingCase,
    u: &[f64],
    candidates: Vec<Vec<usize>>,
    what: &dyn Fn(&[usize], bool) -> String,
    failures: &mut Vec<String>,
) {
    let k = case.config.topk;
    for x in candidates {
        let idx = Array2::from_shape_vec((1, k), x.clone()).unwrap();
        let kept = Array2::from_elem((1, k), true);
        let got = outputs(case, &idx, &kept);
        let ok = valid_selection(u, &case.config, &x);
        if ok != check(case, &got) {
            failures.push(what(&x, ok));
        }
    }
}

fn assert_none(failures: &[String]) {
    assert!(
        failures.is_empty(),
        "{} failures, first: {:#?}",
        failures.len(),
        &failures[..failures.len().min(10)]
    );
}

/// Selection only (T = 1): all rows of a small grid, every group score, every K.
#[test]
#[ignore = "brute force, ~2 min: cargo test --test ties_oracle -- --ignored"]
fn oracle_selection_groups() {
    let mut failures = vec![];
    for (e, g) in [(6usize, 3usize), (6, 2), (4, 2), (6, 1)] {
        let per = e / g;
        for tg in 1..=g {
            for k in 1..=(tg * per).min(3) {
                for gs in GroupScore::ALL {
                    let Some(cfg) = grouped_any(ScoreFunction::TopkSoftmax, e, (k, g, tg), gs)
                    else {
                        continue;
                    };
                    for row in rows(e, &[0.0, 1.0, 2.0]) {
                        let case = RoutingCase {
                            logits: Array2::from_shape_vec((1, e), row.clone()).unwrap(),
                            bias: None,
                            config: cfg,
                        };
                        let what = |x: &[usize], ok| {
                            format!(
                                "E={e} G={g} TG={tg} K={k} {} row {row:?} got {x:?}: valid={ok}",
                                gs.name()
                            )
                        };
                        check_selections(&case, &row, tuples(e, k), &what, &mut failures);
                    }
                }
            }
        }
    }
    assert_none(&failures);
}

/// With a bias (sigmoid): ties in u = s + b.
#[test]
#[ignore = "brute force, ~2 min: cargo test --test ties_oracle -- --ignored"]
fn oracle_selection_bias() {
    let mut failures = vec![];
    let (e, g) = (4usize, 2usize);
    for tg in 1..=2 {
        for k in 1..=2 {
            for gs in GroupScore::ALL {
                let Some(cfg) = grouped_any(ScoreFunction::Sigmoid, e, (k, g, tg), gs) else {
                    continue;
                };
                for row in rows(e, &[0.0, 1.0]) {
                    for b in rows(e, &[0.0, 0.5]) {
                        let case = RoutingCase {
                            logits: Array2::from_shape_vec((1, e), row.clone()).unwrap(),
                            bias: Some(Array1::from(b.clone())),
                            config: cfg,
                        };
                        let r = route(&case).unwrap();
                        let u: Vec<f64> = r.selection_scores.row(0).to_vec();
                        let what = |x: &[usize], ok| {
                            format!(
                                "TG={tg} K={k} {} row {row:?} bias {b:?} got {x:?}: valid={ok}",
                                gs.name()
                            )
                        };
                        check_selections(&case, &u, tuples(e, k), &what, &mut failures);
                    }
                }
            }
        }
    }
    assert_none(&failures);
}

/// Some tie order keeps `kept` under `cap` (probs / token-order), given indices and weights.
fn valid_kept(
    idx: &Array2<usize>,
    w: &Array2<f64>,
    kept: &Array2<bool>,
    e: usize,
    cap: &Capacity,
) -> bool {
    let (t, k) = idx.dim();
    match cap.policy {
        DropPolicy::Position => apply_capacity(idx, w, e, cap, None).kept == *kept,
        _ => {
            let c = moecheck_reference::routing::probs_capacity(t, k, e, cap.factor);
            (0..e).all(|x| {
                let list: Vec<(usize, usize)> = (0..t)
                    .flat_map(|ti| (0..k).map(move |j| (ti, j)))
                    .filter(|&(ti, j)| idx[[ti, j]] == x)
                    .collect();
                let nk = list.iter().filter(|&&a| kept[a]).count();
                if nk != c.min(list.len()) {
                    return false;
                }
                if cap.policy == DropPolicy::TokenOrder {
                    return true;
                }
                let lo = list
                    .iter()
                    .filter(|&&a| kept[a])
                    .map(|&a| w[a])
                    .fold(f64::INFINITY, f64::min);
                let hi = list
                    .iter()
                    .filter(|&&a| !kept[a])
                    .map(|&a| w[a])
                    .fold(f64::NEG_INFINITY, f64::max);
                lo >= hi
            })
        }
    }
}

/// Capacity (T = 3): every valid selection, every kept mask.
#[test]
#[ignore = "brute force, ~2 min: cargo test --test ties_oracle -- --ignored"]
fn oracle_capacity() {
    let mut failures = vec![];
    let e = 3usize;
    let t = 3usize;
    for (k, cf) in [(1, 0.5), (2, 0.5), (2, 1.0), (1, 1.5)] {
        for policy in [
            DropPolicy::Probs,
            DropPolicy::TokenOrder,
            DropPolicy::Position,
        ] {
            for score in [ScoreFunction::Softmax, ScoreFunction::Sigmoid] {
                let mut cfg = RoutingConfig::new(k, score);
                cfg.ties = Ties::Any;
                cfg.capacity = Some(Capacity {
                    factor: cf,
                    policy,
                    seq_len: None,
                });
                let cap = cfg.capacity.unwrap();
                // Every token's row from a small grid (rows may repeat: equal weights).
                let grid = rows(e, &[0.0, 1.0]);
                for r0 in 0..grid.len() {
                    for r1 in 0..grid.len() {
                        for r2 in [0usize, 3, 7] {
                            let flat: Vec<f64> =
                                [r0, r1, r2].iter().flat_map(|&r| grid[r].clone()).collect();
                            let logits = Array2::from_shape_vec((t, e), flat).unwrap();
                            let case = RoutingCase {
                                logits,
                                bias: None,
                                config: cfg,
                            };
                            let r = route(&case).unwrap();
                            let sel: Vec<Vec<Vec<usize>>> = (0..t)
                                .map(|ti| {
                                    let u: Vec<f64> = r.selection_scores.row(ti).to_vec();
                                    tuples(e, k)
                                        .into_iter()
                                        .filter(|x| valid_selection(&u, &cfg, x))
                                        .collect()
                                })
                                .collect();
                            for a in &sel[0] {
                                for b in &sel[1] {
                                    for c in &sel[2] {
                                        let flat: Vec<usize> =
                                            a.iter().chain(b).chain(c).copied().collect();
                                        let idx = Array2::from_shape_vec((t, k), flat).unwrap();
                                        let all = Array2::from_elem((t, k), true);
                                        let w = outputs(&case, &idx, &all).weights;
                                        for m in 0u32..(1 << (t * k)) {
                                            let kept = Array2::from_shape_fn((t, k), |(ti, j)| {
                                                m >> (ti * k + j) & 1 == 1
                                            });
                                            let got = outputs(&case, &idx, &kept);
                                            let ok = valid_kept(&idx, &w, &kept, e, &cap);
                                            if ok != check(&case, &got) {
                                                failures.push(format!(
                                                    "K={k} {} {} logits {:?} idx {:?} kept {:?}: valid={ok}",
                                                    policy.name(),
                                                    score.name(),
                                                    case.logits.as_slice().unwrap(),
                                                    idx.as_slice().unwrap(),
                                                    kept.as_slice().unwrap()
                                                ));
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    assert_none(&failures);
}

/// Four groups of two, duplicates allowed in the candidate.
#[test]
#[ignore = "brute force, ~2 min: cargo test --test ties_oracle -- --ignored"]
fn oracle_selection_four_groups_with_duplicates() {
    let mut failures = vec![];
    let (e, g) = (8usize, 4usize);
    let experts: Vec<usize> = (0..e).collect();
    for tg in 1..=3 {
        for k in 1..=3 {
            for gs in GroupScore::ALL {
                let Some(cfg) = grouped_any(ScoreFunction::TopkSoftmax, e, (k, g, tg), gs) else {
                    continue;
                };
                for row in rows(e, &[0.0, 1.0]) {
                    let case = RoutingCase {
                        logits: Array2::from_shape_vec((1, e), row.clone()).unwrap(),
                        bias: None,
                        config: cfg,
                    };
                    let what = |x: &[usize], ok| {
                        format!(
                            "TG={tg} K={k} {} row {row:?} got {x:?}: valid={ok}",
                            gs.name()
                        )
                    };
                    check_selections(&case, &row, product(k, &experts), &what, &mut failures);
                }
            }
        }
    }
    assert_none(&failures);
}
