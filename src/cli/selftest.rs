//! `moecheck selftest`: the checker proves its power on planted bugs.

use std::process::ExitCode;

use clap::Args;

#[derive(Debug, Args)]
pub struct SelftestArgs {
    /// Cases per (property, implementation) pair; defaults to $PROPTEST_CASES or 64.
    #[arg(long)]
    pub cases: Option<usize>,
    /// Seed of the property runs.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Machine-readable report with a top-level "verdict".
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: SelftestArgs) -> anyhow::Result<ExitCode> {
    let cases = match a.cases {
        Some(c) => c,
        None => match std::env::var("PROPTEST_CASES") {
            Ok(v) => v
                .parse()
                .map_err(|_| anyhow::anyhow!("PROPTEST_CASES={v} is not a whole number"))?,
            Err(_) => 64,
        },
    };
    if cases == 0 {
        anyhow::bail!("--cases must be at least 1");
    }
    let report = moecheck::selftest::run(cases, a.seed);
    moecheck::report::finish(&report, a.json)
}
