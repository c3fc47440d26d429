//! Sending many requests: bounded concurrency over one pooled client with a shared pause,
//! and the one retry policy: which failures are worth another try ([`verdict`]) and how long
//! to wait before it ([`retry_wait`]), for the service's engine and sender and for the
//! one-shot `inventory` ([`retry_without_outbox`]). The outbox is delivered by
//! [`crate::service::engine`].

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

/// Sends every item with `f` on at most `concurrency` threads (each keeps its pooled
/// keep-alive connection); results come back in input order.
///
/// After each failure `retry(error, retries so far)` is the pause before the item is sent
/// again, or `None` to return the error as the item's result ([`retry_without_outbox`]). A
/// pause holds *every* worker (a 429 asks the client, not one request, to slow down). When
/// `stop` is set, items not yet sent get [`SendError::Timeout`].
pub fn send_all_by<T: Sync, R: Send>(
    items: &[T],
    concurrency: usize,
    stop: Option<&AtomicBool>,
    retry: impl Fn(&SendError, u32) -> Option<Duration> + Sync,
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
            let e = match f(item) {
                Err(e) => e,
                ok => return ok,
            };
            let Some(wait) = retry(&e, retries) else {
                return Err(e);
            };
            retries += 1;
            let until = Instant::now() + wait;
            let mut g = resume_at.lock().unwrap_or_else(|e| e.into_inner());
            if g.is_none_or(|t| t < until) {
                if g.is_none_or(|t| t <= Instant::now()) {
                    log::warn!("{e}; pausing all requests for {:.1} s", wait.as_secs_f64());
                }
                *g = Some(until);
            }
        }
    })
}

/// What the delivery policy does with a request that failed: the one classification for the
/// service's engine ([`crate::service::engine`]) and the one-shot `inventory`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Try again later: it may pass with time (CloudVision unreachable or busy, rate
    /// limiting, the token refused, no server configured, a server not answering as
    /// CloudVision).
    Keep {
        /// A 429's `Retry-After`.
        retry_after: Option<Duration>,
        /// CloudVision refused the token: nothing goes through until it is replaced.
        token_refused: bool,
    },
    /// CloudVision will never take it as it is.
    Reject,
}

/// Classifies a failed request ([`Verdict`]).
pub fn verdict(e: &SendError) -> Verdict {
    if e.retryable()
        || matches!(
            e,
            SendError::NotConfigured(_)
                | SendError::TokenRefused { .. }
                | SendError::NotCloudVision { .. }
        )
    {
        Verdict::Keep {
            retry_after: match e {
                SendError::RateLimited { retry_after } => *retry_after,
                _ => None,
            },
            token_refused: matches!(e, SendError::TokenRefused { .. }),
        }
    } else {
        Verdict::Reject
    }
}

/// The longest pause between tries ([`retry_wait`]).
pub const BACKOFF_CAP: Duration = Duration::from_secs(300);

/// The pause after the `failures`-th failure in a row: [`backoff`] up to [`BACKOFF_CAP`], or
/// a 429's `Retry-After` (cut to [`BACKOFF_CAP`]) when that is longer. The service's sender
/// pauses every worker this long on a kept event.
pub fn retry_wait(failures: u32, retry_after: Option<Duration>) -> Duration {
    let wait = backoff(failures, BACKOFF_CAP);
    match retry_after {
        Some(ra) => wait.max(ra.min(BACKOFF_CAP)),
        None => wait,
    }
}

/// How many times a request is tried again where no outbox keeps it (the one-shot
/// `inventory`'s NodeConfigs) before its error is final: the pauses of [`retry_wait`] add up
/// to about 14 s, an admin's command ends while the admin still waits for it.
pub const RETRIES_WITHOUT_OUTBOX: u32 = 3;

/// The service's retry policy where no outbox keeps what fails (the one-shot `inventory`'s
/// NodeConfigs): after the `retries`-th retry (0: the first try) failed with `e`, the pause
/// before the request is sent again, or `None` when `e` is final. [`verdict`] decides what
/// is worth another try and [`retry_wait`] how long to wait, as in the service; without an
/// outbox a request is given up after [`RETRIES_WITHOUT_OUTBOX`] retries, and at once when
/// CloudVision refuses the token (as `flush` stops): no retry passes before it is replaced.
pub fn retry_without_outbox(e: &SendError, retries: u32) -> Option<Duration> {
    match verdict(e) {
        Verdict::Reject => None,
        Verdict::Keep { token_refused, .. }
            if token_refused || retries >= RETRIES_WITHOUT_OUTBOX =>
        {
            None
        }
        Verdict::Keep { retry_after, .. } => Some(retry_wait(retries + 1, retry_after)),
    }
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
    fn send_all_by_honours_retry_after_and_is_bounded() {
        use std::sync::atomic::AtomicU32;
        // A 429 is retried at most 3 times, after its Retry-After (10 ms without one, at
        // most 300 ms); nothing else is.
        let policy = |e: &SendError, retries: u32| match e {
            SendError::RateLimited { retry_after } if retries < 3 => Some(
                retry_after
                    .unwrap_or(Duration::from_millis(10))
                    .min(Duration::from_millis(300)),
            ),
            _ => None,
        };
        // Item 3 is rate limited twice (Retry-After 0.2 s), item 5 always.
        let tries: Vec<AtomicU32> = (0..8).map(|_| AtomicU32::new(0)).collect();
        let items: Vec<usize> = (0..8).collect();
        let t0 = Instant::now();
        let got = send_all_by(&items, 4, None, policy, |&i| {
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
        let got = send_all_by(&[1], 2, None, policy, |_| -> Result<(), SendError> {
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
        let got = send_all_by(&[1, 2], 2, Some(&stop), policy, |_| Ok(()));
        assert!(got.iter().all(|r| matches!(r, Err(SendError::Timeout(_)))));
    }

    /// Without an outbox a NodeConfig is retried as the service's engine would keep it
    /// (unreachable, 5xx, 429), after the service's backoff (a longer Retry-After honoured),
    /// at most [`RETRIES_WITHOUT_OUTBOX`] times; what the engine rejects, and a refused token
    /// (as `flush` stops), are final at once.
    #[test]
    fn a_nodeconfig_is_retried_as_the_service_keeps_it() {
        let server = SendError::Server {
            status: 503,
            message: String::new(),
        };
        let refused = SendError::Rejected {
            status: 400,
            message: String::new(),
        };
        let token = SendError::TokenRefused {
            status: 401,
            message: String::new(),
        };
        let unreachable = SendError::Unreachable("connection refused".into());
        for e in [&server, &unreachable] {
            assert!(matches!(verdict(e), Verdict::Keep { .. }), "{e}");
            for retries in 0..RETRIES_WITHOUT_OUTBOX {
                let wait = retry_without_outbox(e, retries).expect("retried");
                let base = Duration::from_secs(1u64 << (retries + 1));
                assert!(
                    wait >= base.mul_f64(0.75) && wait <= base.mul_f64(1.25),
                    "{e} {retries}: {wait:?}"
                );
            }
            assert_eq!(retry_without_outbox(e, RETRIES_WITHOUT_OUTBOX), None, "{e}");
        }
        let limited = SendError::RateLimited {
            retry_after: Some(Duration::from_secs(120)),
        };
        assert_eq!(
            retry_without_outbox(&limited, 0),
            Some(Duration::from_secs(120))
        );
        assert_eq!(verdict(&refused), Verdict::Reject);
        assert_eq!(retry_without_outbox(&refused, 0), None);
        assert!(matches!(
            verdict(&token),
            Verdict::Keep {
                token_refused: true,
                ..
            }
        ));
        assert_eq!(retry_without_outbox(&token, 0), None);
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
