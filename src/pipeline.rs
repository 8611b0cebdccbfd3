//! The one check pipeline, for every operation:
//!
//! ```text
//! generate -> implementation (from the registry) -> verify -> dump -> report
//! ```
//!
//! A command parses its flags into a generator ([`Generate`]) and an implementation
//! ([`crate::registry`]), calls [`run`], and prints [`report`]. `moecheck check DIR` enters
//! at the same place with a case read from a directory ([`check_dir`]).

use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context};

use moecheck_reference::gemm::shard::Shard;
use moecheck_reference::op::{verify_against, Implementation, Op, RunError, Verdict, Verified};
use moecheck_reference::protocol::Protocol;
use moecheck_reference::report::{Implemented, Reported, RunInfo};

use crate::backends::fewest;
use crate::progress::Progress;
use crate::protocol;
use crate::registry::Backends;
use crate::report::RunReport;

/// A generated case and what the run asks of it.
#[derive(Debug, Clone)]
pub struct Generated<O: Op> {
    pub case: O::Case,
    pub ask: O::Ask,
    /// Cases drawn until one could be checked (near ties are redrawn).
    pub draws: usize,
}

impl<O: Op> Generated<O> {
    /// A case found at the first draw.
    pub fn once(case: O::Case, ask: O::Ask) -> Generated<O> {
        Generated {
            case,
            ask,
            draws: 1,
        }
    }
}

/// How a command makes its case from its flags.
pub trait Generate<O: Op> {
    /// The size of the work (multiply-adds), for the progress spinner.
    fn work(&self) -> u64;

    /// The case. `precision` is what the implementation that will run it declares, for
    /// generators that must keep a case away from near ties at that precision.
    fn generate(
        &self,
        precision: &dyn Fn(&O::Case) -> O::Precision,
    ) -> anyhow::Result<Generated<O>>;

    /// Where the generator can make any shard of experts of its case on its own: a run in
    /// shards then makes one shard's inputs at a time and never holds the whole case's.
    /// `None` (the default): the whole case is made and each shard copied out of it.
    fn shards(&self) -> Option<Box<dyn ShardSource<O> + '_>> {
        None
    }
}

/// A case made a shard of experts at a time ([`Generate::shards`]).
pub trait ShardSource<O: Op> {
    /// The whole case's shapes, group sizes, formats and contracts, with what the run asks:
    /// what the shards are planned on and the report describes. Its arrays are allocated
    /// zeroed and never written, so the memory is not touched (not resident), and nothing
    /// may read their values: they are not the case's.
    fn header(&self) -> anyhow::Result<Generated<O>>;

    /// Experts `shard`'s case on its own, made directly: the values the whole case holds
    /// there, what `Sharded::shard` would copy out of it.
    fn shard(&self, shard: &Shard) -> O::Case;
}

/// One finished run: the case, the reference, and the check of the implementation.
pub struct Run<O: Op> {
    pub generated: Generated<O>,
    pub expected: O::Expected,
    pub reference_seconds: f64,
    /// `None` for a reference-only run.
    pub checked: Option<(Implemented, Verified<O>)>,
    /// Why `--dump DIR` could not be written (a full disk): the verdict still stands and is
    /// reported, then the command exits 2 with this ([`Run::written`]).
    pub unwritten: Option<anyhow::Error>,
}

impl<O: Op> Run<O> {
    /// `Err` when a file the run was asked to write was not written: call it after the
    /// report is printed, so that the report is never lost with the file.
    pub fn written(&mut self) -> anyhow::Result<()> {
        self.unwritten.take().map_or(Ok(()), Err)
    }

    /// The precision the report states: the implementation's, or the reference's.
    pub fn precision(&self) -> O::Precision {
        match &self.checked {
            Some((_, v)) => v.precision.clone(),
            None => O::reference_precision(&self.generated.case),
        }
    }
}

/// Generates the case, computes the reference for a check in mode `check` ([`Op::Check`]:
/// `Default::default()` for every operation checked one way), runs `imp` once (when given),
/// checks its outputs, and writes the case and the checked outputs to `dump`.
///
/// An invalid generated case, an implementation that cannot run it as declared, or a dump
/// directory refused before the run is an error (exit 2); an implementation that fails is a
/// failing verdict; a dump that cannot be written after the check is [`Run::unwritten`].
pub fn run<O: Backends>(
    generator: &dyn Generate<O>,
    imp: Option<&dyn Implementation<O>>,
    dump: Option<&Path>,
    check: O::Check,
) -> anyhow::Result<Run<O>> {
    if let Some(dir) = dump {
        // Refused before anything runs: a directory holding anything but a case, or one
        // that cannot be written.
        replaceable(dir, "--dump")?;
        crate::user_file::check_dir(dir, "--dump")?;
    }
    let progress = Progress::new(generator.work());
    let generated = prepare(generator, imp, &progress)?;
    let (case, ask) = (&generated.case, generated.ask);
    // For the grouped GEMM this is only the validation: its reference is computed during the
    // check, expert by expert (`moecheck_reference::gemm::stream`).
    progress.stage("preparing the f64 reference");
    let start = Instant::now();
    let expected = O::expected(case, ask, check).context("generated case")?;
    let reference_seconds = start.elapsed().as_secs_f64();
    let checked = imp.map(|i| {
        progress.stage(&format!(
            "running {} and checking it against the f64 reference",
            i.name()
        ));
        let implemented = Implemented {
            name: i.name(),
            is_model: i.is_model(),
        };
        (implemented, verify_against(i, case, ask, &expected))
    });
    if let Some((
        _,
        Verified {
            verdict: Verdict::BadInput(e),
            ..
        },
    )) = &checked
    {
        bail!("generated case: {e}");
    }
    let mut unwritten = None;
    if let Some(dir) = dump {
        progress.stage("writing the case directory");
        let outputs = checked.as_ref().and_then(|(_, v)| v.outputs.as_ref());
        let precision = checked.as_ref().map(|(_, v)| &v.precision);
        unwritten = write_dump::<O>(dir, case, ask, outputs, precision, "--dump").err();
        if unwritten.is_none() && imp.is_some() && outputs.is_none() {
            eprintln!(
                "moecheck: --dump {}: the implementation produced nothing, so the case is written without outputs (`moecheck check` on it fails)",
                dir.display()
            );
        }
    }
    Ok(Run {
        generated,
        expected,
        reference_seconds,
        checked,
        unwritten,
    })
}

/// Generates the case and validates it, and refuses an implementation that cannot run it as
/// declared.
pub(crate) fn prepare<O: Op>(
    generator: &dyn Generate<O>,
    imp: Option<&dyn Implementation<O>>,
    progress: &Progress,
) -> anyhow::Result<Generated<O>> {
    progress.stage("generating the case");
    let precision_of = |case: &O::Case| match imp {
        Some(i) => i.precision(case),
        None => O::reference_precision(case),
    };
    let generated = generator.generate(&precision_of)?;
    let (case, ask) = (&generated.case, generated.ask);
    O::validate(case, ask).context("generated case")?;
    if let Some(i) = imp {
        if let Err(reason) = i.supports(case, ask) {
            bail!("{reason}");
        }
    }
    Ok(generated)
}

/// Writes the case and, when there are any, the outputs that were checked into `dir`
/// (created if needed); errors name `flag DIR` (`--dump`, `--out`).
///
/// A case directory already there (nothing but `case.json` and `.npy` files: an earlier dump)
/// is replaced whole, so no output of an earlier run is left beside this case to pass under
/// `moecheck check`; a directory holding anything else is refused ([`replaceable`]). The new
/// directory is written beside it and renamed over it ([`crate::user_file::publish_dir`]).
pub fn write_dump<O: Backends>(
    dir: &Path,
    case: &O::Case,
    ask: O::Ask,
    outputs: Option<&O::Outputs>,
    precision: Option<&O::Precision>,
    flag: &str,
) -> anyhow::Result<()> {
    replaceable(dir, flag)?;
    let named = || format!("{flag} {}", dir.display());
    // The declaration flags beyond the operation's defaults, recorded so that `moecheck
    // check DIR` reproduces the verdict without them being given again.
    let declared = precision
        .map(|p| fewest::<O>(O::declared(case, p)))
        .filter(|d| !d.given().is_empty());
    let fill = |staging: &Path| -> anyhow::Result<()> {
        protocol::write_case::<O>(staging, case, ask, declared.as_ref(), false)
            .with_context(named)?;
        if let Some(out) = outputs {
            protocol::write_outputs::<O>(staging, out).with_context(named)?;
        }
        Ok(())
    };
    // Written beside DIR and renamed over it: two runs at once never mix their files.
    crate::user_file::publish_dir(dir, flag, fill, |old| replaceable(old, flag))
}

/// `Ok` when a case directory may be written to `dir`: nothing is there, an empty directory,
/// or a case directory (`case.json` and nothing but `.npy` plain files beside it, no symbolic
/// links) that an earlier dump or campaign wrote. Anything else is refused, naming `flag`.
pub fn replaceable(dir: &Path, flag: &str) -> anyhow::Result<()> {
    let meta = match std::fs::symlink_metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("{flag} {}", dir.display())),
    };
    if !meta.is_dir() {
        bail!(
            "{flag}: {} exists and is not a directory; not replacing it",
            dir.display()
        );
    }
    // Another run may publish its dump over `dir` meanwhile (a rename: `dir` is then gone, or
    // another whole case): everything is judged from the one listing read here.
    let listing = match std::fs::read_dir(dir) {
        Ok(l) => l,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("{flag} {}", dir.display())),
    };
    let entries: Vec<Option<(String, bool)>> = listing
        .map(|e| {
            let e = e.ok()?;
            let file = e.file_type().is_ok_and(|t| t.is_file());
            Some((e.file_name().to_string_lossy().into_owned(), file))
        })
        .collect();
    let is_case_file = |e: &Option<(String, bool)>| {
        e.as_ref()
            .is_some_and(|(n, f)| *f && (n == "case.json" || n.ends_with(".npy")))
    };
    // Empty, or an earlier case: `case.json` beside nothing but `.npy` files (a directory of
    // someone's own `.npy` files, without `case.json`, is not one).
    let has_json = entries
        .iter()
        .any(|e| e.as_ref().is_some_and(|(n, f)| *f && n == "case.json"));
    let case_dir = entries.is_empty() || (has_json && entries.iter().all(is_case_file));
    if !case_dir {
        bail!(
            "{flag}: {} exists and is not a case directory (only case.json and .npy files); not replacing it",
            dir.display()
        );
    }
    Ok(())
}

/// Makes `dir` ready for a command to write the files `names` into it, or refuses (naming
/// `flag`) when that would lose something:
/// * `dir` exists and is not a directory;
/// * one of `names` there is a symbolic link (never written through; `--force` removes the
///   link itself, not its target);
/// * one of `names` there is one of `inputs` (the command would overwrite what it read);
/// * `dir` holds files other than `names` (another case, or the user's own files): nothing is
///   mixed into it.
///
/// The last two are allowed with `force`. An earlier run of the same command (only `names`
/// there) is replaced without asking.
pub fn prepare_out_dir(
    dir: &Path,
    names: &[&str],
    inputs: &[&Path],
    force: bool,
    flag: &str,
) -> anyhow::Result<()> {
    let shown = || format!("{flag} {}", dir.display());
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return std::fs::create_dir_all(dir).with_context(shown);
        }
        Err(e) => return Err(e).with_context(shown),
        Ok(m) if !std::fs::metadata(dir).is_ok_and(|m| m.is_dir()) || m.is_file() => {
            bail!("{}: exists and is not a directory", shown());
        }
        Ok(_) => {}
    }
    let canon = |p: &Path| std::fs::canonicalize(p).ok();
    let inputs: Vec<_> = inputs.iter().filter_map(|p| canon(p)).collect();
    let again = if force {
        ""
    } else {
        "; pass --force to write there anyway"
    };
    for name in names {
        let p = dir.join(name);
        let Ok(meta) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if meta.file_type().is_symlink() {
            if !force {
                bail!(
                    "{}: {name} is a symbolic link; not writing through it; pass --force to replace the link",
                    shown()
                );
            }
            std::fs::remove_file(&p).with_context(shown)?;
            continue;
        }
        if !force && canon(&p).is_some_and(|c| inputs.contains(&c)) {
            bail!(
                "{}: {name} is this command's own input; not overwriting it{again}",
                shown()
            );
        }
    }
    let mut others: Vec<String> = std::fs::read_dir(dir)
        .with_context(shown)?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !names.contains(&n.as_str()))
        .collect();
    if !others.is_empty() && !force {
        others.sort();
        let more = others.len().saturating_sub(3);
        others.truncate(3);
        bail!(
            "{}: the directory holds other files ({}{}); not mixing this command's files into it{again}",
            shown(),
            others.join(", "),
            if more > 0 { format!(" and {more} more") } else { String::new() }
        );
    }
    Ok(())
}

/// Writes `outputs` into `dir` (created if needed); errors name `flag DIR`.
pub fn write_outputs<O: Protocol>(
    dir: &Path,
    outputs: &O::Outputs,
    flag: &str,
) -> anyhow::Result<()> {
    let flag = || format!("{flag} {}", dir.display());
    std::fs::create_dir_all(dir).with_context(flag)?;
    protocol::write_outputs::<O>(dir, outputs).with_context(flag)
}

/// The report of `run`.
pub fn report<O: Reported>(run: &Run<O>) -> RunReport<O> {
    let (implementation, verdict) = match &run.checked {
        Some((i, v)) => (Some(i), Some(&v.verdict)),
        None => (None, None),
    };
    RunReport::new(&RunInfo {
        implementation,
        case: &run.generated.case,
        ask: run.generated.ask,
        expected: &run.expected,
        precision: &run.precision(),
        verdict,
        draws: run.generated.draws,
        reference_seconds: run.reference_seconds,
    })
}

/// The outputs of a case directory checked against the reference of its case.
pub struct DirCheck<O: Op> {
    pub case: O::Case,
    pub ask: O::Ask,
    pub expected: O::Expected,
    /// The precision `declaration` declares for the case.
    pub precision: O::Precision,
    pub verdict: Verdict<O::Report>,
    pub reference_seconds: f64,
}

/// The outputs in `dir` against the reference of the case in `dir` (checked in mode
/// `check`), for an implementation that declared `declaration`. A directory that cannot be
/// read, or an invalid case, is an error (exit 2); outputs that cannot be read as the case's
/// are a failed run (exit 1).
pub fn verify_dir<O: Protocol>(
    dir: &Path,
    declaration: &O::Declaration,
    check: O::Check,
) -> anyhow::Result<DirCheck<O>> {
    let (case, ask) = protocol::read_case::<O>(dir)?;
    let got = protocol::read_outputs::<O>(dir, &case, ask);
    let precision = O::declared_precision(&case, declaration);
    let start = Instant::now();
    let expected = O::expected(&case, ask, check).with_context(|| dir.display().to_string())?;
    let reference_seconds = start.elapsed().as_secs_f64();
    let verdict = match got {
        // Outputs missing, of the wrong shape or dtype, or out of range are the
        // implementation's failure (exit 1), as they are under `exec:` and `worker:`.
        Err(e) => Verdict::RunFailed(RunError::new(e.to_string())),
        Ok(got) => match O::compare(&case, ask, &precision, &expected, &got) {
            Ok(report) => Verdict::of(report),
            Err(e) => bail!("{}: {e}", dir.display()),
        },
    };
    Ok(DirCheck {
        case,
        ask,
        expected,
        precision,
        verdict,
        reference_seconds,
    })
}

/// `moecheck check DIR`: the report of [`verify_dir`].
pub fn check_dir<O: Protocol + Reported>(
    dir: &Path,
    declaration: &O::Declaration,
    check: O::Check,
) -> anyhow::Result<RunReport<O>> {
    let c = verify_dir::<O>(dir, declaration, check)?;
    let implemented = Implemented {
        name: format!("outputs in {}", dir.display()),
        is_model: false,
    };
    Ok(RunReport::new(&RunInfo {
        implementation: Some(&implemented),
        case: &c.case,
        ask: c.ask,
        expected: &c.expected,
        precision: &c.precision,
        verdict: Some(&c.verdict),
        draws: 0,
        reference_seconds: c.reference_seconds,
    }))
}
