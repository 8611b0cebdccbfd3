//! A benchmark, not a test: the same grouped-GEMM cases through `exec:CMD` (a process per
//! case, protocol v1) and through `worker:CMD` (one process for all of them, protocol v2),
//! each through one implementation built by the registry, as a property campaign drives it.
//!
//! ```sh
//! cargo build --example worker_bench && target/debug/examples/worker_bench [CASES] [ADAPTER]
//! ```
//!
//! (A debug build is enough: nearly all the time is the Python side, and the README's table
//! was measured so.)
//!
//! Defaults: 64 cases, `examples/adapters/jax_ragged_dot.py`. Each case: 4 experts (one
//! empty), 16 tokens, top-2 (M = 32), K = 16, N = 8, f32, all three passes, a different seed
//! (so different group sizes and values; the shape, and so JAX's compilation, is the same).
//! Prints the seconds of each mode, the cases that passed, and the ratio.

use std::time::Instant;

use moecheck::generate::gemm::{generate, GemmSpec, Spread};
use moecheck::reference::format::Format;
use moecheck::reference::gemm::{Gemm, Passes, TailContract};
use moecheck::reference::op::verify;
use moecheck::registry::{build, Choice};

fn main() {
    let mut args = std::env::args().skip(1);
    let cases: u64 = args
        .next()
        .map_or(64, |a| a.parse().expect("CASES: a number"));
    let adapter = args
        .next()
        .unwrap_or_else(|| "examples/adapters/jax_ragged_dot.py".into());
    let mut seconds = Vec::new();
    for mode in ["exec", "worker"] {
        let name = format!("{mode}:python3 {adapter}");
        let start = Instant::now();
        let imp = build::<Gemm>(&Choice::named(&name)).expect("the implementation builds");
        let mut passed = 0;
        for seed in 0..cases {
            let case = generate(&GemmSpec {
                experts: 4,
                tokens: 16,
                topk: 2,
                hidden: 16,
                ffn: 8,
                dtype: Format::F32,
                out_dtype: Format::F32,
                spread: Spread::Skewed,
                empty: 1,
                drop_frac: 0.05,
                seed,
                tail: TailContract::Zero,
                passes: Passes::ALL,
            });
            let verified = verify(imp.as_ref(), &case, Passes::ALL);
            match verified.verdict.failure() {
                None => passed += 1,
                Some(why) => eprintln!("{name}, seed {seed}: {why}"),
            }
        }
        drop(imp);
        let s = start.elapsed().as_secs_f64();
        println!(
            "{name}: {cases} cases in {s:.2} s ({:.3} s per case), {passed} passed",
            s / cases as f64
        );
        seconds.push(s);
    }
    println!("worker is {:.1}x faster than exec", seconds[0] / seconds[1]);
}
