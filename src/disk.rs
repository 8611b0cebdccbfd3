//! The disk a case directory of an `exec:` or `worker:` run needs (and, for `moe`, the memory the
//! program's copies add: [`moe_external_bytes`]), estimated before anything is
//! written, against the free space of the file system that holds `$TMPDIR` (where
//! [`crate::impls::scratch`] makes it).
//!
//! The directory holds every input as a float32 `.npy` file (docs/protocol.md: whatever the
//! case's dtype), for an FP8 case also the recipe's quantised copies and scales, and the
//! outputs the program writes, counted at 8 bytes an element (a program may write float64).
//! A case that cannot fit is refused with exit 2 naming `TMPDIR`, instead of failing with a
//! full disk halfway through writing (or leaving the program to fail on its outputs).

use std::path::Path;

use crate::memory::{elements, gib, io_elements, GemmSize};
use moecheck_reference::gemm::Passes;

/// Bytes free to this user on the file system holding `dir`, if the system says.
pub fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a NUL-terminated string and `st` a valid statvfs to fill.
    let rc = unsafe { libc::statvfs(path.as_ptr(), &mut st) };
    (rc == 0).then(|| (st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

/// The size of a grouped GEMM's case directory with its outputs: `lhs (M, K)`, `rhs (G, K, N)`
/// and `dout (M, N)` at 4 bytes (`compact` and not `fp8`: 2 bytes, bf16 bit patterns; an FP8
/// case's scales are small), the asked outputs at 8, and 1 MiB for
/// `case.json`, the group sizes and the file headers.
pub fn gemm_case_bytes(size: GemmSize, passes: Passes, fp8: bool, compact: bool) -> u64 {
    let (inputs, outputs) = io_elements(size, passes);
    // An FP8 case directory holds its float32 inputs and per-scope scales (small).
    let per_input = if compact && !fp8 { 2 } else { 4 };
    inputs
        .saturating_mul(per_input)
        .saturating_add(outputs.saturating_mul(8))
        .saturating_add(1 << 20)
}

/// What block-scaled FP8 adds to [`gemm_case_bytes`]: each operand's quantised copies (one
/// byte an element, row-wise and column-wise: 2) and their scales (at most one float32 per 32
/// elements, counted at 1 byte an element to stay above).
pub fn block_copies_bytes(size: GemmSize) -> u64 {
    io_elements(size, Passes::default()).0.saturating_mul(3)
}

/// The weight elements of an MoE layer: gate, up and down per expert, the shared expert's,
/// the router.
fn moe_weights(hidden: usize, experts: usize, ffn: usize, shared: usize) -> u64 {
    elements(&[3, experts, hidden, ffn])
        .saturating_add(elements(&[3, hidden, shared]))
        .saturating_add(elements(&[hidden, experts]))
}

/// The size of an MoE layer's case directory with its outputs: every weight at 4 bytes and its
/// gradient at 8, `x` and `dout` at 4 and `y` and `dx` at 8, and 1 MiB for `case.json` and the
/// headers.
pub fn moe_case_bytes(
    tokens: usize,
    hidden: usize,
    experts: usize,
    ffn: usize,
    shared: usize,
) -> u64 {
    moe_weights(hidden, experts, ffn, shared)
        .saturating_mul(12)
        .saturating_add(elements(&[2, tokens, hidden]).saturating_mul(12))
        .saturating_add(1 << 20)
}

/// What `moe` through `exec:` or `worker:` adds to `memory::moe_bytes`, as
/// `memory::external_bytes` does for `gemm`: moecheck's float32 copy of each input, the
/// program's float32 copy of it and its outputs (the inputs' shapes) at 8 bytes: 16 bytes per
/// weight element, 24 per element of `x`, `dout` and the gradients of the same shapes.
pub fn moe_external_bytes(
    tokens: usize,
    hidden: usize,
    experts: usize,
    ffn: usize,
    shared: usize,
) -> u64 {
    moe_weights(hidden, experts, ffn, shared)
        .saturating_mul(16)
        .saturating_add(elements(&[2, tokens, hidden]).saturating_mul(24))
}

/// Refuses a case directory of `need` bytes in `dir` (`$TMPDIR`) when the file system has less
/// free (`free`, `None` when it does not say: then nothing is refused), unless `allow`.
pub fn guard(need: u64, dir: &Path, free: Option<u64>, allow: bool) -> Result<(), String> {
    match free {
        Some(have) if need > have && !allow => Err(format!(
            "TMPDIR ({}): this case's directory needs about {} of disk (inputs as float32 .npy files and the outputs) and {} is free there; set TMPDIR to a larger disk, make the case smaller, or pass --allow-large to try anyway",
            dir.display(),
            gib(need),
            gib(have)
        )),
        _ => Ok(()),
    }
}

/// [`guard`] for `$TMPDIR` as this process sees it.
pub fn guard_tmp(need: u64, allow: bool) -> Result<(), String> {
    let dir = std::env::temp_dir();
    guard(need, &dir, free_bytes(&dir), allow)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_only_what_does_not_fit() {
        let dir = Path::new("/scratch/tmp");
        assert!(guard(10, dir, Some(10), false).is_ok());
        assert!(guard(10, dir, None, false).is_ok());
        assert!(guard(11, dir, Some(10), true).is_ok());
        let e = guard(3 << 30, dir, Some(1 << 30), false).unwrap_err();
        assert!(e.starts_with("TMPDIR (/scratch/tmp): "), "{e}");
        assert!(e.contains("3.0 GiB") && e.contains("1.0 GiB"), "{e}");
        assert!(!e.contains('\n'));
    }

    #[test]
    fn free_space_is_read_and_missing_dirs_say_nothing() {
        let here = free_bytes(&std::env::temp_dir());
        assert!(here.is_some_and(|b| b > 0));
        assert_eq!(free_bytes(Path::new("/no/such/dir/anywhere")), None);
    }

    /// DeepSeek-V3's expert GEMM, three passes: 4096·8 rows, K = 7168, N = 2048, 256 experts.
    /// Inputs 15.9 GB at float32 (the weights 15.0), outputs 33.8 GB at 8 bytes.
    #[test]
    fn deepseek_v3_case_size() {
        let size = GemmSize {
            m: 32768,
            k: 7168,
            n: 2048,
            groups: 256,
        };
        let b = gemm_case_bytes(size, Passes::ALL, false, false);
        let (mk, gkn, mn) = (32768u64 * 7168, 256u64 * 7168 * 2048, 32768u64 * 2048);
        assert_eq!(b, (mk + gkn + mn) * 4 + (mk + gkn + mn) * 8 + (1 << 20));
        let fwd = Passes {
            fwd: true,
            dgrad: false,
            wgrad: false,
        };
        assert_eq!(
            gemm_case_bytes(size, fwd, false, false),
            (mk + gkn + mn) * 4 + mn * 8 + (1 << 20)
        );
        // FP8 (per-tensor, group or expert scales): the same float32 inputs; never compact.
        assert_eq!(
            gemm_case_bytes(size, fwd, true, true),
            gemm_case_bytes(size, fwd, false, false)
        );
        assert_eq!(
            gemm_case_bytes(size, fwd, false, true),
            (mk + gkn + mn) * 2 + mn * 8 + (1 << 20)
        );
    }
}
