//! `cvslurm hook`: PrologSlurmctld / EpilogSlurmctld.
//!
//! From slurmctld's `SLURM_*` environment it builds the job's JobConfig (RUNNING in the prolog,
//! COMPLETED / FAILED / CANCELLED in the epilog), writes it to the outbox, and sends it within
//! `HookTimeout`. It exits 0 in every case — a failing PrologSlurmctld would requeue or kill the
//! job — and a watchdog ends it at the budget whatever CloudVision, DNS or slurmctld do.
//!
//! When the cvslurm service runs (its socket `StateDir/wake.sock` is live), the hook only
//! writes the event to the outbox, wakes the service and exits: no network call, no slurmctld
//! call; the service settles the end state and sends (see `crate::service::sender`). Without the
//! service the hook asks slurmctld and sends itself; what it could not send stays in the
//! outbox for `cvslurm flush`.

use super::startup::{client_for, start_hook, HookStart};
use crate::cloudvision::payload::{JobConfig, JobState, Key};
use crate::config::Config;
use crate::job_end::{epilog_state, epilog_times, final_state_named, HookEnv, Phase};
use crate::slurm::runner::Slurm;
use crate::slurm::{self, JobInfo};
use crate::state::event::HetPart;
use crate::state::queue::{EndFacts, Enqueued, Event, Item, Look};
use crate::state::status::counter;
use crate::state::wake;
use crate::state::StateDir;
use crate::timefmt::{format_epoch, now_epoch};
use argh::FromArgs;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The long flags of `cvslurm hook` (`--help` aside), for `cvslurm --list-flags hook`, the
/// completion and the documentation tests; a unit test in [`crate::cli`] holds it to [`Args`].
pub const FLAGS: &[&str] = &["--config"];

/// PrologSlurmctld/EpilogSlurmctld: send the job's state from the SLURM_* environment (always exits 0).
#[derive(FromArgs, Debug, Default)]
#[argh(subcommand, name = "hook", help_triggers("-h", "--help", "help"))]
pub struct Args {
    /// config file (default $CVSLURM_CONF or /etc/slurm/cloudvision.conf)
    #[argh(option)]
    pub config: Option<PathBuf>,
}

/// The environment variables the hook reads (nothing else is read: another variable with
/// bytes that are not UTF-8 cannot matter).
pub const HOOK_VARS: [&str; 12] = [
    "SLURM_SCRIPT_CONTEXT",
    "SLURM_JOB_ID",
    "SLURM_HET_JOB_ID",
    "SLURM_HET_JOB_OFFSET",
    "SLURM_CLUSTER_NAME",
    "SLURM_JOB_NAME",
    "SLURM_JOB_PARTITION",
    "SLURM_JOB_NODELIST",
    "SLURM_JOB_START_TIME",
    "SLURM_JOB_END_TIME",
    "SLURM_JOB_EXIT_CODE2",
    "SLURM_JOB_RESTART_COUNT",
];

/// Reads [`HOOK_VARS`] from the process environment. A value that is not UTF-8 is kept
/// lossily (U+FFFD for each bad byte); its name is returned in the second list.
pub fn read_vars() -> (HashMap<String, String>, Vec<&'static str>) {
    let mut lossy = Vec::new();
    let mut vars = HashMap::new();
    for k in HOOK_VARS {
        if let Some(v) = std::env::var_os(k) {
            let s = match v.into_string() {
                Ok(s) => s,
                Err(raw) => {
                    lossy.push(k);
                    raw.to_string_lossy().into_owned()
                }
            };
            vars.insert(k.to_string(), s);
        }
    }
    (vars, lossy)
}

/// How far the hook got, for the watchdog's last word.
static PROGRESS: AtomicU8 = AtomicU8::new(NOTHING_YET);
const NOTHING_YET: u8 = 0;
const QUEUED: u8 = 1;
const DONE: u8 = 2;
/// The hook's budget in milliseconds (the default until the config is read).
static BUDGET_MS: AtomicU64 = AtomicU64::new(2000);
/// The job the hook is working on, for the watchdog's message.
static JOB_KEY: OnceLock<String> = OnceLock::new();

extern "C" fn on_alarm(_: nix::libc::c_int) {
    // SAFETY: _exit is async-signal-safe.
    unsafe { nix::libc::_exit(0) }
}

/// The last-resort stop: SIGALRM after `after`, whose handler `_exit(0)`s. It needs no thread,
/// so it works even when no thread can be started.
fn arm_timer(after: Duration) {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    let act = SigAction::new(
        SigHandler::Handler(on_alarm),
        SaFlags::empty(),
        SigSet::empty(),
    );
    // SAFETY: the handler only calls _exit.
    let _ = unsafe { sigaction(Signal::SIGALRM, &act) };
    let tv = |d: Duration| {
        use nix::sys::time::{TimeVal, TimeValLike};
        *TimeVal::microseconds(d.as_micros().min(i64::MAX as u128) as i64).as_ref()
    };
    let it = nix::libc::itimerval {
        it_interval: tv(Duration::ZERO),
        it_value: tv(after),
    };
    // SAFETY: plain syscall with valid pointers.
    unsafe { nix::libc::setitimer(nix::libc::ITIMER_REAL, &it, std::ptr::null_mut()) };
}

/// The watchdog: ends the process with status 0 when the budget is used up, saying truthfully
/// what became of the event.
fn watchdog(t0: Instant) {
    loop {
        let budget = Duration::from_millis(BUDGET_MS.load(Ordering::Relaxed));
        let left = budget.saturating_sub(t0.elapsed());
        if left.is_zero() {
            break;
        }
        std::thread::sleep(left.min(Duration::from_millis(20)));
    }
    let budget = BUDGET_MS.load(Ordering::Relaxed) as f64 / 1000.0;
    let job = JOB_KEY.get().map_or("?", |s| s.as_str());
    match PROGRESS.load(Ordering::SeqCst) {
        NOTHING_YET => log::error!(
            "job {job}: hook time budget of {budget:.1} s used up before its event was queued: the event is LOST (StateDir slow?); reconciliation can send it later from Slurm's record"
        ),
        QUEUED => log::warn!(
            "job {job}: hook time budget of {budget:.1} s used up while sending; the event is in the outbox and is sent later"
        ),
        _ => {}
    }
    std::process::exit(0);
}

/// Runs the hook. Always returns 0.
///
/// The watchdog starts before anything else (a timer that needs no thread backs it), and
/// everything else runs under the panic guard: config, log file, environment, the work.
pub fn run(args: Args) -> i32 {
    hook_main(args.config.as_deref())
}

fn hook_main(config_path: Option<&Path>) -> i32 {
    let t0 = Instant::now();
    let default_budget = Duration::from_millis(BUDGET_MS.load(Ordering::Relaxed));
    arm_timer(default_budget + Duration::from_millis(300));
    let watchdog_started = std::thread::Builder::new()
        .name("watchdog".into())
        .spawn(move || watchdog(t0))
        .is_ok();
    std::panic::set_hook(Box::new(|info| {
        log::error!("internal error (bug in cvslurm, please report): {info}");
    }));
    let _ = std::panic::catch_unwind(|| {
        let HookStart {
            cfg,
            config_error: cfg_error,
            log_problem: problem,
        } = start_hook(config_path, |cfg| {
            BUDGET_MS.store(cfg.hook_timeout.as_millis() as u64, Ordering::Relaxed);
            arm_timer(cfg.hook_timeout + Duration::from_millis(300));
        });
        if !watchdog_started {
            log::warn!("cannot start the watchdog thread (process limit?); a timer ends the hook at its budget");
        }
        if let Some(p) = problem {
            log::error!("{p}");
        }
        let (vars, lossy) = read_vars();
        handle(&cfg, cfg_error.as_deref(), &vars, &lossy, t0);
        PROGRESS.store(DONE, Ordering::SeqCst);
    });
    0
}

fn handle(
    cfg: &Config,
    cfg_error: Option<&str>,
    vars: &HashMap<String, String>,
    lossy: &[&str],
    t0: Instant,
) {
    let deadline = t0 + cfg.hook_timeout;
    if let Some(e) = cfg_error {
        log::error!("config error: {e}; using defaults for this event, fix the file");
    }
    for p in &cfg.problems {
        log::error!("config: {p}; this line is ignored, the others apply (cvslurm check)");
    }
    if let Some(e) = &cfg.env_error {
        log::error!("environment: {e}; ignored");
    }
    let id = vars.get("SLURM_JOB_ID").map_or("?", |s| s.as_str());
    for k in lossy {
        log::warn!(
            "job {id}: {k} is not UTF-8; sent with U+FFFD for each bad byte: {:?}",
            vars.get(*k).map_or("", |s| s.as_str())
        );
    }
    let env = match HookEnv::from_vars(vars) {
        Ok(e) => e,
        Err(e) => {
            log::error!("job {id}: not sent: {e}");
            return;
        }
    };
    let key = env.key();
    let _ = JOB_KEY.set(key.clone());
    if let Err(why) = cfg.job_wanted(&env.name, env.partition.as_deref()) {
        log::info!("job {key}: filtered out ({why}); nothing sent");
        return;
    }
    let outbox = StateDir::new(&cfg.state_dir);
    let service = wake::connect(&cfg.state_dir);
    if env.phase == Phase::Prolog {
        // What CloudVision is sent, for reconciliation to notice a resize or a suspend. Before
        // the start record: whoever sees the record finds the note (reconciliation sends a
        // recorded job without one anew).
        let shape = crate::state::starts::Shape::of(&env.nodes, false);
        if let Err(e) = outbox.starts.save_shape(&key, shape) {
            log::warn!("job {key}: cannot note its node set (reconciliation sends it anew): {e}");
        }
        if let Err(e) =
            outbox
                .starts
                .save_run(&key, env.start.unwrap_or_else(now_epoch), env.restart_count)
        {
            log::error!("job {key}: cannot record its start time: {e}");
        }
    }
    let start_rec = match env.phase {
        Phase::Prolog => None,
        Phase::Epilog => env.start.or_else(|| outbox.starts.load(&key)),
    };
    // Half the budget for queueing at most: the rest is for sending directly if it fails.
    let queue_by = t0 + cfg.hook_timeout / 2;
    let (mut event, mut named_final) =
        build_event(cfg, &env, start_rec, service.is_some(), deadline);
    let (mut queued, mut own) = queue(cfg, &outbox, &event, queue_by, service.is_none());
    if queued == Queue::Stop {
        return;
    }
    if let Some(sock) = &service {
        if matches!(queued, Queue::Queued | Queue::Behind) && wake::wake(sock) {
            PROGRESS.store(QUEUED, Ordering::SeqCst);
            // The start record stays until the service has the end on disk (it forgets it
            // then: `Queue::sync_files`): until then reconciliation can repair the end.
            log::info!(
                "job {key}: {}{} queued for the service ({} ms)",
                event_state(&event),
                het_note(&env),
                t0.elapsed().as_millis()
            );
            return;
        }
        // The service is gone (or the outbox cannot be written): this hook sends itself,
        // with slurmctld's word on the end as a hook without the service does.
        log::warn!("job {key}: the cvslurm service did not take the event; sending directly");
        if event.resolve.is_some() {
            (event, named_final) = build_event(cfg, &env, start_rec, false, deadline);
        }
        if queued != Queue::Failed {
            // Again, synced this time: nobody else will sync it. The first file goes once
            // the second is in place (it is this hook's own).
            let first = own.take();
            (queued, own) = queue(cfg, &outbox, &event, queue_by, true);
            if let (Some(first), Queue::Queued | Queue::Behind | Queue::Stop) = (first, queued) {
                outbox.queue.withdraw(&first);
            }
            if queued == Queue::Stop {
                return;
            }
        }
    }
    let behind = queued == Queue::Behind;
    let queued = matches!(queued, Queue::Queued | Queue::Behind);
    if queued {
        PROGRESS.store(QUEUED, Ordering::SeqCst);
    }
    let Item::Job { job } = &event.item else {
        return;
    };
    let state = job.state;
    if env.phase == Phase::Epilog && state.is_terminal() {
        // Queued here means synced: the start record is no longer needed to repair the end.
        // An end that could not be queued keeps it until it is sent (below), so that
        // reconciliation sends the end if this hook cannot.
        if queued {
            outbox.starts.forget(&key);
        }
        // An end slurmctld did not name (22.05 says COMPLETING; or no answer in time) is
        // checked against Slurm's final record: a cancel can reach the epilog as a success
        // (ExitCode 0:0) or as its shell's exit 143 (128 + SIGTERM).
        if !named_final {
            if let Err(e) = outbox.marks.mark_for_verification(job, env.restart_count) {
                log::warn!("job {key}: cannot mark its end for verification: {e}");
            }
        }
    }
    if behind {
        // A drainer sends the earlier event of this job, then this one: sending it here
        // could put it before the earlier one.
        return;
    }
    if let (Some(h), true) = (&env.het, queued) {
        // Its record is the whole job's, composed from Slurm's record of every component,
        // which only a drainer asks for (the service, or cvslurm flush).
        log::info!(
            "job {key}: {state} of component {} (offset {}) of the heterogeneous job kept in outbox for the service or cvslurm flush",
            env.job_id,
            h.offset
        );
        return;
    }
    let what = if queued {
        "kept in outbox"
    } else {
        "LOST (it could not be queued in StateDir)"
    };
    // An event neither queued nor sent is counted (cvslurm_events_lost_total), if StateDir
    // takes even that.
    let lost = || {
        if !queued {
            outbox.status.count(counter::LOST, 1);
        }
    };
    let token = match cfg.token() {
        Ok(t) => t,
        Err(e) => {
            log::error!("job {key}: {state} {what}: {e}");
            lost();
            return;
        }
    };
    if cfg.api_server.is_none() {
        log::warn!("job {key}: {state} {what}: no CloudVision server configured (ApiServer in cloudvision.conf)");
        lost();
        return;
    }
    if token.is_none() {
        log::warn!(
            "job {key}: {state} {what}: no API token configured (ApiTokenFile in cloudvision.conf)"
        );
        lost();
        return;
    }
    // This hook sends its event itself: no service took it (cvslurm_hook_direct_sends_total).
    outbox.status.count(counter::HOOK_DIRECT_SENDS, 1);
    // Keep a little of the budget to log and remove the outbox file.
    let send_deadline = deadline
        .checked_sub(Duration::from_millis(50))
        .unwrap_or(deadline);
    // The one rule for what goes out (the hook never asks Slurm: a job it decides goes by
    // node names), and a re-run's RUNNING first deletes the earlier run's record.
    let out = crate::inventory::attribution::outgoing(
        cfg.job_interfaces,
        &outbox.job_reps,
        job,
        crate::inventory::attribution::Why::of(&event),
        None,
        true,
    );
    let result = client_for(cfg, token, cfg.hook_timeout).and_then(|c| {
        crate::service::engine::post_outgoing(&c, &out, &outbox.job_reps, Some(send_deadline))
    });
    match result {
        Ok(a) => {
            if env.phase == Phase::Epilog && !queued {
                outbox.starts.forget(&key);
            }
            if let Some(own) = own.as_deref().filter(|_| queued) {
                // Its own file only, without a lock: if a drainer took it in meanwhile, it is
                // sent once more.
                outbox.queue.withdraw(own);
            }
            log::info!(
                "job {key}: sent {state} on {} (HTTP {}, {} ms)",
                nodes_summary(&env.nodes),
                a.status,
                a.elapsed.as_millis()
            );
        }
        Err(e) => {
            log::error!("job {key}: {state} {what}: {e}");
            lost();
        }
    }
}

/// What queueing did, for the hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Queue {
    /// In the outbox, durably.
    Queued,
    /// Not in the outbox (StateDir not writable).
    Failed,
    /// In the outbox behind an earlier event of the job (being sent, or still waiting):
    /// the drainer sends both in order; this hook must not send it.
    Behind,
    /// Nothing more to do: superseded by a later event.
    Stop,
}

/// Queues the event without waiting for any other process ([`crate::state::queue::Queue::hand_in`]);
/// `sync` unless the running service takes it (it syncs before sending). Without the service
/// (`sync`), whether an earlier event of the job waits is looked up until `by`. Returns the
/// hook's own outbox file too.
fn queue(
    cfg: &Config,
    outbox: &StateDir,
    event: &Event,
    by: Instant,
    sync: bool,
) -> (Queue, Option<PathBuf>) {
    let key = match &event.item {
        Item::Job { job } => job.key.id.clone(),
        other => other.describe(),
    };
    let state = event_state(event);
    let look = if sync { Look::Full(by) } else { Look::Quick };
    let placed = || PROGRESS.store(QUEUED, Ordering::SeqCst);
    let (res, own) = match outbox.queue.hand_in(event, sync, look, placed) {
        Ok((r, own)) => (Ok(r), Some(own)),
        Err(e) => (Err(e), None),
    };
    let q = match res {
        Ok(Enqueued::Superseded) => {
            log::info!("job {key}: {state} superseded by a later event already queued; not sent");
            Queue::Stop
        }
        Ok(Enqueued::Queued { busy: true }) => {
            log::info!("job {key}: {state} queued behind an event being sent now");
            Queue::Behind
        }
        Ok(Enqueued::Chained) => {
            log::info!(
                "job {key}: {state} queued after its RUNNING, which is still waiting to be sent"
            );
            Queue::Behind
        }
        Ok(Enqueued::Unchecked) => {
            log::warn!(
                "job {key}: {state} queued; whether an earlier event of the job waits could not be told within half of HookTimeout (a large outbox?), so it is not sent now: the next drainer (the service, or cvslurm flush) sends it in order"
            );
            Queue::Behind
        }
        Ok(Enqueued::Queued { busy: false }) => Queue::Queued,
        Err(e) => {
            PROGRESS.store(NOTHING_YET, Ordering::SeqCst);
            log::error!(
                "job {key}: cannot queue the event in StateDir {}: {e}; sending directly",
                cfg.state_dir.display()
            );
            Queue::Failed
        }
    };
    (q, own)
}

/// ` (component 7 of the heterogeneous job, offset 1)` for a het component's event, for the
/// log: its key is the leader's.
fn het_note(env: &HookEnv) -> String {
    match &env.het {
        Some(h) if env.phase == Phase::Epilog && h.offset > 0 => format!(
            " (component {} of the heterogeneous job, offset {}, ended: the job goes on without it)",
            env.job_id, h.offset
        ),
        Some(h) => format!(
            " (component {} of the heterogeneous job, offset {})",
            env.job_id, h.offset
        ),
        None => String::new(),
    }
}

fn event_state(ev: &Event) -> String {
    match &ev.item {
        Item::Job { job } => job.state.to_string(),
        other => other.describe(),
    }
}

/// The job's event. With the service (`for_service`), an epilog does not ask slurmctld: its
/// event carries the facts the service needs to settle the end ([`EndFacts`]).
fn build_event(
    cfg: &Config,
    env: &HookEnv,
    start_rec: Option<i64>,
    for_service: bool,
    deadline: Instant,
) -> (Event, bool) {
    let now = now_epoch();
    let mut facts = None;
    let mut named_final = false;
    // A component other than the leader that ends leaves the job, which goes on: a RUNNING
    // of the job on fewer nodes (the leader's end is the job's).
    let leaves = env.phase == Phase::Epilog && env.het.as_ref().is_some_and(|h| h.offset > 0);
    let (state, start, end) = match env.phase {
        Phase::Prolog => (JobState::Running, env.start.unwrap_or(now), None),
        Phase::Epilog if leaves => (
            JobState::Running,
            env.start.or(start_rec).unwrap_or(now),
            None,
        ),
        Phase::Epilog => {
            let ctl = if for_service {
                facts = Some(EndFacts {
                    exit: env.exit,
                    restart_count: env.restart_count,
                    // Only Slurm's own times count as known: the prolog's record of the
                    // start (22.05) is its clock, and slurmctld's record replaces it.
                    start_known: env.start.is_some(),
                    end_known: env.end.is_some(),
                });
                None
            } else {
                lookup_end_state(cfg, env, deadline)
            };
            named_final = ctl.as_ref().is_some_and(final_state_named);
            let state = epilog_state(env.exit, env.restart_count, ctl.as_ref());
            let (start, end) = epilog_times(env, ctl.as_ref(), start_rec, now);
            (state, start, Some(end))
        }
    };
    let job = JobConfig {
        key: Key { id: env.key() },
        name: Some(crate::cloudvision::payload::job_name(
            &env.name,
            env.partition.as_deref(),
        )),
        state,
        start_time: format_epoch(start),
        end_time: end.and_then(format_epoch),
        location: Some(env.cluster.clone()),
        job_type: None,
        nodes: Some(env.nodes.clone().into()),
        interfaces: None,
    };
    let phase_rank = u8::from(env.phase == Phase::Epilog && !leaves);
    let mut ev = Event::new(Item::Job { job }, (env.restart_count, phase_rank));
    ev.resolve = facts;
    ev.het = env.het.as_ref().map(|h| HetPart {
        component: env.job_id.clone(),
        offset: h.offset,
        left: leaves,
    });
    (ev, named_final)
}

/// Asks slurmctld how the job ended, within what is left of the budget (keeping half of it for
/// CloudVision). `None` when it cannot tell in time.
fn lookup_end_state(cfg: &Config, env: &HookEnv, deadline: Instant) -> Option<JobInfo> {
    let left = deadline.saturating_duration_since(Instant::now());
    let budget = (left / 2).min(Duration::from_secs(1));
    if budget < Duration::from_millis(50) {
        return None;
    }
    let slurm = Slurm::from_config(cfg);
    match slurm::job_by_id(&slurm, &env.job_id, budget) {
        Ok(j) => {
            if let Some(j) = &j {
                log::debug!(
                    "job {}: slurmctld says JobState={} Reason={} ExitCode={}",
                    env.key(),
                    j.states.join(","),
                    j.reason.as_deref().unwrap_or("-"),
                    j.exit_code.as_deref().unwrap_or("-")
                );
            }
            j
        }
        Err(e) => {
            log::warn!(
                "job {}: cannot ask slurmctld for the end state ({e}); using the exit codes",
                env.key()
            );
            None
        }
    }
}

fn nodes_summary(nodes: &[String]) -> String {
    match nodes.len() {
        0 => "no nodes".into(),
        1..=4 => nodes.join(","),
        n => format!("{},… ({n} nodes)", nodes[..3].join(",")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job_end::finish_end;
    use crate::job_end::tests::{env_of, fixture};

    fn vars(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn het_vars(phase: &str, id: &str, leader: &str, offset: &str) -> HashMap<String, String> {
        vars(&[
            ("SLURM_SCRIPT_CONTEXT", phase),
            ("SLURM_JOB_ID", id),
            ("SLURM_CLUSTER_NAME", "c"),
            ("SLURM_JOB_NAME", "hetjob"),
            ("SLURM_JOB_PARTITION", "debug"),
            ("SLURM_JOB_NODELIST", "n[1-2]"),
            ("SLURM_JOB_START_TIME", "1700000000"),
            ("SLURM_JOB_END_TIME", "1700000060"),
            ("SLURM_JOB_EXIT_CODE2", "0:15"),
            ("SLURM_HET_JOB_ID", leader),
            ("SLURM_HET_JOB_OFFSET", offset),
        ])
    }

    /// Every component's event is the leader's (`<SLURM_HET_JOB_ID>@<cluster>`), marked with
    /// the component; a component other than the leader ending is a RUNNING of the job (it
    /// shrinks), the leader's end is the job's end.
    #[test]
    fn a_het_component_is_its_leaders_job() {
        let cfg = Config::default();
        let far = Instant::now() + Duration::from_secs(5);
        let build = |phase: &str, id: &str, offset: &str| {
            let env = HookEnv::from_vars(&het_vars(phase, id, "6", offset)).unwrap();
            assert_eq!(env.key(), "6@c");
            build_event(&cfg, &env, None, true, far).0
        };
        for (id, offset) in [("6", "0"), ("7", "1")] {
            let start = build("prolog_slurmctld", id, offset);
            let Item::Job { job } = &start.item else {
                panic!()
            };
            assert_eq!((job.key.id.as_str(), job.state), ("6@c", JobState::Running));
            assert_eq!(start.rank, (0, 0));
            let part = start.het.clone().unwrap();
            assert_eq!((part.component.as_str(), part.left), (id, false));
        }
        let left = build("epilog_slurmctld", "7", "1");
        let Item::Job { job } = &left.item else {
            panic!()
        };
        assert_eq!(
            (job.state, job.end_time.as_ref()),
            (JobState::Running, None)
        );
        assert_eq!((left.rank, left.resolve), ((0, 0), None));
        assert!(left.het.as_ref().unwrap().left);
        let end = build("epilog_slurmctld", "6", "0");
        let Item::Job { job } = &end.item else {
            panic!()
        };
        assert!(job.state.is_terminal());
        assert_eq!(end.rank, (0, 1));
        assert!(end.resolve.is_some() && !end.het.as_ref().unwrap().left);
        // The leader's id as Slurm prints it, whatever the variable's leading zeros.
        let env = HookEnv::from_vars(&het_vars("prolog_slurmctld", "7", "006", "1")).unwrap();
        assert_eq!(env.key(), "6@c");
        // Not a het job: no mark, its own key.
        let mut plain = het_vars("prolog_slurmctld", "5", "6", "0");
        plain.remove("SLURM_HET_JOB_ID");
        plain.remove("SLURM_HET_JOB_OFFSET");
        let env = HookEnv::from_vars(&plain).unwrap();
        assert_eq!((env.key().as_str(), env.het.is_none()), ("5@c", true));
    }

    /// Hostile values in the het variables name the variable, and no event is made.
    #[test]
    fn hostile_het_variables_are_refused_by_name() {
        for (id, leader, offset, says) in [
            (
                "7",
                "6x",
                "1",
                "SLURM_HET_JOB_ID=\"6x\" is not a job number",
            ),
            ("7", "0", "1", "SLURM_HET_JOB_ID=\"0\" is not a job number"),
            (
                "7",
                "-6",
                "1",
                "SLURM_HET_JOB_ID=\"-6\" is not a job number",
            ),
            ("7", "99999999999", "1", "is not a job number"),
            ("7", "6 ; rm", "1", "is not a job number"),
            (
                "7",
                "6",
                "128",
                "SLURM_HET_JOB_OFFSET=\"128\" is not a component index (0 to 127)",
            ),
            ("7", "6", "+1", "is not a component index"),
            ("7", "6", "0", "disagree with SLURM_JOB_ID=\"7\""),
            ("6", "6", "1", "disagree"),
            (
                "7",
                "6",
                "",
                "SLURM_HET_JOB_ID is set without SLURM_HET_JOB_OFFSET",
            ),
        ] {
            let e =
                HookEnv::from_vars(&het_vars("prolog_slurmctld", id, leader, offset)).unwrap_err();
            assert!(e.contains(says), "{leader:?} {offset:?}: {e}");
        }
    }

    /// The service settles an epilog's provisional end with what slurmctld said (captured on
    /// real Slurm 22.05): a cancel that looked like a success, and Slurm's own times.
    #[test]
    fn the_service_settles_a_provisional_end() {
        let env = env_of(&fixture("slurm-22.05/json/hookenv-cancelled-epilog.txt"));
        let cfg = Config::default();
        let far = Instant::now() + Duration::from_secs(5);
        let (ev, _) = build_event(&cfg, &env, None, true, far);
        let facts = ev
            .resolve
            .expect("an epilog for the service carries its facts");
        assert!(!facts.start_known && !facts.end_known);
        let Item::Job { job } = &ev.item else {
            panic!()
        };
        assert_eq!(
            job.state,
            JobState::Completed,
            "exit codes alone say success"
        );
        let jobs =
            slurm::json::parse_jobs(&fixture("slurm-22.05/json/squeue-cancelled-epilog.json"))
                .unwrap();
        let ctl = slurm::pick(jobs, std::slice::from_ref(&env.job_id))
            .remove(&env.job_id)
            .unwrap();
        let fixed = finish_end(job, &facts, Some(&ctl));
        assert_eq!(fixed.state, JobState::Cancelled);
        // Slurm's own times, the ones sacct records.
        assert_eq!(fixed.start_time, ctl.start.and_then(format_epoch));
        assert_eq!(fixed.end_time, ctl.end.and_then(format_epoch));
        assert!(fixed.start_time.is_some() && fixed.end_time.is_some());
        // slurmctld no longer knows the job: the exit codes decide, the epilog's times stay.
        assert_eq!(finish_end(job, &facts, None), *job);
        // Times the epilog had from Slurm are kept.
        let known = EndFacts {
            start_known: true,
            end_known: true,
            ..facts
        };
        let kept = finish_end(job, &known, Some(&ctl));
        assert_eq!(
            (kept.start_time.clone(), kept.end_time.clone()),
            (job.start_time.clone(), job.end_time.clone())
        );
        // A prolog's event never carries facts; without the service neither does an epilog's.
        assert!(build_event(&cfg, &env, None, false, Instant::now())
            .0
            .resolve
            .is_none());
    }
}
