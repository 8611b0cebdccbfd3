//! Exhaustive checks of the FP8 casts against tables generated from ml_dtypes
//! (`fixtures/formats/gen_tables.py`; the tables are committed, Python is not needed here).
//!
//! * `fp8_decode.txt`: every byte of both formats decoded.
//! * `bf16_to_fp8.txt`: every bf16 bit pattern cast to both formats, IEEE (ml_dtypes `astype`)
//!   and saturating (`np.clip` to ±max, then `astype`).
//! * `ties.txt`: every midpoint between adjacent finite values, and the ones just beyond ±max.
//!
//! Also documents that float8 0.7 has wrong `MAX` constants but a `from_f32` that agrees with
//! our saturating encoding.

use moecheck_reference::format::{decode_fp8, encode_fp8, Format, Overflow};
use std::path::PathBuf;

const FP8: [Format; 2] = [Format::E4m3, Format::E5m2];

fn table(name: &str) -> Vec<Vec<String>> {
    let path: PathBuf = [
        env!("CARGO_MANIFEST_DIR"),
        "..",
        "fixtures",
        "formats",
        name,
    ]
    .iter()
    .collect();
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let mut lines = text.lines();
    let header = lines.next().expect("empty table");
    assert!(header.starts_with("# "), "{name}: missing header");
    assert!(
        header.contains("ml_dtypes"),
        "{name}: header names no version"
    );
    lines
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect()
}

fn hex(s: &str) -> u64 {
    u64::from_str_radix(s, 16).unwrap_or_else(|e| panic!("bad hex {s:?}: {e}"))
}

/// Same value: NaN matches NaN, zeros must agree in sign, others compare exactly.
fn same(a: f64, b: f64) -> bool {
    if a.is_nan() || b.is_nan() {
        return a.is_nan() && b.is_nan();
    }
    a == b && a.is_sign_negative() == b.is_sign_negative()
}

/// The 256 decoded values per format, from the ml_dtypes table.
fn decoded() -> [Vec<f64>; 2] {
    let rows = table("fp8_decode.txt");
    assert_eq!(rows.len(), 256);
    let mut out = [Vec::new(), Vec::new()];
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(hex(&r[0]) as usize, i);
        for (k, col) in out.iter_mut().enumerate() {
            col.push(f32::from_bits(hex(&r[1 + k]) as u32) as f64);
        }
    }
    out
}

#[test]
fn decode_all_bytes() {
    let want = decoded();
    for (k, f) in FP8.iter().enumerate() {
        for b in 0..=255u8 {
            let got = decode_fp8(b, *f);
            let w = want[k][b as usize];
            assert!(
                same(got, w),
                "{f} decode {b:#04x}: got {got}, ml_dtypes {w}"
            );
            if w.is_nan() {
                // ml_dtypes keeps the sign bit on NaN; so do we.
                assert_eq!(got.is_sign_negative(), w.is_sign_negative(), "{f} {b:#04x}");
            }
        }
    }
}

#[test]
fn encode_all_bf16() {
    let rows = table("bf16_to_fp8.txt");
    assert_eq!(rows.len(), 65536);
    let mut checked = 0;
    for (i, r) in rows.iter().enumerate() {
        let bf = hex(&r[0]) as u32;
        assert_eq!(bf as usize, i);
        let x = f32::from_bits(bf << 16) as f64;
        let cols = [
            (Format::E4m3, Overflow::Ieee),
            (Format::E4m3, Overflow::Saturate),
            (Format::E5m2, Overflow::Ieee),
            (Format::E5m2, Overflow::Saturate),
        ];
        for (c, (f, o)) in cols.iter().enumerate() {
            let want = hex(&r[1 + c]) as u8;
            let got = encode_fp8(x, *f, *o);
            assert_eq!(
                got, want,
                "bf16 {bf:#06x} ({x:e}) -> {f} {o:?}: got {got:#04x}, ml_dtypes {want:#04x}"
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 4 * 65536);
}

#[test]
fn every_tie() {
    let rows = table("ties.txt");
    let mut per_format = [0usize; 2];
    for r in &rows {
        let f = Format::parse(&r[0]).unwrap();
        let x = f64::from_bits(hex(&r[1]));
        let want = hex(&r[2]) as u8;
        let got = encode_fp8(x, f, Overflow::Ieee);
        assert_eq!(
            got, want,
            "{f} tie {x:e}: got {got:#04x}, ml_dtypes {want:#04x}"
        );
        per_format[(f == Format::E5m2) as usize] += 1;
        // A tie rounds to the neighbour with an even mantissa (the last bit is 0), or overflows.
        let v = decode_fp8(got, f);
        if v.is_finite() && v != 0.0 {
            assert_eq!(got & 1, 0, "{f} tie {x:e} rounded to odd {got:#04x}");
        }
    }
    // Finite distinct values: E4M3 253 (254 finite bytes, ±0 merged), E5M2 247; pairs = n - 1,
    // plus the two midpoints beyond ±max.
    assert_eq!(per_format, [252 + 2, 246 + 2]);
    // The midpoints just beyond max: E4M3 464 ties to 448 (even), E5M2 61440 ties to inf.
    assert_eq!(encode_fp8(464.0, Format::E4m3, Overflow::Ieee), 0x7e);
    assert_eq!(encode_fp8(-464.0, Format::E4m3, Overflow::Ieee), 0xfe);
    assert_eq!(encode_fp8(61440.0, Format::E5m2, Overflow::Ieee), 0x7c);
    assert_eq!(encode_fp8(61440.0, Format::E5m2, Overflow::Saturate), 0x7b);
}

#[test]
fn format_info_matches_tables() {
    let dec = decoded();
    for (k, f) in FP8.iter().enumerate() {
        let info = f.info();
        let finite: Vec<f64> = dec[k].iter().copied().filter(|v| v.is_finite()).collect();
        let max = finite.iter().copied().fold(0.0, f64::max);
        let min_pos = finite
            .iter()
            .copied()
            .filter(|v| *v > 0.0)
            .fold(f64::INFINITY, f64::min);
        // Smallest normal: exponent field 1, mantissa 0, i.e. byte 1 << mantissa_bits.
        let min_normal = dec[k][1usize << info.mantissa_bits];
        assert_eq!(info.max, max, "{f} max");
        assert_eq!(info.min_subnormal(), min_pos, "{f} min subnormal");
        assert_eq!(info.min_normal(), min_normal, "{f} min normal");
        assert_eq!(
            info.has_inf,
            dec[k].iter().any(|v| v.is_infinite()),
            "{f} inf"
        );
        let expected_max = [448.0, 57344.0][k];
        assert_eq!(info.max, expected_max);
        // The largest subnormal is just below the smallest normal.
        let max_sub = dec[k][(1usize << info.mantissa_bits) - 1];
        assert_eq!(
            max_sub,
            min_normal - info.min_subnormal(),
            "{f} max subnormal"
        );
    }
}

/// float8 0.7: `MAX` constants are wrong (416 and 49152 instead of 448 and 57344), which is why
/// `Format::info` does not use them.
#[test]
fn float8_max_constants_are_wrong() {
    let e4 = float8::F8E4M3::MAX.to_f64();
    let e5 = float8::F8E5M2::MAX.to_f64();
    assert_eq!(e4, 416.0);
    assert_eq!(e5, 49152.0);
    assert_ne!(e4, Format::E4m3.info().max);
    assert_ne!(e5, Format::E5m2.info().max);
}

/// float8 0.7's `from_f32` is a saturating cast; it agrees with our `Overflow::Saturate`
/// encoding on every bf16 input except some NaNs in E5M2. ml_dtypes and we write every NaN as
/// `S.11111.10` (0x7e/0xfe); float8 keeps the second payload bit, writing `S.11111.1P` where
/// `P` is bf16 mantissa bit 5 (f32 bit 21). So the 2×64 NaN patterns with that bit set
/// (bf16 `0x7fa0..=0x7fbf`, `0x7fe0..=0x7fff` and the same with the sign set) give 0x7f/0xff
/// in float8; all are NaN either way. E4M3 NaN (`S.1111.111`) agrees everywhere.
#[test]
fn float8_from_f32_agrees_with_saturate() {
    let mut bad = Vec::new();
    let mut e5m2_nan = 0;
    for bf in 0..=u16::MAX {
        let x = f32::from_bits((bf as u32) << 16);
        let ours4 = encode_fp8(x as f64, Format::E4m3, Overflow::Saturate);
        let ours5 = encode_fp8(x as f64, Format::E5m2, Overflow::Saturate);
        let theirs4 = float8::F8E4M3::from_f32(x).to_bits();
        let theirs5 = float8::F8E5M2::from_f32(x).to_bits();
        if ours4 != theirs4 {
            bad.push(format!(
                "e4m3 {bf:#06x} ours {ours4:#04x} float8 {theirs4:#04x}"
            ));
        }
        if x.is_nan() {
            let s = if x.is_sign_negative() { 0x80 } else { 0 };
            let p = ((bf >> 5) & 1) as u8;
            assert_eq!(
                (ours5, theirs5),
                (s | 0x7e, s | 0x7e | p),
                "e5m2 NaN {bf:#06x}"
            );
            e5m2_nan += p as usize;
        } else if ours5 != theirs5 {
            bad.push(format!(
                "e5m2 {bf:#06x} ours {ours5:#04x} float8 {theirs5:#04x}"
            ));
        }
    }
    assert_eq!(e5m2_nan, 2 * 64, "NaN patterns where float8 differs");
    assert!(
        bad.is_empty(),
        "{} disagreements:\n{}",
        bad.len(),
        bad.join("\n")
    );
}
