//! The job-completion receiver: job ends from Slurm's own `jobcomp/elasticsearch` plugin,
//! with no process per job on slurmctld's end path and no EpilogSlurmctld (whose end can
//! make slurmctld miss a scheduling pass: docs/performance.md).
//!
//! With `install.sh --jobcomp`, slurm.conf says `JobCompType=jobcomp/elasticsearch` and
//! `JobCompLoc=http://127.0.0.1:<JobCompPort>/slurm/jobcomp`: slurmctld's one sender thread
//! POSTs one JSON document per finished job there (every second; a failed post is kept in
//! `StateSaveLocation/elasticsearch_state` and tried again every 30 s). This receiver, a thread
//! of the service, answers 200 only once the job's end is durable in the outbox (the same
//! ordering rules as an epilog's: an end goes after its run's RUNNING), and 503 when it cannot
//! be written, so that the plugin keeps it and posts it again: nothing is lost.
//!
//! What is taken: a document is read as hostile (any user names a job): bounded in size
//! ([`MAX_BODY`]), strictly parsed, only from a connection owned by root or this service's
//! user (slurmctld runs as SlurmUser, the service too), on 127.0.0.1 only. A document that
//! is not a usable job end (malformed, another cluster's, too large) is answered 200 and
//! logged, never posted again forever: reconciliation still repairs that job's end from
//! Slurm. What a document means ([`end_of`]):
//! - a job that never ran (cancelled while pending: no nodes) is nothing to send;
//! - `RESIZING` is a job continuing on fewer nodes: not an end;
//! - `PENDING`/`REQUEUED` is a run that ended by a requeue: FAILED, as an epilog sees it;
//! - every other state is Slurm's final one, mapped as everywhere ([`JobState::from_slurm`]).
//!
//! A job's runs are told apart by the prolog's start record (start time and restart count,
//! [`crate::state::starts::Starts::load_run`]): the end of a run older than the recorded one
//! is dropped (the next run's RUNNING replaces its record whole).

use super::forward::{self, Spool, Target, MAX_BODY};
use crate::cloudvision::payload::{job_name, JobConfig, JobState, Key};
use crate::config::Config;
use crate::state::event::HetPart;
use crate::state::queue::{Enqueued, Event, Item};
use crate::state::StateDir;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The `JobCompLoc` slurm.conf names for the receiver on `port` (install.sh writes the same).
pub fn location(port: u16) -> String {
    format!("http://127.0.0.1:{port}/slurm/jobcomp")
}

/// The most header bytes of one request.
const MAX_HEADER_BYTES: usize = 16 * 1024;
/// Connections served at once (slurmctld uses one at a time).
const MAX_CONNECTIONS: usize = 8;
/// How long one request may take to arrive.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// What one document is, for the outbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Doc {
    /// A job's end.
    End {
        /// The record.
        job: Box<JobConfig>,
        /// The run's start (Unix seconds).
        start: i64,
        /// The job's name and partition as Slurm gave them (for `JobNameInclude` & co.).
        name: String,
        /// The partition.
        partition: Option<String>,
        /// A component of a heterogeneous job (`het_job_id`, `het_job_offset`): the record
        /// is keyed by the leader; a component other than the leader leaving is a RUNNING
        /// of the job ([`crate::service::het`]).
        het: Option<HetPart>,
    },
    /// Nothing to send, and why (logged at debug).
    Nothing(String),
}

/// Reads one job-completion document of cluster `cluster`. `Err` for a document that is not
/// one (malformed, another cluster's).
pub fn end_of(body: &[u8], cluster: &str) -> Result<Doc, String> {
    let v: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| format!("not JSON: {e}"))?;
    let o = v.as_object().ok_or("not a JSON object")?;
    let text = |k: &str| -> Result<&str, String> {
        o.get(k)
            .and_then(serde_json::Value::as_str)
            .ok_or_else(|| format!("no {k:?} string"))
    };
    let id = o
        .get("jobid")
        .and_then(serde_json::Value::as_u64)
        .filter(|n| *n > 0 && *n < u64::from(u32::MAX))
        .ok_or("no \"jobid\" number")?;
    // Without accounting (no slurmdbd association) the plugin writes no "cluster": the
    // document is then this slurmctld's, the receiver's own cluster.
    match o.get("cluster") {
        None | Some(serde_json::Value::Null) => {}
        Some(_) => {
            let their = text("cluster")?;
            if their != cluster {
                return Err(format!(
                    "job {id} of cluster {:?}, not {cluster}",
                    crate::text::one_line(their, 64)
                ));
            }
        }
    }
    // A heterogeneous job's component: its end is the leader's job's (het_job_id 0: none).
    let het_num = |k: &str| match o.get(k) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .filter(|n| *n <= u64::from(u32::MAX))
            .map(|n| Some(n.to_string()))
            .ok_or_else(|| format!("job {id}: {k} is not a number")),
    };
    let het = match (het_num("het_job_id")?, het_num("het_job_offset")?) {
        (Some(leader), offset) if leader != "0" => crate::job_end::het_component(
            &id.to_string(),
            Some(&leader),
            Some(offset.as_deref().unwrap_or("0")),
        )
        .map_err(|e| format!("job {id}: {e}"))?,
        _ => None,
    };
    let state = text("state")?;
    // A job that never ran has no nodes: "" on 22.05, no field from 24.11.
    let nodes = match o.get("nodes") {
        None | Some(serde_json::Value::Null) => "",
        Some(_) => text("nodes")?,
    };
    if nodes.is_empty() {
        return Ok(Doc::Nothing(format!("job {id} ({state}) never ran")));
    }
    let word = state.split_whitespace().next().unwrap_or("");
    let state = match word {
        "RESIZING" => return Ok(Doc::Nothing(format!("job {id} was resized; it goes on"))),
        "PENDING" | "REQUEUED" | "REQUEUE_HOLD" | "REQUEUE_FED" => JobState::Failed,
        _ => match JobState::from_slurm(state) {
            Some(s) if s.is_terminal() => s,
            _ => return Err(format!("job {id}: state {word:?} is no end")),
        },
    };
    let nodes =
        crate::slurm::hostlist::expand(nodes).map_err(|e| format!("job {id}: nodes: {e}"))?;
    let start = crate::timefmt::parse_jobcomp_time(text("@start")?)
        .ok_or_else(|| format!("job {id}: no usable \"@start\""))?;
    let end = crate::timefmt::parse_jobcomp_time(text("@end")?)
        .filter(|e| *e >= start)
        .ok_or_else(|| format!("job {id}: no usable \"@end\""))?;
    let name = o
        .get("job_name")
        .and_then(serde_json::Value::as_str)
        .unwrap_or("");
    let partition = o.get("partition").and_then(serde_json::Value::as_str);
    let leaves = het.as_ref().is_some_and(|h| h.offset > 0);
    Ok(Doc::End {
        job: Box::new(JobConfig {
            key: Key {
                id: match &het {
                    Some(h) => crate::cloudvision::payload::job_key(&h.leader, cluster),
                    None => crate::cloudvision::payload::job_key(id, cluster),
                },
            },
            name: Some(job_name(name, partition)),
            state: if leaves { JobState::Running } else { state },
            start_time: crate::timefmt::format_epoch(start),
            end_time: crate::timefmt::format_epoch(end).filter(|_| !leaves),
            location: Some(cluster.to_string()),
            job_type: None,
            nodes: Some(nodes.into()),
            interfaces: None,
        }),
        start,
        name: name.to_string(),
        partition: partition.map(str::to_string),
        het: het.map(|h| HetPart {
            component: id.to_string(),
            offset: h.offset,
            left: leaves,
        }),
    })
}

/// Binds 127.0.0.1:`port` and serves documents for `cluster` on a thread of its own until
/// `stop`; returns the address. Fails when the port cannot be bound (the error says which and
/// why).
pub fn start(
    cfg: &Config,
    port: u16,
    cluster: &str,
    outbox: StateDir,
    stop: &'static AtomicBool,
) -> Result<SocketAddr, String> {
    let listener =
        TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)).map_err(|e| {
            format!(
                "job-completion receiver: cannot listen on 127.0.0.1:{port}: {e}: is another \
             process on that port? Set JobCompPort (and JobCompLoc in slurm.conf) to a free one"
            )
        })?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("job-completion receiver: {e}"))?;
    let forward = match &cfg.jobcomp_forward {
        None => None,
        Some(target) => Some(start_forward(cfg, target, addr, &outbox, stop)?),
    };
    let shared = Arc::new(Shared {
        forward,
        cfg: cfg.clone(),
        cluster: cluster.to_string(),
        outbox,
        busy: AtomicUsize::new(0),
        allowed: allowed_uids(),
    });
    log::info!("job-completion receiver listening on http://{addr}/ (jobcomp/elasticsearch)");
    std::thread::Builder::new()
        .name("jobcomp".into())
        .spawn(move || accept_loop(&listener, addr, &shared, stop))
        .map_err(|e| format!("job-completion receiver: cannot start its thread: {e}"))?;
    Ok(addr)
}

struct Shared {
    /// The `JobCompForward` spool, when one is configured.
    forward: Option<Arc<Spool>>,
    cfg: Config,
    cluster: String,
    outbox: StateDir,
    busy: AtomicUsize,
    allowed: Vec<u32>,
}

/// Opens the `JobCompForward` spool and starts its forwarder. Refuses a target that is this
/// receiver (every document would come back forever).
fn start_forward(
    cfg: &Config,
    target: &Target,
    local: SocketAddr,
    outbox: &StateDir,
    stop: &'static AtomicBool,
) -> Result<Arc<Spool>, String> {
    let base = target.base();
    if base == format!("http://{local}/") || base == format!("http://localhost:{}/", local.port()) {
        return Err(format!(
            "JobCompForward={} is this receiver (JobCompPort={}): give the site's own Elasticsearch, the URL slurm.conf's JobCompLoc had before install.sh --jobcomp",
            target.shown(),
            local.port()
        ));
    }
    let agent = forward::agent(cfg.ca_file.as_deref(), cfg.request_timeout)
        .map_err(|e| format!("JobCompForward: {e}"))?;
    let spool = Spool::open(
        outbox.root(),
        outbox.owner(),
        cfg.jobcomp_forward_max_docs,
        outbox.status.clone(),
        target.shown(),
    )
    .map_err(|e| format!("JobCompForward: {e}"))?;
    forward::start(Arc::clone(&spool), target.clone(), agent, stop)?;
    log::info!(
        "job-completion receiver: every document goes on, unchanged, to {} (JobCompForward; spool {}, {} waiting)",
        target.shown(),
        outbox.root().join(forward::SPOOL_DIR).display(),
        spool.len()
    );
    Ok(spool)
}

/// Root and the user the service runs as (SlurmUser, as slurmctld).
fn allowed_uids() -> Vec<u32> {
    let me = nix::unistd::geteuid().as_raw();
    if me == 0 {
        vec![0]
    } else {
        vec![0, me]
    }
}

/// Accepts connections (blocking: a connection is served at once) until `stop`; the thread
/// ends with the process.
fn accept_loop(listener: &TcpListener, local: SocketAddr, shared: &Arc<Shared>, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, peer)) => {
                if shared.busy.load(Ordering::Relaxed) >= MAX_CONNECTIONS {
                    log::warn!("job-completion receiver: {MAX_CONNECTIONS} connections open; {peer} refused (slurmctld posts again)");
                    continue;
                }
                match peer_uid(peer, local) {
                    Some(uid) if shared.allowed.contains(&uid) => {}
                    Some(uid) => {
                        log::warn!("job-completion receiver: a connection from {peer} of uid {uid} refused: only slurmctld (SlurmUser) or root may post job ends");
                        continue;
                    }
                    None => {
                        log::warn!("job-completion receiver: a connection from {peer} refused: its owner cannot be told");
                        continue;
                    }
                }
                shared.busy.fetch_add(1, Ordering::Relaxed);
                let s = Arc::clone(shared);
                let spawned = std::thread::Builder::new()
                    .name("jobcomp-conn".into())
                    .spawn(move || {
                        serve(stream, &s);
                        s.busy.fetch_sub(1, Ordering::Relaxed);
                    });
                if spawned.is_err() {
                    shared.busy.fetch_sub(1, Ordering::Relaxed);
                }
            }
            Err(e) => {
                log::warn!("job-completion receiver: accept: {e}");
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
}

/// The owner of the client socket `peer` connected to `local` (both on loopback), from
/// `/proc/net/tcp`: the socket whose local address is `peer` and remote address is `local`.
fn peer_uid(peer: SocketAddr, local: SocketAddr) -> Option<u32> {
    let hex = |a: SocketAddr| -> Option<String> {
        match a {
            SocketAddr::V4(v4) => Some(format!(
                "{:08X}:{:04X}",
                u32::from_le_bytes(v4.ip().octets()),
                v4.port()
            )),
            SocketAddr::V6(_) => None,
        }
    };
    let (p, l) = (hex(peer)?, hex(local)?);
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        (f.len() > 7 && f[1] == p && f[2] == l).then(|| f[7].parse().ok())?
    })
}

/// Serves the requests of one connection (keep-alive), each answered before the next is read.
fn serve(stream: TcpStream, shared: &Shared) {
    let _ = stream.set_read_timeout(Some(READ_TIMEOUT));
    let _ = stream.set_write_timeout(Some(READ_TIMEOUT));
    let Ok(mut out) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    loop {
        let req = match read_request(&mut reader, &mut out) {
            Ok(Some(r)) => r,
            Ok(None) => return,
            Err(e) => {
                log::warn!("job-completion receiver: {e}");
                let _ = answer(&mut out, 400, "Bad Request", false);
                return;
            }
        };
        let (status, reason) = if req.method != "POST" {
            (405, "Method Not Allowed")
        } else {
            take(shared, &req)
        };
        if answer(&mut out, status, reason, req.keep_alive).is_err() || !req.keep_alive {
            return;
        }
    }
}

/// One request as read.
struct Request {
    method: String,
    /// The body, or `None` when it was larger than [`MAX_BODY`] (read and dropped).
    body: Option<Vec<u8>>,
    keep_alive: bool,
}

/// Reads one HTTP/1.1 request: `Ok(None)` at a clean end of the connection.
fn read_request(
    reader: &mut BufReader<TcpStream>,
    out: &mut TcpStream,
) -> Result<Option<Request>, String> {
    let mut head = Vec::new();
    let mut seen = 0usize;
    loop {
        let mut line = Vec::new();
        let n = reader
            .by_ref()
            // `seen` is at most MAX_HEADER_BYTES here (checked below after each line).
            .take((MAX_HEADER_BYTES - seen) as u64 + 1)
            .read_until(b'\n', &mut line)
            .map_err(|e| format!("reading a request: {e}"))?;
        if n == 0 {
            return if head.is_empty() {
                Ok(None)
            } else {
                Err("the connection closed inside a request".into())
            };
        }
        seen += n;
        if seen > MAX_HEADER_BYTES {
            return Err(format!("request head longer than {MAX_HEADER_BYTES} bytes"));
        }
        let line = String::from_utf8(line).map_err(|_| "a request head that is not UTF-8")?;
        let line = line.trim_end_matches(['\r', '\n']).to_string();
        if line.is_empty() {
            if head.is_empty() {
                continue;
            }
            break;
        }
        head.push(line);
    }
    let mut first = head[0].split(' ');
    let method = first.next().unwrap_or("").to_string();
    let version = first.nth(1).unwrap_or("");
    let mut length: Option<usize> = None;
    let mut keep_alive = version == "HTTP/1.1";
    let mut expect = false;
    for h in &head[1..] {
        let Some((k, v)) = h.split_once(':') else {
            return Err("a header line without ':'".into());
        };
        let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
        match k.as_str() {
            "content-length" => {
                length = Some(
                    v.parse()
                        .map_err(|_| "a Content-Length that is no number")?,
                )
            }
            "transfer-encoding" => return Err("chunked bodies are not taken".into()),
            "connection" => keep_alive = !v.eq_ignore_ascii_case("close"),
            "expect" => expect = v.eq_ignore_ascii_case("100-continue"),
            _ => {}
        }
    }
    let length = length.unwrap_or(0);
    if expect {
        // libcurl asks before a large body (and sends it anyway after a second).
        out.write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
            .map_err(|e| format!("writing 100 Continue: {e}"))?;
    }
    let body = if length > MAX_BODY {
        let dropped = std::io::copy(
            &mut reader.by_ref().take(length as u64),
            &mut std::io::sink(),
        )
        .map_err(|e| format!("reading a body: {e}"))?;
        if dropped as usize != length {
            return Err("the connection closed inside a body".into());
        }
        None
    } else {
        let mut b = vec![0; length];
        reader
            .read_exact(&mut b)
            .map_err(|e| format!("reading a body of {length} bytes: {e}"))?;
        Some(b)
    };
    Ok(Some(Request {
        method,
        body,
        keep_alive,
    }))
}

fn answer(out: &mut TcpStream, status: u16, reason: &str, keep_alive: bool) -> std::io::Result<()> {
    let body = format!("{{\"status\":{status}}}");
    let conn = if keep_alive { "keep-alive" } else { "close" };
    write!(
        out,
        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: {conn}\r\n\r\n{body}",
        body.len()
    )?;
    out.flush()
}

/// Takes one document ([`take_end`]), then, where `JobCompForward` is set and the answer is
/// 200, spools its bytes for the site's Elasticsearch: durable before the answer. A 503 is
/// not spooled (the plugin posts the document again); a spool at its bound or not writable
/// never changes the answer ([`Spool::push`] counts the document as dropped).
fn take(shared: &Shared, req: &Request) -> (u16, &'static str) {
    let answer = take_end(shared, req);
    if let (Some(spool), (200, _)) = (&shared.forward, answer) {
        match &req.body {
            Some(body) => {
                spool.push(body);
            }
            None => {
                log::error!("JobCompForward: a document of more than {} MiB is not forwarded; counted as dropped", MAX_BODY >> 20);
                shared.drop_forward();
            }
        }
    }
    answer
}

impl Shared {
    fn drop_forward(&self) {
        self.outbox
            .status
            .count(crate::state::status::counter::JOBCOMP_FORWARD_DROPPED, 1);
    }
}

/// Takes one document: 200 once its end is durable (or when there is nothing to take), 503
/// when the outbox cannot take it (the plugin posts it again).
fn take_end(shared: &Shared, req: &Request) -> (u16, &'static str) {
    let Some(body) = &req.body else {
        log::error!("job-completion receiver: a document of more than {} MiB dropped; reconciliation sends that job's end", MAX_BODY >> 20);
        return (200, "OK");
    };
    let (job, start, name, partition, het) = match end_of(body, &shared.cluster) {
        Ok(Doc::End {
            job,
            start,
            name,
            partition,
            het,
        }) => (job, start, name, partition, het),
        Ok(Doc::Nothing(why)) => {
            log::debug!("job-completion receiver: {why}: nothing to send");
            return (200, "OK");
        }
        Err(e) => {
            log::error!(
                "job-completion receiver: a document dropped: {}",
                crate::text::one_line(&e, 300)
            );
            return (200, "OK");
        }
    };
    let key = job.key.id.clone();
    if let Err(why) = shared.cfg.job_wanted(&name, partition.as_deref()) {
        log::info!("job {key}: filtered out ({why}); its end is not sent");
        return (200, "OK");
    }
    // Which run: the prolog's record of the latest start (and its restart count).
    let restarts = match shared.outbox.starts.load_run(&key) {
        Some((rec, _)) if crate::state::queue::later_run_at(rec, start) => {
            log::info!("job {key}: the end of an earlier run ({}); its later run's records replace it: not sent", job.state);
            return (200, "OK");
        }
        Some((_, r)) => r,
        None => 0,
    };
    let state = job.state;
    // A component other than the leader leaving: a RUNNING of the job on fewer nodes.
    let phase = u8::from(!het.as_ref().is_some_and(|h| h.left));
    let mut ev = Event::new(Item::Job { job: *job }, (restarts, phase));
    ev.het = het;
    match shared.outbox.queue.enqueue(&ev) {
        Ok(Enqueued::Superseded) => {
            log::info!("job {key}: {state} from Slurm's job-completion record superseded by a later event; not sent");
        }
        Ok(_) => {
            log::info!("job {key}: {state} queued from Slurm's job-completion record");
            if let Some(sock) = crate::state::wake::connect(&shared.cfg.state_dir) {
                crate::state::wake::wake(&sock);
            }
        }
        Err(e) => {
            log::error!("job {key}: {state} from Slurm's job-completion record not queued ({e}): answered 503, slurmctld posts it again in 30 s");
            return (503, "Service Unavailable");
        }
    }
    (200, "OK")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every document Slurm 22.05's jobcomp/elasticsearch posted for the captured cases
    /// (tests/fixtures/slurm-22.05/jobcomp/, `tests/cluster/capture-jobcomp.sh`) reads as
    /// the end it is, or as nothing to send.
    #[test]
    fn het_documents_are_their_leaders_job() {
        for v in ["22.05", "24.11", "26.05"] {
            let text = std::fs::read_to_string(format!(
                "{}/tests/fixtures/slurm-{v}/jobcomp/requests.jsonl",
                env!("CARGO_MANIFEST_DIR")
            ))
            .unwrap();
            let mut got = Vec::new();
            for line in text.lines() {
                let r: serde_json::Value = serde_json::from_str(line).unwrap();
                let body = r["body"].as_str().unwrap();
                if !body.contains("\"het_job_id\":10,") {
                    continue;
                }
                let Doc::End { job, het, .. } = end_of(body.as_bytes(), "cvtest").unwrap() else {
                    panic!("{v}: {body}");
                };
                let het = het.unwrap();
                assert_eq!(job.key.id, "10@cvtest", "{v}: never the component's own id");
                assert_eq!(job.validate(), Ok(()), "{v}: {job:?}");
                got.push((
                    het.component,
                    het.offset,
                    het.left,
                    job.state.word().to_string(),
                ));
            }
            // The leader's document is the job's end; the other component's leaves the job.
            let want = [
                ("10".to_string(), 0, false, "completed".to_string()),
                ("11".to_string(), 1, true, "running".to_string()),
            ];
            assert_eq!(got, [want.clone(), want].concat(), "{v}");
        }
    }

    #[test]
    fn captured_documents() {
        for v in ["22.05", "24.11", "26.05"] {
            let dir = format!(
                "{}/tests/fixtures/slurm-{v}/jobcomp",
                env!("CARGO_MANIFEST_DIR")
            );
            let Ok(text) = std::fs::read_to_string(format!("{dir}/requests.jsonl")) else {
                panic!("no capture for {v} in {dir}");
            };
            let mut seen = std::collections::BTreeMap::new();
            for line in text.lines() {
                let r: serde_json::Value = serde_json::from_str(line).unwrap();
                let body = r["body"].as_str().unwrap();
                let doc = end_of(body.as_bytes(), "cvtest")
                    .unwrap_or_else(|e| panic!("{v}: {e}: {body}"));
                let name = serde_json::from_str::<serde_json::Value>(body).unwrap()["job_name"]
                    .as_str()
                    .unwrap()
                    .to_string();
                let got = match doc {
                    Doc::End { job: j, start, .. } => {
                        assert_eq!(j.validate(), Ok(()), "{v}: {j:?}");
                        assert!(start > 1_700_000_000, "{v}: {start}");
                        j.state.word().to_string()
                    }
                    Doc::Nothing(_) => "nothing".to_string(),
                };
                seen.entry(name).or_insert_with(Vec::new).push(got);
            }
            let has = |name: &str, want: &str| {
                assert!(
                    seen.get(name).is_some_and(|g| g.iter().any(|s| s == want)),
                    "{v}: {name} {want}: {seen:?}"
                )
            };
            has("ok", "completed");
            has("fail", "failed");
            has("two", "completed");
            has("cancel", "cancelled");
            has("held", "nothing");
            has("arr", "completed");
            has("requeue", "failed");
            has("resize", "nothing");
            has("timeout", "failed");
            has("hostile \"name\" \\ </x>", "completed");
        }
        // Hostile and foreign documents.
        for (doc, why) in [
            (
                "{\"jobid\":11,\"het_job_id\":\"10\",\"het_job_offset\":1,\"state\":\"COMPLETED\",\"nodes\":\"n1\"}",
                "het_job_id is not a number",
            ),
            (
                "{\"jobid\":11,\"het_job_id\":10,\"het_job_offset\":128,\"state\":\"COMPLETED\",\"nodes\":\"n1\"}",
                "SLURM_HET_JOB_OFFSET=\"128\" is not a component index",
            ),
            (
                "{\"jobid\":11,\"het_job_id\":10,\"het_job_offset\":0,\"state\":\"COMPLETED\",\"nodes\":\"n1\"}",
                "disagree",
            ),
            (
                "{\"jobid\":11,\"het_job_id\":99999999999,\"het_job_offset\":1,\"state\":\"COMPLETED\",\"nodes\":\"n1\"}",
                "het_job_id is not a number",
            ),
            ("[]", "not a JSON object"),
            ("{\"jobid\":1,\"cluster\":7}", "no \"cluster\" string"),
            ("{\"jobid\":1}", "no \"state\" string"),
            (
                "{\"jobid\":1,\"cluster\":\"other\",\"state\":\"COMPLETED\",\"nodes\":\"n1\"}",
                "of cluster \"other\"",
            ),
            (
                "{\"jobid\":-1,\"cluster\":\"cvtest\"}",
                "no \"jobid\" number",
            ),
            (
                "{\"jobid\":1,\"cluster\":\"cvtest\",\"state\":\"RUNNING\",\"nodes\":\"n1\"}",
                "is no end",
            ),
            (
                "{\"jobid\":1,\"cluster\":\"cvtest\",\"state\":\"COMPLETED\",\"nodes\":\"n[1-99999999]\",\"@start\":\"2025-12-05T10:30:00Z\",\"@end\":\"2025-12-05T10:30:00Z\"}",
                "nodes",
            ),
            (
                "{\"jobid\":1,\"cluster\":\"cvtest\",\"state\":\"COMPLETED\",\"nodes\":\"n1\",\"@start\":\"2025-12-05T10:30:00Z\",\"@end\":\"2025-12-05T10:29:00Z\"}",
                "no usable \"@end\"",
            ),
        ] {
            let e = end_of(doc.as_bytes(), "cvtest").unwrap_err();
            assert!(e.contains(why), "{doc}: {e}");
        }
    }
}
