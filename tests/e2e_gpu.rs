//! End-to-end test of `JobInterfaces` on a real Slurm cluster (the version `SLURM` names:
//! 22.05, 24.11 or 26.05) whose nodes have 8 GPUs as GRES (`cluster.sh` with `WITH_GPUS=1`).
//! The harness's nodes have no GPUs in sysfs, so the DGX A100 tree of
//! `tests/fixtures/topology/gen.sh` is bind-mounted over `/sys` and `/proc/driver` inside each
//! node's slurmd mount namespace: the discover steps slurmd starts see that node as a DGX
//! A100, and nothing ships a test-only setting.
//!
//! Needs root and the cluster to itself; run by `tests/run-all.sh`, or by hand:
//! `SLURM=24.11 PATH=/var/tmp/cvslurm-cluster/bin:$PATH cargo test --release --test e2e_gpu -- --ignored`.
//! With `CVSLURM_E2E_REUSE=1` (as in tests/e2e/) a running two-node GPU cluster of the same
//! version is used as it is (jobs cancelled, each slurmd restarted: the DGX trees mounted in
//! its namespace are gone) and left up at the end instead of taken down.

#[path = "common/cluster.rs"]
mod cluster;
mod common;
use cluster::*;
use common::*;
use cvslurm::internals::state::layout;
use serde_json::Value;
use std::collections::BTreeSet;
use std::fs;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

const WORK: &str = "/var/tmp/cvslurm-e2e-gpu";

/// The tests here each bring the two-node GPU cluster up (and take it down): one at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Held for a test's run: prints `[e2e] TEST: S s (waited W s)` when dropped, as tests/e2e/ do.
struct OneAtATime {
    _guard: std::sync::MutexGuard<'static, ()>,
    since: Instant,
    waited: Duration,
}

impl Drop for OneAtATime {
    fn drop(&mut self) {
        print_held(self.since, self.waited);
    }
}

fn one_at_a_time() -> OneAtATime {
    let asked = Instant::now();
    let guard = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    OneAtATime {
        _guard: guard,
        since: Instant::now(),
        waited: asked.elapsed(),
    }
}

/// The site's settings in these tests.
fn gpu_site(cv: &Standin) -> Site {
    // The DGX's NICs have no IPv4 address in the nodes' network namespaces.
    Site::new(
        &cv.server(),
        &cv.ca(),
        &format!("SlurmBinDir={CLUSTER_DIR}/bin\nJobInterfaces=auto\nInterfaceRequireIp=no\nDiscoveryTimeout=30\n\
         PollInterval=1"),
    )
}

/// Makes `node` a DGX A100 for the processes its slurmd starts: a generated tree (NIC MACs
/// starting with `mac_prefix`) bind-mounted over `/sys` (keeping the real `/sys/fs`, where
/// the cgroups are) and `/proc/driver`, in slurmd's own mount namespace only.
/// A second call stacks a new tree over the first (a NIC swap).
fn mount_topology(node: &str, mac_prefix: &str) {
    let dir = PathBuf::from(WORK).join(format!("topo-{node}-{}", mac_prefix.replace(':', "")));
    let st = Command::new("bash")
        .arg(repo().join("tests/fixtures/topology/gen.sh"))
        .arg("dgx-a100")
        .arg(&dir)
        .arg(mac_prefix)
        .status()
        .unwrap();
    assert!(st.success());
    fs::create_dir_all(dir.join("sys/fs")).unwrap();
    let pid = fs::read_to_string(format!("{CLUSTER_DIR}/run/slurmd-{node}.pid")).unwrap();
    // Slurm 24.11 and later run in a root filesystem: its /sys and /proc are the ones slurmd sees.
    let root = fs::read_to_string(format!("{CLUSTER_DIR}/run/rootfs")).unwrap_or_default();
    let r = root.trim();
    let d = dir.display();
    let out = Command::new("nsenter")
        .args(["-t", pid.trim(), "-m", "sh", "-c"])
        .arg(format!(
            "mount --rbind {r}/sys/fs {d}/sys/fs && mount --rbind {d}/sys {r}/sys && \
             mount --bind {d}/proc/driver {r}/proc/driver"
        ))
        .output()
        .unwrap();
    assert!(out.status.success(), "nsenter mount: {}", stderr(&out));
}

fn wait_running(ids: &[&str]) {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let out = slurm_cmd("squeue")
            .args(["-h", "-t", "RUNNING", "-o", "%i"])
            .output()
            .unwrap();
        let running: BTreeSet<String> = stdout(&out).lines().map(String::from).collect();
        if ids.iter().all(|i| running.contains(*i)) {
            return;
        }
        assert!(Instant::now() < until, "jobs {ids:?} not all running");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The GPU indices slurmctld gave `job` on `node`, read with the library's own parser.
fn gpus_of(job: &str, node: &str) -> Vec<u32> {
    let out = slurm_cmd("scontrol")
        .args(["show", "job", "-d", "-o", job])
        .output()
        .unwrap();
    let g = cvslurm::internals::slurm::parse_job_gpus(&stdout(&out)).unwrap();
    g.get(node)
        .map(|s| s.iter().copied().collect())
        .unwrap_or_default()
}

/// The MACs the DGX A100 layout puts nearest a block of 4 GPUs (gen.sh: MAC = prefix, PCI
/// bus, function): the compute NICs behind their two PCIe switches, and for GPUs 4-7 also
/// the storage NIC's two ports on their NUMA node.
fn dgx_macs(prefix: &str, gpus: &[u32]) -> Vec<String> {
    let buses: &[&str] = match gpus {
        [0, 1, 2, 3] => &["0c:00", "12:00", "4b:00", "54:00"],
        [4, 5, 6, 7] => &["8d:00", "94:00", "ba:00", "cc:00", "e1:00", "e1:01"],
        other => panic!("slurmctld gave GPUs {other:?}, not a block of 4 this test knows"),
    };
    let mut v: Vec<String> = buses.iter().map(|b| format!("{prefix}:{b}")).collect();
    v.sort();
    v
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn two_jobs_sharing_a_gpu_node_get_disjoint_interfaces() {
    let _one = one_at_a_time();
    let _ = fs::remove_dir_all(WORK);
    fs::create_dir_all(WORK).unwrap();
    let _down = Down;
    up(2, &[("WITH_GPUS", "1")]);
    let version = slurm_cmd("scontrol").arg("--version").output().unwrap();
    eprintln!("[e2e_gpu] {}", stdout(&version).trim());
    mount_topology("n1", "02:dd:00:01");
    mount_topology("n2", "02:dd:00:02");
    let cv = Standin::start();
    let site = gpu_site(&cv);

    // Inventory: NodeConfigs as always (no topology in the payload), records in StateDir;
    // taken in a later second than the slurmd started, else they would count as stale.
    wait_past_slurmd_start(&["n1", "n2"]);
    let out = site.run(&["inventory"]);
    assert_exit_0(&out);
    for body in cv.accepted("NodeConfig") {
        assert!(body.get("topology").is_none(), "{body}");
    }
    let n1 = cv.state()["nodes"]["n1"].clone();
    assert_eq!(
        n1["data_interfaces"]["values"].as_array().unwrap().len(),
        10,
        "{n1}"
    );
    let rec: Value = serde_json::from_slice(
        &fs::read(site.state_dir.join(layout::NODES).join("n1.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        rec["topology"]["gpus"].as_array().unwrap().len(),
        8,
        "{rec}"
    );

    // Two 4-GPU jobs on n1, one whole-node job on n2.
    let a = sbatch(&[
        "-w",
        "n1",
        "--gres=gpu:4",
        "-J",
        "share-a",
        "--wrap",
        "sleep 120",
    ]);
    let b = sbatch(&[
        "-w",
        "n1",
        "--gres=gpu:4",
        "-J",
        "share-b",
        "--wrap",
        "sleep 120",
    ]);
    let c = sbatch(&[
        "-w",
        "n2",
        "--gres=gpu:8",
        "-J",
        "whole",
        "--wrap",
        "sleep 120",
    ]);
    wait_running(&[&a, &b, &c]);
    let want_a = dgx_macs("02:dd:00:01", &gpus_of(&a, "n1"));
    let want_b = dgx_macs("02:dd:00:01", &gpus_of(&b, "n1"));

    // The dry run shows the rule for each job.
    let out = site.run(&["send", "--dry-run", &a, &c]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains(&format!("# job {a}: interfaces (auto): n1: GPUs ")),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "# job {c}: nodes (auto): the job holds whole nodes (no node's GPUs are shared)"
        )),
        "{text}"
    );

    // Sent for real: CloudVision holds disjoint MAC sets, and the whole-node job by name.
    let out = site.run(&["send", &a, &b, &c]);
    assert_exit_0(&out);
    let text = stdout(&out);
    assert!(
        text.contains(&format!(
            "job {a}@{CLUSTER}: sent RUNNING on 4 interface(s)"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!("job {c}@{CLUSTER}: sent RUNNING on 1 node(s)")),
        "{text}"
    );
    let jobs = cv.state()["jobs"].clone();
    let got_a = strings(&jobs[key(&a)]["interfaces"]["values"]);
    let got_b = strings(&jobs[key(&b)]["interfaces"]["values"]);
    assert_eq!(got_a, want_a);
    assert_eq!(got_b, want_b);
    assert!(
        got_a.iter().all(|m| !got_b.contains(m)),
        "{got_a:?} {got_b:?}"
    );
    assert!(jobs[key(&a)].get("nodes").is_none());
    assert_eq!(strings(&jobs[key(&c)]["nodes"]["values"]), ["n2"]);

    // JobInterfaces=nodes: the same job by node name, no rule line.
    let nodes_site = Site::new(
        &cv.server(),
        &cv.ca(),
        &format!("SlurmBinDir={CLUSTER_DIR}/bin"),
    );
    let out = nodes_site.run(&["send", "--dry-run", &a]);
    let text = stdout(&out);
    assert!(!text.contains("# job"), "{text}");
    let (first, json) = text.split_once('\n').unwrap();
    assert!(
        first.starts_with("POST https://")
            && first.ends_with("/api/resources/computejob/v1/JobConfig"),
        "{first}"
    );
    let body: Value = serde_json::from_str(json).unwrap();
    assert_eq!(strings(&body["nodes"]["values"]), ["n1"]);
    assert!(body.get("interfaces").is_none());

    // The service path: a prolog hook hands job b's RUNNING to the service, which asks
    // slurmctld for its GPUs off the hook's path and sends its MACs.
    cv.reset();
    let svc = Service::start(&site);
    let partition = String::from_utf8_lossy(
        &slurm_cmd("squeue")
            .args(["-h", "-j", &b, "-o", "%P"])
            .output()
            .unwrap()
            .stdout,
    )
    .trim()
    .to_string();
    let (out, _) = site.hook(&[
        ("SLURM_SCRIPT_CONTEXT", "prolog_slurmctld"),
        ("SLURM_JOB_ID", &b),
        ("SLURM_CLUSTER_NAME", CLUSTER),
        ("SLURM_JOB_NAME", "share-b"),
        ("SLURM_JOB_PARTITION", &partition),
        ("SLURM_JOB_NODELIST", "n1"),
    ]);
    assert_eq!(out.status.code(), Some(0));
    let b_key = key(&b);
    let until = Instant::now() + Duration::from_secs(30);
    let job = loop {
        let j = cv.state()["jobs"][&b_key].clone();
        if j.is_object() {
            break j;
        }
        assert!(
            Instant::now() < until,
            "the service never sent job {b}: {}",
            site.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        site.log()
            .contains(&format!("job {b_key}: RUNNING queued for the service")),
        "{}",
        site.log()
    );
    assert_eq!(strings(&job["interfaces"]["values"]), want_b, "{job}");
    assert!(job.get("nodes").is_none(), "{job}");

    // The inventory changes while the jobs run: n1 is drained, its NICs are swapped (a new
    // tree, other MACs), and it is resumed. The service rediscovers n1 when it comes back and
    // sends its running jobs again, attributed from the new record; the job on n2 is left alone.
    let scontrol = |args: &[&str]| {
        let out = slurm_cmd("scontrol").args(args).output().unwrap();
        assert!(out.status.success(), "scontrol {args:?}: {}", stderr(&out));
    };
    // Waits (30 s at most) until the service's log says `line`; panics with `what` and the log.
    let wait_log = |line: &str, what: &str| {
        let until = Instant::now() + Duration::from_secs(30);
        while !site.log().contains(line) {
            assert!(Instant::now() < until, "{what}: {}", site.log());
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    // Drained once the service's first poll has inventoried n1 (drained before, n1 is
    // never "now drain" to it: found in CI, where that poll came after the drain).
    wait_log("node n1: appeared", "the service never inventoried n1");
    scontrol(&["update", "nodename=n1", "state=drain", "reason=nic-swap"]);
    wait_log("node n1: now drain", "the service never saw n1 drained");
    mount_topology("n1", "02:ee:00:01");
    scontrol(&["update", "nodename=n1", "state=resume"]);
    let new_a = dgx_macs("02:ee:00:01", &gpus_of(&a, "n1"));
    let new_b = dgx_macs("02:ee:00:01", &gpus_of(&b, "n1"));
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let jobs = cv.state()["jobs"].clone();
        let got = |id: &str| {
            let macs = &jobs[key(id)]["interfaces"]["values"];
            macs.is_array().then(|| strings(macs))
        };
        if got(&a).as_ref() == Some(&new_a) && got(&b).as_ref() == Some(&new_b) {
            break;
        }
        assert!(
            Instant::now() < until,
            "jobs {a} and {b} were not resent with n1's new MACs: {jobs}\n{}",
            site.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let log = site.log();
    for id in [&a, &b] {
        assert!(
            log.contains(&format!(
                "job {id}@{CLUSTER}: the inventory of n1 changed; RUNNING queued again"
            )),
            "{log}"
        );
    }
    assert!(
        !log.contains(&format!("job {c}@{CLUSTER}: the inventory")),
        "{log}"
    );
    let whole = cv.state()["jobs"][key(&c)].clone();
    assert_eq!(strings(&whole["nodes"]["values"]), ["n2"], "{whole}");
    // The service records how each RUNNING went (the MACs), for the job's later records.
    let kept = fs::read_to_string(site.state_dir.join(layout::JOB_REPS).join(key(&a))).unwrap();
    assert_eq!(kept.lines().collect::<Vec<_>>(), new_a, "{kept}");
    drop(svc);

    // One representation per job: every record of a job goes the way its
    // first went. The service is down (its socket bound by nobody): a hook sends job a's
    // RUNNING itself, by the MACs recorded (it never asks slurmctld), not by node names.
    let hook_vars = |ctx: &'static str, id: &str, name: &'static str| -> Vec<(String, String)> {
        [
            ("SLURM_SCRIPT_CONTEXT", ctx.to_string()),
            ("SLURM_JOB_ID", id.to_string()),
            ("SLURM_CLUSTER_NAME", CLUSTER.to_string()),
            ("SLURM_JOB_NAME", name.to_string()),
            ("SLURM_JOB_PARTITION", partition.clone()),
            ("SLURM_JOB_NODELIST", "n1".to_string()),
            ("SLURM_JOB_EXIT_CODE2", "0:0".to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    };
    let run_hook = |site: &Site, vars: Vec<(String, String)>| {
        let v: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let (out, _) = site.hook(&v);
        assert_eq!(out.status.code(), Some(0));
    };
    let stored = |id: &str| cv.stored_job(&key(id)).unwrap_or(Value::Null);
    let only = |job: &Value, field: &str, other: &str| {
        assert!(job[field]["values"].is_array(), "{job}");
        assert!(
            job.get(other)
                .is_none_or(|l| l["values"].as_array().is_some_and(|v| v.is_empty())),
            "both lists stored: {job}"
        );
    };
    assert!(stored(&a)["interfaces"]["values"].is_array());
    let before = cv.requests().len();
    run_hook(&site, hook_vars("prolog_slurmctld", &a, "share-a"));
    assert_eq!(cv.requests().len(), before + 1, "{}", site.log());
    let j = stored(&a);
    assert_eq!(j["state"], "JOB_STATE_RUNNING", "{}", site.log());
    only(&j, "interfaces", "nodes");
    assert_eq!(strings(&j["interfaces"]["values"]), new_a, "{j}");
    // The service is back: the end it sends goes by the same MACs, and the record of them
    // ends with the job.
    let svc = Service::start(&site);
    run_hook(&site, hook_vars("epilog_slurmctld", &a, "share-a"));
    let until = Instant::now() + Duration::from_secs(30);
    while stored(&a)["state"] == "JOB_STATE_RUNNING" {
        assert!(Instant::now() < until, "no end of {a}: {}", site.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    let j = stored(&a);
    only(&j, "interfaces", "nodes");
    assert_eq!(strings(&j["interfaces"]["values"]), new_a, "{j}");
    assert!(!site.state_dir.join(layout::JOB_REPS).join(key(&a)).exists());
    drop(svc);

    // A resend after a node's first inventory: a site whose StateDir has no record of n1
    // yet. A hook without the service sends job b's RUNNING by node names (with no record of
    // b here, that is its first record: CloudVision's earlier one by MACs is replaced whole);
    // the service, started, inventories n1 for the first time and sends b again, decided
    // anew by the MACs of its GPUs: another kind, so the stored record is deleted first.
    let fresh = Site::new(
        &cv.server(),
        &cv.ca(),
        &format!("SlurmBinDir={CLUSTER_DIR}/bin\nJobInterfaces=auto\nInterfaceRequireIp=no\nDiscoveryTimeout=30\n\
         PollInterval=1"),
    );
    run_hook(&fresh, hook_vars("prolog_slurmctld", &b, "share-b"));
    let sent = cv.accepted("JobConfig");
    let last = sent.last().unwrap();
    assert_eq!(last["key"]["id"], key(&b).as_str(), "{last}");
    only(last, "nodes", "interfaces");
    let svc = Service::start(&fresh);
    let until = Instant::now() + Duration::from_secs(60);
    // Where a Set merges, the record holds both lists until the resend replaces it whole.
    while !stored(&b)["interfaces"]["values"].is_array() || stored(&b).get("nodes").is_some() {
        assert!(
            Instant::now() < until,
            "{b} not resent by MACs: {}",
            fresh.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let j = stored(&b);
    only(&j, "interfaces", "nodes");
    assert_eq!(strings(&j["interfaces"]["values"]), new_b, "{j}");
    cv.assert_one_list_each();
    assert!(
        fresh
            .log()
            .contains(&format!("job {b_key}: the inventory of n1 changed")),
        "{}",
        fresh.log()
    );
    drop(svc);

    let _ = slurm_cmd("scancel").args([&a, &b, &c]).status();
}

/// A node restarted with other NICs (a reboot, a NIC swap): until it is discovered
/// again, a job on it goes by node names, never with a MAC from its record from before the
/// restart; once the service has its new record, the job is resent with the new MACs. The
/// service is stopped meanwhile, so `send` decides from the stale record for sure; the
/// service's first poll then discovers n1 again.
#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn no_job_names_a_mac_from_before_a_slurmd_restart() {
    let _one = one_at_a_time();
    let _ = fs::remove_dir_all(WORK);
    fs::create_dir_all(WORK).unwrap();
    let _down = Down;
    up(2, &[("WITH_GPUS", "1")]);
    mount_topology("n1", "02:dd:00:01");
    let cv = Standin::start();
    let site = gpu_site(&cv);
    wait_past_slurmd_start(&["n1", "n2"]);
    assert_exit_0(&site.run(&["inventory"]));
    // n1 comes back with other NICs: its slurmd restarts, the new tree is mounted in the new
    // slurmd's namespace (the old one's mounts went with it).
    restart_slurmd("n1");
    mount_topology("n1", "02:ee:00:01");
    let a = sbatch(&[
        "-w",
        "n1",
        "--gres=gpu:4",
        "-J",
        "after-restart",
        "--wrap",
        "sleep 120",
    ]);
    wait_running(&[&a]);
    let new_a = dgx_macs("02:ee:00:01", &gpus_of(&a, "n1"));
    let out = site.run(&["send", "--dry-run", &a]);
    let text = stdout(&out);
    assert!(
        text.contains(&format!("# job {a}: nodes (auto): n1: its record (taken "))
            && text.contains("is not from after its slurmd started"),
        "{text}\n{}",
        stderr(&out)
    );
    let out = site.run(&["send", &a]);
    assert_exit_0(&out);
    assert!(
        stdout(&out).contains(&format!("job {a}@{CLUSTER}: sent RUNNING on 1 node(s)")),
        "{}",
        stdout(&out)
    );
    assert_eq!(
        strings(&cv.state()["jobs"][key(&a)]["nodes"]["values"]),
        ["n1"]
    );
    // One line says why (`send` logs on stderr).
    assert!(
        stderr(&out).contains(&format!(
            "job {a}@{CLUSTER}: sent by node names: nodes (auto): n1: its record"
        )),
        "{}",
        stderr(&out)
    );
    // The service discovers n1 again and resends the job, decided anew: the new MACs.
    let svc = Service::start(&site);
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let j = cv.stored_job(&key(&a)).unwrap_or(Value::Null);
        let macs = &j["interfaces"]["values"];
        if macs.is_array() && strings(macs) == new_a && j.get("nodes").is_none() {
            break;
        }
        assert!(
            Instant::now() < until,
            "{a} not resent with n1's new MACs: {j}\n{}",
            site.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(svc);
    // No record of the job ever named a MAC of n1 from before the restart.
    let sent: Vec<Value> = cv
        .accepted("JobConfig")
        .into_iter()
        .filter(|j| j["key"]["id"] == key(&a))
        .collect();
    assert!(sent.len() >= 2, "{sent:?}");
    for body in sent {
        assert!(!body.to_string().contains("02:dd:00:01"), "{body}");
    }
    let _ = slurm_cmd("scancel").arg(&a).status();
}
