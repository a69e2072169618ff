//! Fencing by lease (docs/protocol/02-agent.md, "Fencing"): a controller that has not heard from this
//! agent for its node timeout requeues the agent's requeueable jobs elsewhere. So that the
//! two copies never overlap, the agent holds a lease, renewed by the controller's answer to
//! each heartbeat, counted from when that heartbeat was *sent*, and shorter than the node
//! timeout by a margin: when it runs out, the agent kills the jobs marked `fence` itself,
//! before the controller can requeue them.
//!
//! A controller known not to run (its port refuses connections: killed, restarting) requeues
//! nothing, and a restarted one gives every node a full timeout from its start: while
//! connections are refused the lease waits, and counts again from the last refusal.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Heartbeats remembered for their renewals (a renewal older than these is of no use).
const SENT_KEPT: usize = 64;

#[derive(Debug)]
pub struct LeaseState {
    /// The lease the controller granted; None: no fencing (not granted, or not yet).
    lease: Option<Duration>,
    /// When the latest renewed heartbeat was sent (or the registration).
    renewed: Instant,
    /// The last connection attempt was refused: the controller is not running.
    refused: bool,
    refused_at: Option<Instant>,
    /// The fenced jobs were killed in this outage.
    fenced: bool,
    sent: VecDeque<(u64, Instant)>,
    next_seq: u64,
}

impl LeaseState {
    pub fn new(now: Instant) -> Self {
        LeaseState {
            lease: None,
            renewed: now,
            refused: false,
            refused_at: None,
            fenced: false,
            sent: VecDeque::new(),
            next_seq: 1,
        }
    }

    /// An agent restarted: the lease its predecessor held (`lease.json`, see
    /// [`LeaseState::held`]), last renewed `renewed_ago` before `now`. The re-adopted fenced
    /// jobs are killed when it runs out, as the predecessor would have: a restart while cut
    /// off from the controller does not make them outlive it (the controller requeues them).
    pub fn restored(now: Instant, lease: Duration, renewed_ago: Duration) -> Self {
        let mut l = LeaseState::new(now);
        l.lease = Some(lease);
        // Long ago (beyond what Instant can hold here): run out at once.
        l.renewed = now.checked_sub(renewed_ago).unwrap_or_else(|| now.checked_sub(lease).unwrap_or(now));
        l
    }

    /// The lease and when it was last renewed, to be kept across an agent restart.
    pub fn held(&self) -> Option<(Duration, Instant)> {
        self.lease.map(|l| (l, self.renewed))
    }

    /// Registered: the registration sent at `sent_at` was accepted with `lease`.
    pub fn registered(&mut self, lease: Option<Duration>, sent_at: Instant) {
        self.lease = lease;
        self.renewed = self.renewed.max(sent_at);
        self.refused = false;
        self.fenced = false;
        self.sent.clear();
    }

    /// A heartbeat is sent now: its number.
    pub fn heartbeat(&mut self, now: Instant) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        if self.sent.len() == SENT_KEPT {
            self.sent.pop_front();
        }
        self.sent.push_back((seq, now));
        seq
    }

    /// The controller renewed the lease as of heartbeat `seq`.
    pub fn renew(&mut self, seq: u64) {
        if let Some(&(_, at)) = self.sent.iter().find(|(s, _)| *s == seq) {
            self.renewed = self.renewed.max(at);
            self.sent.retain(|(s, _)| *s > seq);
        }
    }

    /// A connection attempt starts: until it is refused, the lease counts.
    pub fn connecting(&mut self) {
        self.refused = false;
    }

    /// The controller's port refused the connection at `now`.
    pub fn refused(&mut self, now: Instant) {
        self.refused = true;
        self.refused_at = Some(now);
    }

    /// When the fenced jobs must be killed; None while there is no lease or the controller
    /// is known not to run.
    pub fn deadline(&self) -> Option<Instant> {
        let lease = self.lease?;
        if self.refused {
            return None;
        }
        let base = self.refused_at.map_or(self.renewed, |r| r.max(self.renewed));
        base.checked_add(lease)
    }

    /// The lease ran out at `now` (once per outage): the lease, to say so.
    pub fn expired(&mut self, now: Instant) -> Option<Duration> {
        if self.fenced || self.deadline().is_none_or(|d| now < d) {
            return None;
        }
        self.fenced = true;
        self.lease
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn the_lease_counts_from_the_renewed_heartbeats_sending_and_runs_out_once() {
        let t0 = Instant::now();
        let mut l = LeaseState::new(t0);
        assert_eq!(l.expired(t0 + secs(100.0)), None, "no lease granted: no fencing");
        l.registered(Some(secs(2.0)), t0);
        let a = l.heartbeat(t0 + secs(1.0));
        let b = l.heartbeat(t0 + secs(2.0));
        // The renewal of `a` arrives late (at 2.9 s): it counts from 1 s, when `a` was sent.
        l.renew(a);
        assert_eq!(l.deadline(), Some(t0 + secs(3.0)));
        l.renew(b);
        assert_eq!(l.deadline(), Some(t0 + secs(4.0)));
        l.renew(a); // an old renewal never moves it back
        assert_eq!(l.deadline(), Some(t0 + secs(4.0)));
        l.renew(99); // nor one of a heartbeat never sent
        assert_eq!(l.expired(t0 + secs(3.9)), None);
        assert_eq!(l.expired(t0 + secs(4.0)), Some(secs(2.0)));
        assert_eq!(l.expired(t0 + secs(5.0)), None, "once per outage");
        l.registered(Some(secs(2.0)), t0 + secs(6.0));
        assert_eq!(l.deadline(), Some(t0 + secs(8.0)), "a new registration renews and re-arms");
    }

    #[test]
    fn a_restarted_agent_keeps_its_predecessors_lease() {
        let t0 = Instant::now();
        // Renewed 1.5 s before the restart, with a 2 s lease: it runs out 0.5 s after it.
        let mut l = LeaseState::restored(t0, secs(2.0), secs(1.5));
        assert_eq!(l.deadline(), Some(t0 + secs(0.5)));
        assert_eq!(l.held(), Some((secs(2.0), t0 - secs(1.5))));
        assert_eq!(l.expired(t0 + secs(0.4)), None);
        assert_eq!(l.expired(t0 + secs(0.5)), Some(secs(2.0)));
        // Renewed beyond anything an Instant holds: out at once.
        let mut l = LeaseState::restored(t0, secs(2.0), Duration::MAX);
        assert!(l.expired(t0).is_some());
        // A registration in time renews it as usual.
        let mut l = LeaseState::restored(t0, secs(2.0), secs(1.0));
        l.registered(Some(secs(2.0)), t0 + secs(0.5));
        assert_eq!(l.deadline(), Some(t0 + secs(2.5)));
    }

    #[test]
    fn a_refusing_controller_holds_the_lease_which_counts_again_from_the_last_refusal() {
        let t0 = Instant::now();
        let mut l = LeaseState::new(t0);
        l.registered(Some(secs(2.0)), t0);
        l.connecting();
        l.refused(t0 + secs(1.5));
        assert_eq!(l.expired(t0 + secs(60.0)), None, "the controller is down: nobody requeues");
        l.connecting();
        l.refused(t0 + secs(61.0));
        l.connecting(); // this attempt hangs (a cut link)
        assert_eq!(l.deadline(), Some(t0 + secs(63.0)));
        assert_eq!(l.expired(t0 + secs(62.0)), None);
        assert!(l.expired(t0 + secs(63.0)).is_some());
    }
}
