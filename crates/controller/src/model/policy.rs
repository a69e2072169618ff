//! What the scheduling pass keeps between passes (`PolicyState`, a field of `Controller`):
//! fair-share usage and how far running jobs are charged, what the last pass decided about
//! each job it examined (shown by `berth jobs` and `berth show`), the plan conservative
//! backfill keeps, the array tails it left out, and the advance reservations' book and the
//! dependency feature's state. The features (`impl Controller` in `policy`, `views`,
//! `advance`, `depend`, `update`, ...) change it through the named methods below.

use crate::model::advance::AdvanceBook;
use crate::model::depend::DependState;
use crate::model::effect::Effect;
use berth_core::sched::backfill::KeptPlan;
use berth_core::sched::fairshare::FairShare;
use berth_core::sched::priority::Priority;
use berth_core::sched::round::book_charges;
use berth_core::sched::{ClusterState, PendingReason};
use berth_core::JobId;
use std::collections::HashMap;

/// What the last pass decided and measured, for `berth jobs` and `berth share`.
#[derive(Debug, Default)]
pub struct PolicyState {
    fair_share: FairShare,
    /// Running jobs are charged up to this time.
    charged_until: f64,
    priorities: HashMap<JobId, Priority>,
    expected_start: HashMap<JobId, f64>,
    /// Why each job the last pass examined waits (shown unless a dependency's or an advance
    /// reservation's reason stands before it).
    pending_reasons: HashMap<JobId, PendingReason>,
    /// What the last pass counted (tests check it).
    #[cfg(test)]
    last_pass: PassStats,
    /// Advance reservations (see `advance`).
    advance: AdvanceBook,
    /// Reasons shown instead of the pass's for jobs of advance reservations (waiting for the
    /// window, or for a reservation they can no longer use).
    advance_reasons: HashMap<JobId, PendingReason>,
    /// Jobs waiting for their dependency or begin time (see `depend`).
    depend: DependState,
    /// The last conservative pass's plan, reused by the next where nothing changed.
    kept_plan: Option<KeptPlan<ClusterState>>,
    /// The last pass's array tails: tasks left out of its round, each shown as the task of
    /// its array examined last (`policy::gather`), in id order.
    tails: Vec<ArrayTail>,
    /// Tests: every task goes to the round (to compare with the tails left out).
    #[cfg(test)]
    whole_arrays: bool,
}

/// Pending tasks of an array that a pass left out of its round (`policy::gather`): they are
/// identical to the task examined last before them (`shown_as`) and come right after it in
/// the round's order, so the round would have decided for each what it decided for that one
/// (no start, no reservation) and told the same reason, priority and expected start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArrayTail {
    /// The first and last task left out (every pending task between them that went to no
    /// other pass step belongs to the tail: they were consecutive among the pass's jobs).
    pub first: JobId,
    pub last: JobId,
    /// The task whose decision stands for them.
    pub shown_as: JobId,
    /// How many tasks were left out.
    pub count: usize,
}

#[cfg(test)]
#[derive(Debug, Default, Clone, Copy)]
pub struct PassStats {
    pub pending: usize,
    pub backfilled: usize,
    /// Reservations kept from the pass before (conservative backfill).
    pub kept_reservations: usize,
}

/// A job the pass left waiting, as users are shown it.
#[derive(Debug, Clone, PartialEq)]
pub struct Waited {
    pub id: JobId,
    /// Why the pass left it waiting.
    pub reason: PendingReason,
    pub expected_start: Option<f64>,
    /// For a member of an advance reservation waiting for resources: that it waits for the
    /// window (shown instead of `reason`).
    pub window: Option<PendingReason>,
}

/// What users are shown of a pending job's last pass decision (`berth jobs`, `berth show`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Shown<'a> {
    pub reason: Option<&'a PendingReason>,
    pub priority: Option<&'a Priority>,
    pub expected_start: Option<f64>,
}

impl PolicyState {
    /// Fair-share usage as saved: running jobs were charged up to its time (from their start
    /// if never).
    pub fn restore_usage(&mut self, share: FairShare) {
        self.charged_until = share.as_of;
        self.fair_share = share;
    }

    /// Fair-share usage and its configuration.
    pub fn fair_share(&self) -> &FairShare {
        &self.fair_share
    }

    /// Tests: change the fair-share configuration or usage.
    #[cfg(test)]
    pub fn fair_share_mut(&mut self) -> &mut FairShare {
        &mut self.fair_share
    }

    /// Running jobs are charged up to this time.
    pub fn charged_until(&self) -> f64 {
        self.charged_until
    }

    /// Book `charged` (billed CPU-seconds per account, from berth-core's `charges` since
    /// [`Self::charged_until`]) at `now`: usage decays to `now`, the charges are added, and
    /// running jobs are charged until `now`. Nothing when charged until `now` already (a second
    /// pass in the same batch). The usage to write when there were charges.
    pub fn charge(&mut self, charged: &[(String, f64)], now: f64) -> Vec<Effect> {
        if now <= self.charged_until {
            return vec![];
        }
        book_charges(&mut self.fair_share, charged, now);
        self.charged_until = now;
        if charged.is_empty() {
            return vec![];
        }
        vec![Effect::SaveFairShare(Box::new(self.fair_share.clone()))]
    }

    /// The advance reservations.
    pub fn advance(&self) -> &AdvanceBook {
        &self.advance
    }

    pub fn advance_mut(&mut self) -> &mut AdvanceBook {
        &mut self.advance
    }

    /// The dependency feature's state.
    pub fn depend(&self) -> &DependState {
        &self.depend
    }

    pub fn depend_mut(&mut self) -> &mut DependState {
        &mut self.depend
    }

    /// What a pass's round reads and keeps here: fair-share usage, the time running jobs are
    /// charged until, and the plan the last conservative pass kept (for the round to reuse and
    /// replace).
    pub fn for_round(&mut self) -> (&FairShare, f64, &mut Option<KeptPlan<ClusterState>>) {
        (&self.fair_share, self.charged_until, &mut self.kept_plan)
    }

    /// A pass's outcome, replacing the last's: the priorities it computed, the jobs it left
    /// waiting (in its order), those shut out of the advance reservation they ask for (with
    /// why: shown as their reason), and the array tails it left out of its round.
    pub fn record_pass(
        &mut self,
        priorities: Vec<(JobId, Priority)>,
        waiting: Vec<Waited>,
        shut_out: HashMap<JobId, PendingReason>,
        tails: Vec<ArrayTail>,
    ) {
        self.priorities = priorities.into_iter().collect();
        self.advance_reasons.clear();
        self.pending_reasons.clear();
        self.expected_start.clear();
        for w in waiting {
            self.waits(w);
        }
        for (id, why) in shut_out {
            self.pending_reasons.insert(id, why.clone());
            self.advance_reasons.insert(id, why);
        }
        self.tails = tails;
    }

    /// One more job the pass left waiting (a preemption that did not happen as decided).
    pub fn waits(&mut self, w: Waited) {
        if let Some(t) = w.expected_start {
            self.expected_start.insert(w.id, t);
        }
        if let Some(why) = w.window {
            self.advance_reasons.insert(w.id, why);
        }
        self.pending_reasons.insert(w.id, w.reason);
    }

    /// Job `job` left memory: the pass's reason for it is dropped (its priority, expected
    /// start and advance reservation's reason stay until the next pass).
    pub fn forget(&mut self, job: JobId) {
        self.pending_reasons.remove(&job);
    }

    /// The job whose pass decision job `id` shows: its own, or for a task of an array tail the
    /// last pass left out of its round (that has no reason of its own), the task that stood
    /// for it.
    pub fn shown_as(&self, id: JobId) -> JobId {
        let tails = &self.tails;
        let k = tails.partition_point(|t| t.last < id);
        match tails.get(k) {
            Some(t) if t.first <= id && !self.pending_reasons.contains_key(&id) => t.shown_as,
            _ => id,
        }
    }

    /// What pending job `job` is shown of the last pass: the reason its dependency or begin
    /// time holds it out for, else its advance reservation's, else the pass's; with the
    /// priority and expected start the pass gave it. A task of an array tail not held out by
    /// its dependency shows the decision of the task that stood for it ([`Self::shown_as`]).
    pub fn shown(&self, job: JobId) -> Shown<'_> {
        let held = self.depend.reason(job);
        let id = if held.is_some() { job } else { self.shown_as(job) };
        let reason = held.or_else(|| self.advance_reasons.get(&id)).or_else(|| self.pending_reasons.get(&id));
        Shown { reason, priority: self.priorities.get(&id), expected_start: self.expected_start.get(&id).copied() }
    }

    /// Tests: the pass's own reason for job `id` (not a dependency's or advance reservation's).
    #[cfg(test)]
    pub fn pass_reason(&self, id: JobId) -> Option<&PendingReason> {
        self.pending_reasons.get(&id)
    }

    /// Tests: the priority the last pass gave job `id`.
    #[cfg(test)]
    pub fn priority(&self, id: JobId) -> Option<&Priority> {
        self.priorities.get(&id)
    }

    /// Tests: the start the last pass expects for job `id`.
    #[cfg(test)]
    pub fn expected_start(&self, id: JobId) -> Option<f64> {
        self.expected_start.get(&id).copied()
    }

    /// Tests: the array tails the last pass left out.
    #[cfg(test)]
    pub fn tails(&self) -> &[ArrayTail] {
        &self.tails
    }

    /// Tests: count the pass just recorded (`planned` jobs went to its round, `backfilled`
    /// started out of order).
    #[cfg(test)]
    pub fn count_pass(&mut self, planned: usize, backfilled: usize) {
        let left_out: usize = self.tails.iter().map(|t| t.count).sum();
        self.last_pass = PassStats {
            pending: planned + left_out,
            backfilled,
            kept_reservations: self.kept_plan.as_ref().map_or(0, |k| k.reused()),
        };
    }

    /// Tests: what the last pass counted.
    #[cfg(test)]
    pub fn last_pass(&self) -> PassStats {
        self.last_pass
    }

    /// Tests: send every task to the round (no array tails left out).
    #[cfg(test)]
    pub fn send_whole_arrays(&mut self) {
        self.whole_arrays = true;
    }

    /// Tests: whether every task goes to the round.
    #[cfg(test)]
    pub fn whole_arrays(&self) -> bool {
        self.whole_arrays
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_core::sched::reason::BeginWait;

    fn waited(id: u64, reason: PendingReason, at: Option<f64>) -> Waited {
        Waited { id: JobId(id), reason, expected_start: at, window: None }
    }

    fn prio(total: f64) -> Priority {
        Priority { total, ..Default::default() }
    }

    #[test]
    fn a_dependency_s_reason_stands_before_an_advance_reservation_s_and_that_before_the_pass_s() {
        let mut p = PolicyState::default();
        let window = PendingReason::Dependency("window".into());
        let w = |id| Waited { window: Some(window.clone()), ..waited(id, PendingReason::Priority, Some(50.0)) };
        p.record_pass(
            vec![(JobId(1), prio(3.0))],
            vec![w(1), w(2), waited(3, PendingReason::Held, None)],
            HashMap::new(),
            vec![],
        );
        p.depend_mut().hold_out(JobId(1), PendingReason::BeginTime(BeginWait::OldRun(vec![])));
        let one = p.shown(JobId(1));
        assert_eq!(one.reason, Some(&PendingReason::BeginTime(BeginWait::OldRun(vec![]))));
        assert_eq!((one.priority, one.expected_start), (Some(&prio(3.0)), Some(50.0)), "the pass's, still");
        assert_eq!(p.shown(JobId(2)).reason, Some(&window));
        assert_eq!(p.shown(JobId(3)).reason, Some(&PendingReason::Held));
        assert_eq!(p.shown(JobId(4)), Shown::default());
        assert_eq!(p.pass_reason(JobId(2)), Some(&PendingReason::Priority));
    }

    #[test]
    fn a_job_shut_out_of_its_advance_reservation_shows_why_and_a_new_pass_replaces_the_last() {
        let mut p = PolicyState::default();
        let why = PendingReason::Dependency("cannot use it".into());
        let shut_out = HashMap::from([(JobId(5), why.clone())]);
        p.record_pass(vec![(JobId(5), prio(1.0))], vec![], shut_out, vec![]);
        assert_eq!((p.shown(JobId(5)).reason, p.pass_reason(JobId(5))), (Some(&why), Some(&why)));
        p.record_pass(vec![], vec![waited(6, PendingReason::Priority, None)], HashMap::new(), vec![]);
        assert_eq!(p.shown(JobId(5)), Shown::default(), "forgotten by the next pass");
        assert_eq!(p.shown(JobId(6)).reason, Some(&PendingReason::Priority));
    }

    #[test]
    fn a_task_of_an_array_tail_shows_the_task_that_stood_for_it_unless_held_out_or_decided() {
        let mut p = PolicyState::default();
        let tail = ArrayTail { first: JobId(11), last: JobId(14), shown_as: JobId(10), count: 4 };
        let waiting = vec![waited(10, PendingReason::Priority, Some(70.0)), waited(12, PendingReason::Held, None)];
        p.record_pass(vec![(JobId(10), prio(2.0))], waiting, HashMap::new(), vec![tail]);
        for id in [11, 13, 14] {
            assert_eq!(p.shown_as(JobId(id)), JobId(10));
            let s = p.shown(JobId(id));
            assert_eq!(
                (s.reason, s.priority, s.expected_start),
                (Some(&PendingReason::Priority), Some(&prio(2.0)), Some(70.0))
            );
        }
        assert_eq!(p.shown_as(JobId(12)), JobId(12), "decided itself");
        assert_eq!((p.shown_as(JobId(9)), p.shown_as(JobId(15))), (JobId(9), JobId(15)));
        p.depend_mut().hold_out(JobId(13), PendingReason::Dependency("afterok".into()));
        let s = p.shown(JobId(13));
        assert_eq!((s.reason, s.priority), (Some(&PendingReason::Dependency("afterok".into())), None));
    }

    #[test]
    fn a_forgotten_job_loses_the_pass_s_reason_only() {
        let mut p = PolicyState::default();
        p.record_pass(
            vec![(JobId(1), prio(1.0))],
            vec![waited(1, PendingReason::Priority, Some(9.0))],
            HashMap::new(),
            vec![],
        );
        p.forget(JobId(1));
        let s = p.shown(JobId(1));
        assert_eq!((s.reason, s.priority, s.expected_start), (None, Some(&prio(1.0)), Some(9.0)));
    }

    #[test]
    fn charges_are_booked_once_per_instant_and_written_when_there_are_any() {
        let mut p = PolicyState::default();
        p.restore_usage(FairShare { as_of: 1000.0, ..Default::default() });
        assert_eq!(p.charged_until(), 1000.0);
        let charged = vec![("phys".to_string(), 3600.0), ("chem".to_string(), 60.0), ("phys".to_string(), 400.0)];
        let effects = p.charge(&charged, 1100.0);
        let fs = p.fair_share().clone();
        assert_eq!((p.charged_until(), fs.as_of), (1100.0, 1100.0));
        assert!(fs.usage["phys"] > fs.usage["chem"], "{:?}", fs.usage);
        assert_eq!(effects, vec![Effect::SaveFairShare(Box::new(fs.clone()))], "written as booked");
        // Charged until now already (a second pass in the same batch): nothing booked again.
        assert_eq!(p.charge(&charged, 1100.0), vec![]);
        assert_eq!(p.fair_share(), &fs);
        // Later with nothing to charge: usage decays to the new time, nothing to write.
        assert_eq!(p.charge(&[], 1200.0), vec![]);
        assert_eq!((p.charged_until(), p.fair_share().as_of), (1200.0, 1200.0));
    }
}
