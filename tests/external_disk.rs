//! The disk a case directory of an `exec:` run needs (`moecheck::disk`): the estimate made
//! before anything is written covers what the directory holds once the program has written its
//! outputs.

mod common;

use moecheck::memory::GemmSize;
use moecheck_reference::gemm::Passes;

/// 8 experts, 512 tokens top-2 (M = 1024), K = 512, N = 256, three passes, through the numpy
/// adapter, which then measures its own case directory (inputs, case.json and the outputs it
/// wrote). The estimate counts outputs at 8 bytes and the adapter writes float32, so the
/// estimate is above the measurement but within twice it.
#[test]
fn case_directory_estimate_covers_the_written_directory() {
    let dir = tempfile::tempdir().unwrap();
    let size_file = dir.path().join("size.txt");
    let cmd = format!(
        "exec:f() {{ python3 examples/adapters/numpy_grouped_gemm.py \"$1\" && du -sb --apparent-size \"$1\" > '{}'; }}; f",
        size_file.display()
    );
    common::moecheck()
        .args([
            "gemm",
            "--experts",
            "8",
            "--tokens",
            "512",
            "--hidden",
            "512",
            "--ffn",
            "256",
            "--dtype",
            "f32",
            "--impl",
            &cmd,
        ])
        .assert()
        .code(0);
    let text = std::fs::read_to_string(&size_file).unwrap();
    let measured: u64 = text.split_whitespace().next().unwrap().parse().unwrap();
    let size = GemmSize {
        m: 1024,
        k: 512,
        n: 256,
        groups: 8,
    };
    let estimate = moecheck::disk::gemm_case_bytes(size, Passes::ALL, false, false);
    // Inputs 7.3 MB and outputs 7.3 MB at float32: the directory is at least 14 MB.
    assert!(measured > 14_000_000, "{measured}");
    assert!(
        measured <= estimate && estimate <= 2 * measured + (1 << 20),
        "measured {measured}, estimated {estimate}"
    );
}
