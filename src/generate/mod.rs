//! Case generation for the commands: each operation's spec (the command's flags) turned into
//! a case ([`crate::pipeline::Generate`]). Every generated value is exactly representable in
//! the case's input format and derives from the seed alone.

mod fill;
pub mod fp8;
pub mod gemm;
pub mod moe;
pub mod route;

/// A generator parameter that does not fit (the command names it as the flag `--param`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{param}: {reason}")]
pub struct ParamError {
    /// The parameter's name (`experts`, `drop-frac`), which is also its flag's.
    pub param: &'static str,
    pub reason: String,
}

impl ParamError {
    pub fn new(param: &'static str, reason: impl Into<String>) -> ParamError {
        ParamError {
            param,
            reason: reason.into(),
        }
    }

    /// The reason with the parameter spelt as its command-line flag.
    pub fn as_flag(&self) -> String {
        format!("--{}: {}", self.param, self.reason)
    }
}
