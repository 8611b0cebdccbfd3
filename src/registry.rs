//! The implementation registry: `--impl`, `--inject`, `--timeout` and the declaration flags
//! (`--acc`, `--compute`, ...) turned into an implementation of any operation, or refused
//! with a one-line reason (exit 2) when the chosen implementation cannot honour a flag.
//!
//! Every operation has `reference` (the f64 reference itself), `exec:CMD` (any program,
//! through the case-directory protocol) and `worker:CMD` (a persistent program, protocol v2);
//! an operation adds its CPU model (`emulate`, with
//! planted bugs), its GPU implementations and the declaration flags it reads through
//! [`Backends`].

use std::time::Duration;

use moecheck_reference::op::{Implementation, Reference};

use crate::backends::parse_bug;
use crate::impls::exec::{Exec, Program};
use crate::impls::worker::Worker;
use crate::impls::OnDisk;

/// Seconds an `exec:` implementation (or a `worker:` on one case) may run when `--timeout` is
/// not given.
pub const DEFAULT_TIMEOUT_S: f64 = 600.0;

/// What an operation adds to the registry, and the declaration flags ([`crate::backends`]).
pub use crate::backends::{declaration, Backends, Declared};

/// The implementation flags of one command line.
#[derive(Debug, Clone, Default)]
pub struct Choice {
    /// `--impl`.
    pub name: String,
    /// `--inject`.
    pub inject: Option<String>,
    /// `--timeout`, in seconds.
    pub timeout: Option<f64>,
    /// The declaration flags.
    pub declared: Declared,
    /// `--inputs compact`: an `exec:`/`worker:` program's bf16 inputs as bit patterns.
    pub compact_inputs: bool,
}

impl Choice {
    /// `--impl name` with every other flag left at its default.
    pub fn named(name: &str) -> Choice {
        Choice {
            name: name.to_string(),
            ..Choice::default()
        }
    }
}

/// What `--impl` names.
enum Kind<'a> {
    Reference,
    Emulate,
    Exec(&'a str),
    Worker(&'a str),
    Gpu,
}

/// The names `--impl` accepts for `O`, as a message lists them.
fn accepted<O: Backends>() -> String {
    let mut names = vec!["reference"];
    if O::emulate(None).is_some() {
        names.push("emulate");
    }
    names.extend(["exec:CMD", "worker:CMD"]);
    names.extend(O::gpu_names());
    let last = names.pop().unwrap_or_default();
    format!("{} or {last}", names.join(", "))
}

/// Builds the implementation `choice` names, or the one-line reason it cannot.
pub fn build<O: Backends>(choice: &Choice) -> Result<Box<dyn Implementation<O>>, String> {
    let (kind, declaration) = checked::<O>(choice)?;
    let name = choice.name.trim();
    match kind {
        Kind::Reference => Ok(Box::new(Reference)),
        Kind::Emulate => {
            let bug = match &choice.inject {
                Some(b) => Some(parse_bug::<O::Bug>(b).map_err(|e| format!("--inject {b}: {e}"))?),
                None => None,
            };
            O::emulate(bug)
                .ok_or_else(|| format!("--impl emulate: there is no CPU model of op {}", O::NAME))
        }
        Kind::Exec(_) | Kind::Worker(_) => {
            Ok(on_disk_of(kind, declaration, choice).expect("a program"))
        }
        Kind::Gpu => O::gpu(name)
            .ok_or_else(|| format!("--impl {name}: moecheck was built without the `cuda` feature")),
    }
}

/// The `exec:` or `worker:` implementation `choice` names, as one that runs on a case
/// directory ([`OnDisk`]); `None` for any other implementation; the one-line reason when
/// [`build`] would refuse the flags.
pub fn on_disk<O: Backends>(choice: &Choice) -> Result<Option<Box<dyn OnDisk<O>>>, String> {
    let (kind, declaration) = checked::<O>(choice)?;
    Ok(on_disk_of(kind, declaration, choice))
}

fn on_disk_of<O: Backends>(
    kind: Kind<'_>,
    declaration: O::Declaration,
    choice: &Choice,
) -> Option<Box<dyn OnDisk<O>>> {
    match kind {
        Kind::Exec(cmd) => Some(Box::new(Exec::<O> {
            program: program(cmd, choice),
            declaration,
        })),
        Kind::Worker(cmd) => Some(Box::new(Worker::<O>::new(
            program(cmd, choice),
            declaration,
        ))),
        _ => None,
    }
}

/// What `choice` names, after every flag is checked against it, and its declaration.
fn checked<O: Backends>(choice: &Choice) -> Result<(Kind<'_>, O::Declaration), String> {
    let name = choice.name.trim();
    let kind = match name {
        "reference" => Kind::Reference,
        "emulate" => Kind::Emulate,
        _ if O::gpu_names().contains(&name) => Kind::Gpu,
        _ => match (name.strip_prefix("exec:"), name.strip_prefix("worker:")) {
            (Some(cmd), _) if !cmd.trim().is_empty() => Kind::Exec(cmd),
            (_, Some(cmd)) if !cmd.trim().is_empty() => Kind::Worker(cmd),
            _ => return Err(format!("--impl {name}: expected {}", accepted::<O>())),
        },
    };
    let external = matches!(kind, Kind::Exec(_) | Kind::Worker(_));
    if external {
        // Each case goes to the program as a temporary directory: a temporary directory that
        // cannot be written is the environment's problem (exit 2), not the program's failure.
        if let Err(e) = tempfile::Builder::new().prefix("moecheck-probe-").tempdir() {
            return Err(format!(
                "--impl {name}: cannot create a case directory in {} ({e}); set TMPDIR to a writable directory",
                std::env::temp_dir().display()
            ));
        }
    }
    if choice.compact_inputs && !external {
        return Err(format!(
            "--inputs compact: only an exec: or worker: program reads a case directory (got --impl {name})"
        ));
    }
    if let Some(bug) = &choice.inject {
        if !matches!(kind, Kind::Emulate) {
            return Err(format!(
                "--inject {bug} needs --impl emulate (got --impl {name})"
            ));
        }
    }
    if let Some(t) = choice.timeout {
        if !(t > 0.0 && t <= MAX_TIMEOUT_S) {
            return Err(format!(
                "--timeout {t} must be a positive number of seconds, at most {MAX_TIMEOUT_S:e} (about 31 years)"
            ));
        }
        if !external {
            return Err(format!(
                "--timeout: --impl {name} runs inside moecheck; --timeout applies to exec: and worker: implementations"
            ));
        }
    }
    let declaration = declaration::<O>(&choice.declared)?;
    if let (Some(flag), false) = (choice.declared.given().first(), external) {
        return Err(format!(
            "{flag}: --impl {name} declares its own {}; {flag} declares the {} of an exec: or worker: implementation",
            O::DECLARES,
            O::DECLARES
        ));
    }
    Ok((kind, declaration))
}

/// The worker `choice` names (`worker:CMD`), not started, declaring what its flags declare;
/// `None` for any other implementation. A campaign starts it at once to read the contract in
/// its greeting ([`Worker::contract`]), after [`build`] has checked the flags.
pub fn worker<O: Backends>(choice: &Choice) -> Option<Worker<O>> {
    let cmd = choice.name.trim().strip_prefix("worker:")?;
    let declaration = declaration::<O>(&choice.declared).ok()?;
    (!cmd.trim().is_empty()).then(|| Worker::new(program(cmd, choice), declaration))
}

/// The longest `--timeout` (seconds): far beyond any run, and far inside what a `Duration`
/// and a deadline from now can hold (a larger one panicked converting it).
pub const MAX_TIMEOUT_S: f64 = 1e9;

/// The program `--impl exec:CMD` or `worker:CMD` names, with `--timeout`.
fn program(cmd: &str, choice: &Choice) -> Program {
    Program {
        command: cmd.to_string(),
        timeout: Duration::from_secs_f64(choice.timeout.unwrap_or(DEFAULT_TIMEOUT_S)),
        kept: Default::default(),
        compact: choice.compact_inputs,
    }
}

#[cfg(test)]
mod tests {
    use moecheck_reference::format::Format;
    use moecheck_reference::gemm::{Accumulator, Gemm};
    use moecheck_reference::moe::MoeLayer;

    use super::*;

    fn refused<O: Backends>(choice: Choice) -> String {
        match build::<O>(&choice) {
            Ok(imp) => panic!("{} was built from {choice:?}", imp.name()),
            Err(e) => e,
        }
    }

    #[test]
    fn built_in_implementations_refuse_declarations_and_timeouts() {
        for name in ["reference", "emulate", "cuda", "cublas"] {
            let acc = Declared {
                acc: Some(Format::Bf16),
                ..Declared::default()
            };
            let e = refused::<Gemm>(Choice {
                declared: acc,
                ..Choice::named(name)
            });
            assert!(
                e.contains("--acc") && e.contains("declares its own accumulator"),
                "{e}"
            );
            let e = refused::<Gemm>(Choice {
                timeout: Some(5.0),
                ..Choice::named(name)
            });
            assert!(
                e.contains("--timeout") && e.contains("runs inside moecheck"),
                "{e}"
            );
        }
    }

    #[test]
    fn exec_and_worker_take_the_declaration() {
        let declared = Declared {
            acc: Some(Format::Bf16),
            acc_block: Some(32),
            ..Declared::default()
        };
        for name in ["exec:true", "worker:true"] {
            let imp = build::<Gemm>(&Choice {
                declared,
                timeout: Some(1.0),
                ..Choice::named(name)
            })
            .expect("exec and worker take --acc, --acc-block and --timeout");
            assert_eq!(imp.name(), name);
            let case = moecheck_reference::gemm::GroupedGemmCase {
                lhs: ndarray::Array2::zeros((2, 3)),
                rhs: ndarray::Array3::zeros((1, 3, 2)).into(),
                group_sizes: vec![2],
                dout: None,
                dtype: Format::Bf16,
                out_dtype: Format::F32,
                tail: Default::default(),
            };
            let p = imp.precision(&case);
            assert_eq!(
                p.accumulator,
                Accumulator {
                    format: Format::Bf16,
                    block: Some(32)
                }
            );
        }
    }

    #[test]
    fn a_flag_the_operation_does_not_read_is_refused_for_every_implementation() {
        for name in ["exec:true", "reference", "emulate"] {
            let e = refused::<Gemm>(Choice {
                declared: Declared {
                    compute: Some(Format::F64),
                    ..Declared::default()
                },
                ..Choice::named(name)
            });
            assert!(e.contains("--compute does not apply to op gemm"), "{e}");
        }
        let e = refused::<MoeLayer>(Choice {
            declared: Declared {
                acc: Some(Format::F32),
                ..Declared::default()
            },
            ..Choice::named("exec:true")
        });
        assert!(e.contains("--acc does not apply to op moe"), "{e}");
    }

    #[test]
    fn an_unknown_name_is_refused_before_any_flag_is_blamed_on_it() {
        let e = refused::<Gemm>(Choice {
            declared: Declared {
                acc: Some(Format::Bf16),
                ..Declared::default()
            },
            ..Choice::named("emulat")
        });
        assert!(
            e.starts_with("--impl emulat: expected reference, emulate"),
            "{e}"
        );
        assert!(refused::<Gemm>(Choice::named("exec:")).contains("--impl exec:"));
        let e = refused::<Gemm>(Choice::named("worker: "));
        assert!(e.contains("exec:CMD, worker:CMD"), "{e}");
        let e = refused::<Gemm>(Choice {
            inject: Some("tail-rows-uninitialised".into()),
            ..Choice::named("reference")
        });
        assert!(
            e.contains("--inject") && e.contains("needs --impl emulate"),
            "{e}"
        );
        let e = refused::<Gemm>(Choice {
            inject: Some("no-such-bug".into()),
            ..Choice::named("emulate")
        });
        assert!(e.contains("unknown bug 'no-such-bug'"), "{e}");
    }
}
