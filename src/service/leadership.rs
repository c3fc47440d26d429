//! Which service leads: the one on the controller whose slurmctld is in control.
//!
//! The service runs on every `SlurmctldHost`. Its sender (delivering what this host's outbox
//! holds) always runs; inventory, node deletions, reconciliation and resends run only while
//! this host [`Role::Leads`]. Slurm decides, never cvslurm:
//! - slurm.conf names one `SlurmctldHost` (or none), or there is no slurm.conf at its path
//!   and `scontrol show config` names none that exists: this host leads (one controller, as
//!   before two were known). A slurm.conf elsewhere is found by asking Slurm (its
//!   `SLURM_CONF` line), so a pair whose service was not given `SLURM_CONF` still has one
//!   leader;
//! - two or more: this host leads when `StateSaveLocation/heartbeat` names it, the heartbeat
//!   is fresh ([`crate::slurm::leader`]: at most SlurmctldTimeout old) **and** this host's
//!   slurmctld runs, as SlurmUser from an installed binary
//!   ([`crate::slurm::ctld_process::find_trusted`]: after a kill -9 the heartbeat keeps
//!   naming the dead controller for up to SlurmctldTimeout; any user can name a process
//!   `slurmctld`); on 25.11+ its `/readyz` answer counts only from a listening socket that is
//!   SlurmUser's ([`crate::slurm::ctld_process::owns_listening`]);
//! - anything else that cannot be read (slurm.conf there but unreadable; the heartbeat
//!   missing, stale, hostile):
//!   [`Role::CannotTell`], and this host does not lead: no discovery, no deletion.
//!
//! It is decided again at every poll, so leadership moves within one poll of Slurm's
//! takeover. A host that has just become leader deletes no node on its first poll
//! ([`Leadership::may_delete`]): a node is deleted only when this leader listed it itself
//! in an earlier poll and no longer does.

use crate::slurm::conf::SlurmConf;
use crate::slurm::leader::{self, Leader};
use crate::state::StateDir;

/// What this host's service does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// This host leads: inventory, deletions, reconciliation, resends; the reason.
    Leads(String),
    /// Another controller is in control (its name); this host delivers its own outbox only.
    Standby {
        /// Why, one line.
        why: String,
        /// The controller in control.
        in_control: String,
    },
    /// Who is in control cannot be told: this host does not lead; the reason.
    CannotTell(String),
}

impl Role {
    /// `leader` in service-status.json: true, false, or null (cannot tell).
    pub fn leader(&self) -> Option<bool> {
        match self {
            Role::Leads(_) => Some(true),
            Role::Standby { .. } => Some(false),
            Role::CannotTell(_) => None,
        }
    }

    /// The reason, one line.
    pub fn reason(&self) -> &str {
        match self {
            Role::Leads(w) | Role::CannotTell(w) => w,
            Role::Standby { why, .. } => why,
        }
    }

    /// Whether this host leads.
    pub fn leads(&self) -> bool {
        matches!(self, Role::Leads(_))
    }

    /// Same kind of role, and for a standby the same controller in control (the reasons
    /// themselves change every poll: a heartbeat's age).
    fn same_as(&self, other: &Role) -> bool {
        match (self, other) {
            (Role::Leads(_), Role::Leads(_)) | (Role::CannotTell(_), Role::CannotTell(_)) => true,
            (Role::Standby { in_control: a, .. }, Role::Standby { in_control: b, .. }) => a == b,
            _ => false,
        }
    }
}

/// Why slurm.conf is not there to read.
#[derive(Debug, Clone, Copy)]
pub enum NoConf<'a> {
    /// No file at that path: a site whose slurm.conf lives elsewhere and whose service was
    /// not given `SLURM_CONF` (one controller assumed, as before pairs were known).
    Missing(&'a std::path::Path),
    /// It is there but cannot be read or parsed: the reason.
    Unreadable(&'a str),
}

/// The role from slurm.conf (or why it is not there), this host's name, the time and
/// whether this host's slurmctld runs (asked only when the heartbeat names this host): the
/// heartbeat alone (Slurm before 25.11; see [`decide_with`]).
#[cfg(test)]
pub fn decide(
    conf: Result<&SlurmConf, NoConf>,
    hostname: &str,
    now: u64,
    own_slurmctld_runs: &dyn Fn() -> bool,
) -> Role {
    decide_with(conf, hostname, now, own_slurmctld_runs, None)
}

/// What this host's slurmctld answers to `GET /readyz` (its address and port): in control,
/// not (a standby), or no answer ([`leader::readyz`]).
pub type Readyz<'a> = &'a dyn Fn(&str, u16) -> Option<bool>;

/// The role as the heartbeat decides it, with `readyz` where this Slurm release answers it
/// (25.11 and later) as a second source beside the heartbeat, asked of this host's own
/// slurmctld. `hostname` is this host's `gethostname()` whole ([`leader::this_hostname`]),
/// matched against the `SlurmctldHost` names as slurmctld does ([`leader::names_this_host`]):
/// - the heartbeat names this host but its slurmctld answers as a standby (handing control
///   over): cannot tell, this host does not lead;
/// - its slurmctld answers "in control" (and runs here) while the heartbeat names another
///   controller or cannot be read yet (written again within a few seconds of a takeover):
///   this host leads;
/// - no answer: the heartbeat alone decides.
pub fn decide_with(
    conf: Result<&SlurmConf, NoConf>,
    hostname: &str,
    now: u64,
    own_slurmctld_runs: &dyn Fn() -> bool,
    readyz: Option<Readyz>,
) -> Role {
    let conf = match conf {
        Ok(c) => c,
        Err(NoConf::Missing(path)) => {
            return Role::Leads(format!(
                "there is no {} and scontrol show config names none: this host is taken for the only controller (on a pair, set SLURM_CONF in the service's environment)",
                path.display()
            ))
        }
        Err(NoConf::Unreadable(e)) => {
            return Role::CannotTell(format!(
                "slurm.conf: {e}: cannot tell whether another controller is in control"
            ))
        }
    };
    let list = leader::controllers(conf);
    if list.len() < 2 {
        return Role::Leads(format!(
            "slurm.conf names {} SlurmctldHost: this host is the only controller",
            list.len()
        ));
    }
    // This host's own slurmctld, asked where the release answers /readyz.
    let ready = match (
        readyz,
        list.iter().find(|c| leader::is_this_host(c, hostname)),
        leader::slurmctld_port(conf),
    ) {
        (Some(ask), Some(me), Some(port)) => ask(me.addr.as_deref().unwrap_or(&me.name), port),
        _ => None,
    };
    let ready_leads = |besides: &str| {
        (ready == Some(true) && own_slurmctld_runs()).then(|| {
            Role::Leads(format!(
                "this host's slurmctld answers /readyz: in control ({besides})"
            ))
        })
    };
    match leader::leader(conf, now) {
        Leader::Unknown(why) => {
            ready_leads(&format!("the heartbeat: {why}")).unwrap_or(Role::CannotTell(why))
        }
        Leader::InControl { index, name, age_s } => {
            if !leader::is_this_host(&list[index], hostname) {
                let why = format!("the heartbeat ({age_s} s old) names {name}, not this host");
                return ready_leads(&why).unwrap_or(Role::Standby {
                    why,
                    in_control: name,
                });
            }
            if !own_slurmctld_runs() {
                return Role::CannotTell(format!(
                    "the heartbeat ({age_s} s old) names this host ({name}), but no slurmctld runs here (as SlurmUser, from an installed binary): killed? a takeover follows within SlurmctldTimeout"
                ));
            }
            if ready == Some(false) {
                return Role::CannotTell(format!(
                    "the heartbeat ({age_s} s old) names this host ({name}), but its slurmctld answers /readyz as a standby: handing control over?"
                ));
            }
            Role::Leads(format!(
                "the heartbeat ({age_s} s old) names this host ({name}) and its slurmctld runs{}",
                if ready == Some(true) {
                    " and answers /readyz: in control"
                } else {
                    ""
                }
            ))
        }
    }
}

/// SlurmUser's uid (slurm.conf's `SlurmUser`, else root); `None` when it is no known user.
pub fn slurm_user_uid(conf: &SlurmConf) -> Option<u32> {
    let name = conf
        .last("SlurmUser")
        .map_or("root".to_string(), |s| s.value.trim().to_string());
    nix::unistd::User::from_name(&name)
        .ok()
        .flatten()
        .map(|u| u.uid.as_raw())
}

/// How old the [`Gate`]'s verdict may be before it decides again (a decision reads
/// slurm.conf and the heartbeat and scans `/proc`: about a millisecond).
pub const GATE_FRESH: std::time::Duration = std::time::Duration::from_secs(1);

/// The sending side of leadership: whether this host may send a RUNNING now, and since when it
/// leads (its *term*). Shared by the monitor (which feeds it the role it decides at each poll)
/// and the sender, which asks it just before each RUNNING goes out, deciding again itself when
/// its verdict is older than [`GATE_FRESH`].
///
/// The rule it serves (docs/design.md, "No RUNNING after an end"): on a controller pair a
/// RUNNING is sent only by the host that leads, and only when it was queued during the current
/// term or checked against Slurm during it; a host that does not lead, or cannot tell, keeps
/// its RUNNINGs unsent. With one controller this host always leads, in one term since the
/// epoch: nothing changes.
pub struct Gate {
    pair: std::sync::atomic::AtomicBool,
    readyz: std::sync::atomic::AtomicBool,
    decide: Box<dyn Fn(bool) -> Role + Send + Sync>,
    state: std::sync::Mutex<GateState>,
    /// The slurm.conf the monitor decides from, once it named one ([`Gate::set_conf_path`]).
    conf: std::sync::Arc<std::sync::Mutex<Option<std::path::PathBuf>>>,
}

#[derive(Default)]
struct GateState {
    /// When the verdict was last decided.
    at: Option<std::time::Instant>,
    /// The current term's start (ns since the epoch, as an event's `seq`), or `None`.
    term: Option<u128>,
}

impl GateState {
    fn follow(&mut self, role: &Role) {
        self.at = Some(std::time::Instant::now());
        self.term = match (role.leads(), self.term) {
            (true, Some(t)) => Some(t),
            (true, None) => Some(crate::timefmt::now_nanos()),
            (false, _) => None,
        };
    }
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate").field("pair", &self.pair()).finish()
    }
}

impl Gate {
    /// A gate for this host: `pair` when slurm.conf names two or more `SlurmctldHost`
    /// (otherwise it always leads), deciding as [`Leadership::update`] does.
    pub fn new(pair: bool) -> Gate {
        let conf: std::sync::Arc<std::sync::Mutex<Option<std::path::PathBuf>>> = Default::default();
        let seen = conf.clone();
        let mut gate = Gate::with(
            pair,
            Box::new(move |readyz| {
                let path = seen
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone()
                    .unwrap_or_else(crate::slurm::conf::slurm_conf_path);
                decide_at(&path, readyz)
            }),
        );
        gate.conf = conf;
        gate
    }

    /// The slurm.conf the monitor found (`$SLURM_CONF`, the default, or the one `scontrol
    /// show config` named): decisions read it from now on, and whether this host is one of a
    /// pair follows it.
    pub fn set_conf_path(&self, path: &std::path::Path) {
        let mut conf = self.conf.lock().unwrap_or_else(|e| e.into_inner());
        if conf.as_deref() == Some(path) {
            return;
        }
        *conf = Some(path.to_path_buf());
        if let Ok(c) = crate::slurm::conf::load_slurm_conf(path) {
            let pair = crate::slurm::leader::controllers(&c).len() >= 2;
            self.pair.store(pair, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// A gate whose decisions come from `decide` (given whether `/readyz` is asked).
    pub fn with(pair: bool, decide: Box<dyn Fn(bool) -> Role + Send + Sync>) -> Gate {
        Gate {
            pair: std::sync::atomic::AtomicBool::new(pair),
            readyz: std::sync::atomic::AtomicBool::new(false),
            decide,
            state: Default::default(),
            conf: Default::default(),
        }
    }

    /// Whether this host is one of a controller pair.
    pub fn pair(&self) -> bool {
        self.pair.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// From now on `GET /readyz` is asked too (this Slurm release answers it).
    pub fn set_readyz(&self, on: bool) {
        self.readyz.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// The current term's start (ns since the epoch; 0 with one controller), or `None` when
    /// this host does not lead or cannot tell. Decided again when the last verdict is older
    /// than [`GATE_FRESH`].
    pub fn term(&self) -> Option<u128> {
        if !self.pair() {
            return Some(0);
        }
        // Decided under the lock: one decision at a time, and nobody uses a verdict older
        // than GATE_FRESH meanwhile (a decision's reads are bounded in time: the heartbeat's
        // 2 s on a hung StateSaveLocation, /readyz's 1 s).
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.at.is_none_or(|t| t.elapsed() >= GATE_FRESH) {
            let role = (self.decide)(self.readyz.load(std::sync::atomic::Ordering::Relaxed));
            st.follow(&role);
        }
        st.term
    }

    /// A role decided now (by the monitor's poll, or by [`Gate::term`]): a term starts when
    /// this host leads after not leading, and ends when it does not lead.
    pub fn observe(&self, role: &Role) {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .follow(role);
    }

    /// May a job event with this `seq` (its queue time) whose head is a RUNNING go out now:
    /// this host leads, and the event was queued during the current term or `checked` (against
    /// Slurm) during it. `checked` is asked only when needed, with the term.
    pub fn may_send_running(&self, seq: u128, checked: &dyn Fn(u128) -> bool) -> bool {
        match self.term() {
            None => false,
            Some(t) => seq >= t || checked(t),
        }
    }
}

/// The role of this host decided now from the slurm.conf at `path`, as [`Leadership::update`]
/// decides it: this host's slurmctld trusted only as SlurmUser from an installed binary, and
/// `/readyz` (with `readyz_answers`) only from that slurmctld's own listening socket.
fn decide_at(path: &std::path::Path, readyz_answers: bool) -> Role {
    let conf = crate::slurm::conf::load_slurm_conf(path);
    let now = crate::timefmt::now_epoch();
    let missing = conf.is_err() && !path.exists();
    // Looked for at most once per decision, when the decision needs it.
    let slurm_uid = conf.as_ref().ok().and_then(slurm_user_uid);
    let found = std::cell::OnceCell::new();
    let trusted = || {
        found.get_or_init(|| match slurm_uid {
            Some(uid) => crate::slurm::ctld_process::find_trusted(uid),
            None => Ok(Vec::new()),
        })
    };
    let runs = || trusted().as_ref().map_or(true, |v| !v.is_empty());
    let ask = |addr: &str, port: u16| {
        let started = std::time::Instant::now();
        let target = leader::resolve(addr, port, leader::READYZ_TIMEOUT)?;
        // only an answer from the trusted slurmctld's own listening socket
        let owner = trusted().as_ref().ok()?.iter().any(|c| {
            slurm_uid
                .is_some_and(|uid| crate::slurm::ctld_process::owns_listening(c.pid, uid, target))
        });
        if !owner {
            return None;
        }
        leader::readyz_at(
            target,
            addr,
            leader::READYZ_TIMEOUT.checked_sub(started.elapsed())?,
        )
    };
    decide_with(
        conf.as_ref().map_err(|e| {
            if missing {
                NoConf::Missing(path)
            } else {
                NoConf::Unreadable(e)
            }
        }),
        &leader::this_hostname(),
        u64::try_from(now).unwrap_or(0),
        &runs,
        readyz_answers.then_some(&ask),
    )
}

/// The file in StateDir that says which controller this host last saw in control: `this` or
/// `other` (one word and a newline). Read by [`last_in_control`], written on each change.
pub const LAST_IN_CONTROL: &str = "last-in-control";

/// Who this host last saw in control, from StateDir ([`LAST_IN_CONTROL`]): `Some(true)` this
/// host, `Some(false)` another controller, `None` when not known (no file yet, or anything
/// but one of the two words: a link, a FIFO, a file too large, other bytes).
pub fn last_in_control(outbox: &StateDir) -> Option<bool> {
    use std::io::Read;
    let (f, _) = crate::state::durable::open_regular(&outbox.root().join(LAST_IN_CONTROL)).ok()?;
    let mut s = String::new();
    f.take(16).read_to_string(&mut s).ok()?;
    match s.as_str() {
        "this\n" => Some(true),
        "other\n" => Some(false),
        _ => None,
    }
}

/// Records who this host sees in control ([`LAST_IN_CONTROL`]); a failure is logged.
fn record_in_control(outbox: &StateDir, this: bool) {
    let path = outbox.root().join(LAST_IN_CONTROL);
    let word: &[u8] = if this { b"this\n" } else { b"other\n" };
    if let Err(e) = crate::state::durable::replace(&path, word, outbox.owner()) {
        log::warn!("cannot record who is in control in StateDir: {e}");
    }
}

/// The service's leadership over its polls: the role, since when, and whether this host has
/// led for a whole poll already.
#[derive(Debug, Default)]
pub struct Leadership {
    role: Option<Role>,
    since: i64,
    polls_as_leader: u64,
    /// Fed every role decided here (the sender's view of it).
    gate: Option<std::sync::Arc<Gate>>,
    /// What [`LAST_IN_CONTROL`] holds as written by this process.
    recorded: Option<bool>,
    /// This host's current leadership follows another controller's (see
    /// [`Leadership::took_over`]).
    took_over: bool,
    /// Slurm's commands: where slurm.conf is not at its path, `scontrol show config` names it.
    slurm: Option<crate::slurm::runner::Slurm>,
    /// The slurm.conf `scontrol show config` named, once it did.
    asked: Option<std::path::PathBuf>,
    /// When to ask it again after it named none.
    ask_again: Option<std::time::Instant>,
}

/// How long `scontrol show config` may take when asked where slurm.conf is.
const ASK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
/// How often it is asked again while it names no slurm.conf.
const ASK_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

impl Leadership {
    /// Leadership that asks Slurm (`scontrol show config`, its `SLURM_CONF` line) where
    /// slurm.conf is when it is not at its path (`$SLURM_CONF`, else /etc/slurm/slurm.conf),
    /// and feeds `gate` each role it decides (and the slurm.conf it decides from).
    pub fn new(
        slurm: crate::slurm::runner::Slurm,
        gate: Option<std::sync::Arc<Gate>>,
    ) -> Leadership {
        Leadership {
            slurm: Some(slurm),
            gate,
            ..Leadership::default()
        }
    }

    /// Whether this host's current leadership is a change of controller: before it, this host
    /// last saw another controller in control, or cannot know (StateDir's
    /// [`LAST_IN_CONTROL`] missing or unreadable). False when this host led last, its
    /// service restarted meanwhile or not: a restart of the leader's service is no takeover.
    pub fn took_over(&self) -> bool {
        self.took_over
    }

    /// slurm.conf's path: `$SLURM_CONF`, else the default; where no file is there, the one
    /// `scontrol show config` names (asked at most every [`ASK_EVERY`] until it names one
    /// that exists, then kept).
    fn conf_path(&mut self) -> std::path::PathBuf {
        let path = crate::slurm::conf::slurm_conf_path();
        if path.exists() {
            return path;
        }
        if let Some(p) = &self.asked {
            return p.clone();
        }
        let Some(slurm) = &self.slurm else {
            return path;
        };
        if self
            .ask_again
            .is_some_and(|t| std::time::Instant::now() < t)
        {
            return path;
        }
        self.ask_again = Some(std::time::Instant::now() + ASK_EVERY);
        match slurm.run("scontrol", &["show", "config"], ASK_TIMEOUT) {
            Ok(out) => match crate::slurm::conf::path_from_show_config(&out) {
                Some(p) if p.exists() => {
                    log::info!(
                        "there is no {}: slurm.conf is {} (scontrol show config, SLURM_CONF)",
                        path.display(),
                        p.display()
                    );
                    self.asked = Some(p.clone());
                    p
                }
                _ => path,
            },
            Err(e) => {
                log::debug!("where is slurm.conf? {e}");
                path
            }
        }
    }

    /// Decides the role again (slurm.conf read now; with `readyz_answers`, this Slurm release
    /// answers `GET /readyz`, asked too), logs a change (info; a warning when it cannot be
    /// told), records it in service-status.json, and returns it.
    pub fn update(&mut self, outbox: &StateDir, readyz_answers: bool) -> &Role {
        self.decide_now(outbox, readyz_answers, true)
    }

    /// As [`Leadership::update`], within a poll (after a step that took a while) rather than
    /// at its start: not counted as a poll for [`Leadership::may_delete`].
    pub fn recheck(&mut self, outbox: &StateDir, readyz_answers: bool) -> &Role {
        self.decide_now(outbox, readyz_answers, false)
    }

    fn decide_now(&mut self, outbox: &StateDir, readyz_answers: bool, poll: bool) -> &Role {
        let path = self.conf_path();
        if let Some(g) = &self.gate {
            g.set_readyz(readyz_answers);
            g.set_conf_path(&path);
        }
        let role = decide_at(&path, readyz_answers);
        self.apply(role, crate::timefmt::now_epoch(), outbox, poll);
        self.role.as_ref().expect("set by apply")
    }

    fn apply(&mut self, role: Role, now: i64, outbox: &StateDir, poll: bool) {
        if let Some(g) = &self.gate {
            g.observe(&role);
        }
        let changed = !self.role.as_ref().is_some_and(|r| r.same_as(&role));
        let was_leading = self.role.as_ref().is_some_and(Role::leads);
        if role.leads() && !was_leading {
            self.took_over = last_in_control(outbox) != Some(true);
        }
        let this = match &role {
            Role::Leads(_) => Some(true),
            Role::Standby { .. } => Some(false),
            Role::CannotTell(_) => None,
        };
        if this.is_some() && this != self.recorded {
            record_in_control(outbox, this == Some(true));
            self.recorded = this;
        }
        if changed {
            self.since = now;
            self.polls_as_leader = 0;
            match &role {
                Role::Leads(why) => log::info!(
                    "this host now leads: {why}; inventory, node deletions (from its second poll), reconciliation and resends run here"
                ),
                Role::Standby { why, in_control } => log::info!(
                    "this host {}: {why} ({in_control} is in control); delivering its own outbox only",
                    if self.role.as_ref().is_some_and(Role::leads) {
                        "no longer leads"
                    } else {
                        "does not lead"
                    }
                ),
                Role::CannotTell(why) => log::warn!(
                    "this host does not lead: cannot tell which controller is in control: {why}; delivering its own outbox only, no inventory, no deletions"
                ),
            }
        }
        if role.leads() && poll {
            self.polls_as_leader += 1;
        }
        outbox
            .status
            .record_leadership(role.leader(), role.reason(), self.since);
        self.role = Some(role);
    }

    /// Whether this poll may delete nodes: this host leads and led at the previous poll too
    /// (a host that has just become leader only lists; at a transition the old leader may
    /// still be finishing its last poll).
    pub fn may_delete(&self) -> bool {
        self.role.as_ref().is_some_and(Role::leads) && self.polls_as_leader >= 2
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slurm::conf::parse_slurm_conf;
    use std::path::Path;

    fn conf(text: &str) -> SlurmConf {
        let t = text.to_string();
        parse_slurm_conf(
            Path::new("/etc/slurm/slurm.conf"),
            &move |_| Ok(t.clone()),
            &|_| Vec::new(),
        )
        .unwrap()
    }

    fn be(time: u64, index: u64) -> Vec<u8> {
        let mut v = time.to_be_bytes().to_vec();
        v.extend_from_slice(&index.to_be_bytes());
        v
    }

    #[test]
    fn roles_from_the_heartbeat_and_the_own_slurmctld() {
        let dir = std::env::temp_dir().join(format!("cvslurm-leadership-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let c = conf(&format!(
            "SlurmctldHost=ctl1(10.0.0.1)\nSlurmctldHost=ctl2\nSlurmctldTimeout=10\nStateSaveLocation={}\n",
            dir.display()
        ));
        let now = 1_800_000_000;
        let yes = || true;
        let no = || false;
        // One controller: leads, whatever else.
        assert!(decide(Ok(&conf("SlurmctldHost=a\n")), "b", now, &no).leads());
        assert!(matches!(
            decide(Err(NoConf::Unreadable("permission denied")), "ctl1", now, &yes),
            Role::CannotTell(w) if w.contains("permission denied")
        ));
        assert!(matches!(
            decide(Err(NoConf::Missing(Path::new("/etc/slurm/slurm.conf"))), "ctl1", now, &no),
            Role::Leads(w) if w.contains("there is no /etc/slurm/slurm.conf")
        ));
        // No heartbeat yet.
        assert!(matches!(
            decide(Ok(&c), "ctl1", now, &yes),
            Role::CannotTell(_)
        ));
        std::fs::write(dir.join("heartbeat"), be(now - 1, 1)).unwrap();
        assert_eq!(
            decide(Ok(&c), "ctl1.example.com", now, &yes),
            Role::Standby {
                why: "the heartbeat (1 s old) names ctl2, not this host".into(),
                in_control: "ctl2".into()
            }
        );
        assert!(decide(Ok(&c), "ctl2", now, &yes).leads());
        assert!(matches!(
            decide(Ok(&c), "ctl2", now, &no),
            Role::CannotTell(w) if w.contains("no slurmctld runs here")
        ));
        // Stale: nobody leads.
        assert!(
            matches!(decide(Ok(&c), "ctl2", now + 30, &yes), Role::CannotTell(w) if w.contains("old"))
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn readyz_beside_the_heartbeat() {
        let dir = std::env::temp_dir().join(format!("cvslurm-leadership3-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let c = conf(&format!(
            "SlurmctldHost=ctl1(10.0.0.1)\nSlurmctldHost=ctl2\nSlurmctldPort=7000\nSlurmctldTimeout=10\nStateSaveLocation={}\n",
            dir.display()
        ));
        let now = 1_800_000_000;
        let yes = || true;
        let no = || false;
        let cell = std::cell::RefCell::new(Vec::new());
        let asked = &cell;
        let answer = |a: Option<bool>| {
            move |addr: &str, port: u16| {
                asked.borrow_mut().push(format!("{addr}:{port}"));
                a
            }
        };
        let in_control = answer(Some(true));
        let standby = answer(Some(false));
        let silent = answer(None);
        // No heartbeat yet; ctl1's slurmctld (asked at its address) says it is in control.
        assert!(matches!(
            decide_with(Ok(&c), "ctl1", now, &yes, Some(&in_control)),
            Role::Leads(w) if w.contains("answers /readyz: in control")
        ));
        assert_eq!(asked.borrow().last().unwrap(), "10.0.0.1:7000");
        // ...but not when no slurmctld runs here.
        assert!(!decide_with(Ok(&c), "ctl1", now, &no, Some(&in_control)).leads());
        // The heartbeat names ctl2 (asked by name: no address given).
        std::fs::write(dir.join("heartbeat"), be(now - 1, 1)).unwrap();
        assert!(decide_with(Ok(&c), "ctl2", now, &yes, Some(&silent)).leads());
        assert_eq!(asked.borrow().last().unwrap(), "ctl2:7000");
        assert!(matches!(
            decide_with(Ok(&c), "ctl2", now, &yes, Some(&standby)),
            Role::CannotTell(w) if w.contains("answers /readyz as a standby")
        ));
        // ctl1 in control by /readyz while the heartbeat still names ctl2: ctl1 leads.
        assert!(decide_with(Ok(&c), "ctl1", now, &yes, Some(&in_control)).leads());
        assert!(matches!(
            decide_with(Ok(&c), "ctl1", now, &yes, Some(&standby)),
            Role::Standby { .. }
        ));
        // Without /readyz (older Slurm): the heartbeat alone, as decide().
        assert_eq!(
            decide_with(Ok(&c), "ctl1", now, &yes, None),
            decide(Ok(&c), "ctl1", now, &yes)
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_new_leader_deletes_from_its_second_poll() {
        let dir = std::env::temp_dir().join(format!("cvslurm-leadership2-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let outbox = StateDir::new(&dir);
        let mut l = Leadership::default();
        assert!(!l.may_delete());
        l.apply(Role::Leads("x".into()), 100, &outbox, true);
        assert!(!l.may_delete(), "first poll as leader");
        // A recheck within that poll (after a long discovery) is not a second poll.
        l.apply(Role::Leads("x".into()), 105, &outbox, false);
        assert!(!l.may_delete(), "rechecked within the first poll");
        l.apply(Role::Leads("y".into()), 110, &outbox, true);
        assert!(l.may_delete());
        let v = outbox.status.read().unwrap();
        assert_eq!(v["leader"], true);
        assert_eq!(v["leader_reason"], "y");
        assert_eq!(v["leader_since"], 100);
        l.apply(Role::CannotTell("stale".into()), 120, &outbox, true);
        assert!(!l.may_delete());
        assert_eq!(
            outbox.status.read().unwrap()["leader"],
            serde_json::Value::Null
        );
        l.apply(Role::Leads("again".into()), 130, &outbox, true);
        assert!(!l.may_delete(), "first poll after leading again");
        l.apply(
            Role::Standby {
                why: "w".into(),
                in_control: "ctl1".into(),
            },
            140,
            &outbox,
            true,
        );
        let v = outbox.status.read().unwrap();
        assert_eq!(v["leader"], false);
        assert_eq!(v["leader_since"], 140);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A restart of the leader's service is no change of controller: the catch-up runs only
    /// when this host last saw another controller in control (or cannot know).
    #[test]
    fn took_over_only_from_another_controller() {
        let dir = std::env::temp_dir().join(format!("cvslurm-leadership4-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let outbox = StateDir::new(&dir);
        let leads = || Role::Leads("x".into());
        let standby = || Role::Standby {
            why: "w".into(),
            in_control: "ctl2".into(),
        };
        // Nothing recorded (a first start, an upgrade): cannot know, so a takeover.
        let mut l = Leadership::default();
        l.apply(leads(), 100, &outbox, true);
        assert!(l.took_over());
        assert_eq!(last_in_control(&outbox), Some(true));
        // The leader's service restarts: not a takeover, even through "cannot tell" (its
        // slurmctld restarted, nobody else took control).
        let mut l = Leadership::default();
        l.apply(Role::CannotTell("no slurmctld".into()), 110, &outbox, true);
        l.apply(leads(), 120, &outbox, true);
        assert!(!l.took_over());
        // Another controller in control meanwhile: a takeover, in the same process...
        l.apply(standby(), 130, &outbox, true);
        assert_eq!(last_in_control(&outbox), Some(false));
        l.apply(leads(), 140, &outbox, true);
        assert!(l.took_over());
        // ...and across a restart.
        l.apply(standby(), 150, &outbox, true);
        let mut l = Leadership::default();
        l.apply(leads(), 160, &outbox, true);
        assert!(l.took_over());
        // A hostile record: not known, so a takeover; never followed.
        let rec = dir.join(LAST_IN_CONTROL);
        std::fs::remove_file(&rec).unwrap();
        std::os::unix::fs::symlink(dir.join("elsewhere"), &rec).unwrap();
        std::fs::write(dir.join("elsewhere"), "this\n").unwrap();
        assert_eq!(last_in_control(&outbox), None);
        std::fs::remove_file(&rec).unwrap();
        std::fs::write(&rec, "this\nand more").unwrap();
        assert_eq!(last_in_control(&outbox), None);
        nix::unistd::mkfifo(&rec.with_extension("fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        std::fs::rename(rec.with_extension("fifo"), &rec).unwrap();
        assert_eq!(last_in_control(&outbox), None, "a FIFO never blocks");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The gate's terms: one per stretch of leading; none while not leading.
    #[test]
    fn the_gate_follows_the_role_in_terms() {
        let g = Gate::with(true, Box::new(|_| Role::CannotTell("t".into())));
        assert_eq!(g.term(), None, "decided itself: cannot tell");
        g.observe(&Role::Leads("a".into()));
        let t = g.term().unwrap();
        g.observe(&Role::Leads("b".into()));
        assert_eq!(g.term(), Some(t), "the same term");
        assert!(g.may_send_running(t, &|_| false));
        assert!(!g.may_send_running(t - 1, &|_| false));
        assert!(g.may_send_running(t - 1, &|term| term == t));
        g.observe(&Role::CannotTell("c".into()));
        assert_eq!(g.term(), None);
        assert!(!g.may_send_running(u128::MAX, &|_| true));
        g.observe(&Role::Leads("d".into()));
        assert!(g.term().unwrap() > t, "a new term");
    }
}
