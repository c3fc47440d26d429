//! GPUs: the GRES indices a running job holds per node, and whether it has its nodes to
//! itself, read from slurmctld's job record (`scontrol show job -d`).

use super::hostlist;
use super::runner::Slurm;
use std::time::Duration;

/// The GPU indices a job holds on each node (nodes where it holds none are absent).
pub type JobGpus = std::collections::BTreeMap<String, std::collections::BTreeSet<u32>>;

/// The highest GPU index accepted from Slurm.
const MAX_GPU_INDEX: u32 = 1023;

/// The GPU indices of one GRES string as slurmctld prints it per node (`GRES=` of
/// `scontrol show job -d`, an entry of squeue's JSON `gres_detail`):
/// `gpu:4(IDX:0-3)`, `gpu:a100:2(IDX:0,2)`, `gpu:2(IDX:0-1),nic:1(IDX:0)`, or empty.
///
/// A MIG instance's index is its own GRES index (see
/// [`crate::discovery::topology::Topology::slurm_indices`]). Shares of a GPU (`shard`, `mps`)
/// give the indices of the GPUs they are on: `shard:2(IDX:0)` before Slurm 23.11.2, and from
/// then one `<held>/<available>` per GPU of the node, in GRES index order, `shard:3(0/4,3/4)`
/// holding shares of GPU 1 (`_build_shared_gres_details`, `gres_stepmgr.c:1844-1908` and
/// `:1986-1994@slurm-24-11-6-1`, Slurm commit 05ffde3e96; slurmd makes one shared record per
/// GPU record, in the GPUs' order: `_merge_lists`, `gres_c_s.c:112-185`).
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
        let name = head.split(':').next();
        let shared = matches!(name, Some("shard" | "mps"));
        if name != Some("gpu") && !shared {
            continue;
        }
        let Some(idx) = idx else {
            return Err(format!(
                "GRES {e:?} has no IDX list: ask with scontrol show job -d"
            ));
        };
        if shared && !idx.starts_with("IDX:") {
            // One `<held>/<available>` per GPU of the node, in GRES index order.
            let counts: Vec<&str> = idx.split(',').collect();
            if counts.len() > MAX_GPU_INDEX as usize + 1 {
                return Err(format!("too many GPUs in GRES {e:?}"));
            }
            for (i, c) in counts.into_iter().enumerate() {
                let held = c
                    .split_once('/')
                    .and_then(|(h, a)| Some((h.parse::<u64>().ok()?, a.parse::<u64>().ok()?)))
                    .filter(|(h, a)| h <= a)
                    .map(|(h, _)| h)
                    .ok_or_else(|| format!("bad share count {c:?} in GRES {e:?}"))?;
                if held > 0 {
                    out.insert(i as u32);
                }
            }
            continue;
        }
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

/// Whether a job record (`scontrol show job -d`) says the job has its nodes to itself.
/// From Slurm 26.05 the record has `Exclusive=NO|NODE|USER|MCS|TOPO` beside `OverSubscribe=`
/// (`info_job.c:740-744`, `job_exclusive_display_string`, `slurm_protocol_defs.c:2873@slurm-26-05-3-1`),
/// and `Exclusive=NODE` says so; `OverSubscribe=NO` there is no node exclusivity (a shared
/// job's real 26.05 record has it). Before, `OverSubscribe=NO` says so: scontrol prints it for
/// `--exclusive` or a partition's `OverSubscribe=EXCLUSIVE` (`get_job_share_value`,
/// `slurm_protocol_defs.c:6386-6400`, `info_job.c:708@slurm-24-11-6-1`; `USER`, `MCS` and
/// `TOPO` share nodes with other jobs). A word that appears more than once (a job name can
/// hold it) is not taken as exclusive.
pub fn parse_job_exclusive(record: &str) -> bool {
    let values = |key: &str| -> Vec<&str> {
        record
            .split_whitespace()
            .filter_map(|t| t.strip_prefix(key))
            .collect()
    };
    let exclusive = values("Exclusive=");
    if !exclusive.is_empty() {
        return exclusive == ["NODE"];
    }
    values("OverSubscribe=") == ["NO"]
}

/// What slurmctld says of a running job's GPUs ([`job_gpus`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobGres {
    /// The GRES indices of the GPUs (or GPU shares) it holds, per node.
    pub gpus: JobGpus,
    /// The job has its nodes to itself ([`parse_job_exclusive`]).
    pub exclusive: bool,
}

/// The GPUs per node of a running job, and whether it has its nodes to itself, asked of
/// slurmctld (`scontrol show job -d -o`).
pub fn job_gpus(slurm: &Slurm, job_id: &str, timeout: Duration) -> Result<JobGres, String> {
    let out = slurm.run("scontrol", &["show", "job", "-d", "-o", job_id], timeout)?;
    // The record starts with its own `JobId=`; a second such line is a job name's newline.
    let head = format!("JobId={job_id} ");
    let lines: Vec<&str> = out.lines().filter(|l| l.starts_with(&head)).collect();
    match lines[..] {
        [line] => Ok(JobGres {
            gpus: parse_job_gpus(line)?,
            exclusive: parse_job_exclusive(line),
        }),
        [] => Err(format!("job {job_id} not found in slurmctld")),
        _ => Err(format!(
            "job {job_id}: {} records in scontrol's answer (a job name with a newline); GPUs not read",
            lines.len()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::fixture;
    use super::*;

    fn gres_fixture(version: &str, name: &str) -> String {
        let p = format!(
            "{}/tests/fixtures/slurm-{version}-gres/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{p}: {e}"))
    }

    /// Real records of jobs sharing n1's 8 GPUs, a two-node job, a 6-GPU job and a job
    /// without GPUs (tests/cluster/capture-gres.sh), from every Slurm version: slurmctld gave
    /// the same GPUs on each.
    #[test]
    fn job_gpus_from_real_records() {
        for version in ["22.05", "24.11", "26.05"] {
            job_gpus_from_real_records_of(version);
        }
    }

    fn job_gpus_from_real_records_of(version: &str) {
        let set = |v: &[u32]| {
            v.iter()
                .copied()
                .collect::<std::collections::BTreeSet<u32>>()
        };
        for form in ["scontrol-job-d-o-", "scontrol-job-d-"] {
            let g = |name: &str| {
                parse_job_gpus(&gres_fixture(version, &format!("{form}{name}.txt")))
                    .unwrap_or_else(|e| panic!("{version} {form}{name}: {e}"))
            };
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
        let v: serde_json::Value =
            serde_json::from_str(&gres_fixture(version, "squeue.json")).unwrap();
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

    /// GPU shares (`shard`, `mps`) name the GPUs they are on: by index before Slurm 23.11.2,
    /// by one `<held>/<available>` per GPU since (`gres_stepmgr.c:1986-1994@slurm-24-11-6-1`).
    #[test]
    fn shards_and_mps_name_their_gpus() {
        let set = |v: &[u32]| {
            v.iter()
                .copied()
                .collect::<std::collections::BTreeSet<u32>>()
        };
        let table: [(&str, &[u32]); 6] = [
            ("shard:2(IDX:0)", &[0]),
            ("shard:3(0/4,3/4)", &[1]),
            ("shard:a100:6(2/4,0/4,4/4)", &[0, 2]),
            ("mps:50(50/100,0/100)", &[0]),
            ("gpu:1(IDX:3),shard:1(1/4,0/4,0/4,0/4)", &[0, 3]),
            ("mps:0(0/100,0/100)", &[]),
        ];
        for (gres, want) in table {
            assert_eq!(parse_gres_gpus(gres), Ok(set(want)), "{gres}");
        }
        for bad in [
            "shard:1(5/4)",
            "shard:1(x/4)",
            "shard:1(1)",
            "mps:1(1/-1)",
            "shard:1(IDX:a)",
        ] {
            assert!(parse_gres_gpus(bad).is_err(), "{bad}");
        }
    }

    /// Before 26.05 `OverSubscribe=NO` says the job has its nodes to itself; from 26.05,
    /// `Exclusive=NODE` does (the real shared job's 26.05 record says `OverSubscribe=NO
    /// Exclusive=NO`); a repeated word is not taken as exclusive.
    #[test]
    fn exclusive_jobs() {
        for form in ["scontrol-job-d-o-", "scontrol-job-d-"] {
            for (version, from, to) in [
                ("22.05", " OverSubscribe=OK ", " OverSubscribe=NO "),
                ("24.11", " OverSubscribe=OK ", " OverSubscribe=NO "),
                ("26.05", " Exclusive=NO ", " Exclusive=NODE "),
            ] {
                let rec = gres_fixture(version, &format!("{form}share-a.txt"));
                assert!(rec.contains(from), "{version}");
                assert!(!parse_job_exclusive(&rec), "{version}");
                let excl = rec.replace(from, to);
                assert!(parse_job_exclusive(&excl), "{version}");
                // A job name holding the word: not taken as exclusive.
                let named = excl.replacen("JobName=", &format!("JobName=x{to}"), 1);
                assert!(!parse_job_exclusive(&named), "{version}");
                let key = from.trim().split('=').next().unwrap();
                for other in ["USER", "MCS", "TOPO", "YES"] {
                    let r = rec.replace(from, &format!(" {key}={other} "));
                    assert!(!parse_job_exclusive(&r), "{version} {other}");
                }
            }
        }
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
        for version in ["22.05", "24.11", "26.05"] {
            let real = gres_fixture(version, "scontrol-job-d-o-share-a.txt");
            // A job name or work directory that carries the markers makes the record
            // ambiguous.
            let named = real.replacen(
                "JobName=share-a",
                "JobName=x JOB_GRES=gpu:8 Nodes=n1 GRES=gpu:8(IDX:0-7) MinCPUsNode=1",
                1,
            );
            assert!(
                parse_job_gpus(&named)
                    .unwrap_err()
                    .contains("appears 2 times"),
                "{version}"
            );
            let workdir = real.replacen("WorkDir=/tmp", "WorkDir=/tmp/a MinCPUsNode=1", 1);
            assert_ne!(workdir, real, "{version}");
            assert!(parse_job_gpus(&workdir).is_err(), "{version}");
        }
        assert!(parse_job_gpus(&fixture("scontrol-job-gpu-shell.txt"))
            .unwrap_err()
            .contains("no JOB_GRES="));
    }
}
