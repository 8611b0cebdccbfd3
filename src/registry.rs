//! The implementation registry: `--impl`, `--inject`, `--timeout` and the declaration flags
//! (`--acc`, `--compute`, ...) turned into an implementation of any operation, or refused
//! with a one-line reason (exit 2) when the chosen implementation cannot honour a flag.
//!
//! Every operation has `reference` (the f64 reference itself) and `exec:CMD` (any program,
//! through the case-directory protocol); an operation adds its CPU model (`emulate`, with
//! planted bugs) and its GPU implementations through [`Backends`].

use std::time::Duration;

use moecheck_reference::op::{Implementation, Op, Reference};
use moecheck_reference::protocol::Protocol;

use crate::impls::exec::{Exec, Program};
use crate::impls::{parse_bug, PlantedBug};

/// Seconds an `exec:` implementation may run when `--timeout` is not given.
pub const DEFAULT_TIMEOUT_S: f64 = 600.0;

/// What an operation adds to the registry beyond `reference` and `exec:`.
pub trait Backends: Protocol {
    /// The bugs its CPU model can plant ([`crate::impls::NoBug`] without a model).
    type Bug: PlantedBug;

    /// What the declaration flags declare about an external implementation, for messages
    /// (`accumulator`, `compute format`).
    const DECLARES: &'static str;

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

/// The implementation flags of one command line.
#[derive(Debug, Clone)]
pub struct Choice<O: Op> {
    /// `--impl`.
    pub name: String,
    /// `--inject`.
    pub inject: Option<String>,
    /// `--timeout`, in seconds.
    pub timeout: Option<f64>,
    /// What the declaration flags declared, with the flags that were given (empty when none
    /// was: the default declaration applies).
    pub declaration: O::Declaration,
    pub declared_by: Vec<&'static str>,
}

impl<O: Op> Choice<O> {
    /// `--impl name` with every other flag left at its default.
    pub fn named(name: &str) -> Choice<O> {
        Choice {
            name: name.to_string(),
            inject: None,
            timeout: None,
            declaration: O::Declaration::default(),
            declared_by: Vec::new(),
        }
    }
}

/// The names `--impl` accepts for `O`, as a message lists them.
fn accepted<O: Backends>() -> String {
    let mut names = vec!["reference", "emulate", "exec:CMD"];
    names.extend(O::gpu_names());
    let last = names.pop().unwrap_or_default();
    format!("{} or {last}", names.join(", "))
}

/// Builds the implementation `choice` names, or the one-line reason it cannot.
pub fn build<O: Backends>(choice: &Choice<O>) -> Result<Box<dyn Implementation<O>>, String> {
    let name = choice.name.trim();
    let exec = name.strip_prefix("exec:");
    if let Some(bug) = &choice.inject {
        if name != "emulate" {
            return Err(format!(
                "--inject {bug} needs --impl emulate (got --impl {name})"
            ));
        }
    }
    if let Some(t) = choice.timeout {
        if !(t > 0.0 && t.is_finite()) {
            return Err(format!(
                "--timeout {t} must be a positive number of seconds"
            ));
        }
        if exec.is_none() {
            return Err(format!(
                "--timeout: --impl {name} runs inside moecheck; --timeout applies to exec: implementations"
            ));
        }
    }
    if let (Some(flag), None) = (choice.declared_by.first(), exec) {
        return Err(format!(
            "{flag}: --impl {name} declares its own {}; {flag} declares the {} of an exec: implementation",
            O::DECLARES,
            O::DECLARES
        ));
    }
    match (name, exec) {
        ("reference", _) => Ok(Box::new(Reference)),
        ("emulate", _) => {
            let bug = match &choice.inject {
                Some(b) => Some(parse_bug::<O::Bug>(b).map_err(|e| format!("--inject {b}: {e}"))?),
                None => None,
            };
            O::emulate(bug)
                .ok_or_else(|| format!("--impl emulate: there is no CPU model of op {}", O::NAME))
        }
        (_, Some(cmd)) if !cmd.trim().is_empty() => Ok(Box::new(Exec::<O> {
            program: Program {
                command: cmd.to_string(),
                timeout: Duration::from_secs_f64(choice.timeout.unwrap_or(DEFAULT_TIMEOUT_S)),
            },
            declaration: choice.declaration.clone(),
        })),
        _ if O::gpu_names().contains(&name) => O::gpu(name)
            .ok_or_else(|| format!("--impl {name}: moecheck was built without the `cuda` feature")),
        _ => Err(format!("--impl {name}: expected {}", accepted::<O>())),
    }
}
