//! The new leader's catch-up on a Slurm HA pair: the ends the controller that led before may
//! not have sent.
//!
//! Each controller's hooks queue their events in that host's own StateDir. A controller that
//! crashed or lost its power keeps what it had not sent yet until it comes back (then checked
//! against Slurm before it goes out, [`super::engine`]). So that those jobs' ends are not late
//! meanwhile, a host that becomes leader on a pair asks Slurm for the jobs that ended since
//! [`CATCH_UP_WINDOW`] before it took over — slurmctld (which holds an ended job for
//! `MinJobAge`) and accounting for those it no longer holds (`sacct --state …`, one bounded
//! call: [`crate::slurm::sacct_ended_within`]) — and sends each one's end from Slurm's
//! record, at every reconciliation pass for [`CATCH_UP_FOR`] after it took over (accounting
//! can record a job late, or not at all: measured on 22.05 and 26.05 after a takeover).
//!
//! It runs only on a real change of controller: when this host, before it led, last saw
//! another controller in control (or cannot know: StateDir's
//! [`LAST_IN_CONTROL`](super::leadership::LAST_IN_CONTROL) missing), never at a restart of
//! the leader's own service ([`super::leadership::Leadership::took_over`]). It never sends an
//! end this host delivered itself: those are recorded in StateDir
//! ([`crate::state::ends_sent`]), so a restart does not forget them.
//!
//! Ends only: a RUNNING sent now could reach CloudVision after the end the other controller
//! sent (the running jobs are found by reconciliation's sweep as "no hook reported it"). An
//! end is sent again only when this host has not queued or delivered it itself, and never
//! for a job slurmctld holds as not ended (requeued, running again: its hooks report it).
//! Sending an end CloudVision already has is harmless (a Set of the same fields).

use crate::cloudvision::payload::JobState;
use crate::config::Config;
use crate::slurm::runner::Slurm;
use crate::slurm::{JobInfo, COMMAND_TIMEOUT};
use crate::state::queue::{Event, Item};
use crate::state::StateDir;
use std::collections::HashSet;
use std::time::{Duration, Instant};

/// How far before the takeover the catch-up looks: jobs that ended since then.
pub const CATCH_UP_WINDOW: Duration = Duration::from_secs(600);
/// How long after the takeover the catch-up is repeated (at each reconciliation pass).
pub const CATCH_UP_FOR: Duration = Duration::from_secs(300);
/// The most ends one catch-up pass sends; past it, a warning and the rest next pass.
pub const CATCH_UP_MAX_JOBS: usize = 10_000;

/// One catch-up, from the moment this host became leader.
#[derive(Debug)]
pub struct CatchUp {
    /// Epoch seconds: jobs that ended since then are looked at.
    since: i64,
    /// Until when passes run.
    until: Instant,
    /// The keys this catch-up queued (each job once; bounded by what sacct answers, itself
    /// bounded by the runner's output bound).
    sent: HashSet<String>,
}

impl CatchUp {
    /// A catch-up for a host that became leader at `now` (epoch seconds).
    pub fn new(now: i64) -> CatchUp {
        CatchUp {
            since: now - CATCH_UP_WINDOW.as_secs() as i64,
            until: Instant::now() + CATCH_UP_FOR,
            sent: HashSet::new(),
        }
    }

    /// Whether passes are still due.
    pub fn due(&self) -> bool {
        Instant::now() < self.until
    }

    /// One pass: queues the ends Slurm has that this host has not queued or delivered;
    /// returns how many it queued. slurmctld first (it holds an ended job for `MinJobAge`,
    /// 300 s by default, and has it at once, while accounting can record it late): its
    /// listing (24.11 and later: every job's id and state, then the ended ones' records by
    /// id; before: the one full listing, with its backoff on big queues), then accounting
    /// for the jobs it no longer holds. An error when neither can be asked (the next pass
    /// tries again).
    pub fn pass(
        &mut self,
        cfg: &Config,
        slurm: &Slurm,
        cluster: &str,
        outbox: &StateDir,
    ) -> Result<usize, String> {
        let secs = (crate::timefmt::now_epoch() - self.since).max(1) as u64;
        // slurmctld's view: every job it holds (`full`: with their whole records).
        let listing = match crate::slurm::job_states(slurm, COMMAND_TIMEOUT) {
            Ok(Some(states)) => Ok((states, false)),
            Ok(None) => crate::slurm::all_jobs(slurm, COMMAND_TIMEOUT).map(|all| (all, true)),
            Err(e) => Err(e),
        };
        let acct = crate::slurm::sacct_ended_within(slurm, secs, COMMAND_TIMEOUT);
        let (listing, full) = match (listing, &acct) {
            (Ok(l), _) => (Some(l.0), l.1),
            (Err(e), Ok(_)) => {
                log::debug!("catch-up: slurmctld's listing not had now ({e}); accounting alone");
                (None, false)
            }
            (Err(e), Err(a)) => {
                return Err(format!(
                    "catch-up: neither slurmctld ({e}) nor accounting (sacct: {a}) could be asked"
                ))
            }
        };
        let acct = acct.unwrap_or_else(|e| {
            log::debug!("catch-up: accounting (sacct) could not be asked: {e}");
            Vec::new()
        });
        let held: HashSet<&str> = listing
            .iter()
            .flatten()
            .map(|j| j.job_id.as_str())
            .collect();
        // Ended in slurmctld (its records when full), then accounting's for what it no
        // longer holds; the jobs it holds as not ended (requeued, running again) are left to
        // their hooks.
        let ctl_ended: Vec<JobInfo> = listing
            .iter()
            .flatten()
            .filter(|j| j.ended())
            .filter(|j| j.end.is_none_or(|e| e >= self.since))
            .cloned()
            .collect();
        let from_acct: Vec<JobInfo> = acct
            .into_iter()
            .filter(|j| listing.is_none() || !held.contains(j.job_id.as_str()))
            .collect();
        let mut known = outbox.queue.pending_job_keys();
        known.extend(outbox.queue.recently_ended());
        // What this host delivered itself, recorded in StateDir (across service restarts).
        known.extend(outbox.ends_sent.within(CATCH_UP_WINDOW + CATCH_UP_FOR));
        known.extend(self.sent.iter().cloned());
        let candidates: Vec<JobInfo> = ctl_ended.into_iter().chain(from_acct).collect();
        let (chosen, over) = to_send(&candidates, cluster, &known, CATCH_UP_MAX_JOBS);
        if over > 0 {
            log::warn!(
                "catch-up: {} ended job(s) to look at since the takeover's window; {over} left for the next pass (at most {CATCH_UP_MAX_JOBS} a pass)",
                chosen.len() + over
            );
        }
        if chosen.is_empty() {
            return Ok(0);
        }
        // The whole records, by id, of what the listing gave as states only, and (without a
        // listing) slurmctld's word on accounting's jobs.
        let ask: Vec<String> = chosen
            .iter()
            .filter(|j| !full && (listing.is_none() || held.contains(j.job_id.as_str())))
            .map(|j| j.job_id.clone())
            .collect();
        let by_id = if ask.is_empty() {
            crate::slurm::Answer::default()
        } else {
            crate::slurm::jobs_by_id(slurm, &ask, COMMAND_TIMEOUT)
                .map_err(|e| format!("catch-up: slurmctld could not be asked: {e}"))?
        };
        let later: HashSet<&str> = by_id.later.iter().map(String::as_str).collect();
        let asked_ids: HashSet<&str> = ask.iter().map(String::as_str).collect();
        let mut queued = 0;
        for j in chosen {
            if later.contains(j.job_id.as_str()) {
                continue; // a bound left it unasked: next pass
            }
            let asked = asked_ids.contains(j.job_id.as_str());
            let (info, from) = match (asked, by_id.found.get(&j.job_id)) {
                (true, Some(r)) if !r.ended() => {
                    log::debug!(
                        "catch-up: job {} ended, but slurmctld now holds it as {}; left to its hooks",
                        j.job_id,
                        r.state
                    );
                    self.sent.insert(key_of(&j.job_id, cluster));
                    continue;
                }
                (true, Some(r)) => (r, "slurmctld"),
                (true, None) if held.contains(j.job_id.as_str()) => continue, // gone meanwhile: next pass
                (_, _) if held.contains(j.job_id.as_str()) => (j, "slurmctld"),
                (_, _) => (j, "accounting"),
            };
            if info.end.is_some_and(|e| e < self.since)
                || cfg
                    .job_wanted(&info.name, info.partition.as_deref())
                    .is_err()
            {
                self.sent.insert(key_of(&info.job_id, cluster));
                continue; // ended before the window, or a job cvslurm does not report
            }
            let key = key_of(&info.job_id, cluster);
            let Some(state) = JobState::from_slurm(&info.state).filter(|s| s.is_terminal()) else {
                continue;
            };
            let Ok(mut job) = crate::cloudvision::payload::job_config(info, cluster) else {
                continue; // no nodes known
            };
            job.job_type = None;
            log::info!(
                "catch-up: job {key} ended ({state}) while this host did not lead; sending its end from Slurm's record ({from}) in case the controller that led could not"
            );
            let rank = (info.restarts.unwrap_or(0), 1);
            let mut ev = Event::new(Item::Job { job }, rank);
            ev.het = crate::service::het::part_of(info);
            outbox.queue.enqueue(&ev)?;
            self.sent.insert(key);
            queued += 1;
        }
        Ok(queued)
    }
}

fn key_of(id: &str, cluster: &str) -> String {
    crate::cloudvision::payload::job_key(id, cluster)
}

/// The ended jobs of `ended` whose key is not in `known`, each once, at most `max` (by job
/// id); and how many more there were. A heterogeneous job's end is its leader's: its other
/// components are never sent under their own ids.
fn to_send<'a>(
    ended: &'a [JobInfo],
    cluster: &str,
    known: &HashSet<String>,
    max: usize,
) -> (Vec<&'a JobInfo>, usize) {
    let mut seen = HashSet::new();
    let mut v: Vec<&JobInfo> = ended
        .iter()
        .filter(|j| j.ended() && !crate::service::het::is_follower(j))
        .filter(|j| !known.contains(&key_of(&j.job_id, cluster)))
        .filter(|j| seen.insert(j.job_id.clone()))
        .collect();
    v.sort_by_key(|j| j.job_id.parse::<u64>().unwrap_or(u64::MAX));
    let over = v.len().saturating_sub(max);
    v.truncate(max);
    (v, over)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sacct(version: &str) -> Vec<JobInfo> {
        let file = if version == "22.05" {
            "json/sacct.json"
        } else {
            "sacct-json.json"
        };
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(format!("tests/fixtures/slurm-{version}/{file}"));
        crate::slurm::json::parse_jobs(&std::fs::read_to_string(p).unwrap()).unwrap()
    }

    /// A heterogeneous job's components other than its leader are never caught up under
    /// their own ids: `squeue --only-job-state` names them `<id>+<offset>`, sacct in `het`.
    #[test]
    fn a_het_job_is_caught_up_by_its_leader_only() {
        let states = r#"{"jobs":[{"job_id":"6+0","state":["COMPLETED"]},{"job_id":"7+1","state":["CANCELLED"]},{"job_id":"8","state":["COMPLETED"]},{"job_id":"9+x","state":["COMPLETED"]},{"job_id":"3+4","state":["COMPLETED"]}]}"#;
        let jobs = crate::slurm::json::parse_job_states(states).unwrap();
        let ids: Vec<(&str, Option<&str>, Option<u32>)> = jobs
            .iter()
            .map(|j| (j.job_id.as_str(), j.het_job_id.as_deref(), j.het_job_offset))
            .collect();
        assert_eq!(
            ids,
            [
                ("6", Some("6"), Some(0)),
                ("7", Some("6"), Some(1)),
                ("8", None, None)
            ]
        );
        let (chosen, over) = to_send(&jobs, "c", &HashSet::new(), 10);
        let chosen: Vec<&str> = chosen.iter().map(|j| j.job_id.as_str()).collect();
        assert_eq!((chosen, over), (vec!["6", "8"], 0));
        let part = crate::service::het::part_of(&jobs[0]).unwrap();
        assert_eq!(
            (part.component.as_str(), part.offset, part.left),
            ("6", 0, false)
        );
        assert!(crate::service::het::part_of(&jobs[2]).is_none());
    }

    #[test]
    fn ends_from_real_sacct_output_minus_what_this_host_has() {
        for v in ["22.05", "24.11", "26.05"] {
            let jobs = sacct(v);
            let ended: Vec<&JobInfo> = jobs.iter().filter(|j| j.ended()).collect();
            assert!(!ended.is_empty(), "{v}: the capture holds ended jobs");
            let (all, over) = to_send(&jobs, "c", &HashSet::new(), usize::MAX);
            assert_eq!(all.len(), ended.len(), "{v}");
            assert_eq!(over, 0);
            assert!(all.iter().all(|j| j.ended()), "{v}: ends only");
            // A job this host queued or delivered is not sent again.
            let known: HashSet<String> = [key_of(&all[0].job_id, "c")].into();
            let (rest, _) = to_send(&jobs, "c", &known, usize::MAX);
            assert_eq!(rest.len(), all.len() - 1, "{v}");
            assert!(rest.iter().all(|j| j.job_id != all[0].job_id));
            // The bound: the lowest ids, and the count of the rest.
            let (one, over) = to_send(&jobs, "c", &HashSet::new(), 1);
            assert_eq!((one.len(), over), (1, all.len() - 1), "{v}");
            assert_eq!(one[0].job_id, all[0].job_id);
        }
    }
}
