//! The round's decisions carried out, in its order: usage charges, resumes, what users are
//! shown (reasons, expected starts, priorities), starts, then preemptions (each: its
//! suspensions, then its start). Each changes the in-memory model and queues its effects, by
//! pure functions (`usage_booked`, `crate::suspend::{resumed, waiting_reason, suspended}`,
//! `crate::lifecycle::started`, `preempted`); `Controller::schedule` carries them out in that
//! order in the current transaction; messages to the agents go after it commits.

use super::usage_booked;
use crate::model::effect::Effect;
use crate::state::ArrayTail;
use crate::state::Controller;
use crate::suspend::SuspendBy;
use berth_core::job::Allocation;
use berth_core::sched::backfill::Waiting;
use berth_core::sched::preempt::Resume;
use berth_core::sched::round::{PreemptStart, RoundDecisions};
use berth_core::sched::PendingReason;
use berth_core::JobId;
use std::collections::HashMap;

impl Controller {
    /// Carry out `d`; `shut_out`: jobs asking for an advance reservation they cannot use, with
    /// why; `tails`: array tasks left out of the round, decided as the task each names.
    pub(super) fn carry_out(
        &mut self,
        d: RoundDecisions<Allocation>,
        shut_out: HashMap<JobId, PendingReason>,
        tails: Vec<ArrayTail>,
        now: f64,
    ) {
        let effects = usage_booked(&mut self.policy.fair_share, &mut self.policy.charged_until, &d.charges, now);
        self.queue(effects);
        self.carry_out_resumes(d.resumes, &d.still_suspended, now);
        self.policy.priorities = d.priorities.into_iter().collect();
        self.policy.advance_reasons.clear();
        self.policy.pending_reasons.clear();
        self.policy.expected_start.clear();
        for w in d.waiting {
            self.waits(w, now);
        }
        self.shut_out(shut_out);
        self.policy.tails = tails;
        #[cfg(test)]
        if d.passed {
            let left_out: usize = self.policy.tails.iter().map(|t| t.count).sum();
            self.policy.last_pass = crate::state::PassStats {
                pending: d.planned + left_out,
                backfilled: d.backfilled,
                kept_reservations: self.policy.kept_plan.as_ref().map_or(0, |k| k.reused()),
            };
        }
        for s in d.starts {
            self.start(s.id, s.alloc, now);
        }
        // Each preemption was decided on the state the ones before it left: once one does not
        // happen as decided, the rest wait for the next pass.
        let mut as_decided = true;
        for p in d.preemptions {
            if as_decided {
                as_decided = self.preempt_one(&p, now);
                if self.jobs.get(&p.id).is_some_and(|j| j.state.has_allocation()) {
                    continue;
                }
            }
            self.queue([Effect::Reschedule]);
            self.waits(p.waited, now);
        }
    }

    /// The round's resumes (each on the parts it decided), and why the jobs that stay
    /// suspended wait.
    pub(super) fn carry_out_resumes(
        &mut self,
        resumes: Vec<(JobId, Resume)>,
        still_suspended: &[(JobId, berth_core::sched::preempt::ResumeWait)],
        now: f64,
    ) {
        for (id, how) in resumes {
            self.resume_with(id, &how, now);
        }
        for (id, why) in still_suspended {
            self.resume_waits(*id, why);
        }
    }

    /// A job left waiting: its reason and expected start, shown to users. A member of an
    /// advance reservation waiting for resources is told it waits for the window.
    fn waits(&mut self, w: Waiting, now: f64) {
        if let Some(t) = w.expected_start {
            self.policy.expected_start.insert(w.id, t);
        }
        if matches!(w.reason, PendingReason::Resources(_)) {
            if let Some(why) = self.jobs.get(&w.id).and_then(|j| self.advance_wait_reason(j, now)) {
                self.policy.advance_reasons.insert(w.id, why);
            }
        }
        self.policy.pending_reasons.insert(w.id, w.reason);
    }

    /// Suspend the preemption's victims, then start its job on the allocation the round
    /// chose. A victim that could not be frozen keeps its CPUs: the job does not start.
    /// Whether it started as the round decided.
    ///
    /// The round placed it on the state the decisions before it leave (the resumes, starts and
    /// preemptions carried out here in the same order, with the same claims: `resumed_on`,
    /// `claim`, a victim's PUs given back as `release_pus` does), beside the advance
    /// reservations it would run into: the windows `advance_view` claims, kept claimed under
    /// the victims it suspends (berth-core's `plan_preemption_beside`). Placing it again here
    /// would find the same allocation.
    fn preempt_one(&mut self, p: &PreemptStart<Allocation>, now: f64) -> bool {
        let why = format!("preempted by job {}", p.id);
        let mut all_suspended = true;
        for victim in &p.victims {
            if let Err(e) = self.suspend_queued(*victim, now, SuspendBy::Policy(why.clone())) {
                tracing::warn!(job = %victim, "cannot suspend for job {}: {e}", p.id);
                all_suspended = false;
            }
        }
        if !all_suspended || !self.jobs.contains_key(&p.id) {
            return false;
        }
        self.queue([preempted(p)]);
        self.start(p.id, p.alloc.clone(), now);
        true
    }
}

/// The event of preemption `p` (its victims suspended), written before its job's start.
pub(crate) fn preempted(p: &PreemptStart<Allocation>) -> Effect {
    let victims: Vec<String> = p.victims.iter().map(|v| v.to_string()).collect();
    Effect::job_event("preempt", p.id, None, format!("suspended jobs {}", victims.join(",")))
}
