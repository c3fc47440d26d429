//! How every store writes and lists its files in StateDir.
//!
//! - A file is written to a fresh temp file beside it (mode 0600 whatever the umask, never
//!   through a link, `.tmp.<pid>.<n>.<name>`), then renamed over its name: a reader sees the
//!   old file or the new one, never half of one. [`write_durably`] also `fsync`s the data
//!   before the rename and the directory after it; [`replace`] does not (a record whose loss
//!   costs a check, not an event).
//! - When root writes in a StateDir that belongs to someone else (SlurmUser), every new file
//!   and directory gets StateDir's owner ([`owner_to_match`]), so that the hooks can use them.
//! - Keys become file names through [`safe_name`] (`/`, `%`, NUL and a leading `.` are
//!   percent-encoded) and back through [`unsafe_name`].
//! - Readers skip temp files ([`list_dir`], [`records`]); [`remove_stale_tmp`] removes those
//!   a writer killed mid-write left behind.

use super::layout::{DIRS, TMP_PREFIX};
use nix::fcntl::{Flock, FlockArg};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A temp file older than this is from a writer that died (hooks live for seconds).
pub const STALE_TMP: Duration = Duration::from_secs(60);

/// The owner (uid, gid) new files must get: StateDir's, when we are root and it belongs to
/// someone else.
pub fn owner_to_match(state_dir: &Path) -> Option<(u32, u32)> {
    use std::os::unix::fs::MetadataExt;
    if !nix::unistd::geteuid().is_root() {
        return None;
    }
    let m = fs::metadata(state_dir).ok()?;
    (m.uid() != 0).then(|| (m.uid(), m.gid()))
}

/// Creates StateDir's directories ([`DIRS`], mode 0700) if missing, handed to `owner`.
pub fn ensure_dirs(root: &Path, owner: Option<(u32, u32)>) -> Result<(), String> {
    for d in DIRS {
        let p = root.join(d);
        if !p.is_dir() {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&p)
                .map_err(|e| format!("cannot create {}: {e}", p.display()))?;
        }
        if let Some((uid, gid)) = owner {
            // Also repairs directories an earlier root run left owned by root.
            std::os::unix::fs::lchown(&p, Some(uid), Some(gid))
                .map_err(|e| format!("cannot chown {}: {e}", p.display()))?;
        }
    }
    Ok(())
}

/// Locks (`flock`, exclusive) the file `path` (never through a link), created 0600 for `owner`
/// if missing; with a
/// deadline, gives up when it passes (the error then ends with "past the deadline").
pub fn lock_file(
    path: &Path,
    owner: Option<(u32, u32)>,
    deadline: Option<Instant>,
) -> Result<Flock<File>, String> {
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    // A hard link planted in StateDir (SlurmUser's) must not get root's fchown.
    match f.metadata() {
        Ok(md) if md.is_file() && std::os::unix::fs::MetadataExt::nlink(&md) == 1 => {}
        _ => {
            return Err(format!(
                "{} is not a plain file with one link; remove it",
                path.display()
            ))
        }
    }
    if let Some((uid, gid)) = owner {
        let _ = std::os::unix::fs::fchown(&f, Some(uid), Some(gid));
    }
    let Some(deadline) = deadline else {
        return Flock::lock(f, FlockArg::LockExclusive)
            .map_err(|(_, e)| format!("cannot lock {}: {e}", path.display()));
    };
    let mut f = f;
    loop {
        match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
            Ok(l) => return Ok(l),
            Err((back, nix::errno::Errno::EWOULDBLOCK)) => {
                if Instant::now() >= deadline {
                    return Err(format!(
                        "{} stayed locked past the deadline",
                        path.display()
                    ));
                }
                f = back;
                std::thread::sleep(Duration::from_micros(500));
            }
            Err((_, e)) => return Err(format!("cannot lock {}: {e}", path.display())),
        }
    }
}

/// Opens a state file for reading, never through a link (`O_NOFOLLOW`), a regular file only
/// (`O_NONBLOCK` so that a FIFO planted in its place cannot block the reader); with its
/// metadata.
pub fn open_regular(path: &Path) -> std::io::Result<(File, fs::Metadata)> {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path)?;
    let md = f.metadata()?;
    if !md.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    Ok((f, md))
}

/// Reads a whole state file ([`open_regular`]).
pub fn read_file(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let (mut f, _) = open_regular(path)?;
    let mut bytes = Vec::new();
    f.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// `fsync`s a directory (its entries: renames, new files), ignoring failures.
pub fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

/// Writes a file atomically and durably: temp file, fsync, rename, fsync of the directory.
/// `owner` (uid, gid), when given, is set on the file before it takes its name.
pub fn write_durably(path: &Path, data: &[u8], owner: Option<(u32, u32)>) -> Result<(), String> {
    let tmp = write_tmp(path, data, owner, true)?;
    if let Err(e) = fs::rename(&tmp, path) {
        let _ = fs::remove_file(&tmp);
        return Err(format!("cannot write {}: {e}", path.display()));
    }
    sync_dir(path.parent().unwrap_or(Path::new(".")));
    Ok(())
}

/// Writes a file atomically, not `fsync`ed (it survives the kill of any process, not a power
/// loss): for records whose loss costs nothing but a check or a hint.
pub fn replace(path: &Path, data: &[u8], owner: Option<(u32, u32)>) -> Result<(), String> {
    let tmp = write_tmp(path, data, owner, false)?;
    if let Err(e) = fs::rename(&tmp, path) {
        let _ = fs::remove_file(&tmp);
        return Err(format!("cannot write {}: {e}", path.display()));
    }
    Ok(())
}

/// Writes `data` to a fresh temp file beside `path` (`fdatasync`ed with `sync`), owned by
/// `owner` when given; returns its path. The caller renames it or removes it.
pub fn write_tmp(
    path: &Path,
    data: &[u8],
    owner: Option<(u32, u32)>,
    sync: bool,
) -> Result<PathBuf, String> {
    write_tmp_at(path, data, owner, sync, None)
}

/// [`write_tmp`], the file's modification time set to `mtime` when given (the outbox keeps
/// each event's queue time there, for `cvslurm status`).
pub fn write_tmp_at(
    path: &Path,
    data: &[u8],
    owner: Option<(u32, u32)>,
    sync: bool,
    mtime: Option<std::time::SystemTime>,
) -> Result<PathBuf, String> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(
        "{TMP_PREFIX}{}.{}.{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        path.file_name().unwrap_or_default().to_string_lossy()
    ));
    let res = (|| -> std::io::Result<()> {
        let mut f = OpenOptions::new()
            .create_new(true)
            .write(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&tmp)?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::fchown(&f, Some(uid), Some(gid))?;
        }
        f.write_all(data)?;
        if let Some(t) = mtime {
            f.set_modified(t)?;
        }
        if sync {
            f.sync_data()?;
        }
        Ok(())
    })();
    match res {
        Ok(()) => Ok(tmp),
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            Err(format!("cannot write {}: {e}", path.display()))
        }
    }
}

/// Removes the temp files older than [`STALE_TMP`] in every StateDir directory: left behind
/// by writers killed mid-write.
pub fn remove_stale_tmp(root: &Path) {
    for d in DIRS {
        for e in fs::read_dir(root.join(d)).into_iter().flatten().flatten() {
            // By its change time: a writer may set a temp file's modification time to the
            // past (an event file carries its queue time: `write_tmp_at`).
            let stale = e.file_name().to_string_lossy().starts_with(TMP_PREFIX)
                && e.metadata().is_ok_and(|m| {
                    use std::os::unix::fs::MetadataExt;
                    let changed = std::time::UNIX_EPOCH
                        + Duration::new(m.ctime().max(0).unsigned_abs(), m.ctime_nsec() as u32);
                    changed.elapsed().is_ok_and(|age| age > STALE_TMP)
                });
            if stale {
                let _ = fs::remove_file(e.path());
            }
        }
    }
}

/// The `*.json` files of a directory, temp files and other dot files left out (none when
/// the directory cannot be read).
pub fn list_dir(dir: &Path) -> Vec<PathBuf> {
    fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| {
                    p.extension().is_some_and(|x| x == "json")
                        && !p
                            .file_name()
                            .unwrap_or_default()
                            .to_string_lossy()
                            .starts_with('.')
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The records in one directory (start records, verification marks): file name, contents
/// and age, without the temp files of writers still at work (or killed).
pub fn records(dir: &Path) -> Vec<(String, Vec<u8>, Duration)> {
    let Ok(rd) = fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(TMP_PREFIX) {
                return None;
            }
            let bytes = read_file(&e.path()).ok()?;
            let age = e
                .metadata()
                .ok()?
                .modified()
                .ok()?
                .elapsed()
                .unwrap_or_default();
            Some((name, bytes, age))
        })
        .collect()
}

/// Makes a key safe as a file name: `/`, `%`, NUL and a leading `.` are percent-encoded.
pub fn safe_name(key: &str) -> String {
    let mut s = String::with_capacity(key.len());
    for (i, c) in key.chars().enumerate() {
        match c {
            '/' | '%' | '\0' => s.push_str(&format!("%{:02X}", c as u32)),
            '.' if i == 0 => s.push_str("%2E"),
            _ => s.push(c),
        }
    }
    s
}

/// Undoes [`safe_name`].
pub fn unsafe_name(name: &str) -> String {
    let mut out = Vec::with_capacity(name.len());
    let b = name.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("");
            if let Ok(v) = u8::from_str_radix(hex, 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hard link planted at a lock's name (SlurmUser can make one to any file it may read,
    /// where `fs.protected_hardlinks` is off) is refused before root's `fchown` reaches it.
    #[test]
    fn a_lock_that_is_a_hard_link_is_refused_untouched() {
        use std::os::unix::fs::MetadataExt;
        let root = std::env::temp_dir().join(format!("cvslurm-lockln-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(&root).unwrap();
        let target = root.join("precious");
        fs::write(&target, b"x").unwrap();
        let before = fs::metadata(&target).unwrap();
        fs::hard_link(&target, root.join("some.lock")).unwrap();
        let e = lock_file(&root.join("some.lock"), Some((65534, 65534)), None).unwrap_err();
        assert!(e.contains("one link"), "{e}");
        let after = fs::metadata(&target).unwrap();
        assert_eq!((after.uid(), after.gid()), (before.uid(), before.gid()));
        fs::remove_dir_all(&root).unwrap();
    }

    /// An event's temp file carries the event's queue time as its modification time, which
    /// may be hours old: a writer at work is told by the change time, and its file kept.
    #[test]
    fn a_temp_file_with_an_old_mtime_is_no_stale_one() {
        let root = std::env::temp_dir().join(format!("cvslurm-stale-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let outbox = root.join(crate::state::layout::OUTBOX);
        fs::create_dir_all(&outbox).unwrap();
        let hour_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
        let tmp = write_tmp_at(
            &outbox.join("job.1@c.json"),
            b"{}",
            None,
            false,
            Some(hour_ago),
        )
        .unwrap();
        assert_eq!(fs::metadata(&tmp).unwrap().modified().unwrap(), hour_ago);
        remove_stale_tmp(&root);
        assert!(tmp.exists(), "a writer's file is not removed under it");
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn names_are_safe() {
        assert_eq!(safe_name("1@c"), "1@c");
        assert_eq!(safe_name("../x/y"), "%2E.%2Fx%2Fy");
        for k in ["1@c", "../x/y", "a%b", ".%2F", "%", "%aé", "é%"] {
            assert_eq!(unsafe_name(&safe_name(k)), k);
        }
    }

    #[test]
    fn writes_are_private_and_leave_no_temp_file() {
        use std::os::unix::fs::PermissionsExt;
        let d = std::env::temp_dir().join(format!("cvslurm-durable-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        let (a, b) = (d.join("a.json"), d.join("b"));
        write_durably(&a, b"1", None).unwrap();
        replace(&b, b"2", None).unwrap();
        replace(&b, b"3", None).unwrap();
        assert_eq!(fs::read(&a).unwrap(), b"1");
        assert_eq!(fs::read(&b).unwrap(), b"3");
        for p in [&a, &b] {
            assert_eq!(fs::metadata(p).unwrap().permissions().mode() & 0o777, 0o600);
        }
        assert_eq!(fs::read_dir(&d).unwrap().count(), 2, "no temp file left");
        // A temp file is neither listed nor read as a record.
        fs::write(d.join(".tmp.1.2.c.json"), b"x").unwrap();
        assert_eq!(list_dir(&d), vec![a.clone()]);
        assert_eq!(records(&d).len(), 2);
        // A link planted in StateDir is never read through, whatever it points to.
        std::os::unix::fs::symlink(&a, d.join("link")).unwrap();
        assert!(read_file(&d.join("link")).is_err());
        assert_eq!(read_file(&a).unwrap(), b"1");
        assert_eq!(records(&d).len(), 2, "the link is no record");
        fs::remove_dir_all(&d).unwrap();
    }
}
