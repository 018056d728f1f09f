//! The heartbeat loop's timing decisions, as a plain struct that takes `now` (no runtime):
//! when the next heartbeat and full block report are due, and the reconnect backoff.

use std::time::{Duration, Instant};

/// What the loop should do next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Due {
    /// Send a full block report now.
    BlockReport,
    /// Send a heartbeat now.
    Heartbeat,
    /// Nothing until this instant (or an incremental report arrives).
    WaitUntil(Instant),
}

/// Heartbeat and block-report timers of one registration.
#[derive(Clone, Debug)]
pub struct Schedule {
    heartbeat: Duration,
    report: Duration,
    next_heartbeat: Instant,
    next_report: Instant,
}

impl Schedule {
    /// Just registered at `now`: a full report is due at once, a heartbeat one interval later.
    pub fn registered(now: Instant, heartbeat: Duration, report: Duration) -> Self {
        Schedule {
            heartbeat,
            report,
            next_heartbeat: now + heartbeat,
            next_report: now,
        }
    }

    /// The next thing due at `now` (block reports first).
    pub fn due(&self, now: Instant) -> Due {
        if now >= self.next_report {
            Due::BlockReport
        } else if now >= self.next_heartbeat {
            Due::Heartbeat
        } else {
            Due::WaitUntil(self.next_heartbeat.min(self.next_report))
        }
    }

    /// A heartbeat went out at `now`.
    pub fn heartbeat_sent(&mut self, now: Instant) {
        self.next_heartbeat = now + self.heartbeat;
    }

    /// A full report went out at `now`.
    pub fn report_sent(&mut self, now: Instant) {
        self.next_report = now + self.report;
    }
}

/// Exponential backoff between reconnect attempts.
#[derive(Clone, Debug)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    current: Duration,
}

impl Backoff {
    /// From `min` doubling up to `max`.
    pub fn new(min: Duration, max: Duration) -> Self {
        Backoff {
            min,
            max,
            current: min,
        }
    }

    /// The next delay.
    pub fn next_delay(&mut self) -> Duration {
        let d = self.current;
        self.current = (self.current * 2).min(self.max);
        d
    }

    /// Back to the minimum (after a success).
    pub fn reset(&mut self) {
        self.current = self.min;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_first_then_heartbeats_on_their_interval() {
        let t0 = Instant::now();
        let (hb, rep) = (Duration::from_secs(3), Duration::from_secs(60));
        let mut s = Schedule::registered(t0, hb, rep);
        assert_eq!(s.due(t0), Due::BlockReport);
        s.report_sent(t0);
        assert_eq!(s.due(t0), Due::WaitUntil(t0 + hb));
        assert_eq!(s.due(t0 + hb), Due::Heartbeat);
        s.heartbeat_sent(t0 + hb);
        assert_eq!(s.due(t0 + rep), Due::BlockReport);
    }

    #[test]
    fn backoff_doubles_to_its_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(350));
        let got: Vec<_> = (0..4).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(got, vec![100, 200, 350, 350]);
        b.reset();
        assert_eq!(b.next_delay().as_millis(), 100);
    }
}
