//! Size guards: a command that allocates in proportion to its flags estimates the memory it
//! will need and refuses (exit 2, naming the flags and `--allow-large`) when that exceeds what
//! this machine has available, instead of aborting on allocation minutes later.
//!
//! The estimates are per-element costs measured with `/usr/bin/time -f %M` on release builds
//! (2026-12-03), rounded up:
//! * `gemm`, counted per array: the inputs in f32 (4 bytes per element of `lhs`, `rhs`, and
//!   `dout` when a backward pass is asked), each asked output in f64 as the implementation
//!   returns it (8 bytes per element of `out`, `dlhs`, `drhs`), the emulation's f32 partial
//!   sums of one pass (4 bytes per element of the larger of `out` and `dlhs`), and with
//!   `--verify fast` one expert's operands widened to f64 per core; plus 256 MiB. Full
//!   verification holds no reference array (it is streamed, `moecheck_reference::gemm::stream`).
//!   Measured at 64 experts, M = 4096, K = 2048, N = 1024, three passes: 1.81 GB (reference)
//!   and 1.82 GB (emulate), estimate 2.06 GB.
//! * `gemm --dtype fp8`: about 52 bytes per element of `lhs`, `rhs` and `out` together (the
//!   FP8 references are held whole), measured at 16 experts, M = 2048, K = 1024, N = 512
//!   (600 MB) and 64 experts, M = 4096, K = 2048, N = 1024 (7.3 GB); the guard counts 64.
//! * `moe`: about 100 bytes per expert-weight element and 600 per element of `x` (the
//!   per-token copies of the layer's forward and backward), measured at 2048 tokens, hidden
//!   512, 32 experts, ffn 256 (0.94 GB) and 8192 tokens, hidden 128, 8 experts, ffn 64
//!   (0.59 GB).
//!
//! "Available" is the kernel's `MemAvailable`, or the cgroup's `memory.max` less its
//! `memory.current` when that is smaller.

use std::fs;

use moecheck_reference::gemm::{Passes, Verify};

/// Bytes of memory available to this process, if the machine says.
pub fn available() -> Option<u64> {
    let meminfo = fs::read_to_string("/proc/meminfo").ok().and_then(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("MemAvailable:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kb| kb * 1024)
    });
    let read = |p: &str| fs::read_to_string(p).ok()?.trim().parse::<u64>().ok();
    let cgroup = match (
        read("/sys/fs/cgroup/memory.max"),
        read("/sys/fs/cgroup/memory.current"),
    ) {
        (Some(max), Some(cur)) => Some(max.saturating_sub(cur)),
        _ => None,
    };
    match (meminfo, cgroup) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// `bytes` in GiB, one decimal.
pub fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// The share of the available memory a case may be estimated to need: the estimates are
/// within about 15% of measured peaks, and a case that needs nearly everything gets the machine
/// killed rather than a result.
pub const USABLE: f64 = 0.85;

/// Refuses `need` bytes when more than [`USABLE`] of `available` (unless `allow`): the reason
/// names the flags that set the size and `--allow-large`.
pub fn guard(flags: &str, need: u64, available: Option<u64>, allow: bool) -> Result<(), String> {
    match available {
        Some(have) if need as f64 > have as f64 * USABLE && !allow => Err(format!(
            "{flags}: this case needs about {} of memory and {} is available (a case may use {:.0}% of it); make it smaller, or pass --allow-large to try anyway",
            gib(need),
            gib(have),
            USABLE * 100.0
        )),
        _ => Ok(()),
    }
}

/// Saturating product of sizes, as bytes.
pub fn elements(dims: &[usize]) -> u64 {
    dims.iter()
        .fold(1u64, |acc, &d| acc.saturating_mul(d as u64))
}

/// The estimated peak of `moecheck gemm` (module docs) for `M x K`, `G x K x N`, `M x N`,
/// the asked passes and the verification mode.
pub fn gemm_bytes(
    m: usize,
    k: usize,
    n: usize,
    groups: usize,
    passes: Passes,
    verify: Verify,
) -> u64 {
    let (mk, gkn, mn) = (
        elements(&[m, k]),
        elements(&[groups, k, n]),
        elements(&[m, n]),
    );
    let inputs = [mk, gkn, if passes.needs_dout() { mn } else { 0 }]
        .into_iter()
        .fold(0u64, u64::saturating_add);
    let outputs = [(passes.fwd, mn), (passes.dgrad, mk), (passes.wgrad, gkn)]
        .into_iter()
        .filter(|(asked, _)| *asked)
        .fold(0u64, |acc, (_, e)| acc.saturating_add(e));
    // Fast verification widens one expert's operands at a time per core, each with its
    // absolute values (two f64 copies): a whole `K x N` weight per core (two cores), and the
    // expert's rows of `lhs` or `dout`, which over the cores together are at most all `M`.
    let fast = if verify == Verify::Fast {
        mk.max(mn)
            .saturating_mul(2 * 8)
            .saturating_add(elements(&[k, n]).saturating_mul(2 * 8 * 2))
    } else {
        0
    };
    inputs
        .saturating_mul(4)
        .saturating_add(fast)
        .saturating_add(outputs.saturating_mul(8))
        .saturating_add(mn.max(mk).saturating_mul(4))
        .saturating_add(256 << 20)
}

/// The estimated peak of `moecheck gemm --dtype fp8` (module docs).
pub fn fp8_gemm_bytes(m: usize, k: usize, n: usize, groups: usize) -> u64 {
    let per = elements(&[m, k])
        .saturating_add(elements(&[groups, k, n]))
        .saturating_add(elements(&[m, n]));
    per.saturating_mul(64).saturating_add(64 << 20)
}

/// The estimated peak of `moecheck moe` (module docs).
pub fn moe_bytes(tokens: usize, hidden: usize, experts: usize, ffn: usize, shared: usize) -> u64 {
    let weights =
        elements(&[2, experts, hidden, ffn]).saturating_add(elements(&[2, hidden, shared]));
    weights
        .saturating_mul(100)
        .saturating_add(elements(&[tokens, hidden]).saturating_mul(600))
        .saturating_add(elements(&[tokens, experts]).saturating_mul(64))
        .saturating_add(64 << 20)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimates_cover_the_measured_peaks() {
        // Measured peaks (module docs) are below the estimates, and not far below.
        let g = fp8_gemm_bytes(2048, 1024, 512, 16);
        assert!(g > 600_000_000 && g < 900_000_000, "{g}");
        let g = gemm_bytes(4096, 2048, 1024, 64, Passes::ALL, Verify::Full);
        assert!(g > 1_830_000_000 && g < 3_000_000_000, "{g}");
        // Forward alone holds no dout, dlhs or drhs; fast verification widens per expert.
        let fwd = gemm_bytes(4096, 2048, 1024, 64, Passes::FWD, Verify::Full);
        assert!(fwd < g / 2, "{fwd}");
        let fast = gemm_bytes(4096, 2048, 1024, 64, Passes::ALL, Verify::Fast);
        assert!(fast > g && fast < g + 1_500_000_000, "{fast}");
        let m = moe_bytes(2048, 512, 32, 256, 0);
        assert!(m > 941_000_000 && m < 2_000_000_000, "{m}");
        let m = moe_bytes(8192, 128, 8, 64, 0);
        assert!(m > 588_000_000 && m < 1_000_000_000, "{m}");
    }

    #[test]
    fn the_guard_refuses_only_above_what_is_available() {
        let gb = 1u64 << 30;
        assert!(guard("--tokens", 2 * gb, Some(gb), false)
            .unwrap_err()
            .contains(
                "--tokens: this case needs about 2.0 GiB of memory and 1.0 GiB is available"
            ));
        assert!(guard("--tokens", 2 * gb, Some(gb), true).is_ok());
        assert!(guard("--tokens", gb, Some(2 * gb), false).is_ok());
        // Nearly all of it is refused too: the estimate is not exact.
        assert!(guard("--tokens", 95 * gb / 100, Some(gb), false).is_err());
        assert!(guard("--tokens", u64::MAX, None, false).is_ok());
        assert_eq!(elements(&[usize::MAX, 4]), u64::MAX);
        assert!(available().is_some_and(|a| a > 0));
    }
}
