//! Ctrl-C still reaches the programs moecheck runs.
//!
//! Each `exec:` or `worker:` program runs in its own process group (src/impls/process.rs), out
//! of the terminal's foreground group, so the terminal's `SIGINT` (and a `SIGHUP` when the
//! terminal goes) reaches moecheck alone. Without forwarding, moecheck would die and leave the
//! program running, orphaned, holding whatever it holds (a GPU). So while a program is
//! [`track`]ed, moecheck handles `SIGINT`, `SIGTERM` and `SIGHUP`: the handler sends `SIGTERM`
//! to every tracked group, then restores the signal's default action and raises it again, so
//! moecheck still ends as the signal says.
//!
//! The handler is installed once, on the first tracked program, and only for signals whose
//! action is the default: an application embedding moecheck that handles (or ignores) one
//! keeps its own. It does only async-signal-safe work: atomic loads, `kill`, `signal`,
//! `raise`.

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Once;

/// Groups tracked at once (more run untracked: they are still ended by moecheck, just not
/// on a signal).
const SLOTS: usize = 256;

/// The tracked process group ids; 0 is a free slot.
static GROUPS: [AtomicI32; SLOTS] = [const { AtomicI32::new(0) }; SLOTS];

static INSTALL: Once = Once::new();

/// The signals forwarded.
const FORWARDED: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// A tracked process group; dropping it stops tracking.
#[derive(Debug)]
pub struct Tracked(Option<usize>);

/// Installs the handler (once): call it before starting a program, so that a signal that
/// comes while it starts is forwarded too.
pub fn prepare() {
    INSTALL.call_once(install);
}

/// Tracks process group `group` until the returned value is dropped (or released).
pub fn track(group: i32) -> Tracked {
    prepare();
    let slot = GROUPS.iter().position(|g| {
        g.compare_exchange(0, group, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    });
    Tracked(slot)
}

impl Tracked {
    /// Stops tracking (the group is gone). Safe to call more than once.
    pub fn release(&mut self) {
        if let Some(i) = self.0.take() {
            GROUPS[i].store(0, Ordering::SeqCst);
        }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.release();
    }
}

extern "C" fn on_signal(signal: libc::c_int) {
    for g in &GROUPS {
        let group = g.load(Ordering::SeqCst);
        if group > 0 {
            // SAFETY: kill is async-signal-safe; a negative pid names the process group.
            unsafe { libc::kill(-group, libc::SIGTERM) };
        }
    }
    // SAFETY: signal and raise are async-signal-safe; with the default action restored,
    // raising the signal ends moecheck as it would have ended without this handler.
    unsafe {
        libc::signal(signal, libc::SIG_DFL);
        libc::raise(signal);
    }
}

fn install() {
    for signal in FORWARDED {
        // SAFETY: sigaction reads `new` and writes `old`, both valid, zero-initialised
        // (a valid bit pattern for this plain C struct) and filled in before use; the
        // handler does only async-signal-safe work.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(signal, std::ptr::null(), &mut old) != 0
                || old.sa_sigaction != libc::SIG_DFL
            {
                continue;
            }
            let mut new: libc::sigaction = std::mem::zeroed();
            new.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            libc::sigemptyset(&mut new.sa_mask);
            libc::sigaction(signal, &new, std::ptr::null_mut());
        }
    }
}
