//! The metrics file (`MetricsFile=`) as the binary writes it: valid for `promtool
//! check metrics`, every figure checked against what the CloudVision stand-in received and
//! answered, the same figures in `cvslurm status --json`; and the shipped alert rules under
//! `promtool test rules`. promtool comes from Debian's `prometheus` package (tests/deps.sh).

use crate::common::*;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// promtool, which tests/deps.sh installs: its absence is a failure, not a skip.
fn promtool() -> Command {
    let out = Command::new("promtool").arg("--version").output();
    assert!(
        out.is_ok_and(|o| o.status.success()),
        "promtool is missing: run tests/deps.sh (it installs Debian's prometheus package)"
    );
    Command::new("promtool")
}

/// `promtool check metrics` on `text` (it lints too: names, units, `_total`).
fn check_metrics(text: &str) {
    let mut child = promtool()
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}\n{text}",
        stdout(&out),
        stderr(&out)
    );
}

/// The samples of an exposition text: series (with its labels) to value.
fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').unwrap();
            (series.to_string(), value.parse::<f64>().unwrap())
        })
        .collect()
}

/// A site with `MetricsFile` in a textfile directory of its own.
fn site_with_metrics(cv: &Standin, extra: &str) -> (Site, Scratch, PathBuf) {
    let textfile = Scratch::new("textfile");
    let metrics = textfile.path().join("cvslurm.prom");
    let site = Site::with_standin(cv, &format!("MetricsFile={}\n{extra}", metrics.display()));
    (site, textfile, metrics)
}

/// The requests the stand-in answered with `status` (POSTs of JobConfigs).
fn answered(cv: &Standin, status: u64) -> usize {
    cv.requests()
        .iter()
        .filter(|r| {
            r["method"] == "POST"
                && r["path"].as_str().unwrap_or("").ends_with("JobConfig")
                && r["status"] == status
        })
        .count()
}

#[test]
fn flush_writes_the_figures_the_standin_saw_and_status_json_shows_them() {
    let cv = Standin::start();
    let (site, _textfile, metrics) = site_with_metrics(&cv, "");
    // Four jobs while CloudVision fails: no service, so each hook sends itself (503) and
    // leaves its event queued.
    cv.set_mode(json!({"mode": "status", "status": 503}));
    for id in ["501", "502", "503", "504"] {
        site.hook(&job_env("prolog_slurmctld", id, &[]));
    }
    assert_eq!(site.outbox().len(), 4, "{}", site.log());
    // A flush while it still fails: four retries, counted by the first process.
    let out = site.run(&["flush", "--no-reconcile"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    // Then CloudVision refuses one event and takes the rest: a second process adds to the
    // same counters.
    cv.set_mode(json!({"mode": "status", "status": 400, "count": 1, "message": "bad field"}));
    let out = site.run(&["flush", "--no-reconcile"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("3 delivered, 0 kept, 1 rejected"),
        "{}",
        stdout(&out)
    );
    let text = std::fs::read_to_string(&metrics).expect("flush wrote the metrics file");
    check_metrics(&text);
    let m = samples(&text);
    let v = |k: &str| *m.get(k).unwrap_or_else(|| panic!("{k} missing:\n{text}"));
    // What the stand-in received and answered.
    let took = cv.accepted("JobConfig").len();
    assert_eq!(took, 3);
    assert_eq!(v("cvslurm_events_delivered_total"), took as f64);
    assert_eq!(
        v("cvslurm_http_responses_total{class=\"2xx\"}"),
        answered(&cv, 200) as f64
    );
    assert_eq!(v("cvslurm_events_rejected_total"), 1.0);
    assert_eq!(
        v("cvslurm_http_responses_total{class=\"4xx\"}"),
        answered(&cv, 400) as f64
    );
    assert_eq!(answered(&cv, 400), 1);
    // The 503s: four to the hooks (which sent themselves), four to the first flush.
    assert_eq!(v("cvslurm_hook_direct_sends_total"), 4.0);
    assert_eq!(v("cvslurm_events_retried_total"), 4.0);
    assert_eq!(
        v("cvslurm_http_responses_total{class=\"5xx\"}") + v("cvslurm_hook_direct_sends_total"),
        answered(&cv, 503) as f64
    );
    assert_eq!(v("cvslurm_http_responses_total{class=\"none\"}"), 0.0);
    assert_eq!(v("cvslurm_events_queued_total"), 4.0);
    assert_eq!(v("cvslurm_events_dropped_total"), 0.0);
    assert_eq!(v("cvslurm_events_lost_total"), 0.0);
    assert_eq!(v("cvslurm_outbox_events"), 0.0);
    assert_eq!(v("cvslurm_outbox_oldest_event_timestamp_seconds"), 0.0);
    assert_eq!(v("cvslurm_rejected_events"), 1.0);
    assert_eq!(v("cvslurm_delivery_latency_seconds_count"), 3.0);
    assert_eq!(
        v("cvslurm_delivery_latency_seconds_bucket{le=\"+Inf\"}"),
        3.0
    );
    assert!(v("cvslurm_delivery_latency_seconds_sum") > 0.0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let last = v("cvslurm_last_delivery_timestamp_seconds");
    assert!(now - last < 60.0 && last <= now + 1.0, "{last} vs {now}");
    assert_eq!(v("cvslurm_service_running"), 0.0);
    assert!(
        m.keys()
            .any(|k| k.starts_with("cvslurm_build_info{version=\"") && m[k] == 1.0),
        "{text}"
    );
    // The file is for node_exporter: 0644, no temp file left beside it.
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&metrics).unwrap().permissions().mode() & 0o777,
        0o644
    );
    assert_eq!(
        std::fs::read_dir(metrics.parent().unwrap())
            .unwrap()
            .count(),
        1
    );
    // `status --json` carries the same figures.
    let out = site.run(&["status", "--json", "--offline"]);
    let st: Value = serde_json::from_slice(&out.stdout).unwrap();
    let f = &st["metrics"];
    // No service runs: `status` listed the outbox itself.
    assert_eq!(st["outbox_counted_by"], "listing", "{st}");
    assert_eq!(f["counters"]["events_delivered"], 3, "{st}");
    assert_eq!(f["counters"]["events_rejected"], 1);
    assert_eq!(f["counters"]["events_retried"], 4);
    assert_eq!(f["counters"]["hook_direct_sends"], 4);
    assert_eq!(f["http_responses"]["2xx"], 3);
    assert_eq!(f["outbox_events"], 0);
    assert_eq!(f["delivery_latency_seconds"]["count"], 3);
    assert_eq!(
        f["last_delivery_timestamp_seconds"].as_f64(),
        Some(last),
        "{st}"
    );
}

#[test]
fn events_dropped_over_the_limit_and_lost_by_a_hook_are_counted() {
    let cv = Standin::start();
    let (site, _textfile, metrics) = site_with_metrics(&cv, "OutboxMaxEvents=2");
    cv.set_mode(json!({"mode": "status", "status": 503}));
    for id in ["601", "602", "603", "604"] {
        site.hook(&job_env("prolog_slurmctld", id, &[]));
    }
    let out = site.run(&["flush", "--no-reconcile"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = std::fs::read_to_string(&metrics).unwrap();
    check_metrics(&text);
    let m = samples(&text);
    assert_eq!(m["cvslurm_events_dropped_total"], 2.0, "{text}");
    assert_eq!(m["cvslurm_outbox_events"], 2.0, "{text}");
    assert!(m["cvslurm_outbox_oldest_event_timestamp_seconds"] > 0.0);
    // A hook that can neither queue (outbox/ is a file) nor send (503) loses its event.
    let outbox = site
        .state_dir
        .join(cvslurm::internals::state::layout::OUTBOX);
    std::fs::rename(&outbox, site.state_dir.join("outbox.saved")).unwrap();
    std::fs::write(&outbox, "not a directory").unwrap();
    site.hook(&job_env("prolog_slurmctld", "605", &[]));
    assert!(site.log().contains("LOST"), "{}", site.log());
    let out = site.run(&["status", "--json", "--offline"]);
    let st: Value = serde_json::from_slice(&out.stdout).unwrap();
    // The outbox cannot be listed and no service counts it: unknown, not 0.
    assert_eq!(st["outbox_counted_by"], Value::Null, "{st}");
    assert_eq!(st["metrics"]["counters"]["events_lost"], 1, "{st}");
    assert_eq!(st["metrics"]["counters"]["events_dropped"], 2, "{st}");
}

#[test]
fn the_service_writes_the_file_at_start_and_at_exit() {
    let cv = Standin::start();
    let (site, _textfile, metrics) = site_with_metrics(&cv, "");
    let mut service = Service::start(&site);
    wait_for(
        "the service's first metrics file",
        Duration::from_secs(10),
        || metrics.exists(),
    );
    let text = std::fs::read_to_string(&metrics).unwrap();
    check_metrics(&text);
    assert_eq!(samples(&text)["cvslurm_service_running"], 1.0, "{text}");
    // A job the service delivers; the file written at its exit counts it.
    site.hook(&job_env("prolog_slurmctld", "701", &[]));
    wait_for("the delivery", Duration::from_secs(10), || {
        cv.accepted("JobConfig").len() == 1
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(service.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let st = service.child.wait().unwrap();
    assert!(st.success(), "{st}: {}", site.log());
    let text = std::fs::read_to_string(&metrics).unwrap();
    check_metrics(&text);
    let m = samples(&text);
    assert_eq!(m["cvslurm_events_delivered_total"], 1.0, "{text}");
    assert_eq!(m["cvslurm_hook_direct_sends_total"], 0.0, "{text}");
    assert_eq!(
        m["cvslurm_http_responses_total{class=\"2xx\"}"], 1.0,
        "{text}"
    );
}

/// During an outage the service's file reports the waiting events (from its index, not a
/// listing of the outbox) as `status` lists them.
#[test]
fn the_service_reports_the_waiting_events_during_an_outage() {
    let cv = Standin::start();
    let (site, _textfile, metrics) = site_with_metrics(&cv, "");
    cv.set_mode(json!({"mode": "status", "status": 503}));
    let _service = Service::start(&site);
    for id in ["801", "802", "803"] {
        site.hook(&job_env("prolog_slurmctld", id, &[]));
    }
    wait_for(
        "three waiting events in the file",
        Duration::from_secs(60),
        || {
            std::fs::read_to_string(&metrics)
                .map(|t| samples(&t).get("cvslurm_outbox_events") == Some(&3.0))
                .unwrap_or(false)
        },
    );
    let text = std::fs::read_to_string(&metrics).unwrap();
    check_metrics(&text);
    let m = samples(&text);
    let oldest = m["cvslurm_outbox_oldest_event_timestamp_seconds"];
    // `status` shows the service's count (recorded in the same pass), not a listing of its own.
    let out = site.run(&["status", "--json", "--offline"]);
    let st: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(st["outbox_depth"], 3, "{st}");
    assert_eq!(st["outbox_counted_by"], "service", "{st}");
    let out = site.run(&["status", "--offline"]);
    assert!(
        stdout(&out).contains("3 event(s) waiting (the service's count)"),
        "{}",
        stdout(&out)
    );
    // The oldest queue time is the oldest event file's (its mtime, as cvslurm writes it).
    use std::os::unix::fs::MetadataExt;
    let first = std::fs::read_dir(
        site.state_dir
            .join(cvslurm::internals::state::layout::OUTBOX),
    )
    .unwrap()
    .flatten()
    .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
    .map(|e| e.metadata().unwrap().mtime())
    .min()
    .unwrap();
    assert_eq!(oldest, first as f64, "{text}");
}

#[test]
fn a_metrics_file_in_a_missing_directory_is_refused_in_one_line() {
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "MetricsFile=/nonexistent-cvslurm-dir/cvslurm.prom");
    let out = site.run(&["flush", "--no-reconcile"]);
    let err = stderr(&out);
    let line = err
        .lines()
        .find(|l| l.contains("MetricsFile"))
        .unwrap_or_else(|| panic!("{err}"));
    assert!(
        line.contains("directory /nonexistent-cvslurm-dir does not exist"),
        "{line}"
    );
}

#[test]
fn check_says_whether_slurm_user_can_write_the_metrics_directory() {
    use std::os::unix::fs::PermissionsExt;
    let cv = Standin::start();
    let (site, textfile, _metrics) = site_with_metrics(&cv, "");
    let dir = textfile.path();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::chown(dir, Some(0), Some(0)).unwrap();
    let slurm_conf = "ClusterName=c\nSlurmUser=nobody\n";
    let out = site.check_with_slurm_conf(slurm_conf);
    assert!(
        out.contains(&format!(
            "MetricsFile directory {} is not writable by SlurmUser nobody: run: chgrp",
            dir.display()
        )),
        "{out}"
    );
    std::os::unix::fs::chown(dir, Some(65534), None).unwrap();
    let out = site.check_with_slurm_conf(slurm_conf);
    assert!(
        out.contains(&format!(
            "MetricsFile directory {} is writable by SlurmUser nobody",
            dir.display()
        )),
        "{out}"
    );
}

/// The leadership the service records in service-status.json (`leader`, `leader_reason`,
/// `leader_since`) is in the metrics file, labelled with slurm.conf's ClusterName, and in
/// `status --json`; without a record, two SlurmctldHosts make it unknown and one makes this
/// host the leader.
#[test]
fn the_leadership_the_service_recorded_is_exported() {
    let cv = Standin::start();
    let (site, _textfile, metrics) = site_with_metrics(&cv, "");
    let slurm_conf = site.dir.path().join("slurm.conf.d");
    std::fs::create_dir(&slurm_conf).unwrap();
    std::fs::create_dir_all(&site.state_dir).unwrap();
    let two = slurm_conf.join("two.conf");
    std::fs::write(
        &two,
        "ClusterName=hpc1\nSlurmctldHost=ctl1\nSlurmctldHost=ctl2(10.0.0.2)\n",
    )
    .unwrap();
    let one = slurm_conf.join("one.conf");
    std::fs::write(&one, "ClusterName=hpc1\nSlurmctldHost=ctl1\n").unwrap();
    let status_file = site
        .state_dir
        .join(cvslurm::internals::state::layout::SERVICE_STATUS);
    let figures = |conf: &Path| -> (BTreeMap<String, f64>, Value) {
        let out = site.run_with_slurm_conf(conf, &["flush", "--no-reconcile"]);
        assert_exit_0(&out);
        let text = std::fs::read_to_string(&metrics).unwrap();
        check_metrics(&text);
        let out = site.run_with_slurm_conf(conf, &["status", "--json", "--offline"]);
        let st: Value = serde_json::from_slice(&out.stdout).unwrap();
        (samples(&text), st["metrics"]["leadership"].clone())
    };
    let series = |m: &BTreeMap<String, f64>, name: &str| {
        *m.get(&format!("cvslurm_{name}{{slurm_cluster=\"hpc1\"}}"))
            .unwrap_or_else(|| panic!("{name} missing: {m:?}"))
    };
    // The service recorded that this host leads (other fields of the record kept).
    std::fs::write(
        &status_file,
        r#"{"leader":true,"leader_reason":"ctl1 is in control","leader_since":1764600000,"counters":{"events_queued":2}}"#,
    )
    .unwrap();
    let (m, l) = figures(&two);
    assert_eq!(series(&m, "leader"), 1.0);
    assert_eq!(series(&m, "leader_known"), 1.0);
    assert_eq!(series(&m, "leader_since_timestamp_seconds"), 1764600000.0);
    assert_eq!(m["cvslurm_events_queued_total"], 2.0);
    assert_eq!(
        l,
        json!({"leader": true, "known": true, "since_timestamp_seconds": 1764600000i64,
               "reason": "ctl1 is in control", "controllers": 2, "slurm_cluster": "hpc1"})
    );
    // Standby.
    std::fs::write(
        &status_file,
        r#"{"leader":false,"leader_since":1764600100}"#,
    )
    .unwrap();
    let (m, l) = figures(&two);
    assert_eq!(series(&m, "leader"), 0.0);
    assert_eq!(series(&m, "leader_known"), 1.0);
    assert_eq!(l["since_timestamp_seconds"], 1764600100);
    // It cannot tell.
    std::fs::write(
        &status_file,
        r#"{"leader":null,"leader_reason":"heartbeat 400 s old"}"#,
    )
    .unwrap();
    let (m, l) = figures(&two);
    assert_eq!(series(&m, "leader"), 0.0);
    assert_eq!(series(&m, "leader_known"), 0.0);
    assert_eq!(l["reason"], "heartbeat 400 s old");
    // Nothing recorded: unknown with two controllers; the leader with one.
    std::fs::remove_file(&status_file).unwrap();
    let (m, l) = figures(&two);
    assert_eq!(series(&m, "leader_known"), 0.0);
    assert_eq!(series(&m, "leader"), 0.0);
    assert!(
        l["reason"]
            .as_str()
            .unwrap()
            .contains("has not recorded its leadership"),
        "{l}"
    );
    std::fs::remove_file(&status_file).ok();
    let (m, l) = figures(&one);
    assert_eq!(series(&m, "leader"), 1.0);
    assert_eq!(series(&m, "leader_known"), 1.0);
    assert_eq!(series(&m, "leader_since_timestamp_seconds"), 0.0);
    assert_eq!(l["controllers"], 1);
}

/// The shipped rules: valid, and each alert fires on the series that must fire it and not on
/// the others (packaging/prometheus/cvslurm-alerts.test.yml).
#[test]
fn the_alert_rules_fire_when_they_must_and_only_then() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/prometheus");
    for args in [
        ["check", "rules", "cvslurm-alerts.yml"],
        ["test", "rules", "cvslurm-alerts.test.yml"],
    ] {
        let out = promtool().args(args).current_dir(&dir).output().unwrap();
        assert!(
            out.status.success(),
            "promtool {args:?}: {}{}",
            stdout(&out),
            stderr(&out)
        );
    }
}
