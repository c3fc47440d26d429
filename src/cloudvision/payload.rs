//! CloudVision compute-job resource payloads: `JobConfig` and `NodeConfig`.
//!
//! These serialize to exactly the JSON CloudVision's resource API takes at
//! `/api/resources/computejob/v1/JobConfig` and `/api/resources/computejob/v1/NodeConfig`.

use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::fmt;

/// A resource key: `{"id": "..."}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Key {
    /// The resource id: `<jobid>@<cluster>` for jobs, the node name for nodes.
    pub id: String,
}

/// A repeated field: `{"values": [...]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Values<T> {
    /// The items.
    pub values: Vec<T>,
}

impl<T> From<Vec<T>> for Values<T> {
    fn from(values: Vec<T>) -> Self {
        Values { values }
    }
}

/// A job's state as CloudVision knows it (there is no pending state).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
pub enum JobState {
    /// The job holds its nodes.
    #[serde(rename = "JOB_STATE_RUNNING")]
    Running,
    /// The job ended successfully.
    #[serde(rename = "JOB_STATE_COMPLETED")]
    Completed,
    /// The job ended in failure (non-zero exit, time limit, node failure, out of memory, …).
    #[serde(rename = "JOB_STATE_FAILED")]
    Failed,
    /// The job was cancelled.
    #[serde(rename = "JOB_STATE_CANCELLED")]
    Cancelled,
}

impl JobState {
    /// True for the states that end a job (they carry an `end_time`).
    pub fn is_terminal(self) -> bool {
        self != JobState::Running
    }

    /// Parses `running`, `completed`, `failed`, `cancelled` (any case, `JOB_STATE_` prefix allowed).
    pub fn from_word(s: &str) -> Option<JobState> {
        let s = s.trim().to_ascii_uppercase();
        match s.strip_prefix("JOB_STATE_").unwrap_or(&s) {
            "RUNNING" => Some(JobState::Running),
            "COMPLETED" => Some(JobState::Completed),
            "FAILED" => Some(JobState::Failed),
            "CANCELLED" | "CANCELED" => Some(JobState::Cancelled),
            _ => None,
        }
    }

    /// Maps a Slurm job state (`JobState=` of scontrol, `State` of sacct/squeue) to CloudVision's.
    ///
    /// `CANCELLED by 1000` and `+` suffixes are accepted. Returns `None` for states CloudVision
    /// cannot show (PENDING, REQUEUED, …).
    pub fn from_slurm(state: &str) -> Option<JobState> {
        let word = state
            .split_whitespace()
            .next()
            .unwrap_or("")
            .trim_end_matches('+')
            .to_ascii_uppercase();
        match word.as_str() {
            "RUNNING" | "COMPLETING" | "SUSPENDED" | "CONFIGURING" | "STAGE_OUT" | "SIGNALING"
            | "RESIZING" => Some(JobState::Running),
            "COMPLETED" => Some(JobState::Completed),
            "FAILED" | "NODE_FAIL" | "BOOT_FAIL" | "OUT_OF_MEMORY" | "DEADLINE" | "TIMEOUT"
            | "PREEMPTED" | "LAUNCH_FAILED" => Some(JobState::Failed),
            "CANCELLED" | "REVOKED" => Some(JobState::Cancelled),
            _ => None,
        }
    }

    /// The lower-case word used in logs and on the command line.
    pub fn word(self) -> &'static str {
        match self {
            JobState::Running => "running",
            JobState::Completed => "completed",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.word().to_ascii_uppercase())
    }
}

/// Who configured a job record: omitted for hook records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum JobType {
    /// A job of a tenant scheduler, sent with `send --tenant`.
    #[serde(rename = "JOB_TYPE_TENANT")]
    Tenant,
    /// A job sent by hand or backfilled with `send`.
    #[serde(rename = "JOB_TYPE_CONFIGURED")]
    Configured,
}

/// CloudVision `JobConfig`: which job runs (or ran) on which nodes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobConfig {
    /// `<jobid>@<cluster>`.
    pub key: Key,
    /// `<jobname>@<partition>`, or the bare job name without a partition.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub name: Option<String>,
    /// The job's state.
    pub state: JobState,
    /// UTC `YYYY-MM-DDTHH:MM:SSZ`.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub start_time: Option<String>,
    /// UTC `YYYY-MM-DDTHH:MM:SSZ`, terminal states only.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub end_time: Option<String>,
    /// The cluster name.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub location: Option<String>,
    /// Who configured the record; absent for hook records.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none", default)]
    pub job_type: Option<JobType>,
    /// The node names. Exactly one of `nodes` and `interfaces` is sent, never empty
    /// ([`JobConfig::validate`]); which one is the job's representation, the same for every
    /// record of the job (`StateDir/reps/`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub nodes: Option<Values<String>>,
    /// The interface MAC addresses (tenant jobs placed by interface; `JobInterfaces=gpu|auto`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub interfaces: Option<Values<String>>,
}

impl JobConfig {
    /// Checks that this is a whole record CloudVision (and Arista's own fake CloudVision, which
    /// validates every POST as a whole record) takes: a non-empty `key.id`, `name` and
    /// `location`; a `start_time`; **exactly one** of `nodes` and `interfaces`, its list not
    /// empty (node names not empty, MACs `aa:bb:cc:dd:ee:ff`); `end_time` for an ended job
    /// and none for a running one. What fails is never sent.
    pub fn validate(&self) -> Result<(), String> {
        let id = &self.key.id;
        if id.trim().is_empty() {
            return Err("empty key.id".into());
        }
        for (field, v) in [("name", &self.name), ("location", &self.location)] {
            if v.as_deref().is_none_or(str::is_empty) {
                return Err(format!("job {id}: no {field}"));
            }
        }
        if self.start_time.is_none() {
            return Err(format!("job {id}: no start_time"));
        }
        match (&self.nodes, &self.interfaces) {
            (Some(_), Some(_)) => {
                return Err(format!(
                    "job {id}: both nodes and interfaces (a record names exactly one)"
                ))
            }
            (None, None) => return Err(format!("job {id}: neither nodes nor interfaces")),
            (Some(n), None) => {
                if n.values.is_empty() {
                    return Err(format!("job {id}: an empty list of nodes"));
                }
                if n.values.iter().any(String::is_empty) {
                    return Err(format!("job {id}: an empty node name"));
                }
            }
            (None, Some(i)) => {
                if i.values.is_empty() {
                    return Err(format!("job {id}: an empty list of interfaces"));
                }
                if let Some(bad) = i.values.iter().find(|m| !is_mac(m)) {
                    return Err(format!(
                        "job {id}: {bad:?} is not a MAC address aa:bb:cc:dd:ee:ff"
                    ));
                }
            }
        }
        if self.state.is_terminal() && self.end_time.is_none() {
            return Err(format!("job {id}: {} without end_time", self.state.word()));
        }
        if !self.state.is_terminal() && self.end_time.is_some() {
            return Err(format!("job {id}: running with an end_time"));
        }
        Ok(())
    }

    /// True when the job is sent by interface MACs (a non-empty `interfaces`).
    pub fn by_interfaces(&self) -> bool {
        self.interfaces
            .as_ref()
            .is_some_and(|i| !i.values.is_empty())
    }

    /// The job id part of `key.id` (before the last `@`).
    pub fn job_id(&self) -> &str {
        self.key
            .id
            .rsplit_once('@')
            .map_or(&self.key.id, |(j, _)| j)
    }
}

/// The name a job without one is given ([`job_name`]): CloudVision requires a name.
pub const NO_NAME: &str = "(no name)";

/// CloudVision's job name: `<jobname>@<partition>`, the bare job name without a partition;
/// [`NO_NAME`] stands for an empty job name.
pub fn job_name(name: &str, partition: Option<&str>) -> String {
    let name = if name.is_empty() { NO_NAME } else { name };
    match partition.filter(|p| !p.is_empty()) {
        Some(p) => format!("{name}@{p}"),
        None => name.to_string(),
    }
}

/// CloudVision's job key: `<jobid>@<cluster>` (`key.id` of a JobConfig; the name of a job's
/// files in StateDir). The one place this key is built.
pub fn job_key(job_id: impl std::fmt::Display, cluster: &str) -> String {
    format!("{job_id}@{cluster}")
}

/// One data interface of a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataInterface {
    /// Interface name, e.g. `eth0`.
    pub name: String,
    /// Lower-case MAC address `aa:bb:cc:dd:ee:ff`.
    pub mac_address: String,
    /// IPv4 addresses.
    pub ip_addresses: Values<String>,
}

/// CloudVision `NodeConfig`: a compute node and its data interfaces.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeConfig {
    /// The Slurm node name.
    pub key: Key,
    /// The cluster name.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub location: Option<String>,
    /// The host name (up to the first dot).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub hostname: Option<String>,
    /// The node's data interfaces.
    pub data_interfaces: Values<DataInterface>,
}

/// How node names are written where CloudVision keys nodes (`QualifyNodeNames`): NodeConfig
/// `key.id`, a job's `nodes.values` and the key a NodeConfig delete names. The one place that
/// qualifies them: applied as a record goes out ([`crate::cloudvision::Client`], dry runs);
/// inside cvslurm (StateDir, the outbox, hostlists, Slurm) node names stay bare.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NodeKeys {
    /// `QualifyNodeNames`: `<node>@<cluster>` instead of `<node>` (several clusters on one CloudVision).
    pub qualify: bool,
}

impl NodeKeys {
    /// CloudVision's key of `node` of `cluster`: `<node>@<cluster>` when qualifying (and the
    /// cluster is known), else the node name.
    pub fn key(self, node: &str, cluster: Option<&str>) -> String {
        match cluster.filter(|c| self.qualify && !c.is_empty()) {
            Some(c) => format!("{node}@{c}"),
            None => node.to_string(),
        }
    }

    /// The JobConfig as sent: a Slurm job's node names with its `location` as qualifier. A
    /// tenant job's nodes (`send --tenant --nodes`) go as given: its caller names the nodes
    /// as CloudVision knows them, and its location need not be this cluster.
    pub fn job(self, job: &JobConfig) -> Cow<'_, JobConfig> {
        if !self.qualify || job.nodes.is_none() || job.job_type == Some(JobType::Tenant) {
            return Cow::Borrowed(job);
        }
        let mut out = job.clone();
        if let Some(n) = &mut out.nodes {
            for v in &mut n.values {
                *v = self.key(v, job.location.as_deref());
            }
        }
        Cow::Owned(out)
    }

    /// The NodeConfig as sent: `key.id` with its `location` as qualifier.
    pub fn node(self, node: &NodeConfig) -> Cow<'_, NodeConfig> {
        if !self.qualify {
            return Cow::Borrowed(node);
        }
        let mut out = node.clone();
        out.key.id = self.key(&node.key.id, node.location.as_deref());
        Cow::Owned(out)
    }
}

/// The RUNNING record of a job Slurm lists as running, on `nodes`, started at `start` (epoch
/// seconds): what a prolog would have sent (no `type`).
pub(crate) fn running_job(
    info: &crate::slurm::JobInfo,
    cluster: &str,
    start: i64,
    nodes: Vec<String>,
) -> JobConfig {
    JobConfig {
        key: Key {
            id: job_key(&info.job_id, cluster),
        },
        name: Some(job_name(&info.name, info.partition.as_deref())),
        state: JobState::Running,
        start_time: crate::timefmt::format_epoch(start),
        end_time: None,
        location: Some(cluster.to_string()),
        job_type: None,
        nodes: Some(nodes.into()),
        interfaces: None,
    }
}

/// Builds the JobConfig of a job Slurm described.
pub(crate) fn job_config(info: &crate::slurm::JobInfo, cluster: &str) -> Result<JobConfig, String> {
    let state = JobState::from_slurm(&info.state).ok_or_else(|| {
        format!(
            "job {} is {}: CloudVision has no such state; send it once it runs or ends",
            info.job_id,
            if info.state.is_empty() {
                "in no known state"
            } else {
                &info.state
            }
        )
    })?;
    let nodes = info
        .nodes()
        .map_err(|e| format!("job {}: {e}", info.job_id))?;
    if nodes.is_empty() {
        return Err(format!("job {} has no nodes", info.job_id));
    }
    let start = info
        .start
        .ok_or_else(|| format!("job {} has no start time", info.job_id))?;
    let end = if state.is_terminal() {
        Some(info.end.unwrap_or_else(crate::timefmt::now_epoch))
    } else {
        None
    };
    Ok(JobConfig {
        key: Key {
            id: job_key(&info.job_id, cluster),
        },
        name: Some(job_name(&info.name, info.partition.as_deref())),
        state,
        start_time: crate::timefmt::format_epoch(start),
        end_time: end.and_then(crate::timefmt::format_epoch),
        location: Some(cluster.to_string()),
        job_type: Some(JobType::Configured),
        nodes: Some(nodes.into()),
        interfaces: None,
    })
}

/// True for a lower-case `aa:bb:cc:dd:ee:ff`.
pub fn is_mac(s: &str) -> bool {
    s.len() == 17
        && s.split(':').count() == 6
        && s.split(':').all(|p| {
            p.len() == 2
                && p.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn job_config_matches_seed_example() {
        let job = JobConfig {
            key: Key {
                id: "12345@hpc-cluster-west".into(),
            },
            name: Some("gpt-training@gpu".into()),
            state: JobState::Running,
            start_time: Some("2025-12-05T10:30:00Z".into()),
            end_time: None,
            location: Some("hpc-cluster-west".into()),
            job_type: None,
            nodes: Some(
                vec!["gpu-node-1", "gpu-node-2", "gpu-node-3", "gpu-node-4"]
                    .into_iter()
                    .map(String::from)
                    .collect::<Vec<_>>()
                    .into(),
            ),
            interfaces: None,
        };
        let seed = json!({"key":{"id":"12345@hpc-cluster-west"},"name":"gpt-training@gpu",
            "state":"JOB_STATE_RUNNING","start_time":"2025-12-05T10:30:00Z",
            "location":"hpc-cluster-west",
            "nodes":{"values":["gpu-node-1","gpu-node-2","gpu-node-3","gpu-node-4"]}});
        assert_eq!(serde_json::to_value(&job).unwrap(), seed);
        assert_eq!(job.job_id(), "12345");
        let mut done = job.clone();
        done.state = JobState::Completed;
        done.end_time = Some("2025-12-05T11:00:00Z".into());
        done.job_type = Some(JobType::Configured);
        let v = serde_json::to_value(&done).unwrap();
        assert_eq!(v["state"], "JOB_STATE_COMPLETED");
        assert_eq!(v["end_time"], "2025-12-05T11:00:00Z");
        assert_eq!(v["type"], "JOB_TYPE_CONFIGURED");
    }

    fn job_on(nodes: Option<&[&str]>, macs: Option<&[&str]>) -> JobConfig {
        let list = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>().into();
        JobConfig {
            key: Key { id: "7@c".into() },
            name: Some("j".into()),
            state: JobState::Running,
            start_time: Some("2025-12-05T10:30:00Z".into()),
            end_time: None,
            location: Some("c".into()),
            job_type: None,
            nodes: nodes.map(list),
            interfaces: macs.map(list),
        }
    }

    /// The bytes of each representation: one list, never empty, never both (what Arista's own
    /// fake CloudVision takes, and a protobuf `oneof` would); and whole records only.
    #[test]
    fn a_record_names_exactly_one_list_and_is_whole() {
        let bytes = |j: &JobConfig| serde_json::to_string(j).unwrap();
        let head = r#"{"key":{"id":"7@c"},"name":"j","state":"JOB_STATE_RUNNING","start_time":"2025-12-05T10:30:00Z","location":"c""#;
        let j = job_on(Some(&["n1", "n2"]), None);
        assert_eq!(
            bytes(&j),
            format!(r#"{head},"nodes":{{"values":["n1","n2"]}}}}"#)
        );
        assert_eq!(j.validate(), Ok(()));
        let m = job_on(None, Some(&["02:00:00:00:00:01"]));
        assert_eq!(
            bytes(&m),
            format!(r#"{head},"interfaces":{{"values":["02:00:00:00:00:01"]}}}}"#)
        );
        assert_eq!(m.validate(), Ok(()));
        assert!(m.by_interfaces());
        let err = |j: JobConfig| j.validate().unwrap_err();
        // Both lists, even one empty: refused.
        assert!(err(job_on(Some(&["n1"]), Some(&["02:00:00:00:00:01"]))).contains("both"));
        assert!(err(job_on(Some(&[]), Some(&["02:00:00:00:00:01"]))).contains("both"));
        assert!(err(job_on(Some(&["n1"]), Some(&[]))).contains("both"));
        // An empty list, or none: refused.
        assert!(err(job_on(Some(&[]), None)).contains("empty list of nodes"));
        assert!(err(job_on(None, Some(&[]))).contains("empty list of interfaces"));
        assert!(err(job_on(None, None)).contains("neither"));
        assert!(err(job_on(Some(&[""]), None)).contains("empty node name"));
        assert!(err(job_on(None, Some(&["02:00:00:00:00:0G"]))).contains("is not a MAC"));
        // Whole records: name, location, start_time; end_time only for ends.
        let mut no_name = job_on(Some(&["n1"]), None);
        no_name.name = Some(String::new());
        assert_eq!(err(no_name), "job 7@c: no name");
        let mut no_location = job_on(Some(&["n1"]), None);
        no_location.location = None;
        assert_eq!(err(no_location), "job 7@c: no location");
        let mut no_start = job_on(Some(&["n1"]), None);
        no_start.start_time = None;
        assert_eq!(err(no_start), "job 7@c: no start_time");
        let mut running_end = job_on(Some(&["n1"]), None);
        running_end.end_time = Some("2025-12-05T11:00:00Z".into());
        assert_eq!(err(running_end), "job 7@c: running with an end_time");
        let mut done = job_on(Some(&["n1"]), None);
        done.state = JobState::Failed;
        assert_eq!(err(done.clone()), "job 7@c: failed without end_time");
        done.end_time = Some("2025-12-05T11:00:00Z".into());
        assert_eq!(done.validate(), Ok(()));
    }

    #[test]
    fn node_config_matches_seed_example() {
        let node = NodeConfig {
            key: Key {
                id: "gpu-node-1".into(),
            },
            location: Some("hpc-cluster-west".into()),
            hostname: Some("gpu-node-1".into()),
            data_interfaces: vec![DataInterface {
                name: "eth0".into(),
                mac_address: "aa:bb:cc:dd:ee:01".into(),
                ip_addresses: vec!["192.168.1.11".to_string()].into(),
            }]
            .into(),
        };
        let seed = json!({"key":{"id":"gpu-node-1"},"location":"hpc-cluster-west",
            "hostname":"gpu-node-1","data_interfaces":{"values":[{"name":"eth0",
            "mac_address":"aa:bb:cc:dd:ee:01","ip_addresses":{"values":["192.168.1.11"]}}]}});
        assert_eq!(serde_json::to_value(&node).unwrap(), seed);
    }

    /// QualifyNodeNames: off, every record goes as built (the
    /// reference's bytes); on, a Slurm job's nodes and a NodeConfig's key get the record's
    /// location as qualifier, a tenant job's nodes go as given.
    #[test]
    fn node_keys_qualify_nodes_and_node_keys_with_the_location() {
        let job = JobConfig {
            key: Key {
                id: "7@west".into(),
            },
            name: None,
            state: JobState::Running,
            start_time: Some("2025-12-05T10:30:00Z".into()),
            end_time: None,
            location: Some("west".into()),
            job_type: None,
            nodes: Some(vec!["n1".to_string(), "n2".to_string()].into()),
            interfaces: None,
        };
        let node = NodeConfig {
            key: Key { id: "n1".into() },
            location: Some("west".into()),
            hostname: Some("n1".into()),
            data_interfaces: Vec::new().into(),
        };
        let off = NodeKeys::default();
        assert!(matches!(off.job(&job), Cow::Borrowed(_)));
        assert!(matches!(off.node(&node), Cow::Borrowed(_)));
        assert_eq!(off.key("n1", Some("west")), "n1");
        let on = NodeKeys { qualify: true };
        assert_eq!(on.key("n1", Some("west")), "n1@west");
        assert_eq!(on.key("n1", Some("")), "n1");
        assert_eq!(on.key("n1", None), "n1");
        let sent = serde_json::to_value(on.job(&job).as_ref()).unwrap();
        assert_eq!(sent["nodes"], json!({"values": ["n1@west", "n2@west"]}));
        assert_eq!(sent["key"]["id"], "7@west");
        let sent = serde_json::to_value(on.node(&node).as_ref()).unwrap();
        assert_eq!(sent["key"]["id"], "n1@west");
        assert_eq!(sent["hostname"], "n1");
        assert_eq!(sent["location"], "west");
        let mut tenant = job.clone();
        tenant.job_type = Some(JobType::Tenant);
        assert_eq!(on.job(&tenant).as_ref(), &tenant);
        let mut by_macs = job.clone();
        by_macs.nodes = None;
        by_macs.interfaces = Some(vec!["aa:bb:cc:dd:ee:01".to_string()].into());
        assert_eq!(on.job(&by_macs).as_ref(), &by_macs);
    }

    #[test]
    fn job_names() {
        assert_eq!(job_name("train", Some("gpu")), "train@gpu");
        assert_eq!(job_name("train", None), "train");
        assert_eq!(job_name("train", Some("")), "train");
        assert_eq!(job_name("", Some("gpu")), "(no name)@gpu");
        assert_eq!(job_name("", None), "(no name)");
    }

    /// Slurm's own notion of a final state (`JobInfo::ended`) and the CloudVision mapping
    /// agree on every state word.
    #[test]
    fn ended_agrees_with_the_state_map() {
        for w in [
            "RUNNING",
            "COMPLETING",
            "SUSPENDED",
            "CONFIGURING",
            "PENDING",
            "REQUEUED",
            "COMPLETED",
            "FAILED",
            "NODE_FAIL",
            "BOOT_FAIL",
            "OUT_OF_MEMORY",
            "DEADLINE",
            "TIMEOUT",
            "PREEMPTED",
            "LAUNCH_FAILED",
            "CANCELLED",
            "REVOKED",
            "CANCELLED by 0",
            "completed",
            "",
        ] {
            let j = crate::slurm::JobInfo {
                state: w.into(),
                ..Default::default()
            };
            assert_eq!(
                j.ended(),
                JobState::from_slurm(w).is_some_and(JobState::is_terminal),
                "{w}"
            );
        }
    }

    #[test]
    fn slurm_state_map() {
        use JobState::*;
        let table = [
            ("RUNNING", Some(Running)),
            ("COMPLETING", Some(Running)),
            ("SUSPENDED", Some(Running)),
            ("COMPLETED", Some(Completed)),
            ("FAILED", Some(Failed)),
            ("NODE_FAIL", Some(Failed)),
            ("BOOT_FAIL", Some(Failed)),
            ("OUT_OF_MEMORY", Some(Failed)),
            ("DEADLINE", Some(Failed)),
            ("TIMEOUT", Some(Failed)),
            ("PREEMPTED", Some(Failed)),
            ("LAUNCH_FAILED", Some(Failed)),
            ("CANCELLED", Some(Cancelled)),
            ("CANCELLED by 1000", Some(Cancelled)),
            ("CANCELLED+", Some(Cancelled)),
            ("REVOKED", Some(Cancelled)),
            ("PENDING", None),
            ("REQUEUED", None),
            ("", None),
        ];
        for (s, want) in table {
            assert_eq!(JobState::from_slurm(s), want, "{s}");
        }
        assert_eq!(JobState::from_word("Cancelled"), Some(Cancelled));
        assert_eq!(JobState::from_word("JOB_STATE_FAILED"), Some(Failed));
        assert_eq!(JobState::from_word("pending"), None);
    }
}
