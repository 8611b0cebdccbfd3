//! One property type for every operation: [`Property`], generic over the [`Op`] it checks,
//! and [`PropertyOp`], what an operation adds to join (its strategy arguments and its list of
//! properties).
//!
//! Each operation lists its properties as a table of `Property` values (name, description,
//! strategy, test). The tables of different operations look alike line by line — they are
//! data of one shape, not repeated logic — and the duplicate finder reports them as such.

use moecheck_reference::op::{verify, Implementation, Op, Verdict};
use proptest::strategy::BoxedStrategy;

use crate::runner::{run_property_observed, CaseResult, Outcome, RunConfig, Step};

/// An operation with properties: its generated-case arguments and the properties themselves.
pub trait PropertyOp: Op {
    /// The arguments a case is built from (what shrinks and what a minimal case prints).
    type Args: Clone + std::fmt::Debug;

    /// Every property of this operation, in a fixed order.
    fn properties() -> Vec<Property<Self>>;

    /// The case `args` describe, with what a full check asks of it (every pass). A property
    /// that checks less names its own ([`Property::case`]).
    fn case_of(args: &Self::Args) -> (Self::Case, Self::Ask);

    /// Most shrink steps after a failure, whatever the run's budget (an operation whose
    /// cases are expensive caps it).
    const MAX_SHRINK_ITERS: u32 = u32::MAX;

    /// How many rejected (redrawn) cases a run of `cases` cases tolerates before it fails as
    /// "aborted", so a property that rejects everything cannot pass vacuously.
    fn max_rejects(cases: u32) -> u32 {
        let _ = cases;
        0
    }
}

/// A property of implementations of `O`.
pub struct Property<O: PropertyOp> {
    /// Kebab-case name (`fwd-matches-reference`, …).
    pub name: &'static str,
    /// One line on what it checks.
    pub description: &'static str,
    /// The cases it runs on.
    pub strategy: fn() -> BoxedStrategy<O::Args>,
    /// The check of one case.
    pub test: fn(&dyn Implementation<O>, &O::Args) -> CaseResult,
    /// The case and ask this property checks, when it is not the operation's full check
    /// ([`PropertyOp::case_of`]): a per-pass property asks for its pass only, so a failure
    /// written as a case directory makes `moecheck check` report the property's own line.
    pub case: Option<CaseOf<O>>,
}

/// How a property builds the case and ask it checks from its arguments.
pub type CaseOf<O> = fn(&<O as PropertyOp>::Args) -> (<O as Op>::Case, <O as Op>::Ask);

impl<O: PropertyOp> Property<O> {
    /// The case and ask of `args` for this property ([`Property::case`], by default the
    /// operation's full check).
    pub fn case_of(&self, args: &O::Args) -> (O::Case, O::Ask) {
        match self.case {
            Some(case) => case(args),
            None => O::case_of(args),
        }
    }
}

impl<O: PropertyOp> Clone for Property<O> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<O: PropertyOp> Copy for Property<O> {}

impl<O: PropertyOp> std::fmt::Debug for Property<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Property")
            .field("op", &O::NAME)
            .field("name", &self.name)
            .finish()
    }
}

/// The property of `O` called `name`.
pub fn by_name<O: PropertyOp>(name: &str) -> Option<Property<O>> {
    O::properties().into_iter().find(|p| p.name == name)
}

/// Checks `prop` against `imp` on `config.cases` cases drawn deterministically from
/// `config.seed`; rejected cases are redrawn, and a failure is shrunk quietly to a minimal
/// case, whose arguments come back in the outcome.
pub fn check<O: PropertyOp>(
    prop: &Property<O>,
    imp: &dyn Implementation<O>,
    config: &RunConfig,
) -> Outcome<O::Args> {
    check_observed(prop, imp, config, &mut |_| {})
}

/// [`check`], telling `observe` of every case and shrink step ([`run_property_observed`]).
pub fn check_observed<O: PropertyOp>(
    prop: &Property<O>,
    imp: &dyn Implementation<O>,
    config: &RunConfig,
    observe: &mut dyn FnMut(Step),
) -> Outcome<O::Args> {
    let config = RunConfig {
        max_shrink_iters: config.max_shrink_iters.min(O::MAX_SHRINK_ITERS),
        ..*config
    };
    run_property_observed(
        &(prop.strategy)(),
        |args| (prop.test)(imp, args),
        &config,
        O::max_rejects(config.cases),
        observe,
    )
}

/// `Ok` when `imp` passes the full check of `case`, else the failure's one line. An invalid
/// generated case is a failure of the property's generator, and says so.
pub fn verified<O: Op>(
    imp: &dyn Implementation<O>,
    case: &O::Case,
    ask: O::Ask,
) -> Result<(), String> {
    match verify(imp, case, ask).verdict {
        Verdict::BadInput(e) => Err(format!("invalid generated case: {e}")),
        v => v.failure().map_or(Ok(()), Err),
    }
}
