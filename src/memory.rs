//! Size guards: a command that allocates in proportion to its flags estimates the memory it
//! will need and refuses (exit 2, naming the flags and `--allow-large`) when that exceeds what
//! this machine has available, instead of aborting on allocation minutes later.
//!
//! The estimates are per-element costs measured with `/usr/bin/time -f %M` on release builds
//! (2026-12-03 and 2026-12-04), rounded up:
//! * `gemm`, counted per array: the inputs as they are held (4 bytes per element of `lhs` and
//!   `dout`, which the generated case always has, and of `rhs`, 2 with `--dtype bf16`), each
//!   asked output as it is held (4 bytes per element of `out`, `dlhs`, `drhs`; 8 with
//!   `--out-dtype f64`; an `exec:` program that writes float64 for a narrower format is held
//!   in f64, twice this), what the check holds per core while it widens one expert at a time
//!   (`gemm_bytes` spells it out per verification mode), and what the emulated kernel holds
//!   beside its outputs; plus 256 MiB. A case checked in shards of experts
//!   ([`gemm_bytes_sharded`]) counts its largest shard as a case of its own (each shard's
//!   inputs are made for it; the whole case's are never held). Measured in the README's end-to-end runs (release builds, two cores): 64 experts,
//!   M = 4096, K = 2048, N = 1024, three passes, 0.88 GiB (reference) to 1.03 GiB (emulate,
//!   fast); DeepSeek-V3's forward pass (256 experts, M = 32768, K = 7168, N = 2048),
//!   emulate, full, 8.49 GiB; its three passes in shards, the README's table.
//! * `gemm --dtype fp8`: about 55 bytes per element of `lhs`, `rhs` and `out` together (the
//!   FP8 references are held whole), measured with `/usr/bin/time` at 16 experts, M = 2048,
//!   K = 1024, N = 512 (0.63 GB) and 64 experts, M = 4096, K = 2048, N = 1024 (7.76 GB; the
//!   end-to-end runs' 7.18 and 7.25 GiB); the guard counts 64. (Before the comparison with the
//!   unquantised GEMM stopped copying every element, the peaks were 74 bytes per element,
//!   above the 64 counted then.) A case checked in shards of experts
//!   ([`fp8_gemm_bytes_sharded`]) counts its largest shard as a case of its own, and its
//!   whole inputs ([`FP8_INPUTS`]) where the shards are cut from them.
//! * `gemm` through `exec:` or `worker:`: [`external_bytes`] more (the program's own copies of
//!   the case beside it, and for FP8 moecheck's float32 copies of the inputs it writes).
//! * `moe`: about 100 bytes per expert-weight element and 600 per element of `x` (the
//!   per-token copies of the layer's forward and backward), measured at 2048 tokens, hidden
//!   512, 32 experts, ffn 256 (0.94 GB) and 8192 tokens, hidden 128, 8 experts, ffn 64
//!   (0.59 GB).
//!
//! "Available" is the smallest of: the kernel's `MemAvailable`; for this process's cgroup and
//! each cgroup above it, its `memory.max` less its `memory.current` (v1: `limit_in_bytes` less
//! `usage_in_bytes`); and under `ulimit -v` or `ulimit -d` (`RLIMIT_AS`, `RLIMIT_DATA`), the
//! limit less what is mapped now (`VmSize`, `VmData`). A case the guard passes must not then
//! abort on an allocation that one of them refuses.

use std::fs;

use moecheck_reference::format::Format;
use moecheck_reference::gemm::shard::Shard;
use moecheck_reference::gemm::{Passes, Verify};

/// Bytes of memory available to this process, if the machine says.
pub fn available() -> Option<u64> {
    let meminfo = fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| kib_field(&s, "MemAvailable:"));
    [meminfo, cgroup_room(), rlimit_room()]
        .into_iter()
        .flatten()
        .min()
}

/// The `KEY: N kB` field of a `/proc` file, in bytes.
fn kib_field(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb.saturating_mul(1024))
}

/// The least room under a memory limit of this process's cgroup and those above it.
fn cgroup_room() -> Option<u64> {
    let read = |p: &str| fs::read_to_string(p).ok()?.trim().parse::<u64>().ok();
    let room = |dir: &str, max: &str, used: &str| {
        Some(read(&format!("{dir}/{max}"))?.saturating_sub(read(&format!("{dir}/{used}"))?))
    };
    // cgroup v2: `0::/path`; within a cgroup namespace the path is `/`.
    let own = fs::read_to_string("/proc/self/cgroup").ok().and_then(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("0::"))
            .map(|p| p.trim_end_matches('/').to_string())
    });
    let mut rooms = vec![room(
        "/sys/fs/cgroup/memory",
        "memory.limit_in_bytes",
        "memory.usage_in_bytes",
    )];
    let mut path = own.unwrap_or_default();
    loop {
        let dir = format!("/sys/fs/cgroup{path}");
        rooms.push(room(&dir, "memory.max", "memory.current"));
        match path.rfind('/') {
            Some(at) => path.truncate(at),
            None => break,
        }
    }
    rooms.into_iter().flatten().min()
}

/// Room left under `ulimit -v` (the address space) and `ulimit -d` (the data segment).
fn rlimit_room() -> Option<u64> {
    use rustix::process::{getrlimit, Resource};
    let status = fs::read_to_string("/proc/self/status").ok()?;
    [(Resource::As, "VmSize:"), (Resource::Data, "VmData:")]
        .into_iter()
        .filter_map(|(resource, used)| {
            let limit = getrlimit(resource).current?;
            Some(limit.saturating_sub(kib_field(&status, used).unwrap_or(0)))
        })
        .min()
}

/// This process's peak resident memory so far (`VmHWM` in /proc/self/status), when the
/// system says.
pub fn peak_resident() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    kib_field(&status, "VmHWM:")
}

/// `bytes` in GiB, one decimal.
pub fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// The share of the available memory a case may be estimated to need: the estimates are
/// within about 15% of measured peaks, and a case that needs nearly everything gets the machine
/// killed rather than a result.
pub const USABLE: f64 = 0.85;

/// Refuses `need` bytes when more than [`USABLE`] of `available` (unless `allow`): the reason
/// names the flags that set the size and `--allow-large`.
pub fn guard(flags: &str, need: u64, available: Option<u64>, allow: bool) -> Result<(), String> {
    match available {
        Some(have) if !within(need, have, USABLE) && !allow => Err(format!(
            "{flags}: this case needs about {} of memory and {} is available (a case may use {:.0}% of it); make it smaller, or pass --allow-large to try anyway",
            gib(need),
            gib(have),
            USABLE * 100.0
        )),
        _ => Ok(()),
    }
}

/// Whether `need` bytes are at most `share` of `have`.
fn within(need: u64, have: u64, share: f64) -> bool {
    need as f64 <= have as f64 * share
}

/// Whether the guard lets `need` bytes run without `--allow-large`: at most [`USABLE`] of
/// `available`, or the machine does not say.
pub fn fits(need: u64, available: Option<u64>) -> bool {
    available.is_none_or(|have| within(need, have, USABLE))
}

/// The cores this process may use (the checks run on all of them).
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |c| c.get())
}

/// Saturating product of sizes, as bytes.
pub fn elements(dims: &[usize]) -> u64 {
    dims.iter()
        .fold(1u64, |acc, &d| acc.saturating_mul(d as u64))
}

/// The sizes of a grouped GEMM: `M x K` left operand, `G x K x N` weights.
#[derive(Debug, Clone, Copy)]
pub struct GemmSize {
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub groups: usize,
}

/// The estimated peak of `moecheck gemm` (module docs) for `size`, the asked passes, the
/// verification mode and the output format (outputs are held in f32 unless it is f64).
pub fn gemm_bytes(size: GemmSize, passes: Passes, verify: Verify, formats: Formats) -> u64 {
    gemm_bytes_on(cores(), size, passes, verify, formats)
}

/// The input and output formats of a grouped GEMM: bf16 weights are held in bf16, outputs in
/// f32 unless they are f64.
#[derive(Debug, Clone, Copy)]
pub struct Formats {
    pub dtype: Format,
    pub out_dtype: Format,
}

/// [`gemm_bytes`] on a machine with `cores` cores.
fn gemm_bytes_on(
    cores: usize,
    size: GemmSize,
    passes: Passes,
    verify: Verify,
    formats: Formats,
) -> u64 {
    let GemmSize { m, k, n, groups } = size;
    let Formats { dtype, out_dtype } = formats;
    let (mk, gkn, mn) = (
        elements(&[m, k]),
        elements(&[groups, k, n]),
        elements(&[m, n]),
    );
    let kn = elements(&[k, n]);
    let cores = cores as u64;
    let add = |terms: &[u64]| terms.iter().fold(0u64, |a, t| a.saturating_add(*t));
    let mul = |a: u64, b: u64| a.saturating_mul(b);
    let inputs = input_bytes(size, dtype);
    let out_bytes = if out_dtype == Format::F64 { 8 } else { 4 };
    // Elements of the asked outputs.
    let asked = add(&[
        if passes.fwd { mn } else { 0 },
        if passes.dgrad { mk } else { 0 },
        if passes.wgrad { gkn } else { 0 },
    ]);
    let outputs = mul(asked, out_bytes);
    // The check works on one expert at a time per core. Full verification holds, per core,
    // dgrad's transposed weight (an f32 copy, counted at 8 bytes; fwd's weight and wgrad's
    // rows of dout are read in place), a 256-row block of the left operand in f64 (its depth
    // is K for fwd, N for dgrad, the expert's rows, at most M, for wgrad) and the block's
    // values and magnitudes (at most max(K, N) columns). Fast verification holds both operands whole with absolute
    // values, whose rows over the cores are at most all M; per core an expert's chunk sums
    // (`(K, N / 16)` or `(N, K / 16)`, values and absolute values: K·N bytes); and for the
    // whole pass the chunks' projections and magnitudes, 16 bytes per 16 elements of output.
    let depth = k.max(n).max(if passes.wgrad { m } else { 0 }) as u64;
    let check = match verify {
        Verify::Full => mul(
            mul(add(&[kn, mul(256, depth), mul(512, k.max(n) as u64)]), 8),
            cores,
        ),
        Verify::Fast => add(&[mul(mul(kn, 17), cores), mul(add(&[mk, mn]), 16), asked]),
    };
    // The emulated kernel, one pass at a time, writes into its outputs; per core it holds a
    // 256 x 256 panel of partial sums, with bf16 weights one expert's weight widened to f32
    // (fwd, dgrad), and in wgrad copies of an expert's rows of lhs and dout (at most all M).
    let panel = mul(256 * 256 * 4, cores);
    let widened = if dtype == Format::Bf16 {
        mul(mul(kn, 4), cores)
    } else {
        0
    };
    let emulate = [
        (passes.fwd, add(&[widened, panel])),
        (passes.dgrad, add(&[widened, panel])),
        (passes.wgrad, add(&[mul(add(&[mk, mn]), 4), panel])),
    ]
    .into_iter()
    .filter(|(asked, _)| *asked)
    .map(|(_, b)| b)
    .max()
    .unwrap_or(0);
    add(&[inputs, outputs, check, emulate, 256 << 20])
}

/// What a case run by an `exec:` or `worker:` program adds to [`gemm_bytes`]: the program's
/// copies (every input as float32, or at 2 bytes when `compact`, whatever the helper lets it
/// map instead; every asked output at 8 bytes, in case it writes float64), and for FP8 (`fp8`)
/// moecheck's float32 copy of the inputs it writes (a plain grouped GEMM's are written from the
/// case itself, `protocol::Input`). Issue 42's OOM (DS3 fwd through the numpy worker, 24 GB) is below this.
pub fn external_bytes(size: GemmSize, passes: Passes, fp8: bool, compact: bool) -> u64 {
    let (inputs, outputs) = io_elements(size, passes);
    let width = if compact { 2 } else { 4 };
    let copies = if fp8 { 2 } else { 1 };
    (inputs.saturating_mul(width).saturating_mul(copies)).saturating_add(outputs.saturating_mul(8))
}

/// Elements of a grouped GEMM's inputs (`lhs (M, K)`, `rhs (G, K, N)`, `dout (M, N)`) and of
/// the outputs `passes` asks for: what a case directory holds.
pub fn io_elements(size: GemmSize, passes: Passes) -> (u64, u64) {
    let GemmSize { m, k, n, groups } = size;
    let [mk, gkn, mn] = [
        elements(&[m, k]),
        elements(&[groups, k, n]),
        elements(&[m, n]),
    ];
    let asked = [(passes.fwd, mn), (passes.dgrad, mk), (passes.wgrad, gkn)];
    let outputs = asked
        .iter()
        .filter(|(a, _)| *a)
        .fold(0u64, |t, (_, e)| t.saturating_add(*e));
    (mk.saturating_add(gkn).saturating_add(mn), outputs)
}

/// The inputs of a generated grouped GEMM as they are held: `lhs` and `dout` (which the
/// generated case always has, whichever passes are asked) in f32, `rhs` in bf16 when `dtype`
/// is bf16 and in f32 otherwise.
fn input_bytes(size: GemmSize, dtype: Format) -> u64 {
    let GemmSize { m, k, n, groups } = size;
    let rhs_bytes = if dtype == Format::Bf16 { 2 } else { 4 };
    elements(&[m, k])
        .saturating_add(elements(&[m, n]))
        .saturating_mul(4)
        .saturating_add(elements(&[groups, k, n]).saturating_mul(rhs_bytes))
}

/// [`gemm_bytes`] for a case checked a shard of consecutive experts at a time
/// (`moecheck_reference::gemm::shard`, `shards` its plan): what the largest shard holds
/// while it is made, run and checked (its experts, its rows, and for the last one the tail
/// rows), counted as [`gemm_bytes`] counts a whole case. The whole case's inputs are never
/// held: each shard's are made on their own (`pipeline::Generate::shards`). One shard is
/// the whole case.
pub fn gemm_bytes_sharded(
    size: GemmSize,
    passes: Passes,
    verify: Verify,
    formats: Formats,
    shards: &[Shard],
) -> u64 {
    sharded_on(cores(), size, passes, verify, formats, shards)
}

fn sharded_on(
    cores: usize,
    size: GemmSize,
    passes: Passes,
    verify: Verify,
    formats: Formats,
    shards: &[Shard],
) -> u64 {
    if shards.len() <= 1 {
        return gemm_bytes_on(cores, size, passes, verify, formats);
    }
    let largest = shards
        .iter()
        .map(|s| {
            let shard = GemmSize {
                m: s.rows.len(),
                groups: s.experts.len(),
                ..size
            };
            gemm_bytes_on(cores, shard, passes, verify, formats)
        })
        .max()
        .unwrap_or(0);
    largest
}

/// The share of the available memory a case checked in shards is planned to need: the
/// fewest shards under it are used (more shards cost little, and leave the machine room).
pub const SHARDED_SHARE: f64 = 0.5;

/// How many shards `moecheck gemm` checks a case in when it may choose: 1 when the whole case
/// fits the guard ([`USABLE`] of `available`, or the machine does not say); otherwise the
/// fewest (at most `groups`) whose estimate `need(parts)` is at most [`SHARDED_SHARE`] of
/// `available`, or else at most [`USABLE`] of it, or else `groups` (which the guard refuses).
///
/// `need` is taken to fall as the shards grow: the search tries 1, 2, 4, … shards and then
/// halves the last gap, so a case of many experts costs a few dozen plans, not one per count.
pub fn shards_for(available: Option<u64>, groups: usize, need: impl Fn(usize) -> u64) -> usize {
    let Some(have) = available else {
        return 1;
    };
    let under = |share: f64| fewest_shards(groups, |p| within(need(p), have, share));
    if within(need(1), have, USABLE) {
        return 1;
    }
    under(SHARDED_SHARE)
        .or_else(|| under(USABLE))
        .unwrap_or(groups)
}

/// The fewest shards (at most `groups`) for which `fits`, taken to hold from some count on:
/// 1, 2, 4, … and then the last gap halved, so a case of many experts costs a few dozen
/// plans. `None` when not even `groups` shards fit.
pub fn fewest_shards(groups: usize, fits: impl Fn(usize) -> bool) -> Option<usize> {
    let groups = groups.max(1);
    let (mut lo, mut hi) = (0, 1);
    while !fits(hi) {
        if hi == groups {
            return None;
        }
        lo = hi;
        hi = (hi * 2).min(groups);
    }
    // `lo` does not fit (or is 0), `hi` does: the fewest is in between.
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Some(hi)
}

/// What one shard of a grouped GEMM is planned to hold at most ([`gemm_bytes_sharded`] of
/// its plan), unless its largest expert alone holds more; a case estimated above it is
/// checked in shards by default even when it would fit whole (an in-process model's). The
/// memory a shard uses is touched for the first time once and reused by the shards after
/// it, and first touches cost more than the arithmetic on them on these machines, by an
/// amount that varies from hour to hour (the kernel clears each fresh page, and the host
/// backs it). DeepSeek-V3's three passes, `--impl emulate`, two cores (release builds,
/// 2026-12-05): `--verify full` in 8 shards 68.1 s with 23.8 s of system time (3.1 GiB
/// peak), in 24 shards 66.5 s with 0.9 s (1.4 GiB); `--verify fast` in 16, 29 and 64 shards
/// 48.7, 50.0 and 51.5 s, in 60 (what this gives) 51.7 s. Its forward pass alone, fast
/// (8.8 GiB whole, which fits): whole 32.8 s with 20.4 s of system time, in 8 shards 24.5 s
/// (0.8 s, 1.9 GiB), in 32 shards 24.9 s (0.4 s, 0.8 GiB).
pub const GEMM_SHARD_BYTES: u64 = 2 << 30;

/// Whether a grouped GEMM estimated to need `need` bytes is checked whole by default: when it
/// is no larger than one shard ([`GEMM_SHARD_BYTES`]) and fits in `available`.
pub fn whole_by_default(need: u64, available: Option<u64>) -> bool {
    need <= GEMM_SHARD_BYTES && fits(need, available)
}

/// What one shard of an FP8 case is planned to hold at most ([`fp8_gemm_bytes`] of its
/// experts): its references are held whole, and memory touched for the first time costs
/// more than the arithmetic on it here (the kernel clears each fresh page), so an FP8 case
/// is checked in shards of about this size whenever it may be (`moecheck gemm`). On 64
/// experts, M = 4096, K = 2048, N = 1024, `--dtype fp8`, two cores: whole 42.2 s and 7.0 GiB;
/// 4 shards 13.0 s, 16 shards 12.3 s (0.9 GiB), 64 shards 14.0 s.
pub const FP8_SHARD_BYTES: u64 = 512 << 20;

/// Experts per core an FP8 shard keeps at least, when memory allows: the experts of a shard
/// run in parallel, so a shard of one expert (DeepSeek-V3's are 1 GB each by
/// [`fp8_gemm_bytes`]) would leave every core but one idle.
pub const FP8_EXPERTS_PER_CORE: usize = 2;

/// Whether a case of `size` is refused whatever its shards: its inputs alone are above
/// [`USABLE`] of `available`. A run in shards does not hold them, but it allocates them
/// (untouched) for the whole case's description, which the kernel may refuse beyond its
/// memory; and some cases' shards are cut from their whole inputs (an FP8 case under
/// delayed scaling, a kernel run on the whole case).
pub fn inputs_too_large(size: GemmSize, dtype: Format, available: Option<u64>) -> bool {
    !fits(input_bytes(size, dtype), available)
}

/// The estimated peak of `moecheck gemm --dtype fp8` (module docs).
pub fn fp8_gemm_bytes(m: usize, k: usize, n: usize, groups: usize) -> u64 {
    let per = elements(&[m, k])
        .saturating_add(elements(&[groups, k, n]))
        .saturating_add(elements(&[m, n]));
    per.saturating_mul(64).saturating_add(64 << 20)
}

/// How an FP8 case's inputs are held: `lhs` and `dout` in f32, `rhs` in bf16 (the generated
/// weights are bf16 values, `crate::generate::fp8`).
pub const FP8_INPUTS: Format = Format::Bf16;

/// [`fp8_gemm_bytes`] for a case checked a shard of consecutive experts at a time (`shards`
/// its plan): the largest shard counted as a case of its own, and the whole case's inputs
/// when its shards are cut from them (`whole_inputs`: the generator cannot make a shard on
/// its own, as under delayed scaling, whose scales come from the whole case). One shard (or
/// none planned) is the whole case.
pub fn fp8_gemm_bytes_sharded(size: GemmSize, shards: &[Shard], whole_inputs: bool) -> u64 {
    let GemmSize { m, k, n, groups } = size;
    if shards.len() <= 1 {
        return fp8_gemm_bytes(m, k, n, groups);
    }
    let largest = shards
        .iter()
        .map(|s| fp8_gemm_bytes(s.rows.len(), k, n, s.experts.len()))
        .max()
        .unwrap_or(0);
    let inputs = if whole_inputs {
        input_bytes(size, FP8_INPUTS)
    } else {
        0
    };
    inputs.saturating_add(largest)
}

/// [`fp8_gemm_bytes_sharded`] for an implementation that runs on the whole case (a kernel under
/// test) while its
/// outputs are checked a shard at a time (`pipeline_sharded::run_whole_checked_in_shards`): the whole
/// case's inputs, every output of the whole case at 8 bytes an element (written as f32 or f64,
/// and the copies made of them on the way), 12 bytes per weight element for the copies of the
/// weights that the implementation's host side makes (the `cuda` FP8 path widens them to f32
/// and flattens them, 8; `emulate` keeps f32 rows, decoded values and codes, about 10), and the
/// largest shard's check. One shard (or none planned) is the whole case.
pub fn fp8_kernel_bytes_sharded(size: GemmSize, shards: &[Shard]) -> u64 {
    let GemmSize { m, k, n, groups } = size;
    if shards.len() <= 1 {
        return fp8_gemm_bytes(m, k, n, groups);
    }
    let outputs = elements(&[m, n])
        .saturating_add(elements(&[m, k]))
        .saturating_add(elements(&[groups, k, n]))
        .saturating_mul(8);
    let weight_copies = elements(&[groups, k, n]).saturating_mul(12);
    fp8_gemm_bytes_sharded(size, shards, true)
        .saturating_add(outputs)
        .saturating_add(weight_copies)
}

/// The estimated peak of `moecheck moe` (module docs).
pub fn moe_bytes(tokens: usize, hidden: usize, experts: usize, ffn: usize, shared: usize) -> u64 {
    let weights =
        elements(&[2, experts, hidden, ffn]).saturating_add(elements(&[2, hidden, shared]));
    weights
        .saturating_mul(100)
        .saturating_add(elements(&[tokens, hidden]).saturating_mul(600))
        .saturating_add(elements(&[tokens, experts]).saturating_mul(64))
        .saturating_add(64 << 20)
}

#[cfg(test)]
#[path = "memory_tests.rs"]
mod tests;
