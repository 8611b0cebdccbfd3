//! How a property's cases meet the implementation's contract: the scope they are drawn in
//! ([`Scope`]: fitted into the declared domain, their edge classes named), what came of them
//! ([`Coverage`]), the caps on refusals, and what the checks of one case note beside their
//! result (a refusal, a broken protocol, an inconclusive verdict) for the loop
//! ([`crate::runner`]).

use std::cell::RefCell;
use std::collections::BTreeSet;

use moecheck_reference::op::{RunError, RunErrorKind};

/// How a property's cases met the implementation's contract: what was applied, what was
/// refused or fell outside the declared domain, and which edge classes the applied cases
/// exercised.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Coverage {
    /// Cases the implementation ran (passed, failed or inconclusive; shrink steps not counted).
    pub applied: u32,
    /// Cases the implementation refused (not applicable; never shrunk).
    pub refused: u32,
    /// Drawn cases outside the declared domain, never sent to the implementation.
    pub outside: u32,
    /// Applied cases that were inconclusive.
    pub inconclusive: u32,
    /// The edge classes the applied cases exercised ([`crate::PropertyOp::edges`]).
    pub edges: BTreeSet<&'static str>,
    /// The last refusal's reason, or the last reason a drawn case was outside the domain.
    pub last_refusal: Option<String>,
    /// Why the property stopped before its cases were all applied (too many refusals).
    pub stopped: Option<String>,
}

/// The scope a property's cases are drawn in: `fit` maps a drawn case into the declared
/// domain (the declaration applied, a shape rounded up to a supported multiple) or says why
/// it is outside (such a case is redrawn and never reaches the implementation), and `edges`
/// names the edge classes a case exercises.
pub struct Scope<'a, A> {
    pub fit: &'a dyn Fn(&A) -> Result<A, String>,
    pub edges: &'a dyn Fn(&A) -> Vec<&'static str>,
}

pub(crate) fn as_drawn<A: Clone>(a: &A) -> Result<A, String> {
    Ok(a.clone())
}

pub(crate) fn no_edges<A>(_: &A) -> Vec<&'static str> {
    Vec::new()
}

/// Implementation refusals a property tolerates per case asked for, before it stops.
pub const REFUSALS_PER_CASE: u32 = 10;
/// Drawn cases outside the declared domain a property tolerates per case asked for (they
/// cost microseconds), plus [`OUTSIDE_BASE`].
pub const OUTSIDE_PER_CASE: u32 = 100;
/// See [`OUTSIDE_PER_CASE`].
pub const OUTSIDE_BASE: u32 = 1000;

/// What the checks of one case noted beside their result: a refusal or a protocol failure of
/// the implementation ([`note_run_error`]), an inconclusive verdict ([`note_inconclusive`]).
/// Kept per thread, taken by the loop after each case.
#[derive(Debug, Default)]
pub(crate) struct Notes {
    pub(crate) refused: Option<String>,
    pub(crate) broken: bool,
    pub(crate) inconclusive: Option<String>,
}

thread_local! {
    static NOTES: RefCell<Notes> = RefCell::new(Notes::default());
}

/// Notes a run error of the implementation under test for the case being checked: a
/// refusal makes the case not applicable whatever the property concluded from it, a broken
/// protocol or timeout makes its failure one that is not shrunk.
pub fn note_run_error(e: &RunError) {
    NOTES.with(|n| {
        let mut n = n.borrow_mut();
        match e.kind {
            RunErrorKind::Refused => n.refused = Some(e.message.clone()),
            RunErrorKind::Broken => n.broken = true,
            RunErrorKind::Failed => {}
        }
    });
}

/// Notes that the case being checked was inconclusive (`reason`): its failure line is then
/// an inconclusive case, not a failure.
pub fn note_inconclusive(reason: &str) {
    NOTES.with(|n| n.borrow_mut().inconclusive = Some(reason.to_string()));
}

pub(crate) fn take_notes() -> Notes {
    NOTES.with(|n| std::mem::take(&mut *n.borrow_mut()))
}

/// The names of `names` whose condition in `hits` holds, in `names`' order: the edge classes a
/// case exercises, from one condition per class.
pub fn edges_hit<const N: usize>(names: &[&'static str; N], hits: [bool; N]) -> Vec<&'static str> {
    names
        .iter()
        .zip(hits)
        .filter_map(|(name, hit)| hit.then_some(*name))
        .collect()
}

/// `Err` naming `dtype` and the declared ones when `dtypes` (`None`: every one) leaves it out.
pub fn dtype_declared(
    dtype: moecheck_reference::format::Format,
    dtypes: &Option<Vec<moecheck_reference::format::Format>>,
) -> Result<(), String> {
    match dtypes {
        Some(d) if !d.contains(&dtype) => {
            let names: Vec<&str> = d.iter().map(|f| f.name()).collect();
            Err(format!(
                "dtype {} (declared dtypes: {})",
                dtype.name(),
                names.join(", ")
            ))
        }
        _ => Ok(()),
    }
}
