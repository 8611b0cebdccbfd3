//! Loss-curve parity: read training logs of many frameworks into one [`Curve`], then decide
//! whether two runs agree ([`diff`], whose verdict is [`decide`]d), print the result
//! ([`render`]) and draw it ([`plot`]). Dependencies point one way: `diff` uses `decide`, both
//! fill the plain data of `report`, and `render` and `plot` only read it.
//!
//! Every reader returns, per metric it found, the samples `(step, value, line, quantum)` in file
//! order, where `quantum` is the logging resolution of that printed value (`0.001` for MaxText's
//! `loss: 12.269`, `1e-5` for Megatron's `lm loss: 1.034443E+01`, the f32 spacing for values
//! stored as binary or JSON floats). A comparison's *logging precision* is the upper median,
//! over the compared steps, of each pair's coarser quantum (one value printed coarser does not
//! set it); the criterion never asks for agreement finer than twice that.
//!
//! Readers refuse malformed input with [`CurveError::Malformed`], naming the file and the
//! 1-based line (or, for binary TensorBoard files, the byte offset of the bad record); what they
//! skip instead of refusing (a TensorBoard file cut inside its last record) comes back in
//! [`Curve::warnings`]. Steps are whole numbers up to [`MAX_STEP`] (2^53) everywhere.

mod curve;
pub mod decide;
pub mod diff;
mod gap;
mod hf;
mod maxtext;
mod megatron;
mod megatron_bridge;
mod nanogpt;
mod parse;
mod pattern;
mod plain;
pub mod plot;
mod read;
pub mod render;
mod report;
mod seed;
mod series;
pub mod stats;
mod tensorboard;
mod torchtitan;

pub use curve::{Curve, CurveError, LogFormat, Metric, ReadWarning, Sample};
pub use parse::{f32_quantum, parse_printed, strip_ansi, MAX_STEP};
pub use pattern::LinePattern;
pub use read::{detect, read, read_pattern};
pub use tensorboard::crc32c;
