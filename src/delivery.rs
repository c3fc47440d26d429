//! Sending many requests: bounded concurrency over one pooled client, and the outbox drain
//! (used by `cvslurm flush` and by the service).

use crate::cloudvision::{Answer, Client, SendError};
use crate::outbox::{Event, Finish, Item, Outbox};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Runs `f` over `items` on at most `concurrency` threads; results come back in input order.
pub fn parallel_map<T: Sync, R: Send>(
    items: &[T],
    concurrency: usize,
    f: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    let n = items.len();
    let workers = concurrency.clamp(1, n.max(1));
    if workers == 1 {
        return items.iter().map(f).collect();
    }
    let next = Mutex::new(0usize);
    let results: Mutex<Vec<Option<R>>> = Mutex::new((0..n).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = {
                    let mut g = next.lock().unwrap_or_else(|e| e.into_inner());
                    let i = *g;
                    *g += 1;
                    i
                };
                if i >= n {
                    break;
                }
                let r = f(&items[i]);
                results.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(r);
            });
        }
    });
    results
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .map(|r| r.expect("every item was processed"))
        .collect()
}

/// Sends one outbox item.
pub fn send_item(
    client: &Client,
    item: &Item,
    deadline: Option<Instant>,
) -> Result<Answer, SendError> {
    match item {
        Item::Job { job } => client.post_job(job, deadline),
        Item::Node { node } => client.post_node(node, deadline),
        Item::NodeDelete { name } => client.delete_node(name, deadline),
    }
}

/// What one drain pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DrainReport {
    /// Events CloudVision took.
    pub delivered: usize,
    /// Events kept for a later try.
    pub kept: usize,
    /// Events moved to `rejected/`.
    pub rejected: usize,
    /// CloudVision refused the token: the pass stopped early.
    pub token_refused: bool,
    /// The longest `Retry-After` CloudVision asked for.
    pub retry_after: Option<Duration>,
    /// The last error, for the log and `status`.
    pub last_error: Option<String>,
}

/// Sends every pending event once, oldest first, `concurrency` at a time. Events of one key
/// are never sent concurrently (the outbox holds one per key). Stops early when `stop` is set
/// or when CloudVision refuses the token.
pub fn drain(
    outbox: &Outbox,
    client: &Client,
    concurrency: usize,
    stop: &AtomicBool,
) -> DrainReport {
    let pending: VecDeque<Event> = outbox.pending().into();
    let queue = Mutex::new(pending);
    let report = Mutex::new(DrainReport::default());
    let halt = AtomicBool::new(false);
    let workers = concurrency.max(1);
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                if stop.load(Ordering::Relaxed) || halt.load(Ordering::Relaxed) {
                    break;
                }
                let Some(ev) = queue.lock().unwrap_or_else(|e| e.into_inner()).pop_front() else {
                    break;
                };
                let taken = match outbox.take(&ev) {
                    Ok(Some(t)) => t,
                    Ok(None) => continue, // replaced or taken meanwhile
                    Err(e) => {
                        log::error!("outbox: {e}");
                        halt.store(true, Ordering::Relaxed);
                        break;
                    }
                };
                let what = taken.item.describe();
                let result = send_item(client, &taken.item, None);
                let mut r = report.lock().unwrap_or_else(|e| e.into_inner());
                let finish = match &result {
                    Ok(a) => {
                        r.delivered += 1;
                        log::info!(
                            "outbox: delivered {what} (HTTP {}, queued {} s ago)",
                            a.status,
                            crate::timefmt::now_epoch() - taken.queued_at
                        );
                        Finish::Delivered
                    }
                    Err(e @ SendError::TokenRefused { .. }) => {
                        r.kept += 1;
                        r.token_refused = true;
                        r.last_error = Some(e.to_string());
                        halt.store(true, Ordering::Relaxed);
                        Finish::Retry
                    }
                    Err(e) if e.retryable() || matches!(e, SendError::NotConfigured(_)) => {
                        r.kept += 1;
                        if let SendError::RateLimited { retry_after } = e {
                            r.retry_after = r.retry_after.max(*retry_after);
                        }
                        log::debug!("outbox: {what} kept: {e}");
                        r.last_error = Some(e.to_string());
                        Finish::Retry
                    }
                    Err(e) => {
                        r.rejected += 1;
                        log::error!("outbox: {what} rejected, moved to rejected/: {e}");
                        r.last_error = Some(e.to_string());
                        Finish::Reject(e.to_string())
                    }
                };
                drop(r);
                if let Err(e) = outbox.finish(&taken, finish) {
                    log::error!("outbox: {e}");
                }
            });
        }
    });
    let mut r = report.into_inner().unwrap_or_else(|e| e.into_inner());
    r.kept += queue.into_inner().unwrap_or_else(|e| e.into_inner()).len();
    r
}

/// Capped exponential backoff with jitter: 1 s, 2 s, 4 s … up to `cap`, each ±25 %.
pub fn backoff(failures: u32, cap: Duration) -> Duration {
    let base = Duration::from_secs(1u64 << failures.min(16)).min(cap);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let jitter = (nanos % 500) as f64 / 1000.0 - 0.25; // -0.25 .. +0.25
    base.mul_f64(1.0 + jitter)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parallel_map_keeps_order() {
        let items: Vec<u32> = (0..100).collect();
        assert_eq!(
            parallel_map(&items, 8, |x| x * 2),
            items.iter().map(|x| x * 2).collect::<Vec<_>>()
        );
        assert!(parallel_map(&Vec::<u32>::new(), 8, |x| *x).is_empty());
    }

    #[test]
    fn backoff_is_capped_with_jitter() {
        for f in 0..20 {
            let b = backoff(f, Duration::from_secs(300));
            let base = Duration::from_secs(1u64 << f.min(16)).min(Duration::from_secs(300));
            assert!(
                b >= base.mul_f64(0.75) && b <= base.mul_f64(1.25),
                "{f}: {b:?}"
            );
        }
    }
}
