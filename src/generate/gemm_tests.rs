//! Tests of `generate::gemm`: the stream drawn in parallel and in shards is the sequential one.

use super::*;
use moecheck_reference::format::{round_to, Overflow};
use rand::RngCore;

fn spec() -> GemmSpec {
    GemmSpec {
        experts: 16,
        tokens: 100,
        topk: 2,
        hidden: 8,
        ffn: 4,
        dtype: Format::Bf16,
        out_dtype: Format::F32,
        spread: Spread::Skewed,
        empty: 3,
        drop_frac: 0.1,
        seed: 7,
        tail: TailContract::Zero,
        passes: Passes::ALL,
    }
}

#[test]
fn sizes_respect_empty_and_drop() {
    let s = spec();
    let case = generate(&s);
    assert!(case.group_sizes.iter().filter(|x| **x == 0).count() >= 3);
    assert_eq!(case.group_sizes[0], 0);
    assert_eq!(case.group_sizes[15], 0);
    assert_eq!(case.rows_used(), 180);
    case.validate(Passes::ALL).unwrap();
    // What the memory guard plans shards with, before the case is made.
    assert_eq!(sizes_of(&s), case.group_sizes);
}

/// The original, sequential generator: one stream drawn in order.
fn sequential(spec: &GemmSpec) -> GroupedGemmCase {
    let mut rng = ChaCha8Rng::seed_from_u64(spec.seed);
    let sizes = group_sizes(spec, &mut rng);
    let (m, k, n, g) = (spec.rows(), spec.hidden, spec.ffn, spec.experts);
    let dtype = spec.dtype;
    let value = |scale: f64, rng: &mut ChaCha8Rng| -> f32 {
        let x = unit_range(rng.next_u32());
        round_to(x * scale, dtype, Overflow::Ieee) as f32
    };
    let lhs = ndarray::Array2::from_shape_simple_fn((m, k), || value(1.0, &mut rng));
    let scales: Vec<f64> = (0..g)
        .map(|_| 2f64.powi(rng.random_range(-6..=6)))
        .collect();
    let mut rhs = ndarray::Array3::<f32>::zeros((g, k, n));
    for (e, mut w) in rhs.outer_iter_mut().enumerate() {
        w.mapv_inplace(|_| value(scales[e], &mut rng));
    }
    let dout = ndarray::Array2::from_shape_simple_fn((m, n), || value(1.0, &mut rng));
    GroupedGemmCase {
        lhs,
        rhs: Weights::narrowed(rhs, dtype),
        group_sizes: sizes,
        dout: Some(dout),
        dtype,
        out_dtype: spec.out_dtype,
        tail: spec.tail,
    }
}

/// Seeking chunk by chunk gives the sequential stream's values exactly, for arrays of
/// several parallel chunks and for empty ones, in every input format.
#[test]
fn parallel_generation_is_the_sequential_stream() {
    for (tokens, hidden, ffn, dtype) in [
        (100, 8, 4, Format::F32),
        (3000, 700, 3, Format::F16),
        // bf16 weights of several chunks, made in bf16.
        (1, 1500, 1400, Format::Bf16),
        (0, 5, 0, Format::Bf16),
    ] {
        let s = GemmSpec {
            tokens,
            hidden,
            ffn,
            dtype,
            ..spec()
        };
        let (a, b) = (generate(&s), sequential(&s));
        assert!(a == b, "{tokens} x {hidden} x {ffn} {dtype}");
    }
}

/// The values lie in [-1, 1) on the 2^-23 grid, reach both ends of the words, and are
/// spread over the range; the bulk draw gives the words one at a time would.
#[test]
fn unit_range_covers_minus_one_to_one() {
    assert_eq!(unit_range(0), -1.0);
    assert_eq!(unit_range(u32::MAX), 1.0 - 2f64.powi(-23));
    assert_eq!(unit_range(1 << 31), 0.0);
    let mut a = ChaCha8Rng::seed_from_u64(3);
    let mut b = a.clone();
    let mut words = [0u32; 4000];
    b.fill(&mut words[..]);
    let mut halves = [0usize; 2];
    for w in words {
        assert_eq!(w, a.next_u32());
        let x = unit_range(w);
        assert!((-1.0..1.0).contains(&x) && (x * 2f64.powi(23)).fract() == 0.0);
        halves[usize::from(x >= 0.0)] += 1;
    }
    assert_eq!(a.get_word_pos(), b.get_word_pos());
    assert!(halves.iter().all(|&h| h > 1800), "{halves:?}");
}

#[test]
fn same_seed_same_case() {
    assert_eq!(generate(&spec()), generate(&spec()));
    let mut other = spec();
    other.seed = 8;
    assert_ne!(generate(&spec()), generate(&other));
}

/// Every shard made on its own holds what the whole case holds there (what
/// `GroupedGemmCase::shard` copies out of it), in each input format, with empty experts, a
/// tail, a hot expert and K = 0; the header has the whole case's shapes, sizes, formats,
/// contract and passes, and its arrays are zeros.
#[test]
fn shards_made_alone_are_the_whole_cases_shards() {
    use moecheck_reference::gemm::shard::plan;
    for (dtype, tokens, hidden, ffn) in [
        (Format::Bf16, 100, 8, 4),
        (Format::F32, 300, 33, 5),
        (Format::F16, 50, 0, 3),
    ] {
        let s = GemmSpec {
            dtype,
            tokens,
            hidden,
            ffn,
            ..spec()
        };
        let whole = generate(&s);
        let source = InShards::with(s.clone(), dtype);
        for parts in [1, 3, 16] {
            for shard in plan(&whole, parts) {
                let made = ShardSource::<Gemm>::shard(&source, &shard);
                assert!(made == whole.shard(&shard), "{dtype} {shard} of {parts}");
            }
        }
        let header = ShardSource::<Gemm>::header(&source).unwrap();
        let h = &header.case;
        assert_eq!(header.ask, s.passes);
        assert_eq!((h.m(), h.k(), h.n()), (whole.m(), whole.k(), whole.n()));
        assert_eq!(h.group_sizes, whole.group_sizes);
        assert_eq!(
            (h.dtype, h.out_dtype, h.tail),
            (whole.dtype, whole.out_dtype, whole.tail)
        );
        assert_eq!(h.rhs.shape(), whole.rhs.shape());
        assert_eq!(
            h.dout.as_ref().map(|d| d.dim()),
            whole.dout.as_ref().map(|d| d.dim())
        );
        assert!(h.lhs.iter().all(|v| *v == 0.0) && h.rhs.f32().iter().all(|v| *v == 0.0));
    }
}
