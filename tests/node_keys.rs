//! Node names as CloudVision sees them, through the binary against the stand-in (issue 18,
//! points 4 and 5): `QualifyNodeNames` qualifies a job's `nodes` and a NodeConfig's key with
//! the cluster, consistently, and a delete never touches a node another cluster holds.
//!
//! The NodeConfig events here are written into the outbox as the service's monitor queues
//! them (its polls need a Slurm cluster: tests/e2e.rs), and `cvslurm flush` sends them with
//! the service's engine.

mod common;
use common::*;
use cvslurm::internals::state::layout;
use serde_json::{json, Value};
use std::fs;
use std::time::{SystemTime, UNIX_EPOCH};

const CLUSTER: &str = "hpc-cluster-west";

/// Writes one outbox event for `item` (the `kind`-tagged fields of an outbox item) under the
/// file name the outbox gives node `node`'s key, as the monitor's `queue` writes it.
fn queue_node_event(site: &Site, node: &str, item: Value) {
    let dir = site.state_dir.join(layout::OUTBOX);
    fs::create_dir_all(&dir).unwrap();
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let mut ev = json!({
        "v": 1,
        "seq": now.as_nanos() as u64,
        "rank": [0, 0],
        "queued_at": now.as_secs(),
        "attempts": 0,
    });
    for (k, v) in item.as_object().unwrap() {
        ev[k] = v.clone();
    }
    fs::write(
        dir.join(format!("node.{node}.json")),
        serde_json::to_vec(&ev).unwrap(),
    )
    .unwrap();
}

/// The NodeConfig event of node `node` of this cluster, as the monitor queues it.
fn node_event(node: &str) -> Value {
    json!({"kind": "node", "node": {
        "key": {"id": node}, "location": CLUSTER, "hostname": node,
        "data_interfaces": {"values": [{"name": "eth0", "mac_address": "02:99:00:00:01:01",
            "ip_addresses": {"values": ["10.99.0.11"]}}]}}})
}

/// Runs `cvslurm flush`: (its summary, its log lines).
fn flush(site: &Site) -> (String, String) {
    let out = site.run(&["flush"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    (stdout(&out), stderr(&out))
}

/// `QualifyNodeNames=yes`: the hook's JobConfig names `<node>@<cluster>`, the NodeConfig's key
/// is `<node>@<cluster>` (its hostname stays the node name), and the default sends the bare
/// names (the reference's bytes).
#[test]
fn qualified_node_names_in_jobs_and_node_keys_and_bare_by_default() {
    let cv = Standin::start();
    for (extra, qualified) in [("QualifyNodeNames=yes", true), ("", false)] {
        cv.reset();
        let site = Site::new(&cv.server(), &cv.ca(), extra);
        let (out, _) = site.hook(&job_env("prolog_slurmctld", "77", &[]));
        assert_eq!(out.status.code(), Some(0));
        queue_node_event(&site, "n1", node_event("n1"));
        let (summary, log) = flush(&site);
        assert_eq!(summary.trim(), "outbox: 1 delivered, 0 kept, 0 rejected");
        let state = cv.state();
        let job = &state["jobs"][format!("77@{CLUSTER}")];
        let want: Vec<String> = (1..=4)
            .map(|i| match qualified {
                true => format!("gpu-node-{i}@{CLUSTER}"),
                false => format!("gpu-node-{i}"),
            })
            .collect();
        assert_eq!(job["nodes"]["values"], json!(want), "{extra:?}: {job}");
        assert_eq!(job["location"], CLUSTER);
        let key = if qualified {
            format!("n1@{CLUSTER}")
        } else {
            "n1".to_string()
        };
        let node = &state["nodes"][&key];
        assert_eq!(node["key"]["id"], key.as_str(), "{extra:?}: {state}");
        assert_eq!(node["hostname"], "n1");
        assert_eq!(node["location"], CLUSTER);
        let other = if qualified {
            "n1"
        } else {
            "n1@hpc-cluster-west"
        };
        assert!(state["nodes"][other].is_null(), "{extra:?}: {state}");
        // Inside, names stay bare: the log names the node as the outbox does.
        assert!(log.contains("delivered node n1 "), "{log}");
    }
}
