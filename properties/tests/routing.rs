//! Every routing property holds for the reference itself.

use moecheck_properties::routing::{all_route, check_route};
use moecheck_properties::RunConfig;
use moecheck_reference::routing::ReferenceRouter;

#[test]
fn reference_router_passes_every_routing_property() {
    for p in all_route() {
        let out = check_route(&p, &ReferenceRouter, &RunConfig::default());
        assert!(out.passed(), "{}: {out:?}", p.name);
    }
}
