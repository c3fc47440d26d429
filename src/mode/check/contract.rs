//! `cvslurm check --contract`: asks the configured CloudVision the questions about
//! `arista.computejob.v1` that only a live server answers (README.md, "CloudVision
//! compatibility"), and says for each what the server did and whether cvslurm's assumption
//! holds.
//!
//! It WRITES to CloudVision: a JobConfig (and, for question 5, a NodeConfig) under a
//! throw-away key (`cvslurm-contract-<pid>-<unix time>@<cluster>`, which no Slurm job or node
//! has), created, read back (GetOne), changed and deleted. Every record it posts is a whole
//! one, as cvslurm itself sends them and as a server that validates each POST as a whole
//! record (Arista's own fake CloudVision) requires: a JobConfig has `key`, `name`, `state`,
//! `start_time`, `location` (the cluster) and exactly one non-empty list (`nodes` or
//! `interfaces`), `end_time` only when ended; a NodeConfig has `key`, `location`, `hostname`
//! and a non-empty `data_interfaces`. Only the requests that ask about a refusal differ: an
//! unknown field (6), a `type` (8), a hostname other than `key.id` (5).
//!
//! The questions (the numbers stay those of docs/design.md; 3b, whether an empty list clears the
//! stored one, is gone: cvslurm never sends an empty list):
//! 1. `GET …/JobConfig` without a key: any CloudVision answer is fine.
//! 2. GetOne of a key that does not exist: CloudVision's not-found answer (404, code 5).
//! 3. A whole Set by `nodes`, then a whole Set of the same key by `interfaces`: merged (both
//!    lists stored) or replaced (interfaces only) are both fine, since cvslurm deletes a
//!    job's record before it switches lists; the line says which.
//! 4. A whole RUNNING Set (no `end_time`) after a whole COMPLETED one: `end_time` kept (a
//!    merging Set) holds; gone is a harmless difference (`note`).
//! 5. A NodeConfig whose `hostname` is not its `key.id`: asked only when the configuration
//!    makes cvslurm send such records (`NodeHostname=hostname`, `QualifyNodeNames=yes`); a
//!    refusal is a `FAIL` naming the setting to turn off. Otherwise an `ok` line says why it
//!    is not asked.
//! 6. A whole Set with an unknown field: refused or ignored, both fine (cvslurm sends none).
//! 7. `DELETE …/JobConfig?key.id=`, then a whole RUNNING: deleted, and no old `end_time`. A
//!    server without the DELETE (405, 501, or an answer that is not CloudVision's) is a
//!    `note`: cvslurm then posts the whole record without deleting it first.
//! 8. A whole ended Set with `"type":"JOB_TYPE_CONFIGURED"` (what `cvslurm send <jobid>`
//!    sends, as Arista's newer Slurm client does): accepted holds; refused is a `note`
//!    (those records would be refused; the hooks' records carry no type).
//!
//! Answers are read as CloudVision's ([`SendError::NotCloudVision`]). An opening probe that
//! is not answered as CloudVision does not stop the run: one `note` line says so, and the
//! writes are asked all the same. Each question whose GET or GetOne is not answered as
//! CloudVision (Arista's fake CloudVision answers no GET) says `note … cannot tell` and is
//! counted as not answered: it is never "holds". A Set not answered as CloudVision (a web
//! server's page) means nothing can be asked of this server: that question and the later
//! ones are `SKIP`ped.
//!
//! Each key a Set may have stored is deleted at the end whatever happened before (a key no
//! Set was taken under has nothing to delete and gets no DELETE); a key that could not be
//! deleted is named, with the curl command that deletes it: as `note clean-up:` where the
//! server has no JobConfig DELETE (the job is left COMPLETED), as `FAIL clean-up:` otherwise.
//!
//! Exit codes: [`EXIT_HOLDS`] (0) when every question was answered and every assumption holds
//! or differs in a way cvslurm copes with (`note`); [`EXIT_DOES_NOT_HOLD`] (1) when one does
//! not (`FAIL`); else [`EXIT_COULD_NOT_RUN`] (2) when a question could not be asked (`SKIP`),
//! or its answer could not be told (`note … cannot tell`: e.g. Arista's fake CloudVision,
//! which takes every write but answers no GET), or a key could not be deleted.
//!
//! What the server answers is hostile like any outside byte: it is only compared, and quoted
//! on one line, capped, control characters escaped.
//!
//! SIGINT or SIGTERM (Ctrl-C, a `timeout`, a closed session) stops the questions at the next
//! request (the one under way is finished: its outcome says whether a record may be stored),
//! deletes what the run may have stored, and exits 130 or 143. The line it prints first names
//! the throw-away keys and the command that deletes each by hand; a second signal ends the
//! process at once (the handler is reset), leaving those lines as the record of what is left.

use crate::cloudvision::{Answer, Client, Kind, SendError};
use crate::text::one_line;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicI32, Ordering};

/// The signal (SIGINT or SIGTERM) that asked the run to stop; 0 while none did.
static STOP: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_stop_signal(sig: nix::libc::c_int) {
    STOP.store(sig, Ordering::SeqCst);
}

/// Catches SIGINT and SIGTERM into [`STOP`], once each (a second one ends the process), and
/// lets interrupted system calls restart (a request under way is finished).
fn catch_stop_signals() {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    let act = SigAction::new(
        SigHandler::Handler(on_stop_signal),
        SaFlags::SA_RESTART | SaFlags::SA_RESETHAND,
        SigSet::empty(),
    );
    for sig in [Signal::SIGINT, Signal::SIGTERM] {
        // SAFETY: the handler only stores into an atomic (async-signal-safe).
        let _ = unsafe { sigaction(sig, &act) };
    }
}

/// The signal that asked the run to stop, if one did.
fn stop_signal() -> Option<nix::sys::signal::Signal> {
    match STOP.load(Ordering::SeqCst) {
        0 => None,
        n => nix::sys::signal::Signal::try_from(n).ok(),
    }
}

/// Every question answered, and every assumption holds (or differs harmlessly).
pub const EXIT_HOLDS: i32 = 0;
/// Some assumption does not hold (named in the output).
pub const EXIT_DOES_NOT_HOLD: i32 = 1;
/// Some question could not be asked (CloudVision unreachable, the token refused, a failure
/// midway, a server that does not answer as CloudVision), or its answer could not be told (a
/// GetOne not answered as CloudVision), or a throw-away key could not be deleted.
pub const EXIT_COULD_NOT_RUN: i32 = 2;

/// The most characters of the server's words quoted in one line.
const QUOTE: usize = 160;

/// A locally administered MAC (no NIC's burnt-in address) for the throw-away job.
const MAC: &str = "02:00:00:c5:00:01";

/// The throw-away job's `name`.
const NAME: &str = "cvslurm check --contract";

/// The field no schema knows, of question 6.
const UNKNOWN_FIELD: &str = "cvslurm_contract_unknown_field";

/// The `type` of question 8: what `cvslurm send <jobid>` sends.
const CONFIGURED: &str = "JOB_TYPE_CONFIGURED";

const RUNNING: &str = "JOB_STATE_RUNNING";
const COMPLETED: &str = "JOB_STATE_COMPLETED";

/// What one question found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Holds,
    DoesNotHold,
    /// The server differs from what cvslurm assumes in a way it copes with.
    Differs,
    /// Asked, but the answer cannot be read: the server does not answer a GET as CloudVision.
    CannotTell,
    /// Not asked, or no answer: CloudVision failed, did not answer or refused the token.
    Unasked,
}

/// The list a throw-away JobConfig names (exactly one, never empty).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum List {
    Nodes,
    Interfaces,
}

/// One run of the questions against one server.
struct Run<'a> {
    client: &'a Client,
    curl: String,
    job: String,
    node: String,
    /// `location` of every record: the cluster.
    cluster: String,
    start: String,
    end: String,
    /// The settings that make cvslurm's NodeConfig `hostname` differ from its `key.id`.
    hostname_settings: Vec<String>,
    /// Set once a request could not be made at all: the later questions are not asked.
    broken: Option<String>,
    failed: Vec<&'static str>,
    differs: Vec<&'static str>,
    untold: Vec<&'static str>,
    unasked: Vec<&'static str>,
    /// A Set of the job (of the node) may have been stored: it is deleted at the end.
    job_stored: bool,
    node_stored: bool,
    /// A Set was not answered as CloudVision: the questions stopped there.
    not_cloudvision: bool,
}

/// Runs the questions with `client` (token and server from the configuration), the keys
/// qualified by `cluster` (also every record's `location`); `curl` is what a hand-made curl
/// needs for CloudVision (the token header read from the token file, the CA), shown if a key
/// cannot be deleted; `hostname_settings` are the settings in force that make a NodeConfig's
/// `hostname` differ from its `key.id` (`NodeHostname=hostname`, `QualifyNodeNames=yes`):
/// question 5 is asked only when there is one. Prints one line per question, the clean-up
/// and a summary; returns [`EXIT_HOLDS`], [`EXIT_DOES_NOT_HOLD`] or [`EXIT_COULD_NOT_RUN`].
pub fn run(client: &Client, cluster: &str, curl: &str, hostname_settings: &[&str]) -> i32 {
    catch_stop_signals();
    let server = client.base_url().trim_start_matches("https://").to_string();
    // Reachable, TLS, the token: else nothing is written. A server that answers, but not as
    // CloudVision, is still asked the writes.
    match client.probe(None) {
        Ok(_) => {}
        Err(e @ SendError::NotCloudVision { .. }) => println!(
            "note {} does not answer a GetOne as CloudVision ({}): the questions that read a record back cannot be answered; the writes are asked all the same",
            crate::text::escape_control(&server),
            said_err(&e)
        ),
        Err(e) => {
            println!(
                "FAIL CloudVision {server}: {}: nothing was written; run cvslurm check",
                one_line(&e.to_string(), 400)
            );
            return EXIT_COULD_NOT_RUN;
        }
    }
    let now = crate::timefmt::now_epoch();
    let stem = format!("cvslurm-contract-{}-{now}", std::process::id());
    let mut r = Run {
        client,
        curl: curl.to_string(),
        job: crate::cloudvision::payload::job_key(&stem, cluster),
        node: format!("{stem}@{cluster}"),
        cluster: cluster.to_string(),
        start: crate::timefmt::format_epoch(now - 60).unwrap_or_default(),
        end: crate::timefmt::format_epoch(now).unwrap_or_default(),
        hostname_settings: hostname_settings.iter().map(|s| s.to_string()).collect(),
        broken: None,
        failed: Vec::new(),
        differs: Vec::new(),
        untold: Vec::new(),
        unasked: Vec::new(),
        job_stored: false,
        node_stored: false,
        not_cloudvision: false,
    };
    println!(
        "asking CloudVision {server} with the throw-away {} {} (deleted at the end)",
        if r.hostname_settings.is_empty() {
            "JobConfig"
        } else {
            "JobConfig and NodeConfig"
        },
        r.job
    );
    for question in 1..=8 {
        if stop_signal().is_some() {
            break;
        }
        match question {
            1 => r.q1_get_without_key(),
            2 => r.q2_unknown_key(),
            3 => r.q3_other_list(),
            4 => r.q4_end_time_kept(),
            5 => r.q5_hostname(),
            6 => r.q6_unknown_field(),
            7 => r.q7_delete_job(),
            _ => r.q8_type(),
        }
    }
    if let Some(sig) = stop_signal() {
        return r.interrupted(sig);
    }
    let clean = r.clean_up();
    r.summary();
    if !r.failed.is_empty() {
        EXIT_DOES_NOT_HOLD
    } else if !r.unasked.is_empty() || !r.untold.is_empty() || !clean {
        EXIT_COULD_NOT_RUN
    } else {
        EXIT_HOLDS
    }
}

/// A request's outcome in words: `HTTP 404: not found`, or why there was none.
fn said(r: &Result<Answer, SendError>) -> String {
    match r {
        Ok(a) => format!("HTTP {}", a.status),
        Err(e) => said_err(e),
    }
}

/// [`said`] of an error.
fn said_err(e: &SendError) -> String {
    let words = match e {
        SendError::Rejected { status, message }
        | SendError::Server { status, message }
        | SendError::TokenRefused { status, message }
            if !message.is_empty() =>
        {
            format!("HTTP {status}: {message}")
        }
        SendError::Rejected { status, .. }
        | SendError::Server { status, .. }
        | SendError::TokenRefused { status, .. } => format!("HTTP {status}"),
        SendError::NotCloudVision { status, excerpt } if excerpt.is_empty() => {
            format!("HTTP {status} with an empty body")
        }
        SendError::NotCloudVision { status, excerpt } => format!("HTTP {status} {excerpt:?}"),
        e => e.to_string(),
    };
    one_line(&words, QUOTE)
}

/// True when the outcome says nothing about the question: no answer, a server failure, rate
/// limiting, the token, or an answer that is not CloudVision's.
fn no_answer(e: &SendError) -> bool {
    !matches!(e, SendError::Rejected { .. } | SendError::Invalid(_))
}

/// True when the outcome of a Set leaves its record possibly stored: accepted, or no answer
/// that says it was not (a timeout, a lost connection, a server failure).
fn may_store(r: &Result<Answer, SendError>) -> bool {
    matches!(
        r,
        Ok(_) | Err(SendError::Unreachable(_) | SendError::Timeout(_) | SendError::Server { .. })
    )
}

/// True for a DELETE answer of a server without a JobConfig DELETE: 405, 501, or an answer
/// that is not CloudVision's (Arista's fake CloudVision: 404 `{"errors":[…]}`).
fn no_delete(e: &SendError) -> bool {
    matches!(
        e,
        SendError::NotCloudVision { .. }
            | SendError::Rejected { status: 405, .. }
            | SendError::Server { status: 501, .. }
    )
}

/// A field of a GetOne's value by its request name (`start_time`) or CloudVision's
/// lowerCamelCase answer name (`startTime`); `null` counts as absent.
fn field<'v>(v: &'v Value, snake: &str) -> Option<&'v Value> {
    let mut camel = String::new();
    let mut up = false;
    for c in snake.chars() {
        if c == '_' {
            up = true;
        } else if up {
            camel.push(c.to_ascii_uppercase());
            up = false;
        } else {
            camel.push(c);
        }
    }
    v.get(snake)
        .or_else(|| v.get(&camel))
        .filter(|x| !x.is_null())
}

/// The strings of a `{"values":[…]}` field; empty when absent.
fn list(v: &Value, snake: &str) -> Vec<String> {
    field(v, snake)
        .and_then(|w| w.get("values"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(|s| one_line(s, 64)))
                .collect()
        })
        .unwrap_or_default()
}

/// A string field, quoted for a line.
fn text(v: &Value, snake: &str) -> Option<String> {
    field(v, snake)
        .and_then(Value::as_str)
        .map(|s| one_line(s, 64))
}

impl Run<'_> {
    fn line(&mut self, n: &'static str, verdict: Verdict, what: &str) {
        let tag = match verdict {
            Verdict::Holds => "ok  ",
            Verdict::DoesNotHold => {
                self.failed.push(n);
                "FAIL"
            }
            Verdict::Differs => {
                self.differs.push(n);
                "note"
            }
            Verdict::CannotTell => {
                self.untold.push(n);
                "note"
            }
            Verdict::Unasked => {
                self.unasked.push(n);
                "SKIP"
            }
        };
        println!("{tag} {n}. {}", crate::text::escape_control(what));
    }

    /// False (and the question reported as not asked) once CloudVision stopped answering.
    fn go(&mut self, n: &'static str, question: &str) -> bool {
        if let Some(why) = self.broken.clone() {
            self.line(
                n,
                Verdict::Unasked,
                &format!("{question}: not asked: {why}"),
            );
            return false;
        }
        true
    }

    /// Reports a request that got no usable answer; true when it did.
    fn answered(
        &mut self,
        n: &'static str,
        question: &str,
        step: &str,
        r: &Result<Answer, SendError>,
    ) -> bool {
        match r {
            Err(e @ SendError::NotCloudVision { status, .. }) => {
                self.line(
                    n,
                    Verdict::Unasked,
                    &format!(
                        "{question}: {step}: the server is not answering as CloudVision: {}",
                        said_err(e)
                    ),
                );
                self.broken = Some(format!(
                    "the server did not answer as CloudVision (question {n}, {step}: HTTP {status})"
                ));
                self.not_cloudvision = true;
                false
            }
            Err(e) if no_answer(e) => {
                let why = format!("{step}: {}", said(r));
                self.line(n, Verdict::Unasked, &format!("{question}: {why}"));
                self.broken = Some(format!("an earlier request got no answer ({why})"));
                false
            }
            _ => true,
        }
    }

    /// Reports question `n` as not answered: the server does not answer a GET as CloudVision.
    fn cannot_tell(&mut self, n: &'static str, question: &str, done: &str, e: &SendError) {
        let done = if done.is_empty() {
            String::new()
        } else {
            format!("{done}; ")
        };
        self.line(
            n,
            Verdict::CannotTell,
            &format!(
                "{question}: {done}cannot tell: the server does not answer GetOne as CloudVision ({})",
                said_err(e)
            ),
        );
    }

    /// Stopped by a signal: says what the run may have left and how to delete it by hand
    /// (in case the clean-up is cut short too), deletes it, and returns 128 + the signal.
    fn interrupted(&mut self, sig: nix::sys::signal::Signal) -> i32 {
        let mut left = Vec::new();
        if self.job_stored {
            left.push(format!(
                "JobConfig {}: curl -X DELETE {} '{}'",
                one_line(&self.job, QUOTE),
                crate::text::escape_control(&self.curl),
                one_line(&self.client.job_key_url(&self.job), 400)
            ));
        }
        if self.node_stored {
            left.push(format!(
                "NodeConfig {}: curl -X DELETE {} '{}'",
                one_line(&self.node, QUOTE),
                crate::text::escape_control(&self.curl),
                one_line(&self.client.node_key_url(&self.node), 400)
            ));
        }
        if left.is_empty() {
            println!("interrupted by {sig}: the questions stop here; nothing was stored");
        } else {
            println!(
                "interrupted by {sig}: the questions stop here; deleting the throw-away records (should that be cut short, delete them by hand: {})",
                left.join("; ")
            );
        }
        let clean = self.clean_up();
        println!(
            "interrupted by {sig}{}",
            if clean {
                ""
            } else {
                ": the throw-away records above are still in CloudVision"
            }
        );
        128 + sig as i32
    }

    /// Posts a JobConfig as it is, and notes whether it may be stored. Once a signal asked
    /// the run to stop, nothing more is posted.
    fn post_job(&mut self, body: Value) -> Result<Answer, SendError> {
        if let Some(sig) = stop_signal() {
            return Err(SendError::Unreachable(format!(
                "not sent: interrupted by {sig}"
            )));
        }
        let r = self.client.post_raw(Kind::Job, &body, None);
        self.job_stored |= may_store(&r);
        r
    }

    /// The whole JobConfig of the throw-away job, as cvslurm sends one: `state` since `start`
    /// (with `end_time` when ended), by `list` (the node, or `MAC`).
    fn whole(&self, state: &str, by: List) -> Value {
        let mut v = json!({
            "key": {"id": self.job},
            "name": NAME,
            "location": self.cluster,
            "state": state,
            "start_time": self.start,
        });
        if state != RUNNING {
            v["end_time"] = json!(self.end);
        }
        match by {
            List::Nodes => v["nodes"] = json!({"values": [self.node]}),
            List::Interfaces => v["interfaces"] = json!({"values": [MAC]}),
        }
        v
    }

    /// The whole NodeConfig of the throw-away node, with `hostname`.
    fn whole_node(&self, hostname: &str) -> Value {
        json!({
            "key": {"id": self.node},
            "location": self.cluster,
            "hostname": hostname,
            "data_interfaces": {"values": [
                {"name": "eth0", "mac_address": MAC, "ip_addresses": {"values": []}}
            ]},
        })
    }

    /// GetOne: `Ok(Some(value))`, `Ok(None)` for a missing key (CloudVision's not-found
    /// answer, or 200 without a value).
    fn read(&self, kind: Kind, id: &str) -> Result<Option<Value>, SendError> {
        let r = match kind {
            Kind::Job => self.client.get_job(id, None),
            Kind::Node => self.client.get_node(id, None),
        };
        match r {
            Ok(a) => Ok(serde_json::from_str::<Value>(&a.body)
                .ok()
                .and_then(|v| v.get("value").cloned())
                .filter(|v| v.as_object().is_some_and(|o| !o.is_empty()))),
            Err(SendError::Rejected { status: 404, .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// [`Run::read`] of the job for question `n`, after `done` (what was accepted); reported
    /// when it fails.
    fn read_job(&mut self, n: &'static str, question: &str, done: &str) -> Option<Value> {
        match self.read(Kind::Job, &self.job.clone()) {
            Ok(Some(v)) => Some(v),
            Ok(None) => {
                self.line(
                    n,
                    Verdict::DoesNotHold,
                    &format!("{question}: {done}, yet a GetOne right after finds no record"),
                );
                None
            }
            Err(e @ SendError::NotCloudVision { .. }) => {
                self.cannot_tell(n, question, done, &e);
                None
            }
            Err(e) => {
                let r = Err(e);
                if self.answered(n, question, "the GetOne", &r) {
                    self.line(
                        n,
                        Verdict::DoesNotHold,
                        &format!("{question}: the GetOne was refused: {}", said(&r)),
                    );
                }
                None
            }
        }
    }

    /// Posts `body` for question `n`; true when accepted, else reported.
    fn set(&mut self, n: &'static str, question: &str, step: &str, body: Value) -> bool {
        let r = self.post_job(body);
        if !self.answered(n, question, step, &r) {
            return false;
        }
        if r.is_err() {
            self.line(
                n,
                Verdict::DoesNotHold,
                &format!("{question}: {step} was refused: {}", said(&r)),
            );
            return false;
        }
        true
    }

    fn q1_get_without_key(&mut self) {
        let q = "GET JobConfig without a key";
        if !self.go("1", q) {
            return;
        }
        let r = self.client.get_job_without_key(None);
        if let Err(e @ SendError::NotCloudVision { .. }) = &r {
            self.cannot_tell("1", q, "", e);
            return;
        }
        if !self.answered("1", q, "the GET", &r) {
            return;
        }
        self.line(
            "1",
            Verdict::Holds,
            &format!(
                "{q}: {}; either an error or an answer is fine: cvslurm's probe is a GetOne of a key no job has",
                said(&r)
            ),
        );
    }

    fn q2_unknown_key(&mut self) {
        let q = "GetOne of a JobConfig key that does not exist";
        if !self.go("2", q) {
            return;
        }
        let r = self.client.get_job(&self.job.clone(), None);
        if let Err(e @ SendError::NotCloudVision { .. }) = &r {
            self.cannot_tell("2", q, "", e);
            return;
        }
        if !self.answered("2", q, "the GetOne", &r) {
            return;
        }
        match &r {
            Err(SendError::Rejected { status: 404, .. }) => self.line(
                "2",
                Verdict::Holds,
                &format!("{q}: {}; cvslurm assumes CloudVision's not-found answer: holds", said(&r)),
            ),
            _ => self.line(
                "2",
                Verdict::DoesNotHold,
                &format!(
                    "{q}: {}; cvslurm assumes CloudVision's not-found answer, 404 (its probe takes 200 as well, this check reads a missing record as 404 or an empty answer)",
                    said(&r)
                ),
            ),
        }
    }

    fn q3_other_list(&mut self) {
        let q = "a whole Set by interfaces after a whole Set by nodes";
        if !self.go("3", q) {
            return;
        }
        if !self.set("3", q, "the Set by nodes", self.whole(RUNNING, List::Nodes)) {
            return;
        }
        let by_interfaces = self.whole(RUNNING, List::Interfaces);
        if !self.set("3", q, "the Set by interfaces", by_interfaces) {
            return;
        }
        let Some(v) = self.read_job("3", q, "both Sets were accepted") else {
            return;
        };
        let nodes = !list(&v, "nodes").is_empty();
        let interfaces = !list(&v, "interfaces").is_empty();
        let fine = "either is fine: cvslurm deletes a job's record before it switches lists";
        match (nodes, interfaces) {
            (true, true) => self.line(
                "3",
                Verdict::Holds,
                &format!("{q}: merged (both lists are stored); {fine}: holds"),
            ),
            (false, true) => self.line(
                "3",
                Verdict::Holds,
                &format!("{q}: replaced (only the interfaces are stored); {fine}: holds"),
            ),
            (_, false) => self.line(
                "3",
                Verdict::DoesNotHold,
                &format!(
                    "{q}: the interfaces of the accepted Set are not stored (nodes {}); cvslurm assumes a Set's list is stored",
                    if nodes { "kept" } else { "gone" }
                ),
            ),
        }
    }

    fn q4_end_time_kept(&mut self) {
        let q = "a whole RUNNING Set (no end_time) after a whole COMPLETED one";
        if !self.go("4", q) {
            return;
        }
        let done = self.whole(COMPLETED, List::Interfaces);
        if !self.set("4", q, "the COMPLETED Set", done) {
            return;
        }
        let running = self.whole(RUNNING, List::Interfaces);
        if !self.set("4", q, "the RUNNING Set", running) {
            return;
        }
        let Some(v) = self.read_job("4", q, "both Sets were accepted") else {
            return;
        };
        match field(&v, "end_time") {
            Some(_) => self.line(
                "4",
                Verdict::Holds,
                &format!("{q}: end_time is kept; cvslurm assumes so and deletes a requeued job's record before its new RUNNING (question 7): holds"),
            ),
            None => self.line(
                "4",
                Verdict::Differs,
                &format!("{q}: end_time is gone; cvslurm assumes a Set keeps it, which is harmless here: its DELETE before a requeued job's RUNNING is then not needed"),
            ),
        }
    }

    fn q5_hostname(&mut self) {
        let q = "a NodeConfig whose hostname is not its key.id";
        if self.hostname_settings.is_empty() {
            // A question of the configuration, not of the server: answered even when the
            // server stopped answering.
            self.line(
                "5",
                Verdict::Holds,
                &format!("{q}: not asked: with this configuration (NodeHostname=nodename, QualifyNodeNames=no) cvslurm sends hostname = key.id"),
            );
            return;
        }
        if !self.go("5", q) {
            return;
        }
        let settings = self.hostname_settings.join(" and ");
        let off = self
            .hostname_settings
            .iter()
            .map(|s| match s.split('=').next() {
                Some("NodeHostname") => "NodeHostname=nodename",
                Some("QualifyNodeNames") => "QualifyNodeNames=no",
                _ => s,
            })
            .collect::<Vec<_>>()
            .join(" and ");
        let host = format!("cvslurm-contract-host-{}", std::process::id());
        let body = self.whole_node(&host);
        let r = match stop_signal() {
            Some(sig) => Err(SendError::Unreachable(format!(
                "not sent: interrupted by {sig}"
            ))),
            None => self.client.post_raw(Kind::Node, &body, None),
        };
        self.node_stored |= may_store(&r);
        if !self.answered("5", q, "the Set", &r) {
            return;
        }
        if r.is_err() {
            self.line(
                "5",
                Verdict::DoesNotHold,
                &format!(
                    "{q}: refused: {}; with {settings} cvslurm sends such NodeConfigs, and this server refuses them: turn {settings} off in cloudvision.conf ({off}: hostname = key.id)",
                    said(&r)
                ),
            );
            return;
        }
        let shown = match self.read(Kind::Node, &self.node.clone()) {
            Ok(Some(v)) => match text(&v, "hostname") {
                Some(h) if h == host => "GetOne shows the hostname sent".to_string(),
                Some(h) => format!("GetOne shows hostname {h:?}"),
                None => "GetOne shows no hostname".to_string(),
            },
            Ok(None) => "GetOne finds no record".to_string(),
            Err(e @ SendError::NotCloudVision { .. }) => format!(
                "the server does not answer GetOne as CloudVision: {}",
                said_err(&e)
            ),
            Err(e) => format!("GetOne: {}", said_err(&e)),
        };
        self.line(
            "5",
            Verdict::Holds,
            &format!(
                "{q}: accepted ({shown}); cvslurm sends such NodeConfigs with {settings}: holds"
            ),
        );
    }

    fn q6_unknown_field(&mut self) {
        let q = "a whole Set with an unknown field";
        if !self.go("6", q) {
            return;
        }
        let mut body = self.whole(RUNNING, List::Interfaces);
        body[UNKNOWN_FIELD] = json!("x");
        let r = self.post_job(body);
        if !self.answered("6", q, "the Set", &r) {
            return;
        }
        let fine = "either a refusal or ignoring it is fine: cvslurm sends no other field";
        match &r {
            Err(SendError::Rejected { .. }) => self.line(
                "6",
                Verdict::Holds,
                &format!("{q}: rejected ({}); {fine}: holds", said(&r)),
            ),
            Ok(_) => {
                let kept = match self.read(Kind::Job, &self.job.clone()) {
                    Ok(Some(v)) if field(&v, UNKNOWN_FIELD).is_some() => "stored",
                    Ok(_) => "not stored",
                    Err(_) => "stored or not: the GetOne did not tell",
                };
                self.line(
                    "6",
                    Verdict::Holds,
                    &format!(
                        "{q}: ignored ({}, the field {kept}); {fine}: holds",
                        said(&r)
                    ),
                );
            }
            Err(_) => self.line(
                "6",
                Verdict::DoesNotHold,
                &format!("{q}: {}; cvslurm assumes a refusal or ignored", said(&r)),
            ),
        }
    }

    fn q7_delete_job(&mut self) {
        let q = "JobConfig DELETE, then a whole RUNNING";
        if !self.go("7", q) {
            return;
        }
        let done = self.whole(COMPLETED, List::Interfaces);
        if !self.set("7", q, "the COMPLETED Set", done) {
            return;
        }
        let r = self.client.delete_job(&self.job.clone(), None);
        if let Err(e) = &r {
            if no_delete(e) {
                self.line(
                    "7",
                    Verdict::Differs,
                    &format!("{q}: the server has no JobConfig DELETE ({}): cvslurm then posts the whole record without deleting it first (a requeued job's RUNNING may show the earlier run's end_time on a server whose Set merges)", said(&r)),
                );
                return;
            }
        }
        if !self.answered("7", q, "the DELETE", &r) {
            return;
        }
        if r.is_err() {
            self.line(
                "7",
                Verdict::DoesNotHold,
                &format!("{q}: the DELETE was refused: {}; cvslurm deletes a requeued job's record so that its new RUNNING does not keep the old end_time", said(&r)),
            );
            return;
        }
        let deleted = format!("the DELETE answered {}", said(&r));
        match self.read(Kind::Job, &self.job.clone()) {
            Ok(None) => {}
            Ok(Some(_)) => {
                self.line(
                    "7",
                    Verdict::DoesNotHold,
                    &format!("{q}: {deleted} but a GetOne still finds the record"),
                );
                return;
            }
            Err(e @ SendError::NotCloudVision { .. }) => {
                self.cannot_tell("7", q, &deleted, &e);
                return;
            }
            Err(e) => {
                let g = Err(e);
                if self.answered("7", q, "the GetOne after the DELETE", &g) {
                    self.line(
                        "7",
                        Verdict::DoesNotHold,
                        &format!("{q}: the GetOne after the DELETE: {}", said(&g)),
                    );
                }
                return;
            }
        }
        let running = self.whole(RUNNING, List::Interfaces);
        if !self.set("7", q, "the RUNNING Set after the DELETE", running) {
            return;
        }
        let Some(v) = self.read_job("7", q, &format!("{deleted}, the RUNNING was accepted")) else {
            return;
        };
        if field(&v, "end_time").is_some() {
            self.line(
                "7",
                Verdict::DoesNotHold,
                &format!(
                    "{q}: deleted ({}), yet the new RUNNING shows the old end_time",
                    said(&r)
                ),
            );
        } else {
            self.line(
                "7",
                Verdict::Holds,
                &format!(
                    "{q}: deleted ({}), the new RUNNING has no end_time; cvslurm assumes so: holds",
                    said(&r)
                ),
            );
        }
    }

    fn q8_type(&mut self) {
        let q = "a whole ended Set with \"type\":\"JOB_TYPE_CONFIGURED\" (what cvslurm send <jobid> sends)";
        if !self.go("8", q) {
            return;
        }
        let mut body = self.whole(COMPLETED, List::Nodes);
        body["type"] = json!(CONFIGURED);
        let r = self.post_job(body);
        if !self.answered("8", q, "the Set", &r) {
            return;
        }
        match &r {
            Ok(_) => self.line(
                "8",
                Verdict::Holds,
                &format!("{q}: accepted ({}); cvslurm send <jobid> sends it, as Arista's cv-job-send.py does: holds", said(&r)),
            ),
            Err(_) => self.line(
                "8",
                Verdict::Differs,
                &format!("{q}: refused ({}): the records of cvslurm send <jobid> would be refused by this server, while the hooks' records (no type) are not", said(&r)),
            ),
        }
    }

    /// Deletes each throw-away key a Set may have stored (a missing one is gone already). A
    /// JobConfig that cannot be deleted is at least ended. Returns false, after naming what
    /// is left and how to delete it by hand, when something could not be removed (a job left
    /// by a server without a JobConfig DELETE is named too, but counts as cleaned up: there
    /// is no other way).
    fn clean_up(&mut self) -> bool {
        // (kind, key, URL, the DELETE's answer, true when the server cannot delete it)
        let mut left: Vec<(&str, String, String, String, bool)> = Vec::new();
        let mut deleted = Vec::new();
        let job = self.job.clone();
        if self.job_stored {
            let r = self.client.delete_job(&job, None);
            if matches!(r, Ok(_) | Err(SendError::Rejected { status: 404, .. })) {
                deleted.push("JobConfig");
            } else {
                // Not deletable here: leave it ended rather than RUNNING.
                let done = self.whole(COMPLETED, List::Interfaces);
                let ended = self.client.post_raw(Kind::Job, &done, None).is_ok();
                left.push((
                    "JobConfig",
                    job.clone(),
                    self.client.job_key_url(&job),
                    format!(
                        "{}{}",
                        said(&r),
                        if ended { "; it is left COMPLETED" } else { "" }
                    ),
                    ended && r.as_ref().is_err_and(no_delete),
                ));
            }
        }
        let node = self.node.clone();
        if self.node_stored {
            match self.client.delete_node(&node, None) {
                Ok(_) => deleted.push("NodeConfig"),
                Err(e) => left.push((
                    "NodeConfig",
                    node.clone(),
                    self.client.node_key_url(&node),
                    said_err(&e),
                    false,
                )),
            }
        }
        for (kind, key, url, why, cannot) in &left {
            let (tag, since) = match cannot {
                true => ("note", ", as this server has no JobConfig DELETE"),
                false => ("FAIL", ""),
            };
            println!(
                "{tag} clean-up: the throw-away {kind} {} is still in CloudVision{since} (its DELETE: {}): delete it by hand: curl -X DELETE {} '{}'",
                one_line(key, QUOTE),
                crate::text::escape_control(why),
                crate::text::escape_control(&self.curl),
                one_line(url, 400)
            );
        }
        if left.is_empty() {
            match deleted.as_slice() {
                [] => println!(
                    "cleaned up: nothing to delete: no Set under the throw-away keys was taken"
                ),
                [one] => println!("cleaned up: the throw-away {one} {job} is deleted"),
                _ => println!(
                    "cleaned up: the throw-away JobConfig and NodeConfig {job} are deleted"
                ),
            }
        }
        left.iter().all(|l| l.4)
    }

    /// The closing lines: what holds, what not, what could not be told or asked.
    fn summary(&self) {
        let complete = self.failed.is_empty() && self.unasked.is_empty() && self.untold.is_empty();
        if complete && self.differs.is_empty() {
            println!("all of cvslurm's assumptions hold");
        } else if complete {
            println!(
                "cvslurm works with this CloudVision: no assumption fails; question(s) {} differ from what it assumes, as their note lines say",
                self.differs.join(", ")
            );
        }
        if !self.failed.is_empty() {
            println!(
                "{} assumption(s) do not hold: question(s) {}; see README.md, \"CloudVision compatibility\"",
                self.failed.len(),
                self.failed.join(", ")
            );
        }
        if !self.untold.is_empty() {
            println!(
                "{} question(s) cannot be told: {}: the server does not answer GetOne as CloudVision, so what it stores could not be read back",
                self.untold.len(),
                self.untold.join(", ")
            );
        }
        if !complete && !self.differs.is_empty() {
            println!(
                "question(s) {} differ from what cvslurm assumes, as their note lines say",
                self.differs.join(", ")
            );
        }
        if !self.unasked.is_empty() {
            println!(
                "{} question(s) could not be asked: {}{}",
                self.unasked.len(),
                self.unasked.join(", "),
                if self.not_cloudvision {
                    ": the server is not answering as CloudVision: check that ApiServer names CloudVision (with the computejob API), not a web server or proxy"
                } else {
                    ""
                }
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloudvision::payload::JobConfig;
    use crate::cloudvision::ClientOptions;

    #[test]
    fn fields_by_either_name() {
        let v = json!({"startTime": "t", "end_time": null, "dataInterfaces": {"values": ["a"]}});
        assert_eq!(field(&v, "start_time"), Some(&json!("t")));
        assert_eq!(field(&v, "end_time"), None);
        assert_eq!(list(&v, "data_interfaces"), ["a"]);
        assert!(list(&v, "nodes").is_empty());
        // Hostile values are quoted on one line.
        let v = json!({"hostname": "a\u{1b}[2J\nb"});
        assert!(!text(&v, "hostname").unwrap().chars().any(char::is_control));
    }

    fn run_on(client: &Client) -> Run<'_> {
        Run {
            client,
            curl: String::new(),
            job: "cvslurm-contract-1-2@west".into(),
            node: "cvslurm-contract-1-2@west".into(),
            cluster: "west".into(),
            start: "2025-12-05T10:30:00Z".into(),
            end: "2025-12-05T10:31:00Z".into(),
            hostname_settings: Vec::new(),
            broken: None,
            failed: Vec::new(),
            differs: Vec::new(),
            untold: Vec::new(),
            unasked: Vec::new(),
            job_stored: false,
            node_stored: false,
            not_cloudvision: false,
        }
    }

    /// Every JobConfig the questions post is a whole record, as cvslurm's own are: its
    /// payload check takes each (exactly one non-empty list, name, location, start_time,
    /// end_time only when ended).
    #[test]
    fn every_record_is_whole() {
        let client = Client::new(ClientOptions {
            server: "127.0.0.1:9".into(),
            token: None,
            ca_file: None,
            pins: Vec::new(),
            insecure: true,
            timeout: std::time::Duration::from_secs(1),
        })
        .unwrap();
        let r = run_on(&client);
        for state in [RUNNING, COMPLETED] {
            for by in [List::Nodes, List::Interfaces] {
                let v = r.whole(state, by);
                let j: JobConfig = serde_json::from_value(v.clone()).unwrap();
                assert_eq!(j.validate(), Ok(()), "{v}");
                assert_eq!(v["location"], "west");
                assert_eq!(v["name"], NAME);
                assert_eq!(v.get("end_time").is_some(), state != RUNNING, "{v}");
                let lists = ["nodes", "interfaces"].map(|k| v.get(k).is_some());
                assert_eq!(lists, [by == List::Nodes, by == List::Interfaces], "{v}");
            }
        }
        let n = r.whole_node("h");
        assert_eq!(n["key"]["id"], r.node);
        assert_eq!(n["location"], "west");
        assert_eq!(n["hostname"], "h");
        assert_eq!(n["data_interfaces"]["values"].as_array().unwrap().len(), 1);
    }

    /// Answers that are not CloudVision's are quoted with their status; a server without a
    /// JobConfig DELETE is told from a refusal; only what may have stored a record is deleted.
    #[test]
    fn answers_in_words() {
        let web = SendError::NotCloudVision {
            status: 404,
            excerpt: "<html>Not Found</html>".into(),
        };
        assert_eq!(said_err(&web), "HTTP 404 \"<html>Not Found</html>\"");
        let empty = SendError::NotCloudVision {
            status: 200,
            excerpt: String::new(),
        };
        assert_eq!(said_err(&empty), "HTTP 200 with an empty body");
        let hostile = SendError::Rejected {
            status: 400,
            message: format!("\u{1b}[2J{}", "x".repeat(500)),
        };
        let s = said_err(&hostile);
        assert!(
            !s.chars().any(char::is_control) && s.chars().count() <= QUOTE,
            "{s}"
        );
        assert!(no_answer(&web) && !no_answer(&hostile));
        let rejected = |status| SendError::Rejected {
            status,
            message: String::new(),
        };
        assert!(no_delete(&web) && no_delete(&rejected(405)));
        assert!(no_delete(&SendError::Server {
            status: 501,
            message: String::new()
        }));
        assert!(!no_delete(&rejected(400)) && !no_delete(&rejected(404)));
        assert!(!may_store(&Err(web)) && !may_store(&Err(rejected(400))));
        assert!(may_store(&Err(SendError::Timeout("t".into()))));
    }
}
