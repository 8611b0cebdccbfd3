//! Implementations under test, besides the reference itself
//! ([`moecheck_reference::op::Reference`]).
//!
//! * Per operation, its CPU **model** of a kernel with planted bugs (`--impl emulate --inject
//!   BUG`) and its GPU implementations, registered through [`crate::registry::Backends`]:
//!   [`gemm`], [`fp8`], [`route`], [`moe`]. A model is never a GPU
//!   result.
//! * [`exec`]: any external program, through the case-directory protocol (v1), for every
//!   operation; [`worker`]: a persistent program answering case after case (protocol v2).
//!   Both run their program through [`process`], which cannot hang.

pub mod exec;
pub mod fp8;
pub mod gemm;
pub mod interrupt;
pub mod moe;
pub mod process;
pub mod route;
pub mod worker;

/// A defect that can be planted in an operation's CPU model (`--inject NAME`).
pub trait PlantedBug: Copy + Eq + std::fmt::Debug + 'static {
    /// Every bug of the model, in `selftest`'s order.
    const ALL: &'static [Self];
    /// The kebab-case name used in `--inject`.
    fn name(self) -> &'static str;
    /// One line on what the defect does.
    fn description(self) -> &'static str;
}

/// The bug called `name` (`--inject NAME`), or a reason listing the known ones.
pub fn parse_bug<B: PlantedBug>(name: &str) -> Result<B, String> {
    let name = name.trim();
    B::ALL
        .iter()
        .copied()
        .find(|b| b.name() == name)
        .ok_or_else(|| {
            let names: Vec<_> = B::ALL.iter().map(|b| b.name()).collect();
            format!(
                "unknown bug '{name}' (expected one of: {})",
                names.join(", ")
            )
        })
}

/// A model's report name: `emulate`, or `emulate[inject=NAME]` with a planted bug.
pub fn model_name<B: PlantedBug>(bug: Option<B>) -> String {
    match bug {
        None => "emulate".into(),
        Some(b) => format!("emulate[inject={}]", b.name()),
    }
}

/// The bug type of an operation without a CPU model: there is none to plant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoBug {}

impl PlantedBug for NoBug {
    const ALL: &'static [NoBug] = &[];
    fn name(self) -> &'static str {
        match self {}
    }
    fn description(self) -> &'static str {
        match self {}
    }
}
