//! Routing properties: each a named check of one implementation of [`Route`] over generated
//! cases.
//!
//! Besides agreement with the reference, each property checks one documented rule from the
//! implementation's own outputs (metamorphic or by recomputing the rule), so a failure names
//! the rule that broke rather than only "differs from the reference".

use moecheck_reference::op::Implementation;
use moecheck_reference::routing::scores::{gates, normalise_and_scale, scores};
use moecheck_reference::routing::topk::{group_scores, group_terms, kept_groups};
use moecheck_reference::routing::{
    weight_bound, Route, RoutingCase, ScoreFunction, SlotOrder, Ties,
};
use ndarray::Array2;

use super::capacity::{capacity_survivors, no_renormalisation};
use super::domain::{self, RouteDomain};
use super::outputs::{run, valid_case};
use super::strategies::{route_args, RouteArgs, RouteRequire};
use crate::property::{verified, Property, PropertyOp};

impl PropertyOp for Route {
    type Args = RouteArgs;
    type Domain = RouteDomain;

    fn properties() -> Vec<Property<Route>> {
        vec![
            Property {
                name: "route-matches-reference",
                description:
                    "indices, kept and group_sizes equal the reference, weights within bound",
                strategy: || route_args(RouteRequire::default()),
                test: |imp, a| matches_reference(imp, a).into(),
                case: None,
            },
            Property {
                name: "capacity-survivors",
                description: "kept per expert <= capacity, exactly the documented survivors",
                strategy: || {
                    route_args(RouteRequire {
                        capacity: Some(true),
                        ..RouteRequire::default()
                    })
                },
                test: |imp, a| capacity_survivors(imp, a).into(),
                case: None,
            },
            Property {
                name: "no-renormalisation",
                description: "surviving weights equal the weights without dropping",
                strategy: || {
                    route_args(RouteRequire {
                        capacity: Some(true),
                        ..RouteRequire::default()
                    })
                },
                test: |imp, a| no_renormalisation(imp, a).into(),
                case: None,
            },
            Property {
                name: "token-permutation-equivariance",
                description: "without dropping, permuting tokens permutes the routing",
                strategy: || {
                    route_args(RouteRequire {
                        capacity: Some(false),
                        ..RouteRequire::default()
                    })
                },
                test: |imp, a| permutation_equivariance(imp, a).into(),
                case: None,
            },
            Property {
                name: "ties-to-lower-index",
                description: "equal selection scores go to the lower expert (and group) index",
                strategy: || {
                    route_args(RouteRequire {
                        ties: true,
                        ..RouteRequire::default()
                    })
                },
                test: |imp, a| ties_to_lower_index(imp, a).into(),
                case: None,
            },
            Property {
                name: "weights-from-prebias-scores",
                description:
                    "combine weights come from the pre-bias scores of the selected experts",
                strategy: || {
                    route_args(RouteRequire {
                        bias: true,
                        capacity: Some(false),
                        ..RouteRequire::default()
                    })
                },
                test: |imp, a| weights_from_prebias(imp, a).into(),
                case: None,
            },
            Property {
                name: "group-limited-selection",
                description: "selected experts lie in the top groups by the declared group score",
                strategy: || {
                    route_args(RouteRequire {
                        groups: true,
                        ..RouteRequire::default()
                    })
                },
                test: |imp, a| group_limited_selection(imp, a).into(),
                case: None,
            },
            Property {
                name: "sigmoid-k1-weight",
                description: "at K = 1 a sigmoid weight is α·s/(s + ε) (always) or α·s (skip-k1, never)",
                strategy: || {
                    route_args(RouteRequire {
                        k1_sigmoid: true,
                        capacity: Some(false),
                        ..RouteRequire::default()
                    })
                },
                test: |imp, a| sigmoid_weight(imp, a).into(),
                case: None,
            },
            Property {
                name: "sigmoid-weight",
                description: "sigmoid weights are α·s/(Σ s + ε) where normalised (always; skip-k1 at K > 1), α·s where not (never)",
                strategy: || {
                    route_args(RouteRequire {
                        sigmoid: true,
                        capacity: Some(false),
                        ..RouteRequire::default()
                    })
                },
                test: |imp, a| sigmoid_weight(imp, a).into(),
                case: None,
            },
        ]
    }

    fn case_of(args: &RouteArgs) -> (RoutingCase, ()) {
        (args.build(), ())
    }

    fn fit(domain: &RouteDomain, args: &RouteArgs) -> Result<RouteArgs, String> {
        domain.fit(args)
    }
    fn relaxed(domain: &RouteDomain, name: &str) -> Option<String> {
        domain.relaxed(name)
    }
    const EDGES: &'static [&'static str] = domain::EDGES;
    fn edges(args: &RouteArgs) -> Vec<&'static str> {
        domain::edges(args)
    }
}

/// The reference selection scores `u = s + b`.
fn selection_scores(case: &RoutingCase) -> Array2<f64> {
    let s = scores(&case.logits, case.config.score);
    match &case.bias {
        Some(b) => &s + &b.view().insert_axis(ndarray::Axis(0)),
        None => s,
    }
}

fn matches_reference(imp: &dyn Implementation<Route>, args: &RouteArgs) -> Result<(), String> {
    verified(imp, &valid_case(args)?, ())
}

fn permutation_equivariance(
    imp: &dyn Implementation<Route>,
    args: &RouteArgs,
) -> Result<(), String> {
    let case = valid_case(args)?;
    let t = case.tokens();
    // perm[new] = old: reversed, then rotated by a seed-dependent amount.
    let rot = (args.value_seed as usize) % t.max(1);
    let perm: Vec<usize> = (0..t).map(|i| (t - 1 - i + rot) % t).collect();
    let mut moved = case.clone();
    for (new, &old) in perm.iter().enumerate() {
        moved.logits.row_mut(new).assign(&case.logits.row(old));
    }
    let a = run(imp, &case)?;
    let b = run(imp, &moved)?;
    let precision = imp.precision(&case);
    // Under slot order any a token's experts are a set: each slot is matched by its expert.
    let any_order = case.config.slot_order == SlotOrder::Any;
    let sorted = |mut v: Vec<usize>| {
        if any_order {
            v.sort_unstable();
        }
        v
    };
    for (new, &old) in perm.iter().enumerate() {
        let sel: Vec<usize> = a.indices.row(old).to_vec();
        let moved_sel: Vec<usize> = b.indices.row(new).to_vec();
        if sorted(moved_sel.clone()) != sorted(sel.clone()) {
            return Err(format!(
                "token {old} moved to position {new} selects {moved_sel:?} instead of {sel:?}"
            ));
        }
        for (j, &expert) in sel.iter().enumerate() {
            // The slot of the same expert at the new position (`j` itself in score order).
            let jn = if any_order {
                moved_sel.iter().position(|&y| y == expert).unwrap_or(j)
            } else {
                j
            };
            if a.kept[[old, j]] != b.kept[[new, jn]] {
                return Err(format!(
                    "token {old} slot {j}: kept = {} at position {old} but {} at position {new}",
                    a.kept[[old, j]],
                    b.kept[[new, jn]]
                ));
            }
            let (x, y) = (a.weights[[old, j]], b.weights[[new, jn]]);
            if (x - y).abs() > 2.0 * weight_bound(&case, precision, old, &sel, x) {
                return Err(format!(
                    "token {old} slot {j}: weight {x:e} at position {old} but {y:e} at {new}"
                ));
            }
        }
    }
    if a.group_sizes != b.group_sizes {
        return Err(format!(
            "group_sizes {:?} become {:?} when the tokens are permuted",
            a.group_sizes, b.group_sizes
        ));
    }
    Ok(())
}

fn ties_to_lower_index(imp: &dyn Implementation<Route>, args: &RouteArgs) -> Result<(), String> {
    let case = valid_case(args)?;
    let got = run(imp, &case)?;
    let u = selection_scores(&case);
    let e = case.experts();
    for ti in 0..case.tokens() {
        let row = u.row(ti);
        let row = row.as_slice().expect("standard layout");
        let allowed: Vec<bool> = match case.config.groups {
            None => vec![true; e],
            Some(limit) => {
                let keep = kept_groups(row, &case.config);
                let per = e / limit.groups;
                (0..e).map(|x| keep[x / per]).collect()
            }
        };
        let sel: Vec<usize> = got.indices.row(ti).to_vec();
        for w in sel.windows(2) {
            let (a, b) = (w[0], w[1]);
            if row[a] == row[b] && a > b {
                return Err(format!(
                    "token {ti}: experts {a} and {b} tie at {:e} but {a} comes first",
                    row[a]
                ));
            }
        }
        for &x in &sel {
            if !allowed[x] {
                return Err(format!(
                    "token {ti}: expert {x} is in a group that loses (or loses a tie) to a \
                     lower-index group"
                ));
            }
        }
        for (x, &ok) in allowed.iter().enumerate() {
            if !ok || sel.contains(&x) {
                continue;
            }
            if let Some(&y) = sel.iter().find(|&&y| row[y] == row[x] && y > x) {
                return Err(format!(
                    "token {ti}: experts {x} and {y} tie at {:e}; {y} was selected, {x} was not",
                    row[x]
                ));
            }
        }
    }
    Ok(())
}

fn weights_from_prebias(imp: &dyn Implementation<Route>, args: &RouteArgs) -> Result<(), String> {
    let case = valid_case(args)?;
    let got = run(imp, &case)?;
    let s = scores(&case.logits, case.config.score);
    let g = gates(&s, &got.indices, case.config.score);
    let (w, _) = normalise_and_scale(&g, &case.config);
    let precision = imp.precision(&case);
    for ((ti, j), &want) in w.indexed_iter() {
        if !got.kept[[ti, j]] {
            continue;
        }
        let sel: Vec<usize> = got.indices.row(ti).to_vec();
        let have = got.weights[[ti, j]];
        if (have - want).abs() > weight_bound(&case, precision, ti, &sel, want) || have.is_nan() {
            return Err(format!(
                "token {ti} slot {j} (expert {}): weight {have:e}, but the pre-bias scores of the \
                 selected experts give {want:e}",
                sel[j]
            ));
        }
    }
    Ok(())
}

fn group_limited_selection(
    imp: &dyn Implementation<Route>,
    args: &RouteArgs,
) -> Result<(), String> {
    let case = valid_case(args)?;
    let limit = case.config.groups.ok_or("the case has no groups")?;
    let got = run(imp, &case)?;
    let u = selection_scores(&case);
    let per = case.experts() / limit.groups;
    for ti in 0..case.tokens() {
        let row = u.row(ti);
        let row = row.as_slice().expect("standard layout");
        let keep = kept_groups(row, &case.config);
        let terms = group_terms(&case.config, case.experts());
        let sums = group_scores(row, limit.groups, terms);
        // Under ties any a group that ties the last kept group's score may be kept instead.
        let last_kept = (0..limit.groups)
            .filter(|&g| keep[g])
            .map(|g| sums[g])
            .fold(f64::INFINITY, f64::min);
        for &x in got.indices.row(ti) {
            let tied = case.config.ties == Ties::Any && sums[x / per] == last_kept;
            if !keep[x / per] && !tied {
                return Err(format!(
                    "token {ti}: expert {x} is in group {}, not among the top {} groups by \
                     group score {} {sums:?}",
                    x / per,
                    limit.topk_groups,
                    case.config.group_score.name()
                ));
            }
        }
    }
    Ok(())
}

/// Every sigmoid weight as the declared `sigmoid_norm` gives it: `α·s/(Σ s + ε)` where the
/// weights are normalised (always; skip-k1 at `K > 1`), `α·s` where not (skip-k1 at `K = 1`,
/// never).
fn sigmoid_weight(imp: &dyn Implementation<Route>, args: &RouteArgs) -> Result<(), String> {
    let case = valid_case(args)?;
    let cfg = &case.config;
    if cfg.score != ScoreFunction::Sigmoid || cfg.capacity.is_some() {
        return Err("the case is not a sigmoid case without dropping".into());
    }
    let got = run(imp, &case)?;
    let precision = imp.precision(&case);
    let sigmoid = |ti: usize, x: usize| 1.0 / (1.0 + (-case.logits[[ti, x]]).exp());
    for ti in 0..case.tokens() {
        let xs: Vec<usize> = got.indices.row(ti).to_vec();
        let s: Vec<f64> = xs.iter().map(|&x| sigmoid(ti, x)).collect();
        let denominator = if cfg.normalises() {
            s.iter().sum::<f64>() + cfg.norm_eps
        } else {
            1.0
        };
        for (j, (&x, &sj)) in xs.iter().zip(&s).enumerate() {
            let want = cfg.scaling_factor * sj / denominator;
            let have = got.weights[[ti, j]];
            if (have - want).abs() > weight_bound(&case, precision, ti, &xs, want) || have.is_nan()
            {
                let how = if cfg.normalises() {
                    "normalised"
                } else {
                    "not normalised"
                };
                return Err(format!(
                    "token {ti} slot {j} (expert {x}, sigmoid {s:e}): weight {have:e}, but \
                     sigmoid-norm {} at K = {} gives {want:e} ({how})",
                    cfg.sigmoid_norm.name(),
                    cfg.topk,
                    s = sj
                ));
            }
        }
    }
    Ok(())
}
