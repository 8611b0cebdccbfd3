//! Fuzzing the log readers: every log in `fixtures/curves/` (the generator script aside),
//! mutated — bits flipped, cut short, random bytes inserted, lines duplicated, numbers replaced
//! by huge ones or by NaN/inf text — and read with every explicit `--format` and with
//! detection. Reading may refuse (exit 2 in the CLI); it must never panic. A log that reads
//! is also compared with itself and with its unmutated fixture (`diff`) and plotted, so what a
//! reader lets through cannot panic further on. TensorBoard files are re-framed after most
//! mutations (their checksums recomputed) so that the protobuf decoder, not the checksum,
//! meets the mutated bytes.
//!
//! Deterministic: a fixed seed and a fixed number of cases ([`CASES`], whatever
//! `PROPTEST_CASES` says): 25–40 s in the test profile on two busy cores, most of it drawing
//! the plots of the logs that read. A failure is shrunk and saved beside this file
//! (`fuzz_readers.proptest-regressions`, to be committed). See: issue 16.

use std::path::{Path, PathBuf};

use moecheck_curves::diff::{diff, Criterion};
use moecheck_curves::plot::{render, Kind};
use moecheck_curves::{crc32c, read, Curve, LogFormat, Metric};
use proptest::prelude::*;
use proptest::test_runner::{FileFailurePersistence, RngSeed};

/// Mutated logs tried per run.
const CASES: u32 = 384;
/// Mutations applied to one log, at most.
const MAX_MUTATIONS: usize = 4;
/// The seed of every run.
const SEED: u64 = 16;

/// Texts a number is replaced by: beyond u64 and f64, below the smallest subnormal, signed
/// zero, non-finite spellings, absurdly long digit strings.
const HUGE: [&str; 14] = [
    "18446744073709551616",
    "9223372036854775808",
    "-9223372036854775809",
    "1e309",
    "-1e309",
    "1e-400",
    "-0",
    "NaN",
    "nan",
    "inf",
    "-Infinity",
    "1.7976931348623157e308",
    "99999999999999999999999999999999999999999999999999999999999999999999999999999999",
    "0.00000000000000000000000000000000000000000000000000000000000000000000000000000001",
];

fn fixtures() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_none_or(|x| x != "py") {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    walk(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/curves"),
        &mut out,
    );
    out.sort();
    out
}

/// One change to a log's bytes; positions are fractions of its length (in 1/65536), so any
/// mutation fits any log, also one shortened by an earlier mutation.
#[derive(Debug, Clone)]
enum Mutation {
    FlipBit { at: u16, bit: u8 },
    Truncate { at: u16 },
    Insert { at: u16, bytes: Vec<u8> },
    DuplicateLine { at: u16, times: u8 },
    ReplaceNumber { at: u16, with: usize },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        3 => (any::<u16>(), 0u8..8).prop_map(|(at, bit)| Mutation::FlipBit { at, bit }),
        1 => any::<u16>().prop_map(|at| Mutation::Truncate { at }),
        2 => (any::<u16>(), prop::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(at, bytes)| Mutation::Insert { at, bytes }),
        2 => (any::<u16>(), 1u8..4).prop_map(|(at, times)| Mutation::DuplicateLine { at, times }),
        3 => (any::<u16>(), 0..HUGE.len()).prop_map(|(at, with)| Mutation::ReplaceNumber { at, with }),
    ]
}

/// A mutated log: which fixture, the mutations in order, and whether to recompute the
/// TFRecord checksums afterwards.
#[derive(Debug, Clone)]
struct Case {
    fixture: usize,
    mutations: Vec<Mutation>,
    reframe: bool,
}

fn case(fixtures: usize) -> impl Strategy<Value = Case> {
    (
        0..fixtures,
        prop::collection::vec(mutation(), 1..=MAX_MUTATIONS),
        prop::bool::weighted(0.8),
    )
        .prop_map(|(fixture, mutations, reframe)| Case {
            fixture,
            mutations,
            reframe,
        })
}

fn index(at: u16, len: usize) -> usize {
    (at as usize * (len + 1)) >> 16
}

fn apply(m: &Mutation, b: &mut Vec<u8>) {
    match m {
        Mutation::FlipBit { at, bit } => {
            if !b.is_empty() {
                let i = index(*at, b.len() - 1);
                b[i] ^= 1 << bit;
            }
        }
        Mutation::Truncate { at } => b.truncate(index(*at, b.len())),
        Mutation::Insert { at, bytes } => {
            let i = index(*at, b.len());
            b.splice(i..i, bytes.iter().copied());
        }
        Mutation::DuplicateLine { at, times } => {
            let i = index(*at, b.len());
            let start = b[..i]
                .iter()
                .rposition(|&c| c == b'\n')
                .map_or(0, |p| p + 1);
            let end = b[i..]
                .iter()
                .position(|&c| c == b'\n')
                .map_or(b.len(), |p| i + p + 1);
            let line = b[start..end].to_vec();
            for _ in 0..*times {
                b.splice(end..end, line.iter().copied());
            }
        }
        Mutation::ReplaceNumber { at, with } => {
            let i = index(*at, b.len());
            let number =
                |c: u8| c.is_ascii_digit() || matches!(c, b'.' | b'e' | b'E' | b'+' | b'-');
            let Some(d) = b[i..].iter().position(u8::is_ascii_digit).map(|p| i + p) else {
                b.splice(i..i, HUGE[*with].bytes());
                return;
            };
            let start = b[..d]
                .iter()
                .rposition(|&c| !number(c))
                .map_or(0, |p| p + 1);
            let end = b[d..]
                .iter()
                .position(|&c| !number(c))
                .map_or(b.len(), |p| d + p);
            b.splice(start..end, HUGE[*with].bytes());
        }
    }
}

/// Recomputes the masked CRC-32C of every record's length and data, as far as the lengths
/// lead, so that mutated payloads pass the framing checks.
fn reframe(b: &mut [u8]) {
    let masked = |d: &[u8]| crc32c(d).rotate_right(15).wrapping_add(0xa282_ead8);
    let mut at = 0usize;
    while at + 12 <= b.len() {
        let crc = masked(&b[at..at + 8]);
        b[at + 8..at + 12].copy_from_slice(&crc.to_le_bytes());
        let len = u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
        let Some(end) = usize::try_from(len)
            .ok()
            .and_then(|l| (at + 12).checked_add(l))
        else {
            return;
        };
        if end + 4 > b.len() {
            return;
        }
        let crc = masked(&b[at + 12..end]);
        b[end..end + 4].copy_from_slice(&crc.to_le_bytes());
        at = end + 4;
    }
}

/// What a reader let through, taken further: precision, diff against itself and against the
/// unmutated log, and both plots of each diff that succeeds.
fn exercise(c: &Curve, original: Option<&Curve>) {
    for m in Metric::ALL {
        let _ = c.precision(m);
    }
    for w in &c.warnings {
        let _ = w.to_string();
    }
    let others = [Some(c), original].into_iter().flatten();
    for other in others {
        for (base, test) in [(other, c), (c, other)] {
            for exact in [false, true] {
                let crit = Criterion {
                    exact,
                    ..Criterion::default()
                };
                if let Ok(d) = diff(base, test, &[], Metric::Loss, &crit) {
                    let _ = moecheck_curves::render::text(&d.report);
                    if !exact {
                        let _ = render(&d, Kind::Svg);
                        let _ = render(&d, Kind::Png);
                    }
                }
            }
        }
    }
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: CASES,
        rng_seed: RngSeed::Fixed(SEED),
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    /// No mutated log makes a reader — or what follows reading — panic.
    #[test]
    fn mutated_logs_never_panic_a_reader(c in case(fixtures().len())) {
        let fixture = &fixtures()[c.fixture];
        let mut bytes = std::fs::read(fixture).unwrap();
        for m in &c.mutations {
            apply(m, &mut bytes);
        }
        if c.reframe && fixture.to_string_lossy().contains("tfevents") {
            reframe(&mut bytes);
        }
        let original = read(fixture, None).ok();
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(fixture.file_name().unwrap());
        std::fs::write(&p, &bytes).unwrap();
        for format in std::iter::once(None).chain(LogFormat::ALL.map(Some)) {
            if let Ok(curve) = read(&p, format) {
                exercise(&curve, original.as_ref());
            }
        }
    }
}
