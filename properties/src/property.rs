//! One property type for every operation: [`Property`], generic over the [`Op`] it checks,
//! and [`PropertyOp`], what an operation adds to join (its strategy arguments and its list of
//! properties).
//!
//! Each operation lists its properties as a table of `Property` values (name, description,
//! strategy, test). The tables of different operations look alike line by line — they are
//! data of one shape, not repeated logic — and the duplicate finder reports them as such.

use moecheck_reference::op::{verify, Implementation, Op, RunError, Verdict};
use proptest::strategy::BoxedStrategy;

use crate::runner::{
    note_inconclusive, note_run_error, run_property_in, CaseResult, Coverage, Outcome, RunConfig,
    Scope, Step,
};

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

    /// What an implementation declares about the cases it runs: the conventions it follows
    /// (which change the case: a tail rule, a routing convention) and the domain it supports
    /// (dtypes, passes, shapes, features). The default declares everything.
    type Domain: Clone + std::fmt::Debug + Default + PartialEq;

    /// `args` fitted into `domain`: the declared conventions applied and shapes rounded up
    /// where the domain allows, or why the case is outside it (it is redrawn, never run).
    fn fit(domain: &Self::Domain, args: &Self::Args) -> Result<Self::Args, String> {
        let _ = domain;
        Ok(args.clone())
    }

    /// Why the property `name` does not apply under `domain` (the declaration relaxes the
    /// rule it checks, or it needs a pass the domain leaves out), `None` when it applies.
    fn relaxed(domain: &Self::Domain, name: &str) -> Option<String> {
        let _ = (domain, name);
        None
    }

    /// Every edge class a campaign of this operation should exercise, in report order.
    const EDGES: &'static [&'static str] = &[];

    /// The edge classes ([`PropertyOp::EDGES`]) the case `args` exercises.
    fn edges(args: &Self::Args) -> Vec<&'static str> {
        let _ = args;
        Vec::new()
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

/// [`check`], telling `observe` of every case and shrink step ([`crate::run_property_observed`]).
pub fn check_observed<O: PropertyOp>(
    prop: &Property<O>,
    imp: &dyn Implementation<O>,
    config: &RunConfig,
    observe: &mut dyn FnMut(Step),
) -> Outcome<O::Args> {
    check_in(prop, imp, config, &O::Domain::default(), observe).0
}

/// [`check_observed`] on cases drawn in `domain` ([`PropertyOp::fit`]), with how they met
/// the implementation's contract ([`Coverage`]). A property the domain relaxes
/// ([`PropertyOp::relaxed`]) is not applicable and runs nothing.
pub fn check_in<O: PropertyOp>(
    prop: &Property<O>,
    imp: &dyn Implementation<O>,
    config: &RunConfig,
    domain: &O::Domain,
    observe: &mut dyn FnMut(Step),
) -> (Outcome<O::Args>, Coverage) {
    if let Some(reason) = O::relaxed(domain, prop.name) {
        return (Outcome::NotApplicable { reason }, Coverage::default());
    }
    let config = RunConfig {
        max_shrink_iters: config.max_shrink_iters.min(O::MAX_SHRINK_ITERS),
        ..*config
    };
    let watched = Watched(imp);
    let fit = |args: &O::Args| O::fit(domain, args);
    let scope = Scope {
        fit: &fit,
        edges: &O::edges,
    };
    run_property_in(
        &(prop.strategy)(),
        |args| (prop.test)(&watched, args),
        &config,
        O::max_rejects(config.cases),
        &scope,
        observe,
    )
}

/// The implementation under test as a property sees it: a case it does not support
/// ([`Implementation::supports`]) is refused before it runs, and every refusal or protocol
/// failure is noted for the loop ([`note_run_error`]), whatever the property makes of it.
struct Watched<'a, O: Op>(&'a dyn Implementation<O>);

impl<O: Op> Implementation<O> for Watched<'_, O> {
    fn name(&self) -> String {
        self.0.name()
    }
    fn is_model(&self) -> bool {
        self.0.is_model()
    }
    fn precision(&self, case: &O::Case) -> O::Precision {
        self.0.precision(case)
    }
    fn supports(&self, case: &O::Case, ask: O::Ask) -> Result<(), String> {
        let supported = self.0.supports(case, ask);
        if let Err(reason) = &supported {
            note_run_error(&RunError::refused(reason.clone()));
        }
        supported
    }
    fn broken(&self) -> Option<RunError> {
        self.0.broken()
    }
    fn shardable(&self) -> bool {
        self.0.shardable()
    }
    fn run(&self, case: &O::Case, ask: O::Ask) -> Result<O::Outputs, RunError> {
        if let Err(reason) = self.supports(case, ask) {
            return Err(RunError::refused(format!(
                "{} does not support this case: {reason}",
                self.0.name()
            )));
        }
        let result = self.0.run(case, ask);
        if let Err(e) = &result {
            note_run_error(e);
        }
        result
    }
    fn internals(&self, case: &O::Case, ask: O::Ask) -> Option<O::Internals> {
        self.0.internals(case, ask)
    }
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
        Verdict::Inconclusive { reason, .. } => {
            note_inconclusive(&reason);
            Err(format!("inconclusive: {reason}"))
        }
        v => v.failure().map_or(Ok(()), Err),
    }
}
