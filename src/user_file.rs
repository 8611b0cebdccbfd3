//! Every file a user names for moecheck to write goes through here (`--junit FILE`, `--plot
//! FILE`, `--log FILE`, and the directories of `--dump DIR`, `--out DIR`), so that all of them
//! are treated one way:
//!
//! * a symbolic link is refused, never written through nor replaced (as `--dump` always did):
//!   name the file it points to;
//! * a character device or a FIFO (`/dev/null`, `/dev/full`, a named pipe) is written in place,
//!   never replaced by a regular file; a block device, a socket or a directory is refused;
//! * a regular file is replaced whole ([`write`]): written to a temporary file beside it and
//!   renamed over it, so a reader never sees half a report. A new file's mode follows the umask
//!   (`0666 & !umask`, as a shell's `>` makes it); a replaced file keeps its mode;
//! * [`check`] says, before a long run, whether the write can be done — the file, or the
//!   directory that will hold it, writable — without creating or truncating anything.
//!
//! Errors name the flag and the file: `--junit out.xml: is a symbolic link; ...`.

use std::fs::{File, OpenOptions, Permissions};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;

use anyhow::{bail, Context};
use rustix::fs::Access;

/// What is at a path about to be written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Nothing: a new file is made.
    New,
    /// A regular file, replaced whole; it keeps its mode.
    Regular(Permissions),
    /// A character device or a FIFO, written in place.
    Special,
}

/// The directory that holds `path` (`.` for a bare name).
pub fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// `Ok` when the calling user may write to `path` (`access(2)`: permissions and read-only
/// file systems), else the reason.
fn writable(path: &Path, mode: Access) -> std::io::Result<()> {
    rustix::fs::access(path, mode).map_err(std::io::Error::from)
}

/// What `path` is, when `flag` may write a file there; refused (naming `flag` and `path`)
/// when it is a symbolic link, a directory, a block device or a socket, when it or the
/// directory that would hold it cannot be written, or when that directory does not exist.
/// Creates and truncates nothing.
pub fn check(path: &Path, flag: &str) -> anyhow::Result<Target> {
    let shown = || format!("{flag} {}", path.display());
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => Some(m),
        Err(e) if e.kind() == ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(shown),
    };
    let parent = parent_of(path);
    let parent_ok = || -> anyhow::Result<()> {
        if !parent.is_dir() {
            bail!("{}: directory {} does not exist", shown(), parent.display());
        }
        writable(parent, Access::WRITE_OK | Access::EXEC_OK)
            .with_context(|| format!("{}: cannot write in {}", shown(), parent.display()))
    };
    let Some(meta) = meta else {
        parent_ok()?;
        return Ok(Target::New);
    };
    let t = meta.file_type();
    let refused = if t.is_symlink() {
        "is a symbolic link; not writing through it (name the file it points to)"
    } else if t.is_dir() {
        "is a directory (give a file name)"
    } else if t.is_block_device() {
        "is a block device; not writing onto it"
    } else if t.is_socket() {
        "is a socket; not writing to it"
    } else {
        ""
    };
    if !refused.is_empty() {
        bail!("{}: {refused}", shown());
    }
    writable(path, Access::WRITE_OK).with_context(|| format!("{}: cannot write it", shown()))?;
    if t.is_char_device() || t.is_fifo() {
        return Ok(Target::Special);
    }
    parent_ok()?;
    Ok(Target::Regular(meta.permissions()))
}

/// Writes `bytes` to `path` for `flag`, as the module says: a special file in place, a
/// regular file replaced whole (a temporary file beside it, renamed over it).
pub fn write(path: &Path, flag: &str, bytes: &[u8]) -> anyhow::Result<()> {
    let target = check(path, flag)?;
    let shown = || format!("{flag} {}", path.display());
    let mode = match target {
        Target::Special => {
            let mut f = OpenOptions::new()
                .write(true)
                .open(path)
                .with_context(shown)?;
            return f
                .write_all(bytes)
                .and_then(|()| f.flush())
                .with_context(shown);
        }
        Target::New => None,
        Target::Regular(p) => Some(p),
    };
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}.moecheck-"))
        // Subject to the umask, as a shell's `>` creates a file.
        .permissions(Permissions::from_mode(0o666))
        .tempfile_in(parent_of(path))
        .with_context(shown)?;
    if let Some(p) = mode {
        tmp.as_file().set_permissions(p).with_context(shown)?;
    }
    tmp.write_all(bytes).with_context(shown)?;
    tmp.as_file().sync_all().with_context(shown)?;
    tmp.persist(path).map_err(|e| e.error).with_context(shown)?;
    Ok(())
}

/// Opens `path` for `flag` to write as a run goes (a log): a special file in place, a
/// regular file truncated (it keeps its mode), a new one with the umask's mode.
pub fn open(path: &Path, flag: &str) -> anyhow::Result<File> {
    let target = check(path, flag)?;
    let mut o = OpenOptions::new();
    o.write(true);
    if target != Target::Special {
        o.create(true).truncate(true);
    }
    o.open(path)
        .with_context(|| format!("{flag} {}", path.display()))
}

/// `Ok` when `flag` may make or fill the directory `dir`: the nearest of it and its ancestors
/// that exists is a directory the calling user can write in. Creates nothing.
pub fn check_dir(dir: &Path, flag: &str) -> anyhow::Result<()> {
    let shown = || format!("{flag} {}", dir.display());
    let mut at = dir;
    loop {
        match std::fs::metadata(at) {
            Ok(m) if m.is_dir() => break,
            Ok(_) => bail!("{}: {} is not a directory", shown(), at.display()),
            Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => {
                match at.parent() {
                    Some(p) if !p.as_os_str().is_empty() => at = p,
                    _ => {
                        at = Path::new(".");
                        break;
                    }
                }
            }
            Err(e) => return Err(e).with_context(shown),
        }
    }
    writable(at, Access::WRITE_OK | Access::EXEC_OK)
        .with_context(|| format!("{}: cannot write in {}", shown(), at.display()))
}

/// Makes the directory `dir` whole at once, for `flag`: `fill` writes into a new directory
/// beside it (on the same file system, its mode the umask's), which then takes `dir`'s place
/// by `rename(2)`; what was at `dir` is moved aside and removed, once `replaceable` accepts it
/// (else it is put back and the error returned). Two runs at once each publish a whole
/// directory and the last one wins: a reader never sees one run's files beside another's, and
/// a run that fails half-way leaves `dir` as it was.
pub fn publish_dir(
    dir: &Path,
    flag: &str,
    fill: impl FnOnce(&Path) -> anyhow::Result<()>,
    replaceable: impl Fn(&Path) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let shown = || format!("{flag} {}", dir.display());
    let parent = parent_of(dir);
    let name = match dir.file_name() {
        Some(n) => n.to_string_lossy(),
        None => bail!("{}: not a directory name", shown()),
    };
    std::fs::create_dir_all(parent).with_context(shown)?;
    let beside = || {
        tempfile::Builder::new()
            .prefix(&format!(".{name}.moecheck-"))
            .permissions(Permissions::from_mode(0o777))
            .tempdir_in(parent)
            .with_context(shown)
    };
    let staging = beside()?;
    fill(staging.path())?;
    // A few rounds: another run may publish between our moving its directory aside and ours in.
    for _ in 0..16 {
        match std::fs::rename(staging.path(), dir) {
            Ok(()) => {
                let _ = staging.keep();
                return Ok(());
            }
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::DirectoryNotEmpty | ErrorKind::AlreadyExists
                ) => {}
            Err(e) => return Err(e).with_context(shown),
        }
        let aside = beside()?;
        let old = aside.path().join(&*name);
        match std::fs::rename(dir, &old) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => continue,
            Err(e) => return Err(e).with_context(shown),
        }
        if let Err(e) = replaceable(&old) {
            // Not ours to remove (someone's files arrived since the run was allowed).
            if std::fs::rename(&old, dir).is_err() {
                // Never removed: it stays beside DIR under its temporary name.
                let _ = aside.keep();
            }
            return Err(e);
        }
    }
    bail!("{}: other runs kept replacing it; not written", shown())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_is_refused_and_its_target_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target.xml");
        std::fs::write(&target, "mine").unwrap();
        let link = dir.path().join("link.xml");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = write(&link, "--junit", b"report").unwrap_err();
        assert!(format!("{e:#}").contains("symbolic link"), "{e:#}");
        assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "mine");
    }

    #[test]
    fn a_device_or_fifo_is_written_in_place() {
        // Devices are only looked at: a regression must not replace this machine's /dev/null.
        for device in ["/dev/null", "/dev/full"] {
            assert_eq!(
                check(Path::new(device), "--junit").unwrap(),
                Target::Special
            );
        }
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("report.pipe");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.unwrap().success());
        let reading = fifo.clone();
        let reader = std::thread::spawn(move || std::fs::read(reading).unwrap());
        write(&fifo, "--junit", b"report").unwrap();
        assert_eq!(reader.join().unwrap(), b"report");
        let meta = std::fs::symlink_metadata(&fifo).unwrap();
        assert!(meta.file_type().is_fifo());
    }

    #[test]
    fn a_regular_file_is_replaced_and_keeps_its_mode() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.xml");
        std::fs::write(&p, "old").unwrap();
        std::fs::set_permissions(&p, Permissions::from_mode(0o640)).unwrap();
        write(&p, "--junit", b"new").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "new");
        let mode = std::fs::metadata(&p).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o640);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_directory_is_published_whole_while_another_run_publishes_it() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("case");
        let ok = |_: &Path| Ok(());
        let files = |d: &Path| {
            let mut n: Vec<_> = std::fs::read_dir(d)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            n.sort();
            n
        };
        let fill = |names: &'static [&'static str]| {
            move |d: &Path| {
                for n in names {
                    std::fs::write(d.join(n), n)?;
                }
                Ok(())
            }
        };
        publish_dir(&dir, "--dump", fill(&["a", "b"]), ok).unwrap();
        // Another run publishes while this one fills: the last one wins, whole.
        publish_dir(
            &dir,
            "--dump",
            |d| {
                publish_dir(&dir, "--dump", fill(&["x"]), ok).unwrap();
                fill(&["c"])(d)
            },
            ok,
        )
        .unwrap();
        assert_eq!(files(&dir), ["c"]);
        // A directory that is not replaceable is put back, untouched.
        let e = publish_dir(&dir, "--dump", fill(&["d"]), |_| bail!("mine")).unwrap_err();
        assert_eq!(e.to_string(), "mine");
        assert_eq!(files(&dir), ["c"]);
        // A failed fill leaves the directory as it was, and nothing beside it.
        let e = publish_dir(&dir, "--dump", |_| bail!("full"), ok).unwrap_err();
        assert_eq!(e.to_string(), "full");
        assert_eq!(files(&dir), ["c"]);
        assert_eq!(files(root.path()), ["case"]);
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
        assert_ne!(
            mode & 0o777,
            0o700,
            "the umask's mode, not a temporary directory's"
        );
    }

    #[test]
    fn check_creates_nothing_and_refuses_a_missing_directory() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("new.xml");
        assert_eq!(check(&p, "--junit").unwrap(), Target::New);
        assert!(!p.exists());
        let e = check(&dir.path().join("no/such.xml"), "--junit").unwrap_err();
        assert!(e.to_string().contains("does not exist"), "{e}");
        check_dir(&dir.path().join("a/b/c"), "--out").unwrap();
        assert!(!dir.path().join("a").exists());
        let e = check_dir(&p.with_extension("d"), "--out");
        assert!(e.is_ok());
        std::fs::write(&p, "x").unwrap();
        let e = check_dir(&p.join("sub"), "--out").unwrap_err();
        assert!(e.to_string().contains("is not a directory"), "{e}");
    }
}
