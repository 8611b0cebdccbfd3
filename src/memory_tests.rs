use super::*;

const BF16_F32: Formats = Formats {
    dtype: Format::Bf16,
    out_dtype: Format::F32,
};
const BF16_F64: Formats = Formats {
    dtype: Format::Bf16,
    out_dtype: Format::F64,
};
/// DeepSeek-V3's expert GEMM at 4096 tokens × top-8.
const DS: GemmSize = GemmSize {
    m: 32768,
    k: 7168,
    n: 2048,
    groups: 256,
};

/// [`DS`] in `p` shards, its experts of 128 rows each.
fn even_plan(p: usize) -> Vec<Shard> {
    moecheck_reference::gemm::shard::plan_sizes(&[128; 256], DS.m, DS.k, DS.n, p)
}

#[test]
fn estimates_cover_the_measured_peaks() {
    // Measured peaks (module docs, two cores) are below the estimates, and not far below.
    let g = fp8_gemm_bytes(2048, 1024, 512, 16);
    assert!(g > 632_000_000 && g < 900_000_000, "{g}");
    let g = fp8_gemm_bytes(4096, 2048, 1024, 64);
    assert!(g > 7_760_000_000 && g < 10_000_000_000, "{g}");
    let size = |m, k, n, groups| GemmSize { m, k, n, groups };
    let mid = size(4096, 2048, 1024, 64);
    let g = gemm_bytes_on(2, mid, Passes::ALL, Verify::Full, BF16_F32);
    assert!(g > 980_000_000 && g < 1_600_000_000, "{g}");
    let fast = gemm_bytes_on(2, mid, Passes::ALL, Verify::Fast, BF16_F32);
    assert!(fast > 1_130_000_000 && fast < 1_800_000_000, "{fast}");
    // Forward alone holds no dlhs or drhs (0.57 GB in f32).
    let fwd = gemm_bytes_on(2, mid, Passes::FWD, Verify::Full, BF16_F32);
    assert!(fwd < g - 500_000_000, "{fwd}");
    // f64 outputs are held in f64: twice the outputs' bytes.
    let wide = gemm_bytes_on(2, mid, Passes::ALL, Verify::Full, BF16_F64);
    assert_eq!(wide - g, 4 * (4096 * 1024 + 4096 * 2048 + 64 * 2048 * 1024));
    // f32 weights are held in f32: twice the weights' bytes (emulate's largest pass here,
    // wgrad, widens no weight).
    let f32_in = Formats {
        dtype: Format::F32,
        out_dtype: Format::F32,
    };
    let narrow = gemm_bytes_on(2, mid, Passes::ALL, Verify::Full, f32_in);
    assert_eq!(narrow - g, 2 * 64 * 2048 * 1024);
    // Forward alone, f32 weights are widened by no one: the bf16 case widens one per core.
    let fwd32 = gemm_bytes_on(2, mid, Passes::FWD, Verify::Full, f32_in);
    assert_eq!(fwd32 - fwd, 2 * 64 * 2048 * 1024 - 2 * 4 * 2048 * 1024);
    // DeepSeek-V3's forward pass ran at a 9.38 GB (8.74 GiB) peak, verified in full, and
    // at 9.12 GB (8.49 GiB) in the README's latest run.
    let ds = gemm_bytes_on(2, DS, Passes::FWD, Verify::Full, BF16_F32);
    // More cores hold more experts at once.
    assert!(gemm_bytes_on(16, DS, Passes::FWD, Verify::Full, BF16_F32) > ds);
    assert!(ds > 9_390_000_000 && ds < 12_000_000_000, "{ds}");
    let m = moe_bytes(2048, 512, 32, 256, 0);
    assert!(m > 941_000_000 && m < 2_000_000_000, "{m}");
    let m = moe_bytes(8192, 128, 8, 64, 0);
    assert!(m > 588_000_000 && m < 1_000_000_000, "{m}");
}

#[test]
fn shards_hold_only_the_largest_shard() {
    use moecheck_reference::gemm::shard::plan_sizes;
    // Even experts of 128 rows each.
    let even = vec![128; 256];
    let full = |sizes: &[usize], p| {
        let plan = plan_sizes(sizes, DS.m, DS.k, DS.n, p);
        sharded_on(2, DS, Passes::ALL, Verify::Full, BF16_F32, &plan)
    };
    let whole = gemm_bytes_on(2, DS, Passes::ALL, Verify::Full, BF16_F32);
    assert_eq!(full(&even, 1), whole);
    // lhs and dout in f32, 256 bf16 weights of 7168 x 2048: 8.73 GB, never held whole in
    // shards: each halving of the shards' size takes about half of the estimate.
    let inputs = input_bytes(DS, Format::Bf16);
    assert_eq!(inputs, (32768 * (7168 + 2048)) * 4 + 256 * 7168 * 2048 * 2);
    for p in [2, 4, 8, 16] {
        let (a, b) = (full(&even, p), full(&even, 2 * p));
        assert!(b < a && b as f64 > a as f64 * 0.4, "{p}: {a} -> {b}");
    }
    // Sixteen shards of DeepSeek-V3's three passes: a sixteenth of the inputs and outputs,
    // and what the check and the emulation hold beside them (2.1 GiB measured, fast).
    let sixteen = full(&even, 16);
    assert!(sixteen < whole / 8 && sixteen > inputs / 16, "{sixteen}");
    // One hot expert with half the rows: its shard is counted with them.
    let mut hot = vec![64; 256];
    hot[100] = 16384;
    hot[0] = 128;
    assert_eq!(hot.iter().sum::<usize>(), 32768);
    assert!(full(&hot, 16) > sixteen + 4 * 16384 * (7168 + 2048) as u64);
    // One expert a shard: an expert and its rows.
    assert!(full(&even, 256) < 1_000_000_000);
}

#[test]
fn shards_are_the_fewest_that_leave_room() {
    let gb = 1u64 << 30;
    // 10 GiB of inputs and 16 GiB of the rest, split evenly.
    let need = |p: usize| 10 * gb + 16 * gb / p as u64;
    // Fits whole: one shard.
    assert_eq!(shards_for(Some(64 * gb), 256, need), 1);
    assert_eq!(shards_for(None, 256, need), 1);
    // 24 GiB: half of it, 12 GiB, needs 8 shards (12 GiB exactly).
    assert_eq!(shards_for(Some(24 * gb), 256, need), 8);
    // 20 GiB: nothing under half (10 GiB), the fewest under 85% (17 GiB): 3.
    assert_eq!(shards_for(Some(20 * gb), 256, need), 3);
    // Nothing fits: every expert its own shard, for the guard to refuse.
    assert_eq!(shards_for(Some(8 * gb), 256, need), 256);
    // Never more shards than experts.
    assert_eq!(shards_for(Some(20 * gb), 2, need), 2);
    // Many experts: a few dozen estimates, not one per count.
    let calls = std::cell::Cell::new(0);
    let counted = |p: usize| {
        calls.set(calls.get() + 1);
        need(p)
    };
    assert_eq!(shards_for(Some(24 * gb), 100_000_000, counted), 8);
    assert!(calls.get() < 64, "{}", calls.get());
    // The fewest, between powers of two: 10 GiB + 16 GiB / p under 12.5 GiB needs 7.
    let need_half = |p: usize| 10 * gb + 16 * gb / p as u64;
    assert_eq!(shards_for(Some(25 * gb), 256, need_half), 7);
}

#[test]
fn inputs_that_cannot_fit_are_known_without_a_plan() {
    let gb = 1u64 << 30;
    let huge = GemmSize {
        m: 1024,
        k: 7000,
        n: 7000,
        groups: 100_000_000,
    };
    assert!(inputs_too_large(huge, Format::Bf16, Some(24 * gb)));
    assert!(!inputs_too_large(huge, Format::Bf16, None));
    let small = GemmSize { groups: 8, ..huge };
    assert!(!inputs_too_large(small, Format::Bf16, Some(24 * gb)));
}

#[test]
fn the_guard_refuses_only_above_what_is_available() {
    let gb = 1u64 << 30;
    assert!(guard("--tokens", 2 * gb, Some(gb), false)
        .unwrap_err()
        .contains("--tokens: this case needs about 2.0 GiB of memory and 1.0 GiB is available"));
    assert!(guard("--tokens", 2 * gb, Some(gb), true).is_ok());
    assert!(guard("--tokens", gb, Some(2 * gb), false).is_ok());
    // Nearly all of it is refused too: the estimate is not exact.
    assert!(guard("--tokens", 95 * gb / 100, Some(gb), false).is_err());
    assert!(guard("--tokens", u64::MAX, None, false).is_ok());
    assert_eq!(elements(&[usize::MAX, 4]), u64::MAX);
    assert!(available().is_some_and(|a| a > 0));
}

/// An FP8 implementation run whole and checked in shards holds the whole case's inputs and
/// outputs, its host copies of the weights, and the largest shard's check: DeepSeek-V3's case
/// (refused whole on the H200's 125 GiB at 242 GiB) fits there in 16 shards, not in 8; one
/// shard is the whole estimate.
#[test]
fn a_whole_fp8_run_checked_in_shards_holds_the_outputs_once() {
    assert_eq!(
        fp8_kernel_bytes_sharded(DS, &even_plan(1)),
        fp8_gemm_bytes(DS.m, DS.k, DS.n, DS.groups)
    );
    assert!(fp8_gemm_bytes(DS.m, DS.k, DS.n, DS.groups) > 240 << 30);
    let outputs = 8 * (32768 * 2048 + 32768 * 7168 + 256 * 7168 * 2048);
    let weight_copies = 12 * 256 * 7168 * 2048;
    for p in [2, 16, 128] {
        assert_eq!(
            fp8_kernel_bytes_sharded(DS, &even_plan(p)),
            fp8_gemm_bytes_sharded(DS, &even_plan(p), true) + outputs + weight_copies,
            "{p}"
        );
    }
    let h200 = Some(124_800 << 20);
    assert!(!fits(fp8_kernel_bytes_sharded(DS, &even_plan(8)), h200));
    assert!(fits(fp8_kernel_bytes_sharded(DS, &even_plan(16)), h200));
}

/// An FP8 case whose shards are made on their own holds its largest shard's check alone;
/// one whose shards are cut from the whole case holds its inputs too (bf16 weights, f32
/// `lhs` and `dout`: DeepSeek-V3's 8.7 GB); one shard is the whole estimate either way.
#[test]
fn fp8_shards_made_alone_hold_no_whole_inputs() {
    let whole = fp8_gemm_bytes(DS.m, DS.k, DS.n, DS.groups);
    for held in [false, true] {
        assert_eq!(fp8_gemm_bytes_sharded(DS, &even_plan(1), held), whole);
    }
    let inputs = 2 * 256 * 7168 * 2048 + 4 * (32768 * 7168 + 32768 * 2048);
    assert!(inputs > 8_600_000_000);
    let shard = fp8_gemm_bytes(32768 / 64, DS.k, DS.n, 4);
    assert_eq!(fp8_gemm_bytes_sharded(DS, &even_plan(64), false), shard);
    assert_eq!(
        fp8_gemm_bytes_sharded(DS, &even_plan(64), true),
        shard + inputs
    );
}

/// A case is checked whole by default only when it is at most one shard's 2 GiB and fits:
/// the mid-size case (about 0.9 GiB) whole, DeepSeek-V3's forward pass (about 9 GiB, which
/// fits in 24 GiB) in shards, and nothing whole that does not fit.
#[test]
fn only_a_case_of_one_shards_size_is_checked_whole_by_default() {
    let machine = Some(24 << 30);
    let size = |m, k, n, groups| GemmSize { m, k, n, groups };
    let mid = gemm_bytes(
        size(4096, 2048, 1024, 64),
        Passes::ALL,
        Verify::Full,
        BF16_F32,
    );
    assert!(mid < GEMM_SHARD_BYTES && whole_by_default(mid, machine));
    let fwd = gemm_bytes(DS, Passes::FWD, Verify::Fast, BF16_F32);
    assert!(fits(fwd, machine) && !whole_by_default(fwd, machine));
    assert!(!whole_by_default(mid, Some(mid / 2)));
    assert!(whole_by_default(GEMM_SHARD_BYTES, None));
    assert!(!whole_by_default(GEMM_SHARD_BYTES + 1, None));
}

/// Issue 42, item 14: DeepSeek-V3's forward pass through the numpy worker (`--verify fast`)
/// passed the guard and was OOM-killed at 24 GB; with what the external path holds counted,
/// the estimate is above that.
#[test]
fn an_external_program_s_copies_are_counted() {
    let fwd = Passes::FWD;
    let inside = gemm_bytes_on(2, DS, fwd, Verify::Fast, BF16_F32);
    let external = inside + external_bytes(DS, fwd, false, false);
    assert!(inside < 24 << 30, "{}", gib(inside));
    assert!(external > 24 << 30, "{}", gib(external));
    // Each asked output adds its 8 bytes per element.
    let all = external_bytes(DS, Passes::ALL, false, false) - external_bytes(DS, fwd, false, false);
    assert_eq!(all, (32768 * 7168 + 256 * 7168 * 2048) * 8);
    // An FP8 case adds moecheck's float32 copy of its inputs (a plain one writes them from
    // the case itself).
    let inputs = (32768 * 7168 + 256 * 7168 * 2048 + 32768 * 2048) * 4;
    assert_eq!(
        external_bytes(DS, fwd, true, false) - external_bytes(DS, fwd, false, false),
        inputs
    );
    // Compact inputs: the program holds them at 2 bytes.
    assert_eq!(
        external_bytes(DS, fwd, false, false) - external_bytes(DS, fwd, false, true),
        inputs / 2
    );
}
