//! The bounds on what one pass asks Slurm: how many single-job questions slurmctld gets, and
//! how many ids go into one `sacct -j` argument and into one pass. Past a bound the remaining
//! ids are not dropped: the caller gets them back ([`Answer::later`]) and asks again in its
//! next pass, and the bound being reached is a warning at the default log level.

use super::JobInfo;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The most single-job questions (`scontrol show job ID`, one REQUEST_JOB_INFO_SINGLE each:
/// slurmctld's cost does not grow with its queue) one call of
/// [`jobs_by_id`](super::jobs_by_id) asks. About 64 × 10–30 ms of process time.
pub const JOB_QUERIES_PER_PASS: usize = 64;

/// The most job ids in one `sacct -j` argument: at most 1,000 × 21 bytes (`<id>_<task>,`),
/// about 21 KB, far below the kernel's 128 KiB limit on one argument (E2BIG past it).
pub const SACCT_IDS_PER_CALL: usize = 1000;

/// The most `sacct` calls in one call of [`sacct_jobs`](super::sacct_jobs): with
/// [`SACCT_IDS_PER_CALL`], 10,000 ids per pass.
pub const SACCT_CALLS_PER_PASS: usize = 10;

/// The most job ids one `squeue --only-job-state -j ID,…` carries (about 12 KB of arguments,
/// far below the kernel's 128 KiB).
pub const STATE_IDS_PER_CALL: usize = 1000;

/// The most `squeue --only-job-state -j …` calls of one pass: the states of at most 10,000
/// jobs by id per pass; the rest are asked in the next pass.
pub const STATE_CALLS_PER_PASS: usize = 10;

/// What one bounded question learned, and the ids it left for the next pass.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Answer {
    /// Id as asked → the job; ids Slurm does not know are absent (and not in `later`).
    pub found: HashMap<String, JobInfo>,
    /// Ids not asked about in this pass (a bound was reached, or the time ran out): nothing
    /// is known of them; ask again.
    pub later: Vec<String>,
}

/// Splits `ids` into the ones asked now (at most `limit`) and the ones left for the next pass,
/// with a warning naming `what` and the bound when some are left.
pub fn split<'a>(ids: &'a [String], limit: usize, what: &str) -> (&'a [String], &'a [String]) {
    if ids.len() <= limit {
        return (ids, &[]);
    }
    let (now, later) = ids.split_at(limit);
    log::warn!(
        "{what}: {} jobs to ask about, at most {limit} per pass; {} left for the next pass",
        ids.len(),
        later.len()
    );
    (now, later)
}

/// Asks about `ids` in calls of at most `per_call` ids, at most `calls` calls, within
/// `timeout`: `ask(ids, time left)` is one command, whose jobs are picked for the ids it was
/// given ([`pick`](super::pick)). The ids past the bound (a warning names `what`), and those of
/// a call that failed or found no time left after the first, are in [`Answer::later`]; an error
/// when the first call fails.
pub fn ask_bounded(
    ids: &[String],
    per_call: usize,
    calls: usize,
    timeout: Duration,
    what: &str,
    mut ask: impl FnMut(&[String], Duration) -> Result<Vec<JobInfo>, String>,
) -> Result<Answer, String> {
    let started = Instant::now();
    let per_call = per_call.max(1);
    let (now, later) = split(ids, per_call.saturating_mul(calls), what);
    let mut answer = Answer {
        found: HashMap::new(),
        later: later.to_vec(),
    };
    for (i, chunk) in now.chunks(per_call).enumerate() {
        let left = timeout.saturating_sub(started.elapsed());
        let asked = if left.is_zero() {
            Err(format!("no time left of {} ms", timeout.as_millis()))
        } else {
            ask(chunk, left)
        };
        match asked {
            Ok(jobs) => answer.found.extend(super::pick(jobs, chunk)),
            Err(e) if i == 0 => return Err(e),
            Err(e) => {
                let rest = &now[i * per_call..];
                log::warn!("{what}: {e}; {} job(s) left for the next pass", rest.len());
                answer.later.splice(0..0, rest.iter().cloned());
                break;
            }
        }
    }
    Ok(answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Slurm's answer to a question about some ids: the real records of a 24.11
    /// `squeue --json` capture, as a by-id question would give them.
    fn real_jobs() -> Vec<JobInfo> {
        let p = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/slurm-24.11/squeue-json.json"
        );
        super::super::json::parse_jobs(&std::fs::read_to_string(p).unwrap()).unwrap()
    }

    fn ids(range: std::ops::RangeInclusive<u32>) -> Vec<String> {
        range.map(|i| i.to_string()).collect()
    }

    #[test]
    fn split_keeps_the_rest() {
        let ids = ids(1..=5);
        let (now, later) = split(&ids, 3, "test");
        assert_eq!((now.len(), later), (3, &ids[3..]));
        let (now, later) = split(&ids, 5, "test");
        assert_eq!((now.len(), later.len()), (5, 0));
    }

    /// One id per call, a bound of 8 calls: 8 questions, the other ids kept in order for the
    /// next pass; the jobs found are Slurm's own records of the ids asked.
    #[test]
    fn by_id_bound_keeps_the_rest_for_the_next_pass() {
        let jobs = real_jobs();
        let wanted = ids(1..=30);
        let mut asked = Vec::new();
        let a = ask_bounded(&wanted, 1, 8, Duration::from_secs(5), "test", |one, _| {
            asked.push(one.to_vec());
            Ok(jobs.clone())
        })
        .unwrap();
        assert_eq!(asked.len(), 8);
        assert!(asked.iter().all(|c| c.len() == 1));
        assert_eq!(a.later, wanted[8..]);
        let mut found: Vec<&String> = a.found.keys().collect();
        found.sort_by_key(|k| k.parse::<u32>().unwrap());
        let known: Vec<String> = (1..=8)
            .map(|i| i.to_string())
            .filter(|i| jobs.iter().any(|j| j.is(i)))
            .collect();
        assert_eq!(found, known.iter().collect::<Vec<_>>());
        assert!(!known.is_empty());
        for (id, j) in &a.found {
            assert!(j.is(id));
        }
    }

    /// sacct's bound: at most `per_call` ids per argument list, at most `calls` calls; each
    /// argument stays far below the kernel's 128 KiB limit even with the longest ids.
    #[test]
    fn sacct_batches_and_argument_size() {
        let wanted = ids(1..=2500);
        let mut sizes = Vec::new();
        let a = ask_bounded(&wanted, 1000, 2, Duration::from_secs(5), "test", |c, _| {
            sizes.push(c.len());
            Ok(Vec::new())
        })
        .unwrap();
        assert_eq!(sizes, [1000, 1000]);
        assert_eq!(a.later, wanted[2000..]);
        let longest = format!("{}_{},", u32::MAX, u32::MAX);
        assert!(longest.len() * SACCT_IDS_PER_CALL < 128 * 1024 / 4);
        // Everything below the bound is asked in one pass.
        let all = ask_bounded(&wanted, 1000, 3, Duration::from_secs(5), "test", |_, _| {
            Ok(Vec::new())
        })
        .unwrap();
        assert!(all.later.is_empty());
    }

    /// A failed first call is an error (Slurm cannot be asked); a later failure keeps what was
    /// learnt and leaves the rest, from the failed call on, for the next pass.
    #[test]
    fn failures_keep_the_rest() {
        let jobs = real_jobs();
        let wanted = ids(1..=6);
        let e = ask_bounded(&wanted, 2, 10, Duration::from_secs(5), "test", |_, _| {
            Err("slurmctld down".to_string())
        });
        assert_eq!(e.unwrap_err(), "slurmctld down");
        let mut n = 0;
        let a = ask_bounded(&wanted, 2, 10, Duration::from_secs(5), "test", |_, _| {
            n += 1;
            if n == 2 {
                Err("timed out".into())
            } else {
                Ok(jobs.clone())
            }
        })
        .unwrap();
        assert_eq!(a.later, wanted[2..]);
        assert!(a.found.keys().all(|k| k == "1" || k == "2"));
        // No time left after the first call: the rest waits.
        let a = ask_bounded(&wanted, 1, 10, Duration::from_millis(30), "test", |_, _| {
            std::thread::sleep(Duration::from_millis(40));
            Ok(Vec::new())
        })
        .unwrap();
        assert_eq!(a.later, wanted[1..]);
    }
}
