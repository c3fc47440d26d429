//! Which GPUs each NIC is nearest to on the PCIe tree, read from sysfs and procfs.
//!
//! `discover --topology` adds a [`Topology`] to its record; the inventory keeps it in StateDir
//! (never in the NodeConfig payload) and [`crate::inventory::attribution`] turns a job's GPUs into MACs.
//!
//! Nearness follows `nvidia-smi topo -m`: a NIC and a GPU behind the same PCIe switch (a
//! bridge below the root port) are nearest ([`Nearness::Switch`]), then the same root port,
//! then the same host bridge (root complex), then the same NUMA node. Each NIC lists the GPUs
//! at its best level; a NIC on another NUMA node than every GPU is near none.
//!
//! Only GPUs a job can hold count (physical functions bound to a GPU driver: see [`read`]);
//! GPUs that cannot be numbered as Slurm numbers them are an error, never a guess.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The most GPUs a node may report.
pub const MAX_GPUS: usize = 64;
/// The most PCI devices discover looks at.
const MAX_PCI_DEVICES: usize = 16384;

/// How near a NIC is to its nearest GPUs. Ordered from nearest to farthest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Nearness {
    /// Behind the same PCIe switch (`PIX`/`PXB` in `nvidia-smi topo -m`).
    Switch,
    /// On the same CPU root port, no switch in common.
    RootPort,
    /// Under the same host bridge (root complex), different root ports (`PHB`).
    HostBridge,
    /// Different host bridges, same NUMA node (`NODE`).
    Numa,
    /// No GPU on its NUMA node (`SYS`): near none.
    None,
}

impl Nearness {
    /// Words for logs and `send --dry-run`.
    pub fn describe(self) -> &'static str {
        match self {
            Nearness::Switch => "same PCIe switch",
            Nearness::RootPort => "same root port",
            Nearness::HostBridge => "same host bridge",
            Nearness::Numa => "same NUMA node",
            Nearness::None => "no GPU on its NUMA node",
        }
    }
}

/// One GPU, numbered as Slurm numbers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gpu {
    /// The GRES index (`IDX` in `scontrol show job -d`): the NVIDIA device minor; for AMD
    /// GPUs, the position in PCI address order.
    pub index: u32,
    /// PCI address `0000:07:00.0`.
    pub pci: String,
    /// NUMA node, if the kernel knows it.
    pub numa_node: Option<u32>,
}

/// Where one NIC sits and which GPUs it serves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NicTopology {
    /// The interface name (one of the record's interfaces).
    pub name: String,
    /// PCI address of the NIC function.
    pub pci: String,
    /// NUMA node, if the kernel knows it.
    pub numa_node: Option<u32>,
    /// GRES indices of the nearest GPUs (sorted; empty when near none).
    pub gpus: Vec<u32>,
    /// How near they are.
    pub near: Nearness,
}

/// A node's GPUs and the GPU nearness of its reported NICs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Topology {
    /// The GPUs, by index.
    pub gpus: Vec<Gpu>,
    /// The reported interfaces that are PCI devices, by name.
    pub nics: Vec<NicTopology>,
}

impl Topology {
    /// Checks sizes, addresses and references; `interfaces` are the record's interface names.
    pub fn validate(&self, interfaces: &BTreeSet<&str>) -> Result<(), String> {
        if self.gpus.len() > MAX_GPUS {
            return Err(format!("topology: more than {MAX_GPUS} GPUs"));
        }
        let mut idx = BTreeSet::new();
        for g in &self.gpus {
            if !idx.insert(g.index) || g.index as usize >= 4 * MAX_GPUS {
                return Err(format!("topology: bad or repeated GPU index {}", g.index));
            }
            if !is_pci_address(&g.pci) {
                return Err(format!("topology: bad GPU PCI address {:?}", g.pci));
            }
        }
        let mut names = BTreeSet::new();
        for n in &self.nics {
            if !interfaces.contains(n.name.as_str()) || !names.insert(n.name.as_str()) {
                return Err(format!(
                    "topology: NIC {:?} is not a reported interface, or listed twice",
                    n.name
                ));
            }
            if !is_pci_address(&n.pci) {
                return Err(format!(
                    "topology: NIC {}: bad PCI address {:?}",
                    n.name, n.pci
                ));
            }
            if n.gpus.iter().any(|g| !idx.contains(g)) || n.gpus.len() > MAX_GPUS {
                return Err(format!("topology: NIC {} names an unknown GPU", n.name));
            }
        }
        Ok(())
    }

    /// The nearness entry of interface `name`.
    pub fn nic(&self, name: &str) -> Option<&NicTopology> {
        self.nics.iter().find(|n| n.name == name)
    }
}

/// True for a PCI address `dddd:bb:dd.f` in lower-case hex.
pub fn is_pci_address(s: &str) -> bool {
    let b = s.as_bytes();
    let hex = |r: std::ops::Range<usize>| {
        b[r].iter()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
    };
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && hex(0..4)
        && hex(5..7)
        && hex(8..10)
        && (b'0'..=b'7').contains(&b[11])
}

/// Where a PCI device hangs: its host bridge (`pci0000:00`) and the PCI addresses from the
/// root port down to the device itself.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PciPath {
    host: String,
    chain: Vec<String>,
}

impl PciPath {
    /// From a resolved sysfs device path `…/devices/pci0000:00/0000:00:01.1/…/0000:07:00.0`
    /// (a NIC's path may go on with `net/<if>`; it stops at the last PCI address).
    fn from_resolved(p: &Path) -> Option<PciPath> {
        let comps: Vec<String> = p
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        let at = comps
            .iter()
            .rposition(|c| c.starts_with("pci") && c.len() == 10 && c.as_bytes()[7] == b':')?;
        let chain: Vec<String> = comps[at + 1..]
            .iter()
            .take_while(|c| is_pci_address(c))
            .cloned()
            .collect();
        (!chain.is_empty()).then(|| PciPath {
            host: comps[at].clone(),
            chain,
        })
    }

    fn device(&self) -> &str {
        self.chain.last().map(String::as_str).unwrap_or("")
    }

    /// How near two devices are on the tree (NUMA is decided by the caller).
    fn nearness(&self, other: &PciPath) -> Option<Nearness> {
        if self.host != other.host {
            return None;
        }
        // Bridges in common: the chains without the devices themselves.
        let a = &self.chain[..self.chain.len() - 1];
        let b = &other.chain[..other.chain.len() - 1];
        let common = a.iter().zip(b).take_while(|(x, y)| x == y).count();
        Some(match common {
            0 => Nearness::HostBridge,
            1 => Nearness::RootPort,
            _ => Nearness::Switch,
        })
    }
}

/// Where discover reads from: `<root>/sys` and `<root>/proc`.
#[derive(Debug, Clone)]
pub struct Roots {
    /// The sysfs root (`/sys`).
    pub sys: PathBuf,
    /// The procfs root (`/proc`).
    pub proc: PathBuf,
}

impl Roots {
    /// `/sys` and `/proc` under `root` (`/` for the running system).
    pub fn under(root: &Path) -> Roots {
        Roots {
            sys: root.join("sys"),
            proc: root.join("proc"),
        }
    }
}

/// Reads a small sysfs/procfs file (at most 4 KiB), trimmed.
fn read_small(p: &Path) -> Option<String> {
    let mut s = String::new();
    fs::File::open(p)
        .ok()?
        .take(4096)
        .read_to_string(&mut s)
        .ok()?;
    Some(s.trim().to_string())
}

fn read_hex(p: &Path) -> Option<u32> {
    let s = read_small(p)?;
    u32::from_str_radix(s.trim_start_matches("0x"), 16).ok()
}

fn read_numa(dev: &Path) -> Option<u32> {
    read_small(&dev.join("numa_node"))?
        .parse::<i64>()
        .ok()
        .and_then(|n| u32::try_from(n).ok())
}

/// PCI vendors whose display/3D controllers Slurm schedules as GPUs: NVIDIA and AMD.
const GPU_VENDORS: [u32; 2] = [0x10de, 0x1002];

/// The kernel drivers through which Slurm's jobs use a GPU (`/dev/nvidia<minor>`,
/// `/dev/dri/renderD*`). A GPU bound to no driver, or to another one (`vfio-pci` for a
/// virtual machine, `nouveau`), is no GPU a job can hold.
const GPU_DRIVERS: [&str; 2] = ["nvidia", "amdgpu"];

/// Is a device of this class and vendor a GPU? (Display controllers, base class 0x03, of a GPU
/// vendor: a BMC's VGA is not one.)
fn is_gpu(class: u32, vendor: u32) -> bool {
    class >> 16 == 0x03 && GPU_VENDORS.contains(&vendor)
}

/// The name of the driver bound to a PCI function (the last part of its `driver` link).
fn driver_of(dev: &Path) -> Option<String> {
    fs::read_link(dev.join("driver"))
        .ok()?
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
}

/// The NVIDIA driver's device minor for a GPU (`Device Minor:` in
/// `/proc/driver/nvidia/gpus/<pci>/information`).
fn nvidia_minor(proc_root: &Path, pci: &str) -> Option<u32> {
    let info = read_small(
        &proc_root
            .join("driver/nvidia/gpus")
            .join(pci)
            .join("information"),
    )?;
    info.lines()
        .find_map(|l| l.strip_prefix("Device Minor:"))
        .and_then(|v| v.trim().parse().ok())
}

/// The GPUs under `roots`, with their PCI paths, sorted by index; an error when they cannot be
/// numbered as Slurm numbers them.
///
/// A GPU is a physical function (an SR-IOV virtual function, with a `physfn` link, is a slice
/// of one and is not counted) of a GPU vendor's display class, bound to a GPU driver
/// ([`GPU_DRIVERS`]). NVIDIA GPUs are numbered by the driver's device minor, which is Slurm's
/// index (`File=/dev/nvidia<minor>`, or NVML); each must have one, distinct. AMD GPUs are
/// numbered in PCI address order. A node holding both is not numbered: which index Slurm
/// gives each is not known here.
fn gpus(roots: &Roots) -> Result<Vec<(Gpu, PciPath)>, String> {
    let dir = roots.sys.join("bus/pci/devices");
    let rd = match fs::read_dir(&dir) {
        Ok(rd) => rd,
        // No PCI bus in this sysfs (a container, a VM without PCI): no GPU.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("cannot list {}: {e}", dir.display())),
    };
    let mut found: Vec<(String, PciPath, Option<u32>, bool)> = Vec::new();
    for e in rd.flatten().take(MAX_PCI_DEVICES) {
        let link = e.path();
        let (Some(class), Some(vendor)) = (
            read_hex(&link.join("class")),
            read_hex(&link.join("vendor")),
        ) else {
            continue;
        };
        if !is_gpu(class, vendor) || fs::symlink_metadata(link.join("physfn")).is_ok() {
            continue;
        }
        let Some(path) = fs::canonicalize(&link)
            .ok()
            .and_then(|r| PciPath::from_resolved(&r))
        else {
            continue;
        };
        let pci = path.device().to_string();
        let driver = driver_of(&link);
        if !driver.as_deref().is_some_and(|d| GPU_DRIVERS.contains(&d)) {
            log::info!(
                "GPU {pci} skipped: bound to {}, not a GPU driver ({})",
                driver
                    .as_deref()
                    .map_or("no driver".into(), |d| format!("{d:?}")),
                GPU_DRIVERS.join(", ")
            );
            continue;
        }
        let is_nvidia = driver.as_deref() == Some("nvidia");
        found.push((pci, path, read_numa(&link), is_nvidia));
        if found.len() > MAX_GPUS {
            return Err(format!("more than {MAX_GPUS} GPUs"));
        }
    }
    found.sort_by(|a, b| a.0.cmp(&b.0));
    let nvidia = found.iter().filter(|f| f.3).count();
    if nvidia > 0 && nvidia < found.len() {
        return Err(format!(
            "{nvidia} NVIDIA and {} other GPU(s): how Slurm numbers them is not known",
            found.len() - nvidia
        ));
    }
    let mut seen = BTreeSet::new();
    let mut out = Vec::with_capacity(found.len());
    for (i, (pci, path, numa_node, is_nvidia)) in found.into_iter().enumerate() {
        let index = if is_nvidia {
            let minor = nvidia_minor(&roots.proc, &pci).ok_or_else(|| {
                format!(
                    "GPU {pci}: no device minor in {}",
                    roots
                        .proc
                        .join("driver/nvidia/gpus")
                        .join(&pci)
                        .join("information")
                        .display()
                )
            })?;
            if !seen.insert(minor) {
                return Err(format!(
                    "GPU {pci}: device minor {minor} is another GPU's too"
                ));
            }
            minor
        } else {
            i as u32
        };
        out.push((
            Gpu {
                index,
                pci,
                numa_node,
            },
            path,
        ));
    }
    out.sort_by_key(|g| g.0.index);
    Ok(out)
}

/// Reads the topology of the interfaces `names` (found under `sys_class_net`). `None` when the
/// node has no GPU: there is nothing to attribute. An error when the GPUs cannot be read or
/// numbered (physical functions bound to `nvidia` or `amdgpu`; NVIDIA by device minor, AMD in
/// PCI order; anything else is an error): the caller reports the node without topology.
pub fn read(
    roots: &Roots,
    sys_class_net: &Path,
    names: &[&str],
) -> Result<Option<Topology>, String> {
    let gpus = gpus(roots)?;
    if gpus.is_empty() {
        return Ok(None);
    }
    let mut nics = Vec::new();
    for name in names {
        let dev = sys_class_net.join(name).join("device");
        let Some(path) = fs::canonicalize(&dev)
            .ok()
            .and_then(|r| PciPath::from_resolved(&r))
        else {
            continue; // not a PCI device (virtual, USB, …)
        };
        let numa_node = read_numa(&dev);
        let level = |g: &(Gpu, PciPath)| {
            path.nearness(&g.1).unwrap_or_else(|| {
                if numa_node.is_some() && numa_node == g.0.numa_node {
                    Nearness::Numa
                } else {
                    Nearness::None
                }
            })
        };
        let near = gpus.iter().map(level).min().unwrap_or(Nearness::None);
        let near_gpus: Vec<u32> = if near == Nearness::None {
            Vec::new()
        } else {
            gpus.iter()
                .filter(|g| level(g) == near)
                .map(|g| g.0.index)
                .collect()
        };
        nics.push(NicTopology {
            name: name.to_string(),
            pci: path.device().to_string(),
            numa_node,
            gpus: near_gpus,
            near,
        });
    }
    let t = Topology {
        gpus: gpus.into_iter().map(|g| g.0).collect(),
        nics,
    };
    t.validate(&names.iter().copied().collect())?;
    Ok(Some(t))
}

/// NIC name → nearest GPU indices, for tests and `discover` summaries.
pub fn nic_map(t: &Topology) -> BTreeMap<String, Vec<u32>> {
    t.nics
        .iter()
        .map(|n| (n.name.clone(), n.gpus.clone()))
        .collect()
}

/// Test support: the sysfs/procfs trees of `tests/fixtures/topology/gen.sh`.
#[cfg(test)]
pub mod fixtures {
    use crate::discovery::record::DiscoverRecord;
    use crate::discovery::{self, Filter};
    use std::path::PathBuf;

    /// Generates layout `layout` (NIC MACs start with `mac_prefix`) in a fresh directory.
    pub fn tree(layout: &str, mac_prefix: &str) -> PathBuf {
        tree_with(layout, mac_prefix, &[])
    }

    /// As [`tree`], with gen.sh's environment variables (`GPU_VFS`, `DRIVERLESS`).
    pub fn tree_with(layout: &str, mac_prefix: &str, env: &[(&str, &str)]) -> PathBuf {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "cvslurm-topo-{layout}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let gen = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/topology/gen.sh"
        );
        let st = std::process::Command::new("bash")
            .args([gen, layout])
            .arg(&dir)
            .arg(mac_prefix)
            .envs(env.iter().copied())
            .status()
            .expect("bash runs");
        assert!(st.success(), "gen.sh {layout} failed");
        dir
    }

    /// The discover record of node `node` with layout `layout`, as `discover --topology
    /// --sys-root <tree> --require-ip no` builds it (default name filter, physical NICs).
    pub fn record(node: &str, layout: &str, mac_prefix: &str) -> DiscoverRecord {
        record_with(node, layout, mac_prefix, &[])
    }

    /// As [`record`], on a tree made with gen.sh's environment variables.
    pub fn record_with(
        node: &str,
        layout: &str,
        mac_prefix: &str,
        env: &[(&str, &str)],
    ) -> DiscoverRecord {
        let dir = tree_with(layout, mac_prefix, env);
        let roots = super::Roots::under(&dir);
        let filter = Filter {
            name_regex: crate::config::Config::default().interface_regex,
            physical_only: true,
            require_ip: false,
        };
        let net = roots.sys.join("class/net");
        let interfaces = discovery::interfaces(&net, &Default::default(), &filter).unwrap();
        let names: Vec<&str> = interfaces.iter().map(|i| i.name.as_str()).collect();
        let topology = super::read(&roots, &net, &names).unwrap();
        let rec = DiscoverRecord {
            node_name: node.into(),
            hostname: node.into(),
            location: None,
            interfaces,
            topology,
            topology_error: None,
        };
        rec.validate().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        rec
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(v: &[(&str, &[u32])]) -> BTreeMap<String, Vec<u32>> {
        v.iter().map(|(n, g)| (n.to_string(), g.to_vec())).collect()
    }

    /// DGX A100: each compute NIC serves the two GPUs behind its PCIe switch; the storage
    /// NICs only share socket 1 (NUMA node 1) with GPUs 4-7; the BMC's VGA is no GPU.
    #[test]
    fn dgx_a100_nic_to_gpu() {
        let rec = fixtures::record("dgx1", "dgx-a100", "02:dd:00:01");
        let t = rec.topology.as_ref().unwrap();
        let idx: Vec<(u32, &str, Option<u32>)> = t
            .gpus
            .iter()
            .map(|g| (g.index, g.pci.as_str(), g.numa_node))
            .collect();
        assert_eq!(
            idx,
            [
                (0, "0000:07:00.0", Some(0)),
                (1, "0000:0f:00.0", Some(0)),
                (2, "0000:47:00.0", Some(0)),
                (3, "0000:4e:00.0", Some(0)),
                (4, "0000:87:00.0", Some(1)),
                (5, "0000:90:00.0", Some(1)),
                (6, "0000:b7:00.0", Some(1)),
                (7, "0000:bd:00.0", Some(1)),
            ]
        );
        assert_eq!(
            nic_map(t),
            map(&[
                ("enp12s0", &[0, 1]),
                ("enp18s0", &[0, 1]),
                ("enp75s0", &[2, 3]),
                ("enp84s0", &[2, 3]),
                ("enp141s0", &[4, 5]),
                ("enp148s0", &[4, 5]),
                ("enp186s0", &[6, 7]),
                ("enp204s0", &[6, 7]),
                ("enp225s0f0", &[4, 5, 6, 7]),
                ("enp225s0f1", &[4, 5, 6, 7]),
            ])
        );
        assert_eq!(t.nic("enp12s0").unwrap().near, Nearness::Switch);
        assert_eq!(t.nic("enp12s0").unwrap().pci, "0000:0c:00.0");
        assert_eq!(t.nic("enp225s0f1").unwrap().near, Nearness::Numa);
        let mac = &rec
            .interfaces
            .iter()
            .find(|i| i.name == "enp84s0")
            .unwrap()
            .mac_address;
        assert_eq!(mac, "02:dd:00:01:54:00");
    }

    /// Two sockets, each GPU and NIC on its own host bridge: NICs serve their socket's GPUs.
    #[test]
    fn two_socket_nic_to_gpu() {
        let rec = fixtures::record("pcie1", "two-socket", "02:dd:00:02");
        let t = rec.topology.as_ref().unwrap();
        assert_eq!(t.gpus.len(), 4);
        assert_eq!(
            nic_map(t),
            map(&[
                ("eno1", &[0, 1]),
                ("ens3f0", &[0, 1]),
                ("ens3f1", &[0, 1]),
                ("ens7f0", &[2, 3]),
                ("ens7f1", &[2, 3]),
            ])
        );
        assert!(t.nics.iter().all(|n| n.near == Nearness::Numa));
    }

    /// NVIDIA GPUs are numbered by the driver's minors, whatever their PCI order; GPUs that
    /// cannot be numbered as Slurm numbers them (a repeated minor, no minor, NVIDIA beside AMD)
    /// give an error, never a guess; AMD GPUs go in PCI order; without GPUs there is no
    /// topology at all.
    #[test]
    fn gpu_numbering_by_minor_or_pci_order_never_a_guess() {
        let dir = fixtures::tree("two-socket", "02:dd:00:03");
        let roots = Roots::under(&dir);
        let set_minor = |pci: &str, from: u32, to: u32| {
            let info = roots
                .proc
                .join("driver/nvidia/gpus")
                .join(pci)
                .join("information");
            let text = fs::read_to_string(&info).unwrap();
            let new = text.replace(
                &format!("Device Minor: \t {from}\n"),
                &format!("Device Minor: \t {to}\n"),
            );
            assert_ne!(text, new);
            fs::write(&info, new).unwrap();
        };
        let dev = |pci: &str| roots.sys.join("bus/pci/devices").join(pci);
        let net = roots.sys.join("class/net");
        // The driver's minors win over PCI order...
        set_minor("0000:17:00.0", 0, 1);
        set_minor("0000:31:00.0", 1, 0);
        let t = read(&roots, &net, &["ens3f0"]).unwrap().unwrap();
        assert_eq!(
            (t.gpus[0].index, t.gpus[0].pci.as_str()),
            (0, "0000:31:00.0")
        );
        assert_eq!(
            (t.gpus[1].index, t.gpus[1].pci.as_str()),
            (1, "0000:17:00.0")
        );
        // ...and two GPUs claiming the same one, or GPUs bound to nvidia without one, are an
        // error: PCI order could give a job another job's NICs.
        set_minor("0000:31:00.0", 0, 1);
        let e = read(&roots, &net, &["ens3f0"]).unwrap_err();
        assert!(e.contains("device minor 1 is another GPU's too"), "{e}");
        fs::remove_dir_all(roots.proc.join("driver")).unwrap();
        let e = read(&roots, &net, &["ens3f0"]).unwrap_err();
        assert!(e.contains("GPU 0000:17:00.0: no device minor in"), "{e}");
        // AMD GPUs (amdgpu) are numbered in PCI order; beside NVIDIA ones, not at all.
        let amd = |pci: &str| {
            fs::write(dev(pci).join("vendor"), "0x1002\n").unwrap();
            let link = dev(pci).join("driver");
            let to = fs::read_link(&link).unwrap().with_file_name("amdgpu");
            fs::remove_file(&link).unwrap();
            std::os::unix::fs::symlink(to, &link).unwrap();
        };
        amd("0000:17:00.0");
        let e = read(&roots, &net, &["ens3f0"]).unwrap_err();
        assert!(e.contains("3 NVIDIA and 1 other GPU(s)"), "{e}");
        for g in ["0000:31:00.0", "0000:98:00.0", "0000:b1:00.0"] {
            amd(g);
        }
        let t = read(&roots, &net, &["ens3f0", "lo"]).unwrap().unwrap();
        assert_eq!(
            t.gpus.iter().map(|g| g.index).collect::<Vec<_>>(),
            [0, 1, 2, 3]
        );
        assert_eq!(nic_map(&t), map(&[("ens3f0", &[0, 1])]));
        for g in [
            "0000:17:00.0",
            "0000:31:00.0",
            "0000:98:00.0",
            "0000:b1:00.0",
        ] {
            fs::write(dev(g).join("class"), "0x020000\n").unwrap();
        }
        assert_eq!(read(&roots, &net, &["ens3f0"]), Ok(None));
        fs::remove_dir_all(&dir).unwrap();
    }

    /// SR-IOV virtual functions are slices of a GPU, not GPUs: a DGX A100 with 16 VFs per GPU
    /// (bound to nvidia, as on a vGPU host) has the same 8 GPUs and NIC nearness as without.
    /// Before, its 136 functions were "more than 64 GPUs" and the node lost its record.
    #[test]
    fn virtual_functions_are_not_gpus() {
        let plain = fixtures::record("dgx1", "dgx-a100", "02:dd:00:01");
        let vfs = fixtures::record_with("dgx1", "dgx-a100", "02:dd:00:01", &[("GPU_VFS", "16")]);
        let t = vfs.topology.as_ref().unwrap();
        assert_eq!(t.gpus.len(), 8);
        assert_eq!(vfs, plain);
        // The tree does hold them: 16 functions bound to nvidia behind each GPU.
        let dir = fixtures::tree_with("dgx-a100", "02:dd:00:01", &[("GPU_VFS", "16")]);
        let vf = dir.join("sys/bus/pci/devices/0000:07:02.3");
        assert!(vf.join("physfn").exists());
        assert_eq!(driver_of(&vf).as_deref(), Some("nvidia"));
        fs::remove_dir_all(&dir).unwrap();
    }

    /// A GPU bound to no driver is no GPU a job can hold: it is skipped, and the others keep
    /// their minors. Before, it switched every GPU to PCI order: GPUs 1-3 became 0-2, and a job
    /// holding GPUs 2-3 was sent with the NICs of the GPUs another job held.
    #[test]
    fn a_driverless_gpu_is_skipped_and_the_others_keep_their_numbers() {
        let rec = fixtures::record_with(
            "pcie1",
            "two-socket",
            "02:dd:00:04",
            &[("DRIVERLESS", "0000:17:00.0")],
        );
        let t = rec.topology.as_ref().unwrap();
        let idx: Vec<(u32, &str)> = t.gpus.iter().map(|g| (g.index, g.pci.as_str())).collect();
        assert_eq!(
            idx,
            [
                (1, "0000:31:00.0"),
                (2, "0000:98:00.0"),
                (3, "0000:b1:00.0")
            ]
        );
        assert_eq!(
            nic_map(t),
            map(&[
                ("eno1", &[1]),
                ("ens3f0", &[1]),
                ("ens3f1", &[1]),
                ("ens7f0", &[2, 3]),
                ("ens7f1", &[2, 3]),
            ])
        );
        // A job holding GPUs 2-3 gets socket 1's NICs (MACs: prefix, bus 0xca, function).
        let records = BTreeMap::from([("pcie1".to_string(), rec)]);
        let gpus = BTreeMap::from([("pcie1".to_string(), BTreeSet::from([2, 3]))]);
        let a = crate::inventory::attribution::attribute(
            crate::config::JobInterfaces::Gpu,
            &["pcie1".to_string()],
            &gpus,
            &records,
        );
        assert_eq!(
            a.macs.unwrap(),
            ["02:dd:00:04:ca:00", "02:dd:00:04:ca:01"],
            "{}",
            a.rule
        );
    }

    #[test]
    fn pci_addresses() {
        assert!(is_pci_address("0000:07:00.0"));
        assert!(!is_pci_address("0000:07:00.8"));
        assert!(!is_pci_address("0000:07:00"));
        assert!(!is_pci_address("0000:0G:00.0"));
        assert!(!is_pci_address("0000:07:00.0 "));
    }

    #[test]
    fn pci_paths_and_nearness() {
        let p = |s: &str| PciPath::from_resolved(Path::new(s)).unwrap();
        let gpu =
            p("/x/sys/devices/pci0000:00/0000:00:01.1/0000:01:00.0/0000:02:00.0/0000:07:00.0");
        let nic = p("/x/sys/devices/pci0000:00/0000:00:01.1/0000:01:00.0/0000:02:01.0/0000:0c:00.0/net/enp12s0");
        assert_eq!(nic.device(), "0000:0c:00.0");
        assert_eq!(nic.nearness(&gpu), Some(Nearness::Switch));
        let rp = p("/sys/devices/pci0000:00/0000:00:01.1/0000:01:00.1");
        let rp2 = p("/sys/devices/pci0000:00/0000:00:01.1/0000:01:00.0");
        assert_eq!(rp.nearness(&rp2), Some(Nearness::RootPort));
        let hb = p("/sys/devices/pci0000:00/0000:00:03.1/0000:21:00.0");
        assert_eq!(hb.nearness(&gpu), Some(Nearness::HostBridge));
        let other = p("/sys/devices/pci0000:40/0000:40:01.1/0000:41:00.0");
        assert_eq!(other.nearness(&gpu), None);
        assert!(PciPath::from_resolved(Path::new("/sys/devices/virtual/net/lo")).is_none());
    }
}
