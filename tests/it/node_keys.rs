//! Node names as CloudVision sees them, through the binary against the stand-in:
//! `QualifyNodeNames` qualifies a job's `nodes` and a NodeConfig's key with
//! the cluster, consistently, and a delete never touches a node another cluster holds.
//!
//! The NodeConfig events here are written into the outbox as the service's monitor queues
//! them (its polls need a Slurm cluster: tests/e2e/inventory.rs), and `cvslurm flush` sends them with
//! the service's engine.

use crate::common::*;
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
        let site = Site::with_standin(&cv, extra);
        let (out, _) = site.hook(&job_env("prolog_slurmctld", "77", &[]));
        assert_eq!(out.status.code(), Some(0));
        queue_node_event(&site, "n1", node_event("n1"));
        let (summary, log) = flush(&site);
        assert_eq!(summary.trim(), "outbox: 1 delivered, 0 kept, 0 rejected");
        let job = cv.stored_job(&format!("77@{CLUSTER}")).unwrap();
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
        let node = cv
            .stored_node(&key)
            .unwrap_or_else(|| panic!("{extra:?}: no NodeConfig {key}: {}", cv.state()));
        assert_eq!(node["key"]["id"], key.as_str());
        assert_eq!(node["hostname"], "n1");
        assert_eq!(node["location"], CLUSTER);
        let other = if qualified {
            "n1"
        } else {
            "n1@hpc-cluster-west"
        };
        assert!(cv.stored_node(other).is_none(), "{extra:?}");
        // Inside, names stay bare: the log names the node as the outbox does.
        assert!(log.contains("delivered node n1 "), "{log}");
    }
}

/// A client of the stand-in, standing for whoever else writes to CloudVision.
fn other_client(cv: &Standin) -> cvslurm::cloudvision::Client {
    use cvslurm::cloudvision::{Client, ClientOptions};
    Client::new(ClientOptions {
        server: cv.server(),
        token: cvslurm::config::Token::new(TOKEN),
        ca_file: Some(cv.ca()),
        pins: Vec::new(),
        insecure: false,
        timeout: std::time::Duration::from_secs(10),
    })
    .unwrap()
}

/// Stores NodeConfig `id` with `location` in the stand-in, as another writer would.
fn seed_node(cv: &Standin, id: &str, location: &str) {
    use cvslurm::cloudvision::payload::{Key, NodeConfig};
    other_client(cv)
        .post_node(
            &NodeConfig {
                key: Key { id: id.into() },
                location: Some(location.into()),
                hostname: Some(id.into()),
                data_interfaces: Vec::new().into(),
            },
            None,
        )
        .unwrap();
}

/// The delete the monitor queues for node `node` of this cluster when it leaves.
fn delete_event(node: &str) -> Value {
    json!({"kind": "node_delete", "name": node, "location": CLUSTER})
}

fn deletes_of(cv: &Standin, id: &str) -> usize {
    cv.requests()
        .iter()
        .filter(|r| r["method"] == "DELETE" && r["query"]["key.id"] == id)
        .count()
}

/// A delete asks CloudVision first (GetOne): a node stored with another cluster's location
/// (two clusters sharing a node name) is left alone with a warning; one with this
/// cluster's is deleted; one CloudVision does not have needs nothing; while the question
/// fails (503) the delete waits in the outbox, and goes once CloudVision answers.
#[test]
fn a_delete_leaves_another_clusters_node_alone_and_waits_while_cloudvision_cannot_say() {
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "");
    seed_node(&cv, "n1", "othercluster");
    seed_node(&cv, "n2", CLUSTER);
    for n in ["n1", "n2", "n3"] {
        queue_node_event(&site, n, delete_event(n));
    }
    let (summary, log) = flush(&site);
    assert_eq!(summary.trim(), "outbox: 3 delivered, 0 kept, 0 rejected");
    assert_eq!(cv.stored_node("n1").unwrap()["location"], "othercluster");
    assert!(cv.stored_node("n2").is_none());
    assert_eq!(deletes_of(&cv, "n1"), 0);
    assert_eq!(deletes_of(&cv, "n2"), 1);
    assert_eq!(deletes_of(&cv, "n3"), 0, "n3 was never there");
    assert!(
        log.contains(
            "node n1: not deleted: the NodeConfig CloudVision holds is cluster \"othercluster\"'s, \
             not cluster hpc-cluster-west's"
        ),
        "{log}"
    );
    // CloudVision cannot say whose n4 is: the delete waits, and goes when it can.
    seed_node(&cv, "n4", CLUSTER);
    queue_node_event(&site, "n4", delete_event("n4"));
    cv.set_mode(json!({"mode": "status", "status": 503}));
    let out = site.run(&["flush"]);
    assert_eq!(
        stdout(&out).trim(),
        "outbox: 0 delivered, 1 kept, 0 rejected (last error: CloudVision failed: HTTP 503: \
         unavailable: service unavailable)",
        "{}",
        stderr(&out)
    );
    assert_eq!(deletes_of(&cv, "n4"), 0);
    assert_eq!(site.outbox().len(), 1);
    cv.set_mode(json!({"mode": "ok"}));
    assert!(cv.stored_node("n4").is_some());
    let (summary, _) = flush(&site);
    assert_eq!(summary.trim(), "outbox: 1 delivered, 0 kept, 0 rejected");
    assert!(cv.stored_node("n4").is_none());
    assert!(site.outbox().is_empty());
}

/// With `QualifyNodeNames=yes` the delete asks for and deletes `<node>@<cluster>`, and never
/// the bare name another cluster may hold.
#[test]
fn a_qualified_delete_names_the_qualified_key() {
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "QualifyNodeNames=yes");
    let id = format!("n1@{CLUSTER}");
    seed_node(&cv, &id, CLUSTER);
    seed_node(&cv, "n1", "othercluster");
    queue_node_event(&site, "n1", delete_event("n1"));
    let (summary, log) = flush(&site);
    assert_eq!(
        summary.trim(),
        "outbox: 1 delivered, 0 kept, 0 rejected",
        "{log}"
    );
    assert!(cv.stored_node(&id).is_none());
    assert_eq!(cv.stored_node("n1").unwrap()["location"], "othercluster");
    assert_eq!(deletes_of(&cv, &id), 1);
    assert_eq!(deletes_of(&cv, "n1"), 0);
}

/// Against Arista's own fake CloudVision, which answers every GET with a plain 404 (not
/// CloudVision's not-found): the delete of a node that left cannot check the location, so it
/// is sent all the same, and the log says which requests were made and what came back. Against
/// CloudVision, a node it does not hold gets no DELETE, and the log says so (before: a 404
/// of any kind read as "gone", logged as `delivered delete node n2 (HTTP 404)`).
#[test]
fn a_delete_says_which_requests_it_made_against_either_profile() {
    for profile in PROFILES {
        let cv = Standin::start_profile(profile);
        let site = Site::with_standin(&cv, "");
        queue_node_event(&site, "n2", node_event("n2"));
        let (summary, _) = flush(&site);
        assert_eq!(summary.trim(), "outbox: 1 delivered, 0 kept, 0 rejected");
        assert!(cv.stored_node("n2").is_some(), "{profile}");
        queue_node_event(&site, "n2", delete_event("n2"));
        queue_node_event(&site, "n3", delete_event("n3"));
        let (summary, log) = flush(&site);
        assert_eq!(
            summary.trim(),
            "outbox: 2 delivered, 0 kept, 0 rejected",
            "{log}"
        );
        assert!(cv.stored_node("n2").is_none(), "{profile}");
        let gets = |id: &str| {
            cv.requests()
                .iter()
                .filter(|r| r["method"] == "GET" && r["query"]["key.id"] == id)
                .count()
        };
        assert_eq!((gets("n2"), gets("n3")), (1, 1), "{profile}");
        assert_eq!(deletes_of(&cv, "n2"), 1, "{profile}");
        if profile == "arista" {
            assert_eq!(deletes_of(&cv, "n3"), 1, "{profile}");
            for n in ["n2", "n3"] {
                let line = format!(
                    "outbox: delete node {n}: GET (its location) answered HTTP 404 \
                     \"{{\\\"errors\\\":[\\\"GET not supported by CV stub\\\"]}}\", not as \
                     CloudVision; DELETE answered HTTP 200 ("
                );
                assert!(log.contains(&line), "{line}\n{log}");
            }
        } else {
            assert_eq!(deletes_of(&cv, "n3"), 0, "{profile}");
            assert!(
                log.contains(
                    "outbox: delete node n2: GET answered HTTP 200 (cluster hpc-cluster-west's); \
                     DELETE answered HTTP 200 ("
                ),
                "{log}"
            );
            assert!(
                log.contains(
                    "outbox: delete node n3: GET answered CloudVision's not-found: it holds no \
                     NodeConfig of it; no DELETE sent ("
                ),
                "{log}"
            );
        }
        assert!(!log.contains("delivered delete node"), "{log}");
    }
}
