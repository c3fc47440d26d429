//! Nodes: inventory and discovery, the monitor, misbehaving workers, hidden partitions, node
//! keys, Arista's CloudVision rules, `cvslurm check`.

use super::*;

/// Expected data interfaces of static node `i` (the harness's addressing scheme).
fn expected_interfaces(i: usize) -> Value {
    json!([
        {"name": "ens1f0", "mac_address": format!("02:99:00:00:{i:02x}:02"),
         "ip_addresses": {"values": [format!("10.98.{i}.1"), format!("10.98.{i}.2")]}},
        {"name": "eth0", "mac_address": format!("02:99:00:00:{i:02x}:01"),
         "ip_addresses": {"values": [format!("10.99.0.{}", 10 + i)]}},
    ])
}

#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn inventory_sends_each_nodes_own_interfaces() {
    let (f, _g) = exclusive();
    f.cv.set_mode(json!({"mode": "ok"}));
    let out = Command::new(&f.bin)
        .args(["inventory", "--dry-run"])
        .output()
        .unwrap();
    assert_exit_0(&out);
    let text = stdout(&out);
    assert!(
        text.contains(&format!(
            "inventory of cluster {CLUSTER}: {NODES} would send, 0 failed, 0 unavailable"
        )),
        "{text}"
    );
    // Real run: one NodeConfig per node with that node's own MACs and IPs.
    let before = f.cv.requests().len();
    let out = Command::new(&f.bin).args(["inventory"]).output().unwrap();
    assert_exit_0(&out);
    let sent: Vec<Value> = f.cv.requests()[before..]
        .iter()
        .filter(|r| r["method"] == "POST" && r["path"].as_str().unwrap().ends_with("NodeConfig"))
        .map(|r| r["body"].clone())
        .collect();
    // One NodeConfig per node from this run (its summary); the service may send a node of
    // its own meanwhile (one an earlier test left failing), so the request log is read as a
    // set of nodes.
    assert!(
        stdout(&out).contains(&format!("{NODES} sent, 0 failed, 0 unavailable")),
        "{}",
        stdout(&out)
    );
    let keys: std::collections::BTreeSet<String> = sent
        .iter()
        .map(|n| n["key"]["id"].as_str().unwrap_or("").to_string())
        .collect();
    let all: std::collections::BTreeSet<String> = (1..=NODES).map(|i| format!("n{i}")).collect();
    assert_eq!(keys, all);
    for i in 1..=NODES {
        let n = sent
            .iter()
            .find(|n| n["key"]["id"] == format!("n{i}"))
            .unwrap_or_else(|| panic!("n{i} not sent"));
        assert_eq!(n["hostname"], format!("n{i}"));
        assert_eq!(n["location"], CLUSTER);
        assert_eq!(
            n["data_interfaces"]["values"],
            expected_interfaces(i),
            "n{i}"
        );
    }
    // A node whose slurmd is dead: dead_node_requeue_and_time_limit_end_right.
    // Discovery through srun --bcast: nothing needs to be installed on the workers but the
    // directory the copy goes to, writable only by SlurmUser (root's inventory runs as
    // StateDir's owner).
    let bdir = PathBuf::from(WORK).join("bcast");
    fs::create_dir_all(&bdir).unwrap();
    fs::set_permissions(&bdir, fs::Permissions::from_mode(0o700)).unwrap();
    chown_slurm(&bdir);
    let conf = fs::read_to_string(&f.conf).unwrap();
    let bcast = Scratch::new("bcast");
    let bconf = bcast.path().join("cv.conf");
    fs::write(
        &bconf,
        format!(
            "{conf}DiscoveryBcast=yes\nDiscoveryBcastDir={}\n",
            bdir.display()
        ),
    )
    .unwrap();
    let out = Command::new(&f.bin)
        .args([
            "inventory",
            "--dry-run",
            "--config",
            bconf.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(
        stdout(&out).contains(&format!("{NODES} would send, 0 failed")),
        "{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    let copies = fs::read_dir(&bdir).unwrap().count();
    assert!(copies >= 1, "no copy in {}", bdir.display());
}

/// Puts the stand-in back to CloudVision's contract when the test ends, passed or not.
struct ContractProfile<'a>(&'a Standin);

impl Drop for ContractProfile<'_> {
    fn drop(&mut self) {
        self.0.set_behaviour(json!({"profile": "cloudvision"}));
    }
}

/// On a real cluster against Arista's own fake CloudVision's rules (every POST a
/// whole record that replaces the stored one; no GET): a job's RUNNING and end from the hooks
/// and the service, and a one-shot inventory, are each accepted and the records held are the
/// job's and the nodes'; a node whose interfaces no filter lets through gets no NodeConfig
/// (a warning naming the filters, exit 0), and its record stays.
#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn arista_rules_take_every_record_and_a_node_without_nics_is_not_posted() {
    let (f, _g) = exclusive();
    f.cv.set_mode(json!({"mode": "ok"}));
    let from =
        f.cv.requests()
            .last()
            .map_or(0, |r| r["seq"].as_u64().unwrap_or(0));
    f.cv.set_behaviour(json!({"profile": "arista"}));
    let _back = ContractProfile(&f.cv);
    let id = sbatch(&["-J", "e2e-arista", "--wrap", "sleep 1"]);
    let done = wait_job(f, &id, "JOB_STATE_COMPLETED", Duration::from_secs(60));
    check_times(&done);
    assert_eq!(done["name"], "e2e-arista@debug");
    assert_eq!(nodes_of(&done).len(), 1);
    assert!(done.get("interfaces").is_none(), "{done}");
    let out = Command::new(&f.bin).args(["inventory"]).output().unwrap();
    assert_exit_0(&out);
    assert!(
        stdout(&out).contains(&format!("{NODES} sent, 0 failed, 0 unavailable")),
        "{}",
        stdout(&out)
    );
    for i in 1..=NODES {
        let n = f.cv.stored_node(&format!("n{i}")).unwrap();
        assert_eq!(
            n["data_interfaces"]["values"],
            expected_interfaces(i),
            "{n}"
        );
    }
    // No interface passes InterfaceRegex: nothing posted, one warning per node, exit 0.
    let conf = Scratch::new("no-nics");
    let path = conf.path().join("cv.conf");
    fs::write(
        &path,
        format!(
            "{}InterfaceRegex=^nomatch\n",
            fs::read_to_string(&f.conf).unwrap()
        ),
    )
    .unwrap();
    let posts = |f: &Fixture| {
        f.cv.requests()
            .iter()
            .filter(|r| {
                r["method"] == "POST" && r["path"].as_str().unwrap().ends_with("NodeConfig")
            })
            .count()
    };
    let before = posts(f);
    let out = Command::new(&f.bin)
        .args(["inventory", "--config", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert_exit_0(&out);
    assert!(
        stdout(&out).contains(&format!(
            "0 sent, 0 failed, 0 unavailable, {NODES} without an interface (n1, n2, n3, n4)"
        )),
        "{}",
        stdout(&out)
    );
    assert!(
        stderr(&out).contains(
            "node n1: no interface passes the filters (InterfaceRegex=^nomatch, \
             InterfacePhysicalOnly="
        ),
        "{}",
        stderr(&out)
    );
    assert_eq!(posts(f), before, "a NodeConfig was posted");
    assert!(f.cv.stored_node("n1").is_some(), "n1's record is gone");
    // Every request since the switch was accepted: whole records, one list each.
    for r in f.cv.requests() {
        if r["seq"].as_u64().unwrap_or(0) <= from || r["method"] != "POST" {
            continue;
        }
        assert_eq!(r["status"], 200, "refused: {r}");
        if r["path"].as_str().unwrap().ends_with("JobConfig") {
            let lists = ["nodes", "interfaces"]
                .iter()
                .filter(|l| r["body"].get(**l).is_some())
                .count();
            assert_eq!(lists, 1, "{r}");
        }
    }
}

#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn monitor_follows_nodes_that_appear_leave_and_return() {
    let (f, _g) = exclusive();
    f.cv.set_mode(json!({"mode": "ok"}));
    let nodes = |f: &Fixture| f.cv.state()["nodes"].clone();
    // The service's first inventory sent every node.
    wait_until(
        "the service's first inventory",
        Duration::from_secs(60),
        || (1..=NODES).all(|i| nodes(f)[format!("n{i}")].is_object()),
    );
    cluster_sh(&["add-node", "n5"], &[]);
    let _cleanup = Restore(&["del-node", "n5"]);
    wait_until("n5's NodeConfig", Duration::from_secs(60), || {
        nodes(f)["n5"].is_object()
    });
    assert_eq!(
        nodes(f)["n5"]["data_interfaces"]["values"],
        expected_interfaces(5)
    );
    // n5 goes away for a while and comes back: sent again.
    let sent_before =
        f.cv.accepted("NodeConfig")
            .iter()
            .filter(|n| n["key"]["id"] == "n5")
            .count();
    cluster_sh(&["stop-slurmd", "n5"], &[]);
    // Set DOWN at once, as slurmctld does after SlurmdTimeout (30 s here) without an answer,
    // and kept so (the service's discovery ran there just before: see NodeDown).
    let mut down = NodeDown::set("n5", "e2e-stopped");
    // Wait until the service itself saw n5 unavailable (a blip shorter than a poll goes unseen).
    wait_until(
        "the service to see n5 unavailable",
        Duration::from_secs(120),
        || {
            down.keep();
            fs::read_to_string(&f.log_file)
                .unwrap_or_default()
                .contains("node n5: now ")
        },
    );
    cluster_sh(&["start-slurmd", "n5"], &[]);
    wait_until("n5 to be sent again", Duration::from_secs(90), || {
        f.cv.accepted("NodeConfig")
            .iter()
            .filter(|n| n["key"]["id"] == "n5")
            .count()
            > sent_before
    });
    cluster_sh(&["del-node", "n5"], &[]);
    wait_until("n5's DELETE", Duration::from_secs(60), || {
        f.cv.requests()
            .iter()
            .any(|r| r["method"] == "DELETE" && r["query"]["key.id"] == "n5")
    });
    assert!(nodes(f)["n5"].is_null());
    let log = fs::read_to_string(&f.log_file).unwrap();
    assert!(
        log.contains("node n5: appeared; sending NodeConfig"),
        "{log}"
    );
    assert!(
        log.contains("node n5: came back; sending NodeConfig"),
        "{log}"
    );
    assert!(
        log.contains("node n5: left the cluster; deleting its NodeConfig"),
        "{log}"
    );
}

/// `QualifyNodeNames=yes` through a real inventory: every NodeConfig's
/// key is `<node>@<cluster>`, its hostname the node name, and the dry run prints the same
/// keys. The bare keys the service sent stay as they were.
#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn inventory_qualifies_node_keys_with_the_cluster() {
    use cvslurm::cloudvision::{Client, ClientOptions};
    let (f, _g) = exclusive();
    f.cv.set_mode(json!({"mode": "ok"}));
    wait_until(
        "the service's first inventory",
        Duration::from_secs(60),
        || (1..=NODES).all(|i| f.cv.stored_node(&format!("n{i}")).is_some()),
    );
    let conf = Scratch::new("qualify");
    let path = conf.path().join("cv.conf");
    fs::write(
        &path,
        format!(
            "{}QualifyNodeNames=yes\n",
            fs::read_to_string(&f.conf).unwrap()
        ),
    )
    .unwrap();
    let out = Command::new(&f.bin)
        .args(["inventory", "--dry-run", "--config", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    for i in 1..=NODES {
        assert!(
            stdout(&out).contains(&format!("\"id\": \"n{i}@{CLUSTER}\"")),
            "{}",
            stdout(&out)
        );
    }
    let out = Command::new(&f.bin)
        .args(["inventory", "--config", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert_exit_0(&out);
    let client = Client::new(ClientOptions {
        server: f.cv.server(),
        token: cvslurm::config::Token::new(TOKEN),
        ca_file: Some(f.cv.ca()),
        pins: Vec::new(),
        insecure: false,
        timeout: Duration::from_secs(10),
    })
    .unwrap();
    for i in 1..=NODES {
        let id = format!("n{i}@{CLUSTER}");
        let n =
            f.cv.stored_node(&id)
                .unwrap_or_else(|| panic!("no NodeConfig {id}"));
        assert_eq!(n["key"]["id"], id.as_str());
        assert_eq!(n["hostname"], format!("n{i}"));
        assert_eq!(n["location"], CLUSTER);
        assert_eq!(
            n["data_interfaces"]["values"],
            expected_interfaces(i),
            "{id}"
        );
        // The service's own NodeConfig of the node is still there, under its bare name.
        assert!(f.cv.stored_node(&format!("n{i}")).is_some(), "n{i}");
        client.delete_node(&id, None).unwrap();
    }
}

/// The service deletes a node that left the cluster only when CloudVision's record of it is
/// this cluster's: a NodeConfig another cluster (same node name, no
/// QualifyNodeNames) wrote over is asked for (GetOne), found with the other location, and
/// left alone with a warning.
#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn monitor_leaves_a_node_another_cluster_holds_alone() {
    use cvslurm::cloudvision::payload::{Key, NodeConfig};
    use cvslurm::cloudvision::{Client, ClientOptions};
    let (f, _g) = exclusive();
    f.cv.set_mode(json!({"mode": "ok"}));
    let nodes = |f: &Fixture| f.cv.state()["nodes"].clone();
    wait_until(
        "the service's first inventory",
        Duration::from_secs(60),
        || (1..=NODES).all(|i| nodes(f)[format!("n{i}")].is_object()),
    );
    cluster_sh(&["add-node", "n6"], &[]);
    let _cleanup = Restore(&["del-node", "n6"]);
    wait_until("n6's NodeConfig", Duration::from_secs(60), || {
        nodes(f)["n6"].is_object()
    });
    // Another cluster's n6 (its own location) replaces this one's in CloudVision.
    let other = Client::new(ClientOptions {
        server: f.cv.server(),
        token: cvslurm::config::Token::new(TOKEN),
        ca_file: Some(f.cv.ca()),
        pins: Vec::new(),
        insecure: false,
        timeout: Duration::from_secs(10),
    })
    .unwrap();
    other
        .post_node(
            &NodeConfig {
                key: Key { id: "n6".into() },
                location: Some("othercluster".into()),
                hostname: Some("n6".into()),
                data_interfaces: Vec::new().into(),
            },
            None,
        )
        .unwrap();
    cluster_sh(&["del-node", "n6"], &[]);
    wait_until(
        "the service to leave n6 alone",
        Duration::from_secs(60),
        || {
            fs::read_to_string(&f.log_file).unwrap_or_default().contains(
                "node n6: not deleted: the NodeConfig CloudVision holds is cluster \"othercluster\"'s",
            )
        },
    );
    assert_eq!(nodes(f)["n6"]["location"], "othercluster");
    assert!(
        !f.cv
            .requests()
            .iter()
            .any(|r| r["method"] == "DELETE" && r["query"]["key.id"] == "n6"),
        "n6 was deleted"
    );
    assert!(
        f.cv.requests()
            .iter()
            .any(|r| r["method"] == "GET" && r["query"]["key.id"] == "n6"),
        "CloudVision was not asked for n6"
    );
    other.delete_node("n6", None).unwrap();
}

#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn monitor_stops_cleanly_on_sigterm() {
    let (f, _g) = shared();
    let mut child = Command::new(&f.bin)
        .args(["inventory", "--monitor", "--poll-interval", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the monitor stopped by itself"
    );
    let t = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the monitor ignored SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0));
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "stopping took {:?}",
        t.elapsed()
    );
}

/// Makes `node`'s copy of the cvslurm binary a script (a bind mount in the mount namespace of
/// that node's slurmd, which srun's tasks inherit), as a broken install on one worker would
/// be. Undone on drop.
struct BrokenWorker {
    pid: String,
}

impl BrokenWorker {
    fn new(f: &Fixture, node: &str, script: &str) -> BrokenWorker {
        let pid =
            fs::read_to_string(slurm_bin_dir().join(format!("../run/slurmd-{node}.pid.ours")))
                .unwrap()
                .trim()
                .to_string();
        let path = PathBuf::from(WORK).join(format!("broken-{node}.sh"));
        fs::write(&path, format!("#!/bin/sh\n{script}\n")).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        let out = Command::new("nsenter")
            // -r: slurmd's own root (a Slurm root filesystem has its own bind of WORK)
            .args(["-t", &pid, "-m", "-r", "--", "mount", "--bind"])
            .arg(&path)
            .arg(&f.bin)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "bind mount on {node}: {}",
            stderr(&out)
        );
        BrokenWorker { pid }
    }
}

impl Drop for BrokenWorker {
    fn drop(&mut self) {
        let bin = PathBuf::from(WORK).join("cvslurm");
        let _ = Command::new("nsenter")
            .args(["-t", &self.pid, "-m", "-r", "--", "umount", "-l"])
            .arg(bin)
            .output();
    }
}

#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn misbehaving_workers_fail_alone() {
    let (f, _g) = exclusive();
    f.cv.set_mode(json!({"mode": "ok"}));
    let slow = BrokenWorker::new(f, "n1", "sleep 600");
    let garbage = BrokenWorker::new(f, "n2", "echo 'not json'; echo '{\"node_name\":\"n3\"'");
    let flood = BrokenWorker::new(f, "n3", "head -c 100000000 /dev/zero | tr '\\000' x");
    let conf = Scratch::new("broken");
    let path = conf.path().join("cv.conf");
    fs::write(
        &path,
        format!(
            "{}DiscoveryTimeout=15\n",
            fs::read_to_string(&f.conf).unwrap()
        ),
    )
    .unwrap();
    let t = Instant::now();
    let out = Command::new(&f.bin)
        .args(["inventory", "--config", path.to_str().unwrap()])
        .output()
        .unwrap();
    let took = t.elapsed();
    let (text, err) = (stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(1), "{text}\n{err}");
    assert!(
        text.contains("1 sent, 3 failed (n1, n2, n3), 0 unavailable"),
        "{text}\n{err}"
    );
    assert!(
        err.contains(
            "node n1: discovery failed: no discover record within 15 s (DiscoveryTimeout)"
        ),
        "{err}"
    );
    assert!(err.contains("node n2: discovery failed"), "{err}");
    assert!(err.contains("node n3: discovery failed"), "{err}");
    assert!(
        took < Duration::from_secs(60),
        "inventory took {took:?} with a 15 s DiscoveryTimeout"
    );
    // n4 was sent with its own interfaces.
    let n4 = f.cv.state()["nodes"]["n4"].clone();
    assert_eq!(n4["data_interfaces"]["values"], expected_interfaces(4));
    // A worker that prints nothing at all.
    drop((slow, garbage, flood));
    let _silent = BrokenWorker::new(f, "n2", "exit 0");
    let out = Command::new(&f.bin)
        .args(["inventory", "--config", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        stdout(&out).contains("3 sent, 1 failed (n2), 0 unavailable"),
        "{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(
        stderr(&out).contains("node n2: discovery failed: no discover record"),
        "{}",
        stderr(&out)
    );
}

/// A worker whose discover lies about its node name (here n2 claiming to be n3, with made-up
/// interfaces) cannot set another node's NodeConfig: the record is bound to the node srun
/// ran the task on, the lie is dropped and only n2 fails. Nor can a worker claim another
/// node's MAC under its own name: that record is held.
#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn lying_worker_cannot_speak_for_another_node() {
    let (f, _g) = exclusive();
    f.cv.set_mode(json!({"mode": "ok"}));
    let lie = r#"{"node_name":"n3","hostname":"n3","location":"cvtest","interfaces":[{"name":"eth0","mac_address":"de:ad:be:ef:00:03","ip_addresses":["6.6.6.6"]}]}"#;
    let liar = BrokenWorker::new(f, "n2", &format!("echo '{lie}'; echo '{lie}'"));
    let out = Command::new(&f.bin)
        .args(["inventory", "--config", f.conf.to_str().unwrap()])
        .output()
        .unwrap();
    let (text, err) = (stdout(&out), stderr(&out));
    assert!(
        text.contains("3 sent, 1 failed (n2), 0 unavailable"),
        "{text}\n{err}"
    );
    assert!(
        err.contains("the worker on node n2 sent a record for node \"n3\"; dropped"),
        "{err}"
    );
    let n3 = f.cv.state()["nodes"]["n3"].clone();
    assert_eq!(
        n3["data_interfaces"]["values"],
        expected_interfaces(3),
        "{n3}"
    );
    let bodies = f.cv.accepted("NodeConfig");
    assert!(
        !bodies.iter().any(|b| b.to_string().contains("de:ad:be:ef")),
        "the lie reached CloudVision"
    );
    // Under its own name, n1 reports n2's NIC beside its own. n2 reported
    // that MAC first (the plain inventory below keeps every node's record in StateDir), so
    // n1's record is held: a MAC belongs to one node, and n1's jobs never go to n2's port.
    drop(liar);
    let out = Command::new(&f.bin)
        .args(["inventory", "--config", f.conf.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        stdout(&out).contains(&format!("{NODES} sent, 0 failed")),
        "{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    let thief = json!({"node_name": "n1", "hostname": "n1", "location": CLUSTER, "interfaces": [
        {"name": "eth0", "mac_address": "02:99:00:00:01:01", "ip_addresses": ["10.99.0.11"]},
        {"name": "eth1", "mac_address": "02:99:00:00:02:01", "ip_addresses": ["10.99.0.12"]}]});
    let _thief = BrokenWorker::new(f, "n1", &format!("echo '{thief}'"));
    let before = f.cv.accepted("NodeConfig").len();
    let out = Command::new(&f.bin)
        .args(["inventory", "--config", f.conf.to_str().unwrap()])
        .output()
        .unwrap();
    let (text, err) = (stdout(&out), stderr(&out));
    assert!(
        text.contains("3 sent, 1 failed (n1), 0 unavailable"),
        "{text}\n{err}"
    );
    assert!(
        err.contains(
            "node n1: discovery failed: record held: it claims MAC 02:99:00:00:02:01 (eth1), \
             which node n2 reported too"
        ),
        "{err}"
    );
    assert_eq!(
        f.cv.state()["nodes"]["n1"]["data_interfaces"]["values"],
        expected_interfaces(1)
    );
    let n1_bodies: Vec<String> = f.cv.accepted("NodeConfig")[before..]
        .iter()
        .filter(|b| b["key"]["id"] == "n1")
        .map(|b| b.to_string())
        .collect();
    assert!(
        !n1_bodies.iter().any(|b| b.contains("02:99:00:00:02:01")),
        "n2's MAC reached CloudVision in n1's NodeConfig: {n1_bodies:?}"
    );
}

/// `count` more NICs with IPv4 (`ens3f1`… with MAC `02:96:00:00:<i>:<k>` and address
/// `10.96.<i>.<k>`) in node `n<i>`'s network namespace, which its slurmd and so discover see:
/// macvlans on eth0, as cluster.sh makes ens1f0 (the test kernel has no dummy links).
/// Removed on drop.
struct ExtraNics {
    ns: String,
    names: Vec<String>,
}

impl ExtraNics {
    fn add(i: usize, count: usize) -> ExtraNics {
        let ns = format!("cvslurm-n{i}");
        let mut extra = ExtraNics {
            ns: ns.clone(),
            names: Vec::new(),
        };
        for k in 1..=count {
            let name = format!("ens3f{k}");
            let mac = format!("02:96:00:00:{i:02x}:{k:02x}");
            let ip = format!("10.96.{i}.{k}/32");
            extra.names.push(name.clone());
            for args in [
                &[
                    "link", "add", &name, "link", "eth0", "address", &mac, "type", "macvlan",
                    "mode", "bridge",
                ][..],
                &["addr", "add", &ip, "dev", &name],
                &["link", "set", &name, "up"],
            ] {
                let out = Command::new("ip")
                    .args(["-n", &ns])
                    .args(args)
                    .output()
                    .unwrap();
                assert!(out.status.success(), "ip {args:?}: {}", stderr(&out));
            }
        }
        extra
    }
}

impl Drop for ExtraNics {
    fn drop(&mut self) {
        for name in &self.names {
            let _ = Command::new("ip")
                .args(["-n", &self.ns, "link", "del", name])
                .output();
        }
    }
}

/// A node with 18 NICs: its plain record (no topology, JobInterfaces=nodes)
/// is over 1 KiB, which slurmstepd forwards in 1024-byte pieces that `srun --label` ends with a
/// newline each; discover sends it as parts and the inventory puts it back together.
#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn node_with_many_nics_is_discovered() {
    let (f, _g) = exclusive();
    f.cv.set_mode(json!({"mode": "ok"}));
    let nics = ExtraNics::add(1, 16);
    let out = Command::new(&f.bin)
        .args(["inventory", "--config", f.conf.to_str().unwrap()])
        .output()
        .unwrap();
    let (text, err) = (stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(0), "{text}\n{err}");
    assert!(
        text.contains(&format!("{NODES} sent, 0 failed, 0 unavailable")),
        "{text}\n{err}"
    );
    let n1 = f.cv.state()["nodes"]["n1"].clone();
    let got = n1["data_interfaces"]["values"].as_array().unwrap().clone();
    assert_eq!(got.len(), 18, "{n1}");
    for k in 1..=16 {
        let name = format!("ens3f{k}");
        let nic = got.iter().find(|v| v["name"] == name.as_str());
        assert_eq!(
            nic,
            Some(
                &json!({"name": name, "mac_address": format!("02:96:00:00:01:{k:02x}"),
                         "ip_addresses": {"values": [format!("10.96.1.{k}")]}})
            ),
            "{n1}"
        );
    }
    assert!(serde_json::to_string(&n1).unwrap().len() > 1024);
    // Put n1's NodeConfig (and its record in StateDir) back as the other tests expect it.
    drop(nics);
    let out = Command::new(&f.bin)
        .args(["inventory", "--config", f.conf.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        f.cv.state()["nodes"]["n1"]["data_interfaces"]["values"],
        expected_interfaces(1)
    );
}

/// Every CPU of every node allocated (one exclusive job on all nodes): discovery does not
/// wait for resources (a new srun would pend until DiscoveryTimeout); it runs as an
/// overlapping step inside the job that holds the nodes, a job of the inventory's own user
/// (root here: its StateDir is its own). A node held by another user's job is not discovered.
#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn discovery_reaches_fully_allocated_nodes() {
    // Every node is taken below: the fixture's time-limit job (n1, ended by Slurm at most
    // 90 s after the cluster came up) is waited out first, holding no lock, so the other
    // tests run meanwhile.
    let time_limit_job = &fixture().time_limit_job;
    wait_until(
        "the time-limit job to leave n1",
        Duration::from_secs(300),
        || {
            stdout(&slurm("squeue", &["-h", "-j", time_limit_job]))
                .trim()
                .is_empty()
        },
    );
    let (f, _g) = exclusive();
    f.cv.set_mode(json!({"mode": "ok"}));
    let all = format!("n[1-{NODES}]");
    let job = sbatch(&[
        "--exclusive",
        "-w",
        &all,
        "-N",
        &NODES.to_string(),
        "--wrap",
        "sleep 300",
    ]);
    struct Cancel(String);
    impl Drop for Cancel {
        fn drop(&mut self) {
            let _ = slurm("scancel", &[&self.0]);
        }
    }
    let _cancel = Cancel(job.clone());
    // The job itself running (it can wait behind the service's own discovery job, which
    // holds a CPU of every node for a moment at start), then every node allocated.
    wait_until(
        "the whole-cluster job to run",
        Duration::from_secs(60),
        || stdout(&slurm("squeue", &["-h", "-j", &job, "-o", "%T"])).trim() == "RUNNING",
    );
    wait_until("every node allocated", Duration::from_secs(30), || {
        (1..=NODES).all(|i| node_state(&format!("n{i}")) == "allocated")
    });
    let conf = Scratch::new("busy");
    let path = conf.path().join("cv.conf");
    fs::write(
        &path,
        format!(
            "{}DiscoveryTimeout=20\nStateDir={}\n",
            fs::read_to_string(&f.conf).unwrap(),
            conf.path().join("state").display()
        ),
    )
    .unwrap();
    let t = Instant::now();
    let out = Command::new(&f.bin)
        .args(["inventory", "--config", path.to_str().unwrap()])
        .output()
        .unwrap();
    let (text, err) = (stdout(&out), stderr(&out));
    assert!(
        text.contains(&format!("{NODES} sent, 0 failed, 0 unavailable")),
        "{text}\n{err}"
    );
    assert!(
        err.contains(&format!(
            "discovery: {NODES} node(s) fully allocated (n[1-{NODES}]); reached through job {job} (n[1-{NODES}])"
        )),
        "{err}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "took {:?}",
        t.elapsed()
    );
    for i in 1..=NODES {
        let n = f.cv.state()["nodes"][format!("n{i}")].clone();
        assert_eq!(
            n["data_interfaces"]["values"],
            expected_interfaces(i),
            "{n}"
        );
    }
    // n4 held by another user's job: a step there would run as that user,
    // who could write into its output and forge n4's record, and Slurm refuses root's step in
    // it anyway. n4 fails at once, naming the job, without an srun; the others are sent.
    drop(_cancel);
    wait_until(
        "the whole-cluster job to end",
        Duration::from_secs(60),
        || {
            stdout(&slurm("squeue", &["-h", "-j", &job]))
                .trim()
                .is_empty()
        },
    );
    let out = as_nobody(
        Path::new("sbatch"),
        &[
            "--parsable",
            "-o",
            "/dev/null",
            "-e",
            "/dev/null",
            "--exclusive",
            "-w",
            "n4",
            "--wrap",
            "sleep 300",
        ],
    );
    assert!(out.status.success(), "sbatch as nobody: {}", stderr(&out));
    let theirs = stdout(&out).trim().split(';').next().unwrap().to_string();
    let _cancel = Cancel(theirs.clone());
    wait_until("nobody's job on n4 to run", Duration::from_secs(60), || {
        stdout(&slurm("squeue", &["-h", "-j", &theirs, "-o", "%T"])).trim() == "RUNNING"
    });
    wait_until("n4 allocated", Duration::from_secs(30), || {
        node_state("n4") == "allocated"
    });
    let t = Instant::now();
    let out = Command::new(&f.bin)
        .args(["inventory", "--config", path.to_str().unwrap()])
        .output()
        .unwrap();
    let (text, err) = (stdout(&out), stderr(&out));
    assert!(
        text.contains(&format!("{} sent, 1 failed (n4), 0 unavailable", NODES - 1)),
        "{text}\n{err}"
    );
    assert!(
        err.contains(&format!(
            "node n4: discovery failed: fully allocated by job {theirs} of another user (uid \
             65534): discovery runs no step in another user's job"
        )),
        "{err}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "took {:?}",
        t.elapsed()
    );
    // With WorkerRecords=yes, n4 is taken from the record it published itself: slurmd runs
    // cvslurm-publish (the fixture's HealthCheckProgram) at its start, before it registers.
    workers_publish_their_own_records(f, &path);
}

/// The record a node publishes (slurmd's HealthCheckProgram `cvslurm-publish`, into its Slurm
/// `Extra` field) stands in for discovery on a node held by another user's job
/// (`WorkerRecords=yes`), and follows a new MAC after slurmd restarts there; a site's own
/// `Extra` is never overwritten. n4 is held by nobody's job throughout.
fn workers_publish_their_own_records(f: &Fixture, conf: &Path) {
    let path = conf.with_file_name("cv-workers.conf");
    fs::write(
        &path,
        format!("{}WorkerRecords=yes\n", fs::read_to_string(conf).unwrap()),
    )
    .unwrap();
    let inventory = || {
        let out = Command::new(&f.bin)
            .args(["inventory", "--config", path.to_str().unwrap()])
            .output()
            .unwrap();
        (stdout(&out), stderr(&out))
    };
    let extra = || -> Option<String> {
        stdout(&slurm("scontrol", &["show", "node", "-o", "n4"]))
            .split_whitespace()
            .find_map(|w| w.strip_prefix("Extra=").map(String::from))
    };
    let (text, err) = inventory();
    assert!(
        text.contains(&format!("{NODES} sent, 0 failed, 0 unavailable")),
        "{text}\n{err}"
    );
    assert!(
        err.contains("node n4: taken from the record it published (taken "),
        "{err}"
    );
    assert_eq!(
        f.cv.state()["nodes"]["n4"]["data_interfaces"]["values"],
        expected_interfaces(4)
    );
    // `check` counts the nodes that published, from slurm.conf's health check.
    let out = Command::new(&f.bin)
        .args(["check", "--config", path.to_str().unwrap()])
        .output()
        .unwrap();
    let want = format!(
        "ok   WorkerRecords=yes: {NODES} of {NODES} node(s) published a record \
         (HealthCheckProgram={WORK}/cvslurm-publish, every 3600 s)"
    );
    assert!(stdout(&out).contains(&want), "{}", stdout(&out));
    // A site's own Extra: publish leaves it, and inventory says why n4 is not taken.
    let ours = extra().expect("n4 published its record");
    assert!(ours.starts_with("cvslurm1:"), "{ours}");
    slurm("scontrol", &["update", "NodeName=n4", "Extra=rack=4"]);
    let out = Command::new(&f.bin)
        .args(["publish", "--foreground", "--node-name", "n4"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(
            "node n4: its Extra field holds the site's own data (rack=4); not overwritten"
        ),
        "{}",
        stderr(&out)
    );
    assert_eq!(extra().as_deref(), Some("rack=4"));
    let (text, err) = inventory();
    assert!(text.contains("1 failed (n4)"), "{text}\n{err}");
    assert!(
        err.contains("its Extra field holds something other than a cvslurm record"),
        "{err}"
    );
    // A new MAC and slurmd restarted under the job: the record it publishes at its start
    // carries the new MAC, and inventory sends it.
    let put_back = N4MacBack;
    slurm("scontrol", &["update", "NodeName=n4", "Extra="]);
    set_n4_mac("02:96:00:00:04:02");
    let start = restart_slurmd("n4");
    wait_until(
        "n4 to publish a record taken after its slurmd started",
        Duration::from_secs(30),
        || {
            extra()
                .and_then(|x| cvslurm::internals::discovery::published::decode(&x).ok())
                .is_some_and(|r| r.taken_at.is_some_and(|t| t > start))
        },
    );
    let (text, err) = inventory();
    assert!(
        text.contains(&format!("{NODES} sent, 0 failed, 0 unavailable")),
        "{text}\n{err}"
    );
    let mac = f.cv.state()["nodes"]["n4"]["data_interfaces"]["values"]
        .as_array()
        .and_then(|v| v.iter().find(|i| i["name"] == "ens1f0").cloned())
        .map(|i| i["mac_address"].clone());
    assert_eq!(mac, Some(json!("02:96:00:00:04:02")));
    drop(put_back);
}

/// Gives n4's data NIC (ens1f0) another MAC.
fn set_n4_mac(mac: &str) {
    let out = Command::new("ip")
        .args(["-n", "cvslurm-n4", "link", "set", "ens1f0", "address", mac])
        .output()
        .unwrap();
    assert!(out.status.success(), "ip link set: {}", stderr(&out));
}

/// On drop, even when a test fails: n4's data NIC gets its MAC back, its `Extra` is cleared
/// and its slurmd starts again (publishing its record anew: the fixture's HealthCheckProgram).
struct N4MacBack;
impl Drop for N4MacBack {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["-n", "cvslurm-n4", "link", "set", "ens1f0", "address"])
            .arg("02:99:00:00:04:02")
            .output();
        let _ = slurm("scontrol", &["update", "NodeName=n4", "Extra="]);
        for c in ["stop-slurmd", "start-slurmd"] {
            let _ = Command::new(repo().join("tests/cluster/cluster.sh"))
                .args([c, "n4"])
                .output();
        }
    }
}

/// Runs `prog args` as `nobody`, a user who is no operator, with the PATH of this test (the
/// cluster's Slurm first), in `/`. Where the cluster's Slurm runs in a root filesystem (its
/// commands are chroot wrappers), the user is switched inside it.
fn as_nobody(prog: &Path, args: &[&str]) -> Output {
    let path = std::env::var("PATH").unwrap_or_default();
    let sinfo = std::env::split_paths(&path)
        .map(|d| d.join("sinfo"))
        .find(|p| p.is_file());
    let rootfs = sinfo
        .and_then(|p| fs::read(p).ok())
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .and_then(|t| {
            // The wrapper's comment names its root: "# Slurm 24.11: sinfo from /var/cache/…".
            let rest = t.lines().nth(1)?.split(": sinfo from ").nth(1)?;
            rest.split_whitespace().next().map(String::from)
        });
    let mut c = match &rootfs {
        Some(r) => {
            let mut c = Command::new("chroot");
            c.arg(r).arg("runuser");
            c
        }
        None => Command::new("runuser"),
    };
    c.args(["-u", "nobody", "--", "env"])
        .arg(format!("PATH={path}:/usr/bin:/bin"))
        .arg(prog)
        .args(args)
        .current_dir("/")
        .output()
        .unwrap()
}

/// `cvslurm check` names the Slurm release and how it is read.
#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn check_names_the_slurm_release() {
    let (f, _g) = shared();
    let out = Command::new(&f.bin).arg("check").output().unwrap();
    let text = stdout(&out);
    let (major, minor) = slurm_version();
    let line = text
        .lines()
        .find(|l| l.contains(&format!("Slurm {major}.{minor:02}.")))
        .unwrap_or_else(|| panic!("no Slurm version line:\n{text}"));
    assert!(line.starts_with("ok"), "{line}");
    assert!(line.contains("--json"), "{line}");
}

/// Hidden partitions (Hidden=YES) are inventoried: `sinfo` without `--all` shows them only to
/// operators, so an inventory run by another user missed their nodes (and the service would
/// delete their NodeConfigs when a partition was hidden).
#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn hidden_partition_nodes_are_inventoried() {
    let (f, _g) = exclusive();
    f.cv.set_mode(json!({"mode": "ok"}));
    struct Unhide;
    impl Drop for Unhide {
        fn drop(&mut self) {
            let _ = slurm("scontrol", &["update", "partitionname=gpu", "hidden=no"]);
            let _ = slurm("scontrol", &["update", "partitionname=debug", "nodes=ALL"]);
        }
    }
    let _unhide = Unhide;
    // n3 and n4 are then only in the hidden partition gpu.
    let ok = |o: Output| assert!(o.status.success(), "{}", stderr(&o));
    ok(slurm(
        "scontrol",
        &["update", "partitionname=debug", "nodes=n1,n2"],
    ));
    ok(slurm(
        "scontrol",
        &["update", "partitionname=gpu", "hidden=yes"],
    ));
    let plain = as_nobody(Path::new("sinfo"), &["-h", "-N", "-o", "%N"]);
    assert!(
        plain.status.success() && !stdout(&plain).contains("n3"),
        "sinfo shows hidden nodes to users, the test would prove nothing: {}{}",
        stdout(&plain),
        stderr(&plain)
    );
    let deletes_before =
        f.cv.requests()
            .iter()
            .filter(|r| r["method"] == "DELETE")
            .count();
    let out = as_nobody(
        &f.bin,
        &[
            "inventory",
            "--dry-run",
            "--config",
            f.conf.to_str().unwrap(),
        ],
    );
    let text = stdout(&out);
    assert!(
        text.contains(&format!("{NODES} would send, 0 failed")),
        "{text}\n{}",
        stderr(&out)
    );
    // The service (a poll every 2 s) deletes nothing while the partition is hidden.
    std::thread::sleep(Duration::from_secs(5));
    let deletes =
        f.cv.requests()
            .iter()
            .filter(|r| r["method"] == "DELETE")
            .count();
    assert_eq!(
        deletes, deletes_before,
        "a hidden partition's nodes were deleted"
    );
}

/// A node whose NIC changes and whose slurmd restarts (as after a reboot or a NIC swap):
/// the service sees SlurmdStartTime move past the node's record at its next poll,
/// discovers the node again and sends its new MAC. Without that, a node that never looked
/// unavailable to a poll kept its old NodeConfig until NodeReassertInterval. n4's data NIC
/// (ens1f0, a macvlan) gets another MAC in its namespace; put back, with another restart, at
/// the end. The cluster to itself: n4's restarts can hold the service's loop (a discovery
/// srun) while other tests wait on it.
#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn node_config_follows_a_new_mac_after_a_slurmd_restart() {
    let (f, _g) = exclusive();
    let mac_of = |f: &Fixture| {
        f.cv.state()["nodes"]["n4"]["data_interfaces"]["values"]
            .as_array()
            .and_then(|v| v.iter().find(|i| i["name"] == "ens1f0").cloned())
            .map(|i| i["mac_address"].as_str().unwrap_or("").to_string())
    };
    let (old, new) = ("02:99:00:00:04:02", "02:97:00:00:04:02");
    // The service (this pid: an exclusive test may have restarted it just before) has sent n4
    // and holds a fresh record of it, so that only the restart below makes it discover n4
    // again: not its first poll, nor a record from the second the cluster came up in.
    let service = format!(
        "cvslurm[{}]",
        f.service.lock().unwrap_or_else(|e| e.into_inner()).id()
    );
    wait_until(
        "the service's fresh record of n4",
        Duration::from_secs(60),
        || {
            let sent = fs::read_to_string(&f.log_file)
                .unwrap_or_default()
                .lines()
                .any(|l| {
                    l.contains(&service)
                        && l.contains("node n4: ")
                        && l.contains("sending NodeConfig")
                });
            let rec: Value = fs::read(f.state_dir.join(layout::NODES).join("n4.json"))
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())
                .unwrap_or(Value::Null);
            let fresh = rec["taken_at"]
                .as_i64()
                .zip(slurmd_start("n4"))
                .is_some_and(|(t, s)| t > s);
            sent && fresh && mac_of(f).as_deref() == Some(old)
        },
    );
    // What the service logs from here.
    let log_from = fs::read_to_string(&f.log_file).unwrap_or_default().len();
    let put_back = N4MacBack;
    set_n4_mac(new);
    cluster_sh(&["stop-slurmd", "n4"], &[]);
    cluster_sh(&["start-slurmd", "n4"], &[]);
    // The service's own lines from here (a shared test runs a monitor of its own, with the
    // same LogFile, StateDir and CloudVision, which may send n4 too).
    let service_log = || -> String {
        fs::read_to_string(&f.log_file).unwrap_or_default()[log_from..]
            .lines()
            .filter(|l| l.contains(&service))
            .map(|l| format!("{l}\n"))
            .collect()
    };
    // Sent again as restarted; or, had a ping of slurmctld caught the stopped slurmd (`idle*`
    // for a poll), as come back: either way discovered again, not left alone.
    let rediscovered = |log: &str| {
        log.contains("node n4: discovered again after its slurmd started; sending NodeConfig")
            || log.contains("node n4: came back; sending NodeConfig")
    };
    wait_until(
        "the service to send n4 again, with its new MAC",
        Duration::from_secs(60),
        || rediscovered(&service_log()) && mac_of(f).as_deref() == Some(new),
    );
    let log = service_log();
    assert!(
        log.contains("node n4: its record (taken ")
            && log.contains("is not from after its slurmd started"),
        "{log}"
    );
    // Put back as the other tests expect it, followed the same way.
    drop(put_back);
    wait_until(
        "n4's NodeConfig with its old MAC",
        Duration::from_secs(60),
        || mac_of(f).as_deref() == Some(old),
    );
    assert_eq!(
        f.cv.state()["nodes"]["n4"]["data_interfaces"]["values"],
        expected_interfaces(4)
    );
}
