//! The FP8 section of `moecheck selftest`: every FP8 property against the correct FP8 model
//! ([`EmulateFp8`] without a bug), which must pass all of them, and against each [`Fp8Bug`],
//! which at least one property must catch; every property must catch some bug.

use moecheck_properties::fp8::{check_fp8, fp8_all};
use moecheck_properties::RunConfig;
use moecheck_reference::fp8::Fp8GroupedGemm;

use crate::impls::emulate_fp8::{EmulateFp8, Fp8Bug};
use crate::selftest::{cell, Row, Section};

fn row(imp: &EmulateFp8, bug: Option<Fp8Bug>, config: &RunConfig) -> Row {
    Row {
        bug: bug.map(|b| b.name().to_string()),
        implementation: imp.name(),
        description: bug
            .map_or("the correct FP8 model", |b| b.description())
            .to_string(),
        cells: fp8_all()
            .iter()
            .map(|p| cell(p.name, check_fp8(p, imp, config)))
            .collect(),
    }
}

/// The FP8 section (current scaling, E4M3 forward / E5M2 backward): every FP8 property
/// against the correct model and each planted FP8 bug.
pub fn fp8_section(config: &RunConfig) -> Section {
    let properties = fp8_all().iter().map(|p| p.name.to_string()).collect();
    let correct = row(&EmulateFp8::default(), None, config);
    let bugs = Fp8Bug::ALL
        .iter()
        .map(|&b| row(&EmulateFp8::with_bug(Some(b)), Some(b), config))
        .collect();
    Section::new("fp8", properties, correct, bugs)
}
