//! The spend ledger: price × running time within the budget period, never going backwards.

use serde::{Deserialize, Serialize};

use super::calendar::Period;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Ledger {
    /// Start of the current budget period (Unix seconds); 0 before the first accrual.
    pub period_start: f64,
    /// USD spent in the current period.
    pub spent: f64,
    /// The time up to which spend has been accrued.
    pub accrued_until: f64,
    /// The last price accrued at, for the forecast and for restarts.
    pub last_price: Option<f64>,
    /// How long the machine had been asleep (suspended or hibernated) since its boot, at the
    /// last accrual: see `sleep`.
    #[serde(default, skip_serializing_if = "crate::is_zero")]
    pub suspended: f64,
    /// The monotonic clock at the last accrual of this run of the daemon (seconds, any
    /// origin): see `ran`. Not saved: after a restart, `running_since` bounds the accrual.
    #[serde(skip)]
    pub monotonic: Option<f64>,
}

/// A budget period that ended, with its total.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Closed {
    pub period_start: f64,
    pub period_end: f64,
    pub total: f64,
}

impl Ledger {
    /// Skips the time the machine slept since the last accrual: a hibernated or suspended
    /// instance is not billed for it, and the same process may wake up days later.
    /// `suspended` is the machine's total time asleep since its boot (`CLOCK_BOOTTIME` less
    /// `CLOCK_MONOTONIC`); after a reboot it starts again from zero, which skips nothing.
    pub fn skip_asleep(&mut self, suspended: f64) {
        let slept = suspended - self.suspended;
        self.suspended = suspended;
        if slept > 0.0 && self.period_start != 0.0 {
            self.accrued_until += slept;
        }
    }

    /// Makes the next accrual the time the monotonic clock counted since the last one, when
    /// the wall clock moved by more than that, or less, give or take a second (the jitter
    /// between the two clocks' reads). A wall clock stepped forward (a bad RTC put right, an
    /// operator's `date -s`) is not time the instance ran, and billing it could exhaust a
    /// budget in one sample; one stepped back is, and the instance runs on while the wall
    /// clock is behind the time already accrued. The monotonic clock leaves out time asleep,
    /// as the ledger does after `skip_asleep`. `None` (a replayed trace, whose timestamps are the
    /// truth) changes nothing.
    pub fn skip_unrun(&mut self, now: f64, monotonic: Option<f64>) {
        let last = std::mem::replace(&mut self.monotonic, monotonic);
        if let (Some(m), Some(l)) = (monotonic, last) {
            let ran = m - l;
            // The two clocks are read one after the other, so their differences disagree by
            // the jitter between the reads: only a step beyond that counts.
            let wall = now - self.accrued_until;
            if self.period_start != 0.0 && ran >= 0.0 && (wall - ran).abs() > 1.0 {
                self.accrued_until = now - ran;
            }
        }
    }

    /// Accrues spend up to `now` at `usd_per_hour`. With no price, time passes unaccrued: the
    /// spend is then unknown, not zero, and budget rules stay inactive.
    ///
    /// `running_since` bounds the accrual from below: after a reboot the instance ran from the
    /// boot, not from the last accrual. Returns the periods that closed on the way.
    pub fn accrue(
        &mut self,
        now: f64,
        usd_per_hour: Option<f64>,
        period: Period,
        running_since: f64,
    ) -> Vec<Closed> {
        let mut closed = Vec::new();
        if self.period_start == 0.0 {
            self.period_start = period.start(now);
            self.accrued_until = now.max(running_since);
        }
        let mut from = self.accrued_until.max(running_since).max(self.period_start);
        if now <= from {
            return closed;
        }
        while period.end(self.period_start) <= now {
            let end = period.end(self.period_start);
            if let Some(p) = usd_per_hour {
                self.spent += p * (end - from).max(0.0) / 3600.0;
            }
            closed.push(Closed {
                period_start: self.period_start,
                period_end: end,
                total: self.spent,
            });
            self.period_start = end;
            self.spent = 0.0;
            from = from.max(end);
        }
        if let Some(p) = usd_per_hour {
            self.spent += p * (now - from).max(0.0) / 3600.0;
            self.last_price = Some(p);
        }
        self.accrued_until = now;
        closed
    }

    /// Spend at the end of the period at the last price; `None` without a price.
    pub fn forecast(&self, now: f64, period: Period) -> Option<f64> {
        let p = self.last_price?;
        Some(
            self.spent
                + p * (period.end(self.period_start.max(period.start(now))) - now).max(0.0)
                    / 3600.0,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::parse_rfc3339;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9 * (1.0 + b.abs())
    }

    #[test]
    fn a_day_at_a_known_price_with_a_restart_in_the_middle() {
        let t0 = parse_rfc3339("2026-11-10T00:00:00Z").unwrap();
        let price = Some(1.5);
        let mut l = Ledger::default();
        for s in (0..=43_200).step_by(10) {
            l.accrue(t0 + s as f64, price, Period::Month, 0.0);
        }
        // A restart: the state round-trips through JSON; the daemon was down for 5 minutes
        // without a reboot, and the instance ran (and was billed) all along.
        let mut l: Ledger = serde_json::from_str(&serde_json::to_string(&l).unwrap()).unwrap();
        for s in (43_500..=86_400).step_by(10) {
            l.accrue(t0 + s as f64, price, Period::Month, 0.0);
        }
        assert!(close(l.spent, 1.5 * 24.0), "{}", l.spent);
        // The same again after a reboot: the instance was stopped from 12:00 to 13:00.
        let mut l = Ledger::default();
        l.accrue(t0, price, Period::Month, 0.0);
        l.accrue(t0 + 43_200.0, price, Period::Month, 0.0);
        let booted = t0 + 46_800.0;
        l.accrue(t0 + 86_400.0, price, Period::Month, booted);
        assert!(close(l.spent, 1.5 * 23.0), "{}", l.spent);
    }

    #[test]
    fn time_asleep_accrues_nothing() {
        // Hibernated for three days at noon; the same process goes on after it wakes.
        let t0 = parse_rfc3339("2026-11-10T00:00:00Z").unwrap();
        let mut l = Ledger::default();
        // $10 an hour, from `t0` on.
        let accrue = |l: &mut Ledger, seconds: f64| {
            l.accrue(t0 + seconds, Some(10.0), Period::Month, 0.0);
        };
        l.skip_asleep(40.0);
        accrue(&mut l, 0.0);
        accrue(&mut l, 43_200.0);
        let asleep = 3.0 * 86_400.0;
        l.skip_asleep(40.0 + asleep);
        accrue(&mut l, 43_200.0 + asleep + 3600.0);
        assert!(close(l.spent, 10.0 * 13.0), "{}", l.spent);
        // After a reboot the count starts from zero again: nothing is skipped.
        l.skip_asleep(0.0);
        accrue(&mut l, 43_200.0 + asleep + 7200.0);
        assert!(close(l.spent, 10.0 * 14.0), "{}", l.spent);
        // It round-trips through the state file.
        let again: Ledger = serde_json::from_str(&serde_json::to_string(&l).unwrap()).unwrap();
        assert_eq!(again, l);
    }

    #[test]
    fn a_wall_clock_stepped_forward_accrues_only_the_time_that_ran() {
        let t0 = parse_rfc3339("2026-11-10T00:00:00Z").unwrap();
        let mut l = Ledger::default();
        // $100 an hour, sampled every 10 s; the monotonic clock starts at 5,000 s.
        let step = |l: &mut Ledger, wall: f64, mono: f64| {
            l.skip_unrun(t0 + wall, Some(5_000.0 + mono));
            l.accrue(t0 + wall, Some(100.0), Period::Month, 0.0)
        };
        for s in (0..=3600).step_by(10) {
            step(&mut l, s as f64, s as f64);
        }
        assert!(close(l.spent, 100.0), "{}", l.spent);
        // The wall clock jumps 30 days ahead, into the next month, between two samples 10 s
        // apart: the 10 s accrue, in the new month, not a month of spend; November closes
        // with what really ran in it.
        let closed = step(&mut l, 3610.0 + 30.0 * 86_400.0, 3610.0);
        assert_eq!(closed.len(), 1);
        assert!(close(closed[0].total, 100.0), "{closed:?}");
        let ten_seconds = 100.0 * 10.0 / 3600.0;
        assert!(close(l.spent, ten_seconds), "{}", l.spent);
        // From there on it accrues as before.
        for s in (3620..=7210).step_by(10) {
            step(&mut l, s as f64 + 30.0 * 86_400.0, s as f64);
        }
        assert!(close(l.spent, 100.0 + ten_seconds), "{}", l.spent);
        // Time asleep is skipped once, not twice: the monotonic clock stops while asleep, and
        // `sleep` moves the accrual past it.
        l.skip_asleep(7200.0);
        step(&mut l, 7220.0 + 30.0 * 86_400.0 + 7200.0, 7220.0);
        assert!(close(l.spent, 100.0 + 2.0 * ten_seconds), "{}", l.spent);
        // The jitter between the two clocks' reads is not a step: all of it accrues.
        let before = l.spent;
        step(&mut l, 7230.3 + 30.0 * 86_400.0 + 7200.0, 7230.0);
        let accrued = l.spent - before;
        assert!((accrued - 100.0 * 10.3 / 3600.0).abs() < 1e-6, "{accrued}");
        // Without a monotonic reading (a replayed trace) nothing is bounded.
        let mut trace = Ledger::default();
        for wall in [0.0, 3600.0, 7200.0] {
            trace.skip_unrun(t0 + wall, None);
            trace.accrue(t0 + wall, Some(100.0), Period::Month, 0.0);
        }
        assert!(close(trace.spent, 200.0), "{}", trace.spent);
    }

    #[test]
    fn a_wall_clock_stepped_back_accrues_the_time_that_ran() {
        let t0 = parse_rfc3339("2026-11-10T00:00:00Z").unwrap();
        let mut l = Ledger::default();
        // $100 an hour, sampled every 10 s; the monotonic clock starts at 5,000 s.
        let step = |l: &mut Ledger, wall: f64, mono: f64| {
            l.skip_unrun(t0 + wall, Some(5_000.0 + mono));
            l.accrue(t0 + wall, Some(100.0), Period::Month, 0.0)
        };
        for s in (0..=3600).step_by(10) {
            step(&mut l, s as f64, s as f64);
        }
        assert!(close(l.spent, 100.0), "{}", l.spent);
        // The wall clock steps an hour back (a clock set ahead, put right) between two samples
        // 10 s apart, and the instance runs another hour: it is billed, though every sample of
        // it is timed before the time already accrued.
        for s in (3610..=7200).step_by(10) {
            step(&mut l, s as f64 - 3600.0, s as f64);
        }
        assert!(close(l.spent, 200.0), "{}", l.spent);
        // A step back over the start of a period accrues nothing in the closed period: the new
        // one goes on from where the wall clock is in it.
        let t1 = parse_rfc3339("2026-12-01T00:00:00Z").unwrap();
        let mut l = Ledger::default();
        let step = |l: &mut Ledger, wall: f64, mono: f64| {
            l.skip_unrun(t1 + wall, Some(5_000.0 + mono));
            l.accrue(t1 + wall, Some(100.0), Period::Month, 0.0)
        };
        step(&mut l, -20.0, 0.0);
        let closed = step(&mut l, 30.0, 50.0);
        assert_eq!(closed.len(), 1);
        assert!(close(closed[0].total, 100.0 * 20.0 / 3600.0), "{closed:?}");
        assert!(close(l.spent, 100.0 * 30.0 / 3600.0), "{}", l.spent);
        assert!(step(&mut l, -10.0, 60.0).is_empty());
        assert!(close(l.spent, 100.0 * 30.0 / 3600.0), "{}", l.spent);
        step(&mut l, 10.0, 80.0);
        assert!(close(l.spent, 100.0 * 40.0 / 3600.0), "{}", l.spent);
    }

    #[test]
    fn month_rollover_closes_the_period() {
        let t0 = parse_rfc3339("2026-11-30T23:00:00Z").unwrap();
        let mut l = Ledger::default();
        l.accrue(t0, Some(2.0), Period::Month, 0.0);
        let closed = l.accrue(t0 + 7200.0, Some(2.0), Period::Month, 0.0);
        assert_eq!(closed.len(), 1);
        assert!(close(closed[0].total, 2.0));
        assert_eq!(
            crate::time::rfc3339(closed[0].period_end),
            "2026-12-01T00:00:00Z"
        );
        assert!(close(l.spent, 2.0));
        assert_eq!(crate::time::rfc3339(l.period_start), "2026-12-01T00:00:00Z");
    }

    #[test]
    fn unknown_price_accrues_nothing_and_time_never_runs_backwards() {
        let t0 = parse_rfc3339("2026-11-10T00:00:00Z").unwrap();
        let mut l = Ledger::default();
        l.accrue(t0, None, Period::Day, 0.0);
        l.accrue(t0 + 3600.0, None, Period::Day, 0.0);
        assert_eq!(l.spent, 0.0);
        assert_eq!(l.forecast(t0 + 3600.0, Period::Day), None);
        l.accrue(t0 + 7200.0, Some(1.0), Period::Day, 0.0);
        assert!(close(l.spent, 1.0));
        l.accrue(t0 + 3600.0, Some(1.0), Period::Day, 0.0); // a clock step back
        assert!(close(l.spent, 1.0));
        let f = l.forecast(t0 + 7200.0, Period::Day).unwrap();
        assert!(close(f, 1.0 + 22.0));
    }
}
