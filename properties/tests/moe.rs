//! The f64 reference layer satisfies every layer property (the emulate model and its planted
//! bugs are in `moecheck selftest`).

use moecheck_properties::{check, PropertyOp, RunConfig};
use moecheck_reference::moe::MoeLayer;
use moecheck_reference::op::Reference;

#[test]
fn reference_layer_satisfies_every_layer_property() {
    let config = RunConfig::default();
    for p in MoeLayer::properties() {
        let o = check(&p, &Reference, &config);
        assert!(o.passed(), "{}: {o:?}", p.name);
    }
}
