//! The MoE-layer properties: agreement with the f64 reference within the layer bound, and
//! the layer's exact rules (dropped tokens, empty experts, the permute round trip), the
//! dense formulation, finite differences and token-order equivariance, each checked from the
//! implementation's own outputs.
//!
//! A case within the selection-score error of a top-k, group or capacity tie (for the
//! implementation's declared precision, [`tie_guard`], or for the finite-difference step) is
//! **rejected** and another is drawn; it never counts as passed.

use moecheck_reference::format::Format;
use moecheck_reference::moe::fd::{check_gradients, FdOutcome};
use moecheck_reference::moe::{
    dense_layer, forward, layer_bound, tie_guard, LayerPrecision, MoeCase, MoeLayer, MoeOutputs,
    TensorId,
};
use moecheck_reference::op::{Implementation, Op};
use moecheck_reference::seed::mix;
use ndarray::{ArrayD, Axis, Dimension};

use super::domain::{self, MoeDomain};
use super::strategies::{any_case, dropping, no_dropping, MoeArgs};
use crate::property::{verified, Property, PropertyOp};
use crate::runner::CaseResult;

impl PropertyOp for MoeLayer {
    type Args = MoeArgs;
    type Domain = MoeDomain;

    fn properties() -> Vec<Property<MoeLayer>> {
        vec![
            Property {
                name: "layer-matches-reference",
                description: "out and every gradient inside the derived bound of the f64 reference",
                strategy: any_case,
                test: matches_reference,
                case: None,
            },
            Property {
                name: "sparse-equals-dense",
                description: "out and every gradient equal the dense formulation (all experts, masked weights)",
                strategy: any_case,
                test: sparse_equals_dense,
                case: None,
            },
            Property {
                name: "dropped-contribute-zero",
                description: "fully dropped tokens: out and dx exactly 0, and their dout changes no gradient",
                strategy: dropping,
                test: dropped_contribute_zero,
                case: None,
            },
            Property {
                name: "permute-round-trip",
                description: "unpermute(permute(x)) == x on every slot, dropped ones included",
                strategy: any_case,
                test: permute_round_trip,
                case: None,
            },
            Property {
                name: "gradient-matches-fd",
                description: "every gradient matches central finite differences of the f64 layer",
                strategy: any_case,
                test: gradient_matches_fd,
                case: None,
            },
            Property {
                name: "empty-expert-zero-wgrad",
                description: "dW0, dW1, dWo of every expert with no kept assignment are exactly 0",
                strategy: any_case,
                test: empty_expert_zero_wgrad,
                case: None,
            },
            Property {
                name: "token-order-equivariance",
                description: "permuting the tokens permutes out and dx and leaves the weight gradients (nothing dropped)",
                strategy: no_dropping,
                test: token_order_equivariance,
                case: None,
            },
        ]
    }

    fn case_of(args: &MoeArgs) -> (MoeCase, ()) {
        (args.build(), ())
    }

    /// Each layer case runs the whole layer (the FD property ~30 times): shrinking stops
    /// after 32 steps, which still reaches a small case.
    const MAX_SHRINK_ITERS: u32 = 32;

    fn fit(domain: &MoeDomain, args: &MoeArgs) -> Result<MoeArgs, String> {
        domain.fit(args)
    }
    fn relaxed(domain: &MoeDomain, name: &str) -> Option<String> {
        domain.relaxed(name)
    }
    const EDGES: &'static [&'static str] = domain::EDGES;
    fn edges(args: &MoeArgs) -> Vec<&'static str> {
        domain::edges(args)
    }

    /// Near-tie cases are redrawn; a run gives up after `64·max(cases, 16)` of them.
    fn max_rejects(cases: u32) -> u32 {
        64 * cases.max(16)
    }
}

/// Builds the case and applies the tie guard at the implementation's precision.
fn guarded(imp: &dyn Implementation<MoeLayer>, args: &MoeArgs) -> Result<MoeCase, CaseResult> {
    let case = args.build();
    match tie_guard(&case, &imp.precision(&case)) {
        Err(e) => Err(CaseResult::Fail(format!("invalid generated case: {e}"))),
        Ok(Some(why)) => Err(CaseResult::Reject(why)),
        Ok(None) => Ok(case),
    }
}

fn run(imp: &dyn Implementation<MoeLayer>, case: &MoeCase) -> Result<MoeOutputs, CaseResult> {
    imp.run(case, ())
        .map_err(|e| CaseResult::Fail(format!("run failed: {e}")))
}

macro_rules! tri {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(r) => return r,
        }
    };
}

fn matches_reference(imp: &dyn Implementation<MoeLayer>, args: &MoeArgs) -> CaseResult {
    let case = tri!(guarded(imp, args));
    verified(imp, &case, ()).into()
}

/// `|a − b| <= bound` element-wise for every tensor, or the first violation.
fn within(
    case: &MoeCase,
    a: &MoeOutputs,
    b: &MoeOutputs,
    bound: impl Fn(TensorId) -> ArrayD<f64>,
    what: &str,
) -> CaseResult {
    for id in TensorId::of_case(case) {
        let (Some(x), Some(y)) = (a.get(id), b.get(id)) else {
            return CaseResult::Fail(format!("{id} is missing"));
        };
        if x.shape() != y.shape() {
            return CaseResult::Fail(format!(
                "{id} has shape {:?}, want {:?}",
                x.shape(),
                y.shape()
            ));
        }
        let bd = bound(id);
        for (((i, p), q), e) in x.indexed_iter().zip(y.iter()).zip(bd.iter()) {
            let ok = (p - q).abs() <= *e; // false for NaN
            if !ok {
                return CaseResult::Fail(format!(
                    "{id}{:?}: {p:e} vs {q:e} ({what}), bound {e:e}",
                    i.slice()
                ));
            }
        }
    }
    CaseResult::Pass
}

fn sparse_equals_dense(imp: &dyn Implementation<MoeLayer>, args: &MoeArgs) -> CaseResult {
    let case = tri!(guarded(imp, args));
    let got = tri!(run(imp, &case));
    let dense = match dense_layer(&case) {
        Ok(d) => d,
        Err(e) => return CaseResult::Fail(format!("invalid generated case: {e}")),
    };
    let f = forward(&case).expect("validated");
    let b_imp = layer_bound(&case, &f, &imp.precision(&case));
    let b_ref = layer_bound(&case, &f, &F64);
    within(
        &case,
        &got,
        &dense,
        |id| b_imp.get(id).expect("bound") + b_ref.get(id).expect("bound"),
        "implementation vs dense",
    )
}

const F64: LayerPrecision = LayerPrecision {
    input: Format::F64,
    compute: Format::F64,
    router: None,
    output: Format::F64,
};

fn dropped_contribute_zero(imp: &dyn Implementation<MoeLayer>, args: &MoeArgs) -> CaseResult {
    let case = tri!(guarded(imp, args));
    let f = forward(&case).expect("validated");
    let k = case.topk();
    let dropped: Vec<usize> = (0..case.tokens())
        .filter(|&t| (0..k).all(|s| !f.routing.kept[(t, s)]))
        .collect();
    if dropped.is_empty() {
        return CaseResult::Reject("no fully dropped token".into());
    }
    let got = tri!(run(imp, &case));
    for &t in &dropped {
        for (what, a) in [("out", &got.out), ("dx", &got.dx)] {
            if let Some((c, v)) = a.row(t).indexed_iter().find(|(_, v)| **v != 0.0) {
                return CaseResult::Fail(format!(
                    "token {t} is fully dropped but {what}[{t}, {c}] = {v:e}, want exactly 0"
                ));
            }
        }
    }
    // Another dout on the dropped tokens must not change any gradient, bit for bit.
    let mut other = case.clone();
    for &t in &dropped {
        other.dout.row_mut(t).mapv_inplace(|v| -2.0 * v + 0.5);
    }
    let got2 = tri!(run(imp, &other));
    for id in TensorId::of_case(&case).into_iter().skip(1) {
        let (a, b) = (got.get(id).expect("present"), got2.get(id));
        let Some(b) = b else {
            return CaseResult::Fail(format!("{id} is missing"));
        };
        if let Some(((i, x), y)) = a
            .indexed_iter()
            .zip(b.iter())
            .find(|((_, x), y)| x.to_bits() != y.to_bits())
        {
            return CaseResult::Fail(format!(
                "{id}{:?} changed from {x:e} to {y:e} when only the dout of fully dropped tokens changed",
                i.slice()
            ));
        }
    }
    CaseResult::Pass
}

fn permute_round_trip(imp: &dyn Implementation<MoeLayer>, args: &MoeArgs) -> CaseResult {
    let case = args.build();
    if let Err(e) = MoeLayer::validate(&case, ()) {
        return CaseResult::Fail(format!("invalid generated case: {e}"));
    }
    let Some(u) = imp.internals(&case, ()) else {
        return CaseResult::NotApplicable(format!(
            "{} does not expose its permute round trip",
            imp.name()
        ));
    };
    if u.dim() != (case.tokens(), case.topk(), case.hidden()) {
        return CaseResult::Fail(format!("round trip has shape {:?}", u.shape()));
    }
    for ((t, s, c), v) in u.indexed_iter() {
        if v.to_bits() != case.x[(t, c)].to_bits() {
            return CaseResult::Fail(format!(
                "unpermute(permute(x))[{t}, {s}, {c}] = {v:e}, want x[{t}, {c}] = {:e}",
                case.x[(t, c)]
            ));
        }
    }
    CaseResult::Pass
}

fn gradient_matches_fd(imp: &dyn Implementation<MoeLayer>, args: &MoeArgs) -> CaseResult {
    let case = tri!(guarded(imp, args));
    let got = tri!(run(imp, &case));
    let f = forward(&case).expect("validated");
    let bound = layer_bound(&case, &f, &imp.precision(&case));
    match check_gradients(&case, &got, Some(&bound), args.value_seed) {
        Err(e) => CaseResult::Fail(format!("finite differences: {e}")),
        Ok(FdOutcome::NearTie(why)) => CaseResult::Reject(why),
        Ok(FdOutcome::Checked(v)) => match v.iter().find(|c| !c.passed()) {
            None => CaseResult::Pass,
            Some(c) => CaseResult::Fail(format!(
                "<d{}, v> = {:e} but finite differences give {:e} (tolerance {:e})",
                c.tensor, c.analytic, c.numeric, c.tolerance
            )),
        },
    }
}

fn empty_expert_zero_wgrad(imp: &dyn Implementation<MoeLayer>, args: &MoeArgs) -> CaseResult {
    let case = tri!(guarded(imp, args));
    let f = forward(&case).expect("validated");
    let empty: Vec<usize> = (0..case.experts())
        .filter(|&e| f.perm.group_sizes[e] == 0)
        .collect();
    if empty.is_empty() {
        return CaseResult::Reject("no empty expert".into());
    }
    let got = tri!(run(imp, &case));
    for (name, w) in [("dw0", &got.dw0), ("dw1", &got.dw1), ("dwo", &got.dwo)] {
        for &e in &empty {
            if e >= w.shape()[0] {
                return CaseResult::Fail(format!("{name} has shape {:?}", w.shape()));
            }
            if let Some(((i, j), v)) = w
                .index_axis(Axis(0), e)
                .indexed_iter()
                .find(|(_, v)| **v != 0.0)
            {
                return CaseResult::Fail(format!(
                    "expert {e} is empty but {name}[{e}, {i}, {j}] = {v:e}, want exactly 0"
                ));
            }
        }
    }
    CaseResult::Pass
}

fn token_order_equivariance(imp: &dyn Implementation<MoeLayer>, args: &MoeArgs) -> CaseResult {
    let case = tri!(guarded(imp, args));
    let t = case.tokens();
    // π: a seeded shuffle; token i of the new case is token pi[i] of the old one.
    let mut pi: Vec<usize> = (0..t).collect();
    for i in (1..t).rev() {
        let j = (mix(args.value_seed ^ i as u64) % (i as u64 + 1)) as usize;
        pi.swap(i, j);
    }
    let mut other = case.clone();
    for (i, &p) in pi.iter().enumerate() {
        other.x.row_mut(i).assign(&case.x.row(p));
        other.dout.row_mut(i).assign(&case.dout.row(p));
    }
    let a = tri!(run(imp, &case));
    let b = tri!(run(imp, &other));
    let prec = imp.precision(&case);
    let ba = layer_bound(&case, &forward(&case).expect("validated"), &prec);
    let bb = layer_bound(&other, &forward(&other).expect("validated"), &prec);
    // Bring b back to the original token order.
    let mut back = b.clone();
    for (i, &p) in pi.iter().enumerate() {
        back.out.row_mut(p).assign(&b.out.row(i));
        back.dx.row_mut(p).assign(&b.dx.row(i));
    }
    let mut bb_back = bb.clone();
    for (id, arr) in bb_back.tensors.iter_mut() {
        if matches!(id, TensorId::Out | TensorId::Dx) {
            let src = bb.get(*id).expect("bound").clone();
            for (i, &p) in pi.iter().enumerate() {
                arr.index_axis_mut(Axis(0), p)
                    .assign(&src.index_axis(Axis(0), i));
            }
        }
    }
    within(
        &case,
        &a,
        &back,
        |id| ba.get(id).expect("bound") + bb_back.get(id).expect("bound"),
        "original vs token-permuted",
    )
}
