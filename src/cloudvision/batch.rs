//! Sending many requests: bounded concurrency over one pooled client with a shared pause on
//! HTTP 429 (the one-shot `inventory` and `send` modes), and the backoff the service's sender
//! uses. The outbox is delivered by [`crate::service::engine`].

use crate::cloudvision::SendError;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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
    let next = AtomicUsize::new(0);
    // Each worker keeps its own (index, result) list: no lock per item.
    let mut parts: Vec<Vec<(usize, R)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= n {
                            break mine;
                        }
                        mine.push((i, f(&items[i])));
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    let mut results: Vec<Option<R>> = (0..n).map(|_| None).collect();
    for part in &mut parts {
        for (i, r) in part.drain(..) {
            results[i] = Some(r);
        }
    }
    results
        .into_iter()
        .map(|r| r.expect("every item was processed"))
        .collect()
}

/// How [`send_all`] treats HTTP 429 (CloudVision asking the client to slow down).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimitPolicy {
    /// Rate-limited retries of one item before its 429 is returned as its result.
    pub max_retries: u32,
    /// The pause when a 429 carries no usable `Retry-After`.
    pub default_wait: Duration,
    /// The longest pause honoured (a larger `Retry-After` is cut to this).
    pub max_wait: Duration,
}

impl Default for RateLimitPolicy {
    fn default() -> Self {
        RateLimitPolicy {
            max_retries: 5,
            default_wait: Duration::from_secs(1),
            max_wait: Duration::from_secs(60),
        }
    }
}

/// [`send_all_with`] with the default [`RateLimitPolicy`]: at most 5 retries per item, pauses
/// of `Retry-After` (1 s when absent), at most 60 s each.
pub fn send_all<T: Sync, R: Send>(
    items: &[T],
    concurrency: usize,
    f: impl Fn(&T) -> Result<R, SendError> + Sync,
) -> Vec<Result<R, SendError>> {
    send_all_with(items, concurrency, &RateLimitPolicy::default(), None, f)
}

/// Sends every item with `f` on at most `concurrency` threads (each keeps its pooled
/// keep-alive connection); results come back in input order.
///
/// A 429 pauses *every* worker until its `Retry-After` has passed (CloudVision asks the
/// client, not one request, to slow down), then the item is sent again, at most
/// `policy.max_retries` times. Other errors are returned as they are: retrying those is the
/// outbox's job. When `stop` is set, items not yet sent get [`SendError::Timeout`].
pub fn send_all_with<T: Sync, R: Send>(
    items: &[T],
    concurrency: usize,
    policy: &RateLimitPolicy,
    stop: Option<&AtomicBool>,
    f: impl Fn(&T) -> Result<R, SendError> + Sync,
) -> Vec<Result<R, SendError>> {
    let resume_at: Mutex<Option<Instant>> = Mutex::new(None);
    let pause = || {
        let until = *resume_at.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = until {
            let now = Instant::now();
            if t > now {
                std::thread::sleep(t - now);
            }
        }
    };
    parallel_map(items, concurrency, |item| {
        let mut retries = 0;
        loop {
            pause();
            if stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
                return Err(SendError::Timeout("stopped before sending".into()));
            }
            match f(item) {
                Err(SendError::RateLimited { retry_after }) if retries < policy.max_retries => {
                    retries += 1;
                    let wait = retry_after
                        .unwrap_or(policy.default_wait)
                        .min(policy.max_wait);
                    let until = Instant::now() + wait;
                    let mut g = resume_at.lock().unwrap_or_else(|e| e.into_inner());
                    if g.is_none_or(|t| t < until) {
                        if g.is_none_or(|t| t <= Instant::now()) {
                            log::warn!(
                                "CloudVision is rate limiting (HTTP 429); pausing all requests for {:.1} s",
                                wait.as_secs_f64()
                            );
                        }
                        *g = Some(until);
                    }
                }
                other => return other,
            }
        }
    })
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
    fn send_all_honours_retry_after_and_is_bounded() {
        use std::sync::atomic::AtomicU32;
        let policy = RateLimitPolicy {
            max_retries: 3,
            default_wait: Duration::from_millis(10),
            max_wait: Duration::from_millis(300),
        };
        // Item 3 is rate limited twice (Retry-After 0.2 s), item 5 always.
        let tries: Vec<AtomicU32> = (0..8).map(|_| AtomicU32::new(0)).collect();
        let items: Vec<usize> = (0..8).collect();
        let t0 = Instant::now();
        let got = send_all_with(&items, 4, &policy, None, |&i| {
            let n = tries[i].fetch_add(1, Ordering::Relaxed);
            match i {
                3 if n < 2 => Err(SendError::RateLimited {
                    retry_after: Some(Duration::from_millis(200)),
                }),
                5 => Err(SendError::RateLimited { retry_after: None }),
                _ => Ok(i * 10),
            }
        });
        assert!(
            t0.elapsed() >= Duration::from_millis(400),
            "{:?}",
            t0.elapsed()
        );
        assert_eq!(got[3], Ok(30));
        assert_eq!(tries[3].load(Ordering::Relaxed), 3);
        assert!(matches!(got[5], Err(SendError::RateLimited { .. })));
        assert_eq!(tries[5].load(Ordering::Relaxed), 4); // 1 + max_retries
        for i in [0, 1, 2, 4, 6, 7] {
            assert_eq!(got[i], Ok(i * 10));
        }
        // Other errors are not retried here.
        let once = AtomicU32::new(0);
        let got = send_all(&[1], 2, |_| -> Result<(), SendError> {
            once.fetch_add(1, Ordering::Relaxed);
            Err(SendError::Server {
                status: 503,
                message: String::new(),
            })
        });
        assert!(matches!(got[0], Err(SendError::Server { .. })));
        assert_eq!(once.load(Ordering::Relaxed), 1);
        // A stop request ends it.
        let stop = AtomicBool::new(true);
        let got = send_all_with(&[1, 2], 2, &policy, Some(&stop), |_| Ok(()));
        assert!(got.iter().all(|r| matches!(r, Err(SendError::Timeout(_)))));
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
