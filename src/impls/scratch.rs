//! The one owner of moecheck's temporary directories (the case directories of `exec:` and
//! `worker:` runs, `train --compare`'s logs without `--out`): each is removed on every way
//! out of moecheck —
//!
//! * when its [`Scratch`] is dropped (a return, an error, a panic that unwinds);
//! * on `SIGINT`, `SIGTERM` or `SIGHUP`: the handler of [`super::interrupt`] wakes a thread
//!   that removes every directory still [`Scratch`]-owned ([`remove_all`]), and only then lets
//!   the signal end moecheck.
//!
//! A directory handed over with [`Scratch::keep`] (a failed case kept for the user) is the
//! user's from then on, and is not removed.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use super::interrupt;

/// The directories owned now.
static OWNED: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn owned() -> std::sync::MutexGuard<'static, Vec<PathBuf>> {
    OWNED.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A temporary directory `$TMPDIR/<prefix>XXXXXX`, removed when dropped or on a signal.
#[derive(Debug)]
pub struct Scratch(Option<tempfile::TempDir>);

impl Scratch {
    /// A new directory named `<prefix>` and a random tail, in `$TMPDIR`.
    pub fn new(prefix: &str) -> std::io::Result<Scratch> {
        // Before the directory exists: a signal from now on removes it.
        interrupt::prepare_cleanup(remove_all);
        if interrupt::interrupted() {
            return Err(std::io::Error::other("moecheck is ending on a signal"));
        }
        let dir = tempfile::Builder::new().prefix(prefix).tempdir()?;
        owned().push(dir.path().to_path_buf());
        Ok(Scratch(Some(dir)))
    }

    pub fn path(&self) -> &Path {
        self.0.as_ref().expect("held until dropped or kept").path()
    }

    /// Gives the directory to the user: it is no longer removed. `None` once a signal came:
    /// then it is removed all the same.
    pub fn keep(mut self) -> Option<PathBuf> {
        if interrupt::interrupted() {
            return None;
        }
        let dir = self.0.take().expect("held until dropped or kept");
        forget(dir.path());
        Some(dir.keep())
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Some(dir) = self.0.take() {
            forget(dir.path());
            // TempDir's own drop removes it.
        }
    }
}

fn forget(path: &Path) {
    owned().retain(|p| p != path);
}

/// Removes every directory owned now (the signal path: the process is about to end).
pub fn remove_all() {
    // `try_lock`: the thread interrupted by the signal may hold the lock, and it will not run
    // again before the process ends; a few tries, then whatever is left stays.
    for _ in 0..100 {
        if let Ok(mut dirs) = OWNED.try_lock() {
            for d in dirs.drain(..) {
                // Twice: the program just ended may have been writing there.
                if std::fs::remove_dir_all(&d).is_err() {
                    let _ = std::fs::remove_dir_all(&d);
                }
            }
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dropped_and_kept_directories() {
        let a = Scratch::new("moecheck-scratch-test-").unwrap();
        let path = a.path().to_path_buf();
        assert!(owned().contains(&path));
        drop(a);
        assert!(!path.exists() && !owned().contains(&path));
        let b = Scratch::new("moecheck-scratch-test-").unwrap();
        let kept = b.keep().unwrap();
        assert!(kept.is_dir() && !owned().contains(&kept));
        std::fs::remove_dir_all(kept).unwrap();
    }
}
