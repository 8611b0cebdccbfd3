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
//! Before it raises the signal again, the handler has the temporary directories removed
//! ([`super::scratch`], through [`prepare_cleanup`]): removing a directory is not
//! async-signal-safe, so a thread started with the handler (its signals blocked) does it,
//! woken through a pipe, and the handler waits for its answer on a second pipe (at most
//! [`CLEANUP_WAIT_MS`]).
//!
//! The handler is installed once, on the first tracked program or temporary directory, and
//! only for signals whose action is the default: an application embedding moecheck that
//! handles (or ignores) one keeps its own. It does only async-signal-safe work: atomic loads,
//! `kill`, `write`, `poll`, `signal`, `raise`.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Once, OnceLock};

/// Groups tracked at once (more run untracked: they are still ended by moecheck, just not
/// on a signal).
const SLOTS: usize = 256;

/// The tracked process group ids; 0 is a free slot.
static GROUPS: [AtomicI32; SLOTS] = [const { AtomicI32::new(0) }; SLOTS];

static INSTALL: Once = Once::new();

/// The signals forwarded.
const FORWARDED: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// The longest the handler waits for the temporary directories to be removed.
pub const CLEANUP_WAIT_MS: libc::c_int = 5_000;

/// The write end of the pipe that wakes the cleaning thread; -1 before it runs.
static WAKE: AtomicI32 = AtomicI32::new(-1);
/// The read end of the pipe on which the cleaning thread says it is done.
static DONE: AtomicI32 = AtomicI32::new(-1);
/// What the cleaning thread does ([`prepare_cleanup`]).
static CLEANUP: OnceLock<fn()> = OnceLock::new();
/// Set by the first signal: a second one ends moecheck without waiting again.
static CLEANING: AtomicBool = AtomicBool::new(false);

/// A tracked process group; dropping it stops tracking.
#[derive(Debug)]
pub struct Tracked(Option<usize>);

/// Installs the handler (once): call it before starting a program, so that a signal that
/// comes while it starts is forwarded too.
pub fn prepare() {
    INSTALL.call_once(install);
}

/// Installs the handler (once) with `clean` as what a signal does before it ends moecheck
/// (the first `clean` given is kept): [`super::scratch`] removes its directories.
pub fn prepare_cleanup(clean: fn()) {
    let _ = CLEANUP.set(clean);
    prepare();
}

/// Whether a forwarded signal came: moecheck is ending, and keeps nothing it made.
pub fn interrupted() -> bool {
    CLEANING.load(Ordering::SeqCst)
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
    let (wake, done) = (WAKE.load(Ordering::SeqCst), DONE.load(Ordering::SeqCst));
    if wake >= 0 && done >= 0 && !CLEANING.swap(true, Ordering::SeqCst) {
        let mut answer = libc::pollfd {
            fd: done,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: write and poll are async-signal-safe; the byte and the pollfd are valid
        // for the calls' duration, and the descriptors stay open for the process's life.
        unsafe {
            if libc::write(wake, [1u8].as_ptr().cast(), 1) == 1 {
                libc::poll(&mut answer, 1, CLEANUP_WAIT_MS);
            }
        }
    }
    // SAFETY: signal and raise are async-signal-safe; with the default action restored,
    // raising the signal ends moecheck as it would have ended without this handler.
    unsafe {
        libc::signal(signal, libc::SIG_DFL);
        libc::raise(signal);
    }
}

/// Starts the thread that removes the temporary directories when the handler wakes it, with
/// the forwarded signals blocked (so that the handler never runs on it and waits for itself).
fn start_cleaner() {
    let (mut wake, mut done) = ([-1; 2], [-1; 2]);
    // SAFETY: pipe2 writes two descriptors into each valid two-element array; the signal set is
    // zero-initialised, then filled by sigemptyset/sigaddset; pthread_sigmask reads `block` and
    // writes `old`, both valid.
    unsafe {
        // Close-on-exec: the programs moecheck starts never hold them.
        if libc::pipe2(wake.as_mut_ptr(), libc::O_CLOEXEC) != 0
            || libc::pipe2(done.as_mut_ptr(), libc::O_CLOEXEC) != 0
        {
            return;
        }
        let mut block: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut block);
        for signal in FORWARDED {
            libc::sigaddset(&mut block, signal);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &block, &mut old);
        // The thread inherits the blocked mask; this thread gets its own back at once.
        let started = std::thread::Builder::new()
            .name("moecheck-cleanup".into())
            .spawn(move || clean_when_woken(wake[0], done[1]));
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        if started.is_ok() {
            DONE.store(done[0], Ordering::SeqCst);
            WAKE.store(wake[1], Ordering::SeqCst);
        }
    }
}

fn clean_when_woken(wake: libc::c_int, done: libc::c_int) {
    let mut byte = [0u8; 1];
    // SAFETY: read and write on this thread's own pipe ends, with a valid one-byte buffer.
    unsafe {
        while libc::read(wake, byte.as_mut_ptr().cast(), 1) != 1 {
            if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                return;
            }
        }
        if let Some(clean) = CLEANUP.get() {
            clean();
        }
        libc::write(done, byte.as_ptr().cast(), 1);
    }
}

fn install() {
    start_cleaner();
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
