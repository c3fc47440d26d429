//! Which Slurm this is (`scontrol --version`, asked once per process), and how cvslurm reads
//! jobs from it.

use crate::slurm::runner::Slurm;
use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

/// A Slurm release, e.g. 24.11.5.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    /// Year of the release (22, 24, 26, …).
    pub major: u32,
    /// Month of the release (05, 11).
    pub minor: u32,
    /// Maintenance release.
    pub micro: u32,
}

impl Version {
    /// Parses what `scontrol --version` prints: `slurm 24.11.5`, `slurm-wlm 22.05.8`.
    pub fn parse(s: &str) -> Option<Version> {
        let word = s.split_whitespace().last()?;
        let mut it = word.split('.').map(|p| {
            let digits: String = p.chars().take_while(char::is_ascii_digit).collect();
            digits.parse::<u32>().ok()
        });
        let major = it.next()??;
        let minor = it.next()??;
        let micro = it.next().flatten().unwrap_or(0);
        Some(Version {
            major,
            minor,
            micro,
        })
    }

    const fn new(major: u32, minor: u32) -> Version {
        Version {
            major,
            minor,
            micro: 0,
        }
    }

    /// How cvslurm reads jobs from this release.
    pub fn reader(self) -> Reader {
        // `scontrol --json` exists from 23.02; before it only squeue and sacct print JSON.
        let ctl_json = self >= Version::new(23, 2);
        // data_parser v0.0.42 is the one version both 24.11 (v0.0.40-42) and 26.05
        // (v0.0.42-45) accept; outside that range Slurm's own default is asked for.
        let v42 = self >= Version::new(24, 11) && self < Version::new(26, 6);
        let json = if v42 { "--json=v0.0.42" } else { "--json" };
        Reader {
            ctl: if ctl_json { Ctl::Scontrol } else { Ctl::Squeue },
            json_flag: json,
            // `squeue --only-job-state` came with 24.05; its JSON is captured from 24.11 on
            // (tests/fixtures/slurm-24.11/only-job-state/), so that is where it is used.
            only_job_state: self >= Version::new(24, 11),
            // From 23.02 on, slurmctld reports a job's final state beside COMPLETING while its
            // epilog runs; 22.05's squeue says only COMPLETING (measured, tests/cluster/FACTS.md).
            final_state_in_epilog: ctl_json,
        }
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:02}.{}", self.major, self.minor, self.micro)
    }
}

/// Which command answers "what does slurmctld know about these jobs".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ctl {
    /// `scontrol --all --json show job [ID]` (Slurm 23.02 and later).
    Scontrol,
    /// `squeue --all --json`, every job slurmctld holds (22.05 ignores squeue's filters with
    /// `--json`).
    Squeue,
}

/// How cvslurm reads one Slurm release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reader {
    /// Where slurmctld's view of jobs comes from.
    pub ctl: Ctl,
    /// `--json=v0.0.42` or `--json`.
    pub json_flag: &'static str,
    /// Whether `squeue --only-job-state --json` (every job's id and state, without the rest
    /// of its record) is used to see which jobs run.
    pub only_job_state: bool,
    /// Whether slurmctld's JSON names a job's final state while its epilog runs.
    pub final_state_in_epilog: bool,
}

impl Reader {
    /// One line for `cvslurm check`: the commands cvslurm runs.
    pub fn describe(&self) -> String {
        let ctl = match self.ctl {
            Ctl::Scontrol => format!("scontrol --all {} show job", self.json_flag),
            Ctl::Squeue => format!("squeue --all {}", self.json_flag),
        };
        let by_id = match self.ctl {
            Ctl::Scontrol => format!(
                "by id (`scontrol --all {} show job ID`, at most {} per pass)",
                self.json_flag,
                super::JOB_QUERIES_PER_PASS
            ),
            Ctl::Squeue => format!("from the listing `{ctl}` (no single-job JSON before 23.02)"),
        };
        let running = if self.only_job_state {
            format!("`squeue --only-job-state {}`", self.json_flag)
        } else {
            format!("`{ctl}`")
        };
        format!(
            "jobs {by_id}, running jobs from {running}, ended jobs from `sacct {}` (at most {} ids per call); the epilog {}",
            self.json_flag,
            super::SACCT_IDS_PER_CALL,
            if self.final_state_in_epilog {
                "reads the final state from slurmctld"
            } else {
                "infers the end state from ExitCode, Reason and Restarts (22.05 does not give the final state)"
            }
        )
    }
}

/// What `scontrol --version` said, per scontrol path, for this process.
static CACHE: Mutex<Option<HashMap<PathBuf, Version>>> = Mutex::new(None);

/// The Slurm version, from `scontrol --version`, asked once per process (per scontrol path).
pub fn version(slurm: &Slurm, timeout: Duration) -> Result<Version, String> {
    let path = slurm.path_of("scontrol");
    if let Some(v) = CACHE
        .lock()
        .ok()
        .and_then(|c| c.as_ref().and_then(|m| m.get(&path).copied()))
    {
        return Ok(v);
    }
    let out = slurm.run("scontrol", &["--version"], timeout)?;
    let v = Version::parse(&out).ok_or_else(|| {
        format!(
            "scontrol --version printed {:?}, not a Slurm version",
            out.trim()
        )
    })?;
    if let Ok(mut c) = CACHE.lock() {
        c.get_or_insert_with(HashMap::new).insert(path, v);
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_scontrol_prints() {
        // Captured: 22.05 (Debian 12), 24.11 and 26.05 (tests/fixtures/slurm-*/).
        for (file, want) in [
            ("slurm-22.05/json/versions-and-timings.txt", "22.05.8"),
            ("slurm-24.11/version.txt", "24.11.5"),
            ("slurm-26.05/version.txt", "26.05.5"),
        ] {
            let text = std::fs::read_to_string(format!(
                "{}/tests/fixtures/{file}",
                env!("CARGO_MANIFEST_DIR")
            ))
            .unwrap();
            let line = text
                .lines()
                .find(|l| l.starts_with("slurm"))
                .unwrap_or_else(|| panic!("{file}"));
            assert_eq!(Version::parse(line).unwrap().to_string(), want, "{file}");
        }
        assert_eq!(Version::parse("slurm 23.02.0-0rc1").unwrap().minor, 2);
        assert_eq!(Version::parse("garbage"), None);
        assert_eq!(Version::parse(""), None);
    }

    #[test]
    fn readers_per_version() {
        let r = |s: &str| Version::parse(s).unwrap().reader();
        assert_eq!(r("slurm 22.05.8").ctl, Ctl::Squeue);
        assert!(!r("slurm 22.05.8").final_state_in_epilog);
        assert_eq!(r("slurm 23.02.7").ctl, Ctl::Scontrol);
        assert_eq!(r("slurm 23.11.1").json_flag, "--json");
        assert_eq!(r("slurm 24.11.5").json_flag, "--json=v0.0.42");
        assert_eq!(r("slurm 26.05.5").json_flag, "--json=v0.0.42");
        assert_eq!(r("slurm 26.11.0").json_flag, "--json");
        assert!(r("slurm 26.05.5").final_state_in_epilog);
        assert!(!r("slurm 24.05.8").only_job_state);
        assert!(r("slurm 24.11.5").only_job_state);
        assert!(r("slurm 26.05.5").only_job_state);
    }
}
