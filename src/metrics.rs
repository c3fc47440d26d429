//! The metrics file (`MetricsFile=`): what cvslurm did, in Prometheus' text exposition format,
//! for node_exporter's textfile collector.
//!
//! The figures ([`Figures`]) come from one place, StateDir: the outbox (depth, oldest event,
//! `rejected/`) and `service-status.json` (times, counters kept across restarts, the
//! leadership the service recorded; see [`crate::state::status`]), with slurm.conf's
//! `SlurmctldHost` count and `ClusterName` for the leadership ([`Leadership`]). `cvslurm status --json` shows the same [`Figures`]. So every
//! writer (the service every `MetricsInterval` and at exit, `flush` and the one-shot
//! inventory at the end of their run) writes the whole picture of the StateDir into the same
//! file: there is no per-mode file and no `mode` label; the last writer's figures are the
//! newest.
//!
//! The file is replaced atomically: a temp file in the same directory (named `.<name>.tmp…`,
//! which node_exporter skips: it reads `*.prom` only), mode 0644, then a rename, which
//! replaces whatever the name held (a symlink there is replaced, never followed).

use crate::slurm::conf::{load_slurm_conf, slurm_conf_path, SlurmConf};
use crate::state::status::{counter, Histogram, ANSWER_CLASSES, LATENCY_BOUNDS};
use crate::state::StateDir;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs::{self, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The longest a label value read from StateDir may be.
const MAX_LABEL: usize = 64;

/// Nodes of the last inventory.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct InventoryNodes {
    /// Listed by Slurm.
    pub known: u64,
    /// Whose NodeConfig was sent (one-shot) or queued and not since failed (the service).
    pub sent: u64,
    /// Whose discovery or sending failed.
    pub failed: u64,
}

/// Every figure of the metrics file and of `cvslurm status --json` (its `metrics` object).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Figures {
    /// Events waiting in the outbox (`None`: the outbox cannot be read).
    pub outbox_events: Option<u64>,
    /// Queue time (Unix seconds) of the oldest waiting event; 0 when none waits.
    pub outbox_oldest_event_timestamp_seconds: Option<i64>,
    /// Events in `rejected/`.
    pub rejected_events: Option<u64>,
    /// `JobCompForward` documents waiting in the spool (0: none, or no spool).
    pub jobcomp_forward_spool_documents: u64,
    /// The counters of [`counter::ALL`], since StateDir was created.
    pub counters: BTreeMap<String, u64>,
    /// CloudVision's answers to deliveries, by class ([`ANSWER_CLASSES`]).
    pub http_responses: BTreeMap<String, u64>,
    /// Delivery latency, queued to delivered.
    pub delivery_latency_seconds: Histogram,
    /// The last delivery (Unix seconds; 0: never).
    pub last_delivery_timestamp_seconds: i64,
    /// The last inventory or service node poll (Unix seconds; 0: never).
    pub last_inventory_timestamp_seconds: i64,
    /// The last reconciliation with Slurm (Unix seconds; 0: never).
    pub last_reconcile_timestamp_seconds: i64,
    /// Nodes of the last inventory.
    pub inventory_nodes: InventoryNodes,
    /// The service listens on its wake-up socket.
    pub service_running: bool,
    /// `PollInterval`, for the "no inventory" alert.
    pub poll_interval_seconds: u64,
    /// This cvslurm's version.
    pub version: String,
    /// The Slurm version the service or the inventory detected (empty: not yet known).
    pub slurm_version: String,
    /// This host's part in the leadership of the cluster's controllers.
    pub leadership: Leadership,
}

/// This host's part in the leadership: which of the cluster's controllers' cvslurm services
/// does the cluster-wide work (inventory, reconciliation, deletions).
///
/// With two or more `SlurmctldHost`s the service records its judgement in
/// `service-status.json` each poll: `leader` (true, false, or null: it cannot tell),
/// `leader_reason`, `leader_since`. Without that record: with one controller (or a slurm.conf
/// that cannot be read) there is nothing to elect and this host leads (`leader` 1, known), so
/// every site exports the same series and "exactly one leader per cluster" holds everywhere;
/// with two or more the leadership is unknown (the service has not recorded it: not running,
/// or older than this cvslurm).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Leadership {
    /// This host's cvslurm leads (false: standby, or unknown).
    pub leader: bool,
    /// Whether it can be told (false: `leader` is false and `reason` says why).
    pub known: bool,
    /// Since when (Unix seconds) this host holds its part, as the service recorded it; 0:
    /// not recorded (one controller, or unknown).
    pub since_timestamp_seconds: i64,
    /// Why, as the service recorded it (one line), or why it is unknown; empty: one controller.
    pub reason: String,
    /// `SlurmctldHost`s in slurm.conf (`None`: slurm.conf cannot be read).
    pub controllers: Option<u64>,
    /// `ClusterName` in slurm.conf (the `slurm_cluster` label); empty: not known.
    pub slurm_cluster: String,
}

impl Leadership {
    /// The leadership as `status` (`service-status.json`) records it, with `conf` the
    /// cluster's slurm.conf (`None`: unreadable). `status` is hostile: a `leader` that is not
    /// true, false or null is unknown.
    pub fn from_status(status: &serde_json::Value, conf: Option<&SlurmConf>) -> Leadership {
        let controllers = conf.map(|c| crate::slurm::leader::controllers(c).len() as u64);
        let slurm_cluster = conf
            .and_then(|c| c.last("ClusterName"))
            .map(|s| s.value.chars().take(MAX_LABEL).collect())
            .unwrap_or_default();
        let reason = status["leader_reason"]
            .as_str()
            .map(|r| crate::text::one_line(r, 300))
            .unwrap_or_default();
        let since = status["leader_since"]
            .as_i64()
            .filter(|t| *t >= 0)
            .unwrap_or(0);
        let (leader, known, since, reason) = match status.get("leader") {
            Some(serde_json::Value::Bool(b)) => (*b, true, since, reason),
            Some(serde_json::Value::Null) => (false, false, since, reason),
            Some(_) => (
                false,
                false,
                0,
                "service-status.json: leader is not true, false or null".to_string(),
            ),
            None if controllers.is_some_and(|n| n >= 2) => (
                false,
                false,
                0,
                "the service has not recorded its leadership (not running, or older than this \
                 cvslurm)"
                    .to_string(),
            ),
            None => (true, true, 0, String::new()),
        };
        Leadership {
            leader,
            known,
            since_timestamp_seconds: since,
            reason,
            controllers,
            slurm_cluster,
        }
    }
}

impl Figures {
    /// The figures of `outbox` now; `poll_interval` is the configured `PollInterval`. The
    /// outbox's depth and oldest age are listed unless `known_depth` gives them
    /// (`Queue::depth`'s answer already had, or the service's index: at a million events a
    /// listing takes seconds).
    pub fn gather_with(
        outbox: &StateDir,
        poll_interval: Duration,
        known_depth: Option<(usize, Option<i64>)>,
    ) -> Figures {
        let readable = std::fs::read_dir(outbox.root()).is_ok();
        let (depth, oldest_age) = match known_depth {
            _ if !readable => (None, None),
            Some((d, o)) => (Some(d as u64), o),
            None => {
                let (d, o) = outbox.queue.depth();
                (Some(d as u64), o)
            }
        };
        let now = crate::timefmt::now_epoch();
        let v = outbox.status.read().unwrap_or_default();
        let int = |k: &str| v[k].as_i64().filter(|t| *t >= 0).unwrap_or(0);
        let n = |x: &serde_json::Value| x.as_u64().unwrap_or(0);
        let label = |x: &serde_json::Value| {
            x.as_str()
                .map(|s| s.chars().take(MAX_LABEL).collect())
                .unwrap_or_default()
        };
        Figures {
            outbox_events: depth,
            outbox_oldest_event_timestamp_seconds: depth
                .map(|_| oldest_age.map_or(0, |age| now - age)),
            rejected_events: depth.map(|_| outbox.queue.rejected_count() as u64),
            jobcomp_forward_spool_documents: crate::service::forward::depth(outbox.root())
                .unwrap_or(0),
            counters: counter::ALL
                .iter()
                .map(|c| (c.to_string(), n(&v["counters"][*c])))
                .collect(),
            http_responses: ANSWER_CLASSES
                .iter()
                .map(|c| (c.to_string(), n(&v["answers"][*c])))
                .collect(),
            delivery_latency_seconds: Histogram::from_value(&v["latency"]),
            last_delivery_timestamp_seconds: int("last_delivery"),
            last_inventory_timestamp_seconds: int("last_inventory"),
            last_reconcile_timestamp_seconds: int("last_reconcile"),
            inventory_nodes: InventoryNodes {
                known: n(&v["inventory"]["known"]),
                sent: n(&v["inventory"]["sent"]),
                failed: n(&v["inventory"]["failed"]),
            },
            service_running: crate::state::wake::connect(outbox.root()).is_some(),
            poll_interval_seconds: poll_interval.as_secs(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            slurm_version: label(&v["slurm_version"]),
            leadership: Leadership::from_status(
                &v,
                load_slurm_conf(&slurm_conf_path()).ok().as_ref(),
            ),
        }
    }

    /// The figures in Prometheus' text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let mut family = |name: &str, kind: &str, help: &str, samples: &[(String, String)]| {
            let _ = writeln!(out, "# HELP cvslurm_{name} {help}");
            let _ = writeln!(out, "# TYPE cvslurm_{name} {kind}");
            for (series, value) in samples {
                let _ = writeln!(out, "cvslurm_{series} {value}");
            }
        };
        let plain = |name: &str, value: String| vec![(name.to_string(), value)];
        let opt = |v: Option<i64>| v.map_or("NaN".to_string(), |v| v.to_string());
        family(
            "outbox_events",
            "gauge",
            "Events waiting in the outbox to be sent to CloudVision (NaN: the outbox cannot be read).",
            &plain("outbox_events", opt(self.outbox_events.map(|d| d as i64))),
        );
        family(
            "outbox_oldest_event_timestamp_seconds",
            "gauge",
            "Queue time of the oldest waiting event (0: none waits).",
            &plain(
                "outbox_oldest_event_timestamp_seconds",
                opt(self.outbox_oldest_event_timestamp_seconds),
            ),
        );
        family(
            "rejected_events",
            "gauge",
            "Events CloudVision refused, kept in StateDir/rejected.",
            &plain(
                "rejected_events",
                opt(self.rejected_events.map(|d| d as i64)),
            ),
        );
        family(
            "jobcomp_forward_spool_documents",
            "gauge",
            "JobCompForward documents waiting in the spool for the site's Elasticsearch.",
            &plain(
                "jobcomp_forward_spool_documents",
                self.jobcomp_forward_spool_documents.to_string(),
            ),
        );
        for (name, help) in [
            (counter::QUEUED, "Events written to the outbox."),
            (counter::DELIVERED, "Events CloudVision took."),
            (
                counter::RETRIED,
                "Deliveries that failed in a way that may pass (kept for a later try).",
            ),
            (
                counter::REJECTED,
                "Events CloudVision refused for good (4xx), moved to rejected/.",
            ),
            (
                counter::DROPPED,
                "Events dropped because the outbox was over OutboxMaxEvents.",
            ),
            (
                counter::LOST,
                "Events a hook could neither queue in StateDir nor send.",
            ),
            (
                counter::HOOK_DIRECT_SENDS,
                "Hooks that sent their event themselves (the service was not running).",
            ),
            (
                counter::JOBCOMP_FORWARD_DROPPED,
                "JobCompForward documents not forwarded (spool full, not writable, or refused for good).",
            ),
        ] {
            let total = format!("{name}_total");
            family(
                &total,
                "counter",
                help,
                &plain(
                    &total,
                    self.counters.get(name).copied().unwrap_or(0).to_string(),
                ),
            );
        }
        family(
            "http_responses_total",
            "counter",
            "CloudVision's answers to deliveries by class (none: no answer).",
            &self
                .http_responses
                .iter()
                .map(|(class, n)| {
                    (
                        format!("http_responses_total{{class=\"{class}\"}}"),
                        n.to_string(),
                    )
                })
                .collect::<Vec<_>>(),
        );
        let h = &self.delivery_latency_seconds;
        let mut samples = Vec::new();
        let mut cumulative = 0;
        for (i, bound) in LATENCY_BOUNDS.iter().enumerate() {
            cumulative += h.buckets.get(i).copied().unwrap_or(0);
            samples.push((
                format!("delivery_latency_seconds_bucket{{le=\"{bound}\"}}"),
                cumulative.to_string(),
            ));
        }
        samples.push((
            "delivery_latency_seconds_bucket{le=\"+Inf\"}".into(),
            h.count.to_string(),
        ));
        samples.push(("delivery_latency_seconds_sum".into(), h.sum.to_string()));
        samples.push(("delivery_latency_seconds_count".into(), h.count.to_string()));
        family(
            "delivery_latency_seconds",
            "histogram",
            "Time from an event's queueing to its delivery.",
            &samples,
        );
        for (name, v, help) in [
            (
                "last_delivery_timestamp_seconds",
                self.last_delivery_timestamp_seconds,
                "Time of the last delivery (0: never).",
            ),
            (
                "last_inventory_timestamp_seconds",
                self.last_inventory_timestamp_seconds,
                "Time of the last inventory or service node poll (0: never).",
            ),
            (
                "last_reconcile_timestamp_seconds",
                self.last_reconcile_timestamp_seconds,
                "Time of the last reconciliation with Slurm (0: never).",
            ),
        ] {
            family(name, "gauge", help, &plain(name, v.to_string()));
        }
        let nodes = &self.inventory_nodes;
        family(
            "inventory_nodes",
            "gauge",
            "Nodes of the last inventory: listed by Slurm (known), sent, failed.",
            &[
                ("known", nodes.known),
                ("sent", nodes.sent),
                ("failed", nodes.failed),
            ]
            .iter()
            .map(|(s, n)| (format!("inventory_nodes{{state=\"{s}\"}}"), n.to_string()))
            .collect::<Vec<_>>(),
        );
        family(
            "service_running",
            "gauge",
            "1 when the cvslurm service listens for the hooks' events.",
            &plain(
                "service_running",
                u8::from(self.service_running).to_string(),
            ),
        );
        family(
            "poll_interval_seconds",
            "gauge",
            "PollInterval: how often the service polls the nodes.",
            &plain(
                "poll_interval_seconds",
                self.poll_interval_seconds.to_string(),
            ),
        );
        let l = &self.leadership;
        let cluster = format!("{{slurm_cluster=\"{}\"}}", label_value(&l.slurm_cluster));
        for (name, v, help) in [
            (
                "leader",
                i64::from(l.leader),
                "1 when this host's cvslurm does the cluster's inventory and reconciliation \
                 (with one controller: always); 0: standby, or unknown.",
            ),
            (
                "leader_known",
                i64::from(l.known),
                "0 when this host's cvslurm cannot tell whether it leads (cvslurm status says why).",
            ),
            (
                "leader_since_timestamp_seconds",
                l.since_timestamp_seconds,
                "Since when this host leads or stands by (0: not recorded).",
            ),
        ] {
            family(name, "gauge", help, &plain(&format!("{name}{cluster}"), v.to_string()));
        }
        family(
            "build_info",
            "gauge",
            "cvslurm's version and the Slurm version detected, as labels; always 1.",
            &plain(
                &format!(
                    "build_info{{version=\"{}\",slurm_version=\"{}\"}}",
                    label_value(&self.version),
                    label_value(&self.slurm_version)
                ),
                "1".into(),
            ),
        );
        out
    }
}

/// A label value escaped as the exposition format wants (`\`, `"`, newline), other control
/// characters dropped (the value may come from StateDir, which is hostile).
fn label_value(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c if c.is_control() => {}
            c => s.push(c),
        }
    }
    s
}

/// Replaces `path` with `text` atomically: a temp file beside it (mode 0644, never through a
/// link), then a rename.
pub fn write_file(path: &Path, text: &str) -> Result<(), String> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    let name = path
        .file_name()
        .ok_or_else(|| format!("MetricsFile {}: not a file name", path.display()))?
        .to_string_lossy();
    let tmp = dir.join(format!(".{name}.tmp{}", std::process::id()));
    let what = |e: std::io::Error| format!("cannot write MetricsFile {}: {e}", path.display());
    // One of this process's earlier tries, killed mid-write (never followed: removing a
    // link removes the link).
    let _ = fs::remove_file(&tmp);
    let res = (|| {
        let mut f = OpenOptions::new()
            .create_new(true)
            .write(true)
            .mode(0o644)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&tmp)?;
        // The umask may have narrowed the mode: node_exporter runs as its own user.
        f.set_permissions(fs::Permissions::from_mode(0o644))?;
        f.write_all(text.as_bytes())?;
        fs::rename(&tmp, path)
    })();
    if let Err(e) = res {
        let _ = fs::remove_file(&tmp);
        return Err(what(e));
    }
    Ok(())
}

/// Writes the metrics file of `outbox` when `MetricsFile` is set; a failure is logged.
pub fn publish(metrics_file: Option<&Path>, outbox: &StateDir, poll_interval: Duration) {
    publish_with(metrics_file, outbox, poll_interval, None);
}

/// [`publish`], the outbox's depth and oldest age given when known (the service's index).
pub fn publish_with(
    metrics_file: Option<&Path>,
    outbox: &StateDir,
    poll_interval: Duration,
    known_depth: Option<(usize, Option<i64>)>,
) {
    let Some(path) = metrics_file else {
        return;
    };
    let text = Figures::gather_with(outbox, poll_interval, known_depth).render();
    if let Err(e) = write_file(path, &text) {
        log::warn!(
            "{e}; make its directory writable by the user cvslurm runs as (SlurmUser for the \
             service), or unset MetricsFile"
        );
    }
}

/// The service's metrics writer: a thread that writes the file now, then every `every`
/// (`MetricsInterval`) until `stop` is set (the service writes it once more at exit). The
/// outbox's depth comes from `depth` (the sender's index) when it knows it, else from a
/// listing.
pub fn spawn_writer(
    metrics_file: Option<&Path>,
    outbox: &StateDir,
    poll_interval: Duration,
    every: Duration,
    stop: &'static AtomicBool,
    depth: impl Fn() -> Option<(usize, Option<i64>)> + Send + 'static,
) -> Option<std::thread::JoinHandle<()>> {
    let path = metrics_file?.to_path_buf();
    let outbox = outbox.clone();
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                publish_with(Some(&path), &outbox, poll_interval, depth());
                let until = Instant::now() + every;
                while Instant::now() < until && !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        })
        .map_err(|e| log::error!("cannot start the metrics writer: {e}"))
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("cvslurm-metrics-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn every_series_is_there_from_the_start() {
        let d = tmpdir("empty");
        let sd = StateDir::new(&d);
        let text = Figures::gather_with(&sd, Duration::from_secs(60), None).render();
        for line in [
            "cvslurm_outbox_events 0",
            "cvslurm_outbox_oldest_event_timestamp_seconds 0",
            "cvslurm_events_queued_total 0",
            "cvslurm_events_delivered_total 0",
            "cvslurm_events_retried_total 0",
            "cvslurm_events_rejected_total 0",
            "cvslurm_events_dropped_total 0",
            "cvslurm_events_lost_total 0",
            "cvslurm_hook_direct_sends_total 0",
            "cvslurm_jobcomp_forward_dropped_total 0",
            "cvslurm_jobcomp_forward_spool_documents 0",
            "cvslurm_http_responses_total{class=\"2xx\"} 0",
            "cvslurm_http_responses_total{class=\"none\"} 0",
            "cvslurm_delivery_latency_seconds_bucket{le=\"+Inf\"} 0",
            "cvslurm_delivery_latency_seconds_count 0",
            "cvslurm_last_delivery_timestamp_seconds 0",
            "cvslurm_inventory_nodes{state=\"failed\"} 0",
            "cvslurm_service_running 0",
            "cvslurm_poll_interval_seconds 60",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
        }
        fs::remove_dir_all(&d).unwrap();
    }

    fn conf(text: &str) -> SlurmConf {
        let text = text.to_string();
        crate::slurm::conf::parse_slurm_conf(
            Path::new("/etc/slurm/slurm.conf"),
            &move |_| Ok(text.clone()),
            &|_| Vec::new(),
        )
        .unwrap()
    }

    #[test]
    fn leadership_as_the_service_records_it() {
        use serde_json::json;
        let two = conf("ClusterName=c1\nSlurmctldHost=ctl1\nSlurmctldHost=ctl2(10.0.0.2)\n");
        let one = conf("ClusterName=c1\nSlurmctldHost=ctl1\n");
        let l = Leadership::from_status(
            &json!({"leader": true, "leader_reason": "in control\nnow", "leader_since": 1700}),
            Some(&two),
        );
        assert_eq!(
            (
                l.leader,
                l.known,
                l.since_timestamp_seconds,
                l.reason.as_str()
            ),
            (true, true, 1700, "in control now")
        );
        assert_eq!((l.controllers, l.slurm_cluster.as_str()), (Some(2), "c1"));
        let l = Leadership::from_status(&json!({"leader": false, "leader_since": 5}), Some(&two));
        assert_eq!(
            (l.leader, l.known, l.since_timestamp_seconds),
            (false, true, 5)
        );
        let l = Leadership::from_status(
            &json!({"leader": null, "leader_reason": "heartbeat stale"}),
            Some(&two),
        );
        assert_eq!(
            (l.leader, l.known, l.reason.as_str()),
            (false, false, "heartbeat stale")
        );
        // Nothing recorded: unknown with two controllers, the leader with one (or none known).
        let l = Leadership::from_status(&json!({}), Some(&two));
        assert_eq!((l.leader, l.known), (false, false));
        assert!(l.reason.contains("has not recorded"), "{}", l.reason);
        for c in [Some(&one), None] {
            let l = Leadership::from_status(&json!({}), c);
            assert_eq!(
                (l.leader, l.known, l.since_timestamp_seconds),
                (true, true, 0)
            );
        }
        // Hostile values.
        for bad in [
            json!({"leader": "yes"}),
            json!({"leader": 1, "leader_since": 9}),
        ] {
            let l = Leadership::from_status(&bad, Some(&one));
            assert_eq!(
                (l.leader, l.known, l.since_timestamp_seconds),
                (false, false, 0)
            );
        }
        let l = Leadership::from_status(&json!({"leader": true, "leader_since": -4}), Some(&one));
        assert_eq!(l.since_timestamp_seconds, 0);
    }

    #[test]
    fn leadership_series_carry_the_cluster() {
        let d = tmpdir("leader");
        let mut f = Figures::gather_with(&StateDir::new(&d), Duration::from_secs(60), None);
        f.leadership = Leadership::from_status(
            &serde_json::json!({"leader": false, "leader_since": 42}),
            Some(&conf(
                "ClusterName=a\"b\nSlurmctldHost=x\nSlurmctldHost=y\n",
            )),
        );
        let text = f.render();
        for line in [
            "cvslurm_leader{slurm_cluster=\"a\\\"b\"} 0",
            "cvslurm_leader_known{slurm_cluster=\"a\\\"b\"} 1",
            "cvslurm_leader_since_timestamp_seconds{slurm_cluster=\"a\\\"b\"} 42",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
        }
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn hostile_labels_are_escaped() {
        assert_eq!(label_value("a\"b\\c\nd\u{1b}e"), "a\\\"b\\\\c\\nde");
    }

    #[test]
    fn the_file_replaces_a_symlink_never_follows_it() {
        let d = tmpdir("link");
        let victim = d.join("victim");
        fs::write(&victim, "keep").unwrap();
        let p = d.join("cvslurm.prom");
        std::os::unix::fs::symlink(&victim, &p).unwrap();
        write_file(&p, "x 1\n").unwrap();
        assert_eq!(fs::read_to_string(&victim).unwrap(), "keep");
        assert_eq!(fs::read_to_string(&p).unwrap(), "x 1\n");
        let m = fs::symlink_metadata(&p).unwrap();
        assert!(m.file_type().is_file());
        assert_eq!(m.permissions().mode() & 0o777, 0o644);
        assert_eq!(fs::read_dir(&d).unwrap().count(), 2, "no temp file left");
        fs::remove_dir_all(&d).unwrap();
    }
}
