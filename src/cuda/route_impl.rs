//! `moecheck route --impl cuda`: kernels/routing.cu ([`super::routing::route`]) as an
//! implementation of [`Route`].
//!
//! The case's logits and bias (f32 values widened to f64) are narrowed back to f32 exactly and
//! routed on device 0. Declared precision: f32 compute and f32 output. The kernels compute
//! scores with CUDA's `expf` (NVRTC without fast math: at most 2 ulps, CUDA Programming Guide,
//! "Mathematical Functions") and IEEE division; the weight bound
//! (`moecheck_reference::routing` bound.rs) charges `exp` 2 ulps of the compute format, so an
//! f32 declaration covers it. Index near-ties (selection scores equal within the f32 bound) may
//! legitimately be ordered the other way than the f64 reference; the comparison reports them
//! and does not fail on them. Supported: the three score functions, group-limited top-k, the
//! position capacity policy, top-2 group scores, sigmoid normalisation at every K; anything
//! else is refused before it runs ([`Implementation::supports`]).

use moecheck_reference::format::Format;
use moecheck_reference::op::{Implementation, RunError};
use moecheck_reference::routing::{
    position_capacity, DropPolicy, GroupScore, Route, RouteOutputs, RoutePrecision, RoutingCase,
    ScoreFunction, NORM_EPS,
};
use ndarray::Array2;

use super::routing::{route, RouteParams, Routed, Score};

/// The routing kernels on device 0.
#[derive(Debug, Clone, Copy, Default)]
pub struct CudaRouter;

/// The precision the routing kernels compute and write weights in.
pub const PRECISION: RoutePrecision = RoutePrecision {
    compute: Format::F32,
    output: Format::F32,
};

/// The kernel parameters of `case`'s configuration; one line on what is unsupported otherwise.
/// The position capacity is the reference's [`position_capacity`] of the sequence length
/// (`seq_len`, or every token as one sequence).
pub fn params_of(case: &RoutingCase) -> Result<RouteParams, String> {
    let c = &case.config;
    if c.norm_eps != NORM_EPS {
        return Err(format!(
            "normalisation epsilon {:e}: the CUDA kernels use {NORM_EPS:e}",
            c.norm_eps
        ));
    }
    if c.groups.is_some() && c.group_score != GroupScore::Top2 {
        return Err(format!(
            "--group-score {}: the CUDA kernels score groups by their top-2 sum",
            c.group_score.name()
        ));
    }
    if c.score == ScoreFunction::Sigmoid && !c.normalises() {
        return Err(format!(
            "--sigmoid-norm {}{}: the CUDA kernels always normalise sigmoid weights",
            c.sigmoid_norm.name(),
            if c.topk == 1 { " with K = 1" } else { "" }
        ));
    }
    let (t, e, k) = (case.tokens(), case.experts(), c.topk);
    let capacity = match c.capacity {
        None => None,
        Some(cap) if cap.policy == DropPolicy::Position => {
            let s = cap.seq_len.unwrap_or(t).max(1);
            Some((s, position_capacity(s, k, e, cap.factor)))
        }
        Some(cap) => {
            return Err(format!(
                "--drop-policy {}: --impl cuda implements the position policy only",
                cap.policy.name()
            ))
        }
    };
    let p = RouteParams {
        score: match c.score {
            ScoreFunction::Softmax => Score::Softmax,
            ScoreFunction::TopkSoftmax => Score::TopkSoftmax,
            ScoreFunction::Sigmoid => Score::Sigmoid,
        },
        topk: k,
        groups: c.groups.map_or(1, |g| g.groups),
        topk_groups: c.groups.map_or(1, |g| g.topk_groups),
        norm_topk: c.norm_topk,
        scaling_factor: c.scaling_factor as f32,
        capacity,
    };
    super::routing::check_params(t, e, &p)?;
    Ok(p)
}

/// The kernels' flat `(T, K)` results as [`RouteOutputs`]; an index outside `0..E` or a
/// wrong length is an error (never a silent wrong answer).
pub fn outputs_of(r: &Routed, t: usize, k: usize, e: usize) -> Result<RouteOutputs, String> {
    let n = t * k;
    if [r.indices.len(), r.weights.len(), r.kept.len()] != [n, n, n] || r.group_sizes.len() != e {
        return Err(format!(
            "kernel results have lengths {}/{}/{}/{}, want {n}/{n}/{n}/{e}",
            r.indices.len(),
            r.weights.len(),
            r.kept.len(),
            r.group_sizes.len()
        ));
    }
    let idx = r
        .indices
        .iter()
        .map(|&i| usize::try_from(i).ok().filter(|&i| i < e))
        .collect::<Option<Vec<usize>>>()
        .ok_or_else(|| format!("an expert index outside 0..{e}"))?;
    let sizes = r
        .group_sizes
        .iter()
        .map(|&s| usize::try_from(s).map_err(|_| format!("negative group size {s}")))
        .collect::<Result<Vec<_>, _>>()?;
    let shape = |e: ndarray::ShapeError| e.to_string();
    Ok(RouteOutputs {
        indices: Array2::from_shape_vec((t, k), idx).map_err(shape)?,
        weights: Array2::from_shape_vec((t, k), r.weights.iter().map(|&w| w as f64).collect())
            .map_err(shape)?,
        kept: Array2::from_shape_vec((t, k), r.kept.iter().map(|&b| b != 0).collect())
            .map_err(shape)?,
        group_sizes: sizes,
        weights_format: None,
    })
}

impl Implementation<Route> for CudaRouter {
    fn name(&self) -> String {
        "cuda".into()
    }
    fn is_model(&self) -> bool {
        false
    }
    fn precision(&self, _case: &RoutingCase) -> RoutePrecision {
        PRECISION
    }
    /// The kernels implement the position capacity policy, top-2 group scores and sigmoid
    /// normalisation at every K only.
    fn supports(&self, case: &RoutingCase, _: ()) -> Result<(), String> {
        params_of(case).map(|_| ())
    }
    fn run(&self, case: &RoutingCase, _: ()) -> Result<RouteOutputs, RunError> {
        let p = params_of(case).map_err(RunError::new)?;
        let (t, e) = (case.tokens(), case.experts());
        let logits: Vec<f32> = case.logits.iter().map(|&x| x as f32).collect();
        let bias: Option<Vec<f32>> = case
            .bias
            .as_ref()
            .map(|b| b.iter().map(|&x| x as f32).collect());
        let r =
            route(&logits, bias.as_deref(), t, e, &p).map_err(|e| RunError::new(e.to_string()))?;
        outputs_of(&r, t, p.topk, e).map_err(RunError::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use moecheck_reference::routing::{
        compare_routing, route as reference_route, Capacity, GroupLimit, RoutingConfig,
    };

    fn case(config: RoutingConfig) -> RoutingCase {
        let logits = Array2::from_shape_fn((6, 8), |(t, e)| ((t * 5 + e * 3) % 11) as f64 / 4.0);
        RoutingCase {
            logits,
            bias: None,
            config,
        }
    }

    #[test]
    fn params_follow_the_reference_configuration() {
        let mut c = RoutingConfig::new(2, ScoreFunction::Sigmoid);
        c.groups = Some(GroupLimit {
            groups: 4,
            topk_groups: 2,
        });
        c.norm_topk = true;
        c.scaling_factor = 2.5;
        c.capacity = Some(Capacity {
            factor: 1.0,
            policy: DropPolicy::Position,
            seq_len: Some(3),
        });
        let p = params_of(&case(c)).unwrap();
        assert_eq!(p.score, Score::Sigmoid);
        assert_eq!((p.topk, p.groups, p.topk_groups), (2, 4, 2));
        assert!(p.norm_topk);
        assert_eq!(p.scaling_factor, 2.5);
        // ceil(3·2/8)·1 = 1 per sequence of 3 tokens.
        assert_eq!(p.capacity, Some((3, 1)));
        let plain = params_of(&case(RoutingConfig::new(3, ScoreFunction::Softmax))).unwrap();
        assert_eq!(
            (plain.groups, plain.topk_groups, plain.capacity),
            (1, 1, None)
        );
    }

    #[test]
    fn unsupported_configurations_are_refused_with_a_reason() {
        let mut c = RoutingConfig::new(2, ScoreFunction::Softmax);
        c.capacity = Some(Capacity {
            factor: 1.0,
            policy: DropPolicy::Probs,
            seq_len: None,
        });
        assert!(params_of(&case(c)).unwrap_err().contains("probs"));
        let mut c = RoutingConfig::new(2, ScoreFunction::Softmax);
        c.norm_eps = 1e-6;
        assert!(params_of(&case(c)).unwrap_err().contains("epsilon"));
        let c = RoutingConfig::new(9, ScoreFunction::Softmax);
        assert!(params_of(&case(c)).is_err());
        let mut c = RoutingConfig::new(2, ScoreFunction::Softmax);
        c.groups = Some(GroupLimit {
            groups: 4,
            topk_groups: 2,
        });
        c.group_score = GroupScore::Max;
        assert!(params_of(&case(c))
            .unwrap_err()
            .contains("--group-score max"));
        let mut c = RoutingConfig::new(1, ScoreFunction::Sigmoid);
        c.sigmoid_norm = moecheck_reference::routing::SigmoidNorm::SkipK1;
        let err = params_of(&case(c)).unwrap_err();
        assert!(err.contains("--sigmoid-norm skip-k1"), "{err}");
        // supports() is the same check, before anything runs.
        assert_eq!(CudaRouter.supports(&case(c), ()), Err(err));
    }

    /// The reference's own routing, flattened the way the kernels return it, converts back
    /// to outputs that compare equal; a corrupted index is refused.
    #[test]
    fn kernel_layout_converts_to_the_reference_outputs() {
        let mut c = RoutingConfig::new(2, ScoreFunction::Softmax);
        c.capacity = Some(Capacity {
            factor: 0.5,
            policy: DropPolicy::Position,
            seq_len: None,
        });
        let cs = case(c);
        let want = reference_route(&cs).unwrap();
        let mut r = Routed {
            indices: want.indices.iter().map(|&i| i as i32).collect(),
            weights: want.combine.iter().map(|&w| w as f32).collect(),
            kept: want.kept.iter().map(|&b| b as u8).collect(),
            group_sizes: want.group_sizes.iter().map(|&s| s as i32).collect(),
            positions: vec![],
        };
        let got = outputs_of(&r, 6, 2, 8).unwrap();
        assert!(got.kept.iter().any(|k| !k), "the case drops something");
        let rep = compare_routing(&cs, &want, &got, PRECISION);
        assert!(rep.passed(), "{:?}", rep.first_failure());
        r.indices[3] = 8;
        assert!(outputs_of(&r, 6, 2, 8).is_err());
        r.indices[3] = -1;
        assert!(outputs_of(&r, 6, 2, 8).is_err());
        assert!(outputs_of(&r, 6, 3, 8).is_err());
    }
}
