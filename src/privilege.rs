//! Root never works in a directory another user controls.
//!
//! StateDir belongs to SlurmUser (the hooks run as SlurmUser and write there), so SlurmUser can
//! plant symlinks in it. A cvslurm mode started as root (`cvslurm flush` by hand, the service
//! under a supervisor without systemd's `User=`) would follow them: open `outbox.lock` with
//! O_CREAT, chown directories, rename temp files, all through links to anywhere. So, at start,
//! a root process whose StateDir belongs to another user first reads what only root may read
//! (the API token file), then becomes StateDir's owner for good (supplementary groups, gid,
//! uid): from then on it can do nothing SlurmUser could not do itself.

use crate::config::Config;
use nix::unistd::{Gid, Uid};
use std::os::unix::fs::MetadataExt;

/// When run as root and StateDir is owned by another user: reads the token into `cfg`, then
/// drops to StateDir's owner and group. Returns what was done, for the log (`None`: nothing
/// to do). An error means the process must not go on.
pub fn drop_to_state_dir_owner(cfg: &mut Config) -> Result<Option<String>, String> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(None);
    }
    let Ok(meta) = std::fs::metadata(&cfg.state_dir) else {
        return Ok(None);
    };
    if meta.uid() == 0 {
        return Ok(None);
    }
    // The token file may be readable by root only: read it while still root. A failure is
    // left for the mode to report, as it would be without the drop.
    if cfg.api_token.is_none() {
        if let Ok(Some(t)) = cfg.token() {
            cfg.api_token = Some(t);
        }
    }
    let (uid, gid) = (Uid::from_raw(meta.uid()), Gid::from_raw(meta.gid()));
    let user = nix::unistd::User::from_uid(uid).ok().flatten().map_or_else(
        || format!("uid {uid}"),
        |u| format!("{} (uid {uid})", u.name),
    );
    nix::unistd::setgroups(&[gid])
        .and_then(|()| nix::unistd::setgid(gid))
        .and_then(|()| nix::unistd::setuid(uid))
        .map_err(|e| {
            format!(
                "cannot become {user}, the owner of StateDir {}: {e}; run cvslurm as that user",
                cfg.state_dir.display()
            )
        })?;
    Ok(Some(format!(
        "started as root: now running as {user}, the owner of StateDir {}, so that root never acts in a directory another user controls",
        cfg.state_dir.display()
    )))
}
