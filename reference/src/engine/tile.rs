//! The kernel's register tile ([`super::kernel`]): `R × C` sums (and magnitudes) over one
//! `kc`-deep band, accumulated in registers in increasing `p`, then stored or added.

use super::operand::Operand;

/// One `mr × NR` tile over one `kc`-deep band, `c` pointing at its top-left element.
pub(super) struct Tile<B> {
    pub(super) kc: usize,
    pub(super) a: *const f64,
    pub(super) rsa: isize,
    pub(super) csa: isize,
    pub(super) b: *const B,
    pub(super) ldb: isize,
    pub(super) c: *mut f64,
    pub(super) ldc: isize,
    /// The magnitudes' tile (used only by `MAG` tiles).
    pub(super) s: *mut f64,
    pub(super) lds: isize,
    /// `MAG` tiles only: `|b|`, laid out as `b`, and the tile's `|a|` (`a_abs[p·R + i]`).
    pub(super) babs: *const f64,
    pub(super) a_abs: *const f64,
    pub(super) first: bool,
}

/// Dispatches `mr in 1..=MR` to a tile with that many rows as a constant.
#[inline(always)]
pub(super) unsafe fn tile_rows<
    B: Operand,
    const MR: usize,
    const NR: usize,
    const FMA: bool,
    const MAG: bool,
>(
    mr: usize,
    t: &Tile<B>,
) {
    unsafe {
        match mr {
            1 => tile::<B, 1, NR, FMA, MAG>(t),
            2 => tile::<B, 2, NR, FMA, MAG>(t),
            3 if MR >= 3 => tile::<B, 3, NR, FMA, MAG>(t),
            4 if MR >= 4 => tile::<B, 4, NR, FMA, MAG>(t),
            5 if MR >= 5 => tile::<B, 5, NR, FMA, MAG>(t),
            6 if MR >= 6 => tile::<B, 6, NR, FMA, MAG>(t),
            7 if MR >= 7 => tile::<B, 7, NR, FMA, MAG>(t),
            8 if MR >= 8 => tile::<B, 8, NR, FMA, MAG>(t),
            _ => unreachable!("tile with {mr} rows, at most {MR}"),
        }
    }
}

/// `c[i, j] (=|+=) Σ_{p < kc} a[i, p]·b[p, j]` for `i < R`, `j < C`, accumulated in registers
/// in increasing `p`; `=` for the first band, `+=` for later ones. With `MAG`, the same for
/// `s[i, j]` and `|a[i, p]|·|b[p, j]|`, in the same order.
#[inline(always)]
unsafe fn tile<B: Operand, const R: usize, const C: usize, const FMA: bool, const MAG: bool>(
    t: &Tile<B>,
) {
    let step = |a: f64, b: f64, x: f64| if FMA { a.mul_add(b, x) } else { a * b + x };
    let mut acc = [[0.0f64; C]; R];
    let mut mag = [[0.0f64; C]; R];
    for p in 0..t.kc {
        // SAFETY: row p of the tile's C columns lies inside `b` (the band of the caller's `b`,
        // C <= n - jr, or its widened copy of kc rows × C values): the caller's contract.
        let raw: [B; C] =
            unsafe { std::ptr::read_unaligned(t.b.offset(p as isize * t.ldb) as *const [B; C]) };
        let bv: [f64; C] = raw.map(Operand::wide);
        // SAFETY (MAG): `babs` is laid out as `b`, and `a_abs` holds kc·R values.
        let babs: [f64; C] = if MAG {
            unsafe {
                std::ptr::read_unaligned(t.babs.offset(p as isize * t.ldb) as *const [f64; C])
            }
        } else {
            [0.0; C]
        };
        for (i, (row, mrow)) in acc.iter_mut().zip(mag.iter_mut()).enumerate() {
            let av = unsafe { *t.a.offset(i as isize * t.rsa + p as isize * t.csa) };
            for (x, bj) in row.iter_mut().zip(bv) {
                *x = step(av, bj, *x);
            }
            if MAG {
                let aa = unsafe { *t.a_abs.add(p * R + i) };
                for (x, bj) in mrow.iter_mut().zip(babs) {
                    *x = step(aa, bj, *x);
                }
            }
        }
    }
    // SAFETY: rows i < R, columns [jr, jr + C) of the tile are inside c (and s).
    unsafe {
        store::<R, C>(&acc, t.c, t.ldc, t.first);
        if MAG {
            store::<R, C>(&mag, t.s, t.lds, t.first);
        }
    }
}

/// Writes (`first`) or adds a tile's sums into the `R × C` window at `c` (row stride `ldc`).
///
/// # Safety
/// The window must lie inside a live, mutably borrowed array.
#[inline(always)]
unsafe fn store<const R: usize, const C: usize>(
    acc: &[[f64; C]; R],
    c: *mut f64,
    ldc: isize,
    first: bool,
) {
    for (i, row) in acc.iter().enumerate() {
        let cp = unsafe { c.offset(i as isize * ldc) } as *mut [f64; C];
        // SAFETY: row i of the window, by the caller's contract.
        unsafe {
            if first {
                std::ptr::write_unaligned(cp, *row);
            } else {
                let mut old: [f64; C] = std::ptr::read_unaligned(cp);
                for (o, x) in old.iter_mut().zip(row) {
                    *o += x;
                }
                std::ptr::write_unaligned(cp, old);
            }
        }
    }
}
