//! Root never works in a directory another user controls.
//!
//! StateDir belongs to SlurmUser (the hooks run as SlurmUser and write there), so SlurmUser can
//! plant symlinks in it. A cvslurm mode started as root (`cvslurm flush` by hand, the service
//! under a supervisor without systemd's `User=`) would follow them: open `outbox.lock` with
//! O_CREAT, chown directories, rename temp files, all through links to anywhere. So, at start,
//! a root process decides once, on the directory actually used ([`verify_state_dir`]):
//! - StateDir is resolved to its real path (no link left in it), and from then on every
//!   operation goes through that path;
//! - StateDir must be writable by its owner only (no group or other write bit), and every
//!   directory above it must belong to root or to StateDir's owner and be writable by its
//!   owner only (or sticky, like `/tmp`): nobody else can swap any part of the path;
//! - a StateDir that belongs to root keeps root (nobody else can write there: its
//!   subdirectories and files must be root's too); one that belongs to another user must
//!   belong to SlurmUser (slurm.conf), and the process first reads what only root may read
//!   (the API token file), then becomes that user for good, with that user's own identity
//!   from its passwd entry: its uid, its primary group and its supplementary groups
//!   (`initgroups`), never StateDir's group (root's, after `install -d -o slurm`). From then on
//!   it can do nothing SlurmUser could not do itself.

use crate::config::Config;
use crate::slurm::conf::{load_slurm_conf, slurm_conf_path};
use nix::unistd::{Gid, Uid};
use std::ffi::CString;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

/// A StateDir root may work with: its real path and its owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// The real path (links resolved); every later operation goes through it.
    pub path: PathBuf,
    /// StateDir's owner (0 when it does not exist yet: root creates it).
    pub uid: u32,
}

/// Checks that nobody but root and StateDir's owner can change StateDir or the directories
/// above it (see the module documentation); returns its real path and owner. A StateDir
/// that does not exist yet is checked through its nearest existing ancestor, for root.
pub fn verify_state_dir(dir: &Path) -> Result<Verified, String> {
    let (real, exists) = match std::fs::canonicalize(dir) {
        Ok(p) => (p, true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (missing_path(dir)?, false),
        Err(e) => return Err(format!("StateDir {}: {e}", dir.display())),
    };
    let uid = if exists {
        let m = std::fs::symlink_metadata(&real)
            .map_err(|e| format!("StateDir {}: {e}", real.display()))?;
        if !m.is_dir() {
            return Err(format!(
                "StateDir {} is not a directory: remove it or point StateDir elsewhere",
                real.display()
            ));
        }
        if m.mode() & 0o022 != 0 {
            return Err(format!(
                "StateDir {} is writable by group or others (mode {:04o}): only its owner, \
                 SlurmUser, may write it; run: chmod 0700 {}",
                real.display(),
                m.mode() & 0o7777,
                real.display()
            ));
        }
        m.uid()
    } else {
        0
    };
    for a in real.ancestors().skip(1) {
        let Ok(m) = std::fs::symlink_metadata(a) else {
            continue; // a missing StateDir's missing parents: root creates them
        };
        if m.uid() != 0 && m.uid() != uid {
            return Err(format!(
                "{} (above StateDir {}) belongs to uid {}, neither root nor StateDir's owner: \
                 that user could swap StateDir for a link; move StateDir under directories \
                 root owns",
                a.display(),
                real.display(),
                m.uid()
            ));
        }
        if m.mode() & 0o022 != 0 && m.mode() & 0o1000 == 0 {
            return Err(format!(
                "{} (above StateDir {}) is writable by group or others (mode {:04o}) without \
                 the sticky bit: another user could swap StateDir for a link; run: chmod go-w {}",
                a.display(),
                real.display(),
                m.mode() & 0o7777,
                a.display()
            ));
        }
    }
    if exists && uid == 0 {
        // Root stays root here: nothing in StateDir may belong to anyone else.
        for e in std::fs::read_dir(&real).into_iter().flatten().flatten() {
            if let Ok(m) = e.metadata() {
                let open = m.is_dir() && m.mode() & 0o022 != 0;
                if m.uid() != 0 || open {
                    return Err(format!(
                        "{} in root's StateDir belongs to uid {} or is writable by others: \
                         remove it (or chown -R root and chmod go-w it)",
                        e.path().display(),
                        m.uid()
                    ));
                }
            }
        }
    }
    Ok(Verified { path: real, uid })
}

/// The real path a missing StateDir will have: its nearest existing ancestor resolved, the
/// rest (which may not contain `..`) appended.
fn missing_path(dir: &Path) -> Result<PathBuf, String> {
    let mut rest = Vec::new();
    let mut cur = dir;
    loop {
        match std::fs::canonicalize(cur) {
            Ok(base) => {
                let mut p = base;
                for c in rest.iter().rev() {
                    p.push(c);
                }
                return Ok(p);
            }
            Err(_) => {
                let name = match cur.components().next_back() {
                    Some(Component::Normal(n)) => n.to_owned(),
                    _ => {
                        return Err(format!(
                            "StateDir {}: cannot resolve it (use a plain absolute path)",
                            dir.display()
                        ))
                    }
                };
                rest.push(name);
                cur = match cur.parent() {
                    Some(p) if !p.as_os_str().is_empty() => p,
                    _ => Path::new("."),
                };
            }
        }
    }
}

/// SlurmUser's uid from slurm.conf (`root` when slurm.conf does not set it, as Slurm does).
fn slurm_user() -> Result<(String, u32), String> {
    let path = slurm_conf_path();
    let sc = load_slurm_conf(&path).map_err(|e| {
        format!(
            "cannot read slurm.conf ({}: {e}), so cannot tell whether StateDir's owner is \
             SlurmUser; root does not become a user it cannot vouch for: set SLURM_CONF, or \
             run cvslurm as StateDir's owner",
            path.display()
        )
    })?;
    let name = sc
        .last("SlurmUser")
        .map_or("root".to_string(), |s| s.value.clone());
    let uid = match nix::unistd::User::from_name(&name) {
        Ok(Some(u)) => u.uid.as_raw(),
        _ => name.parse::<u32>().map_err(|_| {
            format!(
                "SlurmUser {name} (slurm.conf {}) is not a known user",
                path.display()
            )
        })?,
    };
    Ok((name, uid))
}

/// When run as root: verifies StateDir ([`verify_state_dir`]) and points `cfg.state_dir` at
/// its real path; when StateDir belongs to another user, that user must be SlurmUser: reads
/// the token into `cfg`, then becomes that user (its passwd entry's uid, gid and groups).
/// Returns what was done, for the log (`None`: nothing to do). An error means the process
/// must not go on.
pub fn drop_to_state_dir_owner(cfg: &mut Config) -> Result<Option<String>, String> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(None);
    }
    let v = verify_state_dir(&cfg.state_dir).map_err(|e| format!("started as root: {e}"))?;
    cfg.state_dir = v.path.clone();
    if v.uid == 0 {
        return Ok(None);
    }
    let uid = Uid::from_raw(v.uid);
    let pw = nix::unistd::User::from_uid(uid)
        .ok()
        .flatten()
        .ok_or_else(|| {
            format!(
                "StateDir {} belongs to uid {uid}, which has no passwd entry: chown it to SlurmUser",
                v.path.display()
            )
        })?;
    let user = format!("{} (uid {uid})", pw.name);
    let (slurm_name, slurm_uid) = slurm_user().map_err(|e| format!("started as root: {e}"))?;
    if slurm_uid != v.uid {
        return Err(format!(
            "StateDir {} belongs to {user}, not SlurmUser {slurm_name}: root becomes no other \
             user than SlurmUser; run: chown {slurm_name} {} (or run cvslurm as {})",
            v.path.display(),
            v.path.display(),
            pw.name
        ));
    }
    // The token file may be readable by root only: read it while still root. A failure is
    // left for the mode to report, as it would be without the drop.
    if cfg.api_token.is_none() {
        if let Ok(Some(t)) = cfg.token() {
            cfg.api_token = Some(t);
        }
    }
    let gid: Gid = pw.gid;
    let name = CString::new(pw.name.as_bytes()).map_err(|e| e.to_string())?;
    nix::unistd::initgroups(&name, gid)
        .and_then(|()| nix::unistd::setgid(gid))
        .and_then(|()| nix::unistd::setuid(uid))
        .map_err(|e| {
            format!(
                "cannot become {user}, the owner of StateDir {}: {e}; run cvslurm as that user",
                v.path.display()
            )
        })?;
    Ok(Some(format!(
        "started as root: now running as {user} with its own groups (gid {gid}), the owner of \
         StateDir {}, so that root never acts in a directory another user controls",
        v.path.display()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_state_dir_resolves_through_its_existing_ancestor() {
        let base = std::fs::canonicalize(std::env::temp_dir()).unwrap();
        let p = base.join(format!("cvslurm-missing-{}/a/b", std::process::id()));
        assert_eq!(missing_path(&p).unwrap(), p);
        assert!(missing_path(&base.join("nope/../x")).is_err());
    }
}
