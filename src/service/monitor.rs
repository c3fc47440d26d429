//! The service loop: node polls (nodes that appear or come back are sent, nodes that leave
//! are deleted, each node re-asserted every `NodeReassertInterval`), resends when a node's
//! record changes, and reconciliation every `ReconcileInterval` — all only while this host
//! leads ([`super::leadership`], decided again at every poll). The sender delivers what it
//! queues, and what the hooks queue, whatever the role.

use super::catch_up::CatchUp;
use super::leadership::Leadership;
use super::sender::Sender;
use super::{reconcile, resend};
use crate::inventory::Inventory;
use crate::slurm::{self, COMMAND_TIMEOUT};
use crate::state::queue::{Event, Item};
use crate::state::StateDir;
use crate::systemd;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// What the monitor knows of a node since it last listed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Available, and its NodeConfig was queued.
    Sent,
    /// Not available (or, never sent, its discovery failed): sent again once it is.
    Unavailable,
    /// Due for re-assertion (`NodeReassertInterval`).
    Refresh,
    /// Sent, then available but its discovery failed (its NodeConfig stands): discovered
    /// again at the next poll; a node that then leaves service is said to, as a sent one is.
    Failed,
}

/// The service loop: node polls and reconciliation; the sender (started by
/// [`super::run_service`]) delivers what they and the hooks queue. Returns the exit code when
/// stopped: within 200 ms of SIGTERM (between polls), whatever CloudVision does — what
/// is in flight stays in `inflight/` and the next start sends it.
pub fn monitor(inv: &Inventory, outbox: &StateDir, sender: &Sender) -> i32 {
    std::thread::scope(|scope| monitor_in(scope, inv, outbox, sender))
}

/// A discovery the loop started, its answer awaited beside it.
struct Pass {
    /// The leadership term it was started in ([`monitor_in`]): an answer from an earlier
    /// term is dropped (what this host knew then is forgotten).
    term: u64,
    /// The nodes asked.
    nodes: Vec<crate::slurm::SinfoNode>,
    /// Those among them discovered again because their slurmd started after their record.
    restarted: BTreeSet<String>,
}

/// What this host knows of the nodes while it leads: forgotten when it stops leading
/// ([`Nodes::forget`]), as at a start.
#[derive(Default)]
struct Nodes {
    /// Each node as it was last seen.
    known: BTreeMap<String, Seen>,
    /// The nodes whose NodeConfig this service queued: the only ones it ever deletes.
    ours: BTreeSet<String>,
    /// The records' discovery times and the nodes discovered again after a restart.
    restarts: crate::inventory::freshness::Restarts,
    /// Bumped at each stand-down: a discovery's answer from an earlier term is dropped.
    term: u64,
}

impl Nodes {
    /// Forgets what this host knew of the nodes; a new term starts.
    fn forget(&mut self) {
        self.known.clear();
        self.ours.clear();
        self.restarts.clear();
        self.term += 1;
    }
}

/// What one poll leaves the loop to do.
enum Polled {
    /// Nothing to discover.
    Nothing,
    /// These nodes to discover.
    Discover(Pass),
    /// Nodes to discover while a discovery is still under way: the next poll follows its
    /// answer.
    Deferred,
}

/// What the latest poll listed: the available nodes (a discovery's answer for a node no
/// longer among them is dropped: it is discovered again when it comes back) and how many
/// nodes in all.
#[derive(Default)]
struct Listed {
    available: BTreeSet<String>,
    count: usize,
}

/// [`monitor`]'s loop. Discovery (an `srun` that may wait for the scheduler up to
/// `DiscoveryTimeout`) runs in a thread of `scope`, one at a time, so that reconciliation,
/// the leadership check and the resends keep their pace meanwhile; its answer is applied by
/// the loop when it comes.
fn monitor_in<'scope, 'env: 'scope>(
    scope: &'scope std::thread::Scope<'scope, 'env>,
    inv: &'env Inventory<'env>,
    outbox: &'env StateDir,
    sender: &'env Sender,
) -> i32 {
    log::info!(
        "monitoring cluster {} every {} s",
        inv.cluster,
        inv.cfg.poll_interval.as_secs(),
    );
    let mut nodes = Nodes::default();
    let mut next_poll = Instant::now();
    let every = |d: Duration| (!d.is_zero()).then_some(d);
    let mut next_reconcile = Instant::now();
    let mut next_reassert = every(inv.cfg.node_reassert_interval).map(|d| Instant::now() + d);
    let follow_records = inv.cfg.job_interfaces != crate::config::JobInterfaces::Nodes;
    let mut records = resend::RecordWatch::default();
    let mut resend_on: BTreeSet<String> = BTreeSet::new();
    let mut leadership = Leadership::new(inv.slurm.clone(), Some(sender.gate()));
    let mut leads = false;
    // On a pair, a host that becomes leader catches up the ends the other may not have sent.
    let mut catch_up: Option<CatchUp> = None;
    // Discovery beside the loop: its answers, whether one is under way, and whether a poll
    // left nodes for later.
    let (answers, answer_rx) = std::sync::mpsc::channel::<(Pass, crate::inventory::Discovered)>();
    let mut discovering = false;
    let mut deferred = false;
    let mut listed = Listed::default();
    while !inv.stop.load(Ordering::Relaxed) {
        systemd::notify("WATCHDOG=1");
        if leads && next_reassert.is_some_and(|t| Instant::now() >= t) {
            let n = nodes
                .known
                .values_mut()
                .filter(|v| **v == Seen::Sent)
                .map(|v| *v = Seen::Refresh)
                .count();
            log::info!("re-asserting the NodeConfig of {n} node(s) (NodeReassertInterval)");
            next_reassert = every(inv.cfg.node_reassert_interval).map(|d| Instant::now() + d);
            next_poll = Instant::now();
        }
        if Instant::now() >= next_poll {
            // Who leads is decided again at every poll (super::leadership).
            let was = leads;
            // 25.11 and later: slurmctld's /readyz beside the heartbeat.
            let readyz = slurm::version(&inv.slurm)
                .is_ok_and(|v| (v.major, v.minor) >= crate::slurm::leader::READYZ_SINCE);
            leads = leadership.update(outbox, readyz).leads();
            if was && !leads {
                stand_down(&mut nodes, &mut resend_on, &mut catch_up, sender);
            }
            if leads {
                if !was {
                    // The reconciliation and the record watch start from now.
                    next_reconcile = Instant::now();
                    // Only when control came from another controller: a restart of the
                    // leader's own service is no takeover, and what it queued is its own.
                    if super::controller_pair() {
                        if leadership.took_over() {
                            catch_up = Some(CatchUp::new(crate::timefmt::now_epoch()));
                        } else {
                            log::info!("catch-up: not run: this host was the last controller in control it saw (StateDir/{}); no other controller led meanwhile", super::leadership::LAST_IN_CONTROL);
                        }
                    }
                    // Before its first discovery, whose srun waits for the scheduler (22.05
                    // schedules nothing for ~30 s after a takeover, measured): what the old
                    // leader could not send comes first.
                    if !inv.cfg.reconcile_interval.is_zero() {
                        reconcile_pass(inv, outbox, sender, &mut catch_up);
                        next_reconcile = Instant::now() + inv.cfg.reconcile_interval;
                    }
                    if follow_records {
                        records.changed(outbox);
                    }
                }
                match poll(
                    inv,
                    &mut nodes,
                    outbox,
                    leadership.may_delete(),
                    discovering,
                    &mut listed,
                ) {
                    Polled::Nothing => {}
                    Polled::Deferred => deferred = true,
                    Polled::Discover(pass) => {
                        discovering = true;
                        let answers = answers.clone();
                        scope.spawn(move || {
                            let found = discover_caught(inv, &pass.nodes);
                            let _ = answers.send((pass, found));
                        });
                    }
                }
                // Who leads is asked again before this host resends or reconciles, so that a
                // host that lost control meanwhile does not send RUNNING events the new
                // leader's ends may already have overtaken.
                leads = leadership.recheck(outbox, readyz).leads();
                if !leads {
                    stand_down(&mut nodes, &mut resend_on, &mut catch_up, sender);
                }
            }
            if leads {
                if follow_records {
                    resend_on.extend(records.changed(outbox));
                    resend(inv, &mut resend_on, outbox);
                }
            } else {
                log::debug!("poll: this host does not lead; inventory and reconciliation skipped");
            }
            sender.wake();
            next_poll = Instant::now() + inv.cfg.poll_interval;
        }
        if let Ok((pass, found)) = answer_rx.try_recv() {
            discovering = false;
            if leads && pass.term == nodes.term {
                let restarted = apply(inv, &mut nodes, outbox, &pass, found, &listed);
                if follow_records {
                    // Their jobs went by node names while the records were stale: decided
                    // anew, with the records just kept.
                    resend_on.extend(restarted);
                    resend_on.extend(records.changed(outbox));
                    resend(inv, &mut resend_on, outbox);
                }
                sender.wake();
            } else {
                log::debug!(
                    "discovery of {} node(s) answered after this host's role changed; its answer is dropped",
                    pass.nodes.len()
                );
            }
            if std::mem::take(&mut deferred) {
                next_poll = Instant::now();
            }
        }
        if !inv.cfg.reconcile_interval.is_zero() && Instant::now() >= next_reconcile {
            // Representation records whose job's end never went out (this host's own StateDir).
            let pruned = outbox.job_reps.prune(crate::state::job_reps::MAX_AGE);
            if pruned > 0 {
                log::info!("{pruned} representation record(s) of jobs without an end removed");
            }
            outbox
                .ends_sent
                .prune(super::catch_up::CATCH_UP_WINDOW + super::catch_up::CATCH_UP_FOR);
            if leads {
                reconcile_pass(inv, outbox, sender, &mut catch_up);
            }
            next_reconcile = Instant::now() + inv.cfg.reconcile_interval;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    log::info!("stopping");
    systemd::notify("STOPPING=1");
    0
}

/// What a host that no longer leads forgets: what it knew is stale when it leads again, so it
/// starts over then, as at a start (it deletes only nodes it lists itself afterwards); what it
/// queued so far may be overtaken by the new leader's events.
fn stand_down(
    nodes: &mut Nodes,
    resend_on: &mut BTreeSet<String>,
    catch_up: &mut Option<CatchUp>,
    sender: &Sender,
) {
    nodes.forget();
    resend_on.clear();
    *catch_up = None;
    sender.check_queued_before(u64::try_from(crate::timefmt::now_nanos()).unwrap_or(u64::MAX));
}

/// One reconciliation pass, then the new leader's catch-up while it is due.
fn reconcile_pass(
    inv: &Inventory,
    outbox: &StateDir,
    sender: &Sender,
    catch_up: &mut Option<CatchUp>,
) {
    let reconciled = reconcile::reconcile(inv.cfg, &inv.slurm, &inv.cluster, outbox);
    if reconciled.is_ok() {
        outbox.status.record_reconcile();
    }
    match reconciled {
        Ok(r) if r.started + r.ended + r.corrected > 0 => {
            log::info!(
                "reconcile: {} RUNNING, {} end(s) and {} correction(s) queued",
                r.started,
                r.ended,
                r.corrected
            );
            sender.wake();
        }
        // Each said where it was queued.
        Ok(r) if r.reshaped + r.restamped > 0 => sender.wake(),
        Ok(_) => {}
        // Said once, when the backoff started (src/slurm.rs).
        Err(e) if slurm::held_back(&e) => log::debug!("reconcile: {e}"),
        Err(e) => log::error!("reconcile: {e}"),
    }
    if let Some(c) = catch_up.as_mut().filter(|c| c.due()) {
        match c.pass(inv.cfg, &inv.slurm, &inv.cluster, outbox) {
            Ok(0) => {}
            Ok(n) => {
                log::info!("catch-up: {n} end(s) queued from Slurm's records");
                sender.wake();
            }
            Err(e) if slurm::held_back(&e) => log::debug!("{e}"),
            Err(e) => log::warn!("{e}; trying again at the next pass"),
        }
    } else {
        *catch_up = None;
    }
}

/// Queues the RUNNING again of the running jobs on nodes whose record changed (see
/// [`crate::service::resend`]); the nodes stay in `nodes` until slurmctld could be asked.
fn resend(inv: &Inventory, nodes: &mut BTreeSet<String>, outbox: &StateDir) {
    if nodes.is_empty() {
        return;
    }
    match resend::resend_running_on(inv.cfg, &inv.slurm, &inv.cluster, outbox, nodes) {
        Ok(n) => {
            if n > 0 {
                log::info!("{n} running job(s) queued again: the inventory of their nodes changed");
            }
            nodes.clear();
        }
        Err(e) if slurm::held_back(&e) => {
            log::debug!("cannot resend the jobs on changed nodes yet: {e}")
        }
        Err(e) => log::error!("cannot resend the jobs on changed nodes yet: {e}"),
    }
}

/// One monitor poll: lists the nodes; picks those to discover — nodes that appeared, came
/// back or are due for re-assertion, and nodes whose slurmd started since their record was
/// taken ([`crate::inventory::freshness`]: a reboot, a power-up, a new registration; one
/// `scontrol show node` per poll), so that NodeConfig follows their new NICs (while
/// `discovering`, a discovery is under way: they wait for the poll after its answer); deletes
/// nodes that left, if this service sent them (`ours`): a node it never sent (one that was
/// never available while it ran) may be another cluster's of the same name, and is never
/// deleted. With `may_delete` false (this host has just become leader) a node that left is
/// forgotten, not deleted. The delete itself asks CloudVision whose the node is first
/// ([`crate::service::engine::delete_own_node`]). `listed` is what it listed.
fn poll(
    inv: &Inventory,
    state: &mut Nodes,
    outbox: &StateDir,
    may_delete: bool,
    discovering: bool,
    listed: &mut Listed,
) -> Polled {
    let nodes = match slurm::sinfo_nodes(&inv.slurm, COMMAND_TIMEOUT) {
        Ok(n) => n,
        Err(e) => {
            log::error!("cannot list nodes: {e}");
            return Polled::Nothing;
        }
    };
    let Nodes {
        known,
        ours,
        restarts,
        term,
    } = state;
    listed.count = nodes.len();
    listed.available = nodes
        .iter()
        .filter(|n| n.available())
        .map(|n| n.name.clone())
        .collect();
    let present: BTreeSet<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
    let gone: Vec<String> = known
        .keys()
        .filter(|k| !present.contains(k.as_str()))
        .cloned()
        .collect();
    for name in gone {
        known.remove(&name);
        restarts.forget(&name);
        outbox.nodes.forget(&name);
        if !ours.remove(&name) {
            log::info!("node {name}: left the cluster; it was never sent, nothing to delete");
            continue;
        }
        if !may_delete {
            log::info!(
                "node {name}: left the cluster; not deleted: this host leads since its last poll only (a new leader deletes from its second poll)"
            );
            continue;
        }
        log::info!("node {name}: left the cluster; deleting its NodeConfig");
        queue(
            outbox,
            Item::NodeDelete {
                name,
                location: Some(inv.cluster.clone()),
            },
        );
    }
    let mut to_discover: Vec<crate::slurm::SinfoNode> = Vec::new();
    for n in &nodes {
        let was = known.get(&n.name).copied();
        if n.available() {
            if was != Some(Seen::Sent) {
                to_discover.push(n.clone());
            }
            continue;
        }
        match was {
            Some(Seen::Sent) | Some(Seen::Refresh) | Some(Seen::Failed) => log::info!(
                "node {}: now {}; it will be sent again when it comes back",
                n.name,
                n.state
            ),
            None => log::info!("node {}: {} (not available for discovery)", n.name, n.state),
            Some(Seen::Unavailable) => {}
        }
        known.insert(n.name.clone(), Seen::Unavailable);
    }
    if discovering {
        // The restarted nodes are asked about again at the poll after the answer.
        return if to_discover.is_empty() {
            Polled::Nothing
        } else {
            Polled::Deferred
        };
    }
    // Nodes whose slurmd started after their record was taken: discovered again now (those
    // discovered anyway are counted too, so that their jobs are decided anew: a node's first
    // poll after a service restart).
    let mut restarted = BTreeSet::new();
    if !listed.available.is_empty() {
        let available: Vec<&str> = listed.available.iter().map(String::as_str).collect();
        match crate::inventory::freshness::starts_now(&inv.slurm) {
            Ok(starts) => {
                for (name, why) in restarts.due(outbox, &starts, &available) {
                    if to_discover.iter().any(|n| n.name == name) {
                        log::debug!("node {name}: {why}");
                    } else if let Some(n) = nodes.iter().find(|n| n.name == name) {
                        log::info!("node {name}: {why}: discovering it again");
                        to_discover.push(n.clone());
                    }
                    restarted.insert(name);
                }
            }
            Err(e) => log::warn!("cannot tell which nodes' slurmd restarted: {e}"),
        }
    }
    if to_discover.is_empty() {
        record_inventory(outbox, known, listed.count, 0);
        return Polled::Nothing;
    }
    Polled::Discover(Pass {
        term: *term,
        nodes: to_discover,
        restarted,
    })
}

/// Applies a discovery's answer: each node's record kept and its NodeConfig queued, or its
/// failure noted (discovered again at the next poll). A node the latest poll did not list as
/// available (it left, or went down meanwhile) is skipped: it is discovered again when it
/// comes back. Returns the nodes discovered again after a restart whose new record came in
/// (now, or after a failed discovery, in an earlier answer): their jobs are decided anew.
fn apply(
    inv: &Inventory,
    state: &mut Nodes,
    outbox: &StateDir,
    pass: &Pass,
    found: crate::inventory::Discovered,
    listed: &Listed,
) -> BTreeSet<String> {
    let Nodes {
        known,
        ours,
        restarts,
        ..
    } = state;
    let mut failed = 0;
    for (name, r) in found {
        if !listed.available.contains(&name) {
            log::debug!("node {name}: its discovery answered after it left service; dropped");
            continue;
        }
        match r {
            Ok(rec) if rec.interfaces.is_empty() => {
                // Not a failure, and not asked again until its next refresh: one warning.
                let text = crate::inventory::no_interface(&name, inv.cfg);
                log::warn!("{}", crate::logging::escape_control(&text));
                crate::inventory::save_record(outbox, &rec);
                restarts.noted(&rec);
                known.insert(name, Seen::Sent);
            }
            Ok(rec) => {
                let verb = match known.get(&name) {
                    None => "appeared",
                    Some(Seen::Refresh) => "re-asserting",
                    Some(Seen::Sent | Seen::Failed) if pass.restarted.contains(&name) => {
                        "discovered again after its slurmd started"
                    }
                    Some(_) => "came back",
                };
                log::info!(
                    "node {name}: {verb}; sending NodeConfig ({} interface(s))",
                    rec.interfaces.len()
                );
                known.insert(name.clone(), Seen::Sent);
                ours.insert(name);
                crate::inventory::save_record(outbox, &rec);
                restarts.noted(&rec);
                queue(
                    outbox,
                    Item::Node {
                        node: rec.to_node_config(&inv.cluster, inv.cfg.node_hostname),
                    },
                );
            }
            Err(e) => {
                log::warn!("node {name}: discovery failed, will retry next poll: {e}");
                failed += 1;
                let seen = known.entry(name).or_insert(Seen::Unavailable);
                if *seen == Seen::Sent {
                    *seen = Seen::Failed;
                }
            }
        }
    }
    record_inventory(outbox, known, listed.count, failed);
    restarts.settled()
}

/// [`Inventory::discover`] of `nodes`, in the discovery thread ([`caught`]).
fn discover_caught(
    inv: &Inventory,
    nodes: &[crate::slurm::SinfoNode],
) -> crate::inventory::Discovered {
    let refs: Vec<&crate::slurm::SinfoNode> = nodes.iter().collect();
    caught(nodes, || inv.discover(&refs))
}

/// `discover()`'s answer; a panic there (a bug) fails each of `nodes` with one error line,
/// asked again at the next poll, instead of ending the thread without an answer (no
/// discovery would ever start again).
fn caught(
    nodes: &[crate::slurm::SinfoNode],
    discover: impl FnOnce() -> crate::inventory::Discovered,
) -> crate::inventory::Discovered {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(discover)).unwrap_or_else(|_| {
        log::error!(
            "discovery of {} node(s) failed inside cvslurm (a panic: a bug, please report it with this log); asked again at the next poll",
            nodes.len()
        );
        nodes
            .iter()
            .map(|n| {
                (
                    n.name.clone(),
                    Err("discovery failed inside cvslurm (see the error above)".to_string()),
                )
            })
            .collect()
    })
}

/// The service's inventory for `cvslurm status`: the nodes listed, those whose NodeConfig is
/// queued (and not failed since), and the discoveries that failed in the last answer.
fn record_inventory(outbox: &StateDir, known: &BTreeMap<String, Seen>, listed: usize, failed: u64) {
    let sent = known
        .values()
        .filter(|s| matches!(s, Seen::Sent | Seen::Refresh))
        .count();
    outbox
        .status
        .record_inventory(listed as u64, sent as u64, failed);
}

fn queue(outbox: &StateDir, item: Item) {
    if let Err(e) = outbox.queue.enqueue(&Event::new(item, (0, 0))) {
        log::error!("outbox: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::record::{DiscoverRecord, Interface};
    use std::sync::atomic::AtomicBool;

    fn record(node: &str, mac: &str) -> DiscoverRecord {
        DiscoverRecord {
            node_name: node.into(),
            hostname: node.into(),
            location: Some("c".into()),
            interfaces: vec![Interface {
                name: "eth0".into(),
                mac_address: mac.into(),
                ip_addresses: vec![],
            }],
            topology: None,
            topology_error: None,
            taken_at: Some(1),
        }
    }

    /// A discovery that panics still answers: every node it was asked fails (asked again at
    /// the next poll), so the loop's one discovery at a time is not left waiting forever.
    #[test]
    fn a_discovery_that_panics_still_answers() {
        let nodes = crate::slurm::nodes::parse_sinfo("n1 idle debug\nn2 mixed debug\n");
        assert_eq!(nodes.len(), 2);
        let found = caught(&nodes, || panic!("a bug"));
        assert_eq!(found.len(), 2);
        assert!(found.values().all(|r| r.is_err()));
        let ok = caught(&nodes, crate::inventory::Discovered::new);
        assert!(ok.is_empty());
    }

    /// A discovery's answer comes after polls that may have seen its nodes change: a node
    /// still available is sent; one that went down (or left) meanwhile is skipped, to be
    /// discovered again when it comes back; a failure is counted and the node asked again.
    #[test]
    fn an_answer_is_applied_to_the_nodes_as_the_latest_poll_saw_them() {
        let d = std::env::temp_dir().join(format!("cvslurm-monitor-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let outbox = StateDir::new(&d);
        let cfg = crate::config::Config::default();
        let stop = AtomicBool::new(false);
        let inv = Inventory {
            cfg: &cfg,
            slurm: crate::slurm::runner::Slurm::new(None),
            cluster: "c".into(),
            client: None,
            stop: &stop,
        };
        let mut nodes = Nodes::default();
        nodes.known.insert("n2".to_string(), Seen::Unavailable);
        let pass = Pass {
            term: 0,
            nodes: Vec::new(),
            restarted: BTreeSet::new(),
        };
        let found: crate::inventory::Discovered = BTreeMap::from([
            ("n1".to_string(), Ok(record("n1", "02:00:00:00:00:01"))),
            ("n2".to_string(), Ok(record("n2", "02:00:00:00:00:02"))),
            ("n3".to_string(), Err("no discover record".to_string())),
        ]);
        let listed = Listed {
            available: ["n1", "n3"].iter().map(|s| s.to_string()).collect(),
            count: 3,
        };
        apply(&inv, &mut nodes, &outbox, &pass, found, &listed);
        assert_eq!(nodes.known.get("n1"), Some(&Seen::Sent));
        assert_eq!(nodes.known.get("n2"), Some(&Seen::Unavailable));
        assert_eq!(nodes.known.get("n3"), Some(&Seen::Unavailable));
        assert_eq!(nodes.ours, BTreeSet::from(["n1".to_string()]));
        let queued: Vec<String> = outbox
            .queue
            .pending()
            .iter()
            .map(|e| e.item.describe())
            .collect();
        assert_eq!(queued, ["node n1"]);
        let _ = std::fs::remove_dir_all(&d);
    }
}
