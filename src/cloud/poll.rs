//! The one loop every price, budget and lifecycle poller of every cloud runs: read, hand over
//! what it learnt, wait; after a read that fails, wait less (backing off, twice as long each
//! time up to a most) and say so once per failing spell, and once more when it answers again.

use std::future::Future;
use std::time::Duration;

/// How a poller paces its reads.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pace {
    /// Between reads that answer.
    pub every: Duration,
    /// After the first read that fails; twice as long after each failure in a row, up to `most`.
    pub retry: Duration,
    pub most: Duration,
}

impl Pace {
    /// A read needed until it answers once: tried again after a second, twice as long each
    /// time, up to `most`.
    pub const fn until_answered(most: Duration) -> Pace {
        Pace {
            every: Duration::ZERO,
            retry: Duration::from_secs(1),
            most,
        }
    }

    /// The same wait after a failure as after an answer.
    pub const fn steady(every: Duration) -> Pace {
        Pace {
            every,
            retry: every,
            most: every,
        }
    }
}

/// A cloud budget's pace: its `poll_interval`, and after a failure twice that, doubling up to
/// an hour.
pub fn budget_pace(budget: &crate::config::BudgetConfig) -> Pace {
    Pace {
        every: budget.poll_interval,
        retry: budget.poll_interval * 2,
        most: Duration::from_secs(3600).max(budget.poll_interval),
    }
}

/// What one read came to.
#[derive(Debug, Clone, PartialEq)]
pub enum Read {
    /// An answer, handed over: read again after `every`.
    Again,
    /// The last read this poller needs.
    Done,
    /// No answer, and why.
    Failed(String),
}

/// What a poller says, for people: `failing` (with the reason) once when a failing spell begins,
/// `recovered` once when it ends.
pub struct Said {
    pub failing: &'static str,
    pub recovered: Option<&'static str>,
}

/// Runs `read` at `pace` until it says [`Read::Done`], saying what `said` gives; `what` names
/// the poller in each line (a budget's name, an instance type).
pub async fn poll<F, R>(pace: Pace, said: Said, what: &str, mut read: F)
where
    F: FnMut() -> R,
    R: Future<Output = Read>,
{
    let mut wait = pace.retry;
    let mut failing = false;
    loop {
        let next = match read().await {
            Read::Done => return,
            Read::Again => {
                if std::mem::take(&mut failing) {
                    if let Some(line) = said.recovered {
                        tracing::info!(what, "{line}");
                    }
                }
                wait = pace.retry;
                pace.every
            }
            Read::Failed(reason) => {
                if !std::mem::replace(&mut failing, true) {
                    tracing::warn!(what, reason = %reason, "{}", said.failing);
                }
                let now = wait;
                wait = (wait * 2).min(pace.most);
                now.min(pace.most)
            }
        };
        tokio::time::sleep(next).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::time::Instant;

    /// A read that answers is read again after `every`; one that fails sooner, twice as long
    /// each time up to `most`, then at `every` again once it answers; `Done` ends the poller.
    #[tokio::test]
    async fn reads_are_paced_and_failures_back_off() {
        let ms = Duration::from_millis;
        let pace = Pace {
            every: ms(40),
            retry: ms(5),
            most: ms(10),
        };
        let script = [
            Read::Again,
            Read::Failed("a".into()),
            Read::Failed("b".into()),
            Read::Failed("c".into()),
            Read::Again,
            Read::Done,
        ];
        let times = Mutex::new(Vec::new());
        let said = Said {
            failing: "failing",
            recovered: Some("answers again"),
        };
        poll(pace, said, "test", || async {
            let mut t = times.lock().unwrap();
            t.push(Instant::now());
            script[t.len() - 1].clone()
        })
        .await;
        let times = times.into_inner().unwrap();
        assert_eq!(times.len(), script.len());
        let gaps: Vec<Duration> = times.windows(2).map(|w| w[1] - w[0]).collect();
        // Never sooner than the pace says (a busy machine may be later).
        for (gap, least) in gaps.iter().zip([ms(40), ms(5), ms(10), ms(10), ms(40)]) {
            assert!(*gap >= least, "{gaps:?}");
        }
        // After the failing spell the waits start over at `retry`.
        assert!(gaps[1] < ms(40), "{gaps:?}");
    }
}
