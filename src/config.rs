//! `cloudvision.conf`: slurm.conf-style `Key=Value` lines, `#` comments (`\#` for a literal
//! `#`), case-insensitive keys. UTF-8 text; a byte that is not spoils at most its own line.
//!
//! The file is found at `--config PATH`, else `$CVSLURM_CONF`, else
//! `/etc/slurm/cloudvision.conf`. A missing default file means "all defaults" (the environment
//! may still name the server); a missing file that was asked for by name is an error. The
//! environment variables `CV_API_SERVER`, `CV_API_TOKEN` and `CV_LOG_FILE` override the file.

use regex_lite::Regex;
use std::fmt;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where the configuration is read from when nothing else is said.
pub const DEFAULT_PATH: &str = "/etc/slurm/cloudvision.conf";

/// `SlurmOutputMaxMiB`'s default, in bytes: the most output read from one Slurm command
/// (the runner's `runner::MAX_OUTPUT`).
pub const SLURM_OUTPUT_MAX_DEFAULT: u64 = 64 * 1024 * 1024;

/// A configuration problem, naming the file, line and key where there is one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

/// The CloudVision API token. Its `Debug` and `Display` never show the value.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl Token {
    /// Wraps a token, trimming surrounding white space; `None` when it is empty.
    pub fn new(s: &str) -> Option<Token> {
        let t = s.trim();
        (!t.is_empty()).then(|| Token(t.to_string()))
    }

    /// The secret itself, for the `Authorization` header only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// `JobInterfaces`: how a job's place in the fabric is told to CloudVision (the rules are
/// in `crate::inventory::attribution`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum JobInterfaces {
    /// Node names only (every port of the job's nodes is the job's).
    #[default]
    Nodes,
    /// A job holding part of a node's GPUs is sent as the MACs of the NICs nearest them.
    /// A node of the job where it holds none of the GPUs adds no NIC.
    Gpu,
    /// As `gpu`, but any doubt (a node without topology, a node where the job holds no GPU
    /// of a GPU node, GPUs with no near NIC) sends node names.
    Auto,
}

impl JobInterfaces {
    /// Parses `nodes`, `gpu` or `auto` (any case).
    pub fn parse(v: &str) -> Result<JobInterfaces, String> {
        match v.trim().to_ascii_lowercase().as_str() {
            "nodes" => Ok(JobInterfaces::Nodes),
            "gpu" => Ok(JobInterfaces::Gpu),
            "auto" => Ok(JobInterfaces::Auto),
            _ => Err(format!("{v:?} is not one of nodes, gpu, auto")),
        }
    }

    /// The configuration word.
    pub fn word(self) -> &'static str {
        match self {
            JobInterfaces::Nodes => "nodes",
            JobInterfaces::Gpu => "gpu",
            JobInterfaces::Auto => "auto",
        }
    }
}

/// `NodeHostname`: what NodeConfig's `hostname` carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NodeHostname {
    /// The Slurm node name (`key.id` without a cluster qualifier), as Arista's own clients
    /// send it (and Arista's fake server requires).
    #[default]
    NodeName,
    /// The worker's own host name up to the first dot (what `discover` reports), for sites
    /// where CloudVision matches LLDP neighbours by system name and NodeName differs from it.
    HostName,
}

impl NodeHostname {
    /// Parses `nodename` or `hostname` (any case).
    pub fn parse(v: &str) -> Result<NodeHostname, String> {
        match v.trim().to_ascii_lowercase().as_str() {
            "nodename" => Ok(NodeHostname::NodeName),
            "hostname" => Ok(NodeHostname::HostName),
            _ => Err(format!("{v:?} is not one of nodename, hostname")),
        }
    }

    /// The configuration word.
    pub fn word(self) -> &'static str {
        match self {
            NodeHostname::NodeName => "nodename",
            NodeHostname::HostName => "hostname",
        }
    }
}

/// Everything cvslurm can be told by `cloudvision.conf` and the environment.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file this came from, if any.
    pub source: Option<PathBuf>,
    /// Lines of the file that were ignored (unknown key, bad value), each naming the file,
    /// line and key. Every other line applies; `cvslurm check` fails on these, the other
    /// modes log them.
    pub problems: Vec<ConfigError>,
    /// The bad lines of [`TLS_KEYS`] (also in `problems`): while there is one, the client
    /// refuses to connect ([`Config::tls_refusal`]).
    pub tls_problems: Vec<ConfigError>,
    /// A bad value in the environment (`CV_API_SERVER`): an error for every mode but the hook,
    /// which logs it.
    pub env_error: Option<ConfigError>,
    /// `ApiServer`: CloudVision host, optionally `host:port` (no scheme needed).
    pub api_server: Option<String>,
    /// `ApiTokenFile`: file holding the token; must not be readable by group or others.
    pub api_token_file: Option<PathBuf>,
    /// The token from `CV_API_TOKEN` (or the command line), which wins over the file.
    pub api_token: Option<Token>,
    /// `CaFile`: PEM file of extra CA certificates (an on-prem CA), added to the system roots.
    pub ca_file: Option<PathBuf>,
    /// `ApiServerPin`: SHA-256 pins (`sha256//<base64>`) of the server's public key; when
    /// set, only a server holding one of these keys is accepted, CA or not.
    pub api_server_pins: Vec<[u8; 32]>,
    /// `Insecure`: turn TLS verification off (logged as a warning every run).
    pub insecure: bool,
    /// `LogFile`: where the hook and the service append their log lines.
    pub log_file: PathBuf,
    /// `LogLevel`: error, warn, info, debug or trace.
    pub log_level: log::LevelFilter,
    /// `JobNameInclude`: only jobs whose name matches this regex are sent.
    pub job_name_include: Option<Regex>,
    /// `JobNameExclude`: jobs whose name matches this regex are not sent.
    pub job_name_exclude: Option<Regex>,
    /// `Partitions`: only jobs in these partitions are sent (empty: all).
    pub partitions: Vec<String>,
    /// `PollInterval`: seconds between inventory polls in `--monitor`.
    pub poll_interval: Duration,
    /// `InterfaceRegex`: interface names that `discover` reports.
    pub interface_regex: Regex,
    /// `InterfacePhysicalOnly`: report only NICs with a `device` link in sysfs.
    pub interface_physical_only: bool,
    /// `InterfaceRequireIp`: skip NICs without an IPv4 address.
    pub interface_require_ip: bool,
    /// `WorkerRecords`: take the record a node published itself (`cvslurm publish`, in its
    /// Slurm `Extra` field) for a node that discovery's srun cannot reach (every CPU held by
    /// another user's job).
    pub worker_records: bool,
    /// `DiscoveryJobName`: the srun job name of inventory discovery.
    pub discovery_job_name: String,
    /// `DiscoveryTimeout`: how long one discovery srun may take.
    pub discovery_timeout: Duration,
    /// `DiscoveryBcast`: let srun copy the binary to the workers (`srun --bcast`). Refused
    /// (a problem, and left off) without [`Config::discovery_bcast_dir`].
    pub discovery_bcast: bool,
    /// `DiscoveryBcastDir`: the directory on every worker the copy goes to; only root and the
    /// user running the inventory may write there.
    pub discovery_bcast_dir: Option<PathBuf>,
    /// `HookTimeout`: the hook's whole time budget, CloudVision included.
    pub hook_timeout: Duration,
    /// `RequestTimeout`: one CloudVision request's budget outside the hook.
    pub request_timeout: Duration,
    /// `StateDir`: per-job records and the outbox; owned by SlurmUser.
    pub state_dir: PathBuf,
    /// `SlurmBinDir`: where scontrol, sinfo, sacct and srun are (else `PATH`, else the usual places).
    pub slurm_bin_dir: Option<PathBuf>,
    /// `SlurmOutputMaxMiB`, in bytes: the most output read from one Slurm command (a listing
    /// of every job is about 6 KB of JSON per job); more is an error (see
    /// `runner::Slurm::max_output`).
    pub slurm_output_max: u64,
    /// `MaxConcurrentRequests`: parallel CloudVision requests of inventory and the outbox drain.
    pub max_concurrent_requests: usize,
    /// `ReconcileInterval`: how often the service compares Slurm's running jobs with what the
    /// hooks reported (0: never).
    pub reconcile_interval: Duration,
    /// `NodeReassertInterval`: how often the service discovers and sends every node again
    /// (0: never).
    pub node_reassert_interval: Duration,
    /// `OutboxMaxEvents`: the most events the outbox keeps; past it the least valuable go.
    pub outbox_max_events: usize,
    /// `JobCompPort`: the port of the service's job-completion receiver on 127.0.0.1 (the
    /// `JobCompLoc` of slurm.conf's `JobCompType=jobcomp/elasticsearch`); 0: none.
    pub jobcomp_port: u16,
    /// `JobCompForward`: the site's own Elasticsearch, to which the receiver passes every
    /// job-completion document on, unchanged (`None`: none).
    pub jobcomp_forward: Option<ForwardTarget>,
    /// `JobCompForwardMaxDocs`: the most documents the forward spool holds.
    pub jobcomp_forward_max_docs: usize,
    /// `JobInterfaces`: node names (`nodes`, the default) or, for jobs sharing a node's GPUs,
    /// the MACs of the NICs nearest their GPUs (`gpu`, `auto`).
    pub job_interfaces: JobInterfaces,
    /// `NodeHostname`: NodeConfig `hostname` is the Slurm node name (`nodename`, the default)
    /// or the worker's own host name (`hostname`).
    pub node_hostname: NodeHostname,
    /// `QualifyNodeNames`: node keys in CloudVision (NodeConfig `key.id`, a job's
    /// `nodes.values`) are `<node>@<cluster>`, for several clusters on one CloudVision.
    pub qualify_node_names: bool,
    /// `MetricsFile`: where the service, `flush` and the inventory write their Prometheus
    /// metrics (node_exporter's textfile format; `None`: off).
    pub metrics_file: Option<PathBuf>,
    /// `MetricsInterval`: how often the service rewrites the metrics file.
    pub metrics_interval: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            source: None,
            problems: Vec::new(),
            tls_problems: Vec::new(),
            env_error: None,
            api_server: None,
            api_token_file: None,
            api_token: None,
            ca_file: None,
            api_server_pins: Vec::new(),
            insecure: false,
            log_file: PathBuf::from("/var/log/slurm/cvjob.log"),
            log_level: log::LevelFilter::Info,
            job_name_include: None,
            job_name_exclude: Some(Regex::new("^cv-").expect("valid default regex")),
            partitions: Vec::new(),
            poll_interval: Duration::from_secs(60),
            interface_regex: Regex::new("^(eth|eno|ens|enp|em)").expect("valid default regex"),
            interface_physical_only: true,
            interface_require_ip: true,
            worker_records: false,
            discovery_job_name: "cv-interface-discovery".into(),
            discovery_timeout: Duration::from_secs(120),
            discovery_bcast: false,
            discovery_bcast_dir: None,
            hook_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(10),
            state_dir: PathBuf::from("/var/spool/cvslurm"),
            slurm_bin_dir: None,
            slurm_output_max: SLURM_OUTPUT_MAX_DEFAULT,
            max_concurrent_requests: 32,
            reconcile_interval: Duration::from_secs(300),
            node_reassert_interval: Duration::from_secs(86_400),
            outbox_max_events: 1_000_000,
            jobcomp_port: 0,
            jobcomp_forward: None,
            jobcomp_forward_max_docs: 100_000,
            job_interfaces: JobInterfaces::Nodes,
            node_hostname: NodeHostname::NodeName,
            qualify_node_names: false,
            metrics_file: None,
            metrics_interval: Duration::from_secs(15),
        }
    }
}

/// One key of cloudvision.conf: its name as the documentation spells it, its default as text
/// (empty: unset) and how a value is applied. [`KEYS`] is the one list of keys: the parser
/// knows only what it lists, and `cvslurm --list-config-keys` prints it.
pub struct Key {
    /// The name, in the spelling the documentation uses (matched case-insensitively).
    pub name: &'static str,
    /// The default, as it would be written in the file (empty: not set).
    pub default: &'static str,
    /// Applies a value to a config.
    set: fn(&mut Config, &str) -> Result<(), String>,
}

/// Every key the file may hold, with its default and its parser.
pub const KEYS: &[Key] = &[
    Key {
        name: "ApiServer",
        default: "",
        set: |c, v| {
            if v.starts_with("http://") {
                return Err("CloudVision is reached over HTTPS only; drop \"http://\"".into());
            }
            let v = v.trim_start_matches("https://").trim_end_matches('/');
            c.api_server = (!v.is_empty()).then(|| v.to_string());
            Ok(())
        },
    },
    Key {
        name: "ApiTokenFile",
        default: "",
        set: |c, v| {
            c.api_token_file = Some(path(v)?);
            Ok(())
        },
    },
    Key {
        name: "CaFile",
        default: "",
        set: |c, v| {
            c.ca_file = Some(path(v)?);
            Ok(())
        },
    },
    Key {
        name: "ApiServerPin",
        default: "",
        set: |c, v| {
            c.api_server_pins = v
                .split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(crate::cloudvision::tls::parse_pin)
                .collect::<Result<_, _>>()?;
            Ok(())
        },
    },
    Key {
        name: "Insecure",
        default: "no",
        set: |c, v| {
            c.insecure = parse_bool(v)?;
            Ok(())
        },
    },
    Key {
        name: "LogFile",
        default: "/var/log/slurm/cvjob.log",
        set: |c, v| {
            c.log_file = path(v)?;
            Ok(())
        },
    },
    Key {
        name: "LogLevel",
        default: "info",
        set: |c, v| {
            c.log_level = parse_level(v)?;
            Ok(())
        },
    },
    Key {
        name: "JobNameInclude",
        default: "",
        set: |c, v| {
            c.job_name_include = opt_regex(v)?;
            Ok(())
        },
    },
    Key {
        name: "JobNameExclude",
        default: "^cv-",
        set: |c, v| {
            c.job_name_exclude = opt_regex(v)?;
            Ok(())
        },
    },
    Key {
        name: "Partitions",
        default: "",
        set: |c, v| {
            c.partitions = v
                .split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(String::from)
                .collect();
            Ok(())
        },
    },
    Key {
        name: "PollInterval",
        default: "60",
        set: |c, v| {
            c.poll_interval = parse_duration(v, 1.0)?;
            Ok(())
        },
    },
    Key {
        name: "InterfaceRegex",
        default: "^(eth|eno|ens|enp|em)",
        set: |c, v| {
            c.interface_regex = Regex::new(v).map_err(|e| regex_error(v, &e))?;
            Ok(())
        },
    },
    Key {
        name: "InterfacePhysicalOnly",
        default: "yes",
        set: |c, v| {
            c.interface_physical_only = parse_bool(v)?;
            Ok(())
        },
    },
    Key {
        name: "InterfaceRequireIp",
        default: "yes",
        set: |c, v| {
            c.interface_require_ip = parse_bool(v)?;
            Ok(())
        },
    },
    Key {
        name: "WorkerRecords",
        default: "no",
        set: |c, v| {
            c.worker_records = parse_bool(v)?;
            Ok(())
        },
    },
    Key {
        name: "DiscoveryJobName",
        default: "cv-interface-discovery",
        set: |c, v| {
            if v.is_empty() {
                return Err("needs a job name".into());
            }
            c.discovery_job_name = v.to_string();
            Ok(())
        },
    },
    Key {
        name: "DiscoveryTimeout",
        default: "120",
        set: |c, v| {
            c.discovery_timeout = parse_duration(v, 1.0)?;
            Ok(())
        },
    },
    Key {
        name: "DiscoveryBcast",
        default: "no",
        set: |c, v| {
            c.discovery_bcast = parse_bool(v)?;
            Ok(())
        },
    },
    Key {
        name: "DiscoveryBcastDir",
        default: "",
        set: |c, v| {
            c.discovery_bcast_dir = bcast_dir(v)?;
            Ok(())
        },
    },
    Key {
        name: "HookTimeout",
        default: "2",
        set: |c, v| {
            c.hook_timeout = parse_duration(v, 0.1)?;
            Ok(())
        },
    },
    Key {
        name: "RequestTimeout",
        default: "10",
        set: |c, v| {
            c.request_timeout = parse_duration(v, 0.1)?;
            Ok(())
        },
    },
    Key {
        name: "StateDir",
        default: "/var/spool/cvslurm",
        set: |c, v| {
            c.state_dir = path(v)?;
            Ok(())
        },
    },
    Key {
        name: "SlurmBinDir",
        default: "",
        set: |c, v| {
            c.slurm_bin_dir = Some(path(v)?);
            Ok(())
        },
    },
    Key {
        name: "SlurmOutputMaxMiB",
        default: "64",
        set: |c, v| {
            c.slurm_output_max = v
                .parse::<u64>()
                .ok()
                .filter(|n| (1..=4096).contains(n))
                .map(|n| n << 20)
                .ok_or_else(|| {
                    format!(
                        "{v:?} is not a whole number of MiB from 1 to 4096 (the most output \
                         read from one Slurm command, 64 by default)"
                    )
                })?;
            Ok(())
        },
    },
    Key {
        name: "MaxConcurrentRequests",
        default: "32",
        set: |c, v| {
            c.max_concurrent_requests =
                v.parse::<usize>()
                    .ok()
                    .filter(|n| (1..=256).contains(n))
                    .ok_or_else(|| format!("{v:?} is not a whole number from 1 to 256"))?;
            Ok(())
        },
    },
    Key {
        name: "ReconcileInterval",
        default: "300",
        set: |c, v| {
            c.reconcile_interval = parse_duration(v, 0.0)?;
            Ok(())
        },
    },
    Key {
        name: "NodeReassertInterval",
        default: "1d",
        set: |c, v| {
            c.node_reassert_interval = parse_duration(v, 0.0)?;
            Ok(())
        },
    },
    Key {
        name: "OutboxMaxEvents",
        default: "1000000",
        set: |c, v| {
            c.outbox_max_events = v
                .parse::<usize>()
                .ok()
                .filter(|n| *n >= 1)
                .ok_or_else(|| format!("{v:?} is not a whole number of at least 1"))?;
            Ok(())
        },
    },
    Key {
        name: "JobCompPort",
        default: "0",
        set: |c, v| {
            c.jobcomp_port = v
                .parse::<u16>()
                .map_err(|_| format!("{v:?} is not a port (0 for none, else 1 to 65535)"))?;
            Ok(())
        },
    },
    Key {
        name: "JobCompForward",
        default: "",
        set: |c, v| {
            c.jobcomp_forward = Some(ForwardTarget::parse(v)?);
            Ok(())
        },
    },
    Key {
        name: "JobCompForwardMaxDocs",
        default: "100000",
        set: |c, v| {
            c.jobcomp_forward_max_docs = v
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=10_000_000).contains(n))
                .ok_or_else(|| format!("{v:?} is not a whole number from 1 to 10000000"))?;
            Ok(())
        },
    },
    Key {
        name: "JobInterfaces",
        default: "nodes",
        set: |c, v| {
            c.job_interfaces = JobInterfaces::parse(v)?;
            Ok(())
        },
    },
    Key {
        name: "NodeHostname",
        default: "nodename",
        set: |c, v| {
            c.node_hostname = NodeHostname::parse(v)?;
            Ok(())
        },
    },
    Key {
        name: "QualifyNodeNames",
        default: "no",
        set: |c, v| {
            c.qualify_node_names = parse_bool(v)?;
            Ok(())
        },
    },
    Key {
        name: "MetricsFile",
        default: "",
        set: |c, v| {
            c.metrics_file = metrics_file(v)?;
            Ok(())
        },
    },
    Key {
        name: "MetricsInterval",
        default: "15",
        set: |c, v| {
            c.metrics_interval = parse_duration(v, 1.0)?;
            Ok(())
        },
    },
];

/// A `MetricsFile` value: empty (off), or an absolute path ending in `.prom` (the only files
/// node_exporter's textfile collector reads) in a directory that exists.
fn metrics_file(v: &str) -> Result<Option<PathBuf>, String> {
    if v.is_empty() {
        return Ok(None);
    }
    let p = path(v)?;
    if !v.ends_with(".prom") || p.file_name().is_none() {
        return Err(format!(
            "{v:?}: needs a file name ending in .prom (node_exporter's textfile collector reads \
             only those), such as /var/lib/node_exporter/textfile_collector/cvslurm.prom"
        ));
    }
    let dir = p.parent().unwrap_or(Path::new("/"));
    if !dir.is_dir() {
        return Err(format!(
            "{v:?}: directory {} does not exist; create it (node_exporter's \
             --collector.textfile.directory) or point MetricsFile elsewhere",
            dir.display()
        ));
    }
    Ok(Some(p))
}

/// What `DiscoveryBcast=yes` without a `DiscoveryBcastDir` is told.
pub const BCAST_NEEDS_DIR: &str = "DiscoveryBcast=yes needs DiscoveryBcastDir, a directory on \
     every worker that only root and the user running the inventory (SlurmUser for the service) \
     can write, where srun --bcast puts the copy; a shared directory such as /tmp is not safe: \
     srun's command line names the copy, every user sees it, and another user could create \
     that file first and have it run; DiscoveryBcast is off until then";

/// A `DiscoveryBcastDir` value: empty (none), or an absolute path without `..` that is not one
/// of the directories every user can write (`/tmp`, `/var/tmp`, `/dev/shm`).
fn bcast_dir(v: &str) -> Result<Option<PathBuf>, String> {
    if v.is_empty() {
        return Ok(None);
    }
    let p = Path::new(v);
    if !p.is_absolute() || p.components().any(|c| c == std::path::Component::ParentDir) {
        return Err(format!("{v:?}: needs an absolute path without .."));
    }
    let trimmed = v.trim_end_matches('/');
    if ["", "/tmp", "/var/tmp", "/dev/shm"].contains(&trimmed) {
        return Err(format!(
            "{v:?}: every user can write there; use a directory only root and the user running \
             the inventory can write (e.g. /var/lib/cvslurm/bcast, mode 0700)"
        ));
    }
    Ok(Some(p.to_path_buf()))
}

/// A path value: absolute. The hook runs in slurmctld's working directory, the service in
/// `/`, the commands in the admin's: a relative path would name a different file for each.
fn path(v: &str) -> Result<PathBuf, String> {
    if v.is_empty() {
        return Err("needs a path".into());
    }
    let p = PathBuf::from(v);
    if !p.is_absolute() {
        return Err(relative_path(v));
    }
    Ok(p)
}

/// Why a relative path is refused.
fn relative_path(v: &str) -> String {
    format!(
        "{v:?} is a relative path: use an absolute path (such as /{}); the hook, the service \
         and the commands each run in another working directory",
        v.trim_start_matches("./")
    )
}

/// A regex value; empty means none.
fn opt_regex(v: &str) -> Result<Option<Regex>, String> {
    if v.is_empty() {
        Ok(None)
    } else {
        Regex::new(v).map(Some).map_err(|e| regex_error(v, &e))
    }
}

impl Config {
    /// Loads the configuration: `explicit` path, else `$CVSLURM_CONF`, else the default path
    /// (which may be absent), then applies the environment overrides.
    ///
    /// A bad line does not spoil the others: it is skipped and listed in
    /// [`Config::problems`]. Only a file that cannot be read is an error.
    pub fn load(explicit: Option<&Path>) -> Result<Config, ConfigError> {
        let env_path = std::env::var_os("CVSLURM_CONF").filter(|p| !p.is_empty());
        let (path, required) = match (explicit, env_path) {
            (Some(p), _) => (p.to_path_buf(), true),
            (None, Some(p)) => (PathBuf::from(p), true),
            (None, None) => (PathBuf::from(DEFAULT_PATH), false),
        };
        // Read as bytes: one byte that is not UTF-8 (a Latin-1 comment) spoils at most its own
        // line, not the file.
        let mut cfg = match fs::read(&path) {
            Ok(bytes) => Config::parse_lenient_bytes(&bytes, &path),
            Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => Config::default(),
            Err(e) => {
                return Err(ConfigError(format!(
                    "cannot read config file {}: {e}",
                    path.display()
                )))
            }
        };
        cfg.apply_env();
        Ok(cfg)
    }

    /// Parses the text of a config file strictly: the first bad line is the error. `origin`
    /// names the file in error messages.
    pub fn parse(text: &str, origin: &Path) -> Result<Config, ConfigError> {
        let mut cfg = Config::parse_lenient(text, origin);
        match cfg.problems.is_empty() {
            true => Ok(cfg),
            false => Err(cfg.problems.remove(0)),
        }
    }

    /// Parses the text of a config file, applying every valid line and listing each bad one
    /// in [`Config::problems`]. A leading UTF-8 byte-order mark is ignored.
    pub fn parse_lenient(text: &str, origin: &Path) -> Config {
        Config::parse_lenient_bytes(text.as_bytes(), origin)
    }

    /// [`Config::parse_lenient`] on the file's bytes. Bytes that are not UTF-8 spoil at most
    /// their own line: in a comment they are part of the comment; elsewhere the line is a bad
    /// line like any other.
    pub fn parse_lenient_bytes(bytes: &[u8], origin: &Path) -> Config {
        let mut cfg = Config {
            source: Some(origin.to_path_buf()),
            ..Config::default()
        };
        let bytes = bytes.strip_prefix("\u{feff}".as_bytes()).unwrap_or(bytes);
        let mut bcast_line = 0;
        for (n, raw) in bytes.split(|b| *b == b'\n').enumerate() {
            let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
            let stripped = strip_comment(raw);
            // The key a bad line is about (if it names one), and what is wrong with it.
            let (key, msg): (Option<&Key>, String) = match std::str::from_utf8(&stripped) {
                Err(e) => {
                    let text = String::from_utf8_lossy(&stripped);
                    (
                        line_key(&text),
                        format!(
                            "not UTF-8 text (byte 0x{:02X} at column {}): write the value in \
                             UTF-8 (iconv -f latin1 -t utf-8)",
                            stripped[e.valid_up_to()],
                            e.valid_up_to() + 1
                        ),
                    )
                }
                Ok(line) => {
                    let line = line.trim();
                    if line.is_empty() {
                        continue;
                    }
                    let Some((key, value)) = line.split_once('=') else {
                        cfg.push_problem(
                            origin,
                            n + 1,
                            line_key(line).filter(|k| TLS_KEYS.contains(&k.name)),
                            format!("expected Key=Value, found {line:?}"),
                        );
                        continue;
                    };
                    let (key, value) = (key.trim(), unquote(value.trim()));
                    match cfg.set(key, value) {
                        Ok(()) => {
                            if key.eq_ignore_ascii_case("DiscoveryBcast") {
                                bcast_line = n + 1;
                            }
                            continue;
                        }
                        Err(msg) if find_key(key).is_none() => (None, format!("{key}: {msg}")),
                        Err(msg) => (find_key(key), msg),
                    }
                }
            };
            cfg.push_problem(origin, n + 1, key, msg);
        }
        if cfg.discovery_bcast && cfg.discovery_bcast_dir.is_none() {
            cfg.discovery_bcast = false;
            cfg.problems.push(ConfigError(format!(
                "{}:{bcast_line}: DiscoveryBcast: {BCAST_NEEDS_DIR}",
                origin.display()
            )));
        }
        cfg
    }

    /// Lists a bad line: `file:line: Key: msg` (`file:line: msg` when `key` is `None`). A bad
    /// line of a key in [`TLS_KEYS`] is also a reason to refuse to connect.
    fn push_problem(&mut self, origin: &Path, line: usize, key: Option<&Key>, msg: String) {
        let e = ConfigError(match key {
            Some(k) => format!("{}:{line}: {}: {msg}", origin.display(), k.name),
            None => format!("{}:{line}: {msg}", origin.display()),
        });
        if key.is_some_and(|k| TLS_KEYS.contains(&k.name)) {
            self.tls_problems.push(e.clone());
        }
        self.problems.push(e);
    }

    /// Why the client must not connect: a bad line of a key that decides whom it trusts
    /// ([`TLS_KEYS`]). Ignoring such a line would trust more than the admin meant (a
    /// malformed pin would let any CA-signed server have the token), so no request is made
    /// until it is fixed; events stay queued.
    pub fn tls_refusal(&self) -> Option<String> {
        let first = self.tls_problems.first()?;
        let more = match self.tls_problems.len() {
            1 => String::new(),
            n => format!(" (and {} more)", n - 1),
        };
        Some(format!(
            "refusing to connect to CloudVision: {first}{more}; a TLS setting that cannot be \
             read is never ignored: fix that line (cvslurm check)"
        ))
    }

    /// Sets one key from its text value (key case-insensitive).
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        let Some(k) = find_key(key) else {
            let names: Vec<&str> = KEYS.iter().map(|k| k.name).collect();
            return Err(format!("unknown key (known keys: {})", names.join(", ")));
        };
        (k.set)(self, value)
    }

    /// Applies `CV_API_SERVER`, `CV_API_TOKEN` and `CV_LOG_FILE` (a bad server or a relative
    /// log file is kept out, in [`Config::env_error`]).
    pub fn apply_env(&mut self) {
        if let Some(v) = env_nonempty("CV_API_SERVER") {
            if let Err(e) = self.set("ApiServer", &v) {
                self.env_error = Some(ConfigError(format!("CV_API_SERVER={v:?}: {e}")));
            }
        }
        if let Some(v) = env_nonempty("CV_API_TOKEN") {
            self.api_token = Token::new(&v);
        }
        if let Some(v) = env_nonempty("CV_LOG_FILE") {
            if Path::new(&v).is_absolute() {
                self.log_file = PathBuf::from(v);
            } else {
                self.env_error = Some(ConfigError(format!("CV_LOG_FILE: {}", relative_path(&v))));
            }
        }
    }

    /// The API token: the one given directly (environment or command line), else the one in
    /// `ApiTokenFile`. `Ok(None)` when neither is configured.
    pub fn token(&self) -> Result<Option<Token>, ConfigError> {
        if let Some(t) = &self.api_token {
            return Ok(Some(t.clone()));
        }
        match &self.api_token_file {
            Some(p) => read_token_file(p).map(Some),
            None => Ok(None),
        }
    }

    /// True when a job with this name and partition should be sent.
    pub fn job_wanted(&self, name: &str, partition: Option<&str>) -> Result<(), String> {
        if let Some(re) = &self.job_name_include {
            if !re.is_match(name) {
                return Err(format!("name {name:?} does not match JobNameInclude"));
            }
        }
        if let Some(re) = &self.job_name_exclude {
            if re.is_match(name) {
                return Err(format!("name {name:?} matches JobNameExclude"));
            }
        }
        if !self.partitions.is_empty() {
            // A job submitted to several partitions runs in one; Slurm names that one.
            let p = partition.unwrap_or("");
            if !self.partitions.iter().any(|x| x == p) {
                return Err(format!("partition {p:?} is not in Partitions"));
            }
        }
        Ok(())
    }
}

/// A regex error message; look-around (the reference's `^(?!cv-)`) gets a way to say it here.
fn regex_error(v: &str, e: &regex_lite::Error) -> String {
    if ["(?!", "(?=", "(?<!", "(?<="].iter().any(|l| v.contains(l)) {
        return format!(
            "bad regex {v:?}: look-around such as (?!...) is not supported; say it the other way \
             round: JobNameExclude=^cv- drops the jobs whose name starts with cv- \
             (JobNameInclude=^(?!cv-) in the reference)"
        );
    }
    format!("bad regex {v:?}: {e}")
}

/// Reads a token file, refusing one that group or others can read.
pub fn read_token_file(path: &Path) -> Result<Token, ConfigError> {
    let meta = fs::metadata(path).map_err(|e| {
        ConfigError(format!(
            "cannot read API token file {}: {e}",
            path.display()
        ))
    })?;
    let mode = meta.mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(ConfigError(format!(
            "API token file {} is readable by group or others (mode {mode:04o}); run: chmod 600 {}",
            path.display(),
            path.display()
        )));
    }
    let text = fs::read_to_string(path).map_err(|e| {
        ConfigError(format!(
            "cannot read API token file {}: {e}",
            path.display()
        ))
    })?;
    Token::new(&text)
        .ok_or_else(|| ConfigError(format!("API token file {} is empty", path.display())))
}

fn env_nonempty(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn find_key(key: &str) -> Option<&'static Key> {
    KEYS.iter().find(|k| k.name.eq_ignore_ascii_case(key))
}

/// The key a line starts with (the word before `=`, blank or `:`), if it is one.
fn line_key(line: &str) -> Option<&'static Key> {
    let word = line
        .trim_start()
        .split(|c: char| c == '=' || c == ':' || c.is_whitespace())
        .next()?;
    find_key(word)
}

/// The keys that decide whom the client trusts. A bad line of one of them makes the client
/// refuse to connect ([`Config::tls_refusal`]) instead of being skipped.
pub const TLS_KEYS: &[&str] = &["ApiServerPin", "CaFile", "Insecure"];

/// Cuts a line at its first `#` that is not written `\#` (as in slurm.conf), and turns each
/// `\#` into `#`. Works on bytes: what follows the `#` need not be text.
fn strip_comment(line: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    let cut = (0..line.len())
        .find(|&i| line[i] == b'#' && (i == 0 || line[i - 1] != b'\\'))
        .unwrap_or(line.len());
    let kept = &line[..cut];
    if !kept.windows(2).any(|w| w == b"\\#") {
        return std::borrow::Cow::Borrowed(kept);
    }
    let mut out = Vec::with_capacity(kept.len());
    for (i, &b) in kept.iter().enumerate() {
        if !(b == b'\\' && kept.get(i + 1) == Some(&b'#')) {
            out.push(b);
        }
    }
    std::borrow::Cow::Owned(out)
}

fn unquote(v: &str) -> &str {
    v.strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .unwrap_or(v)
}

/// Parses yes/no, true/false, on/off, 1/0.
pub fn parse_bool(v: &str) -> Result<bool, String> {
    match v.to_ascii_lowercase().as_str() {
        "yes" | "true" | "on" | "1" => Ok(true),
        "no" | "false" | "off" | "0" => Ok(false),
        _ => Err(format!("{v:?} is not yes or no")),
    }
}

fn parse_level(v: &str) -> Result<log::LevelFilter, String> {
    match v.to_ascii_lowercase().as_str() {
        "error" => Ok(log::LevelFilter::Error),
        "warn" | "warning" => Ok(log::LevelFilter::Warn),
        "info" => Ok(log::LevelFilter::Info),
        "debug" => Ok(log::LevelFilter::Debug),
        "trace" => Ok(log::LevelFilter::Trace),
        _ => Err(format!(
            "{v:?} is not one of error, warn, info, debug, trace"
        )),
    }
}

/// Parses a duration: seconds (`2`, `1.5`), or with a unit (`500ms`, `30s`, `5m`), at least `min_secs`.
pub fn parse_duration(v: &str, min_secs: f64) -> Result<Duration, String> {
    let v = v.trim();
    let (num, scale) = if let Some(n) = v.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = v.strip_suffix('h') {
        (n, 3600.0)
    } else if let Some(n) = v.strip_suffix('d') {
        (n, 86_400.0)
    } else if let Some(n) = v.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = v.strip_suffix('m') {
        (n, 60.0)
    } else {
        (v, 1.0)
    };
    let secs = num
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|x| x.is_finite() && *x >= 0.0)
        .map(|x| x * scale)
        .ok_or_else(|| format!("{v:?} is not a duration (seconds, or 500ms, 30s, 5m, 12h, 1d)"))?;
    if secs < min_secs || secs > 86_400.0 * 30.0 {
        return Err(format!("{v:?} is out of range ({min_secs} s to 30 days)"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Path::new("/etc/slurm/cloudvision.conf"))
    }

    #[test]
    fn defaults_match_reference() {
        let c = Config::default();
        assert!(c
            .job_name_exclude
            .as_ref()
            .unwrap()
            .is_match("cv-interface-discovery"));
        assert!(c.job_name_include.is_none());
        assert!(c.partitions.is_empty());
        assert_eq!(c.poll_interval, Duration::from_secs(60));
        for n in ["eth0", "eno1", "ens1f0", "enp3s0", "em1"] {
            assert!(c.interface_regex.is_match(n), "{n}");
        }
        for n in ["lo", "docker0", "ib0", "virbr0"] {
            assert!(!c.interface_regex.is_match(n), "{n}");
        }
        assert!(c.interface_physical_only && c.interface_require_ip);
        assert_eq!(c.discovery_job_name, "cv-interface-discovery");
        assert_eq!(c.log_file, Path::new("/var/log/slurm/cvjob.log"));
        assert_eq!(c.log_level, log::LevelFilter::Info);
        assert_eq!(c.hook_timeout, Duration::from_secs(2));
        assert_eq!(c.state_dir, Path::new("/var/spool/cvslurm"));
    }

    /// DiscoveryBcast copies only into a directory other users cannot write: without
    /// DiscoveryBcastDir it is refused and left off; /tmp and the like, relative
    /// paths and `..` are refused as DiscoveryBcastDir.
    #[test]
    fn discovery_bcast_needs_a_private_directory() {
        let origin = Path::new("/etc/slurm/cloudvision.conf");
        let c = Config::parse_lenient("LogLevel=info\nDiscoveryBcast=yes\n", origin);
        assert!(!c.discovery_bcast);
        assert_eq!(c.problems.len(), 1);
        assert_eq!(
            c.problems[0].0,
            format!("/etc/slurm/cloudvision.conf:2: DiscoveryBcast: {BCAST_NEEDS_DIR}")
        );
        for bad in [
            "/tmp",
            "/tmp/",
            "/var/tmp",
            "/dev/shm//",
            "/",
            "bcast",
            "/srv/../tmp",
        ] {
            let c = Config::parse_lenient(
                &format!("DiscoveryBcastDir={bad}\nDiscoveryBcast=yes\n"),
                origin,
            );
            assert!(!c.discovery_bcast, "{bad}");
            assert!(
                c.problems[0].0.contains(":1: DiscoveryBcastDir: "),
                "{bad}: {:?}",
                c.problems
            );
        }
        let c = parse("DiscoveryBcast=yes\nDiscoveryBcastDir=/var/lib/cvslurm/bcast\n").unwrap();
        assert!(c.discovery_bcast);
        let c = parse("DiscoveryBcast=no\n").unwrap();
        assert!(!c.discovery_bcast && c.discovery_bcast_dir.is_none());
    }

    /// NodeHostname and QualifyNodeNames: the reference's bytes
    /// by default; a bad value is one line naming the file, line, key and the choices.
    #[test]
    fn node_hostname_and_qualify_node_names() {
        let origin = Path::new("/etc/slurm/cloudvision.conf");
        let c = Config::default();
        assert_eq!(c.node_hostname, NodeHostname::NodeName);
        assert!(!c.qualify_node_names);
        let c = parse("NodeHostname=HostName\nQualifyNodeNames=yes\n").unwrap();
        assert_eq!(c.node_hostname, NodeHostname::HostName);
        assert!(c.qualify_node_names);
        let c = parse("nodehostname = nodename\nqualifynodenames=no\n").unwrap();
        assert_eq!(c.node_hostname, NodeHostname::NodeName);
        assert!(!c.qualify_node_names);
        let c = Config::parse_lenient("NodeHostname=fqdn\nQualifyNodeNames=cluster\n", origin);
        assert_eq!(c.node_hostname, NodeHostname::NodeName);
        assert!(!c.qualify_node_names);
        let problems: Vec<&str> = c.problems.iter().map(|p| p.0.as_str()).collect();
        assert_eq!(
            problems,
            [
                "/etc/slurm/cloudvision.conf:1: NodeHostname: \"fqdn\" is not one of nodename, hostname",
                "/etc/slurm/cloudvision.conf:2: QualifyNodeNames: \"cluster\" is not yes or no",
            ]
        );
    }

    #[test]
    fn parses_every_key() {
        let c = parse(
            "# CloudVision\napiserver = https://cv.example.com:8443/\nApiTokenFile=/etc/slurm/cv.token\n\
             CaFile=/etc/ssl/onprem.pem\nInsecure=yes # lab only\nLogFile=/tmp/x.log\nLogLevel=debug\n\
             JobNameInclude=^train\nJobNameExclude=\nPartitions=gpu, cpu\nPollInterval=30\n\
             InterfaceRegex=^(eth|ib)\nInterfacePhysicalOnly=no\nInterfaceRequireIp=false\n\
             DiscoveryJobName=\"cv-disc\"\nDiscoveryTimeout=45s\nDiscoveryBcast=yes\nDiscoveryBcastDir=/var/lib/cvslurm/bcast\nHookTimeout=1.5\n\
             RequestTimeout=500ms\nStateDir=/var/spool/x\nSlurmBinDir=/opt/slurm/bin\nMaxConcurrentRequests=32\n\
             SlurmOutputMaxMiB=256\nReconcileInterval=0\nNodeReassertInterval=12h\nOutboxMaxEvents=500\n",
        )
        .unwrap();
        assert_eq!(c.api_server.as_deref(), Some("cv.example.com:8443"));
        assert_eq!(
            c.api_token_file.as_deref(),
            Some(Path::new("/etc/slurm/cv.token"))
        );
        assert!(c.insecure);
        assert_eq!(c.log_level, log::LevelFilter::Debug);
        assert!(c.job_name_include.unwrap().is_match("train-1"));
        assert!(c.job_name_exclude.is_none());
        assert_eq!(c.partitions, ["gpu", "cpu"]);
        assert_eq!(c.poll_interval, Duration::from_secs(30));
        assert!(c.interface_regex.is_match("ib0"));
        assert!(!c.interface_physical_only && !c.interface_require_ip);
        assert_eq!(c.discovery_job_name, "cv-disc");
        assert_eq!(c.discovery_timeout, Duration::from_secs(45));
        assert!(c.discovery_bcast);
        assert_eq!(
            c.discovery_bcast_dir.as_deref(),
            Some(Path::new("/var/lib/cvslurm/bcast"))
        );
        assert_eq!(c.hook_timeout, Duration::from_millis(1500));
        assert_eq!(c.request_timeout, Duration::from_millis(500));
        assert_eq!(
            c.slurm_bin_dir.as_deref(),
            Some(Path::new("/opt/slurm/bin"))
        );
        assert_eq!(c.max_concurrent_requests, 32);
        assert_eq!(c.slurm_output_max, 256 << 20);
        assert_eq!(c.reconcile_interval, Duration::ZERO);
        assert_eq!(c.node_reassert_interval, Duration::from_secs(43_200));
        assert_eq!(c.outbox_max_events, 500);
    }

    #[test]
    fn errors_name_file_line_and_key() {
        let cases = [
            (
                "Bogus=1",
                "/etc/slurm/cloudvision.conf:1: Bogus: unknown key",
            ),
            (
                "\nInsecure=maybe",
                "/etc/slurm/cloudvision.conf:2: Insecure: \"maybe\" is not yes or no",
            ),
            (
                "PollInterval=soon",
                "/etc/slurm/cloudvision.conf:1: PollInterval: \"soon\" is not a duration",
            ),
            (
                "HookTimeout=0",
                "/etc/slurm/cloudvision.conf:1: HookTimeout: \"0\" is out of range",
            ),
            (
                "InterfaceRegex=(",
                "/etc/slurm/cloudvision.conf:1: InterfaceRegex: bad regex",
            ),
            (
                "LogLevel=loud",
                "/etc/slurm/cloudvision.conf:1: LogLevel: \"loud\" is not one of",
            ),
            (
                "just words",
                "/etc/slurm/cloudvision.conf:1: expected Key=Value",
            ),
            (
                "ApiServer=http://cv",
                "/etc/slurm/cloudvision.conf:1: ApiServer: CloudVision is reached over HTTPS only",
            ),
            (
                "MaxConcurrentRequests=0",
                "/etc/slurm/cloudvision.conf:1: MaxConcurrentRequests: \"0\" is not a whole number",
            ),
            (
                "StateDir=",
                "/etc/slurm/cloudvision.conf:1: StateDir: needs a path",
            ),
            (
                "StateDir=var/spool/cvslurm",
                "/etc/slurm/cloudvision.conf:1: StateDir: \"var/spool/cvslurm\" is a relative path: \
                 use an absolute path (such as /var/spool/cvslurm)",
            ),
        ];
        for (text, want) in cases {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.starts_with(want), "{text:?} gave {e:?}");
        }
    }

    /// `SlurmOutputMaxMiB`: 64 MiB (the runner's own bound) when unset; a whole number of MiB
    /// from 1 to 4096; anything else is a bad line naming the key, and the default stays.
    #[test]
    fn slurm_output_bound() {
        assert_eq!(Config::default().slurm_output_max, SLURM_OUTPUT_MAX_DEFAULT);
        assert_eq!(
            parse("SlurmOutputMaxMiB=64").unwrap().slurm_output_max,
            64 << 20
        );
        assert_eq!(
            parse("slurmoutputmaxmib = 1").unwrap().slurm_output_max,
            1 << 20
        );
        assert_eq!(
            parse("SlurmOutputMaxMiB=4096").unwrap().slurm_output_max,
            4096 << 20
        );
        for bad in [
            "0",
            "4097",
            "-1",
            "1.5",
            "64MiB",
            "",
            "lots",
            "18446744073709551616",
        ] {
            let e = parse(&format!("SlurmOutputMaxMiB={bad}"))
                .unwrap_err()
                .to_string();
            assert!(
                e.starts_with(&format!(
                    "/etc/slurm/cloudvision.conf:1: SlurmOutputMaxMiB: {bad:?} is not a whole \
                     number of MiB from 1 to 4096"
                )),
                "{bad:?} gave {e:?}"
            );
            let c = Config::parse_lenient(
                &format!("SlurmOutputMaxMiB={bad}\n"),
                Path::new("/etc/slurm/cloudvision.conf"),
            );
            assert_eq!(c.slurm_output_max, SLURM_OUTPUT_MAX_DEFAULT);
            assert_eq!(c.problems.len(), 1);
        }
    }

    #[test]
    fn token_file_must_be_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("cvslurm-token-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let f = dir.join("token");
        fs::write(&f, "  s3cret-token\n").unwrap();
        fs::set_permissions(&f, fs::Permissions::from_mode(0o644)).unwrap();
        let e = read_token_file(&f).unwrap_err().to_string();
        assert!(e.contains("readable by group or others (mode 0644)"), "{e}");
        assert!(e.contains(&format!("chmod 600 {}", f.display())), "{e}");
        assert!(!e.contains("s3cret"));
        fs::set_permissions(&f, fs::Permissions::from_mode(0o600)).unwrap();
        let t = read_token_file(&f).unwrap();
        assert_eq!(t.expose(), "s3cret-token");
        assert_eq!(format!("{t:?} {t}"), "Token(<redacted>) <redacted>");
        fs::write(&f, "\n").unwrap();
        assert!(read_token_file(&f)
            .unwrap_err()
            .to_string()
            .contains("is empty"));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn job_filters() {
        let c = parse("Partitions=gpu\nJobNameInclude=^train").unwrap();
        assert!(c.job_wanted("train-a", Some("gpu")).is_ok());
        assert!(c.job_wanted("eval", Some("gpu")).is_err());
        assert!(c.job_wanted("train-a", Some("cpu")).is_err());
        assert!(Config::default()
            .job_wanted("cv-interface-discovery", None)
            .is_err());
        assert!(Config::default().job_wanted("x", None).is_ok());
    }

    #[test]
    fn escaped_hash_is_not_a_comment() {
        let c = parse("JobNameInclude=^run\\#[0-9]+ # trailing comment\n").unwrap();
        let re = c.job_name_include.unwrap();
        assert_eq!(re.as_str(), "^run#[0-9]+");
        assert!(re.is_match("run#7"));
    }

    #[test]
    fn one_bad_line_spoils_only_itself() {
        let text = "\u{feff}StateDir=/var/spool/site\nLogFile=/tmp/site.log\nBogus=1\n\
                    HookTimeout=soon\nApiServer=cv.example.com\njust words\n";
        let c = Config::parse_lenient(text, Path::new("/etc/cv.conf"));
        assert_eq!(c.state_dir, Path::new("/var/spool/site"));
        assert_eq!(c.log_file, Path::new("/tmp/site.log"));
        assert_eq!(c.api_server.as_deref(), Some("cv.example.com"));
        assert_eq!(
            c.hook_timeout,
            Duration::from_secs(2),
            "the bad value keeps the default"
        );
        let p: Vec<String> = c.problems.iter().map(|e| e.to_string()).collect();
        assert_eq!(p.len(), 3, "{p:?}");
        assert!(
            p[0].starts_with("/etc/cv.conf:3: Bogus: unknown key"),
            "{p:?}"
        );
        assert!(
            p[1].starts_with("/etc/cv.conf:4: HookTimeout: \"soon\""),
            "{p:?}"
        );
        assert!(
            p[2].starts_with("/etc/cv.conf:6: expected Key=Value"),
            "{p:?}"
        );
        // The BOM is not part of the first key.
        assert!(parse("\u{feff}ApiServer=cv\n").is_ok());
    }

    #[test]
    fn bytes_that_are_not_utf8_spoil_at_most_their_line() {
        let text = b"# G\xe9r\xe9 par Puppet\nStateDir=/var/spool/site # \xe9t\xe9\n\
                     Partitions=caf\xe9\r\n  # \xff\xfe\nLogFile=/tmp/site.log\n";
        let c = Config::parse_lenient_bytes(text, Path::new("/etc/cv.conf"));
        assert_eq!(c.state_dir, Path::new("/var/spool/site"));
        assert_eq!(c.log_file, Path::new("/tmp/site.log"));
        assert!(c.partitions.is_empty());
        let p: Vec<String> = c.problems.iter().map(|e| e.to_string()).collect();
        assert_eq!(
            p,
            [
                "/etc/cv.conf:3: Partitions: not UTF-8 text (byte 0xE9 at column 15): write the \
              value in UTF-8 (iconv -f latin1 -t utf-8)"
            ]
        );
    }

    #[test]
    fn a_bad_tls_line_refuses_to_connect() {
        let pin = format!("sha256//{}", "A".repeat(43) + "=");
        assert!(parse(&format!(
            "ApiServerPin={pin}\nCaFile=/etc/ca.pem\nInsecure=no"
        ))
        .unwrap()
        .tls_refusal()
        .is_none());
        let bad_pin = format!("ApiServerPin={pin}, sha256//typo!");
        let bad_lines = [
            bad_pin.as_str(),
            "Insecure=maybe",
            "CaFile=",
            "apiserverpin sha256//x",
            "ApiServerPin: sha256//x",
        ];
        for line in bad_lines {
            let c = Config::parse_lenient(
                &format!("LogLevel=loud\n{line}\n"),
                Path::new("/etc/cv.conf"),
            );
            assert_eq!(c.problems.len(), 2, "{line}");
            let why = c.tls_refusal().unwrap_or_default();
            assert!(
                why.starts_with("refusing to connect to CloudVision: /etc/cv.conf:2: "),
                "{line}: {why}"
            );
            assert!(!why.contains('\n'), "{why}");
        }
        let c = Config::parse_lenient_bytes(b"ApiServerPin=sha256//\xe9\n", Path::new("/c"));
        assert!(c
            .tls_refusal()
            .unwrap()
            .contains("/c:1: ApiServerPin: not UTF-8"));
        // Other bad lines are skipped, as before.
        assert!(
            Config::parse_lenient("LogLevel=loud\nBogus=1\njust words", Path::new("/c"))
                .tls_refusal()
                .is_none()
        );
    }

    #[test]
    fn every_path_key_needs_an_absolute_path() {
        let path_keys = [
            "ApiTokenFile",
            "CaFile",
            "LogFile",
            "StateDir",
            "SlurmBinDir",
            "MetricsFile",
        ];
        for k in path_keys {
            // MetricsFile's directory must exist, and its name end in .prom.
            let ok = if k == "MetricsFile" {
                "/tmp/x.prom"
            } else {
                "/abs/x"
            };
            assert!(parse(&format!("{k}={ok}")).is_ok(), "{k}");
            for v in ["rel/x", "./x", "../x", "x"] {
                let e = parse(&format!("{k}={v}")).unwrap_err().to_string();
                assert!(
                    e.contains(&format!(
                        "{k}: {v:?} is a relative path: use an absolute path"
                    )),
                    "{e}"
                );
            }
        }
        // Every key whose default or meaning is a path is in the list above.
        for k in KEYS {
            let pathlike = k.default.starts_with('/') || k.name.ends_with("File");
            assert!(
                !pathlike || path_keys.contains(&k.name),
                "{} takes a path: add it here",
                k.name
            );
        }
    }

    #[test]
    fn metrics_interval_defaults_to_15_s_and_is_at_least_1_s() {
        assert_eq!(parse("").unwrap().metrics_interval, Duration::from_secs(15));
        assert_eq!(
            parse("MetricsInterval=2").unwrap().metrics_interval,
            Duration::from_secs(2)
        );
        assert!(parse("MetricsInterval=500ms").is_err());
    }

    #[test]
    fn metrics_file_is_off_by_default_and_checked() {
        assert_eq!(parse("").unwrap().metrics_file, None);
        assert_eq!(
            parse("MetricsFile=/tmp/cvslurm.prom").unwrap().metrics_file,
            Some(PathBuf::from("/tmp/cvslurm.prom"))
        );
        let e = parse("MetricsFile=/nonexistent-dir/cvslurm.prom")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("MetricsFile: \"/nonexistent-dir/cvslurm.prom\": directory /nonexistent-dir does not exist"),
            "{e}"
        );
        assert!(!e.contains('\n'), "{e}");
        let e = parse("MetricsFile=/tmp/cvslurm.txt")
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs a file name ending in .prom"), "{e}");
    }

    #[test]
    fn lookaround_regex_says_how_to_write_it_here() {
        let e = parse("JobNameInclude=^(?!cv-)").unwrap_err().to_string();
        assert!(e.contains("JobNameInclude: bad regex"), "{e}");
        assert!(e.contains("JobNameExclude=^cv-"), "{e}");
    }

    #[test]
    fn every_key_default_is_the_default() {
        let mut c = Config::default();
        for k in KEYS {
            if !k.default.is_empty() {
                c.set(k.name, k.default)
                    .unwrap_or_else(|e| panic!("{}={}: {e}", k.name, k.default));
            }
        }
        assert_eq!(format!("{c:?}"), format!("{:?}", Config::default()));
        let mut names: Vec<String> = KEYS.iter().map(|k| k.name.to_lowercase()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), KEYS.len(), "a key is listed twice");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("2", 0.1).unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("5m", 1.0).unwrap(), Duration::from_secs(300));
        assert!(parse_duration("-1", 0.0).is_err());
        assert!(parse_duration("NaN", 0.0).is_err());
    }
}

/// The longest `JobCompForward` URL.
const MAX_FORWARD_URL: usize = 2048;

/// A `JobCompForward` target: the URL posted to (as Slurm's `JobCompLoc` would name it: the
/// index's path included), with any `user:password@` taken out into an `Authorization` header.
#[derive(Clone, PartialEq, Eq)]
pub struct ForwardTarget {
    url: String,
    auth: Option<String>,
    shown: String,
}

impl std::fmt::Debug for ForwardTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown)
    }
}

impl ForwardTarget {
    /// Reads a `JobCompForward` value: `http://` or `https://`, a host, and the path Slurm's
    /// plugin posts to. Refuses anything else with a one-line reason.
    pub fn parse(v: &str) -> Result<ForwardTarget, String> {
        let bad = |why: &str| {
            Err(format!(
                "{:?} {why}: give the URL slurm.conf's JobCompLoc had, such as http://es.example.com:9200/slurm/jobcomp",
                v.chars().take(120).collect::<String>()
            ))
        };
        if v.len() > MAX_FORWARD_URL {
            return bad(&format!("is longer than {MAX_FORWARD_URL} bytes"));
        }
        if v.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return bad("holds a space or a control character");
        }
        let lower = v.to_ascii_lowercase();
        let (scheme, rest) = if lower.starts_with("http://") {
            ("http", &v[7..])
        } else if lower.starts_with("https://") {
            ("https", &v[8..])
        } else {
            return bad("is not an http:// or https:// URL");
        };
        if v.contains('#') {
            return bad("has a #fragment");
        }
        let split = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, path) = rest.split_at(split);
        let (userinfo, host) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        if host.is_empty() || host.starts_with(':') {
            return bad("names no host");
        }
        let url = format!("{scheme}://{host}{path}");
        let uri = match url.parse::<ureq::http::Uri>() {
            Ok(u) => u,
            Err(e) => return bad(&format!("is not a URL ({e})")),
        };
        if uri.host().is_none_or(str::is_empty) {
            return bad("names no host");
        }
        let auth = match userinfo {
            None => None,
            Some(u) => {
                let (user, pass) = u.split_once(':').unwrap_or((u, ""));
                let (Some(user), Some(pass)) = (percent_decode(user), percent_decode(pass)) else {
                    return bad("has a user or password that is not percent-encoded UTF-8");
                };
                Some(format!(
                    "Basic {}",
                    base64(format!("{user}:{pass}").as_bytes())
                ))
            }
        };
        let shown = match userinfo {
            Some(u) => format!(
                "{scheme}://{}:***@{host}{path}",
                u.split_once(':').map_or(u, |(user, _)| user)
            ),
            None => url.clone(),
        };
        Ok(ForwardTarget { url, auth, shown })
    }

    /// The URL posted to, without credentials.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The URL as logs and `cvslurm check` show it (a password as `***`).
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// The `Authorization` header of the URL's `user:password@`, if any.
    pub fn auth(&self) -> Option<&str> {
        self.auth.as_deref()
    }

    /// `scheme://host[:port]/`: what `cvslurm check` asks.
    pub fn base(&self) -> String {
        let after = self.url.find("://").map_or(0, |i| i + 3);
        let end = self.url[after..]
            .find(['/', '?'])
            .map_or(self.url.len(), |i| after + i);
        format!("{}/", &self.url[..end])
    }
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn base64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for c in data.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for (k, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if k <= c.len() {
                out.push(T[(n >> shift & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod forward_target_tests {
    use super::*;

    #[test]
    fn forward_targets() {
        let t = ForwardTarget::parse("https://elastic:p%40ss@es.example.com:9200/slurm/jobcomp")
            .unwrap();
        assert_eq!(t.url(), "https://es.example.com:9200/slurm/jobcomp");
        assert_eq!(
            t.shown(),
            "https://elastic:***@es.example.com:9200/slurm/jobcomp"
        );
        assert_eq!(t.base(), "https://es.example.com:9200/");
        assert_eq!(t.auth.as_deref(), Some("Basic ZWxhc3RpYzpwQHNz"));
        assert!(!format!("{t:?}").contains("p@ss"));
        let t = ForwardTarget::parse("HTTP://10.0.0.1:9200/slurm/_doc").unwrap();
        assert_eq!(t.base(), "http://10.0.0.1:9200/");
        for bad in [
            "",
            "es:9200/slurm",
            "ftp://es/slurm",
            "file:///etc/passwd",
            "http://",
            "http:///slurm",
            "http://:9200/x",
            "http://es/x#frag",
            "http://es /x",
            "http://es/\u{1b}[31m",
            "http://u:%zz@es/x",
        ] {
            let e = ForwardTarget::parse(bad).unwrap_err();
            assert!(e.contains("JobCompLoc"), "{bad}: {e}");
            assert!(!e.contains('\n'), "{bad}: {e}");
        }
        assert!(
            ForwardTarget::parse(&format!("http://es/{}", "a".repeat(MAX_FORWARD_URL))).is_err()
        );
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
    }
}
