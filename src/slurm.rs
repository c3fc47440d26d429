//! Parsers for what Slurm's commands print, and the lookups built on them.
//!
//! Every parser here is fed real 22.05 output in its tests (`tests/fixtures/slurm-22.05/`).
//! Times are read as epoch seconds: the runner sets `SLURM_TIME_FORMAT=%s`, so the
//! controller's time zone never enters.

use crate::hostlist;
use crate::runner::Slurm;
use crate::timefmt::parse_slurm_epoch;
use std::time::Duration;

/// Budget of one scontrol/sacct/sinfo call outside the hook.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// One `Key=Value …` record of `scontrol show job -o` / `scontrol show node -o`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KvRecord {
    fields: Vec<(String, String)>,
}

impl KvRecord {
    /// Parses one line. A token that does not start with `Key=` continues the previous value
    /// (job names, commands and reasons may hold spaces).
    pub fn parse(line: &str) -> KvRecord {
        let mut fields: Vec<(String, String)> = Vec::new();
        for tok in line.split(' ').filter(|t| !t.is_empty()) {
            match split_key(tok) {
                Some((k, v)) => fields.push((k.to_string(), v.to_string())),
                None => {
                    if let Some((_, v)) = fields.last_mut() {
                        v.push(' ');
                        v.push_str(tok);
                    }
                }
            }
        }
        KvRecord { fields }
    }

    /// The first value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

fn split_key(tok: &str) -> Option<(&str, &str)> {
    let (k, v) = tok.split_once('=')?;
    let mut chars = k.chars();
    let ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || "_:/".contains(c));
    ok.then_some((k, v))
}

/// What cvslurm needs of one job, from scontrol or sacct.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobInfo {
    /// The job id (for array tasks, the task's own id).
    pub job_id: String,
    /// The job name.
    pub name: String,
    /// The partition it runs in, if known.
    pub partition: Option<String>,
    /// Slurm's state word (`RUNNING`, `CANCELLED by 0`, …).
    pub state: String,
    /// Why, if Slurm says (`TimeLimit`, `None`, …).
    pub reason: Option<String>,
    /// `exit:signal`.
    pub exit_code: Option<String>,
    /// How often slurmctld requeued the job (scontrol's `Restarts`; sacct does not say).
    pub restarts: Option<u32>,
    /// Start, epoch seconds.
    pub start: Option<i64>,
    /// End, epoch seconds.
    pub end: Option<i64>,
    /// The compressed node list.
    pub nodelist: Option<String>,
}

impl JobInfo {
    /// The expanded node names.
    pub fn nodes(&self) -> Result<Vec<String>, hostlist::HostlistError> {
        match self.nodelist.as_deref() {
            None | Some("") | Some("(null)") | Some("None assigned") => Ok(Vec::new()),
            Some(l) => hostlist::expand(l),
        }
    }
}

/// True for a job id as users give it: `12345`, or an array task `12345_7`.
pub fn valid_job_id(id: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    match id.split_once('_') {
        Some((a, t)) => digits(a) && digits(t),
        None => digits(id),
    }
}

/// Does this record describe `job_id` (`12345`, or array task `12345_7`)?
fn record_is(r: &KvRecord, job_id: &str) -> bool {
    match job_id.split_once('_') {
        Some((a, t)) => r.get("ArrayJobId") == Some(a) && r.get("ArrayTaskId") == Some(t),
        None => r.get("JobId") == Some(job_id),
    }
}

/// Picks the job `job_id` out of `scontrol show job -o <id>` output (an array id lists every
/// task). The result carries the job's own id (an array task's is its own job number).
pub fn parse_scontrol_job(output: &str, job_id: &str) -> Option<JobInfo> {
    output
        .lines()
        .map(KvRecord::parse)
        .find(|r| record_is(r, job_id))
        .map(|r| {
            let opt = |k: &str| {
                r.get(k)
                    .filter(|v| !v.is_empty() && *v != "(null)")
                    .map(String::from)
            };
            JobInfo {
                job_id: r.get("JobId").unwrap_or(job_id).to_string(),
                name: r.get("JobName").unwrap_or("").to_string(),
                partition: opt("Partition"),
                state: r.get("JobState").unwrap_or("").to_string(),
                reason: opt("Reason"),
                exit_code: opt("ExitCode"),
                restarts: r.get("Restarts").and_then(|v| v.parse().ok()),
                start: r.get("StartTime").and_then(parse_slurm_epoch),
                end: r.get("EndTime").and_then(parse_slurm_epoch),
                nodelist: opt("NodeList"),
            }
        })
}

/// The sacct columns cvslurm asks for, in order.
pub const SACCT_FORMAT: &str = "JobIDRaw,JobName,Partition,State,Start,End,NodeList,ExitCode";

/// Picks the job `job_id` out of `sacct -j <id> -X -P -n --format=SACCT_FORMAT` output: the
/// last allocation row of that id (a requeued job's latest run). Step rows (`12.batch`) are
/// skipped. For an array task asked as `12345_7`, sacct answers with the task's own raw id: a
/// single allocation row is that task.
pub fn parse_sacct(output: &str, job_id: &str) -> Option<JobInfo> {
    let rows: Vec<JobInfo> = output.lines().filter_map(parse_sacct_row).collect();
    if let Some(j) = rows.iter().rev().find(|j| j.job_id == job_id) {
        return Some(j.clone());
    }
    match rows.as_slice() {
        [only] if job_id.contains('_') => Some(only.clone()),
        _ => None,
    }
}

/// One allocation row of sacct's parsable output (`None` for steps and malformed lines).
fn parse_sacct_row(line: &str) -> Option<JobInfo> {
    let (id, rest) = line.split_once('|')?;
    if id.contains('.') || id.is_empty() {
        return None;
    }
    // JobName may hold '|': take the six fixed columns from the right.
    let mut right: Vec<&str> = rest.rsplitn(7, '|').collect();
    if right.len() != 7 {
        return None;
    }
    right.reverse();
    let non_empty = |s: &str| (!s.is_empty()).then(|| s.to_string());
    Some(JobInfo {
        job_id: id.to_string(),
        name: right[0].to_string(),
        partition: non_empty(right[1]),
        state: right[2].to_string(),
        reason: None,
        exit_code: non_empty(right[6]),
        restarts: None,
        start: parse_slurm_epoch(right[3]),
        end: parse_slurm_epoch(right[4]),
        nodelist: non_empty(right[5]).filter(|n| n != "None assigned"),
    })
}

/// `ClusterName` from `scontrol show config`.
pub fn parse_cluster_name(show_config: &str) -> Option<String> {
    show_config.lines().find_map(|l| {
        let (k, v) = l.split_once('=')?;
        (k.trim() == "ClusterName")
            .then(|| v.trim().to_string())
            .filter(|v| !v.is_empty() && v != "(null)")
    })
}

/// One node as `sinfo -h -N -o '%N %T %P'` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinfoNode {
    /// Slurm node name.
    pub name: String,
    /// State as printed (`idle`, `down*`, `mixed~`, …).
    pub state: String,
    /// The partitions it is in (without the default marker `*`).
    pub partitions: Vec<String>,
}

impl SinfoNode {
    /// Idle, allocated, mixed or completing, with no flag that says it is not responding,
    /// powered down, powering up, rebooting or failing.
    pub fn available(&self) -> bool {
        node_state_available(&self.state)
    }
}

/// True for the base states a discovery job can run on, without trouble flags.
pub fn node_state_available(state: &str) -> bool {
    let base = state.trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    base.len() == state.len()
        && matches!(
            base.to_ascii_lowercase().as_str(),
            "idle" | "allocated" | "mixed" | "completing"
        )
}

/// The sinfo format cvslurm asks for.
pub const SINFO_FORMAT: &str = "%N %T %P";

/// Parses `sinfo -h -N -o '%N %T %P'`: one entry per node (a node in several partitions is
/// listed once, with all its partitions), in the order sinfo printed them.
pub fn parse_sinfo(output: &str) -> Vec<SinfoNode> {
    let mut nodes: Vec<SinfoNode> = Vec::new();
    let mut index = std::collections::HashMap::new();
    for line in output.lines() {
        let mut it = line.split_whitespace();
        let (Some(name), Some(state)) = (it.next(), it.next()) else {
            continue;
        };
        // A bare `*` (nothing but the default marker) names no partition.
        let part = it
            .next()
            .map(|p| p.trim_end_matches('*').to_string())
            .filter(|p| !p.is_empty());
        let i = *index.entry(name.to_string()).or_insert_with(|| {
            nodes.push(SinfoNode {
                name: name.to_string(),
                state: state.to_string(),
                partitions: Vec::new(),
            });
            nodes.len() - 1
        });
        if let Some(p) = part {
            if !nodes[i].partitions.contains(&p) {
                nodes[i].partitions.push(p);
            }
        }
    }
    nodes
}

/// The GPU indices a job holds on each node (nodes where it holds none are absent).
pub type JobGpus = std::collections::BTreeMap<String, std::collections::BTreeSet<u32>>;

/// The highest GPU index accepted from Slurm.
const MAX_GPU_INDEX: u32 = 1023;

/// The GPU indices of one GRES string as slurmctld prints it per node (`GRES=` of
/// `scontrol show job -d`, an entry of squeue's JSON `gres_detail`):
/// `gpu:4(IDX:0-3)`, `gpu:a100:2(IDX:0,2)`, `gpu:2(IDX:0-1),nic:1(IDX:0)`, or empty.
pub fn parse_gres_gpus(gres: &str) -> Result<std::collections::BTreeSet<u32>, String> {
    let mut out = std::collections::BTreeSet::new();
    let mut depth = 0i32;
    let mut start = 0;
    let mut entries = Vec::new();
    for (i, c) in gres.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                entries.push(&gres[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        if !(0..=1).contains(&depth) {
            return Err(format!("unbalanced parentheses in GRES {gres:?}"));
        }
    }
    entries.push(&gres[start..]);
    for e in entries.into_iter().filter(|e| !e.is_empty()) {
        let (head, idx) = match e.split_once('(') {
            Some((h, rest)) => (
                h,
                Some(
                    rest.strip_suffix(')')
                        .ok_or_else(|| format!("bad GRES entry {e:?}"))?,
                ),
            ),
            None => (e, None),
        };
        if head.split(':').next() != Some("gpu") {
            continue;
        }
        let Some(idx) = idx else {
            return Err(format!(
                "GRES {e:?} has no IDX list: ask with scontrol show job -d"
            ));
        };
        let list = idx
            .strip_prefix("IDX:")
            .ok_or_else(|| format!("bad GRES entry {e:?}"))?;
        for item in list.split(',') {
            let (a, b) = item.split_once('-').unwrap_or((item, item));
            let (a, b) = match (a.parse::<u32>(), b.parse::<u32>()) {
                (Ok(a), Ok(b)) if a <= b && b <= MAX_GPU_INDEX => (a, b),
                _ => return Err(format!("bad GPU index list in GRES {e:?}")),
            };
            out.extend(a..=b);
        }
    }
    Ok(out)
}

/// The GPUs per node of one job from its `scontrol show job -d` record (one `-o` line, or
/// the multi-line form): the `Nodes=<hostlist> … GRES=…` groups slurmctld prints between
/// `JOB_GRES=` and `MinCPUsNode=`. A record where either marker is missing or repeated (a job
/// name or path can hold them) or a node is listed twice is refused.
pub fn parse_job_gpus(record: &str) -> Result<JobGpus, String> {
    let toks: Vec<&str> = record.split_whitespace().collect();
    let at = |key: &str| -> Result<usize, String> {
        let hits: Vec<usize> = toks
            .iter()
            .enumerate()
            .filter(|(_, t)| t.starts_with(key))
            .map(|(i, _)| i)
            .collect();
        match hits[..] {
            [i] => Ok(i),
            [] => Err(format!("no {key} in the job record (scontrol show job -d)")),
            _ => Err(format!(
                "{key} appears {} times in the job record",
                hits.len()
            )),
        }
    };
    let (from, to) = (at("JOB_GRES=")?, at("MinCPUsNode=")?);
    if to < from {
        return Err("MinCPUsNode= before JOB_GRES= in the job record".into());
    }
    let mut out = JobGpus::new();
    let mut seen = std::collections::BTreeSet::new();
    let mut group: Vec<String> = Vec::new();
    for t in &toks[from + 1..to] {
        if let Some(list) = t.strip_prefix("Nodes=") {
            group = hostlist::expand(list).map_err(|e| format!("Nodes={list}: {e}"))?;
            for n in &group {
                if !seen.insert(n.clone()) {
                    return Err(format!("node {n} listed twice in the job record"));
                }
            }
        } else if let Some(g) = t.strip_prefix("GRES=") {
            if group.is_empty() {
                return Err("GRES= without Nodes= in the job record".into());
            }
            let set = parse_gres_gpus(g)?;
            if !set.is_empty() {
                for n in group.drain(..) {
                    out.insert(n, set.clone());
                }
            }
            group.clear();
        }
    }
    Ok(out)
}

/// The GPUs per node of a running job, asked of slurmctld (`scontrol show job -d -o`).
pub fn job_gpus(slurm: &Slurm, job_id: &str, timeout: Duration) -> Result<JobGpus, String> {
    let out = slurm.run("scontrol", &["show", "job", "-d", "-o", job_id], timeout)?;
    let line = out
        .lines()
        .find(|l| record_is(&KvRecord::parse(l), job_id))
        .ok_or_else(|| format!("job {job_id} not found in slurmctld"))?;
    parse_job_gpus(line)
}

/// Looks up the cluster name with `scontrol show config`.
pub fn cluster_name(slurm: &Slurm, timeout: Duration) -> Result<String, String> {
    let out = slurm.run("scontrol", &["show", "config"], timeout)?;
    parse_cluster_name(&out).ok_or_else(|| {
        "ClusterName is not set in slurm.conf (scontrol show config); set it, CloudVision needs a cluster name".to_string()
    })
}

/// Looks a job up in slurmctld (`scontrol show job -o`).
pub fn scontrol_job(
    slurm: &Slurm,
    job_id: &str,
    timeout: Duration,
) -> Result<Option<JobInfo>, String> {
    match slurm.run("scontrol", &["show", "job", "-o", job_id], timeout) {
        Ok(out) => Ok(parse_scontrol_job(&out, job_id)),
        Err(e) if e.contains("Invalid job id") => Ok(None),
        Err(e) => Err(e),
    }
}

/// Looks a job up in the accounting database (`sacct`).
pub fn sacct_job(
    slurm: &Slurm,
    job_id: &str,
    timeout: Duration,
) -> Result<Option<JobInfo>, String> {
    let fmt = format!("--format={SACCT_FORMAT}");
    let out = slurm.run("sacct", &["-j", job_id, "-X", "-P", "-n", &fmt], timeout)?;
    Ok(parse_sacct(&out, job_id))
}

/// The running jobs on some of `nodes`: (job id, its nodes), from
/// `squeue -h -t RUNNING -w <nodes> -o '%A %N'` (a job id and a hostlist: no field a user
/// can write).
pub fn running_jobs_on(
    slurm: &Slurm,
    nodes: &[String],
    timeout: Duration,
) -> Result<Vec<(String, Vec<String>)>, String> {
    let list = crate::hostlist::compress(nodes);
    let out = slurm.run(
        "squeue",
        &["-h", "-t", "RUNNING", "-w", &list, "-o", "%A %N"],
        timeout,
    )?;
    Ok(parse_running_jobs(&out))
}

fn parse_running_jobs(out: &str) -> Vec<(String, Vec<String>)> {
    out.lines()
        .filter_map(|l| {
            let (id, nodes) = l.trim().split_once(' ')?;
            if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let nodes = crate::hostlist::expand(nodes.trim()).ok()?;
            Some((id.to_string(), nodes))
        })
        .collect()
}

/// Lists the nodes (`sinfo -h -N -o '%N %T %P'`).
pub fn sinfo_nodes(slurm: &Slurm, timeout: Duration) -> Result<Vec<SinfoNode>, String> {
    let out = slurm.run("sinfo", &["-h", "-N", "-o", SINFO_FORMAT], timeout)?;
    Ok(parse_sinfo(&out))
}

/// Finds a job in slurmctld, else in sacct.
pub fn lookup(slurm: &Slurm, job_id: &str) -> Result<JobInfo, String> {
    let from_ctl = scontrol_job(slurm, job_id, COMMAND_TIMEOUT);
    if let Ok(Some(j)) = &from_ctl {
        return Ok(j.clone());
    }
    match sacct_job(slurm, job_id, COMMAND_TIMEOUT) {
        Ok(Some(j)) => Ok(j),
        Ok(None) => Err(match from_ctl {
            Err(e) => format!("job {job_id}: not found in accounting, and slurmctld could not be asked: {e}"),
            Ok(_) => format!("job {job_id} not found in slurmctld (scontrol) or accounting (sacct)"),
        }),
        Err(e) => Err(match from_ctl {
            Err(ce) => format!("job {job_id}: slurmctld could not be asked ({ce}) and neither could accounting ({e})"),
            Ok(_) => format!("job {job_id} not known to slurmctld, and accounting could not be asked: {e}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_record_keeps_spaces_in_values() {
        let r = KvRecord::parse("JobId=7 JobName=my job name UserId=u(1) JobState=RUNNING Reason=None Socks/Node=* ReqB:S:C:T=0:0:*:*");
        assert_eq!(r.get("JobName"), Some("my job name"));
        assert_eq!(r.get("JobState"), Some("RUNNING"));
        assert_eq!(r.get("Socks/Node"), Some("*"));
        assert_eq!(r.get("ReqB:S:C:T"), Some("0:0:*:*"));
        assert_eq!(r.get("Missing"), None);
    }

    #[test]
    fn node_states() {
        for s in ["idle", "allocated", "mixed", "completing"] {
            assert!(node_state_available(s), "{s}");
        }
        for s in [
            "idle*",
            "down*",
            "down",
            "drained",
            "draining",
            "idle~",
            "idle#",
            "idle%",
            "mixed!",
            "allocated*",
            "unknown",
            "future",
        ] {
            assert!(!node_state_available(s), "{s}");
        }
    }

    #[test]
    fn sinfo_dedups_nodes_in_two_partitions() {
        let nodes = parse_sinfo("n1 idle debug*\nn3 mixed debug*\nn3 mixed gpu\nn4 down* gpu\n\n");
        assert_eq!(nodes.len(), 3);
        assert_eq!(nodes[1].partitions, ["debug", "gpu"]);
        assert!(nodes[1].available());
        assert!(!nodes[2].available());
    }

    /// From fuzzing (sinfo target, minimized): a bare `*` in the partition column became an
    /// empty partition name.
    #[test]
    fn sinfo_bare_default_marker_is_no_partition() {
        let nodes = parse_sinfo("1 * *");
        assert_eq!(nodes.len(), 1);
        assert!(nodes[0].partitions.is_empty(), "{:?}", nodes[0].partitions);
    }

    #[test]
    fn sacct_job_name_with_pipe() {
        let j = parse_sacct("42|a|b|debug|COMPLETED|100|200|n[1-2]|0:0\n", "42").unwrap();
        assert_eq!(j.name, "a|b");
        assert_eq!(j.partition.as_deref(), Some("debug"));
        assert_eq!((j.start, j.end), (Some(100), Some(200)));
        assert_eq!(j.nodes().unwrap(), ["n1", "n2"]);
        assert!(parse_sacct("41|x|debug|COMPLETED|1|2|n1|0:0\n", "42").is_none());
    }

    fn gres_fixture(name: &str) -> String {
        let p = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/slurm-22.05-gres/"
        );
        std::fs::read_to_string(format!("{p}{name}")).unwrap_or_else(|e| panic!("{name}: {e}"))
    }

    /// Real records of jobs sharing n1's 8 GPUs, a two-node job, a 6-GPU job and a job
    /// without GPUs (tests/cluster/capture-gres.sh).
    #[test]
    fn job_gpus_from_real_records() {
        let set = |v: &[u32]| {
            v.iter()
                .copied()
                .collect::<std::collections::BTreeSet<u32>>()
        };
        for form in ["scontrol-job-d-o-", "scontrol-job-d-"] {
            let g =
                |name: &str| parse_job_gpus(&gres_fixture(&format!("{form}{name}.txt"))).unwrap();
            assert_eq!(
                g("share-a"),
                JobGpus::from([("n1".into(), set(&[0, 1, 2, 3]))])
            );
            assert_eq!(
                g("share-b"),
                JobGpus::from([("n1".into(), set(&[4, 5, 6, 7]))])
            );
            assert_eq!(
                g("two-nodes"),
                JobGpus::from([("n2".into(), set(&[0, 1])), ("n3".into(), set(&[0, 1]))])
            );
            assert_eq!(
                g("six"),
                JobGpus::from([("n3".into(), set(&[2, 3, 4, 5, 6, 7]))])
            );
            assert_eq!(g("nogpu"), JobGpus::new());
        }
        // squeue --json's gres_detail holds the same strings, one per node.
        let v: serde_json::Value = serde_json::from_str(&gres_fixture("squeue.json")).unwrap();
        let details: Vec<Vec<u32>> = v["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|j| j["gres_detail"].as_array().unwrap().clone())
            .map(|d| {
                parse_gres_gpus(d.as_str().unwrap())
                    .unwrap()
                    .into_iter()
                    .collect()
            })
            .collect();
        assert_eq!(
            details,
            [
                vec![0, 1, 2, 3],
                vec![4, 5, 6, 7],
                vec![0, 1],
                vec![0, 1],
                vec![2, 3, 4, 5, 6, 7]
            ]
        );
    }

    #[test]
    fn gres_strings_and_hostile_records() {
        let set = |v: &[u32]| {
            v.iter()
                .copied()
                .collect::<std::collections::BTreeSet<u32>>()
        };
        assert_eq!(
            parse_gres_gpus("gpu:a100:2(IDX:0,2)").unwrap(),
            set(&[0, 2])
        );
        assert_eq!(
            parse_gres_gpus("gpu:2(IDX:0-1),nic:1(IDX:0)").unwrap(),
            set(&[0, 1])
        );
        assert_eq!(parse_gres_gpus("").unwrap(), set(&[]));
        for bad in [
            "gpu:2(IDX:1-0)",
            "gpu:2(IDX:0-99999)",
            "gpu:2(IDX:x)",
            "gpu:2((IDX:0)",
            "gpu:2",
        ] {
            assert!(parse_gres_gpus(bad).is_err(), "{bad}");
        }
        let real = gres_fixture("scontrol-job-d-o-share-a.txt");
        // A job name or work directory that carries the markers makes the record ambiguous.
        let named = real.replacen(
            "JobName=share-a",
            "JobName=x JOB_GRES=gpu:8 Nodes=n1 GRES=gpu:8(IDX:0-7) MinCPUsNode=1",
            1,
        );
        assert!(parse_job_gpus(&named)
            .unwrap_err()
            .contains("appears 2 times"));
        let workdir = real.replacen("WorkDir=/tmp", "WorkDir=/tmp/a MinCPUsNode=1", 1);
        assert!(parse_job_gpus(&workdir).is_err());
        assert!(parse_job_gpus(&fixture("scontrol-job-gpu-shell.txt"))
            .unwrap_err()
            .contains("no JOB_GRES="));
    }

    fn fixture(name: &str) -> String {
        let p = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/slurm-22.05/");
        std::fs::read_to_string(format!("{p}{name}")).unwrap_or_else(|e| panic!("{name}: {e}"))
    }

    #[test]
    fn scontrol_job_from_real_output() {
        use crate::payload::JobState;
        let j = parse_scontrol_job(
            &fixture("scontrol-job-multinode-running-shell-epoch.txt"),
            "7",
        )
        .unwrap();
        assert_eq!(j.state, "RUNNING");
        assert_eq!(j.partition.as_deref(), Some("debug"));
        assert_eq!(j.nodes().unwrap(), ["n1", "n2", "n3"]);
        assert!(j.start.is_some() && j.start.unwrap() > 1_700_000_000);
        assert_eq!(j.restarts, Some(0));
        let t = parse_scontrol_job(&fixture("scontrol-job-timeout-shell-epoch.txt"), "1").unwrap();
        assert_eq!(
            (t.state.as_str(), t.reason.as_deref()),
            ("TIMEOUT", Some("TimeLimit"))
        );
        assert!(t.end.unwrap() - t.start.unwrap() >= 60);
        let c =
            parse_scontrol_job(&fixture("scontrol-job-cancelled-shell-epoch.txt"), "6").unwrap();
        assert_eq!(JobState::from_slurm(&c.state), Some(JobState::Cancelled));
        let p = parse_scontrol_job(&fixture("scontrol-job-pending-begin-shell-epoch.txt"), "10")
            .unwrap();
        assert_eq!(p.state, "PENDING");
        assert_eq!(JobState::from_slurm(&p.state), None);
        // Without SLURM_TIME_FORMAT=%s the times are local ISO strings: never guessed.
        let iso = parse_scontrol_job(&fixture("scontrol-job-completed-shell.txt"), "3").unwrap();
        assert_eq!(iso.start, None);
        // A whole array: one line per task; an array task asked by <array>_<task>.
        let all = fixture("scontrol-job-array-all-finished-shell-epoch.txt");
        assert_eq!(all.lines().count(), 3);
        assert_eq!(parse_scontrol_job(&all, "12").unwrap().job_id, "12");
        assert_eq!(parse_scontrol_job(&all, "8_1").unwrap().job_id, "12");
        assert_eq!(parse_scontrol_job(&all, "8_3").unwrap().job_id, "8");
        assert!(parse_scontrol_job(&all, "99").is_none());
        let by = parse_scontrol_job(
            &fixture("scontrol-job-array-task1-shell-byarrayid.txt"),
            "8_1",
        )
        .unwrap();
        assert_eq!(by.job_id, "12");
        // In the epilog, NodeList is already empty; the hook uses SLURM_JOB_NODELIST.
        let e =
            parse_scontrol_job(&fixture("scontrol-job-completed-epilog-epoch.txt"), "3").unwrap();
        assert_eq!(e.state, "COMPLETING");
        assert!(e.nodes().unwrap().is_empty());
    }

    #[test]
    fn sacct_from_real_output() {
        use crate::payload::JobState;
        let j = parse_sacct(&fixture("sacct-completed.txt"), "3").unwrap();
        assert_eq!(
            (j.name.as_str(), j.state.as_str()),
            ("completed", "COMPLETED")
        );
        assert_eq!(j.nodes().unwrap(), ["n1"]);
        assert!(j.start.is_some() && j.end.is_some());
        let m = parse_sacct(&fixture("sacct-multinode.txt"), "7").unwrap();
        assert_eq!(m.nodes().unwrap(), ["n1", "n2", "n3"]);
        for (file, id, want) in [
            ("sacct-exit3.txt", "4", JobState::Failed),
            ("sacct-sigkill.txt", "5", JobState::Failed),
            ("sacct-cancelled.txt", "6", JobState::Cancelled),
            ("sacct-timeout.txt", "1", JobState::Failed),
            ("sacct-nodefail.txt", "17", JobState::Cancelled),
        ] {
            let j = parse_sacct(&fixture(file), id).unwrap_or_else(|| panic!("{file}"));
            assert_eq!(
                JobState::from_slurm(&j.state),
                Some(want),
                "{file}: {}",
                j.state
            );
        }
        let nf = parse_sacct(&fixture("sacct-nodefail.txt"), "17").unwrap();
        assert_eq!((nf.start, nf.nodelist.as_deref()), (None, None));
        let a = parse_sacct(&fixture("sacct-array.txt"), "8_2").unwrap();
        assert_eq!(a.exit_code.as_deref(), Some("2:0"));
        assert!(parse_sacct(&fixture("sacct-completed.txt"), "4").is_none());
    }

    #[test]
    fn sinfo_from_real_output() {
        let normal = parse_sinfo(&fixture("sinfo-normal.txt"));
        assert_eq!(
            normal.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(),
            ["n1", "n2", "n3", "n4"]
        );
        assert!(normal.iter().all(|n| n.available()));
        let stopped = parse_sinfo(&fixture("sinfo-slurmd-stopped-notresponding.txt"));
        let avail: Vec<_> = stopped
            .iter()
            .filter(|n| n.available())
            .map(|n| n.name.as_str())
            .collect();
        assert_eq!(avail, ["n1", "n3", "n4"]);
        let down = parse_sinfo(&fixture("sinfo-slurmd-stopped-down.txt"));
        assert!(!down.iter().find(|n| n.name == "n2").unwrap().available());
        let drain = parse_sinfo(&fixture("sinfo-drain-draining.txt"));
        let avail: Vec<_> = drain
            .iter()
            .filter(|n| n.available())
            .map(|n| n.name.as_str())
            .collect();
        assert_eq!(avail, ["n1", "n2"]);
        let dynamic = parse_sinfo(&fixture("sinfo-dynamic-node.txt"));
        assert_eq!(dynamic.last().unwrap().name, "n5");
    }

    #[test]
    fn cluster_name_from_real_config() {
        assert_eq!(
            parse_cluster_name(&fixture("scontrol-config.txt")).as_deref(),
            Some("cvtest")
        );
        assert_eq!(parse_cluster_name("ClusterName = (null)\n"), None);
    }

    /// The expander agrees with `scontrol show hostnames` wherever Slurm 22.05 answers, and
    /// rejects what it rejects — except suffixes after `]`, which Slurm accepts from 23.11.
    #[test]
    fn hostlist_agrees_with_scontrol_show_hostnames() {
        let table = fixture("hostnames.tsv");
        // Slurm 22.05 prints nonsense for these; we call them malformed.
        let malformed_here = ["n[1-2", "n1-2]", "n[ 1-2]"];
        // Slurm 22.05 rejects suffixes; 23.11 and later expand them, and so do we.
        let suffixes = ["node[1-2].example.com", "gpu[01-02]-ib", "n[1-3]-ib,n5"];
        let mut compared = 0;
        for line in table.lines() {
            let mut cols = line.splitn(3, '\t');
            let (expr, _code, out) = (
                cols.next().unwrap(),
                cols.next().unwrap(),
                cols.next().unwrap_or(""),
            );
            let ours = crate::hostlist::expand(expr);
            if malformed_here.contains(&expr) {
                assert!(ours.is_err(), "{expr:?}");
            } else if suffixes.contains(&expr) {
                assert!(ours.is_ok(), "{expr:?}");
            } else if out.is_empty() && !expr.trim().is_empty() {
                assert!(ours.is_err(), "Slurm rejects {expr:?}, we gave {ours:?}");
            } else {
                assert_eq!(ours.unwrap().join(" "), out, "{expr:?}");
                compared += 1;
            }
        }
        assert!(compared >= 20, "only {compared} expressions compared");
    }

    #[test]
    fn running_jobs_on_nodes() {
        // squeue -h -t RUNNING -o '%A %N' on the e2e cluster with every node allocated.
        let got = parse_running_jobs("14 n[1-4]\n15 n2\nbad line\n");
        assert_eq!(
            got,
            vec![
                (
                    "14".to_string(),
                    vec!["n1".into(), "n2".into(), "n3".into(), "n4".into()]
                ),
                ("15".to_string(), vec!["n2".to_string()]),
            ]
        );
    }
}
