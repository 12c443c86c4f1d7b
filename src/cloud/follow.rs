//! Following an operation a cloud's call started, until it ends: the one loop that Resource
//! Manager's asynchronous operations, Compute Engine's zone operations and ECS's instance
//! status share. It looks, waits what the cloud asks (`Retry-After`, within a second and a
//! minute) or its own pace, backs off while looks fail, and gives up at its deadline
//! ([`FOLLOW_FOR`](super::FOLLOW_FOR) after the call), saying the outcome is unknown: it never
//! guesses one.

use std::future::Future;
use std::time::{Duration, Instant};

use super::CloudError;

/// One look at an operation.
#[derive(Debug)]
pub enum Look<T> {
    /// It ended: its outcome.
    Ended(Result<T, CloudError>),
    /// It runs; the cloud may say when to look again.
    Running(Option<Duration>),
    /// The look failed in a way worth another (throttled, an outage): the cloud's wait, if it
    /// gave one, and why.
    Again(Option<Duration>, String),
}

/// How a follow paces its looks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pace {
    /// Before the first look.
    pub first: Duration,
    /// Between looks while the operation runs and the cloud says nothing.
    pub every: Duration,
    /// The longest wait while looks fail (twice as long after each failure in a row).
    pub most: Duration,
}

/// The shortest and longest wait a cloud's `Retry-After` is taken for.
const ASKED: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(60));

/// The wait before the next look, after `failures` failed looks in a row (0 while it runs):
/// what the cloud `asked` where it said (within a second and a minute); else `every`, and
/// twice as long after each failure, up to `most`.
pub fn next_wait(pace: Pace, failures: u32, asked: Option<Duration>) -> Duration {
    match (asked, failures) {
        (Some(a), _) => a.clamp(ASKED.0, ASKED.1),
        (None, 0) => pace.every,
        (None, f) => (pace.every * 2u32.saturating_pow(f.min(9) - 1)).min(pace.most),
    }
}

/// Follows an operation until `look` says it ended, or until `deadline` (which a follow in two
/// phases shares); past it, the error `unknown` makes from the last thing seen ("running", or
/// "unread" and why).
pub async fn follow<T, F, R>(
    deadline: Instant,
    pace: Pace,
    unknown: impl Fn(&str) -> CloudError,
    mut look: F,
) -> Result<T, CloudError>
where
    F: FnMut() -> R,
    R: Future<Output = Look<T>>,
{
    let mut wait = pace.first;
    let mut failures = 0u32;
    let mut last = String::from("unread");
    loop {
        if Instant::now() + wait > deadline {
            return Err(unknown(&last));
        }
        tokio::time::sleep(wait).await;
        wait = match look().await {
            Look::Ended(outcome) => return outcome,
            Look::Running(asked) => {
                failures = 0;
                last = "running".into();
                next_wait(pace, 0, asked)
            }
            Look::Again(asked, why) => {
                if failures == 0 {
                    tracing::warn!(reason = %why, "cannot read the operation's status; reading it again");
                }
                failures += 1;
                last = format!("unread ({why})");
                next_wait(pace, failures, asked)
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloud::ErrorKind;

    const PACE: Pace = Pace {
        first: Duration::from_secs(2),
        every: Duration::from_secs(2),
        most: Duration::from_secs(30),
    };

    #[test]
    fn looks_are_paced_by_retry_after_or_a_doubling_wait() {
        let s = Duration::from_secs;
        assert_eq!(next_wait(PACE, 0, None), s(2));
        assert_eq!(next_wait(PACE, 1, None), s(2));
        assert_eq!(next_wait(PACE, 2, None), s(4));
        assert_eq!(next_wait(PACE, 3, None), s(8));
        assert_eq!(next_wait(PACE, 40, None), s(30));
        assert_eq!(next_wait(PACE, 0, Some(s(20))), s(20));
        assert_eq!(next_wait(PACE, 1, Some(s(20))), s(20));
        assert_eq!(next_wait(PACE, 1, Some(Duration::ZERO)), s(1));
        assert_eq!(next_wait(PACE, 1, Some(s(3600))), s(60));
    }

    fn unknown(last: &str) -> CloudError {
        CloudError {
            operation: "Stop",
            kind: ErrorKind::Other,
            message: format!("still {last}: its outcome is unknown"),
            request_id: None,
            retry_after: None,
        }
    }

    const FAST: Pace = Pace {
        first: Duration::ZERO,
        every: Duration::from_millis(5),
        most: Duration::from_millis(20),
    };

    /// Looks go on through a running operation and failed reads until one says it ended.
    #[tokio::test]
    async fn an_operation_is_followed_through_failed_reads_to_its_end() {
        let looks = std::sync::atomic::AtomicU32::new(0);
        let deadline = Instant::now() + Duration::from_secs(60);
        let got = follow(deadline, FAST, unknown, || async {
            let n = looks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            match n {
                0 | 1 => Look::Running(None),
                2 | 3 => Look::Again(None, "throttled".into()),
                _ => Look::Ended(Ok(n)),
            }
        })
        .await;
        assert_eq!(got.unwrap(), 4);
    }

    /// At the deadline the outcome is unknown, saying what was last seen; an operation that
    /// ends in an error is that error.
    #[tokio::test]
    async fn past_its_deadline_an_operation_s_outcome_is_unknown() {
        let soon = || Instant::now() + Duration::from_millis(50);
        let running = follow::<(), _, _>(soon(), FAST, unknown, || async { Look::Running(None) });
        assert_eq!(
            running.await.unwrap_err().message,
            "still running: its outcome is unknown"
        );
        let unread = follow::<(), _, _>(soon(), FAST, unknown, || async {
            Look::Again(None, "a 503".into())
        });
        assert_eq!(
            unread.await.unwrap_err().message,
            "still unread (a 503): its outcome is unknown"
        );
        let failed = follow::<(), _, _>(soon(), FAST, unknown, || async {
            Look::Ended(Err(unknown("failed")))
        });
        assert_eq!(
            failed.await.unwrap_err().message,
            "still failed: its outcome is unknown"
        );
    }
}
