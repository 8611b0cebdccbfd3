//! How a generated grouped-GEMM check runs (`moecheck gemm`): which operation checks it (the
//! grouped GEMM or the FP8 grouped GEMM) in which mode (full or fast verification), whether it runs
//! whole or in shards of experts and in how many, and the memory guard. The command's flags
//! become a [`GemmCheck`]; every decision is made here, on the pipeline's side.

use std::path::PathBuf;
use std::process::ExitCode;

use moecheck_reference::format::Format;
use moecheck_reference::fp8::{Fp8Gemm, Fp8Recipe};
use moecheck_reference::gemm::shard::{self, Sharded};
use moecheck_reference::gemm::{Gemm, Verify};
use moecheck_reference::op::{Implementation, Op};
use moecheck_reference::report::Reported;

use crate::backends::Backends;
use crate::generate::fp8::Fp8Spec;
use crate::generate::gemm::{sizes_of, GemmSpec};
use crate::impls::OnDisk;
use crate::registry::{self, Choice};
use crate::{memory, pipeline, pipeline_external, pipeline_sharded, report};

/// A generated grouped-GEMM check, as `moecheck gemm`'s flags ask for it.
#[derive(Debug, Clone)]
pub struct GemmCheck {
    /// The case (for FP8, its float32 inputs: `dtype` f32).
    pub spec: GemmSpec,
    /// `--dtype` as given: `e4m3`/`e5m2` for an FP8 check.
    pub dtype: Format,
    /// The FP8 recipe of an FP8 check.
    pub fp8: Option<Fp8Recipe>,
    /// `--verify` (default: by the case's work, [`Verify::default_for`]).
    pub verify: Option<Verify>,
    /// `--shards` (default: chosen to fit, [`GemmCheck::shards`]).
    pub shards: Option<u64>,
    /// `--allow-large`.
    pub allow_large: bool,
    /// `--impl-memory`: an `exec:`/`worker:` program's peak, when the user knows it.
    pub impl_memory: Option<u64>,
    /// `--dump DIR`.
    pub dump: Option<PathBuf>,
    /// `--json`.
    pub json: bool,
    /// The implementation flags.
    pub choice: Choice,
}

/// Runs `c` and reports it: the exit status.
pub fn run(c: &GemmCheck) -> anyhow::Result<ExitCode> {
    c.spec
        .validate()
        .map_err(|e| anyhow::anyhow!(e.as_flag()))?;
    let Some(recipe) = c.fp8 else {
        let verify = c
            .verify
            .unwrap_or_else(|| Verify::default_for(c.spec.work()));
        let estimate = Estimate::Gemm(verify);
        // A program on a case directory may have its outputs checked in shards from disk.
        let on_disk = registry::on_disk::<Gemm>(&c.choice).map_err(anyhow::Error::msg)?;
        return check::<Gemm, _>(c, &c.spec, &c.spec, verify, estimate, None, on_disk);
    };
    if matches!(c.spec.out_dtype, Format::E4m3 | Format::E5m2) {
        anyhow::bail!(
            "--out-dtype {}: FP8 GEMM outputs are f32 or bf16",
            c.spec.out_dtype
        );
    }
    let spec = Fp8Spec {
        gemm: c.spec.clone(),
        recipe,
    };
    let verify = match (c.verify, spec.recipe.fast_applies()) {
        (Some(Verify::Fast), Some(why)) => anyhow::bail!("--verify fast: {why}"),
        (Some(v), _) => v,
        (None, Some(_)) => Verify::Full,
        (None, None) => Verify::default_for(spec.gemm.work()),
    };
    let whole = spec.recipe.shard_local();
    // Whether the inputs are held whole is the generator's to say (`check`).
    let fp8 = Estimate::Fp8 { whole_inputs: true };
    check::<Fp8Gemm, _>(c, &spec, &spec.gemm, verify, fp8, whole, None)
}

/// The check of `spec` (whose grouped GEMM is `gemm`) as op `O` ([`Gemm`] or [`Fp8Gemm`]) in
/// mode `verify`, whole or in shards of experts ([`GemmCheck::shards`]; `case_whole` says why
/// the case cannot be sharded). `on_disk`: the `exec:`/`worker:` program of a plain grouped
/// GEMM, which runs on the whole case written and read back a shard at a time when the case is
/// checked in shards ([`pipeline_external`]).
fn check<O, S>(
    c: &GemmCheck,
    spec: &S,
    gemm: &GemmSpec,
    verify: Verify,
    estimate: Estimate,
    case_whole: Option<String>,
    on_disk: Option<Box<dyn OnDisk<Gemm>>>,
) -> anyhow::Result<ExitCode>
where
    O: Backends + Reported + Sharded,
    S: pipeline::Generate<O>,
{
    let imp = registry::build::<O>(&c.choice).map_err(anyhow::Error::msg)?;
    // An FP8 implementation that is not run in shards (a kernel under test) runs on the whole
    // case; its outputs may still be checked in shards. Shards the generator cannot make on
    // their own are cut from the whole case's inputs, held throughout.
    let estimate = match estimate {
        Estimate::Fp8 { .. } if !imp.shardable() => Estimate::Fp8RunWhole,
        Estimate::Fp8 { .. } => Estimate::Fp8 {
            whole_inputs: spec.shards().is_none(),
        },
        other => other,
    };
    let (parts, own) = c.shards(gemm, estimate, imp.as_ref(), case_whole, on_disk.is_some())?;
    if let (Some(program), true) = (&on_disk, parts > 1) {
        eprintln!(
            "moecheck: writing the case a shard of experts at a time, running {} on the whole case, then checking its outputs in {parts} shards read from its files (the report is the whole case's)",
            program.name()
        );
        let mut run = pipeline_external::run(gemm, program.as_ref(), parts, verify, own)?;
        let code = report::finish(&pipeline::report(&run), c.json)?;
        return run.written().map(|()| code);
    }
    let mut run = if parts > 1 && matches!(estimate, Estimate::Fp8RunWhole) {
        eprintln!(
            "moecheck: running {} on the whole FP8 case, then checking its outputs in {parts} shards of consecutive experts, one shard's references held at a time (the report is the whole case's)",
            imp.name()
        );
        pipeline_sharded::run_whole_checked_in_shards(spec, imp.as_ref(), parts, verify)?
    } else if parts > 1 {
        let what = match estimate {
            Estimate::Gemm(_) => "case",
            Estimate::Fp8 { .. } | Estimate::Fp8RunWhole => "FP8 case",
        };
        eprintln!(
            "moecheck: checking the {what} in {parts} shards of consecutive experts, one shard's outputs held at a time ({} computes each expert on its own; the report is the whole case's)",
            imp.name()
        );
        pipeline_sharded::run_sharded(spec, imp.as_ref(), parts, verify)?
    } else {
        pipeline::run(spec, Some(imp.as_ref()), c.dump.as_deref(), verify)?
    };
    let code = report::finish(&pipeline::report(&run), c.json)?;
    run.written().map(|()| code)
}

impl GemmCheck {
    fn size(&self) -> memory::GemmSize {
        memory::GemmSize {
            m: self.spec.tokens.saturating_mul(self.spec.topk),
            k: self.spec.hidden,
            n: self.spec.ffn,
            groups: self.spec.experts,
        }
    }

    /// The formats the estimate counts: an `exec:`/`worker:` program may write float64
    /// outputs whatever the case asks (they are read as written), so its are counted so.
    fn formats(&self) -> memory::Formats {
        memory::Formats {
            dtype: self.dtype,
            out_dtype: match self.external() {
                true => Format::F64,
                false => self.spec.out_dtype,
            },
        }
    }

    /// Whether `--impl` names a program outside moecheck (`exec:`, `worker:`).
    fn external(&self) -> bool {
        let name = self.choice.name.trim();
        name.starts_with("exec:") || name.starts_with("worker:")
    }

    /// The estimated peak of the check ([`memory`]) in `parts` shards planned from the case's
    /// group sizes `sizes` as [`shard::plan`] will plan them (`None`: the whole case, unplanned).
    fn need(&self, check: Estimate, sizes: Option<&[usize]>, parts: usize) -> u64 {
        let size = self.size();
        let plan = match sizes {
            Some(sizes) => shard::plan_sizes(sizes, size.m, size.k, size.n, parts),
            None => Vec::new(),
        };
        match check {
            Estimate::Gemm(verify) => {
                memory::gemm_bytes_sharded(size, self.spec.passes, verify, self.formats(), &plan)
            }
            Estimate::Fp8 { whole_inputs } => {
                memory::fp8_gemm_bytes_sharded(size, &plan, whole_inputs)
            }
            Estimate::Fp8RunWhole => memory::fp8_kernel_bytes_sharded(size, &plan),
        }
    }

    /// How many shards of consecutive experts the case is checked in (`--shards`, or chosen
    /// so that it fits in memory, [`memory::shards_for`]), after the memory guard. `imp` is
    /// checked whole unless it is shardable ([`Implementation::shardable`]), a kernel under
    /// test of the FP8 GEMM, which runs whole and is checked in shards
    /// ([`Estimate::Fp8RunWhole`]), or a program on a case directory (`on_disk`), which runs
    /// whole and is checked in shards read from its files ([`pipeline_external`]); a dumped
    /// case is checked whole. With the shards, moecheck's own estimated peak (the guard adds
    /// an external program's).
    fn shards<O: Op>(
        &self,
        spec: &GemmSpec,
        check: Estimate,
        imp: &dyn Implementation<O>,
        case_whole: Option<String>,
        on_disk: bool,
    ) -> anyhow::Result<(usize, u64)> {
        let whole = if let Some(why) = case_whole {
            Some(why)
        } else if !imp.shardable() && !matches!(check, Estimate::Fp8RunWhole) && !on_disk {
            Some(format!(
                "--impl {} is checked whole, at the size it is given (only the in-process models that compute each expert on its own are checked a shard of experts at a time: reference, and emulate without group-offset-after-empty, which reads across experts; an exec: or worker: program's outputs, and with --dtype fp8 any implementation's, may be checked in shards)",
                imp.name()
            ))
        } else if self.dump.is_some() {
            Some("--dump writes every output of the case, so the case is checked whole".into())
        } else {
            None
        };
        let asked = self
            .shards
            .map(|p| usize::try_from(p).unwrap_or(usize::MAX));
        match (asked, &whole) {
            (Some(p), Some(why)) if p > 1 => anyhow::bail!("--shards {p}: {why}"),
            (Some(p), _) if p > self.spec.experts.max(1) => anyhow::bail!(
                "--shards {p}: more shards than experts (--experts {})",
                self.spec.experts
            ),
            _ => {}
        }
        let available = memory::available();
        // A program outside moecheck runs the whole case beside it: its memory is counted
        // with moecheck's in every estimate the guard sees (`program`), and the case is
        // written to a case directory in $TMPDIR first.
        let external = self.external();
        let program = match (external, self.impl_memory) {
            (true, _) => self.program_bytes(check),
            (false, Some(_)) => anyhow::bail!(
                "--impl-memory: --impl {} runs inside moecheck; --impl-memory is the peak of an exec: or worker: program",
                imp.name()
            ),
            (false, None) => 0,
        };
        let total = |own: u64| own.saturating_add(program);
        // Checked whole, decided without planning (which draws every expert's size): when
        // asked, when it must be, when the whole case is small enough to be one shard
        // (memory::GEMM_SHARD_BYTES) and fits, or when no number of shards could make it fit
        // (the guard refuses it whole).
        let own_whole = self.need(check, None, 1);
        let held = match check {
            Estimate::Gemm(_) => self.dtype,
            Estimate::Fp8 { .. } | Estimate::Fp8RunWhole => memory::FP8_INPUTS,
        };
        // An FP8 case is checked in small shards whenever it may be (memory::FP8_SHARD_BYTES).
        let small = matches!(check, Estimate::Fp8 { .. } | Estimate::Fp8RunWhole);
        let at_once = match asked {
            Some(p) => p == 1,
            None => {
                whole.is_some()
                    || (!small
                        && memory::whole_by_default(own_whole, available)
                        && memory::fits(total(own_whole), available))
                    || memory::inputs_too_large(self.size(), held, available)
            }
        };
        if at_once {
            self.guard(total(own_whole), external)?;
            self.guard_disk(check, external)?;
            return Ok((1, own_whole));
        }
        // The group sizes are the seed's first draws: the shards are planned on them.
        let sizes = sizes_of(spec);
        let need = |p| total(self.need(check, Some(&sizes), p));
        // More shards make no room for a program that alone does not fit.
        let program_fits = memory::fits(program, available);
        let parts = asked.unwrap_or_else(|| match check {
            Estimate::Fp8 { .. } | Estimate::Fp8RunWhole => {
                let size = self.size();
                let largest = |p| {
                    let plan = shard::plan_sizes(&sizes, size.m, size.k, size.n, p);
                    let bytes = |s: &shard::Shard| {
                        memory::fp8_gemm_bytes(s.rows.len(), size.k, size.n, s.experts.len())
                    };
                    plan.iter().map(bytes).max().unwrap_or(0)
                };
                let small = memory::fewest_shards(self.spec.experts, |p| {
                    largest(p) <= memory::FP8_SHARD_BYTES
                })
                .unwrap_or(self.spec.experts.max(1));
                // No fewer experts per shard than keep every core busy, when that fits.
                let busy = self
                    .spec
                    .experts
                    .div_ceil(memory::FP8_EXPERTS_PER_CORE * memory::cores())
                    .max(1);
                let p = small.min(busy);
                if memory::fits(need(p), available) || !program_fits {
                    p
                } else {
                    memory::shards_for(available, self.spec.experts, need)
                }
            }
            // Shards of at most memory::GEMM_SHARD_BYTES of moecheck's own, or of what the
            // largest expert holds alone when that is more (a hot expert), or as few as fit.
            Estimate::Gemm(_) => {
                let own = |p| self.need(check, Some(&sizes), p);
                let budget = memory::GEMM_SHARD_BYTES.max(own(self.spec.experts.max(1)));
                let small = memory::fewest_shards(self.spec.experts, |p| own(p) <= budget)
                    .unwrap_or(self.spec.experts.max(1));
                if memory::fits(need(small), available) || !program_fits {
                    small
                } else {
                    memory::shards_for(available, self.spec.experts, need)
                }
            }
        });
        // The refusal names the shards, which a user may change.
        self.guard(need(parts), external)
            .map_err(|e| match program_fits {
                true => anyhow::anyhow!("{e} (checked in {parts} shards of experts, --shards)"),
                false => e,
            })?;
        self.guard_disk(check, external)?;
        Ok((parts, self.need(check, Some(&sizes), parts)))
    }

    /// How a program's case directory stores the inputs: for an FP8 case (with its quantised
    /// copies), and compact (a bf16 case's inputs at 2 bytes, `--inputs compact`; a worker that
    /// asks in its greeting is known only once started, after the guards).
    fn case_files(&self, check: Estimate) -> (bool, bool) {
        let fp8 = matches!(check, Estimate::Fp8 { .. } | Estimate::Fp8RunWhole);
        let compact = self.choice.compact_inputs && !fp8 && self.spec.dtype == Format::Bf16;
        (fp8, compact)
    }

    /// After the memory guard: the case directory an `exec:` or `worker:` program gets must
    /// fit in $TMPDIR ([`crate::disk`]).
    fn guard_disk(&self, check: Estimate, external: bool) -> anyhow::Result<()> {
        if !external {
            return Ok(());
        }
        let (fp8, compact) = self.case_files(check);
        let mut disk = crate::disk::gemm_case_bytes(self.size(), self.spec.passes, fp8, compact);
        if self.fp8.is_some_and(|r| r.has_block_scope()) {
            disk = disk.saturating_add(crate::disk::block_copies_bytes(self.size()));
        }
        crate::disk::guard_tmp(disk, self.allow_large).map_err(anyhow::Error::msg)
    }

    /// What an `exec:` or `worker:` program is counted to hold beside moecheck: `--impl-memory`
    /// (with, for FP8, moecheck's float32 copy of the inputs it writes), or every input and
    /// output of the case whole ([`memory::external_bytes`], which counts that copy too).
    fn program_bytes(&self, check: Estimate) -> u64 {
        let (fp8, compact) = self.case_files(check);
        if let Some(bytes) = self.impl_memory {
            // An FP8 case's inputs are written from moecheck's own float32 copy, made whole.
            let copy = match fp8 {
                true => memory::io_elements(self.size(), self.spec.passes)
                    .0
                    .saturating_mul(4),
                false => 0,
            };
            return bytes.saturating_add(copy);
        }
        memory::external_bytes(self.size(), self.spec.passes, fp8, compact)
    }

    /// Refuses `need` bytes when more than the memory available ([`memory`]), unless
    /// `--allow-large`.
    /// An `external` program is counted as [`GemmCheck::program_bytes`] says, and the refusal
    /// says so.
    fn guard(&self, need: u64, external: bool) -> anyhow::Result<()> {
        memory::guard(
            "--experts/--tokens/--topk/--hidden/--ffn",
            need,
            memory::available(),
            self.allow_large,
        )
        .map_err(|e| match (external, self.impl_memory) {
            (true, None) => anyhow::anyhow!(
                "{e}; the exec:/worker: program is counted as holding every input and output whole: --impl-memory SIZE gives its peak when you know it"
            ),
            (true, Some(b)) => anyhow::anyhow!("{e}; the program counted at --impl-memory {}", memory::gib(b)),
            (false, _) => anyhow::anyhow!(e),
        })
    }
}

/// Which memory model sizes a check ([`memory`]).
#[derive(Debug, Clone, Copy)]
enum Estimate {
    /// The grouped GEMM under a verification mode.
    Gemm(Verify),
    /// The FP8 grouped GEMM, its shards made on their own or (`whole_inputs`) cut from the
    /// whole case's inputs.
    Fp8 { whole_inputs: bool },
    /// The FP8 grouped GEMM of an implementation that is not run in shards (a kernel under
    /// test, or a model whose planted bug reads across experts): it runs on the whole case,
    /// whose outputs are held whole while they are checked a shard at a time.
    Fp8RunWhole,
}
