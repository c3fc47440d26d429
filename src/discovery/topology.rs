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

/// The most MIG instances one GPU may report (an A100 or H100 splits into at most 7).
pub const MAX_MIGS_PER_GPU: usize = 8;
/// The largest GPU instance, compute instance or capability minor number accepted.
const MAX_MIG_NUMBER: u32 = 1 << 20;

/// One MIG instance: a compute instance of a GPU instance of an NVIDIA GPU in MIG mode. To
/// Slurm (gres.conf `AutoDetect=nvml`) each is a GPU of its own, whose `File` is the parent's
/// `/dev/nvidia<minor>` and the capability devices `/dev/nvidia-caps/nvidia-cap<gi_cap>`,
/// `/dev/nvidia-caps/nvidia-cap<ci_cap>`; its GRES index comes from [`Topology::slurm_indices`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mig {
    /// The parent GPU's index (its device minor).
    pub gpu: u32,
    /// The GPU instance id.
    pub gi: u32,
    /// The compute instance id within the GPU instance.
    pub ci: u32,
    /// The GPU instance's capability minor (`/proc/driver/nvidia-caps/mig-minors`).
    pub gi_cap: u32,
    /// The compute instance's capability minor.
    pub ci_cap: u32,
}

/// A node's GPUs and the GPU nearness of its reported NICs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Topology {
    /// The GPUs, by index.
    pub gpus: Vec<Gpu>,
    /// The reported interfaces that are PCI devices, by name.
    pub nics: Vec<NicTopology>,
    /// The MIG instances of the GPUs in MIG mode (absent when none is).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub migs: Vec<Mig>,
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
        let mut per_gpu: BTreeMap<u32, usize> = BTreeMap::new();
        let mut ids = BTreeSet::new();
        let mut caps = BTreeSet::new();
        for m in &self.migs {
            let n = per_gpu.entry(m.gpu).or_default();
            *n += 1;
            if !idx.contains(&m.gpu) || *n > MAX_MIGS_PER_GPU {
                return Err(format!(
                    "topology: MIG instance of unknown GPU {}, or more than {MAX_MIGS_PER_GPU} on it",
                    m.gpu
                ));
            }
            if [m.gi, m.ci, m.gi_cap, m.ci_cap]
                .iter()
                .any(|v| *v >= MAX_MIG_NUMBER)
                || !ids.insert((m.gpu, m.gi, m.ci))
                || !caps.insert(m.ci_cap)
            {
                return Err(format!(
                    "topology: bad or repeated MIG instance gpu{}/gi{}/ci{}",
                    m.gpu, m.gi, m.ci
                ));
            }
        }
        Ok(())
    }

    /// Slurm's GRES index of each GPU it schedules on this node → the index of the physical
    /// GPU it is (or, for a MIG instance, is part of).
    ///
    /// Without MIG instances, the GPUs' own indices (device minors). With them, the order
    /// in which slurmd (`AutoDetect=nvml`, Slurm 23.02.7 and later) lists the node's GPUs,
    /// which is the GRES index: records sorted by `File` in natural order, then by their
    /// `Links` position with records without links last (`gres_gpu.c:609-614` and
    /// `_sort_gpu_by_links_order`, `:354-372@slurm-24-11-6-1`). Whole GPUs have links
    /// (NVML's enumeration order, which is PCI address order) and come first; MIG instances
    /// have none (`gpu_nvml.c:1492-1519@slurm-24-11-6-1`) and follow, in the natural order of
    /// their `File` `/dev/nvidia<parent>,/dev/nvidia-caps/nvidia-cap<gi_cap>,…<ci_cap>`:
    /// by parent minor, then capability minors.
    pub fn slurm_indices(&self) -> BTreeMap<u32, u32> {
        if self.migs.is_empty() {
            return self.gpus.iter().map(|g| (g.index, g.index)).collect();
        }
        let parents: BTreeSet<u32> = self.migs.iter().map(|m| m.gpu).collect();
        let mut whole: Vec<&Gpu> = self
            .gpus
            .iter()
            .filter(|g| !parents.contains(&g.index))
            .collect();
        whole.sort_by(|a, b| a.pci.cmp(&b.pci));
        let mut migs: Vec<&Mig> = self.migs.iter().collect();
        migs.sort_by_key(|m| (m.gpu, m.gi_cap, m.ci_cap));
        whole
            .iter()
            .map(|g| g.index)
            .chain(migs.iter().map(|m| m.gpu))
            .enumerate()
            .map(|(i, g)| (i as u32, g))
            .collect()
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

/// The most bytes read of `/proc/driver/nvidia-caps/mig-minors` (the driver's table is a few
/// tens of kB for 8 GPUs).
const MAX_MIG_MINORS_BYTES: u64 = 1 << 20;

/// The most entries looked at in one `capabilities` directory.
const MAX_CAP_ENTRIES: usize = 64;

/// The MIG instances of the NVIDIA GPUs with device minors `minors`: each compute instance
/// directory `<proc>/driver/nvidia/capabilities/gpu<minor>/mig/gi<G>/ci<C>` (present only
/// for instances that exist), with the capability minors Slurm gives it from
/// `<proc>/driver/nvidia-caps/mig-minors` (`gpu<minor>/gi<G>/access <n>`,
/// `gpu<minor>/gi<G>/ci<C>/access <n>`; `gpu_nvml.c:1074-1140@slurm-24-11-6-1`). An instance
/// whose minors the table lacks is an error: its GRES index could not be known.
fn migs(proc_root: &Path, minors: &[u32]) -> Result<Vec<Mig>, String> {
    let numbered = |name: &str, prefix: &str| -> Option<u32> {
        let v = name.strip_prefix(prefix)?;
        (!v.is_empty() && v.len() <= 7 && v.bytes().all(|b| b.is_ascii_digit()))
            .then(|| v.parse().ok())
            .flatten()
            .filter(|n| *n < MAX_MIG_NUMBER)
    };
    let list = |dir: &Path, prefix: &str| -> Result<Vec<u32>, String> {
        let rd = match fs::read_dir(dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(format!("cannot list {}: {e}", dir.display())),
        };
        let mut out: Vec<u32> = rd
            .flatten()
            .take(MAX_CAP_ENTRIES)
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| numbered(&e.file_name().to_string_lossy(), prefix))
            .collect();
        out.sort_unstable();
        Ok(out)
    };
    let mut found = Vec::new();
    for &m in minors {
        let dir = proc_root.join(format!("driver/nvidia/capabilities/gpu{m}/mig"));
        let mut n = 0;
        for gi in list(&dir, "gi")? {
            for ci in list(&dir.join(format!("gi{gi}")), "ci")? {
                n += 1;
                if n > MAX_MIGS_PER_GPU {
                    return Err(format!(
                        "GPU {m}: more than {MAX_MIGS_PER_GPU} MIG instances in {}",
                        dir.display()
                    ));
                }
                found.push((m, gi, ci));
            }
        }
    }
    if found.is_empty() {
        return Ok(Vec::new());
    }
    let table_path = proc_root.join("driver/nvidia-caps/mig-minors");
    let mut table = String::new();
    fs::File::open(&table_path)
        .and_then(|f| f.take(MAX_MIG_MINORS_BYTES).read_to_string(&mut table))
        .map_err(|e| {
            format!(
                "MIG instances, but cannot read {}: {e}",
                table_path.display()
            )
        })?;
    let minors: BTreeMap<&str, u32> = table
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k, v.trim().parse().ok().filter(|n| *n < MAX_MIG_NUMBER)?))
        })
        .collect();
    found
        .into_iter()
        .map(|(m, gi, ci)| {
            let cap = |k: String| {
                minors
                    .get(k.as_str())
                    .copied()
                    .ok_or_else(|| format!("MIG instance: no {k} in {}", table_path.display()))
            };
            Ok(Mig {
                gpu: m,
                gi,
                ci,
                gi_cap: cap(format!("gpu{m}/gi{gi}/access"))?,
                ci_cap: cap(format!("gpu{m}/gi{gi}/ci{ci}/access"))?,
            })
        })
        .collect()
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
    let nvidia: Vec<u32> = gpus
        .iter()
        .filter(|g| {
            driver_of(&roots.sys.join("bus/pci/devices").join(&g.0.pci)).as_deref()
                == Some("nvidia")
        })
        .map(|g| g.0.index)
        .collect();
    let migs = migs(&roots.proc, &nvidia)?;
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
        migs,
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
            taken_at: None,
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

    /// MIG instances: read from the driver's capability tree with the minors of its
    /// `mig-minors` table, numbered as slurmd numbers them (whole GPUs first in PCI order,
    /// then MIG instances by parent and capability minors), each mapped to its parent GPU's
    /// NICs. The expected sets are worked out by hand from gen.sh's two-socket tree:
    ///
    /// | GRES index | what (caps)              | GPU | NICs                 |
    /// |------------|--------------------------|-----|----------------------|
    /// | 0          | whole GPU 31:00.0        | 1   | eno1, ens3f0, ens3f1 |
    /// | 1          | whole GPU 98:00.0        | 2   | ens7f0, ens7f1       |
    /// | 2          | gpu0/gi1/ci0 (12, 13)    | 0   | eno1, ens3f0, ens3f1 |
    /// | 3          | gpu0/gi2/ci0 (21, 22)    | 0   | eno1, ens3f0, ens3f1 |
    /// | 4          | gpu3/gi1/ci0 (417, 418)  | 3   | ens7f0, ens7f1       |
    /// | 5          | gpu3/gi1/ci1 (417, 419)  | 3   | ens7f0, ens7f1       |
    #[test]
    fn mig_instances_map_to_their_parent_gpus_nics() {
        use crate::config::JobInterfaces::{Auto, Gpu};
        use crate::inventory::attribution::attribute;
        let rec = fixtures::record_with(
            "mig1",
            "two-socket",
            "02:dd:00:05",
            &[("MIG", "0:1/0 0:2/0 3:1/0 3:1/1")],
        );
        let t = rec.topology.as_ref().unwrap();
        let m = |gpu, gi, ci, gi_cap, ci_cap| Mig {
            gpu,
            gi,
            ci,
            gi_cap,
            ci_cap,
        };
        assert_eq!(
            t.migs,
            [
                m(0, 1, 0, 12, 13),
                m(0, 2, 0, 21, 22),
                m(3, 1, 0, 417, 418),
                m(3, 1, 1, 417, 419)
            ]
        );
        assert_eq!(
            t.slurm_indices(),
            BTreeMap::from([(0, 1), (1, 2), (2, 0), (3, 0), (4, 3), (5, 3)])
        );
        let records = BTreeMap::from([("mig1".to_string(), rec)]);
        let socket0 = [
            "02:dd:00:05:04:00",
            "02:dd:00:05:4b:00",
            "02:dd:00:05:4b:01",
        ];
        let socket1 = ["02:dd:00:05:ca:00", "02:dd:00:05:ca:01"];
        let both = [socket0.as_slice(), &socket1].concat();
        let table: [(&[u32], Option<&[&str]>); 8] = [
            (&[0], Some(&socket0)),
            (&[1], Some(&socket1)),
            (&[2], Some(&socket0)),
            (&[3], Some(&socket0)),
            (&[4], Some(&socket1)),
            (&[5], Some(&socket1)),
            (&[2, 5], Some(&both)),
            // Every GPU of the node: by node name.
            (&[0, 1, 2, 3, 4, 5], None),
        ];
        for (held, want) in table {
            let gpus = BTreeMap::from([("mig1".to_string(), held.iter().copied().collect())]);
            for mode in [Gpu, Auto] {
                let a = attribute(mode, &["mig1".to_string()], &gpus, &records);
                let mut want: Option<Vec<String>> =
                    want.map(|w| w.iter().map(|s| s.to_string()).collect());
                if let Some(w) = &mut want {
                    w.sort();
                }
                assert_eq!(a.macs, want, "{held:?}: {}", a.rule);
            }
        }
        let a = attribute(
            Gpu,
            &["mig1".to_string()],
            &BTreeMap::from([("mig1".to_string(), BTreeSet::from([4]))]),
            &records,
        );
        assert_eq!(
            a.rule,
            "interfaces (gpu): mig1: GPUs 4 (on GPUs 3) -> ens7f0,ens7f1 (same NUMA node)"
        );
        // An index the node does not have (index 6 would be a GPU's minor plus MIG count).
        let a = attribute(
            Gpu,
            &["mig1".to_string()],
            &BTreeMap::from([("mig1".to_string(), BTreeSet::from([6]))]),
            &records,
        );
        assert_eq!(a.macs, None);
    }

    /// On a DGX A100 with only GPU 5 in MIG mode, GRES indices 5 and 6 are GPUs 6 and 7 and
    /// the two MIG instances are 7 and 8: a job on MIG index 7 gets GPU 5's NICs (its switch's
    /// two compute NICs and the socket's storage NIC), not those of a GPU with minor 7.
    #[test]
    fn mig_index_is_not_the_device_minor() {
        let rec =
            fixtures::record_with("dgx1", "dgx-a100", "02:dd:00:01", &[("MIG", "5:1/0 5:2/0")]);
        let t = rec.topology.as_ref().unwrap();
        assert_eq!(
            t.slurm_indices(),
            BTreeMap::from([
                (0, 0),
                (1, 1),
                (2, 2),
                (3, 3),
                (4, 4),
                (5, 6),
                (6, 7),
                (7, 5),
                (8, 5)
            ])
        );
        let records = BTreeMap::from([("dgx1".to_string(), rec)]);
        let on = |idx: u32| {
            let gpus = BTreeMap::from([("dgx1".to_string(), BTreeSet::from([idx]))]);
            let a = crate::inventory::attribution::attribute(
                crate::config::JobInterfaces::Gpu,
                &["dgx1".to_string()],
                &gpus,
                &records,
            );
            a.macs.unwrap()
        };
        // Switch 3 (GPUs 4-5): buses 8d, 94; switch 4 (GPUs 6-7): ba, cc; storage e1.
        let storage = ["02:dd:00:01:e1:00", "02:dd:00:01:e1:01"];
        assert_eq!(
            on(7),
            [
                ["02:dd:00:01:8d:00", "02:dd:00:01:94:00"].as_slice(),
                &storage
            ]
            .concat()
        );
        assert_eq!(on(8), on(7));
        assert_eq!(
            on(5),
            [
                ["02:dd:00:01:ba:00", "02:dd:00:01:cc:00"].as_slice(),
                &storage
            ]
            .concat()
        );
        // A record without MIG instances is as before (no "migs" key at all).
        let plain = fixtures::record("dgx1", "dgx-a100", "02:dd:00:01");
        assert!(!serde_json::to_string(&plain).unwrap().contains("migs"));
    }

    /// MIG instances the driver's minor table does not list, or too many, are an error.
    #[test]
    fn mig_instances_that_cannot_be_numbered_are_an_error() {
        let dir = fixtures::tree_with("two-socket", "02:dd:00:06", &[("MIG", "1:1/0")]);
        let roots = Roots::under(&dir);
        let net = roots.sys.join("class/net");
        let table = roots.proc.join("driver/nvidia-caps/mig-minors");
        let text = fs::read_to_string(&table).unwrap();
        fs::write(
            &table,
            text.replace("gpu1/gi1/ci0/access", "gpu1/gi1/ci9/access"),
        )
        .unwrap();
        let e = read(&roots, &net, &["ens3f0"]).unwrap_err();
        assert!(e.contains("no gpu1/gi1/ci0/access in"), "{e}");
        fs::remove_file(&table).unwrap();
        let e = read(&roots, &net, &["ens3f0"]).unwrap_err();
        assert!(e.contains("MIG instances, but cannot read"), "{e}");
        fs::write(&table, text).unwrap();
        let gi = roots.proc.join("driver/nvidia/capabilities/gpu1/mig/gi1");
        for c in 1..9 {
            fs::create_dir_all(gi.join(format!("ci{c}"))).unwrap();
        }
        let e = read(&roots, &net, &["ens3f0"]).unwrap_err();
        assert!(e.contains("more than 8 MIG instances"), "{e}");
        fs::remove_dir_all(&dir).unwrap();
        // Hostile records: a MIG instance of an unknown GPU, or repeated.
        let mut rec =
            fixtures::record_with("mig1", "two-socket", "02:dd:00:05", &[("MIG", "0:1/0")]);
        rec.topology.as_mut().unwrap().migs[0].gpu = 9;
        assert!(rec.validate().is_err());
        let mut rec =
            fixtures::record_with("mig1", "two-socket", "02:dd:00:05", &[("MIG", "0:1/0")]);
        let t = rec.topology.as_mut().unwrap();
        t.migs.push(t.migs[0].clone());
        assert!(rec.validate().is_err());
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
