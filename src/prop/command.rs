//! The one line a campaign prints to reproduce a failure: `moecheck check DIR [flags]` when
//! the written minimal case fails `check` for the property's own reason, else the `moecheck
//! prop` command that finds it again. Words are quoted for a POSIX shell (`shlex`).

use std::path::Path;

pub use crate::backends::fewest;
use crate::registry::{Choice, Declared};

/// `words` as one shell line, each quoted where it needs it.
pub fn shell_line<S: AsRef<str>>(words: &[S]) -> String {
    let words: Vec<&str> = words.iter().map(AsRef::as_ref).collect();
    // Quoting fails only on a NUL byte, which no command-line argument holds.
    shlex::try_join(words.iter().copied()).unwrap_or_else(|_| words.join(" "))
}

/// The declaration flags of `d` that were given, as words (`--acc`, `f32`, ...), in
/// [`Declared::given`]'s order.
pub fn declared_words(d: &Declared) -> Vec<String> {
    let values = [
        ("--acc", d.acc.map(|f| f.to_string())),
        ("--acc-block", d.acc_block.map(|b| b.to_string())),
        ("--compute", d.compute.map(|f| f.to_string())),
        ("--out-dtype", d.out_dtype.map(|f| f.to_string())),
    ];
    values
        .into_iter()
        .filter_map(|(flag, v)| v.map(|v| [flag.to_string(), v]))
        .flatten()
        .collect()
}

/// `moecheck check DIR [flags]`.
pub fn check_line(dir: &Path, declared: &Declared) -> String {
    let mut words = vec![
        "moecheck".to_string(),
        "check".into(),
        dir.display().to_string(),
    ];
    words.extend(declared_words(declared));
    shell_line(&words)
}

/// What a `moecheck prop` line states besides the implementation.
#[derive(Debug, Clone, Copy)]
pub struct PropRun<'a> {
    pub op: &'a str,
    pub property: &'a str,
    pub cases: u32,
    pub seed: u64,
    /// `None` at the default.
    pub max_shrink: Option<u32>,
    /// The contract flags (`--tail ignored`, `--supports k_min=1`, ...) as words.
    pub flags: &'a [String],
}

/// `moecheck prop --op OP --impl IMPL [--inject B] [--timeout S] [flags] --property NAME
/// --cases N --seed S [--max-shrink M]`: the run that finds `run.property`'s failure again.
pub fn prop_line(choice: &Choice, run: &PropRun) -> String {
    let mut words: Vec<String> = ["moecheck", "prop", "--op", run.op, "--impl"]
        .map(String::from)
        .to_vec();
    words.push(choice.name.clone());
    if let Some(bug) = &choice.inject {
        words.extend(["--inject".into(), bug.clone()]);
    }
    if let Some(t) = choice.timeout {
        words.extend(["--timeout".into(), t.to_string()]);
    }
    words.extend(declared_words(&choice.declared));
    words.extend(run.flags.iter().cloned());
    words.extend([
        "--property".into(),
        run.property.to_string(),
        "--cases".into(),
        run.cases.to_string(),
        "--seed".into(),
        run.seed.to_string(),
    ]);
    if let Some(m) = run.max_shrink {
        words.extend(["--max-shrink".into(), m.to_string()]);
    }
    shell_line(&words)
}

#[cfg(test)]
mod tests {
    use moecheck_reference::format::Format;
    use moecheck_reference::gemm::Gemm;
    use moecheck_reference::moe::MoeLayer;

    use super::*;

    #[test]
    fn lines_quote_what_a_shell_would_split() {
        let choice = Choice {
            declared: Declared {
                acc: Some(Format::Bf16),
                ..Declared::default()
            },
            timeout: Some(30.0),
            ..Choice::named("exec:python3 my adapter.py")
        };
        let run = PropRun {
            op: "gemm",
            property: "k-zero",
            cases: 16,
            seed: 3,
            max_shrink: None,
            flags: &[],
        };
        let line = prop_line(&choice, &run);
        assert_eq!(
            shlex::split(&line).unwrap(),
            [
                "moecheck",
                "prop",
                "--op",
                "gemm",
                "--impl",
                "exec:python3 my adapter.py",
                "--timeout",
                "30",
                "--acc",
                "bf16",
                "--property",
                "k-zero",
                "--cases",
                "16",
                "--seed",
                "3"
            ]
        );
        let dir = Path::new("out dir/gemm-k-zero-seed-3");
        assert_eq!(
            shlex::split(&check_line(dir, &Declared::default())).unwrap(),
            ["moecheck", "check", "out dir/gemm-k-zero-seed-3"]
        );
    }

    #[test]
    fn fewest_drops_the_defaults_only() {
        let d = Declared {
            acc: Some(Format::F32),
            acc_block: Some(32),
            ..Declared::default()
        };
        let f = fewest::<Gemm>(d);
        assert_eq!(declared_words(&f), ["--acc-block", "32"]);
        let d = Declared {
            compute: Some(Format::F64),
            out_dtype: Some(Format::F32),
            ..Declared::default()
        };
        assert_eq!(declared_words(&fewest::<MoeLayer>(d)), ["--compute", "f64"]);
    }
}
