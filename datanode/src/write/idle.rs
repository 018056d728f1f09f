//! The idle-flush timer of a buffered replica writer (`write.buffer.idle.flush.timeout.ms`),
//! as plain logic taking `now`: the [`super::writer_actor::ReplicaWriter`] actor arms one timer and
//! does what [`IdleFlush::on_timer`] decides.
//!
//! A packet arms the timer (if it is not armed) for the timeout. When it fires, the writer has
//! been silent for the timeout only if no packet came since; otherwise it re-arms for the rest
//! of the timeout after the last packet — so writes spaced just below the timeout, then a
//! stall, still end in a flush (upstream's timer once forgot to re-arm after such no-op
//! ticks). A silent writer with something pending is flushed; one with nothing pending costs
//! nothing more: the timer stays disarmed until the next packet.

use std::time::{Duration, Instant};

/// What to do when the timer fires.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdleAction {
    /// Silent for the timeout with bytes pending: flush them.
    Flush,
    /// A packet came since: fire again after this long.
    Rearm(Duration),
    /// Silent with nothing pending: stay disarmed until the next packet.
    Sleep,
}

/// The idle-flush timer's state.
#[derive(Clone, Debug)]
pub struct IdleFlush {
    timeout: Duration,
    last_packet: Option<Instant>,
    armed: bool,
}

impl IdleFlush {
    /// A timer for `timeout`; `None` when the timeout is zero (idle flush off).
    pub fn new(timeout: Duration) -> Option<IdleFlush> {
        (!timeout.is_zero()).then_some(IdleFlush {
            timeout,
            last_packet: None,
            armed: false,
        })
    }

    /// True while a timer is armed.
    #[cfg(test)]
    pub fn is_armed(&self) -> bool {
        self.armed
    }

    /// A packet arrived at `now`: returns the delay to arm the timer with, if it is not armed.
    pub fn on_packet(&mut self, now: Instant) -> Option<Duration> {
        self.last_packet = Some(now);
        if self.armed {
            return None;
        }
        self.armed = true;
        Some(self.timeout)
    }

    /// The timer fired at `now`; `pending`: the sink holds bytes not yet flushed.
    pub fn on_timer(&mut self, now: Instant, pending: bool) -> IdleAction {
        let silent = self
            .last_packet
            .map_or(self.timeout, |t| now.saturating_duration_since(t));
        if silent < self.timeout {
            return IdleAction::Rearm(self.timeout - silent);
        }
        self.armed = false;
        if pending {
            IdleAction::Flush
        } else {
            IdleAction::Sleep
        }
    }

    /// The timer was cancelled (the writer ended).
    pub fn disarm(&mut self) {
        self.armed = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn zero_timeout_is_off() {
        assert!(IdleFlush::new(Duration::ZERO).is_none());
    }

    #[test]
    fn a_silent_writer_is_flushed_when_the_timeout_has_passed() {
        let t0 = Instant::now();
        let mut f = IdleFlush::new(S).unwrap();
        assert_eq!(f.on_packet(t0), Some(S), "the first packet arms");
        assert_eq!(f.on_packet(t0 + S / 10), None, "already armed");
        // Fires one timeout after the first packet: a packet came 0.9 s ago.
        assert_eq!(
            f.on_timer(t0 + S, true),
            IdleAction::Rearm(S / 10),
            "re-armed for the rest"
        );
        assert_eq!(f.on_timer(t0 + S + S / 10, true), IdleAction::Flush);
        assert!(!f.is_armed());
        assert_eq!(
            f.on_packet(t0 + 3 * S),
            Some(S),
            "the next packet arms again"
        );
    }

    #[test]
    fn keeps_re_arming_while_writes_come_just_below_the_timeout_then_flushes_the_stall() {
        let t0 = Instant::now();
        let mut f = IdleFlush::new(S).unwrap();
        let half = S / 2;
        let mut fire_at = t0 + f.on_packet(t0).unwrap();
        let mut flushes = 0;
        // Six writes 0.5 s apart (as upstream's test), then silence.
        let writes: Vec<Instant> = (1..6).map(|i| t0 + half * i).collect();
        let mut next_write = 0;
        for _ in 0..20 {
            while next_write < writes.len() && writes[next_write] < fire_at {
                assert_eq!(f.on_packet(writes[next_write]), None);
                next_write += 1;
            }
            match f.on_timer(fire_at, true) {
                IdleAction::Rearm(d) => fire_at += d,
                IdleAction::Flush => {
                    flushes += 1;
                    break;
                }
                IdleAction::Sleep => panic!("pending bytes are never left asleep"),
            }
        }
        assert_eq!(next_write, writes.len(), "every write came first");
        assert_eq!(flushes, 1, "the stall is flushed");
        assert_eq!(
            fire_at,
            writes[4] + S,
            "exactly one timeout after the last write"
        );
    }

    #[test]
    fn nothing_pending_costs_nothing() {
        let t0 = Instant::now();
        let mut f = IdleFlush::new(S).unwrap();
        f.on_packet(t0);
        assert_eq!(f.on_timer(t0 + S, false), IdleAction::Sleep);
        assert!(!f.is_armed(), "no timer left running for an idle replica");
    }
}
