//! What each operation adds to moecheck's implementations, below the registry that builds
//! them by name: its CPU model with planted bugs and its GPU implementations ([`Backends`]),
//! the planted bugs themselves ([`PlantedBug`]), and the declaration flags an external
//! implementation's precision is declared with ([`Declared`], [`declaration`], [`fewest`]).
//! The implementations (`crate::impls`, `crate::cuda`) implement it; the registry
//! (`crate::registry`) and everything above it use it.

use moecheck_reference::gemm::Verify;
use moecheck_reference::op::Implementation;
use moecheck_reference::protocol::Protocol;

/// The declaration flags (defined beside the case-directory format that records them).
pub use crate::protocol::Declared;

/// What an operation adds to the registry beyond `reference`, `exec:` and `worker:`.
pub trait Backends: Protocol {
    /// The bugs its CPU model can plant ([`NoBug`] without a model).
    type Bug: PlantedBug;

    /// What the declaration flags declare about an external implementation, for messages
    /// (`accumulator`, `compute format`).
    const DECLARES: &'static str;

    /// The declaration flags it reads (a subset of [`Declared`]'s).
    const DECLARATION_FLAGS: &'static [&'static str];

    /// Why a declaration flag it does not read does not apply (one line).
    const NOT_DECLARED_BY: &'static str = "it declares nothing with flags";

    /// Its declaration from the flags it reads (defaults where they were not given); the
    /// error is one line naming the flag.
    fn declaration(declared: &Declared) -> Result<Self::Declaration, String>;

    /// The declaration flags that declare `precision` (the inverse of
    /// [`Backends::declaration`]), or come closest where the flags cannot say all of it: a
    /// `moecheck check` line that reproduces a built-in implementation's failure states them.
    /// By default none (an operation whose precision no flag declares). `case` is the case
    /// the precision was declared for (a grouped GEMM's output format is declared only where
    /// it is not the case's).
    fn declared(case: &Self::Case, precision: &Self::Precision) -> Declared {
        let _ = (case, precision);
        Declared::default()
    }

    /// The check mode `--verify` asks for ([`Op::Check`]): `None` is the default mode; the
    /// default refuses any mode, for operations checked one way. The error is one line.
    fn check_mode(verify: Option<Verify>) -> Result<Self::Check, String> {
        match verify {
            None => Ok(Self::Check::default()),
            Some(v) => Err(format!(
                "--verify {v}: only a grouped GEMM (and an FP8 one) has verification modes; {} is checked one way",
                Self::NAME
            )),
        }
    }

    /// Its CPU model with `bug` planted; `None` when the operation has no model.
    fn emulate(bug: Option<Self::Bug>) -> Option<Box<dyn Implementation<Self>>>;

    /// The names of its GPU implementations (`--impl NAME`).
    fn gpu_names() -> &'static [&'static str] {
        &[]
    }

    /// The GPU implementation `name` (one of [`Backends::gpu_names`]); `None` when this build
    /// has no CUDA backend. Building one never touches CUDA: without a device its runs fail.
    fn gpu(name: &str) -> Option<Box<dyn Implementation<Self>>> {
        let _ = name;
        None
    }
}

/// The declaration `declared` makes for `O`, refusing a flag `O` does not read.
pub fn declaration<O: Backends>(declared: &Declared) -> Result<O::Declaration, String> {
    if let Some(flag) = declared
        .given()
        .into_iter()
        .find(|f| !O::DECLARATION_FLAGS.contains(f))
    {
        return Err(format!(
            "{flag} does not apply to op {}: {}",
            O::NAME,
            O::NOT_DECLARED_BY
        ));
    }
    O::declaration(declared)
}

/// `d` without the flags that declare nothing beyond `O`'s defaults: each flag whose absence
/// leaves `O`'s declaration unchanged is dropped.
pub fn fewest<O: Backends>(d: Declared) -> Declared {
    let Ok(full) = O::declaration(&d) else {
        return d;
    };
    let mut d = d;
    let without: [fn(&mut Declared); 4] = [
        |d| d.acc = None,
        |d| d.acc_block = None,
        |d| d.compute = None,
        |d| d.out_dtype = None,
    ];
    for drop in without {
        let mut fewer = d;
        drop(&mut fewer);
        if O::declaration(&fewer).is_ok_and(|x| x == full) {
            d = fewer;
        }
    }
    d
}

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
