//! The MoE-layer section of `moecheck selftest`: every layer property against the correct
//! layer model (`MoeEmulate` without a bug), which must pass all of them, and against each
//! [`MoeBug`], which at least one property must catch; every property must catch some bug.

use moecheck_properties::moe::{check_layer, layer_properties};
use moecheck_properties::RunConfig;

use crate::impls::moe_emulate::{MoeBug, MoeEmulate};
use crate::selftest::{cell, Row, Section};

fn row(imp: &MoeEmulate, config: &RunConfig) -> Row {
    let cells = layer_properties()
        .iter()
        .map(|p| cell(p.name, check_layer(p, imp, config)))
        .collect();
    Row {
        bug: imp.inject.map(|b| b.name().to_string()),
        implementation: moecheck_reference::moe::MoeLayer::name(imp),
        description: imp
            .inject
            .map_or("the correct layer model", MoeBug::description)
            .to_string(),
        cells,
    }
}

/// The `moe layer` section: the layer properties against the correct model and every bug.
pub fn section(config: &RunConfig) -> Section {
    let properties: Vec<String> = layer_properties()
        .iter()
        .map(|p| p.name.to_string())
        .collect();
    let correct = row(&MoeEmulate::default(), config);
    let bugs: Vec<Row> = MoeBug::ALL
        .iter()
        .map(|&b| row(&MoeEmulate { inject: Some(b) }, config))
        .collect();
    Section::new("moe layer", properties, correct, bugs)
}
