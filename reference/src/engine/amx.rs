//! The magnitudes `s = Σ_p |a[i, p]|·|b[p, j]|` by AMX BF16 tiles, the values on the f64
//! path: [`super::isa::Isa::Amx`].
//!
//! ## Why
//! [`super::bf16mag`] sums the magnitudes by f32 fused multiply-adds, 16 products each against
//! the values' 8: they still cost half as much as the values. `tdpbf16ps` multiplies a 16 × 32 tile of `|a|` by a 32 × 16 tile of
//! `|b|` into 16 × 16 f32 sums, 8192 products per instruction. Here the values are computed by
//! the f64 kernel alone, with its widest register tile, and the magnitudes beside them cost a
//! few percent of the values.
//!
//! ## The upper bound
//! The same as [`super::bf16mag`]'s, step by step (its module doc derives it): every `|x|`
//! rounded up to bf16, so the products are exact in f32; the run is kept only when the
//! operands' ranges (gathered while they are packed) rule out a flushed input or product and
//! an overflowing sum, and the thread does not flush subnormals; sums in f32 within a
//! `KC`-deep band, the bands added in f64, the result times `F = 1 + γ(k + 1, 2^-23) + 2^-50`.
//! `tdpbf16ps` adds each product of a pair to the f32 sum with its own rounding to nearest
//! even (Intel's pseudo-code), and treats subnormal inputs and results as 0 whatever MXCSR
//! says, which the ranges rule out: each product meets at most `min(k, KC)` roundings in its
//! band, as step 3 counts. So `s >= S` for every element, and `s = 0` exactly when every
//! product is 0.
//!
//! Rows are padded to 16, the depth to 32 and the columns to 16 with zeros, which add exact
//! zeros to no sum that counts: no column tile goes to another path. The values `c` are the
//! f64 kernel's, computed by it before this runs.
//!
//! ## Permission
//! On Linux a process must ask for the tile state before it uses it
//! (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`); the path is offered only where
//! the CPU has AMX-BF16, the operating system enables the tile state and the request is
//! granted (asked once per process). Elsewhere the f32 sums of [`super::bf16mag`] or the f64
//! sums run.

use std::arch::asm;
use std::arch::x86_64::*;
use std::sync::OnceLock;

use super::band::{Shape, KC, MC};
use super::bf16mag::{band_sum, certified, flushes_subnormals, inflation, Range};
use super::operand::Operand;
use pack::{pack_a_rows, pack_b_band};

#[path = "amx_pack.rs"]
mod pack;

/// Rows of every tile, and columns (f32 sums) of the sums' tile.
const TILE: usize = 16;
/// The depth one `tdpbf16ps` takes: 32 bf16 per row of `|a|`'s tile (64 bytes).
const DEPTH: usize = 32;

/// Whether this process can run the path: the CPU has AMX-BF16 and AMX-TILE, the operating
/// system enables their state, and it granted this process the tile data (asked once).
pub(super) fn available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| cpu_and_os_have_tiles() && permitted())
}

/// CPUID leaf 7's AMX-BF16 (EDX bit 22) and AMX-TILE (bit 24), and XCR0's tile
/// configuration and data (bits 17 and 18), which `xgetbv` reads when OSXSAVE is set.
fn cpu_and_os_have_tiles() -> bool {
    // SAFETY: CPUID leaves 0, 1 and 7 exist on every x86-64 CPU (leaf 7 checked against
    // leaf 0's maximum); `xgetbv` runs only when CPUID says the OS enabled it (OSXSAVE).
    unsafe {
        if __cpuid(0).eax < 7 {
            return false;
        }
        let leaf7 = __cpuid_count(7, 0);
        let amx = (leaf7.edx >> 22) & 1 == 1 && (leaf7.edx >> 24) & 1 == 1;
        let osxsave = (__cpuid(1).ecx >> 27) & 1 == 1;
        if !amx || !osxsave {
            return false;
        }
        let (lo, _hi): (u32, u32);
        asm!("xgetbv", in("ecx") 0u32, out("eax") lo, out("edx") _hi, options(nomem, nostack));
        const TILES: u32 = (1 << 17) | (1 << 18);
        lo & TILES == TILES
    }
}

/// Asks Linux for this process's use of the tile data.
#[cfg(target_os = "linux")]
fn permitted() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: the request takes two integers and changes only which state this process may use.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

#[cfg(not(target_os = "linux"))]
fn permitted() -> bool {
    false
}

/// The tile configuration `ldtilecfg` reads (palette 1), every tile 16 rows of 64 bytes:
/// `tmm0`–`tmm3` the 16 × 16 f32 sums of two row tiles by two column tiles, `tmm4`–`tmm5` two
/// row tiles of 32 bf16 of `|a|`, `tmm6`–`tmm7` two column tiles of 16 bf16 pairs of `|b|`.
#[repr(C, align(64))]
struct Config {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    bytes_per_row: [u16; 16],
    rows: [u8; 16],
}

impl Config {
    fn eight_tiles() -> Config {
        let mut c = Config {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            bytes_per_row: [0; 16],
            rows: [0; 16],
        };
        for t in 0..8 {
            c.bytes_per_row[t] = 64;
            c.rows[t] = TILE as u8;
        }
        c
    }
}

/// The tiles configured for one call, released when it ends (also on unwinding).
struct Tiles;

impl Tiles {
    /// # Safety
    /// The process must have the tile state ([`available`]).
    unsafe fn configure() -> Tiles {
        let config = Config::eight_tiles();
        // SAFETY: `ldtilecfg` reads the 64 bytes of a valid palette-1 configuration.
        unsafe { asm!("ldtilecfg [{}]", in(reg) &config, options(nostack, readonly)) };
        Tiles
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: returns the tiles to their initial state; touches no memory.
        unsafe { asm!("tilerelease", options(nomem, nostack)) };
    }
}

/// `s ≥ Σ|a|·|b|` as the module doc derives, `c` untouched. Returns `false`, having written
/// nothing that counts, when the operands fall outside the certified range: the caller then
/// runs the f64 path.
///
/// # Safety
/// As for the kernel's `body` (`s.s` not null); the CPU must have AVX-512F, and
/// [`available`] must be true.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn run<B: Operand>(s: &Shape<B>) -> bool {
    if flushes_subnormals() {
        return false;
    }
    let f = inflation(s.k);
    // Column tiles and row tiles in pairs (a zero tile past the last where they are odd).
    let tiles = s.n.div_ceil(TILE).next_multiple_of(2);
    let widest = KC.min(s.k).next_multiple_of(DEPTH);
    let mut b2 = vec![0u32; tiles * TILE * widest / 2];
    let mut a2 = vec![0u16; MC.min(s.m).next_multiple_of(2 * TILE) * widest];
    // Two sets of sums: one block's are stored while the next block's are computed, so that
    // reading them back does not wait for the tile stores.
    let mut sums = [const { [const { Sums([0.0; TILE * TILE]) }; 4] }; 2];
    let (mut ra, mut rb) = (Range::EMPTY, Range::EMPTY);
    // SAFETY: the caller checked `available`.
    let _tiles = unsafe { Tiles::configure() };
    let mut pc = 0;
    while pc < s.k {
        let kc = KC.min(s.k - pc);
        let depth = kc.next_multiple_of(DEPTH);
        let pair_rows = depth / 2;
        // SAFETY: rows pc..pc + kc of b; b2 holds `tiles` column tiles of `pair_rows`.
        rb = rb.join(unsafe { pack_b_band(s, pc, kc, &mut b2[..tiles * pair_rows * TILE]) });
        let out = Out {
            first: pc == 0,
            last: pc + kc == s.k,
            f,
        };
        let mut ic = 0;
        while ic < s.m {
            let mc = MC.min(s.m - ic);
            let rows = mc.next_multiple_of(2 * TILE);
            // SAFETY: rows ic..ic + mc, columns pc..pc + kc of a.
            unsafe { pack_a_rows(s, pc, kc, depth, ic, mc, &mut a2[..rows * depth], &mut ra) };
            // The blocks' corners (first row of the block, first column tile), in order; block
            // `n`'s sums in set `n % 2`, stored after block `n + 1`'s are computed.
            let corners = (0..tiles)
                .step_by(2)
                .flat_map(|t| (0..rows).step_by(2 * TILE).map(move |it| (it, t)));
            let mut pending: Option<(usize, usize)> = None;
            for (n, (it, t)) in corners.enumerate() {
                // SAFETY: the tiles read rows it..it + 32 of the packed block (each `depth`
                // wide) and column tiles t, t + 1 (`depth / 2` pair rows each).
                unsafe {
                    let (a, b) = (
                        a2[it * depth..].as_ptr(),
                        b2[t * pair_rows * TILE..].as_ptr(),
                    );
                    sum_block(a, depth, b, pair_rows * TILE, &mut sums[n % 2]);
                }
                if let Some(corner) = pending {
                    // SAFETY: the block lies inside the rows ic..ic + mc, columns 0..n of s.
                    unsafe { out.store_block(s, ic, mc, corner, &sums[(n + 1) % 2]) };
                }
                pending = Some((it, t));
            }
            if let Some(corner) = pending {
                let last = rows / (2 * TILE) * (tiles / 2) - 1;
                // SAFETY: as above.
                unsafe { out.store_block(s, ic, mc, corner, &sums[last % 2]) };
            }
            ic += mc;
        }
        pc += kc;
    }
    certified(ra, rb, s.k)
}

/// The 16 × 16 f32 sums of one tile, as `tilestored` writes them.
#[repr(C, align(64))]
struct Sums([f32; TILE * TILE]);

/// `sums ← |a|·|b|` over `depth` (a multiple of 32) for two row tiles by two column tiles,
/// four independent accumulations that share their operands' loads: `a` 32 rows `depth`
/// apart, `b` column tile `t`'s pair rows and `b_next` u32s on, tile `t + 1`'s, 16 pairs (64
/// bytes) a row. `sums[2r + c]` is row tile `r` by column tile `c`.
///
/// # Safety
/// `a` must hold 32 rows of `depth` bf16 at a stride of `depth`, `b` two column tiles of
/// `depth / 2` pair rows; the tiles configured by [`Tiles::configure`].
#[inline(always)]
unsafe fn sum_block(
    a: *const u16,
    depth: usize,
    b: *const u32,
    b_next: usize,
    sums: &mut [Sums; 4],
) {
    let (a_stride, b_stride) = (depth * 2, TILE * 4);
    unsafe {
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            options(nomem, nostack)
        );
        for q in (0..depth).step_by(DEPTH) {
            asm!(
                "tileloadd tmm4, [{a0} + {sa}*1]",
                "tileloadd tmm5, [{a1} + {sa}*1]",
                "tileloadd tmm6, [{b0} + {sb}*1]",
                "tileloadd tmm7, [{b1} + {sb}*1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                a0 = in(reg) a.add(q),
                a1 = in(reg) a.add(TILE * depth + q),
                sa = in(reg) a_stride,
                b0 = in(reg) b.add(q / 2 * TILE),
                b1 = in(reg) b.add(b_next + q / 2 * TILE),
                sb = in(reg) b_stride,
                options(nostack, readonly),
            );
        }
        let [s0, s1, s2, s3] = sums;
        asm!(
            "tilestored [{s0} + {ss}*1], tmm0",
            "tilestored [{s1} + {ss}*1], tmm1",
            "tilestored [{s2} + {ss}*1], tmm2",
            "tilestored [{s3} + {ss}*1], tmm3",
            s0 = in(reg) s0.0.as_mut_ptr(),
            s1 = in(reg) s1.0.as_mut_ptr(),
            s2 = in(reg) s2.0.as_mut_ptr(),
            s3 = in(reg) s3.0.as_mut_ptr(),
            ss = in(reg) TILE * 4,
            options(nostack),
        );
    }
}

/// Where a tile's sums go: stored (`first` band) or added to `s`, times `f` after the `last`.
struct Out {
    first: bool,
    last: bool,
    f: f64,
}

impl Out {
    /// The four tiles of the block whose corner is row `it` of the row block at `ic` (`mc`
    /// rows) and column tile `t`: the rows and columns inside `s`.
    ///
    /// # Safety
    /// As for [`Out::store`].
    #[inline(always)]
    unsafe fn store_block<B>(
        &self,
        s: &Shape<B>,
        ic: usize,
        mc: usize,
        (it, t): (usize, usize),
        sums: &[Sums; 4],
    ) {
        for (q, sum) in sums.iter().enumerate() {
            let (i, j) = (it + q / 2 * TILE, (t + q % 2) * TILE);
            let (live, w) = (
                TILE.min(mc.saturating_sub(i)),
                TILE.min(s.n.saturating_sub(j)),
            );
            if live > 0 && w > 0 {
                // SAFETY: rows ic + i.. (live of them), columns j..j + w of s.
                unsafe { self.store(s, ic + i, j, live, w, sum) };
            }
        }
    }

    /// Rows `i..i + rows`, columns `j..j + w` of `s` from the tile's sums.
    ///
    /// # Safety
    /// The window must lie inside `s.s`; the CPU must have AVX-512F.
    #[inline(always)]
    unsafe fn store<B>(&self, s: &Shape<B>, i: usize, j: usize, rows: usize, w: usize, t: &Sums) {
        if w == TILE {
            // Eight rows' sums read before any is written: a write to `s` never stands
            // between a read of the sums and its row (rows 8 KiB apart share their low
            // address bits with the sums, which would make each read wait for the write).
            for r0 in (0..rows).step_by(8) {
                let n = 8.min(rows - r0);
                // SAFETY: rows r0..r0 + n of the sums, 16 each (AVX-512F, checked by the
                // caller); then rows i + r0.. (n of them), columns j..j + 16 of s.
                unsafe {
                    let mut x = [[_mm512_setzero_pd(); 2]; 8];
                    for (r, x) in x.iter_mut().enumerate().take(n) {
                        let row = t.0.as_ptr().add((r0 + r) * TILE);
                        x[0] = _mm512_cvtps_pd(_mm256_loadu_ps(row));
                        x[1] = _mm512_cvtps_pd(_mm256_loadu_ps(row.add(8)));
                    }
                    for (r, x) in x.iter().enumerate().take(n) {
                        let at = s.s.offset((i + r0 + r) as isize * s.lds + j as isize);
                        for (h, &x) in x.iter().enumerate() {
                            band_sum(at.add(8 * h), x, self.first, self.last, self.f);
                        }
                    }
                }
            }
            return;
        }
        for r in 0..rows {
            // SAFETY: row i + r, columns j..j + w of s.
            let at = unsafe { s.s.offset((i + r) as isize * s.lds + j as isize) };
            for (c, &x) in t.0[r * TILE..r * TILE + w].iter().enumerate() {
                // SAFETY: column j + c < j + w of the row.
                let p = unsafe { at.add(c) };
                let v = if self.first {
                    f64::from(x)
                } else {
                    (unsafe { *p }) + f64::from(x)
                };
                unsafe { *p = if self.last { v * self.f } else { v } };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tile configuration is the 64 bytes `ldtilecfg` reads, each tile 16 rows of 64 bytes.
    #[test]
    fn the_configuration_is_laid_out_as_the_instruction_reads_it() {
        assert_eq!(std::mem::size_of::<Config>(), 64);
        assert_eq!(std::mem::align_of::<Config>(), 64);
        let c = Config::eight_tiles();
        // SAFETY: Config is 64 plain bytes (repr(C), no padding: 1 + 1 + 14 + 32 + 16).
        let bytes: [u8; 64] = unsafe { std::mem::transmute(c) };
        assert_eq!(bytes[0], 1, "palette");
        assert_eq!(
            &bytes[16..32],
            &[64, 0].repeat(8)[..],
            "bytes per row, tmm0-7"
        );
        assert_eq!(&bytes[32..48], &[0; 16], "tiles 8-15: none");
        assert_eq!(&bytes[48..56], &[16; 8], "rows, tmm0-7");
        assert_eq!(&bytes[56..64], &[0; 8], "rows, tiles 8-15");
    }
}
