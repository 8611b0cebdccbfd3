//! Tests of checking a case a shard of experts at a time: the plan, the shard's case, and
//! merged reports against the whole case's.

use ndarray::{s, Array2, Array3};

use super::*;
use crate::gemm::bound::{Accumulator, Precision};
use crate::gemm::case::{GemmOutputs, TailContract};
use crate::gemm::compare::compare_streamed;
use crate::gemm::fast::{fast_compare, fast_expected};
use crate::gemm::held::OutArray;
use crate::gemm::stream::reference_written;

const SIZES: [usize; 7] = [0, 300, 1, 0, 9, 260, 0];

/// A case with empty experts (first and last among them), a group over a row block, a tail,
/// and inexact values.
fn case() -> GroupedGemmCase {
    let (g, m, k, n) = (SIZES.len(), 600, 40, 24);
    let v = |i: usize| ((i * 2_654_435_761) % 1000) as f32 / 256.0 - 1.9;
    GroupedGemmCase {
        lhs: Array2::from_shape_fn((m, k), |(i, j)| v(i * 131 + j)),
        // bf16 values, held in bf16 (shards copy them as they are held).
        rhs: Weights::narrowed(
            Array3::from_shape_fn((g, k, n), |(e, i, j)| {
                ((e * 7919 + i * 31 + j * 7) % 97) as f32 / 64.0 - 0.75
            }),
            Format::Bf16,
        ),
        group_sizes: SIZES.to_vec(),
        dout: Some(Array2::from_shape_fn((m, n), |(i, j)| {
            v(i * 17 + j * 3 + 5)
        })),
        // lhs and dout are not bf16 values.
        dtype: Format::F32,
        out_dtype: Format::F32,
        tail: TailContract::Zero,
    }
}

fn precision() -> Precision {
    Precision {
        input: Format::F32,
        accumulator: Accumulator::any_order(Format::F32),
        output: Format::F32,
    }
}

/// The outputs of `got` (written for the whole [`case`]) that belong to `shard`.
fn outputs_of(got: &GemmOutputs, shard: &Shard) -> GemmOutputs {
    shard_outputs(got, &case(), shard, Passes::ALL).unwrap()
}

/// The reference's own outputs with planted errors: one element of expert 5's `out` well
/// past any bound, a NaN in expert 1's `dlhs`, garbage in a tail row of `dlhs`, and a
/// non-zero `drhs` for the last (empty) expert.
fn wrong(c: &GroupedGemmCase) -> GemmOutputs {
    let mut got = reference_written(c, Passes::ALL);
    if let Some(OutArray::F32(out)) = got.out.as_mut() {
        out[(320, 7)] += 3.0;
    }
    if let Some(OutArray::F32(dlhs)) = got.dlhs.as_mut() {
        dlhs[(10, 3)] = f32::NAN;
        dlhs[(590, 0)] = 1.0;
    }
    if let Some(OutArray::F32(drhs)) = got.drhs.as_mut() {
        drhs[(6, 2, 5)] = 0.5;
    }
    got
}

/// A shard's outputs are its rows of `out` and `dlhs` and its experts' `drhs`, held as they
/// were written (f32 stays f32); a missing pass stays missing; an output whose shape is not
/// the whole case's is refused, naming the pass and both shapes.
#[test]
fn shard_outputs_are_the_shards_rows_and_experts() {
    let c = case();
    let got = reference_written(&c, Passes::ALL);
    let s = Shard {
        experts: 4..6,
        rows: 301..570,
    };
    let part = shard_outputs(&got, &c, &s, Passes::ALL).unwrap();
    let (out, whole) = (part.out.as_ref().unwrap(), got.out.as_ref().unwrap());
    assert!(out.is_f32());
    assert_eq!(*out.f64(), whole.f64().slice(s![301..570, ..]));
    let dlhs = part.dlhs.as_ref().unwrap();
    assert_eq!(
        *dlhs.f64(),
        got.dlhs.as_ref().unwrap().f64().slice(s![301..570, ..])
    );
    let drhs = part.drhs.as_ref().unwrap();
    assert_eq!(
        *drhs.f64(),
        got.drhs.as_ref().unwrap().f64().slice(s![4..6, .., ..])
    );
    let fwd_only = GemmOutputs {
        out: got.out.clone(),
        dlhs: None,
        drhs: None,
    };
    let part = shard_outputs(&fwd_only, &c, &s, Passes::ALL).unwrap();
    assert!(part.out.is_some() && part.dlhs.is_none() && part.drhs.is_none());
    let mut short = got.clone();
    short.drhs = Some(OutArray::F32(Array3::zeros((6, 40, 24))));
    assert_eq!(
        shard_outputs(&short, &c, &s, Passes::ALL).unwrap_err(),
        "wgrad: the output has shape [6, 40, 24], the case's is [7, 40, 24]"
    );
    // A pass not asked is neither read nor kept.
    let part = shard_outputs(&short, &c, &s, Passes::FWD).unwrap();
    assert!(part.out.is_some() && part.dlhs.is_none() && part.drhs.is_none());
}

#[test]
fn plan_covers_every_expert_once_in_order() {
    let c = case();
    for parts in [1, 2, 3, 5, 7, 50] {
        let plan = plan(&c, parts);
        assert_eq!(plan.len(), parts.min(SIZES.len()), "{parts}");
        assert_eq!(plan[0].experts.start, 0);
        assert_eq!(plan[0].rows.start, 0);
        for w in plan.windows(2) {
            assert_eq!(w[0].experts.end, w[1].experts.start, "{parts}: {plan:?}");
            assert_eq!(w[0].rows.end, w[1].rows.start, "{parts}: {plan:?}");
        }
        let last = plan.last().unwrap();
        assert_eq!(last.experts.end, SIZES.len());
        // The tail rows are the last shard's.
        assert_eq!(last.rows.end, c.m());
        assert!(plan.iter().all(|s| !s.experts.is_empty()), "{plan:?}");
    }
    // As many shards as experts when asked for more.
    assert_eq!(plan(&c, 50).len(), SIZES.len());
    // Balanced by cost: with two parts the heavy experts 1 and 5 fall in different shards.
    let two = plan(&c, 2);
    assert_eq!(two.len(), 2);
    assert!(
        two[0].experts.contains(&1) && two[1].experts.contains(&5),
        "{two:?}"
    );
}

#[test]
fn a_shard_is_its_experts_rows_and_weights() {
    let c = case();
    assert!(matches!(c.rhs, Weights::Bf16(_)));
    let plan = plan(&c, 3);
    let mid = &plan[1];
    let sub = c.shard(mid);
    assert_eq!(sub.group_sizes, SIZES[mid.experts.clone()].to_vec());
    assert_eq!(sub.lhs, c.lhs.slice(s![mid.rows.clone(), ..]));
    assert_eq!(
        sub.dout.as_ref().unwrap(),
        c.dout.as_ref().unwrap().slice(s![mid.rows.clone(), ..])
    );
    for (i, g) in mid.experts.clone().enumerate() {
        assert_eq!(sub.rhs.expert(i).to_f64(), c.rhs.expert(g).to_f64());
    }
    assert_eq!(
        (sub.dtype, sub.out_dtype, sub.tail),
        (c.dtype, c.out_dtype, c.tail)
    );
    sub.validate(Passes::ALL).unwrap();
    let last = c.shard(plan.last().unwrap());
    assert_eq!(last.m() - last.rows_used(), c.m() - c.rows_used());
}

/// Full verification shard by shard reports exactly what the whole case does, on right
/// outputs and on outputs with errors in several experts and in the tail.
#[test]
fn merged_full_reports_are_the_whole_case_report() {
    let c = case();
    let p = precision();
    for got in [reference_written(&c, Passes::ALL), wrong(&c)] {
        let whole = compare_streamed(&c, Passes::ALL, &p, &got);
        for parts in [1, 2, 3, 5, 7] {
            let reports: Vec<(Shard, CaseReport)> = plan(&c, parts)
                .into_iter()
                .map(|s| {
                    let r = compare_streamed(&c.shard(&s), Passes::ALL, &p, &outputs_of(&got, &s));
                    (s, r)
                })
                .collect();
            // Debug text: the statistics hold NaN where a NaN was read.
            assert_eq!(
                format!("{:?}", merge_case(&c, &reports)),
                format!("{whole:?}"),
                "{parts} shards"
            );
        }
    }
    // The planted errors are there to be found.
    let whole = compare_streamed(&c, Passes::ALL, &p, &wrong(&c));
    assert!(!whole.passed());
    assert_eq!(whole.passes[0].failed_elements(), 1);
}

/// A shard's missing output fails the pass of the whole case, naming the shard.
#[test]
fn a_shards_missing_output_is_named() {
    let c = case();
    let p = precision();
    let got = reference_written(&c, Passes::ALL);
    let reports: Vec<(Shard, CaseReport)> = plan(&c, 3)
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            let mut o = outputs_of(&got, &s);
            if i == 1 {
                o.drhs = None;
            }
            let r = compare_streamed(&c.shard(&s), Passes::ALL, &p, &o);
            (s, r)
        })
        .collect();
    let merged = merge_case(&c, &reports);
    let wgrad = &merged.passes[2];
    let why = wgrad.error.as_deref().unwrap();
    assert!(why.starts_with(&format!("{}: ", reports[1].0)), "{why}");
    assert_eq!(wgrad.shape, vec![SIZES.len(), c.k(), c.n()]);
    assert!(!merged.passed() && merged.passes[0].passed());
}

/// Fast verification shard by shard: every row is projected once, right outputs pass, and
/// each planted error is found where it is in the whole case.
#[test]
fn merged_fast_reports_find_what_the_whole_case_finds() {
    let c = case();
    let p = precision();
    let fast = |got: &GemmOutputs, parts: usize| {
        let reports: Vec<(Shard, CaseReport)> = plan(&c, parts)
            .into_iter()
            .map(|s| {
                let sub = c.shard(&s);
                let e = fast_expected(&sub, Passes::ALL).unwrap();
                let r = fast_compare(&sub, Passes::ALL, &p, &e, &outputs_of(got, &s));
                (s, r)
            })
            .collect();
        merge_case(&c, &reports)
    };
    let right = reference_written(&c, Passes::ALL);
    let whole = fast_compare(
        &c,
        Passes::ALL,
        &p,
        &fast_expected(&c, Passes::ALL).unwrap(),
        &right,
    );
    for parts in [1, 3, 7] {
        let merged = fast(&right, parts);
        assert!(merged.passed(), "{parts}: {:?}", merged.first_failure());
        for (m, w) in merged.fast.iter().zip(&whole.fast) {
            assert_eq!((m.pass, m.rows, m.vectors), (w.pass, w.rows, w.vectors));
        }
        let wrong = fast(&wrong(&c), parts);
        assert!(!wrong.passed());
        // out: the element of expert 5 fails its projections, at its row in the whole case.
        let worst = wrong.fast[0].worst.as_ref().unwrap();
        assert_eq!((worst.group, worst.row), (5, 320), "{parts}");
        assert_eq!(wrong.fast[0].failed_rows, 1, "{parts}");
        // dlhs: the NaN is found at its place in the whole case; the tail row is judged.
        let nan = wrong.fast[1].first_non_finite.unwrap();
        assert_eq!((nan.group, nan.row, nan.col), (GroupId::Expert(1), 10, 3));
        let tail = wrong.passes[1].groups.last().unwrap();
        assert_eq!((tail.group, tail.stats.failed), (GroupId::Tail, 1));
        // drhs: the last expert's gradient is not zero, in its sampled elements and in
        // its projections (the row of a drhs projection is the k index, in any shard).
        let g6 = &wrong.passes[2].groups[6];
        assert_eq!(g6.group, GroupId::Expert(6));
        assert!(g6.stats.failed >= 1, "{parts}: {g6:?}");
        let worst = wrong.fast[2].worst.as_ref().unwrap();
        assert_eq!((worst.group, worst.row), (6, 2), "{parts}");
    }
}

/// A shard whose output of a pass could not be read has no projections for that pass: the
/// passes are still merged by name, and the whole pass fails.
#[test]
fn a_shard_without_an_output_fails_its_pass_in_fast_mode() {
    let c = case();
    let p = precision();
    let got = reference_written(&c, Passes::ALL);
    let reports: Vec<(Shard, CaseReport)> = plan(&c, 3)
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            let sub = c.shard(&s);
            let mut o = outputs_of(&got, &s);
            if i == 1 {
                o.dlhs = None;
            }
            let e = fast_expected(&sub, Passes::ALL).unwrap();
            (s.clone(), fast_compare(&sub, Passes::ALL, &p, &e, &o))
        })
        .collect();
    assert_eq!(
        reports[1].1.fast.len(),
        2,
        "no projections of the missing dlhs"
    );
    let merged = merge_case(&c, &reports);
    let passes: Vec<Pass> = merged.fast.iter().map(|f| f.pass).collect();
    assert_eq!(passes, vec![Pass::Fwd, Pass::Dgrad, Pass::Wgrad]);
    // The two shards that were read, every row of theirs.
    let read: usize = [0, 2].iter().map(|&i| reports[i].1.fast[1].rows).sum();
    assert_eq!(merged.fast[1].rows, read);
    assert!(!merged.passed());
    assert!(merged.passes[1].error.is_some());
    assert!(merged.passes[0].passed() && merged.passes[2].passed());
}
