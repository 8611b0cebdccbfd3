//! Routing cases for `moecheck route`: logits read from a `.npy` file, or generated on a
//! grid, with an optional bias file and the routing configuration of the flags.
//!
//! Generated logits are multiples of 1/64 in `[-4, 4)`, drawn from the seed: exact ties
//! happen, near-ties that a reduced-precision implementation could order either way do not.

use std::path::{Path, PathBuf};

use anyhow::anyhow;
use ndarray::{Array1, Array2, Ix1, Ix2};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use moecheck_reference::routing::{Route, RoutePrecision, RoutingCase, RoutingConfig};
use moecheck_reference::Error;

use super::ParamError;
use crate::npy;
use crate::pipeline::{Generate, Generated};

/// Where the logits come from.
#[derive(Debug, Clone, PartialEq)]
pub enum Logits {
    /// A float32 or float64 `.npy` file of shape `(T, E)`.
    File(PathBuf),
    /// Grid logits of `tokens × experts` from `seed`.
    Generated {
        tokens: usize,
        experts: usize,
        seed: u64,
    },
}

/// Where the selection bias comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum Bias {
    /// A float32 or float64 `.npy` file of shape `(E,)`.
    File(PathBuf),
    /// One value per expert on a grid ([`grid_bias`]) from the logits' seed.
    Generated,
}

/// Everything that defines a routing case.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteSpec {
    pub logits: Logits,
    pub bias: Option<Bias>,
    pub config: RoutingConfig,
}

/// A selection bias for `experts` experts from `seed`: multiples of 1/8 in `[-1, 1]`, exact
/// in every format. It is added to the scores, not the logits: with `topk-softmax` (scores
/// are the logits) the sums stay exact; with softmax or sigmoid scores two selection scores
/// may come within rounding of each other, which the comparison reports as a near-tie.
pub fn grid_bias(experts: usize, seed: u64) -> Array1<f64> {
    // Its own stream: the logits of the same seed are not shifted by drawing it.
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x6269_6173);
    Array1::from_shape_simple_fn(experts, || rng.random_range(-8i32..=8) as f64 / 8.0)
}

/// The grid logits of `tokens × experts` from `seed`.
pub fn grid_logits(tokens: usize, experts: usize, seed: u64) -> Array2<f64> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    Array2::from_shape_simple_fn((tokens, experts), || {
        rng.random_range(-256i32..256) as f64 / 64.0
    })
}

/// A float array of `shape` from `path`; the error names the file.
fn read(path: &Path, shape: &[usize]) -> anyhow::Result<ndarray::ArrayD<f64>> {
    npy::read_float(path, shape)
        .map(|(a, _)| a)
        .map_err(|r| anyhow!("{}: {r}", path.display()))
}

/// The logits `(T, E)` in `path` (`T` and `E` from the file).
fn read_logits(path: &Path) -> anyhow::Result<Array2<f64>> {
    let shape = npy::header_shape(path).map_err(|r| anyhow!("{}: {r}", path.display()))?;
    if shape.len() != 2 {
        anyhow::bail!(
            "{}: has shape {shape:?}, expected 2 dimensions (tokens, experts)",
            path.display()
        );
    }
    Ok(read(path, &shape)?.into_dimensionality::<Ix2>()?)
}

/// A routing parameter the reference refused, as the flag that set it
/// (`topk_groups` → `--topk-groups`).
pub fn as_flag(e: Error) -> anyhow::Error {
    match e {
        Error::InvalidRouting { what, reason }
            if !matches!(what, "logits" | "bias" | "norm_eps") =>
        {
            anyhow!("--{}: {reason}", what.replace('_', "-"))
        }
        other => anyhow::Error::new(other),
    }
}

impl RouteSpec {
    /// The case: logits and bias read (or generated) and the configuration checked against
    /// them. A bad value in a file names the file; a bad parameter names its flag.
    pub fn case(&self) -> anyhow::Result<RoutingCase> {
        let logits = match &self.logits {
            Logits::File(p) => read_logits(p)?,
            Logits::Generated {
                tokens,
                experts,
                seed,
            } => {
                if *experts == 0 {
                    anyhow::bail!(ParamError::new("experts", "must be at least 1").as_flag());
                }
                grid_logits(*tokens, *experts, *seed)
            }
        };
        let seed = match &self.logits {
            Logits::Generated { seed, .. } => *seed,
            Logits::File(_) => 0,
        };
        let bias: Option<Array1<f64>> = match &self.bias {
            Some(Bias::File(p)) => Some(read(p, &[logits.ncols()])?.into_dimensionality::<Ix1>()?),
            Some(Bias::Generated) => Some(grid_bias(logits.ncols(), seed)),
            None => None,
        };
        let case = RoutingCase {
            logits,
            bias,
            config: self.config,
        };
        case.validate()
            .map_err(|e| match (&e, &self.logits, &self.bias) {
                (
                    Error::InvalidRouting {
                        what: "logits",
                        reason,
                    },
                    Logits::File(p),
                    _,
                )
                | (
                    Error::InvalidRouting {
                        what: "bias",
                        reason,
                    },
                    _,
                    Some(Bias::File(p)),
                ) => {
                    anyhow!("{}: {reason}", p.display())
                }
                _ => as_flag(e),
            })?;
        Ok(case)
    }
}

impl Generate<Route> for RouteSpec {
    fn work(&self) -> u64 {
        match &self.logits {
            Logits::Generated {
                tokens, experts, ..
            } => (*tokens as u64) * (*experts as u64),
            Logits::File(_) => 0,
        }
    }

    fn generate(
        &self,
        _: &dyn Fn(&RoutingCase) -> RoutePrecision,
    ) -> anyhow::Result<Generated<Route>> {
        Ok(Generated::once(self.case()?, ()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use moecheck_reference::routing::ScoreFunction;

    fn spec(topk: usize) -> RouteSpec {
        RouteSpec {
            logits: Logits::Generated {
                tokens: 6,
                experts: 8,
                seed: 3,
            },
            bias: None,
            config: RoutingConfig::new(topk, ScoreFunction::Softmax),
        }
    }

    #[test]
    fn grid_logits_are_multiples_of_1_64_in_range() {
        let l = grid_logits(16, 8, 1);
        assert!(l
            .iter()
            .all(|v| (v * 64.0).fract() == 0.0 && (-4.0..4.0).contains(v)));
        assert_eq!(l, grid_logits(16, 8, 1));
    }

    #[test]
    fn a_bad_parameter_names_its_flag() {
        let e = spec(9).case().unwrap_err().to_string();
        assert!(e.starts_with("--topk: "), "{e}");
        let mut s = spec(2);
        s.logits = Logits::Generated {
            tokens: 6,
            experts: 0,
            seed: 0,
        };
        assert!(s.case().unwrap_err().to_string().starts_with("--experts"));
    }
}
