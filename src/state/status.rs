//! Service status: `service-status.json`, the one record of what cvslurm did, for
//! `cvslurm status` and the metrics file ([`crate::metrics`]): the times of the last
//! delivery, error, drain, inventory and reconciliation (Unix seconds), the last inventory's
//! node counts, the Slurm version detected, and counters kept across restarts (events queued,
//! delivered, retried, rejected, dropped, lost; hooks that sent their event themselves; the
//! HTTP answers by class; the delivery latency histogram).
//!
//! Several processes write it (the service or `flush`, the inventory): each
//! read-change-write holds `service-status.lock`. A report, not an event: not fsynced. The
//! counters are added without that lock, through the counter journal
//! ([`super::counter_journal`]), which each read-change-write folds in: a hook (on
//! slurmctld's critical path) never waits for a figure, nor makes another hook wait.

use super::counter_journal::{add, CounterJournal};
use super::durable;
use super::layout::{SERVICE_STATUS, SERVICE_STATUS_LOCK};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The longest a writer waits for `service-status.lock`.
pub const LOCK_WAIT: Duration = Duration::from_millis(100);

pub use super::counter_journal::counter;

/// The classes of CloudVision's answers to deliveries: `none` is no answer (unreachable,
/// timeout, caught before sending, no server configured).
pub const ANSWER_CLASSES: [&str; 4] = ["2xx", "4xx", "5xx", "none"];

/// The upper bounds (seconds) of the delivery latency histogram's buckets: from queued to
/// delivered, which an outage stretches to hours.
pub const LATENCY_BOUNDS: [f64; 10] = [
    0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 21600.0,
];

/// What a drain pass did, for [`ServiceStatus::record_drain`].
#[derive(Debug, Clone, Default)]
pub struct Drained<'a> {
    /// Events delivered.
    pub delivered: u64,
    /// Events kept for a later try after a failed delivery.
    pub retried: u64,
    /// Events rejected.
    pub rejected: u64,
    /// Answers by class, as [`ANSWER_CLASSES`].
    pub answers: [u64; 4],
    /// Latency (queued to delivered) of each delivered event, in seconds.
    pub latencies: &'a [f64],
    /// The last error.
    pub last_error: Option<&'a str>,
}

/// The service status file of one state directory.
#[derive(Debug, Clone)]
pub struct ServiceStatus {
    path: PathBuf,
    lock: PathBuf,
    owner: Option<(u32, u32)>,
    journal: CounterJournal,
}

impl ServiceStatus {
    /// The status file under `root`, written for `owner`.
    pub(super) fn new(root: &Path, owner: Option<(u32, u32)>) -> ServiceStatus {
        ServiceStatus {
            path: root.join(SERVICE_STATUS),
            lock: root.join(SERVICE_STATUS_LOCK),
            owner,
            journal: CounterJournal::new(root, owner),
        }
    }

    /// Reads, changes with `f` and writes the record under its lock. Fails (logged at debug)
    /// when StateDir cannot be written or the lock is not had within [`LOCK_WAIT`].
    fn update(&self, f: impl FnOnce(&mut Value)) -> bool {
        let _lock =
            match durable::lock_file(&self.lock, self.owner, Some(Instant::now() + LOCK_WAIT)) {
                Ok(l) => l,
                Err(e) => {
                    log::debug!("status: not recorded: {e}");
                    return false;
                }
            };
        let mut v = self
            .read_file()
            .filter(Value::is_object)
            .unwrap_or_else(|| json!({}));
        self.journal.fold(&mut v, true, crate::timefmt::now_epoch());
        f(&mut v);
        match serde_json::to_vec(&v) {
            Ok(bytes) => match durable::replace(&self.path, &bytes, self.owner) {
                Ok(()) => true,
                Err(e) => {
                    log::debug!("status: not recorded: {e}");
                    false
                }
            },
            Err(_) => false,
        }
    }

    /// Adds `n` to counter `name` (one of [`counter::ALL`]): appended to the counter
    /// journal, without a lock (a hook calls it).
    pub fn count(&self, name: &str, n: u64) {
        if n == 0 {
            return;
        }
        debug_assert!(counter::ALL.contains(&name), "{name}");
        if let Err(e) = self.journal.append(name, n) {
            log::warn!("status: counter {name} (+{n}) not recorded: {e}");
        }
    }

    /// Records a drain pass: its counters, the last delivery and the last error (on one
    /// line, capped), with their times.
    pub fn record_drain(&self, d: &Drained) {
        let now = crate::timefmt::now_epoch();
        self.update(|v| {
            if d.delivered > 0 {
                v["last_delivery"] = now.into();
            }
            if let Some(e) = d.last_error {
                // One line, capped: `status` shows it (and escapes it again, as it must
                // anything read from StateDir).
                v["last_error"] = crate::text::one_line(e, 1000).into();
                v["last_error_at"] = now.into();
            }
            v["last_drain"] = now.into();
            add(v, counter::DELIVERED, d.delivered);
            add(v, counter::RETRIED, d.retried);
            add(v, counter::REJECTED, d.rejected);
            for (class, n) in ANSWER_CLASSES.iter().zip(d.answers) {
                let a = &mut v["answers"];
                if !a.is_object() {
                    *a = json!({});
                }
                a[*class] = (a[*class].as_u64().unwrap_or(0) + n).into();
            }
            if !d.latencies.is_empty() {
                let mut h = Histogram::from_value(&v["latency"]);
                for l in d.latencies {
                    h.observe(*l);
                }
                v["latency"] = h.to_value();
            }
        });
    }

    /// Records an inventory: its time and the nodes it knew (listed by Slurm), sent (their
    /// NodeConfig sent or queued) and failed (discovery or sending).
    pub fn record_inventory(&self, known: u64, sent: u64, failed: u64) {
        let now = crate::timefmt::now_epoch();
        self.update(|v| {
            v["last_inventory"] = now.into();
            v["inventory"] = json!({"known": known, "sent": sent, "failed": failed});
        });
    }

    /// Records a reconciliation with Slurm that could ask Slurm.
    pub fn record_reconcile(&self) {
        let now = crate::timefmt::now_epoch();
        self.update(|v| v["last_reconcile"] = now.into());
    }

    /// Records the outbox as the service's index knows it (`events`, the oldest queue time),
    /// for `status`, which otherwise lists the outbox (seconds at a million events).
    pub fn record_outbox(&self, events: usize, oldest: Option<i64>) {
        let now = crate::timefmt::now_epoch();
        self.update(|v| {
            v["outbox"] = json!({"events": events, "oldest": oldest, "at": now});
        });
    }

    /// The outbox as the service recorded it at most `max_age_s` seconds ago: (events, the
    /// oldest queue time). The file is SlurmUser's: a record of the wrong shape, or from the
    /// future, is none.
    pub fn recorded_outbox(&self, max_age_s: i64) -> Option<(usize, Option<i64>)> {
        let v = self.read_file()?;
        let o = &v["outbox"];
        let at = o["at"].as_i64()?;
        let now = crate::timefmt::now_epoch();
        if at > now || now - at > max_age_s {
            return None;
        }
        let events = usize::try_from(o["events"].as_u64()?).ok()?;
        let oldest = match &o["oldest"] {
            Value::Null => None,
            t => Some(t.as_i64().filter(|t| *t <= now)?),
        };
        if (events == 0) != oldest.is_none() {
            return None;
        }
        Some((events, oldest))
    }

    /// Records the Slurm version detected.
    pub fn record_slurm_version(&self, version: &str) {
        self.update(|v| v["slurm_version"] = version.into());
    }

    /// Records a bound reached or a question Slurm could not answer for its size (a listing
    /// past the runner's output bound, ids left for the next pass): `last_slurm_warning` and
    /// its time, for `status`.
    pub fn record_slurm_warning(&self, warning: &str) {
        let now = crate::timefmt::now_epoch();
        self.update(|v| {
            v["last_slurm_warning"] = crate::text::one_line(warning, 1000).into();
            v["last_slurm_warning_at"] = now.into();
        });
    }

    /// Records this host's role among the controllers (the service, every poll): `leader`
    /// true (this host leads), false (another controller is in control) or null (cannot
    /// tell), `leader_reason` (one line), `leader_since` (Unix time of the last change) and
    /// `leader_at` (this record's time, for its age).
    pub fn record_leadership(&self, leader: Option<bool>, reason: &str, since: i64) {
        let now = crate::timefmt::now_epoch();
        self.update(|v| {
            v["leader"] = leader.map_or(Value::Null, Value::from);
            v["leader_reason"] = crate::text::one_line(reason, 1000).into();
            v["leader_since"] = since.into();
            v["leader_at"] = now.into();
        });
    }

    /// What was recorded, if anything, with the counter additions not folded in yet.
    pub fn read(&self) -> Option<Value> {
        let mut v = self.read_file();
        if let Some(v) = v.as_mut().filter(|v| v.is_object()) {
            self.journal.fold(v, false, 0);
            if let Some(o) = v.as_object_mut() {
                o.remove("journal");
            }
        } else {
            // Counters added before the service first wrote the file.
            let mut fresh = json!({});
            self.journal.fold(&mut fresh, false, 0);
            if fresh.get("counters").is_some() {
                v = Some(fresh);
            }
        }
        v
    }

    /// The file as written.
    fn read_file(&self) -> Option<Value> {
        durable::read_file(&self.path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
    }
}

/// The delivery latency histogram: a count per bucket of [`LATENCY_BOUNDS`] (not cumulative,
/// the last one past the last bound), their sum and count.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Histogram {
    /// Per bucket (one more than [`LATENCY_BOUNDS`]: the last is above every bound).
    pub buckets: Vec<u64>,
    /// Sum of the observations, in seconds.
    pub sum: f64,
    /// How many observations.
    pub count: u64,
}

impl Histogram {
    /// The histogram `v` holds: one that does not have the expected shape (a file in StateDir
    /// is hostile) starts over from zero.
    pub fn from_value(v: &Value) -> Histogram {
        let empty = Histogram {
            buckets: vec![0; LATENCY_BOUNDS.len() + 1],
            sum: 0.0,
            count: 0,
        };
        let Some(b) = v["buckets"].as_array() else {
            return empty;
        };
        let buckets: Option<Vec<u64>> = b.iter().map(Value::as_u64).collect();
        match (buckets, v["sum"].as_f64(), v["count"].as_u64()) {
            (Some(buckets), Some(sum), Some(count))
                if buckets.len() == LATENCY_BOUNDS.len() + 1
                    && sum.is_finite()
                    && sum >= 0.0
                    && buckets.iter().try_fold(0u64, |a, b| a.checked_add(*b)) == Some(count) =>
            {
                Histogram {
                    buckets,
                    sum,
                    count,
                }
            }
            _ => empty,
        }
    }

    /// Counts one observation (seconds; a negative one, a clock set back, counts as 0).
    pub fn observe(&mut self, secs: f64) {
        let secs = if secs.is_finite() { secs.max(0.0) } else { 0.0 };
        let i = LATENCY_BOUNDS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(LATENCY_BOUNDS.len());
        self.buckets[i] += 1;
        self.sum += secs;
        self.count += 1;
    }

    fn to_value(&self) -> Value {
        json!({"buckets": self.buckets, "sum": self.sum, "count": self.count})
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::StateDir;

    #[test]
    fn drains_are_recorded() {
        let d = std::env::temp_dir().join(format!("cvslurm-status-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let status = StateDir::new(&d).status;
        assert_eq!(status.read(), None);
        status.record_drain(&Drained {
            retried: 1,
            answers: [0, 0, 1, 0],
            last_error: Some("HTTP 503"),
            ..Drained::default()
        });
        status.record_drain(&Drained {
            delivered: 2,
            answers: [2, 0, 0, 0],
            latencies: &[0.05, 7200.0],
            ..Drained::default()
        });
        status.count(counter::DROPPED, 3);
        let v = status.read().unwrap();
        assert!(v["last_delivery"].as_i64().is_some());
        assert_eq!(v["last_error"], "HTTP 503");
        assert!(v["last_drain"].as_i64() >= v["last_error_at"].as_i64());
        assert_eq!(v["counters"]["events_delivered"], 2);
        assert_eq!(v["counters"]["events_retried"], 1);
        assert_eq!(v["counters"]["events_dropped"], 3);
        assert_eq!(v["answers"]["2xx"], 2);
        assert_eq!(v["answers"]["5xx"], 1);
        let h = Histogram::from_value(&v["latency"]);
        assert_eq!(h.count, 2);
        assert_eq!(h.buckets[0], 1);
        assert_eq!(h.buckets[LATENCY_BOUNDS.len() - 1], 1);
        status.record_slurm_warning("slurmctld (by job id): 70 jobs\nto ask about");
        let v = status.read().unwrap();
        assert_eq!(v["last_error"], "HTTP 503");
        assert!(v["last_slurm_warning"]
            .as_str()
            .unwrap()
            .starts_with("slurmctld (by job id): 70 jobs"));
        assert!(!v["last_slurm_warning"].as_str().unwrap().contains('\n'));
        assert!(v["last_slurm_warning_at"].as_i64().is_some());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn the_services_outbox_count_is_taken_only_fresh_and_well_formed() {
        let d = std::env::temp_dir().join(format!("cvslurm-outboxrec-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let status = StateDir::new(&d).status;
        assert_eq!(status.recorded_outbox(15), None);
        let now = crate::timefmt::now_epoch();
        status.record_outbox(3, Some(now - 100));
        assert_eq!(status.recorded_outbox(15), Some((3, Some(now - 100))));
        status.record_outbox(0, None);
        assert_eq!(status.recorded_outbox(15), Some((0, None)));
        let path = d.join(crate::state::layout::SERVICE_STATUS);
        for (bad, why) in [
            (
                json!({"events": 3, "oldest": now - 5, "at": now - 16}),
                "too old",
            ),
            (
                json!({"events": 3, "oldest": now - 5, "at": now + 60}),
                "from the future",
            ),
            (
                json!({"events": 3, "oldest": now + 60, "at": now}),
                "an event from the future",
            ),
            (
                json!({"events": 3, "oldest": null, "at": now}),
                "events without an oldest",
            ),
            (
                json!({"events": 0, "oldest": now, "at": now}),
                "an oldest without events",
            ),
            (json!({"events": -1, "oldest": now, "at": now}), "negative"),
            (
                json!({"events": "3", "oldest": now, "at": now}),
                "not a number",
            ),
        ] {
            std::fs::write(&path, json!({"outbox": bad}).to_string()).unwrap();
            assert_eq!(status.recorded_outbox(15), None, "{why}");
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_histogram_of_the_wrong_shape_starts_over() {
        for bad in [
            json!({"buckets": [1, 2], "sum": 1.0, "count": 3}),
            json!({"buckets": [0,0,0,0,0,0,0,0,0,0,5], "sum": 1.0, "count": 4}),
            json!({"buckets": [0,0,0,0,0,0,0,0,0,0,5], "sum": -1.0, "count": 5}),
            json!("x"),
        ] {
            assert_eq!(Histogram::from_value(&bad).count, 0, "{bad}");
        }
    }
}
