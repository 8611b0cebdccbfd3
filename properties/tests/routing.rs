//! Every routing property holds for the reference itself.

use moecheck_properties::{check, PropertyOp, RunConfig};
use moecheck_reference::op::Reference;
use moecheck_reference::routing::Route;

#[test]
fn reference_router_passes_every_routing_property() {
    for p in Route::properties() {
        let out = check(&p, &Reference, &RunConfig::default());
        assert!(out.passed(), "{}: {out:?}", p.name);
    }
}
