//! Tests of the streamed reference: its blocks, its written outputs and its comparison.

use super::*;
use crate::format::Format;
use crate::gemm::case::TailContract;
use crate::gemm::grouped::{reference, ReferenceResult};
use crate::gemm::weights::Weights;

/// A case with groups larger than a block, empty experts, a tail, small-integer values
/// (every sum exact, so every summation order gives the same bits).
fn case(sizes: &[usize], m: usize, k: usize, n: usize) -> GroupedGemmCase {
    let g = sizes.len();
    GroupedGemmCase {
        lhs: Array2::from_shape_fn((m, k), |(i, j)| ((i * 5 + j * 3) % 7) as f32 - 3.0),
        // bf16 values, held in bf16: the weights are read as the kernel finds them.
        rhs: Weights::narrowed(
            Array3::from_shape_fn((g, k, n), |(e, i, j)| {
                ((e * 3 + i + j * 2) % 5) as f32 - 2.0
            }),
            Format::Bf16,
        ),
        group_sizes: sizes.to_vec(),
        dout: Some(Array2::from_shape_fn((m, n), |(i, j)| {
            ((i + 2 * j) % 9) as f32 - 4.0
        })),
        dtype: Format::Bf16,
        out_dtype: Format::F32,
        tail: TailContract::Zero,
    }
}

/// The whole-tensor reference with its magnitudes (exact sums here: small integers) as the
/// kernel reports them on this CPU (times `F(k)` on the bf16 magnitudes' path), `k` each
/// pass's reduction length: fwd's `K`, dgrad's `N`, wgrad's group size.
fn as_reported(c: &GroupedGemmCase, mut whole: ReferenceResult) -> ReferenceResult {
    use crate::engine::{exact_sum_as_reported, Isa};
    let isa = Isa::detect();
    let at = |x: &mut f64, k: usize| *x = exact_sum_as_reported(isa, *x, k);
    let m = &mut whole.magnitude;
    if let Some(o) = m.out.as_mut() {
        o.mapv_inplace(|mut x| {
            at(&mut x, c.k());
            x
        });
    }
    if let Some(o) = m.dlhs.as_mut() {
        o.mapv_inplace(|mut x| {
            at(&mut x, c.n());
            x
        });
    }
    if let Some(o) = m.drhs.as_mut() {
        for (g, mut e) in o.outer_iter_mut().enumerate() {
            e.mapv_inplace(|mut x| {
                at(&mut x, c.group_sizes[g]);
                x
            });
        }
    }
    whole
}

/// Streamed values and magnitudes equal the whole-tensor reference's exactly (its magnitudes
/// as the kernel reports them: [`as_reported`]), block by block, on shapes with groups over a
/// block, empty experts, a tail, K = 0 and M = 0.
#[test]
fn blocks_are_the_whole_reference() {
    let shapes: [(&[usize], usize, usize, usize); 4] = [
        (&[0, 300, 1, 0, 9, 600, 0], 1000, 300, 27),
        (&[2, 0, 1], 4, 0, 3),
        (&[0, 0], 0, 4, 3),
        (&[517], 600, 5, 1),
    ];
    for (sizes, m, k, n) in shapes {
        let c = case(sizes, m, k, n);
        let whole = as_reported(&c, reference(&c, Passes::ALL).unwrap());
        assert_eq!(reference_values(&c, Passes::ALL), whole.value, "{sizes:?}");
        let off = offsets(sizes);
        for pass in Pass::ALL {
            for (g, &size) in sizes.iter().enumerate() {
                let mut seen = 0;
                group_blocks(&c, &off, pass, g, true, &mut |b| {
                    let rows = b.value.nrows();
                    // The same rows of the whole pass's output (of drhs[g] for wgrad).
                    let rows_of = |o: &WideOutputs| match pass {
                        Pass::Fwd => o
                            .out
                            .as_ref()
                            .unwrap()
                            .slice(s![b.first..b.first + rows, ..])
                            .to_owned(),
                        Pass::Dgrad => o
                            .dlhs
                            .as_ref()
                            .unwrap()
                            .slice(s![b.first..b.first + rows, ..])
                            .to_owned(),
                        Pass::Wgrad => o
                            .drhs
                            .as_ref()
                            .unwrap()
                            .slice(s![g, b.first..b.first + rows, ..])
                            .to_owned(),
                    };
                    let (want, mag) = (rows_of(&whole.value), rows_of(&whole.magnitude));
                    assert!(rows <= BLOCK);
                    assert_eq!(b.value, want, "{pass} group {g} from {}", b.first);
                    assert_eq!(b.magnitude.unwrap(), mag, "{pass} group {g}");
                    seen += rows;
                });
                let expect = if pass == Pass::Wgrad { k } else { size };
                assert_eq!(seen, expect, "{pass} group {g}: every row once");
            }
        }
    }
}

/// The reference as an implementation writes its f64 values rounded once to the output
/// format: held in f64 for f64 output (the values themselves), in f32 otherwise, each
/// element the format's rounding of the f64 value; values that round (not small integers)
/// and one that overflows bf16's neighbour f16.
#[test]
fn written_outputs_are_the_values_rounded_once() {
    let mut c = case(&[0, 300, 1, 0, 9, 600, 0], 1000, 30, 27);
    c.lhs.mapv_inplace(|v| v * 1.0078125 + 0.01171875);
    c.lhs[(5, 0)] = 3.0e4;
    c.rhs.f32_mut().mapv_inplace(|v| v * 3.0);
    c.rhs = Weights::narrowed(c.rhs.f32().into_owned(), Format::Bf16);
    assert!(matches!(c.rhs, Weights::Bf16(_)));
    let values = reference_values(&c, Passes::ALL);
    for out in [Format::F64, Format::F32, Format::Bf16, Format::F16] {
        c.out_dtype = out;
        let written = reference_written(&c, Passes::ALL);
        let pairs = [
            (
                written.out.as_ref().unwrap().f64(),
                values.out.as_ref().unwrap(),
            ),
            (
                written.dlhs.as_ref().unwrap().f64(),
                values.dlhs.as_ref().unwrap(),
            ),
        ];
        assert_eq!(written.out.as_ref().unwrap().is_f32(), out != Format::F64);
        let mut inexact = 0;
        for (w, v) in pairs {
            ndarray::Zip::from(&*w).and(v).for_each(|w, v| {
                let want = round_to(*v, out, Overflow::Ieee);
                assert_eq!(w.to_bits(), want.to_bits(), "{out:?}: {v:e}");
                inexact += usize::from(w != v);
            });
        }
        let d = written.drhs.as_ref().unwrap().f64();
        ndarray::Zip::from(&*d)
            .and(values.drhs.as_ref().unwrap())
            .for_each(|w, v| assert_eq!(*w, round_to(*v, out, Overflow::Ieee)));
        // The values do round (and overflow f16), except in f64.
        assert_eq!(inexact == 0, out == Format::F64, "{out:?}");
    }
    let f16 = reference_written(&c, Passes::FWD)
        .out
        .unwrap()
        .f64()
        .into_owned();
    assert!(f16.iter().any(|v| v.is_infinite()), "3e4·6 overflows f16");
    // Those infinities are the correct f16 answer, so the reference's own f16 outputs pass
    // their check (cuBLAS's grouped GEMM writes f16 the same way); the other infinity fails.
    use crate::gemm::bound::{Accumulator, Precision};
    use crate::gemm::compare::compare_outputs;
    c.out_dtype = Format::F16;
    c.dtype = Format::F32; // lhs was moved off the bf16 grid above
    let precision = Precision {
        input: Format::F32,
        accumulator: Accumulator::any_order(Format::F64),
        output: Format::F16,
    };
    let whole = reference(&c, Passes::FWD).unwrap();
    let written = reference_written(&c, Passes::FWD);
    let r = compare_outputs(&c, Passes::FWD, &precision, &whole, &written);
    assert!(r.passed(), "{:?}", r.first_failure());
    let overflowed: usize = r.passes[0].groups.iter().map(|g| g.stats.overflowed).sum();
    assert!(overflowed > 0);
    let mut text = String::new();
    crate::gemm::report::render_passes(&mut text, &r.passes);
    assert!(
        text.contains(&format!(
            "NOTE: {overflowed} element(s) are ±inf where rounding"
        )),
        "{text}"
    );
    let mut flipped = written.clone();
    let out = flipped.out.as_mut().unwrap().f64_mut();
    let at = out.indexed_iter().find(|(_, v)| v.is_infinite()).unwrap().0;
    out[at] = -out[at];
    let r = compare_outputs(&c, Passes::FWD, &precision, &whole, &flipped);
    assert_eq!(r.passes[0].failed_elements(), 1);
}

/// The streamed comparison reports what the whole-tensor one does, element for element:
/// on right outputs, and on outputs with an error in one element of a large group, a NaN,
/// a non-zero tail row, a non-zero empty expert's drhs and a missing pass.
#[test]
fn streamed_comparison_is_the_whole_comparison() {
    use crate::gemm::bound::{Accumulator, Precision};
    use crate::gemm::compare::{compare_outputs, compare_streamed};
    let c = case(&[0, 300, 1, 0, 9, 600, 0], 1000, 300, 27);
    let whole = as_reported(&c, reference(&c, Passes::ALL).unwrap());
    let precision = Precision {
        input: Format::Bf16,
        accumulator: Accumulator::any_order(Format::F32),
        output: Format::F32,
    };
    let same = |got: &GemmOutputs, passes: Passes| {
        let a = compare_outputs(&c, passes, &precision, &whole, got);
        let b = compare_streamed(&c, passes, &precision, got);
        // Debug text, since NaN statistics are not equal to themselves.
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
        a
    };
    let right: GemmOutputs = whole.value.clone().into();
    assert!(same(&right, Passes::ALL).passed());
    let mut wrong = right.clone();
    wrong.out.as_mut().unwrap().f64_mut()[(500, 3)] += 1.0;
    wrong.dlhs.as_mut().unwrap().f64_mut()[(2, 7)] = f64::NAN;
    wrong.dlhs.as_mut().unwrap().f64_mut()[(995, 0)] = 1e-30;
    wrong.drhs.as_mut().unwrap().f64_mut()[(3, 299, 26)] = 1e-30;
    let r = same(&wrong, Passes::ALL);
    assert!(!r.passed());
    for p in &r.passes {
        assert!(p.failed_elements() > 0, "{:?} caught", p.pass);
    }
    // Held in f32 (1e-30 is an f32 value; NaN stays NaN), the same outputs get the same
    // report as their f64 copy, failures and all.
    let narrow = |o: &GemmOutputs| GemmOutputs {
        out: o.out.as_ref().map(|a| a.f64().mapv(|v| v as f32).into()),
        dlhs: o.dlhs.as_ref().map(|a| a.f64().mapv(|v| v as f32).into()),
        drhs: o.drhs.as_ref().map(|a| a.f64().mapv(|v| v as f32).into()),
    };
    for o in [&right, &wrong] {
        let held = narrow(o);
        assert!(held.drhs.as_ref().unwrap().is_f32());
        let wide: GemmOutputs = held.to_f64().into();
        assert_eq!(
            format!("{:?}", same(&held, Passes::ALL)),
            format!("{:?}", same(&wide, Passes::ALL))
        );
    }
    assert!(!same(&narrow(&wrong), Passes::ALL).passed());
    wrong.drhs = None;
    let r = same(&wrong, Passes::ALL);
    assert!(r.passes[2].error.is_some());
}
