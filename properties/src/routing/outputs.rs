//! The routing properties' shared steps: the generated case (which the reference must
//! accept) and the implementation's run with its output shapes checked.

use moecheck_reference::op::{Implementation, Op};
use moecheck_reference::routing::{Route, RouteOutputs, RoutingCase};

use super::strategies::RouteArgs;

/// The case of `args`, which the reference must accept: an invalid generated case is a bug of
/// the generator, and fails the property saying so.
pub(super) fn valid_case(args: &RouteArgs) -> Result<RoutingCase, String> {
    let case = args.build();
    Route::validate(&case, ()).map_err(|e| format!("invalid generated case: {e}"))?;
    Ok(case)
}

/// Runs `imp` and checks the output shapes and index range (so checks can index freely).
pub(super) fn run(
    imp: &dyn Implementation<Route>,
    case: &RoutingCase,
) -> Result<RouteOutputs, String> {
    let out = imp.run(case, ()).map_err(|e| format!("run failed: {e}"))?;
    let (t, k, e) = (case.tokens(), case.config.topk, case.experts());
    for (name, dim) in [
        ("indices", out.indices.dim()),
        ("weights", out.weights.dim()),
        ("kept", out.kept.dim()),
    ] {
        if dim != (t, k) {
            return Err(format!("{name} has shape {dim:?}, expected {:?}", (t, k)));
        }
    }
    if out.group_sizes.len() != e {
        return Err(format!(
            "group_sizes has {} entries, expected {e}",
            out.group_sizes.len()
        ));
    }
    if let Some(((ti, j), x)) = out.indices.indexed_iter().find(|(_, &x)| x >= e) {
        return Err(format!(
            "indices[{ti}, {j}] = {x} is not an expert (E = {e})"
        ));
    }
    Ok(out)
}

/// The same case without capacity dropping.
pub(super) fn without_capacity(case: &RoutingCase) -> RoutingCase {
    let mut c = case.clone();
    c.config.capacity = None;
    c
}
