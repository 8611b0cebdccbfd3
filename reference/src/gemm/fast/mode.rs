//! `--verify full|fast`: which check a grouped GEMM gets, the size above which `fast` is the
//! default, and the one line each mode's report states as its guarantee.

use serde::{Deserialize, Serialize};

use super::sample::{RANDOM, TILES};

/// Independent ±1 vectors per pass: an error the projections can see escapes all of them with
/// probability at most `2^-VECTORS` (see the [module docs](super)).
pub const VECTORS: usize = 8;

/// The promise of the chunked projections: a lone element off by more than `LONE` times the
/// mean per-element bound of its chunk is caught, wherever it lies and whatever the signs
/// (see the [module docs](super), "Chunks of columns").
pub const LONE: usize = 64;

/// Columns per chunk of the chunked projections, derived from [`LONE`]: a lone element is
/// caught once it is off by more than twice its chunk's threshold `τ_c`, and
/// `2·τ_c <= 2·CHUNK·(1 + r)·b̄_c` with `b̄_c` the mean per-element bound of the chunk and `r`
/// the check's own f64 rounding relative to the chunk's summed bounds. `r < 10^-6` for any
/// declared accumulator narrower than f64, and `r <= 1` for an f64 accumulator over 11 terms
/// or more, so `CHUNK = LONE / 4` keeps `2·τ_c <= LONE·b̄_c` with the check's rounding counted.
/// The cost is two products of `cols / CHUNK` columns per pass (values and magnitudes): an
/// eighth of one GEMM of the pass, a sixteenth of the full check's multiply-adds.
pub const CHUNK: usize = LONE / 4;

/// Above this many multiply-adds in one pass (`M·K·N`, [`Verify::default_for`]) `fast` is the
/// default: `2^36 ≈ 6.9e10`, e.g. `M = 16384, K = N = 2048`. The full check computes every
/// pass twice in f64 (values and magnitudes), `6·M·K·N` multiply-adds for three passes:
/// at this size about 4e11, some 10 – 30 s of the reference on the 2-vCPU development machine
/// (README, Performance: about 60 G multiply-adds/s forward, dgrad and wgrad slower), and the
/// whole reference in memory beside the outputs. Below it the full check is the default.
/// DeepSeek-V3's layer (4096 tokens, top-8, K = 7168, N = 2048) is about 7 times above it.
pub const FAST_ABOVE_MACS: u64 = 1 << 36;

/// How a grouped GEMM's outputs are checked: the [`crate::op::Op::Check`] mode of the grouped
/// GEMM and of the FP8 grouped GEMM.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verify {
    /// Every element against its own bound (the full f64 reference, `O(M·K·N)`); the
    /// default where no size decides ([`Verify::default_for`]).
    #[default]
    Full,
    /// Projections, sampled rows and columns, and structural checks on every element
    /// (`O(VECTORS·(M·K + G·K·N))` plus the samples); see the [module docs](super).
    Fast,
}

impl Verify {
    /// `full` or `fast`; the error is one line naming the accepted values.
    pub fn parse(s: &str) -> Result<Verify, String> {
        match s.trim() {
            "full" => Ok(Verify::Full),
            "fast" => Ok(Verify::Fast),
            other => Err(format!("unknown mode '{other}' (expected full or fast)")),
        }
    }

    /// The default for a case whose largest pass is `macs` multiply-adds: `fast` above
    /// [`FAST_ABOVE_MACS`], `full` otherwise.
    ///
    /// ```
    /// use moecheck_reference::gemm::fast::{Verify, FAST_ABOVE_MACS};
    /// assert_eq!(Verify::default_for(FAST_ABOVE_MACS), Verify::Full);
    /// assert_eq!(Verify::default_for(FAST_ABOVE_MACS + 1), Verify::Fast);
    /// ```
    pub fn default_for(macs: u64) -> Verify {
        if macs > FAST_ABOVE_MACS {
            Verify::Fast
        } else {
            Verify::Full
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Verify::Full => "full",
            Verify::Fast => "fast",
        }
    }
}

impl std::fmt::Display for Verify {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The mode a report ran in, and what it guarantees, in one line (`verification` in `--json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verification {
    pub mode: Verify,
    pub guarantee: String,
}

impl Verification {
    /// Every element against its own bound.
    pub fn full() -> Verification {
        Verification {
            mode: Verify::Full,
            guarantee: "every element checked against its own bound".into(),
        }
    }

    /// The guarantee of `mode`.
    pub fn of(mode: Verify) -> Verification {
        match mode {
            Verify::Full => Verification::full(),
            Verify::Fast => Verification::fast(),
        }
    }

    /// What fast verification guarantees.
    pub fn fast() -> Verification {
        let tiles: Vec<String> = TILES.iter().map(|t| t.to_string()).collect();
        Verification {
            mode: Verify::Fast,
            guarantee: format!(
                "every element finite, tail rows and empty experts' drhs exactly 0; each group's first and last rows and columns, those at tile edges ({}) and {RANDOM} seeded ones checked against their own bounds; elsewhere a lone element off by more than {LONE}x the mean bound of its chunk of {CHUNK} columns is always caught (declared f64 accumulators: over 11 terms or more), any error above its chunk's summed bound escapes with probability <= 1/2 and above its row's summed bound with probability <= 2^-{VECTORS} ({VECTORS} random projections); smaller errors are not seen (use --verify full)",
                tiles.join("/")
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_default() {
        assert_eq!(Verify::parse("full"), Ok(Verify::Full));
        assert_eq!(Verify::parse(" fast"), Ok(Verify::Fast));
        let e = Verify::parse("quick").unwrap_err();
        assert!(e.contains("'quick'") && e.contains("full or fast"), "{e}");
        assert_eq!(Verify::default_for(0), Verify::Full);
        assert_eq!(Verify::default_for(u64::MAX), Verify::Fast);
        assert!(!Verification::fast().guarantee.contains('\n'));
    }
}
