//! The f64 reference layer satisfies every layer property (the emulate model and its planted
//! bugs are in `moecheck selftest`).

use moecheck_properties::moe::{check_layer, layer_properties};
use moecheck_properties::RunConfig;
use moecheck_reference::moe::ReferenceLayer;

#[test]
fn reference_layer_satisfies_every_layer_property() {
    let config = RunConfig::default();
    for p in layer_properties() {
        let o = check_layer(&p, &ReferenceLayer, &config);
        assert!(o.passed(), "{}: {o:?}", p.name);
    }
}
