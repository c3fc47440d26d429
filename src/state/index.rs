//! The service's index of the outbox: what it keeps in memory about the pending event files
//! between its looks ([`super::queue::Queue::refresh`] keeps it up to date), so that it never
//! holds the events themselves.

use super::event::{Event, Item};
use std::time::{Duration, Instant};

/// The most event files [`Queue::refresh`](super::queue::Queue::refresh) reads in one call.
pub const READ_AT_MOST: usize = 50_000;

/// How often [`Queue::refresh`](super::queue::Queue::refresh) tells every file by its `stat` too
/// (see there).
pub const STAT_ALL_EVERY: Duration = Duration::from_secs(5);

/// [`Queue::refresh`](super::queue::Queue::refresh) lists the outbox at least this often even when
/// its directory's times say nothing changed.
pub const FULL_PASS_EVERY: Duration = Duration::from_secs(60);

/// What the service keeps in memory about the outbox between its looks
/// ([`Queue::refresh`](super::queue::Queue::refresh)): per pending file its name and a [`Known`]
/// (under 250 bytes per event, the map's own overhead and a name of up to 30 bytes included: 250 MB
/// at 1,000,000 events, `OutboxMaxEvents`' default), never the events themselves.
#[derive(Debug, Default)]
pub struct Index {
    pub(super) known: std::collections::HashMap<Box<str>, Known>,
    /// Event files in the directory at the last pass (newer-format ones included).
    pub(super) files: usize,
    /// The directory's (mtime, ctime) at the last complete pass it can be trusted for.
    pub(super) stamp: Option<(i64, i64, i64, i64)>,
    /// When the directory was last listed completely.
    pub(super) full_at: Option<Instant>,
    /// When every file was last told by its `stat`, and how long that took.
    pub(super) stat_all_at: Option<Instant>,
    pub(super) stat_all_took: Duration,
    /// Pass number, to forget the names that vanished.
    pub(super) gen: u32,
    /// The last pass read every new or changed file (none left over [`READ_AT_MOST`]).
    pub(super) complete: bool,
    /// The oldest queue time (mtime) of the files the last pass counted but did not read
    /// (`Some(None)`: none); `None` when one of them could not be told.
    pub(super) unread: Option<Option<i64>>,
    /// Event files read so far (for tests and logs).
    pub reads: usize,
    /// The files handed in ([`Queue::hand_in`](super::queue::Queue::hand_in)) the last pass found,
    /// for the drainer to take in ([`Queue::fold`](super::queue::Queue::fold)); counted in `files`,
    /// never sent as they are.
    pub(super) spool: Vec<String>,
    /// The oldest queue time (mtime) among them.
    pub(super) spool_oldest: Option<i64>,
}

/// What [`Index`] knows of one pending file.
#[derive(Debug, Clone, Copy)]
pub(super) struct Known {
    /// Inode, ctime (ns) and size: a rewritten file differs.
    pub(super) id: (u64, i64, u64),
    /// The inode number the directory listing gave (the same as `stat`'s on most file
    /// systems, not on all: compared only with the listing's).
    pub(super) dino: u64,
    pub(super) seq: u128,
    pub(super) queued_at: i64,
    /// 0 node, 1 a job's RUNNING, 2 a job's end
    /// ([`Queue::enforce_limit`](super::queue::Queue::enforce_limit)'s order).
    pub(super) class: u8,
    /// An end that needs slurmctld's word before it is sent
    /// ([`Event::resolve`](super::event::Event::resolve)).
    pub(super) provisional: bool,
    /// Of a newer format: never sent, counted or dropped.
    pub(super) newer: bool,
    pub(super) gen: u32,
}

impl Known {
    pub(super) fn of(ev: &Event, id: (u64, i64, u64), dino: u64, gen: u32) -> Known {
        let class = match &ev.item {
            Item::Node { .. } | Item::NodeDelete { .. } => 0,
            Item::Job { job } if !job.state.is_terminal() => 1,
            Item::Job { .. } => 2,
        };
        Known {
            id,
            dino,
            seq: ev.seq,
            queued_at: ev.queued_at,
            class,
            provisional: ev.resolve.is_some(),
            newer: false,
            gen,
        }
    }
}

impl Index {
    /// What [`Queue::depth_since`](super::queue::Queue::depth_since) would find, from memory: the
    /// event files at the last pass and the oldest queue time. Files the last pass left unread
    /// (over [`READ_AT_MOST`]: a service started on a large outbox) count by the modification time
    /// the pass saw, as `depth_since` takes it; `None` when it could not tell one of them.
    /// O(events).
    pub fn summary(&self) -> Option<(usize, Option<i64>)> {
        let mut oldest: Option<i64> = if self.complete { None } else { self.unread? };
        for k in self.known.values() {
            if k.newer {
                // Its queue time is not known (a format this version cannot read).
                return None;
            }
            oldest = Some(oldest.map_or(k.queued_at, |o| o.min(k.queued_at)));
        }
        if let Some(t) = self.spool_oldest {
            oldest = Some(oldest.map_or(t, |o| o.min(t)));
        }
        Some((self.files, oldest))
    }

    /// The files handed in that the last [`Queue::refresh`](super::queue::Queue::refresh) found:
    /// the drainer takes them in ([`Queue::fold`](super::queue::Queue::fold)).
    pub fn handed_in(&self) -> &[String] {
        &self.spool
    }

    /// False when the last [`Queue::refresh`](super::queue::Queue::refresh) left files unread over
    /// [`READ_AT_MOST`]: look again soon.
    pub fn complete(&self) -> bool {
        self.complete
    }

    /// The names of at most `n` sendable events, oldest first, that `take(name,
    /// provisional)` accepts, and whether more were accepted than returned.
    pub fn oldest(&self, n: usize, take: impl Fn(&str, bool) -> bool) -> (Vec<String>, bool) {
        let mut more = false;
        let names = self.oldest_by(
            n,
            |name, k| !k.newer && take(name, k.provisional),
            |k| (0, k.seq),
        );
        if names.len() == n {
            more = self
                .known
                .iter()
                .filter(|(name, k)| !k.newer && take(name, k.provisional))
                .nth(n)
                .is_some();
        }
        (names, more)
    }

    /// The `n` smallest by `key` among the entries `keep` accepts: O(entries × log n).
    pub(super) fn oldest_by(
        &self,
        n: usize,
        keep: impl Fn(&str, &Known) -> bool,
        key: impl Fn(&Known) -> (u8, u128),
    ) -> Vec<String> {
        use std::collections::BinaryHeap;
        if n == 0 {
            return Vec::new();
        }
        let mut heap: BinaryHeap<((u8, u128), &str)> = BinaryHeap::new();
        for (name, k) in &self.known {
            if !keep(name, k) {
                continue;
            }
            let item = (key(k), &**name);
            if heap.len() < n {
                heap.push(item);
            } else if heap.peek().is_some_and(|top| item < *top) {
                heap.pop();
                heap.push(item);
            }
        }
        heap.into_sorted_vec()
            .into_iter()
            .map(|(_, n)| n.to_string())
            .collect()
    }
}
