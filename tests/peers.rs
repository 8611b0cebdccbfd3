//! Third-party grouped GEMMs ("peers") checked through their adapters in worker mode, each under
//! the contract its adapter declares (README "Compatibility with peers"): JAX's Pallas megablox
//! `gmm` (interpret mode on CPU) and tokamax's `ragged_dot`. Small cases: JAX's import and
//! compilation are most of each run's few seconds.

use assert_cmd::Command;
use predicates::prelude::*;

mod common;
use common::{with_defaults, SMALL_GEMM};

const MEGABLOX: &str = "worker:python3 examples/adapters/jax_megablox_gmm.py";
const TOKAMAX: &str = "worker:python3 examples/adapters/tokamax_ragged_dot.py";

/// `moecheck gemm` on the small case (six experts, two empty, a dropped tail), where a flag
/// given in `extra` replaces the default of the same name.
fn gemm(extra: &[&str]) -> Command {
    with_defaults(&["gemm"], &SMALL_GEMM, extra)
}

/// megablox under its contract: `--tail ignored` (it never writes rows past sum(group_sizes)),
/// and bf16 outputs for bf16 inputs (its VJP returns the gradients in the inputs' dtype).
#[test]
fn megablox_gmm_passes_under_its_declared_contract() {
    for (dtype, out) in [("f32", "f32"), ("bf16", "bf16")] {
        let args = [
            "--impl",
            MEGABLOX,
            "--dtype",
            dtype,
            "--out-dtype",
            out,
            "--tail",
            "ignored",
        ];
        gemm(&args)
            .assert()
            .code(0)
            .stdout(predicate::str::contains("implementation: worker:python3"))
            .stdout(predicate::str::contains("NOT CHECKED (--tail ignored)"))
            .stdout(predicate::str::contains("verdict: PASS"));
    }
}

/// Without `--tail ignored` only the tail rows fail (NaN: never written), and the report says
/// which flag declares that.
#[test]
fn megablox_gmm_without_tail_ignored_fails_on_the_tail_and_names_the_flag() {
    gemm(&["--impl", MEGABLOX, "--dtype", "f32"])
        .assert()
        .code(1)
        .stdout(predicate::str::contains("tail element(s) not 0"))
        .stdout(predicate::str::contains("expert group(s) outside the bound").not())
        .stdout(predicate::str::contains("declare --tail ignored"))
        .stdout(predicate::str::contains("verdict: FAIL"));
}

/// megablox raises on K = 0; the adapter refuses the case with a one-line reason instead:
/// not applicable, exit 2.
#[test]
fn megablox_gmm_refuses_k_zero_with_a_reason() {
    gemm(&[
        "--impl", MEGABLOX, "--dtype", "f32", "--tail", "ignored", "--hidden", "0",
    ])
    .assert()
    .code(2)
    .stdout(predicate::str::contains("refused the case: K = 0"))
    .stdout(predicate::str::contains("verdict: NOT APPLICABLE"));
}

/// tokamax's `ragged_dot` (implementation "xla") under its contract: bf16 outputs for bf16
/// inputs (its VJP returns the inputs' dtype); the default tail contract holds.
#[test]
fn tokamax_ragged_dot_passes_under_its_declared_contract() {
    for (dtype, out) in [("f32", "f32"), ("bf16", "bf16")] {
        gemm(&["--impl", TOKAMAX, "--dtype", dtype, "--out-dtype", out])
            .assert()
            .code(0)
            .stdout(predicate::str::contains("implementation: worker:python3"))
            .stdout(predicate::str::contains("tail rows must be exactly 0"))
            .stdout(predicate::str::contains("verdict: PASS"));
    }
}
