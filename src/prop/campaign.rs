//! One property campaign (`moecheck prop`): every property of one operation against one
//! implementation, `cases` cases each from one seed, through the runner every property goes
//! through ([`moecheck_properties::check_observed`]: the same definitions as `cargo test`
//! and `selftest`).
//!
//! A failure is shrunk (at most `max_shrink` steps) and its minimal case is written as a
//! protocol case directory, `OUT/<op>-<property>-seed-<seed>` (`OUT` defaults to
//! `./moecheck-prop`): the case and the ask the property checks ([`Property::case_of`]) and
//! the implementation's outputs on it. The line that reproduces it is `moecheck check DIR
//! [declaration flags]` when checking that directory fails with the property's own reason
//! (verified here before it is printed), else the `moecheck prop` command that finds it
//! again (a metamorphic property, a property on an implementation's internals, an
//! implementation that produced nothing).

use std::ops::ControlFlow;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::bail;
use moecheck_properties::{check_in, Outcome, Property, PropertyOp, RunConfig, Step};
use moecheck_reference::op::{Implementation, RunError};

use super::command::{self, PropRun};
use super::report::{PropReport, PropertyResult, PropertyVerdict};
use crate::contract::{Contract, Contracted};
use crate::ops::{self, Operation, Visit};
use crate::pipeline;
use crate::progress::Progress;
use crate::registry::{self, Backends, Choice};
use crate::user_file;

/// Cases per property when `--cases` is not given.
pub const DEFAULT_CASES: u32 = 64;
/// Shrink steps per failure when `--max-shrink` is not given: the runner's own default, what
/// `cargo test` and `selftest` shrink with.
pub const DEFAULT_MAX_SHRINK: u32 = moecheck_properties::DEFAULT_MAX_SHRINK_ITERS;
/// Where minimal cases go when `--out` is not given.
pub const DEFAULT_OUT: &str = "moecheck-prop";

/// What a campaign runs, as its command line said.
#[derive(Debug, Clone)]
pub struct Campaign {
    /// The implementation (`--impl`, `--inject`, `--timeout`, the declaration flags).
    pub choice: Choice,
    /// Cases per property.
    pub cases: u32,
    pub seed: u64,
    /// Most shrink steps per failure (an operation may cap it lower).
    pub max_shrink: u32,
    /// The directory minimal cases are written under.
    pub out: PathBuf,
    /// Only these properties (`--property`); all of them when empty.
    pub only: Vec<String>,
    /// The contract the flags declare (`--tail`, `--passes`, `--supports`, ...): each key
    /// replaces the worker greeting's.
    pub flags: Contract,
    /// Those flags as words, for the line that reproduces a failure.
    pub flag_words: Vec<String>,
    /// `--strict`: a property not run, a property stopped by refusals or an edge class no
    /// case exercised fails the campaign.
    pub strict: bool,
}

impl Campaign {
    /// Where the minimal case of `property` of `op` is written.
    pub fn case_dir(&self, op: &str, property: &str) -> PathBuf {
        self.out.join(format!("{op}-{property}-seed-{}", self.seed))
    }
}

/// Runs the campaign `c` on the operation called `op` (`gemm`, `fp8`, `route`, `moe`).
pub fn run_named(op: &str, c: &Campaign) -> anyhow::Result<PropReport> {
    struct Named<'a>(&'a str, &'a Campaign, Option<anyhow::Result<PropReport>>);
    impl Visit for Named<'_> {
        fn visit<O: Operation>(&mut self, _: &'static str) -> ControlFlow<()> {
            if O::NAME != self.0 {
                return ControlFlow::Continue(());
            }
            self.2 = Some(run::<O>(self.1));
            ControlFlow::Break(())
        }
    }
    let mut named = Named(op, c, None);
    ops::each(&mut named);
    named
        .2
        .unwrap_or_else(|| bail!("--op {op}: expected one of {}", ops::names().join(", ")))
}

/// Runs the campaign `c` on `O`. Bad flags, an implementation the registry refuses, or a
/// minimal case that cannot be written are errors (exit 2); failed properties are in the
/// report.
pub fn run<O: Operation>(c: &Campaign) -> anyhow::Result<PropReport> {
    let properties = selected::<O>(&c.only)?;
    if c.cases == 0 {
        bail!("--cases must be at least 1");
    }
    if c.out.exists() && !c.out.is_dir() {
        bail!("--out {}: not a directory", c.out.display());
    }
    user_file::check_dir(&c.out, "--out")?;
    for p in &properties {
        pipeline::replaceable(&c.case_dir(O::NAME, p.name), "--out")?;
    }
    // Last: a worker is started here.
    let Prepared {
        imp,
        contract,
        domain,
    } = implementation::<O>(c)?;
    let progress = Progress::cases(u64::from(c.cases) * properties.len() as u64);
    let mut results = Vec::with_capacity(properties.len());
    for (i, p) in properties.iter().enumerate() {
        progress.stage(p.name);
        if let Some(e) = imp.broken() {
            results.push(not_run(p, &e));
            continue;
        }
        results.push(property::<O>(c, imp.as_ref(), p, &domain, &progress)?);
        progress.set_position(u64::from(c.cases) * (i as u64 + 1));
    }
    progress.done();
    let exercised: Vec<&str> = results
        .iter()
        .flat_map(|r| r.exercised.iter().map(String::as_str))
        .collect();
    let unexercised = O::EDGES
        .iter()
        .filter(|e| !exercised.contains(e))
        .map(|e| e.to_string())
        .collect();
    let mut report = PropReport {
        verdict: moecheck_reference::op::VerdictKind::Pass,
        op: O::NAME.to_string(),
        implementation: imp.name(),
        is_model: imp.is_model(),
        cases: c.cases,
        seed: c.seed,
        max_shrink: c.max_shrink.min(O::MAX_SHRINK_ITERS),
        contract: contract.lines(),
        strict: c.strict,
        unexercised,
        properties: results,
    };
    report.verdict = report.verdict_of();
    Ok(report)
}

/// The implementation `c` names, the contract the campaign draws in and its domain: a worker
/// is started at once and its greeting's contract for `O` read, then the flags' keys replace
/// its keys (the precision flags, `--acc` ..., replace the greeting's precision keys).
fn implementation<O: Operation>(c: &Campaign) -> anyhow::Result<Prepared<O>> {
    // Every flag checked against the implementation first (exit 2 before anything starts).
    let checked = registry::build::<O>(&c.choice).map_err(anyhow::Error::msg)?;
    let (flags_domain, _) = O::read_contract(&c.flags).map_err(anyhow::Error::msg)?;
    let name = c.choice.name.trim();
    let flags_domain = if name.starts_with("exec:") || name.starts_with("worker:") {
        O::external(flags_domain)
    } else {
        flags_domain
    };
    let Some(mut worker) = registry::worker::<O>(&c.choice) else {
        return Ok(Prepared {
            imp: checked,
            contract: c.flags.clone(),
            domain: flags_domain,
        });
    };
    let greeting = match worker.contract(O::PROTOCOL_OP, <O as Contracted>::CONTRACT_KEY) {
        Ok(g) => g,
        // It cannot start: every property says so ([`Implementation::broken`]).
        Err(_) => {
            return Ok(Prepared {
                imp: Box::new(worker),
                contract: c.flags.clone(),
                domain: flags_domain,
            })
        }
    };
    let greeted = Contract::from_greeting(<O as Contracted>::CONTRACT_KEY, greeting.as_ref())
        .map_err(anyhow::Error::msg)?;
    let contract = greeted.overridden_by(&c.flags);
    let (domain, declared) = O::read_contract(&contract).map_err(anyhow::Error::msg)?;
    let domain = O::external(domain);
    let declared = c.choice.declared.or(declared);
    worker.declaration = registry::declaration::<O>(&declared).map_err(|e| {
        anyhow::anyhow!(
            "the worker's greeting declares what op {} does not read: {e}",
            O::NAME
        )
    })?;
    Ok(Prepared {
        imp: Box::new(worker),
        contract,
        domain,
    })
}

/// What a campaign runs against: the implementation, its contract and the domain read from it.
struct Prepared<O: Operation> {
    imp: Box<dyn Implementation<O>>,
    contract: Contract,
    domain: O::Domain,
}

/// The properties of `O` named in `only` (all when it is empty), in `O`'s order.
fn selected<O: PropertyOp>(only: &[String]) -> anyhow::Result<Vec<Property<O>>> {
    let all = O::properties();
    if let Some(unknown) = only.iter().find(|n| !all.iter().any(|p| p.name == *n)) {
        let names: Vec<&str> = all.iter().map(|p| p.name).collect();
        bail!(
            "--property {unknown}: op {} has no such property (expected one of: {})",
            O::NAME,
            names.join(", ")
        );
    }
    Ok(all
        .into_iter()
        .filter(|p| only.is_empty() || only.iter().any(|n| n == p.name))
        .collect())
}

/// A property that was not run because the implementation can run nothing (a worker that
/// never started): it fails, with a reason that says why, without paying for any case.
fn not_run<O: PropertyOp>(p: &Property<O>, why: &RunError) -> PropertyResult {
    let first = why.message.lines().next().unwrap_or_default();
    PropertyResult {
        verdict: PropertyVerdict::Fail,
        reason: Some(format!(
            "not run: the implementation can run nothing, it failed to start ({first})"
        )),
        ..PropertyResult::new(p.name, p.description)
    }
}

/// One property: its cases, and for a failure the minimal case and its reproduce line.
fn property<O: Operation>(
    c: &Campaign,
    imp: &dyn Implementation<O>,
    p: &Property<O>,
    domain: &O::Domain,
    progress: &Progress,
) -> anyhow::Result<PropertyResult> {
    let mut result = PropertyResult::new(p.name, p.description);
    if let Some(reason) = O::relaxed(domain, p.name) {
        result.verdict = PropertyVerdict::NotApplicable;
        result.reason = Some(reason);
        return Ok(result);
    }
    let config = RunConfig {
        cases: c.cases,
        seed: c.seed,
        max_shrink_iters: c.max_shrink,
    };
    let start = Instant::now();
    let (outcome, coverage) = check_in(p, imp, &config, domain, &mut |step| match step {
        Step::Passed => progress.step(),
        Step::Failed => progress.stage(&format!("{}: shrinking", p.name)),
        Step::Shrunk(n) => progress.stage(&format!("{}: shrinking, step {n}", p.name)),
        Step::Rejected | Step::Refused => {}
    });
    result.seconds = start.elapsed().as_secs_f64();
    result.set_coverage(&coverage);
    let (reason, minimal_case, minimal) = match outcome {
        Outcome::Passed { .. } => return Ok(result),
        Outcome::NotApplicable { reason } => {
            result.verdict = PropertyVerdict::Skipped;
            result.reason = Some(reason);
            return Ok(result);
        }
        Outcome::Inconclusive { reason, .. } => {
            result.verdict = PropertyVerdict::Inconclusive;
            result.reason = Some(format!("inconclusive: {reason}"));
            return Ok(result);
        }
        Outcome::NotRun { reason } => {
            result.verdict = PropertyVerdict::NotRun;
            result.reason = Some(reason);
            return Ok(result);
        }
        Outcome::Failed {
            reason,
            minimal_case,
            minimal,
            ..
        } => (reason, minimal_case, minimal),
    };
    let run = PropRun {
        op: O::NAME,
        property: p.name,
        cases: c.cases,
        seed: c.seed,
        max_shrink: (c.max_shrink != DEFAULT_MAX_SHRINK).then_some(c.max_shrink),
        flags: &c.flag_words,
    };
    let mut reproduce = command::prop_line(&c.choice, &run);
    if let Some(args) = &minimal {
        let dir = c.case_dir(O::NAME, p.name);
        // A case that cannot be written (a full disk) loses no verdict: the report says the
        // rest, and the command exits 2 with this reason after it.
        match write_minimal(&dir, imp, p, args, &reason) {
            Ok(line) => {
                reproduce = line.unwrap_or(reproduce);
                result.minimal_case = Some(dir.display().to_string());
            }
            Err(e) => result.unwritten = Some(format!("{e:#}")),
        }
        result.arguments = Some(minimal_case);
    }
    result.verdict = PropertyVerdict::Fail;
    result.reason = Some(reason);
    result.reproduce = Some(reproduce);
    Ok(result)
}

/// Writes the minimal case of `p` built from `args` (its case, its ask and `imp`'s outputs
/// on it) to `dir`, and returns the `moecheck check` line when checking `dir` fails with
/// `reason`, the property's own line.
fn write_minimal<O: Operation>(
    dir: &Path,
    imp: &dyn Implementation<O>,
    p: &Property<O>,
    args: &O::Args,
    reason: &str,
) -> anyhow::Result<Option<String>> {
    let (case, ask) = p.case_of(args);
    // A panic was a failure of the case in the runner; here it leaves no outputs.
    let outputs = catch_unwind(AssertUnwindSafe(|| imp.run(&case, ask)))
        .ok()
        .and_then(Result::ok);
    let precision = imp.precision(&case);
    pipeline::write_dump::<O>(dir, &case, ask, outputs.as_ref(), Some(&precision), "--out")?;
    if outputs.is_none() {
        return Ok(None);
    }
    let declared = command::fewest::<O>(<O as Backends>::declared(&case, &imp.precision(&case)));
    let Ok(declaration) = registry::declaration::<O>(&declared) else {
        return Ok(None);
    };
    let again = pipeline::verify_dir::<O>(dir, &declaration, Default::default())
        .ok()
        .and_then(|checked| checked.verdict.failure());
    Ok((again.as_deref() == Some(reason)).then(|| command::check_line(dir, &declared)))
}

#[cfg(test)]
mod tests {
    use moecheck_properties::PropertyOp;
    use moecheck_reference::gemm::Gemm;

    use super::*;

    #[test]
    fn only_case_directories_are_replaced() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("gemm-k-zero-seed-0");
        pipeline::replaceable(&dir, "--out").unwrap();
        let args = moecheck_properties::gemm::GemmArgs {
            dtype: moecheck_reference::format::Format::Bf16,
            out_dtype: moecheck_reference::format::Format::F32,
            group_sizes: vec![1],
            tail_rows: 0,
            k: 1,
            n: 1,
            lhs_exp: 0,
            expert_exp: vec![0],
            dout_exp: 0,
            int_max: 1,
            value_seed: 0,
            tail: Default::default(),
            passes: moecheck_reference::gemm::Passes::ALL,
        };
        let (case, ask) = Gemm::case_of(&args);
        pipeline::write_dump::<Gemm>(&dir, &case, ask, None, None, "--out").unwrap();
        pipeline::replaceable(&dir, "--out").unwrap();
        std::fs::write(dir.join("notes.txt"), "mine").unwrap();
        let e = pipeline::replaceable(&dir, "--out")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a case directory"), "{e}");
    }

    #[test]
    fn an_unknown_property_is_refused_naming_the_known_ones() {
        let e = selected::<Gemm>(&["nope".into()]).unwrap_err().to_string();
        assert!(e.contains("--property nope") && e.contains("k-zero"), "{e}");
        assert_eq!(selected::<Gemm>(&["k-zero".into()]).unwrap().len(), 1);
        assert_eq!(
            selected::<Gemm>(&[]).unwrap().len(),
            Gemm::properties().len()
        );
    }
}
