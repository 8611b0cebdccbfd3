//! The FP8 kernels of kernels/fp8.cu on the CPU, each against a direct statement of what it
//! must compute: the casts bit for bit against the reference's encode/decode, the recipe per
//! scope (amax, scale, scale_inv, saturating cast), the column-wise copy per group, and the
//! FP8 grouped GEMM passes exactly on small integers.

use moecheck::cuda::plan::{grid_1d, plan_tiles};
use moecheck_reference::format::{decode_fp8, encode_fp8, Format, Overflow};
use moecheck_reference::gemm::Pass;

use crate::harness::{skip, sym};

/// `mc_encode` (driver.cpp): format id ([`fmt_id`]), an f32; the saturating FP8 cast.
type EncodeFn = unsafe extern "C" fn(i32, f32) -> u8;
/// `mc_decode` (driver.cpp): format id ([`fmt_id`]), an FP8 byte; its value as f32.
type DecodeFn = unsafe extern "C" fn(i32, u8) -> f32;
/// `mc_fp8_quantize` (driver.cpp): format id, x (host f32, all scopes back to back), bounds
/// (host, scopes+1 element offsets), scopes, then per scope amax, scale, scale_inv (host f32,
/// overwritten), q (host, one byte per x, overwritten), cast blocks.
type QuantFn = unsafe extern "C" fn(
    i32,
    *const f32,
    *const i64,
    i32,
    *mut f32,
    *mut f32,
    *mut f32,
    *mut u8,
    u32,
);
/// `mc_fp8_transpose` (driver.cpp): q (host, M x cols row-major), cols, offsets (G+1), G,
/// qt (host, M x cols bytes; each group's rows written column-major at its offset), blocks.
type TransposeFn = unsafe extern "C" fn(*const u8, i64, *const i32, i32, *mut u8, u32);
/// `mc_fp8_gemm` (driver.cpp): pass, a, b (host FP8 bytes: fwd lhs E4M3 x rhs E4M3, dgrad
/// dout E5M2 x rhs E4M3, wgrad column-wise lhs E4M3 x column-wise dout E5M2; shapes as in
/// fp8.cu), sa, sb (host, one scale_inv per group), out (host f32, overwritten where a tile
/// writes), offsets (G+1), tiles (flat plan), tile count, M, K, N, G, grid x, grid y.
type Fp8GemmFn = unsafe extern "C" fn(
    i32,
    *const u8,
    *const u8,
    *const f32,
    *const f32,
    *mut f32,
    *const i32,
    *const i32,
    i32,
    i64,
    i64,
    i64,
    i32,
    u32,
    u32,
);

/// The format id of driver.cpp's FP8 entry points: 0 E4M3, 1 E5M2.
fn fmt_id(f: Format) -> i32 {
    if f == Format::E4m3 {
        0
    } else {
        1
    }
}

#[test]
fn fp8_casts_match_the_reference_bit_for_bit() {
    if skip() {
        return;
    }
    let enc = sym!("mc_encode", EncodeFn);
    let dec = sym!("mc_decode", DecodeFn);
    for f in [Format::E4m3, Format::E5m2] {
        for q in 0..=255u8 {
            // SAFETY: plain value function.
            let got = unsafe { dec(fmt_id(f), q) } as f64;
            let want = decode_fp8(q, f);
            assert!(
                got == want || (got.is_nan() && want.is_nan()),
                "{f:?} decode {q:#04x}: {got} vs {want}"
            );
        }
        // Every bf16 bit pattern (as f32), then a deterministic sweep of f32 patterns.
        let mut inputs: Vec<f32> = (0..=u16::MAX)
            .map(|b| f32::from_bits((b as u32) << 16))
            .collect();
        let mut z: u64 = 0x1234_5678;
        for _ in 0..400_000 {
            z = z
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            inputs.push(f32::from_bits((z >> 32) as u32));
        }
        for x in inputs {
            // SAFETY: plain value function.
            let got = unsafe { enc(fmt_id(f), x) };
            let want = encode_fp8(x as f64, f, Overflow::Saturate);
            assert_eq!(got, want, "{f:?} encode {x:e} ({:#010x})", x.to_bits());
        }
    }
}

/// The recipe as reference/src/fp8 documents it, per scope, in f32.
fn recipe(x: &[f32], f: Format) -> (f32, f32, f32, Vec<u8>) {
    let amax = x.iter().fold(0.0f32, |m, v| {
        if m.is_nan() || v.is_nan() {
            f32::NAN
        } else {
            m.max(v.abs())
        }
    });
    let fmax = if f == Format::E4m3 { 448.0f32 } else { 57344.0 };
    let mut scale = if amax.is_nan() || amax <= 0.0 || !amax.is_finite() {
        1.0
    } else {
        fmax / amax
    };
    if scale.is_infinite() {
        scale = f32::MAX;
    }
    let q = x
        .iter()
        .map(|&v| encode_fp8((v * scale) as f64, f, Overflow::Saturate))
        .collect();
    (amax, scale, 1.0 / scale, q)
}

#[test]
fn fp8_quantize_follows_the_recipe_per_scope() {
    if skip() {
        return;
    }
    let quant = sym!("mc_fp8_quantize", QuantFn);
    // Scopes: normal, empty, with a NaN, all zeros, a tiny amax (scale overflow), an outlier,
    // and one longer than a block.
    let scopes: Vec<Vec<f32>> = vec![
        vec![1.5, -3.25, 0.125, 7.0],
        vec![],
        vec![2.0, f32::NAN, -1.0],
        vec![0.0, -0.0, 0.0],
        vec![1e-39, -3e-40],
        vec![1e-3, 2e-3, -65000.0, 1e-6, f32::INFINITY],
        (0..700)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.37)
            .collect(),
    ];
    let x: Vec<f32> = scopes.iter().flatten().copied().collect();
    let mut bounds = vec![0i64];
    for s in &scopes {
        bounds.push(bounds.last().unwrap() + s.len() as i64);
    }
    for f in [Format::E4m3, Format::E5m2] {
        let n = scopes.len();
        let (mut amax, mut scale, mut sinv) = (vec![0f32; n], vec![0f32; n], vec![0f32; n]);
        let mut q = vec![0xaau8; x.len()];
        let widest = scopes.iter().map(Vec::len).max().unwrap();
        let (blocks, _) = grid_1d(widest, 256, 4096).unwrap();
        // SAFETY: arrays sized as the kernels expect (x and q: len; per-scope arrays: n).
        unsafe {
            quant(
                fmt_id(f),
                x.as_ptr(),
                bounds.as_ptr(),
                n as i32,
                amax.as_mut_ptr(),
                scale.as_mut_ptr(),
                sinv.as_mut_ptr(),
                q.as_mut_ptr(),
                blocks,
            )
        };
        for (s, vals) in scopes.iter().enumerate() {
            let (a, sc, si, qq) = recipe(vals, f);
            assert!(
                a.to_bits() == amax[s].to_bits() || (a.is_nan() && amax[s].is_nan()),
                "{f:?} scope {s} amax"
            );
            assert_eq!(sc.to_bits(), scale[s].to_bits(), "{f:?} scope {s} scale");
            assert_eq!(si.to_bits(), sinv[s].to_bits(), "{f:?} scope {s} scale_inv");
            let lo = bounds[s] as usize;
            assert_eq!(&q[lo..lo + vals.len()], &qq[..], "{f:?} scope {s} bytes");
        }
    }
}

/// FP8 grouped GEMM on small integers (exact f32 sums): fwd, dgrad, and wgrad through the
/// column-wise copies made by the transpose kernel; bit-exact against the f32 formula
/// `((Σ qa·qb) · sinv_a[g]) · sinv_b[g]`, zeros in tails and empty experts.
#[test]
fn fp8_grouped_gemm_passes_match_the_formula_exactly() {
    if skip() {
        return;
    }
    let gemm = sym!("mc_fp8_gemm", Fp8GemmFn);
    let transpose = sym!("mc_fp8_transpose", TransposeFn);
    let sizes = [3usize, 0, 70, 1, 0];
    let tail = 5;
    let (k, n) = (67usize, 9usize);
    let g = sizes.len();
    let used: usize = sizes.iter().sum();
    let m = used + tail;
    let off: Vec<usize> = std::iter::once(0)
        .chain(sizes.iter().scan(0, |a, s| {
            *a += s;
            Some(*a)
        }))
        .collect();
    let offs: Vec<i32> = off.iter().map(|&o| o as i32).collect();
    let int = |i: usize, f: Format| -> u8 {
        encode_fp8(((i * 2654435761) % 17) as f64 - 8.0, f, Overflow::Saturate)
    };
    let lhs: Vec<u8> = (0..m * k)
        .map(|i| {
            if i < used * k {
                int(i, Format::E4m3)
            } else {
                0
            }
        })
        .collect();
    let rhs: Vec<u8> = (0..g * k * n).map(|i| int(i + 7, Format::E4m3)).collect();
    let dout: Vec<u8> = (0..m * n)
        .map(|i| {
            if i < used * n {
                int(i + 3, Format::E5m2)
            } else {
                0
            }
        })
        .collect();
    let s_lhs: Vec<f32> = (0..g).map(|i| 0.5f32.powi(i as i32) / 3.0).collect();
    let s_rhs: Vec<f32> = (0..g).map(|i| 1.7f32 * (i + 1) as f32).collect();
    let s_dout: Vec<f32> = (0..g).map(|i| 0.01f32 + i as f32).collect();
    let d4 = |q: u8| decode_fp8(q, Format::E4m3) as f32;
    let d5 = |q: u8| decode_fp8(q, Format::E5m2) as f32;
    // Column-wise copies by the kernel.
    let colwise = |q: &[u8], cols: usize| -> Vec<u8> {
        let mut qt = vec![0u8; q.len()];
        if let Some((blocks, _)) = grid_1d(used * cols, 256, 4096) {
            // SAFETY: q and qt hold m*cols bytes; offsets G+1 entries.
            unsafe {
                transpose(
                    q.as_ptr(),
                    cols as i64,
                    offs.as_ptr(),
                    g as i32,
                    qt.as_mut_ptr(),
                    blocks,
                )
            };
        }
        qt
    };
    let lhs_col = colwise(&lhs, k);
    let dout_col = colwise(&dout, n);
    for (gi, w) in off.windows(2).enumerate() {
        let s = w[1] - w[0];
        for r in 0..s {
            for c in 0..k {
                assert_eq!(
                    lhs_col[w[0] * k + c * s + r],
                    lhs[(w[0] + r) * k + c],
                    "transpose g{gi}"
                );
            }
        }
    }
    for (p, pass) in Pass::ALL.iter().enumerate() {
        let plan = plan_tiles(*pass, &sizes, m, k, n).unwrap();
        let (gx, gy) = plan.grid().unwrap();
        let (a, b, sa, sb, len) = match pass {
            Pass::Fwd => (&lhs, &rhs, &s_lhs, &s_rhs, m * n),
            Pass::Dgrad => (&dout, &rhs, &s_dout, &s_rhs, m * k),
            Pass::Wgrad => (&lhs_col, &dout_col, &s_lhs, &s_dout, g * k * n),
        };
        let mut out = vec![f32::NAN; len];
        let tiles = plan.flat();
        // SAFETY: as the GPU launch; all arrays are sized per kernels/fp8.cu.
        unsafe {
            gemm(
                p as i32,
                a.as_ptr(),
                b.as_ptr(),
                sa.as_ptr(),
                sb.as_ptr(),
                out.as_mut_ptr(),
                offs.as_ptr(),
                tiles.as_ptr(),
                plan.tiles.len() as i32,
                m as i64,
                k as i64,
                n as i64,
                g as i32,
                gx,
                gy,
            )
        };
        let scaled = |acc: f32, gi: usize, red: usize| {
            if red == 0 {
                0.0
            } else {
                (acc * sa[gi]) * sb[gi]
            }
        };
        for gi in 0..g {
            let (lo, hi) = (off[gi], off[gi + 1]);
            match pass {
                Pass::Fwd | Pass::Dgrad => {
                    let (cols, red) = if *pass == Pass::Fwd { (n, k) } else { (k, n) };
                    for r in lo..hi {
                        for c in 0..cols {
                            let acc: f32 = (0..red)
                                .map(|i| {
                                    if *pass == Pass::Fwd {
                                        d4(lhs[r * k + i]) * d4(rhs[gi * k * n + i * n + c])
                                    } else {
                                        d5(dout[r * n + i]) * d4(rhs[gi * k * n + c * n + i])
                                    }
                                })
                                .fold(0.0f32, |s, x| s + x);
                            let want = scaled(acc, gi, red);
                            assert_eq!(
                                out[r * cols + c].to_bits(),
                                want.to_bits(),
                                "{pass} r{r} c{c}"
                            );
                        }
                    }
                }
                Pass::Wgrad => {
                    for kk in 0..k {
                        for c in 0..n {
                            let acc: f32 = (lo..hi)
                                .map(|r| d4(lhs[r * k + kk]) * d5(dout[r * n + c]))
                                .fold(0.0f32, |s, x| s + x);
                            let want = scaled(acc, gi, hi - lo);
                            assert_eq!(
                                out[gi * k * n + kk * n + c].to_bits(),
                                want.to_bits(),
                                "wgrad g{gi} k{kk} n{c}"
                            );
                        }
                    }
                }
            }
        }
        if *pass != Pass::Wgrad {
            let cols = if *pass == Pass::Fwd { n } else { k };
            assert!(
                out[used * cols..].iter().all(|&v| v.to_bits() == 0),
                "{pass}: tail not exactly +0"
            );
        }
    }
}
