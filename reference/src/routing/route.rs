//! The whole routing (steps 1–4) and its result.

use ndarray::{Array1, Array2, ArrayView2};

use super::capacity::apply_capacity;
use super::config::RoutingConfig;
use super::scores::{gates, normalise_and_scale, scores};
use super::topk::select;
use crate::Error;

/// A routing problem: logits, optional bias, configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct RoutingCase {
    /// Router logits `(T, E)`, finite. f32 inputs are widened exactly.
    pub logits: Array2<f64>,
    /// Per-expert selection bias `(E,)`, finite; selection only.
    pub bias: Option<Array1<f64>>,
    pub config: RoutingConfig,
}

impl RoutingCase {
    pub fn tokens(&self) -> usize {
        self.logits.nrows()
    }
    pub fn experts(&self) -> usize {
        self.logits.ncols()
    }

    /// Checks the configuration, the bias shape and that every value is finite. The error
    /// names the flag or input (`logits`, `bias`).
    pub fn validate(&self) -> Result<(), Error> {
        self.config.validate(self.tokens(), self.experts())?;
        if let Some(((t, e), v)) = self.logits.indexed_iter().find(|(_, v)| !v.is_finite()) {
            return Err(Error::InvalidRouting {
                what: "logits",
                reason: format!("holds a non-finite value {v} at [{t}, {e}]"),
            });
        }
        if let Some(b) = &self.bias {
            if b.len() != self.experts() {
                return Err(Error::InvalidRouting {
                    what: "bias",
                    reason: format!(
                        "has shape [{}], expected [{}] (one per expert)",
                        b.len(),
                        self.experts()
                    ),
                });
            }
            if let Some((e, v)) = b.indexed_iter().find(|(_, v)| !v.is_finite()) {
                return Err(Error::InvalidRouting {
                    what: "bias",
                    reason: format!("holds a non-finite value {v} at [{e}]"),
                });
            }
        }
        Ok(())
    }
}

/// The reference routing of a case: every intermediate a hand-written VJP needs.
///
/// Shapes: `T` tokens, `E` experts, `K = config.topk`, `G` groups.
#[derive(Debug, Clone, PartialEq)]
pub struct Routing {
    /// The configuration it was computed with (score function, `norm_topk`, `α`, `ε`, …).
    pub config: RoutingConfig,
    /// `s (T, E)`: pre-bias scores after the score function (softmax probabilities, sigmoids,
    /// or for `topk-softmax` the logits themselves).
    pub scores: Array2<f64>,
    /// `u = s + b (T, E)`: what selection ranks (`= s` without a bias).
    pub selection_scores: Array2<f64>,
    /// `(T, G)`: the groups kept per token, with group-limited selection.
    pub group_mask: Option<Array2<bool>>,
    /// `(T, K)`: the selected experts, largest `u` first, ties toward the lower index (or as
    /// the implementation broke them, from [`route_following`]).
    pub indices: Array2<usize>,
    /// `g (T, K)`: the gates before normalisation and scaling (for `topk-softmax`, the
    /// softmax over the selected logits).
    pub gates: Array2<f64>,
    /// `D (T,)`: `Σ_j g[t, j] + ε` when normalising, else 1.
    pub denominators: Array1<f64>,
    /// `w (T, K)`: `α·g/D` (or `α·g`), before dropping.
    pub weights: Array2<f64>,
    /// `(T, K)`: the assignment survives capacity dropping (all `true` without capacity).
    pub kept: Array2<bool>,
    /// `(T, K)`: the combine weights, `w` where kept and exactly 0 where dropped (no
    /// renormalisation of survivors).
    pub combine: Array2<f64>,
    /// `(E,)`: kept assignments per expert.
    pub group_sizes: Vec<usize>,
    /// The expert capacity `C` (per sequence for `position`), with capacity dropping.
    pub capacity: Option<usize>,
}

/// Computes the routing of `case` in f64 (module documentation, steps 1–4).
///
/// Errors: an invalid case ([`RoutingCase::validate`]).
///
/// ```
/// use moecheck_reference::routing::{route, RoutingCase, RoutingConfig, ScoreFunction};
/// let case = RoutingCase {
///     logits: ndarray::array![[0.0, 2.0, 2.0, 1.0]],
///     bias: None,
///     config: RoutingConfig::new(2, ScoreFunction::Sigmoid),
/// };
/// let r = route(&case).unwrap();
/// assert_eq!(r.indices.row(0).to_vec(), vec![1, 2]); // the tie goes to expert 1 first
/// assert_eq!(r.combine.row(0).to_vec(), vec![0.5, 0.5]); // equal sigmoids, normalised
/// ```
pub fn route(case: &RoutingCase) -> Result<Routing, Error> {
    route_preferring(case, None)
}

/// The reference routing of `case` with every choice among exactly equal values made as the
/// implementation made it ([`Ties::Any`](super::Ties::Any)): `prefer` is its `indices` and
/// `kept`, both `(T, K)` (an index outside `0..E` is ignored). Where the implementation's
/// choices are ones some tie order gives, the result selects, keeps and weighs exactly what
/// it did; where not, the result is still a valid routing and the comparison shows where
/// the implementation left it.
///
/// Errors: an invalid case ([`RoutingCase::validate`]).
pub fn route_following(
    case: &RoutingCase,
    indices: ArrayView2<usize>,
    kept: ArrayView2<bool>,
) -> Result<Routing, Error> {
    route_preferring(case, Some((indices, kept)))
}

fn route_preferring(
    case: &RoutingCase,
    prefer: Option<(ArrayView2<usize>, ArrayView2<bool>)>,
) -> Result<Routing, Error> {
    case.validate()?;
    let cfg = case.config;
    let s = scores(&case.logits, cfg.score);
    let u = match &case.bias {
        Some(b) => &s + &b.view().insert_axis(ndarray::Axis(0)),
        None => s.clone(),
    };
    let (indices, group_mask) = select(&u, &cfg, prefer.map(|p| p.0));
    let g = gates(&s, &indices, cfg.score);
    let (weights, denominators) = normalise_and_scale(&g, &cfg);
    let (kept, capacity) = match &cfg.capacity {
        Some(cap) => {
            let r = apply_capacity(&indices, &weights, case.experts(), cap, prefer.map(|p| p.1));
            (r.kept, Some(r.capacity))
        }
        None => (Array2::from_elem(indices.dim(), true), None),
    };
    let combine = ndarray::Zip::from(&weights)
        .and(&kept)
        .map_collect(|&w, &k| if k { w } else { 0.0 });
    let mut group_sizes = vec![0usize; case.experts()];
    ndarray::Zip::from(&indices)
        .and(&kept)
        .for_each(|&e, &k| group_sizes[e] += usize::from(k));
    Ok(Routing {
        config: cfg,
        scores: s,
        selection_scores: u,
        group_mask,
        indices,
        gates: g,
        denominators,
        weights,
        kept,
        combine,
        group_sizes,
        capacity,
    })
}
