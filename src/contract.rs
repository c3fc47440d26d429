//! `cvslurm check --contract`: asks the configured CloudVision the questions about
//! `arista.computejob.v1` that only a live server answers (README.md, "CloudVision
//! compatibility"), and says for each what the server did and whether cvslurm's assumption
//! holds.
//!
//! It WRITES to CloudVision: one JobConfig and one NodeConfig under throw-away keys
//! (`cvslurm-contract-<pid>-<unix time>@<cluster>`, which no Slurm job or node has), created,
//! read back (GetOne), changed and deleted. Both keys are deleted at the end whatever happened
//! before; a key that could not be deleted is named, with the curl command that deletes it.
//!
//! What the server answers is hostile like any outside byte: it is only compared, and quoted
//! on one line, capped, control characters escaped.

use crate::cloudvision::{Answer, Client, Kind, SendError};
use crate::text::one_line;
use serde_json::{json, Value};

/// Every assumption holds.
pub const EXIT_HOLDS: i32 = 0;
/// Some assumption does not hold (named in the output).
pub const EXIT_DOES_NOT_HOLD: i32 = 1;
/// The questions could not be asked (CloudVision unreachable, the token refused).
pub const EXIT_COULD_NOT_RUN: i32 = 2;

/// The most characters of the server's words quoted in one line.
const QUOTE: usize = 160;

/// A locally administered MAC (no NIC's burnt-in address) for the throw-away job.
const MAC: &str = "02:00:00:c5:00:01";

/// What one question found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Holds,
    DoesNotHold,
    /// The server differs from what cvslurm assumes in a way that changes nothing for it.
    Differs,
    /// Not asked, or no answer: CloudVision failed, did not answer or refused the token.
    Unasked,
}

/// One run of the questions against one server.
struct Run<'a> {
    client: &'a Client,
    curl: String,
    job: String,
    node: String,
    start: String,
    end: String,
    /// Set once a request could not be made at all: the later questions are not asked.
    broken: Option<String>,
    failed: Vec<&'static str>,
    differs: Vec<&'static str>,
    unasked: Vec<&'static str>,
}

/// Runs the questions with `client` (token and server from the configuration), the keys
/// qualified by `cluster`; `curl` is what a hand-made curl needs for CloudVision (the token
/// header read from the token file, the CA), shown if a key cannot be deleted; prints one line per question, the clean-up and a summary; returns
/// [`EXIT_HOLDS`], [`EXIT_DOES_NOT_HOLD`] or [`EXIT_COULD_NOT_RUN`].
pub fn run(client: &Client, cluster: &str, curl: &str) -> i32 {
    let server = client.base_url().trim_start_matches("https://").to_string();
    // Reachable, TLS, the token: else nothing is written.
    if let Err(e) = client.probe(None) {
        println!(
            "FAIL CloudVision {server}: {}: nothing was written; run cvslurm check",
            one_line(&e.to_string(), 400)
        );
        return EXIT_COULD_NOT_RUN;
    }
    let now = crate::timefmt::now_epoch();
    let stem = format!("cvslurm-contract-{}-{now}", std::process::id());
    let mut r = Run {
        client,
        curl: curl.to_string(),
        job: format!("{stem}@{cluster}"),
        node: format!("{stem}@{cluster}"),
        start: crate::timefmt::format_epoch(now - 60).unwrap_or_default(),
        end: crate::timefmt::format_epoch(now).unwrap_or_default(),
        broken: None,
        failed: Vec::new(),
        differs: Vec::new(),
        unasked: Vec::new(),
    };
    println!(
        "asking CloudVision {server} with the throw-away JobConfig and NodeConfig {} (deleted at the end)",
        r.job
    );
    r.q1_get_without_key();
    r.q2_unknown_key();
    r.q3_set_merges();
    r.q3_empty_list_clears();
    r.q4_end_time_kept();
    r.q5_hostname();
    r.q6_unknown_field();
    r.q7_delete_job();
    let clean = r.clean_up();
    if r.failed.is_empty() && r.unasked.is_empty() {
        if r.differs.is_empty() {
            println!("all of cvslurm's assumptions hold");
        } else {
            println!(
                "cvslurm works with this CloudVision: every assumption holds but question(s) {}, where it differs harmlessly",
                r.differs.join(", ")
            );
        }
    }
    if !r.failed.is_empty() {
        println!(
            "{} assumption(s) do not hold: question(s) {}; see README.md, \"CloudVision compatibility\"",
            r.failed.len(),
            r.failed.join(", ")
        );
    }
    if !r.unasked.is_empty() {
        println!(
            "{} question(s) could not be asked: {}",
            r.unasked.len(),
            r.unasked.join(", ")
        );
    }
    if !r.failed.is_empty() {
        EXIT_DOES_NOT_HOLD
    } else if !r.unasked.is_empty() || !clean {
        EXIT_COULD_NOT_RUN
    } else {
        EXIT_HOLDS
    }
}

/// A request's outcome in words: `HTTP 404: not found`, or why there was none.
fn said(r: &Result<Answer, SendError>) -> String {
    let words = match r {
        Ok(a) => format!("HTTP {}", a.status),
        Err(
            SendError::Rejected { status, message }
            | SendError::Server { status, message }
            | SendError::TokenRefused { status, message },
        ) if !message.is_empty() => format!("HTTP {status}: {message}"),
        Err(
            SendError::Rejected { status, .. }
            | SendError::Server { status, .. }
            | SendError::TokenRefused { status, .. },
        ) => format!("HTTP {status}"),
        Err(e) => e.to_string(),
    };
    one_line(&words, QUOTE)
}

/// True when the outcome says nothing about the question: no answer, a server failure, rate
/// limiting, the token.
fn no_answer(e: &SendError) -> bool {
    !matches!(e, SendError::Rejected { .. } | SendError::Invalid(_))
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
            Err(e) if no_answer(e) => {
                let why = format!("{step}: {}", said(r));
                self.line(n, Verdict::Unasked, &format!("{question}: {why}"));
                self.broken = Some(format!("an earlier request got no answer ({why})"));
                false
            }
            _ => true,
        }
    }

    fn post_job(&self, body: Value) -> Result<Answer, SendError> {
        self.client.post_raw(Kind::Job, &body, None)
    }

    /// The job body cvslurm would send: RUNNING since `start` on `MAC`.
    fn running(&self) -> Value {
        json!({
            "key": {"id": self.job},
            "state": "JOB_STATE_RUNNING",
            "start_time": self.start,
            "interfaces": {"values": [MAC]},
        })
    }

    /// GetOne: `Ok(Some(value))`, `Ok(None)` for a missing key (404, or 200 without a value).
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

    /// [`Run::read`] of the job for question `n`, reported when it fails.
    fn read_job(&mut self, n: &'static str, question: &str) -> Option<Value> {
        match self.read(Kind::Job, &self.job.clone()) {
            Ok(Some(v)) => Some(v),
            Ok(None) => {
                self.line(
                    n,
                    Verdict::DoesNotHold,
                    &format!("{question}: a GetOne right after the accepted Set found no record"),
                );
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
        if !self.answered("2", q, "the GetOne", &r) {
            return;
        }
        match &r {
            Err(SendError::Rejected { status: 404, .. }) => self.line(
                "2",
                Verdict::Holds,
                &format!("{q}: {}; cvslurm assumes 404: holds", said(&r)),
            ),
            _ => self.line(
                "2",
                Verdict::DoesNotHold,
                &format!(
                    "{q}: {}; cvslurm assumes 404 (its probe takes 200 as well, this check reads a missing record as 404 or an empty answer)",
                    said(&r)
                ),
            ),
        }
    }

    fn q3_set_merges(&mut self) {
        let q = "a Set with interfaces only, after one with nodes and start_time";
        if !self.go("3a", q) {
            return;
        }
        let first = json!({
            "key": {"id": self.job},
            "state": "JOB_STATE_RUNNING",
            "start_time": self.start,
            "name": "cvslurm check --contract",
            "nodes": {"values": [self.node]},
        });
        if !self.set("3a", q, "the first Set (nodes)", first) {
            return;
        }
        let second = json!({
            "key": {"id": self.job},
            "state": "JOB_STATE_RUNNING",
            "interfaces": {"values": [MAC]},
        });
        if !self.set("3a", q, "the second Set (interfaces only)", second) {
            return;
        }
        let Some(v) = self.read_job("3a", q) else {
            return;
        };
        let nodes = !list(&v, "nodes").is_empty();
        let start = field(&v, "start_time").is_some();
        let interfaces = !list(&v, "interfaces").is_empty();
        let stored = format!(
            "stored: nodes {}, start_time {}, interfaces {}",
            if nodes { "kept" } else { "gone" },
            if start { "kept" } else { "gone" },
            if interfaces { "set" } else { "absent" }
        );
        if nodes && start && interfaces {
            self.line(
                "3a",
                Verdict::Holds,
                &format!(
                    "{q}: {stored}: a Set merges the fields present; cvslurm assumes so: holds"
                ),
            );
        } else {
            self.line(
                "3a",
                Verdict::DoesNotHold,
                &format!("{q}: {stored}: cvslurm assumes a Set merges the fields present (absent ones keep their value)"),
            );
        }
    }

    fn q3_empty_list_clears(&mut self) {
        let q = "a Set with an empty nodes list";
        if !self.go("3b", q) {
            return;
        }
        let before = match self.read(Kind::Job, &self.job.clone()) {
            Ok(Some(v)) => !list(&v, "nodes").is_empty(),
            _ => false,
        };
        if !before {
            // 3a did not leave nodes stored (a server that replaces records): store them.
            let with_nodes = json!({
                "key": {"id": self.job},
                "state": "JOB_STATE_RUNNING",
                "start_time": self.start,
                "nodes": {"values": [self.node]},
            });
            if !self.set("3b", q, "the Set with nodes", with_nodes) {
                return;
            }
        }
        let clear = json!({
            "key": {"id": self.job},
            "state": "JOB_STATE_RUNNING",
            "nodes": {"values": []},
        });
        if !self.set("3b", q, "the Set with \"nodes\":{\"values\":[]}", clear) {
            return;
        }
        let Some(v) = self.read_job("3b", q) else {
            return;
        };
        let left = list(&v, "nodes");
        if left.is_empty() {
            self.line(
                "3b",
                Verdict::Holds,
                &format!("{q}: the stored nodes are cleared; cvslurm assumes so: holds"),
            );
        } else {
            self.line(
                "3b",
                Verdict::DoesNotHold,
                &format!(
                    "{q}: the stored nodes are kept ({}); cvslurm assumes an empty list clears them",
                    left.join(",")
                ),
            );
        }
    }

    fn q4_end_time_kept(&mut self) {
        let q = "a RUNNING Set without end_time after a COMPLETED one with it";
        if !self.go("4", q) {
            return;
        }
        let mut done = self.running();
        done["state"] = json!("JOB_STATE_COMPLETED");
        done["end_time"] = json!(self.end);
        if !self.set("4", q, "the COMPLETED Set", done) {
            return;
        }
        if !self.set("4", q, "the RUNNING Set", self.running()) {
            return;
        }
        let Some(v) = self.read_job("4", q) else {
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
        if !self.go("5", q) {
            return;
        }
        let host = format!("cvslurm-contract-host-{}", std::process::id());
        let body = json!({
            "key": {"id": self.node},
            "hostname": host,
            "data_interfaces": {"values": [
                {"name": "eth0", "mac_address": MAC, "ip_addresses": {"values": []}}
            ]},
        });
        let r = self.client.post_raw(Kind::Node, &body, None);
        if !self.answered("5", q, "the Set", &r) {
            return;
        }
        if r.is_err() {
            self.line(
                "5",
                Verdict::DoesNotHold,
                &format!(
                    "{q}: refused: {}; cvslurm assumes any hostname is accepted",
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
            Err(e) => format!("GetOne: {}", said(&Err(e))),
        };
        self.line(
            "5",
            Verdict::Holds,
            &format!("{q}: accepted ({shown}); cvslurm assumes it is accepted: holds"),
        );
    }

    fn q6_unknown_field(&mut self) {
        let q = "a Set with an unknown field";
        if !self.go("6", q) {
            return;
        }
        let mut body = self.running();
        body["cvslurm_contract_unknown_field"] = json!("x");
        let r = self.post_job(body);
        if !self.answered("6", q, "the Set", &r) {
            return;
        }
        match &r {
            Err(SendError::Rejected { status: 400, .. }) => self.line(
                "6",
                Verdict::Holds,
                &format!(
                    "{q}: rejected ({}); cvslurm sends no unknown field: holds",
                    said(&r)
                ),
            ),
            Ok(_) => {
                let kept = matches!(
                    self.read(Kind::Job, &self.job.clone()),
                    Ok(Some(v)) if field(&v, "cvslurm_contract_unknown_field").is_some()
                );
                self.line(
                    "6",
                    Verdict::Holds,
                    &format!(
                        "{q}: ignored ({}, the field {}); cvslurm sends no unknown field: holds",
                        said(&r),
                        if kept { "stored" } else { "not stored" }
                    ),
                );
            }
            Err(_) => self.line(
                "6",
                Verdict::DoesNotHold,
                &format!("{q}: {}; cvslurm assumes 400 or ignored", said(&r)),
            ),
        }
    }

    fn q7_delete_job(&mut self) {
        let q = "JobConfig DELETE, then a new RUNNING";
        if !self.go("7", q) {
            return;
        }
        let mut done = self.running();
        done["state"] = json!("JOB_STATE_COMPLETED");
        done["end_time"] = json!(self.end);
        if !self.set("7", q, "the COMPLETED Set", done) {
            return;
        }
        let r = self.client.delete_job(&self.job.clone(), None);
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
        match self.read(Kind::Job, &self.job.clone()) {
            Ok(None) => {}
            Ok(Some(_)) => {
                self.line(
                    "7",
                    Verdict::DoesNotHold,
                    &format!(
                        "{q}: the DELETE answered {} but a GetOne still finds the record",
                        said(&r)
                    ),
                );
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
        if !self.set("7", q, "the RUNNING Set after the DELETE", self.running()) {
            return;
        }
        let Some(v) = self.read_job("7", q) else {
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

    /// Deletes both throw-away keys (a missing one is gone already). A JobConfig that cannot
    /// be deleted is at least ended. Returns false, after naming what is left and how to
    /// delete it by hand, when something could not be removed.
    fn clean_up(&mut self) -> bool {
        let mut left = Vec::new();
        let job = self.job.clone();
        let gone = |r: &Result<Answer, SendError>| {
            matches!(r, Ok(_) | Err(SendError::Rejected { status: 404, .. }))
        };
        let r = self.client.delete_job(&job, None);
        if !gone(&r) {
            // Not deletable here: leave it ended rather than RUNNING.
            let mut done = self.running();
            done["state"] = json!("JOB_STATE_COMPLETED");
            done["end_time"] = json!(self.end);
            let ended = self.post_job(done).is_ok();
            left.push((
                "JobConfig",
                job.clone(),
                self.client.job_key_url(&job),
                format!(
                    "{}{}",
                    said(&r),
                    if ended { "; it is left COMPLETED" } else { "" }
                ),
            ));
        }
        let node = self.node.clone();
        let r = self.client.delete_node(&node, None);
        if r.is_err() {
            left.push((
                "NodeConfig",
                node.clone(),
                self.client.node_key_url(&node),
                said(&r),
            ));
        }
        if left.is_empty() {
            println!("cleaned up: the throw-away JobConfig and NodeConfig {job} are deleted");
            return true;
        }
        for (kind, key, url, why) in &left {
            println!(
                "FAIL clean-up: the throw-away {kind} {} is still in CloudVision (its DELETE: {}): delete it by hand: curl -X DELETE {} '{}'",
                one_line(key, QUOTE),
                crate::text::escape_control(why),
                crate::text::escape_control(&self.curl),
                one_line(url, 400)
            );
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
