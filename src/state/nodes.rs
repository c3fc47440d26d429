//! Node records: `nodes/<node>.json`, the inventory's latest discover record of each node (its
//! NICs and GPU topology), which `send` and the service read to attribute jobs to interfaces
//! (`JobInterfaces`) and to notice a node whose NICs changed ([`crate::resend`]).
//!
//! Written durably ([`super::durable::write_durably`]); read as hostile input.

use super::durable::{self, list_dir, safe_name, unsafe_name, write_durably};
use super::layout::NODES;
use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// A node record file's inode, modification time and size ([`Nodes::stamps`]).
pub type RecordStamp = (u64, SystemTime, u64);

/// The node records in one state directory.
#[derive(Debug, Clone)]
pub struct Nodes {
    root: PathBuf,
    owner: Option<(u32, u32)>,
}

impl Nodes {
    /// The node records under `root`, new files handed to `owner`.
    pub(super) fn new(root: &Path, owner: Option<(u32, u32)>) -> Nodes {
        Nodes {
            root: root.to_path_buf(),
            owner,
        }
    }

    fn path(&self, node: &str) -> PathBuf {
        self.root
            .join(NODES)
            .join(format!("{}.json", safe_name(node)))
    }

    /// Keeps the inventory's latest discover record of a node (its GPU topology included), for
    /// `send` and the service to attribute jobs to interfaces (`JobInterfaces`).
    pub fn save(&self, rec: &crate::discovery::record::DiscoverRecord) -> Result<(), String> {
        durable::ensure_dirs(&self.root, self.owner)?;
        let json = serde_json::to_vec(rec).map_err(|e| format!("cannot encode record: {e}"))?;
        write_durably(&self.path(&rec.node_name), &json, self.owner)
    }

    /// The inventory's record of `node`: `Ok(None)` when there is none. The file is hostile
    /// input: a link is not followed, the size is capped, the record is validated and must
    /// name `node`.
    pub fn load(
        &self,
        node: &str,
    ) -> Result<Option<crate::discovery::record::DiscoverRecord>, String> {
        use std::io::Read;
        let p = self.path(node);
        let f = match OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&p)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("cannot read {}: {e}", p.display())),
        };
        let max = crate::discovery::record::MAX_RECORD_BYTES;
        let mut s = String::new();
        f.take(max as u64 + 1)
            .read_to_string(&mut s)
            .map_err(|e| format!("cannot read {}: {e}", p.display()))?;
        if s.len() > max {
            return Err(format!("{}: larger than {max} bytes", p.display()));
        }
        let rec = crate::discovery::record::DiscoverRecord::parse_line(&s)
            .map_err(|e| format!("{}: {e}", p.display()))?;
        if rec.node_name != node {
            return Err(format!(
                "{}: a record of node {:?}",
                p.display(),
                rec.node_name
            ));
        }
        Ok(Some(rec))
    }

    /// The nodes with a record in StateDir, each with its file's inode, modification time and
    /// size: a cheap way to notice a record that changed (see [`crate::resend`]). Records are
    /// replaced by a rename, so a rewrite always shows a new inode, even within one clock tick.
    pub fn stamps(&self) -> BTreeMap<String, RecordStamp> {
        list_dir(&self.root.join(NODES))
            .into_iter()
            .filter_map(|p| {
                let m = fs::symlink_metadata(&p).ok()?;
                if !m.file_type().is_file() {
                    return None;
                }
                let stem = p.file_name()?.to_str()?.strip_suffix(".json")?;
                Some((unsafe_name(stem), (m.ino(), m.modified().ok()?, m.len())))
            })
            .collect()
    }

    /// Every node's record; one that cannot be read is left out (and logged).
    pub fn all(&self) -> BTreeMap<String, crate::discovery::record::DiscoverRecord> {
        self.stamps()
            .into_keys()
            .filter_map(|node| match self.load(&node) {
                Ok(r) => Some((node, r?)),
                Err(e) => {
                    log::warn!("node {node}: inventory record ignored: {e}");
                    None
                }
            })
            .collect()
    }

    /// Forgets a node's record (it left the cluster).
    pub fn forget(&self, node: &str) {
        let _ = fs::remove_file(self.path(node));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::StateDir;

    /// The inventory's node records: kept, read back, and refused when tampered with.
    #[test]
    fn node_records() {
        let d = std::env::temp_dir().join(format!("cvslurm-noderec-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        let ob = StateDir::new(&d).nodes;
        assert_eq!(ob.load("dgx1").unwrap(), None);
        let rec = crate::discovery::topology::fixtures::record("dgx1", "dgx-a100", "02:dd:00:01");
        ob.save(&rec).unwrap();
        assert_eq!(ob.load("dgx1").unwrap(), Some(rec.clone()));
        let p = d.join(NODES).join("dgx1.json");
        // Another node's record under this name.
        let mut other = rec.clone();
        other.node_name = "dgx2".into();
        fs::write(&p, serde_json::to_vec(&other).unwrap()).unwrap();
        assert!(ob
            .load("dgx1")
            .unwrap_err()
            .contains("a record of node \"dgx2\""));
        // Garbage, an oversized file, a link.
        fs::write(&p, b"{not json").unwrap();
        assert!(ob
            .load("dgx1")
            .unwrap_err()
            .contains("not a discover record"));
        fs::write(
            &p,
            vec![b' '; crate::discovery::record::MAX_RECORD_BYTES + 1],
        )
        .unwrap();
        assert!(ob.load("dgx1").unwrap_err().contains("larger than"));
        fs::remove_file(&p).unwrap();
        ob.save(&other).unwrap();
        std::os::unix::fs::symlink(d.join(NODES).join("dgx2.json"), &p).unwrap();
        assert!(ob.load("dgx1").unwrap_err().contains("cannot read"));
        assert_eq!(ob.all().into_keys().collect::<Vec<_>>(), ["dgx2"]);
        ob.forget("dgx2");
        assert_eq!(ob.load("dgx2").unwrap(), None);
        fs::remove_dir_all(&d).unwrap();
    }
}
