//! The binary's command line: modes, argv[0] dispatch, send, discover, status, errors.

use crate::common::*;
use serde_json::json;
use std::process::Command;

#[test]
fn version_and_help() {
    let out = Command::new(bin()).arg("--version").output().unwrap();
    assert_eq!(
        stdout(&out),
        format!("cvslurm {}\n", env!("CARGO_PKG_VERSION"))
    );
    for args in [
        &["help"][..],
        &["--help"],
        &["send", "--help"],
        &["inventory", "help"],
        &["discover", "-h"],
        &["flush", "--help"],
        &["status", "--help"],
        &["hook", "--help"],
    ] {
        let out = Command::new(bin()).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        assert!(
            stdout(&out).starts_with("Usage: cvslurm"),
            "{args:?}: {}",
            stdout(&out)
        );
    }
    let out = Command::new(bin()).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("no mode given"));
    let out = Command::new(bin()).arg("frobnicate").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn argv0_selects_the_mode() {
    let site = Site::offline("");
    for (name, mode_help) in [
        ("cvslurm-send", "Usage: cvslurm send"),
        ("cv-job-send.py", "Usage: cvslurm send"),
        ("cvslurm-inventory", "Usage: cvslurm inventory"),
        ("cv-node-inventory", "Usage: cvslurm inventory"),
        ("cv-node-inventory.py", "Usage: cvslurm inventory"),
        ("cvslurm-discover", "Usage: cvslurm discover"),
        ("interface_discovery.py", "Usage: cvslurm discover"),
        ("interface_discovery", "Usage: cvslurm discover"),
    ] {
        let out = Command::new(site.link(name))
            .arg("--help")
            .output()
            .unwrap();
        assert!(
            stdout(&out).starts_with(mode_help),
            "{name}: {}",
            stdout(&out)
        );
    }
    // An unknown argv[0] means the first argument is the mode.
    let out = Command::new(site.link("whatever"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(stdout(&out).starts_with("cvslurm "));
}

fn fake_sysfs(dir: &std::path::Path) -> std::path::PathBuf {
    let net = dir.join("net");
    for (name, mac, physical) in [
        ("ens99", "02:AA:00:00:00:01", true),
        ("lo", "00:00:00:00:00:00", false),
        ("veth0", "02:aa:00:00:00:09", false),
    ] {
        let d = net.join(name);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("address"), format!("{mac}\n")).unwrap();
        if physical {
            std::fs::create_dir_all(d.join("device")).unwrap();
        }
    }
    net
}

#[test]
fn discover_prints_one_json_line() {
    let s = Scratch::new("disc");
    let net = fake_sysfs(s.path());
    // Interfaces without an IPv4 address on this host: ask not to require one.
    let out = Command::new(bin())
        .args([
            "discover",
            "--sys-class-net",
            net.to_str().unwrap(),
            "--require-ip",
            "no",
            "--interface-regex",
            "^(ens|veth)",
        ])
        .env("SLURMD_NODENAME", "n7")
        .env("SLURM_CLUSTER_NAME", "c1")
        .output()
        .unwrap();
    assert_exit_0(&out);
    let text = stdout(&out);
    // One record, on a line of its own (led by a newline so no other output can swallow it).
    assert!(text.starts_with('\n') && text.ends_with('\n'), "{text:?}");
    assert_eq!(text.lines().filter(|l| !l.is_empty()).count(), 1);
    let v: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(v["node_name"], "n7");
    assert_eq!(v["location"], "c1");
    assert_eq!(
        v["interfaces"],
        json!([{"name":"ens99","mac_address":"02:aa:00:00:00:01","ip_addresses":[]}])
    );
    // Without SLURMD_NODENAME: a clear error, nothing on stdout.
    let out = Command::new(bin())
        .args(["discover"])
        .env_remove("SLURMD_NODENAME")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    assert!(stderr(&out)
        .contains("SLURMD_NODENAME is not set: run discover through srun, or give --node-name"));
    let out = Command::new(bin())
        .args(["discover", "--physical-only", "perhaps"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--physical-only: \"perhaps\" is not yes or no"));
}

/// What srun prints for task `task`'s output `out` with `--label`: slurmstepd forwards the
/// output in messages of at most 1024 bytes, each cut after its last newline (a line longer
/// than that is cut where the message is full), and srun prefixes every line of a message
/// with the label, ending a message's partial line with a newline.
fn srun_labelled(task: usize, out: &[u8]) -> Vec<String> {
    const MAX_MSG: usize = 1024;
    let mut lines = Vec::new();
    let mut rest = out;
    while !rest.is_empty() {
        let window = &rest[..rest.len().min(MAX_MSG)];
        let cut = match window.iter().rposition(|&b| b == b'\n') {
            Some(i) => i + 1,
            None => window.len(),
        };
        let msg = String::from_utf8_lossy(&rest[..cut]);
        for l in msg.split_terminator('\n') {
            lines.push(format!("{task:>2}: {l}"));
        }
        rest = &rest[cut..];
    }
    lines
}

/// A node with many NICs: a plain record (no topology) well over 1 KiB still reaches the
/// inventory through srun's labelled, 1024-byte-message output (before, the
/// record went as one long line, arrived cut into labelled pieces and failed to parse).
#[test]
fn discover_record_of_many_nics_survives_srun_labels() {
    let s = Scratch::new("many-nics");
    let net = s.path().join("net");
    for i in 0..20 {
        let d = net.join(format!("ens3f{i}"));
        std::fs::create_dir_all(d.join("device")).unwrap();
        std::fs::write(d.join("address"), format!("02:aa:00:00:01:{i:02x}\n")).unwrap();
    }
    let out = Command::new(bin())
        .args(["discover", "--node-name", "n1", "--require-ip", "no"])
        .arg("--sys-class-net")
        .arg(&net)
        .output()
        .unwrap();
    assert_exit_0(&out);
    let json_len: usize = serde_json::to_string(&record_of(&stdout(&out)))
        .unwrap()
        .len();
    assert!(json_len > 1100, "the record is only {json_len} bytes");
    // Interleaved line by line with another task's output, as srun prints two nodes at once.
    let mine = srun_labelled(0, &out.stdout);
    let other = srun_labelled(1, b"\nnoise from another node\n");
    let mut reader = cvslurm::internals::inventory::discovery::LabelledReader::default();
    let mut got = Vec::new();
    for i in 0..mine.len().max(other.len()) {
        for l in [mine.get(i), other.get(i)].into_iter().flatten() {
            got.extend(reader.push(l));
        }
    }
    let records: Vec<_> = got
        .iter()
        .filter(|(t, r)| *t == Some(0) && r.is_ok())
        .collect();
    assert_eq!(records.len(), 1, "{got:?}\n{mine:#?}");
    let rec = records[0].1.as_ref().unwrap();
    assert_eq!(rec.node_name, "n1");
    assert_eq!(rec.interfaces.len(), 20);
    assert_eq!(rec.interfaces[19].name, "ens3f9");
    assert!(
        got.iter().all(|(t, r)| *t == Some(1) || r.is_ok()),
        "{got:?}"
    );
}

/// The one record in discover's output, put together from its parts when it was split.
fn record_of(text: &str) -> serde_json::Value {
    let mut r = cvslurm::internals::discovery::record::RecordReader::new(1 << 20, 1 << 20);
    let recs: Vec<_> = text
        .lines()
        .filter(|l| !l.is_empty())
        .filter_map(|l| r.push(l))
        .map(|x| x.unwrap())
        .collect();
    assert_eq!(recs.len(), 1, "{text}");
    serde_json::to_value(&recs[0]).unwrap()
}

/// `discover --sys-root` on the generated DGX A100 tree: the record's topology gives every
/// compute NIC the two GPUs of its PCIe switch. Without `--topology` the record is the
/// old format (no `topology` key), so older inventories still read it.
#[test]
fn discover_sys_root_topology() {
    let s = Scratch::new("topo");
    let gen = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/topology/gen.sh"
    );
    let st = Command::new("bash")
        .args([gen, "dgx-a100"])
        .arg(s.path())
        .status()
        .unwrap();
    assert!(st.success());
    let run = |extra: &[&str]| {
        let out = Command::new(bin())
            .args([
                "discover",
                "--node-name",
                "dgx1",
                "--require-ip",
                "no",
                "--sys-root",
            ])
            .arg(s.path())
            .args(extra)
            .output()
            .unwrap();
        assert_exit_0(&out);
        record_of(&stdout(&out))
    };
    let plain = run(&[]);
    assert!(plain.get("topology").is_none());
    assert_eq!(plain["interfaces"].as_array().unwrap().len(), 10);
    let v = run(&["--topology"]);
    assert_eq!(v["interfaces"], plain["interfaces"]);
    let t = &v["topology"];
    assert_eq!(t["gpus"].as_array().unwrap().len(), 8);
    assert_eq!(
        t["gpus"][3],
        json!({"index":3,"pci":"0000:4e:00.0","numa_node":0})
    );
    let nics: Vec<(String, Vec<u64>, String)> = t["nics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["name"].as_str().unwrap().to_string(),
                n["gpus"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|g| g.as_u64().unwrap())
                    .collect(),
                n["near"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let want: Vec<(String, Vec<u64>, String)> = [
        ("enp12s0", vec![0, 1], "switch"),
        ("enp141s0", vec![4, 5], "switch"),
        ("enp148s0", vec![4, 5], "switch"),
        ("enp186s0", vec![6, 7], "switch"),
        ("enp18s0", vec![0, 1], "switch"),
        ("enp204s0", vec![6, 7], "switch"),
        ("enp225s0f0", vec![4, 5, 6, 7], "numa"),
        ("enp225s0f1", vec![4, 5, 6, 7], "numa"),
        ("enp75s0", vec![2, 3], "switch"),
        ("enp84s0", vec![2, 3], "switch"),
    ]
    .into_iter()
    .map(|(n, g, l)| (n.to_string(), g, l.to_string()))
    .collect();
    assert_eq!(nics, want);
    // --sys-class-net still wins for the interface list.
    let net = fake_sysfs(s.path());
    let out = Command::new(bin())
        .args([
            "discover",
            "--node-name",
            "dgx1",
            "--require-ip",
            "no",
            "--topology",
        ])
        .args(["--sys-class-net", net.to_str().unwrap(), "--sys-root"])
        .arg(s.path())
        .output()
        .unwrap();
    let v = record_of(&stdout(&out));
    assert_eq!(v["interfaces"][0]["name"], "ens99");
    // ens99's device link is not a PCI device: GPUs listed, the NIC has no entry.
    assert_eq!(v["topology"]["nics"], json!([]));
}

#[test]
fn send_tenant_dry_run_and_real() {
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "");
    let args = [
        "send",
        "--tenant",
        "t-9",
        "--name",
        "train",
        "--location",
        "tenant-a",
        "--state",
        "running",
        "--start",
        "2025-12-05T10:30:00Z",
        "--nodes",
        "gpu[1-2]",
    ];
    let mut dry = args.to_vec();
    dry.push("--dry-run");
    let out = site.run(&dry);
    assert_exit_0(&out);
    let text = stdout(&out);
    let (first, body) = text.split_once('\n').unwrap();
    assert_eq!(
        first,
        format!(
            "POST https://{}/api/resources/computejob/v1/JobConfig",
            cv.server()
        )
    );
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(
        v,
        json!({"key":{"id":"t-9"},"name":"train","state":"JOB_STATE_RUNNING","start_time":"2025-12-05T10:30:00Z",
               "location":"tenant-a","type":"JOB_TYPE_TENANT","nodes":{"values":["gpu1","gpu2"]}})
    );
    assert!(cv.requests().is_empty(), "a dry run touches no network");
    let out = site.run(&args);
    assert_exit_0(&out);
    assert_eq!(
        stdout(&out).trim(),
        "job t-9: sent RUNNING on 2 node(s) (HTTP 200)"
    );
    assert_eq!(cv.accepted("JobConfig"), vec![v]);
}

#[test]
fn send_usage_and_failures() {
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "");
    let cases: &[(&[&str], i32, &str)] = &[
        (&["send"], 2, "give one or more job ids"),
        (
            &[
                "send",
                "--tenant",
                "x",
                "--name",
                "n",
                "--location",
                "l",
                "--state",
                "pending",
                "--start",
                "0",
                "--nodes",
                "a",
            ],
            2,
            "--state \"pending\" is not one of",
        ),
        (
            &[
                "send",
                "--tenant",
                "x",
                "--name",
                "n",
                "--location",
                "l",
                "--state",
                "running",
                "--start",
                "0",
            ],
            2,
            "give exactly one of --nodes and --interfaces",
        ),
        (&["send", "--name", "n", "12"], 2, "go with --tenant"),
        (&["send", "12"], 1, "scontrol not found"),
        (&["send", "abc"], 2, "\"abc\" is not a job id"),
    ];
    for (args, code, msg) in cases {
        let out = site.run(args);
        assert_eq!(out.status.code(), Some(*code), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(msg), "{args:?}: {}", stderr(&out));
    }
    // --api-token works but warns; a refused token is one clear line and exit 1.
    let out = site.run(&[
        "send",
        "--api-token",
        "wrong",
        "--tenant",
        "x",
        "--name",
        "n",
        "--location",
        "l",
        "--state",
        "running",
        "--start",
        "0",
        "--nodes",
        "a",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("--api-token is visible to every user in ps"),
        "{err}"
    );
    assert!(
        err.contains("job x: not sent: CloudVision refused the token"),
        "{err}"
    );
    assert!(!err.contains("wrong"), "token leaked: {err}");
}

#[test]
fn config_errors_name_file_line_and_key() {
    let site = Site::offline("PollInterval=soon");
    // A bad line is reported and skipped; the command still runs with the other lines.
    let out = site.run(&[
        "send",
        "--dry-run",
        "--tenant",
        "t",
        "--name",
        "n",
        "--location",
        "l",
        "--state",
        "running",
        "--start",
        "2025-12-05T10:30:00Z",
        "--nodes",
        "a1",
    ]);
    assert_exit_0(&out);
    assert!(
        stderr(&out).contains(&format!(
            "config: {}:10: PollInterval: \"soon\" is not a duration (seconds, or 500ms, 30s, 5m, 12h, 1d)",
            site.conf.display()
        )),
        "{}",
        stderr(&out)
    );
    let out = Command::new(bin())
        .args(["send", "--config", "/nonexistent/cv.conf", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("cannot read config file /nonexistent/cv.conf"));
}

#[test]
fn status_reports_outbox_and_cloudvision() {
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "");
    cv.set_mode(json!({"mode": "status", "status": 500}));
    site.hook(&job_env("prolog_slurmctld", "300", &[]));
    cv.set_mode(json!({"mode": "ok"}));
    let out = site.run(&["status", "--json"]);
    assert_exit_0(&out);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["outbox_depth"], 1);
    assert_eq!(v["cloudvision"], "ok");
    let out = site.run(&["status", "--max-age", "-1"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "an outbox older than the threshold fails"
    );
    assert!(stdout(&out).contains("outbox:           1 event(s) waiting"));
    std::fs::write(&site.token_file, "bad\n").unwrap();
    let out = site.run(&["status"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout(&out).contains("refused the token"),
        "{}",
        stdout(&out)
    );
}

/// `status` counts the outbox's files and takes the oldest one's age from
/// its modification time (an event file's is its queue time); it reads no event, so its cost
/// does not grow with what the events hold, and a file that is not an event counts as waiting
/// (the drainer, not `status`, moves it to rejected/).
#[test]
fn status_counts_the_outbox_without_reading_it() {
    use std::fs;
    use std::os::unix::fs::MetadataExt;
    use std::time::{Duration, SystemTime};
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "");
    cv.set_mode(json!({"mode": "status", "status": 503}));
    site.hook(&job_env("prolog_slurmctld", "300", &[]));
    let outbox = site
        .state_dir
        .join(cvslurm::internals::state::layout::OUTBOX);
    let queued = &site.outbox()[0];
    let name = fs::read_dir(&outbox)
        .unwrap()
        .flatten()
        .next()
        .unwrap()
        .path();
    let file = fs::metadata(&name).unwrap();
    assert_eq!(
        Some(file.mtime()),
        queued["queued_at"].as_i64(),
        "mtime is the queue time"
    );
    for i in 0..10_000 {
        fs::write(
            outbox.join(format!("job.{i}@garbage.json")),
            b"{not an event",
        )
        .unwrap();
    }
    // A writer's temp file is not an event.
    fs::write(outbox.join(".tmp.1.2.job.9@c.json"), b"").unwrap();
    let two_hours_ago = SystemTime::now() - Duration::from_secs(7200);
    fs::File::options()
        .write(true)
        .open(outbox.join("job.77@garbage.json"))
        .unwrap()
        .set_modified(two_hours_ago)
        .unwrap();
    let out = site.run(&["status", "--offline", "--json"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "older than --max-age: {}",
        stdout(&out)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["outbox_depth"], 10_001);
    let age = v["oldest_event_age_s"].as_i64().unwrap();
    assert!((7200..7300).contains(&age), "{age}");
    assert_eq!(v["rejected"], 0);
    assert_eq!(
        fs::read(outbox.join("job.4242@garbage.json")).unwrap(),
        b"{not an event",
        "status moved or changed nothing"
    );
}

/// A StateDir `status` cannot read (a typo, a missing mount, another
/// user's) is not an empty outbox: `status` says so and exits 3 ("cannot know"), so alerting
/// on `--max-age` does not stay silent.
#[test]
fn status_cannot_know_when_state_dir_cannot_be_read() {
    use std::fs;
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "");
    // A typo: StateDir names a directory that is not there.
    let typo = site.dir.path().join("stat");
    let conf = fs::read_to_string(&site.conf).unwrap().replace(
        &format!("StateDir={}", site.state_dir.display()),
        &format!("StateDir={}", typo.display()),
    );
    fs::write(&site.conf, conf).unwrap();
    let out = site.run(&["status", "--offline"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(3), "{text}");
    assert!(!text.contains("0 event(s) waiting"), "{text}");
    assert!(
        text.contains(&format!(
            "outbox:           UNKNOWN: cannot read StateDir {}: No such file or directory",
            typo.display()
        )),
        "{text}"
    );
    let out = site.run(&["status", "--offline", "--json"]);
    assert_eq!(out.status.code(), Some(3));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["outbox_depth"], serde_json::Value::Null);
    assert!(v["state_dir_error"]
        .as_str()
        .unwrap()
        .contains("cannot read StateDir"));

    // Not a directory.
    fs::write(&typo, "").unwrap();
    let out = site.run(&["status", "--offline"]);
    assert_eq!(out.status.code(), Some(3), "{}", stdout(&out));

    // Another user's outbox: root becomes StateDir's owner (nobody), who cannot read it.
    if nix::unistd::geteuid().is_root() {
        use std::os::unix::fs::PermissionsExt;
        fs::remove_file(&typo).unwrap();
        let outbox = typo.join(cvslurm::internals::state::layout::OUTBOX);
        fs::create_dir_all(&outbox).unwrap();
        fs::set_permissions(&outbox, fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::chown(&typo, Some(65534), Some(65534)).unwrap();
        // SlurmUser is nobody: root may become StateDir's owner (crate::privilege).
        let slurm_conf = site.dir.path().join("slurm.conf");
        fs::write(&slurm_conf, "ClusterName=c\nSlurmUser=nobody\n").unwrap();
        let out = std::process::Command::new(bin())
            .args(["status", "--offline"])
            .env_remove("CV_API_TOKEN")
            .env("CVSLURM_CONF", &site.conf)
            .env("SLURM_CONF", &slurm_conf)
            .output()
            .unwrap();
        let text = stdout(&out);
        assert_eq!(out.status.code(), Some(3), "{text}{}", stderr(&out));
        assert!(text.contains("Permission denied"), "{text}");
    }

    // Readable and empty: 0 events, exit 0.
    fs::create_dir_all(&site.state_dir).unwrap();
    let conf = fs::read_to_string(&site.conf).unwrap().replace(
        &format!("StateDir={}", typo.display()),
        &format!("StateDir={}", site.state_dir.display()),
    );
    fs::write(&site.conf, conf).unwrap();
    let out = site.run(&["status", "--offline"]);
    assert_exit_0(&out);
    assert!(stdout(&out).contains("outbox:           0 event(s) waiting"));
}

/// With two `SlurmctldHost`s in slurm.conf, `status` names both and the one whose
/// heartbeat (StateSaveLocation/heartbeat) is fresh; a stale or hostile heartbeat is "unknown",
/// and a single controller prints no such line.
#[test]
fn status_names_the_controllers_and_the_one_in_control() {
    use std::fs;
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "");
    let save = site.dir.path().join("statesave");
    fs::create_dir_all(&save).unwrap();
    let slurm_conf = site.dir.path().join("slurm.conf");
    let status = |conf: &str| {
        fs::write(&slurm_conf, conf).unwrap();
        let out = Command::new(bin())
            .args(["status", "--offline"])
            .env("CVSLURM_CONF", &site.conf)
            .env("SLURM_CONF", &slurm_conf)
            .output()
            .unwrap();
        stdout(&out)
    };
    let pair = format!(
        "SlurmctldHost=ctl1(10.99.0.2)\nSlurmctldHost=ctl2(10.99.0.3)\nSlurmctldTimeout=10\n\
         StateSaveLocation={}\n",
        save.display()
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let heartbeat = |time: u64, index: u64| {
        let mut b = time.to_be_bytes().to_vec();
        b.extend_from_slice(&index.to_be_bytes());
        fs::write(save.join("heartbeat"), b).unwrap();
    };
    heartbeat(now - 1, 1);
    let text = status(&pair);
    assert!(
        text.contains("controllers:      ctl1, ctl2 (in control)\n"),
        "{text}"
    );
    // Written 60 s before `now`: its age is 60 s plus however many seconds have passed
    // since `now` when `status` reads it (a second boundary may pass meanwhile).
    heartbeat(now - 60, 0);
    let text = status(&pair);
    let after = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let said = (60..=60 + (after - now))
        .find(|age| {
            text.contains(&format!(
                "controllers:      ctl1, ctl2 (in control: unknown: the heartbeat of ctl1 is {age} s old"
            ))
        });
    assert!(said.is_some(), "{text}");
    // 20 bytes: its size is said whole (it is not read past 16).
    fs::write(save.join("heartbeat"), b"\x1b[31mnot a heartbeat").unwrap();
    let text = status(&pair);
    assert!(
        text.contains("(in control: unknown: the heartbeat is 20 bytes, not 16)"),
        "{text}"
    );
    let text = status("SlurmctldHost=ctl1(10.99.0.2)\n");
    assert!(!text.contains("controllers:"), "{text}");
}

/// `check` and `status` probe CloudVision with a GetOne of a JobConfig key no job
/// has: a strict CloudVision (a GET of JobConfig without a key is 400, an unknown key 404)
/// counts as reachable with the token accepted; a bad token is named as the token. The old
/// probe (a GET without a key) got 400 here and failed `check` with a good token.
#[test]
fn check_and_status_probe_a_strict_cloudvision() {
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "");
    let cv_line = |site: &Site| {
        let out = stdout(&site.run(&["check"]));
        out.lines()
            .find(|l| l.contains(&format!("CloudVision {}", cv.server())))
            .unwrap_or_else(|| panic!("no CloudVision line: {out}"))
            .to_string()
    };
    let line = cv_line(&site);
    assert!(
        line.starts_with("ok   ") && line.contains("answers with the token (HTTP 404"),
        "{line}"
    );
    let out = site.run(&["status", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["cloudvision"], "ok", "{v}");
    // Every probe was a GetOne (a key given), and wrote nothing.
    let reqs = cv.requests();
    assert!(!reqs.is_empty());
    for r in &reqs {
        assert_eq!(r["method"], "GET", "{r}");
        assert!(r["query"]["key.id"].is_string(), "{r}");
    }
    assert_eq!(cv.state(), json!({"jobs": {}, "nodes": {}}));
    // A refused token is named as the token.
    std::fs::write(&site.token_file, "bad\n").unwrap();
    let line = cv_line(&site);
    assert!(
        line.starts_with("FAIL ")
            && line.contains("refused the token")
            && line.contains("HTTP 401"),
        "{line}"
    );
    // Anything else is named with its status and CloudVision's message.
    std::fs::write(&site.token_file, format!("{}\n", crate::common::TOKEN)).unwrap();
    cv.set_mode(json!({"mode": "status", "status": 400, "message": "no such API"}));
    let line = cv_line(&site);
    assert!(
        line.starts_with("FAIL ") && line.contains("HTTP 400: no such API"),
        "{line}"
    );
}

/// The probe says "answers with the token" only on CloudVision's own answers. A
/// plain web server that answers every path 404 (or 200 with a page of HTML), and Arista's own
/// fake CloudVision (a plain 404 `{"errors":[…]}` to every GET), are named for what answered:
/// `check` fails, `status` says so; nothing is written.
#[test]
fn check_and_status_know_cloudvision_from_any_web_server() {
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "");
    for (profile, status, excerpt) in [
        (
            "web",
            404,
            "<html><head><title>404 Not Found</title></head><body><h1>Not Found</h1></body></html>",
        ),
        (
            "web200",
            200,
            "<html><body><h1>It works!</h1></body></html>",
        ),
        (
            "arista",
            404,
            r#"{"errors":["GET not supported by CV stub"]}"#,
        ),
    ] {
        cv.set_behaviour(json!({ "profile": profile }));
        let out = site.run(&["check"]);
        assert_eq!(out.status.code(), Some(1), "{profile}: {}", stdout(&out));
        let text = stdout(&out);
        let line = text
            .lines()
            .find(|l| l.contains(&format!("CloudVision {}", cv.server())))
            .unwrap_or_else(|| panic!("no CloudVision line: {text}"));
        let want = format!(
            "FAIL CloudVision {}: the server is not answering as CloudVision: HTTP {status} {excerpt:?}",
            cv.server()
        );
        assert!(line.starts_with(&want), "{profile}:\n{line}\n{want}");
        assert!(
            line.contains("set ApiServer to CloudVision's own address"),
            "{line}"
        );
        let out = site.run(&["status", "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let said = v["cloudvision"].as_str().unwrap();
        assert!(
            said.starts_with(&format!(
                "the server is not answering as CloudVision: HTTP {status}"
            )),
            "{profile}: {said}"
        );
        assert_eq!(cv.state(), json!({"jobs": {}, "nodes": {}}), "{profile}");
    }
    // Back to CloudVision's answers: the same site passes.
    cv.set_behaviour(json!({ "profile": "cloudvision" }));
    let out = site.run(&["status", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["cloudvision"], "ok", "{v}");
}

/// A bound the service reached asking Slurm (jobs left for the next pass, a listing
/// past the output bound) is shown by `status`, escaped like everything read from StateDir.
#[test]
fn status_shows_the_last_slurm_warning() {
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "");
    let quiet = site.run(&["status", "--offline"]);
    assert!(
        !stdout(&quiet).contains("Slurm warning"),
        "{}",
        stdout(&quiet)
    );
    let at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    std::fs::create_dir_all(&site.state_dir).unwrap();
    std::fs::write(
        site.state_dir
            .join(cvslurm::internals::state::layout::SERVICE_STATUS),
        json!({
            "last_slurm_warning": "reconcile: squeue --all --json: printed more than 64 MiB\u{1b}[2J",
            "last_slurm_warning_at": at,
        })
        .to_string(),
    )
    .unwrap();
    let out = site.run(&["status", "--offline"]);
    let text = stdout(&out);
    let line = text
        .lines()
        .find(|l| l.starts_with("Slurm warning:"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains("printed more than 64 MiB\\x1b[2J"), "{line}");
    let out = site.run(&["status", "--offline", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["last_slurm_warning_at"], at);
}

/// `check` on a controller of a pair names both and the one in control, and fails
/// on this host when slurm.conf names a hook that is not here (on 23.02+ a slurmctld whose
/// disk lacks it does not start: a backup so set up never takes over).
#[test]
fn check_names_the_controllers_and_fails_on_a_hook_missing_here() {
    use std::fs;
    let site = Site::offline("");
    let save = site.dir.path().join("statesave");
    fs::create_dir_all(&save).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let mut hb = (now - 1).to_be_bytes().to_vec();
    hb.extend_from_slice(&1u64.to_be_bytes());
    fs::write(save.join("heartbeat"), hb).unwrap();
    let link = site.link("cvslurm-hook");
    let missing = site.dir.path().join("opt/cloudvision/cvslurm-hook");
    let pair = |prolog: &std::path::Path| {
        format!(
            "ClusterName=c\nSlurmctldHost=ctl1(10.99.0.2)\nSlurmctldHost=ctl2(10.99.0.3)\n\
             SlurmctldTimeout=10\nStateSaveLocation={}\nSlurmUser=root\n\
             PrologSlurmctld={}\nEpilogSlurmctld={}\n",
            save.display(),
            prolog.display(),
            link.display()
        )
    };
    let text = site.check_with_slurm_conf(&pair(&missing));
    assert!(
        text.contains(&format!(
            "FAIL PrologSlurmctld: {}: No such file or directory (os error 2) on this host: slurmctld cannot run it here, and from Slurm 23.02 on a slurmctld whose disk lacks the hook does not even start (a backup controller could never take over); install cvslurm on every SlurmctldHost before slurm.conf names it",
            missing.display()
        )),
        "{text}"
    );
    assert!(
        text.contains("ok   slurm.conf names 2 controllers: ctl1, ctl2 (in control) (heartbeat "),
        "{text}"
    );
    // Present but not executable: the same failure.
    fs::create_dir_all(missing.parent().unwrap()).unwrap();
    fs::write(&missing, "").unwrap();
    let text = site.check_with_slurm_conf(&pair(&missing));
    assert!(
        text.contains(&format!(
            "FAIL PrologSlurmctld: {} is not an executable file on this host",
            missing.display()
        )) && text.contains("install cvslurm on every SlurmctldHost before slurm.conf names it"),
        "{text}"
    );
    // The hook here: no such failure; a stale heartbeat: who is in control cannot be told.
    fs::write(save.join("heartbeat"), [0u8; 16]).unwrap();
    let text = site.check_with_slurm_conf(&pair(&link));
    assert!(!text.contains("on every SlurmctldHost"), "{text}");
    assert!(
        text.contains("WARN slurm.conf names 2 controllers: ctl1, ctl2; which one is in control cannot be told: the heartbeat of ctl1 is"),
        "{text}"
    );
}

/// Slurmctld is a controller when a `SlurmctldHost` name equals its host
/// name whole or cut at the first dot (case counts), so a host named `ctl1.example.com` is
/// the controller `SlurmctldHost=ctl1.example.com` as well as `SlurmctldHost=ctl1`, and a host
/// named `ctl1` is not `ctl1.example.com`. `check` and `check --slurm-facts` (install.sh's)
/// agree with it. Old code: `check` cut this host's name at the first dot, and a controller
/// named by its full host name was "none of them".
#[test]
fn a_controller_named_by_its_full_host_name_is_this_host() {
    use std::fs;
    let site = Site::offline("");
    let save = site.dir.path().join("statesave");
    fs::create_dir_all(&save).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let mut hb = (now - 1).to_be_bytes().to_vec();
    hb.extend_from_slice(&1u64.to_be_bytes());
    fs::write(save.join("heartbeat"), hb).unwrap();
    let slurm_conf = site.dir.path().join("slurm.conf");
    // (this host's name, the second SlurmctldHost, whether slurmctld takes it for this host)
    let cases = [
        ("cvslurm-ctl1.example.com", "cvslurm-ctl1.example.com", true),
        ("cvslurm-ctl1.example.com", "cvslurm-ctl1", true),
        ("cvslurm-ctl1", "cvslurm-ctl1", true),
        ("cvslurm-ctl1", "cvslurm-ctl1.example.com", false),
        ("cvslurm-ctl10.example.com", "cvslurm-ctl1", false),
        ("cvslurm-ctl1.example.com", "CVSLURM-CTL1", false),
    ];
    for (host, name, this) in cases {
        fs::write(
            &slurm_conf,
            format!(
                "ClusterName=c\nSlurmctldHost=cvslurm-other-ctl(10.99.0.2)\nSlurmctldHost={name}(10.99.0.3)\n\
                 SlurmctldTimeout=10\nStateSaveLocation={}\nSlurmUser=root\n",
                save.display()
            ),
        )
        .unwrap();
        let run = |args: &[&str]| {
            let out = with_hostname(host)?
                .args(args)
                .env_remove("CV_API_TOKEN")
                .env_remove("CV_API_SERVER")
                .env("CVSLURM_CONF", &site.conf)
                .env("SLURM_CONF", &slurm_conf)
                .output()
                .unwrap();
            Some(stdout(&out))
        };
        let Some(text) = run(&["check"]) else {
            eprintln!("skipped: needs unshare --uts (root, or user namespaces)");
            return;
        };
        let said = if this {
            format!("; this host is {name}; the hooks")
        } else {
            format!("; this host ({host}) is none of them;")
        };
        assert!(text.contains(&said), "{host} / {name}: {text}");
        assert!(
            text.contains(&format!("{name} (in control)")),
            "{host} / {name}: {text}"
        );
        let facts = run(&["check", "--slurm-facts", "--slurm-version", "24.11"]).unwrap();
        let line = format!(
            "\ncontroller={name} {}\n",
            if this { "this" } else { "other" }
        );
        assert!(facts.contains(&line), "{host} / {name}: {facts}");
        assert!(
            facts.contains("\ncontroller=cvslurm-other-ctl other\n"),
            "{facts}"
        );
    }
}

/// `StateSaveLocation/heartbeat` is SlurmUser's, on a shared filesystem.
/// A FIFO there, a symlink (to a good heartbeat elsewhere: root's `check` must not follow
/// SlurmUser's links) or a huge file: `status` and `check` end at once and say the heartbeat
/// cannot be read or is not one. Each run is killed after 20 s and counted as a failure.
/// Old code: the FIFO blocked both for good; the symlink was followed.
#[test]
fn a_heartbeat_that_is_no_plain_file_is_refused_at_once() {
    use std::fs;
    use std::time::Duration;
    let site = Site::offline("");
    let save = site.dir.path().join("statesave");
    fs::create_dir_all(&save).unwrap();
    let slurm_conf = site.dir.path().join("slurm.conf");
    fs::write(
        &slurm_conf,
        format!(
            "ClusterName=c\nSlurmctldHost=ctl1(10.99.0.2)\nSlurmctldHost=ctl2(10.99.0.3)\n\
             SlurmctldTimeout=10\nStateSaveLocation={}\nSlurmUser=root\n",
            save.display()
        ),
    )
    .unwrap();
    let heartbeat = save.join("heartbeat");
    let run = |args: &[&str]| {
        let (finished, out) = output_within(
            Command::new(bin())
                .args(args)
                .env_remove("CV_API_TOKEN")
                .env_remove("CV_API_SERVER")
                .env("CVSLURM_CONF", &site.conf)
                .env("SLURM_CONF", &slurm_conf),
            Duration::from_secs(20),
        );
        assert!(finished, "cvslurm {args:?} hung: {}", stdout(&out));
        stdout(&out)
    };
    let cannot_read = format!("cannot read {}: ", heartbeat.display());
    // A FIFO nobody writes.
    nix::unistd::mkfifo(&heartbeat, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    let text = run(&["status", "--offline"]);
    assert!(
        text.contains(&format!(
            "controllers:      ctl1, ctl2 (in control: unknown: {cannot_read}not a regular file)"
        )),
        "{text}"
    );
    let text = run(&["check"]);
    assert!(
        text.contains(&format!(
            "which one is in control cannot be told: {cannot_read}not a regular file"
        )),
        "{text}"
    );
    // A symlink to a fresh heartbeat naming ctl2.
    fs::remove_file(&heartbeat).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let mut hb = (now - 1).to_be_bytes().to_vec();
    hb.extend_from_slice(&1u64.to_be_bytes());
    let elsewhere = site.dir.path().join("elsewhere");
    fs::write(&elsewhere, hb).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &heartbeat).unwrap();
    for args in [&["status", "--offline"][..], &["check"]] {
        let text = run(args);
        assert!(
            text.contains(&cannot_read) && !text.contains("ctl2 (in control)"),
            "{args:?}: {text}"
        );
    }
    // A huge (sparse) file: its size said, not read.
    fs::remove_file(&heartbeat).unwrap();
    fs::File::create(&heartbeat)
        .unwrap()
        .set_len(1 << 40)
        .unwrap();
    let text = run(&["status", "--offline"]);
    assert!(
        text.contains("(in control: unknown: the heartbeat is 1099511627776 bytes, not 16)"),
        "{text}"
    );
    let text = run(&["check"]);
    assert!(
        text.contains("cannot be told: the heartbeat is 1099511627776 bytes, not 16"),
        "{text}"
    );
}
