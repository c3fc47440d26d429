//! `cvslurm status`: outbox depth, oldest event age, rejected events, and whether CloudVision
//! answers with the configured token.

use super::startup::{ClientNeed, Options, StartError, Startup};
use crate::state::{layout, StateDir};
use crate::text::{escape_control, one_line};
use argh::FromArgs;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// The long flags of `cvslurm status` (`--help` aside), for `cvslurm --list-flags status`, the
/// completion and the documentation tests; a unit test in [`crate::cli`] holds it to [`Args`].
pub const FLAGS: &[&str] = &["--config", "--json", "--max-age", "--offline"];

/// Show the outbox depth, the oldest event, rejected events and whether CloudVision answers.
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "status", help_triggers("-h", "--help", "help"))]
pub struct Args {
    /// config file (default $CVSLURM_CONF or /etc/slurm/cloudvision.conf)
    #[argh(option)]
    config: Option<PathBuf>,
    /// print JSON instead of text
    #[argh(switch)]
    json: bool,
    /// exit 1 when the oldest queued event is older than this many seconds (default 3600)
    #[argh(option, default = "3600")]
    max_age: i64,
    /// do not contact CloudVision
    #[argh(switch)]
    offline: bool,
}

/// Exit status: everything is fine.
pub const EXIT_OK: i32 = 0;
/// Exit status: the oldest event is older than `--max-age`, or CloudVision does not answer.
pub const EXIT_PROBLEM: i32 = 1;
/// Exit status: `status` cannot know: StateDir (or the outbox in it) cannot be read.
pub const EXIT_UNKNOWN: i32 = 3;

/// How old the service's count of the outbox may be for `status` to show it rather than list
/// the outbox itself (the service records it every 5 s).
pub const SERVICE_COUNT_MAX_AGE_S: i64 = 15;

/// What `status` reports.
#[derive(Debug, Serialize)]
pub struct Status {
    /// The state directory.
    pub state_dir: String,
    /// Why StateDir cannot be read (then the outbox figures are `None`: unknown).
    pub state_dir_error: Option<String>,
    /// Events waiting to be sent (`None`: unknown).
    pub outbox_depth: Option<usize>,
    /// Age in seconds of the oldest waiting event.
    pub oldest_event_age_s: Option<i64>,
    /// Who counted the outbox: `service` (the running service's index, at most
    /// [`SERVICE_COUNT_MAX_AGE_S`] old, so `status` need not list a large outbox) or `listing`
    /// (this command listed it); `None` when unknown.
    pub outbox_counted_by: Option<&'static str>,
    /// Events CloudVision refused as malformed (in `rejected/`; `None`: unknown).
    pub rejected: Option<usize>,
    /// The CloudVision server.
    pub api_server: Option<String>,
    /// `ok`, `skipped`, or the error.
    pub cloudvision: String,
    /// Unix time of the last delivery by the service or `flush`.
    pub last_delivery: Option<i64>,
    /// The last delivery error the service or `flush` met, and when.
    pub last_error: Option<String>,
    /// Unix time of `last_error`.
    pub last_error_at: Option<i64>,
    /// The last bound the service reached asking Slurm (jobs left for the next pass, a
    /// listing too big to read), and when.
    pub last_slurm_warning: Option<String>,
    /// Unix time of `last_slurm_warning`.
    pub last_slurm_warning_at: Option<i64>,
    /// The cvslurm service listens on `StateDir/wake.sock`: hooks hand it their events.
    pub service_running: bool,
    /// What this host's service does, from its last record (service-status.json): `leads:
    /// …` or `standby: …`; absent when no service recorded a role.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// The service's last record: true (this host leads), false (another controller is in
    /// control), null (cannot tell: it does not lead).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leader: Option<serde_json::Value>,
    /// Why, one line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leader_reason: Option<String>,
    /// Unix time of the last change of role.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leader_since: Option<i64>,
    /// Age in seconds of that record (the service records it every poll).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leader_age_s: Option<i64>,
    /// The figures of the metrics file (`MetricsFile`), from the same StateDir.
    pub metrics: crate::metrics::Figures,
    /// With two or more `SlurmctldHost` lines in slurm.conf: the controllers, in order.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub controllers: Option<Vec<String>>,
    /// The controller in control (from StateSaveLocation/heartbeat).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub in_control: Option<String>,
    /// Why the controller in control cannot be told (two or more controllers only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub in_control_unknown: Option<String>,
}

/// Prints the status; exit 1 when the oldest event is older than `max_age` seconds or
/// CloudVision does not answer, 3 when StateDir cannot be read (the outbox is unknown), 2
/// when the config file cannot be read.
pub fn run(a: Args) -> i32 {
    let Args {
        config,
        json,
        max_age,
        offline,
    } = a;
    // Reading the outbox may move files in StateDir: never as root there (crate::privilege).
    let startup = Startup {
        options: Options {
            config,
            ..Options::default()
        },
        log: None,
        client: if offline {
            ClientNeed::Never
        } else {
            ClientNeed::Optional
        },
        drop_privileges: true,
    };
    let started = match startup.start() {
        Ok(s) => s,
        // Root cannot use StateDir (missing, not a directory, another user's): the outbox is
        // unknown, which is not the same as empty.
        Err(StartError::StateDir(why)) => {
            if json {
                let v = serde_json::json!({"state_dir_error": why, "outbox_depth": null});
                println!("{}", serde_json::to_string_pretty(&v).expect("serializes"));
            } else {
                println!("outbox:           UNKNOWN: {}", escape_control(&why));
            }
            return EXIT_UNKNOWN;
        }
        Err(e) => return e.report(),
    };
    let cfg = &started.cfg;
    let outbox = StateDir::new(&cfg.state_dir);
    let forward = cfg.jobcomp_forward.as_ref().map(|t| t.shown().to_string());
    // An outbox that cannot be read is not an empty one: say so, and exit 3.
    let unreadable = unreadable(&cfg.state_dir);
    let service_running = crate::state::wake::connect(&cfg.state_dir).is_some();
    let (depth, oldest, counted_by) = match unreadable {
        None => match service_running
            .then(|| outbox.status.recorded_outbox(SERVICE_COUNT_MAX_AGE_S))
            .flatten()
        {
            Some((d, o)) => (
                Some(d),
                o.map(|t| crate::timefmt::now_epoch() - t),
                Some("service"),
            ),
            None => {
                let (d, o) = outbox.queue.depth();
                (Some(d), o, Some("listing"))
            }
        },
        Some(_) => (None, None, None),
    };
    let cv = if offline {
        "skipped".to_string()
    } else {
        match started
            .client()
            .map_err(|e| e.to_string())
            .and_then(|c| c.expect("asked for").probe(None).map_err(|e| e.to_string()))
        {
            Ok(_) => "ok".to_string(),
            Err(e) => e,
        }
    };
    let st = Status {
        state_dir: cfg.state_dir.display().to_string(),
        state_dir_error: unreadable,
        outbox_depth: depth,
        oldest_event_age_s: oldest,
        outbox_counted_by: counted_by,
        // Counted once, by the figures (below), under the same condition.
        rejected: None,
        api_server: cfg.api_server.clone(),
        cloudvision: cv,
        last_delivery: None,
        last_error: None,
        last_error_at: None,
        last_slurm_warning: None,
        last_slurm_warning_at: None,
        service_running,
        // The outbox listed once (above), not again for the figures: seconds at a million.
        metrics: crate::metrics::Figures::gather_with(
            &outbox,
            cfg.poll_interval,
            depth.map(|d| (d, oldest)),
        ),
        controllers: None,
        in_control: None,
        in_control_unknown: None,
        role: None,
        leader: None,
        leader_reason: None,
        leader_since: None,
        leader_age_s: None,
    };
    let mut st = st;
    st.rejected = depth.and(st.metrics.rejected_events.map(|n| n as usize));
    controllers(&mut st);
    if let Some(v) = outbox.status.read() {
        st.last_delivery = v["last_delivery"].as_i64();
        st.last_error = v["last_error"].as_str().map(String::from);
        st.last_error_at = v["last_error_at"].as_i64();
        st.last_slurm_warning = v["last_slurm_warning"].as_str().map(String::from);
        st.last_slurm_warning_at = v["last_slurm_warning_at"].as_i64();
        role(&mut st, &v);
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&st).expect("serializes"));
    } else {
        // What is printed comes from outside (service-status.json is SlurmUser's, the
        // CloudVision answer a server's or a proxy's): its control characters are escaped.
        println!("state dir:        {}", escape_control(&st.state_dir));
        println!(
            "service:          {}",
            if st.service_running {
                "running (hooks queue their events, the service sends them)"
            } else {
                "not running (each hook sends its event itself)"
            }
        );
        if let Some(role) = &st.role {
            println!(
                "role:             {}; {} (since {}, recorded {} s ago)",
                escape_control(role),
                one_line(st.leader_reason.as_deref().unwrap_or("?"), 1000),
                st.leader_since
                    .and_then(crate::timefmt::format_epoch)
                    .unwrap_or_else(|| "?".into()),
                st.leader_age_s.map_or("?".into(), |a| a.to_string())
            );
        }
        match st.outbox_depth {
            Some(n) if st.outbox_counted_by == Some("service") => {
                println!("outbox:           {n} event(s) waiting (the service's count)")
            }
            Some(n) => println!("outbox:           {n} event(s) waiting"),
            None => println!(
                "outbox:           UNKNOWN: {}",
                escape_control(st.state_dir_error.as_deref().unwrap_or("?"))
            ),
        }
        println!(
            "oldest event:     {}",
            st.oldest_event_age_s
                .map_or("-".into(), |a| format!("{a} s old"))
        );
        println!(
            "rejected events:  {}",
            st.rejected.map_or("unknown".into(), |n| n.to_string())
        );
        if let Some(target) = &forward {
            println!(
                "JobCompForward:   {} document(s) spooled for {}, {} dropped",
                st.metrics.jobcomp_forward_spool_documents,
                escape_control(target),
                st.metrics
                    .counters
                    .get(crate::state::status::counter::JOBCOMP_FORWARD_DROPPED)
                    .copied()
                    .unwrap_or(0)
            );
        }
        let ago = |t: Option<i64>| {
            t.map_or("never".to_string(), |t| {
                format!(
                    "{} ({} s ago)",
                    crate::timefmt::format_epoch(t).unwrap_or_default(),
                    crate::timefmt::now_epoch() - t
                )
            })
        };
        println!("last delivery:    {}", ago(st.last_delivery));
        match &st.last_error {
            Some(e) => println!(
                "last error:       {} at {}",
                one_line(e, 1000),
                ago(st.last_error_at)
            ),
            None => println!("last error:       none"),
        }
        if let Some(list) = &st.controllers {
            println!(
                "controllers:      {}",
                controllers_line(list, &st.in_control, &st.in_control_unknown)
            );
        }
        if let Some(w) = &st.last_slurm_warning {
            println!(
                "Slurm warning:    {} at {}",
                one_line(w, 1000),
                ago(st.last_slurm_warning_at)
            );
        }
        println!(
            "CloudVision:      {} ({})",
            escape_control(st.api_server.as_deref().unwrap_or("not configured")),
            escape_control(&st.cloudvision)
        );
    }
    let stale = oldest.is_some_and(|a| a > max_age);
    let cv_bad = !(st.cloudvision == "ok" || st.cloudvision == "skipped");
    if st.state_dir_error.is_some() {
        EXIT_UNKNOWN
    } else if stale || cv_bad {
        EXIT_PROBLEM
    } else {
        EXIT_OK
    }
}

/// Fills in what the service recorded of its role (`leader`, `leader_reason`,
/// `leader_since`, `leader_at`: [`crate::service::leadership`]); a record of another shape
/// (StateDir is hostile) is left out.
fn role(st: &mut Status, v: &serde_json::Value) {
    let Some(at) = v["leader_at"].as_i64() else {
        return;
    };
    let leader = &v["leader"];
    st.role = Some(
        match leader.as_bool() {
            Some(true) => "leads: inventory, node deletions, reconciliation, resends, and delivers its own outbox",
            Some(false) => "standby: delivers its own outbox only (another controller is in control)",
            None if leader.is_null() => {
                "standby: delivers its own outbox only (cannot tell which controller is in control)"
            }
            None => return,
        }
        .to_string(),
    );
    st.leader = Some(leader.clone());
    st.leader_reason = v["leader_reason"].as_str().map(String::from);
    st.leader_since = v["leader_since"].as_i64();
    st.leader_age_s = Some(crate::timefmt::now_epoch() - at);
}

/// Fills in the controllers and the one in control when slurm.conf names two or more
/// `SlurmctldHost`s (an unreadable slurm.conf or a single controller: nothing).
fn controllers(st: &mut Status) {
    use crate::slurm::leader::{self, Leader};
    let Ok(conf) = crate::slurm::conf::load_slurm_conf(&crate::slurm::conf::slurm_conf_path())
    else {
        return;
    };
    let list = leader::controllers(&conf);
    if list.len() < 2 {
        return;
    }
    let now = u64::try_from(crate::timefmt::now_epoch()).unwrap_or(0);
    match leader::leader(&conf, now) {
        Leader::InControl { name, .. } => st.in_control = Some(name),
        Leader::Unknown(why) => st.in_control_unknown = Some(why),
    }
    st.controllers = Some(list.into_iter().map(|c| c.name).collect());
}

/// `ctl1 (in control), ctl2`, or `ctl1, ctl2 (in control: unknown: why)`; names come from
/// slurm.conf, escaped.
fn controllers_line(
    list: &[String],
    in_control: &Option<String>,
    unknown: &Option<String>,
) -> String {
    let names: Vec<String> = list
        .iter()
        .map(|n| match in_control {
            Some(c) if c == n => format!("{} (in control)", escape_control(n)),
            _ => escape_control(n).into_owned(),
        })
        .collect();
    match unknown {
        Some(why) => format!(
            "{} (in control: unknown: {})",
            names.join(", "),
            one_line(why, 300)
        ),
        None => names.join(", "),
    }
}

/// Why StateDir's outbox cannot be read, if it cannot: StateDir itself missing (a mount not
/// there, a typo) or unreadable (another user's), or one of its event directories unreadable.
/// An event directory that does not exist yet is empty.
fn unreadable(root: &Path) -> Option<String> {
    let what = |e: std::io::Error, p: &Path| {
        let hint = match e.kind() {
            std::io::ErrorKind::NotFound => {
                "is it mounted? is StateDir in cloudvision.conf right? (the hooks create it)"
            }
            std::io::ErrorKind::PermissionDenied => "run cvslurm status as root or as its owner",
            _ => "check StateDir in cloudvision.conf",
        };
        format!(
            "cannot read StateDir {}: {e}; {hint}; the outbox may hold events",
            p.display()
        )
    };
    if let Err(e) = std::fs::read_dir(root) {
        return Some(what(e, root));
    }
    for d in [layout::OUTBOX, layout::INFLIGHT, layout::REJECTED] {
        let p = root.join(d);
        match std::fs::read_dir(&p) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Some(what(e, &p)),
        }
    }
    None
}
