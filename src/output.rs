//! Standard output that a closed pipe cannot crash: `moecheck gemm --json | head -c 100`
//! keeps its verdict's exit status.
//!
//! `println!` panics when stdout is a pipe whose reader has gone (Rust ignores `SIGPIPE`,
//! so the write fails with `BrokenPipe`). Every report goes through [`out!`](crate::out) and
//! [`outln!`](crate::outln) instead: a broken pipe drops the rest of the output quietly, any
//! other write error is said once on stderr, and the command exits with the status of what it
//! found, as if it had printed everything.

use std::fmt;
use std::io::{ErrorKind, Write};
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once a write to stdout failed: later output is dropped.
static CLOSED: AtomicBool = AtomicBool::new(false);

/// Writes `args` to stdout (and flushes), ignoring a reader that has gone.
pub fn write(args: fmt::Arguments) {
    if CLOSED.load(Ordering::Relaxed) {
        return;
    }
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.flush()) {
        CLOSED.store(true, Ordering::Relaxed);
        if e.kind() != ErrorKind::BrokenPipe {
            eprintln!("moecheck: cannot write to stdout: {e}");
        }
    }
}

/// `print!` that survives a closed stdout ([`write`]).
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::output::write(format_args!($($arg)*))
    };
}

/// `println!` that survives a closed stdout ([`write`]).
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::output::write(format_args!("{}\n", format_args!($($arg)*)))
    };
}
