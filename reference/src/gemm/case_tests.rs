//! Tests of [`super`]: validation's one-read scan.

use super::*;

/// The one-read scan agrees with the format table on every kind of f32: random bit
/// patterns, bf16 values (normal and subnormal), values one f32 ulp off them, ±0, ±inf, NaN.
#[test]
fn scan_agrees_with_the_format_table() {
    let mut values = vec![0.0f32, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN];
    let mut x = 0x9E37_79B9u32;
    for _ in 0..100_000 {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        values.push(f32::from_bits(x));
        let bf = f32::from_bits(x & 0xFFFF_0000);
        values.extend([bf, f32::from_bits(bf.to_bits() + 1)]);
        values.push(f32::from_bits(x & 0x807F_0000)); // subnormal bf16 values
    }
    for dtype in [Format::F64, Format::F32, Format::Bf16, Format::F16] {
        let mut bad = 0;
        for v in &values {
            let table = dtype.represents(f64::from(*v));
            let one = ndarray::ArrayView1::from(std::slice::from_ref(v));
            assert_eq!(
                all_representable(one, dtype),
                table,
                "{dtype:?} {v:e} ({:#010x})",
                v.to_bits()
            );
            bad += usize::from(!table);
        }
        // Every format is offered values it cannot hold (NaN, inf at least).
        assert!(bad >= 3, "{dtype:?}");
    }
}

/// Validation finds one bad value wherever it is in a large operand (the scan runs in
/// blocks on several cores): in `lhs`, `dout` and the weights held in f32 or bf16, a
/// NaN, an infinity, and a value the case's dtype cannot hold.
#[test]
fn validation_finds_one_bad_value_anywhere() {
    use half::bf16;
    // Every operand is over par::SERIAL_BELOW elements: scanned in blocks on several cores.
    let (m, k, n, g) = (1200, 1024, 900, 2);
    let case = |w_bf16: bool| GroupedGemmCase {
        lhs: Array2::from_elem((m, k), 0.5),
        rhs: if w_bf16 {
            Weights::Bf16(Array3::from_elem((g, k, n), bf16::from_f32(0.25)))
        } else {
            Weights::F32(Array3::from_elem((g, k, n), 0.25))
        },
        group_sizes: vec![600, 600],
        dout: Some(Array2::from_elem((m, n), 1.0)),
        dtype: Format::Bf16,
        out_dtype: Format::F32,
        tail: TailContract::default(),
    };
    let all = Passes::ALL;
    assert!(case(true).validate(all).is_ok());
    assert!(case(false).validate(all).is_ok());
    let off_bf16 = 1.0 + f32::EPSILON; // an f32 value, not a bf16 one
    let places = |len: usize| [0, 65_535, 65_536, len / 2, len - 1];
    for bad in [f32::NAN, f32::INFINITY, off_bf16] {
        for at in places(m * k) {
            let mut c = case(true);
            c.lhs.as_slice_mut().unwrap()[at] = bad;
            assert!(c.validate(all).is_err(), "lhs {bad} at {at}");
        }
        for at in places(g * k * n) {
            let mut c = case(false);
            if let Weights::F32(w) = &mut c.rhs {
                w.as_slice_mut().unwrap()[at] = bad;
            }
            assert!(c.validate(all).is_err(), "rhs f32 {bad} at {at}");
        }
        for at in places(m * n) {
            let mut c = case(true);
            c.dout.as_mut().unwrap().as_slice_mut().unwrap()[at] = bad;
            assert!(c.validate(all).is_err(), "dout {bad} at {at}");
        }
    }
    for bad in [f32::NAN, f32::NEG_INFINITY] {
        for at in places(g * k * n) {
            let mut c = case(true);
            if let Weights::Bf16(w) = &mut c.rhs {
                w.as_slice_mut().unwrap()[at] = bf16::from_f32(bad);
            }
            assert!(c.validate(all).is_err(), "rhs bf16 {bad} at {at}");
        }
    }
    // A bf16 weight that an E4M3 case cannot hold.
    let mut c = case(true);
    c.dtype = Format::E4m3;
    c.lhs.fill(0.5);
    c.dout.as_mut().unwrap().fill(1.0);
    assert!(c.validate(all).is_ok());
    if let Weights::Bf16(w) = &mut c.rhs {
        w[[1, 3, 5]] = bf16::from_f32(0.3);
    }
    assert!(c.validate(all).is_err(), "rhs bf16 not an E4M3 value");
}
