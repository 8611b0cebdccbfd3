//! The `moecheck` command line. See `moecheck --help`.
//!
//! Exit status: 0 pass, 1 a mismatch or failing implementation was found, 2 usage or input
//! error (with a one-line reason on stderr), 3 inconclusive (a bound without teeth; curves
//! that cannot decide).

mod cli;

use std::process::ExitCode;

fn main() -> ExitCode {
    match cli::run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("moecheck: error: {}", cli::one_reason(&e));
            ExitCode::from(2)
        }
    }
}
