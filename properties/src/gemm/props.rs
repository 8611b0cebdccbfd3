//! The grouped-GEMM properties: agreement with the f64 reference per pass, and the contract's
//! exact rules (tail rows, empty experts, `K = 0`) checked from the outputs themselves.

use moecheck_reference::gemm::{
    Gemm, GemmOutputs, GroupedGemmCase, OutArray2, Pass, Passes, TailContract,
};
use moecheck_reference::op::Implementation;
use proptest::strategy::BoxedStrategy;

use super::domain::{self, GemmDomain};
use super::strategies::{case_args, GemmArgs, Require};
use crate::property::{verified, Property, PropertyOp};
use crate::runner::CaseResult;

impl PropertyOp for Gemm {
    type Args = GemmArgs;

    fn properties() -> Vec<Property<Gemm>> {
        vec![
            Property {
                name: "fwd-matches-reference",
                description: "out is inside the error bound of the f64 reference, tails exactly 0",
                strategy: any,
                test: |imp, a| pass_matches(imp, a, Pass::Fwd),
                case: Some(|a| only(a, Pass::Fwd)),
            },
            Property {
                name: "dgrad-matches-reference",
                description: "dlhs is inside the error bound of the f64 reference, tails exactly 0",
                strategy: any,
                test: |imp, a| pass_matches(imp, a, Pass::Dgrad),
                case: Some(|a| only(a, Pass::Dgrad)),
            },
            Property {
                name: "wgrad-matches-reference",
                description: "drhs is inside the error bound of the f64 reference",
                strategy: any,
                test: |imp, a| pass_matches(imp, a, Pass::Wgrad),
                case: Some(|a| only(a, Pass::Wgrad)),
            },
            Property {
                name: "tail-contract",
                description:
                    "tail rows of out/dlhs are exactly 0 (not checked under tail ignored) and tail dout does not change drhs",
                strategy: with_tail,
                test: |imp, a| tail_contract(imp, a).into(),
                case: None,
            },
            Property {
                name: "empty-expert-wgrad-zero",
                description: "drhs of every empty expert is exactly 0",
                strategy: with_empty_expert,
                test: |imp, a| empty_expert_wgrad_zero(imp, a).into(),
                case: Some(|a| only(a, Pass::Wgrad)),
            },
            Property {
                name: "k-zero",
                description: "with K = 0, out is exactly 0 and every pass matches the reference",
                strategy: k_zero,
                test: |imp, a| k_zero_test(imp, a).into(),
                case: None,
            },
        ]
    }

    fn case_of(args: &GemmArgs) -> (GroupedGemmCase, Passes) {
        (args.build(), args.passes)
    }

    type Domain = GemmDomain;

    fn fit(domain: &GemmDomain, args: &GemmArgs) -> Result<GemmArgs, String> {
        domain.fit(args)
    }
    fn relaxed(domain: &GemmDomain, name: &str) -> Option<String> {
        domain.relaxed(name)
    }
    const EDGES: &'static [&'static str] = domain::EDGES;
    fn edges(args: &GemmArgs) -> Vec<&'static str> {
        domain::edges(args)
    }
}

fn any() -> BoxedStrategy<GemmArgs> {
    case_args(Require::default())
}
fn with_tail() -> BoxedStrategy<GemmArgs> {
    case_args(Require {
        tail: true,
        ..Require::default()
    })
}
fn with_empty_expert() -> BoxedStrategy<GemmArgs> {
    case_args(Require {
        empty_expert: true,
        nonempty_weights: true,
        ..Require::default()
    })
}
fn k_zero() -> BoxedStrategy<GemmArgs> {
    case_args(Require {
        k_zero: true,
        ..Require::default()
    })
}

type Imp<'a> = &'a dyn Implementation<Gemm>;

/// The case of `args` asking for `pass` only (what a per-pass property checks).
fn only(args: &GemmArgs, pass: Pass) -> (GroupedGemmCase, Passes) {
    (args.build(), Passes::only(pass))
}

fn pass_matches(imp: Imp, args: &GemmArgs, pass: Pass) -> CaseResult {
    let (case, ask) = only(args, pass);
    verified(imp, &case, ask).into()
}

/// Runs every pass of `passes` (the case's declared passes).
fn run_all(imp: Imp, case: &GroupedGemmCase, passes: Passes) -> Result<GemmOutputs, String> {
    imp.run(case, passes)
        .map_err(|e| format!("run failed: {e}"))
}

/// `Err` naming the first element of rows `from..` of `a` that is not exactly 0 (`rows`
/// says which rows those are).
fn rows_zero(what: &str, a: Option<&OutArray2>, from: usize, rows: &str) -> Result<(), String> {
    let a = a.ok_or_else(|| format!("the implementation returned no {what}"))?;
    for ((r, c), v) in a.f64().indexed_iter() {
        if r >= from && *v != 0.0 {
            return Err(format!(
                "{what}[{r}, {c}] = {v:e} in {rows}, want exactly 0"
            ));
        }
    }
    Ok(())
}

fn tail_contract(imp: Imp, args: &GemmArgs) -> Result<(), String> {
    let case = args.build();
    let used = case.rows_used();
    let first = run_all(imp, &case, args.passes)?;
    if case.tail == TailContract::Zero {
        if args.passes.fwd {
            rows_zero("out", first.out.as_ref(), used, "a tail row")?;
        }
        if args.passes.dgrad {
            rows_zero("dlhs", first.dlhs.as_ref(), used, "a tail row")?;
        }
    }
    if !args.passes.wgrad {
        return Ok(());
    }
    // Different, large tail dout: drhs must be bit-identical.
    let other = args.with_tail_dout(&case, |r, c| {
        let s = if (r + c) % 2 == 0 { 1.0 } else { -1.0 };
        s * (64.0 + ((r * 7 + c * 3) % 29) as f32)
    });
    let second = run_all(imp, &other, args.passes)?;
    let (a, b) = match (&first.drhs, &second.drhs) {
        (Some(a), Some(b)) => (a, b),
        _ => return Err("the implementation returned no drhs".into()),
    };
    if a.shape() != b.shape() {
        return Err("drhs shape changed with tail dout".into());
    }
    let (a, b) = (a.f64(), b.f64());
    for (((g, k, n), x), y) in a.indexed_iter().zip(b.iter()) {
        if x.to_bits() != y.to_bits() {
            return Err(format!(
                "drhs[{g}, {k}, {n}] changed from {x:e} to {y:e} when only tail dout changed"
            ));
        }
    }
    Ok(())
}

fn empty_expert_wgrad_zero(imp: Imp, args: &GemmArgs) -> Result<(), String> {
    let (case, ask) = only(args, Pass::Wgrad);
    let out = imp
        .run(&case, ask)
        .map_err(|e| format!("run failed: {e}"))?;
    let drhs = out
        .drhs
        .ok_or("the implementation returned no drhs")?
        .into_f64();
    if drhs.shape() != [case.groups(), case.k(), case.n()] {
        return Err(format!("drhs has shape {:?}", drhs.shape()));
    }
    for (g, &size) in case.group_sizes.iter().enumerate() {
        if size != 0 {
            continue;
        }
        for ((k, n), v) in drhs.index_axis(ndarray::Axis(0), g).indexed_iter() {
            if *v != 0.0 {
                return Err(format!(
                    "expert {g} is empty but drhs[{g}, {k}, {n}] = {v:e}, want exactly 0"
                ));
            }
        }
    }
    Ok(())
}

fn k_zero_test(imp: Imp, args: &GemmArgs) -> Result<(), String> {
    let case = args.build();
    let out = run_all(imp, &case, args.passes)?;
    // Under tail ignored only the rows of the groups must be 0.
    let rows = match case.tail {
        TailContract::Zero => 0..usize::MAX,
        TailContract::Ignored => 0..case.rows_used(),
    };
    let in_rows = |what: &str, a: Option<&OutArray2>| match a {
        Some(a) => {
            let a = a.f64();
            let r = a.rows().into_iter().take(rows.end).enumerate();
            for (i, row) in r {
                if let Some((c, v)) = row.iter().enumerate().find(|(_, v)| **v != 0.0) {
                    return Err(format!(
                        "{what}[{i}, {c}] = {v:e} with K = 0, want exactly 0"
                    ));
                }
            }
            Ok(())
        }
        None => Err(format!("the implementation returned no {what}")),
    };
    if args.passes.fwd {
        in_rows("out", out.out.as_ref())?;
    }
    if args.passes.dgrad {
        // dlhs has no element at K = 0; its shape is still checked by the reference.
        in_rows("dlhs", out.dlhs.as_ref())?;
    }
    verified(imp, &case, args.passes)
}
