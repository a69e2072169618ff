//! The round's decisions carried out, in its order: usage charges, resumes, what users are
//! shown (reasons, expected starts, priorities), starts, then preemptions (each: its
//! suspensions, then its start). Each changes the in-memory model and queues its effects, by
//! pure functions (`usage_booked`, `crate::suspend::{resumed, waiting_reason, suspended}`,
//! `crate::lifecycle::started`, `preempted`); `Controller::schedule` carries them out in that
//! order in the current transaction; messages to the agents go after it commits.

use crate::model::effect::Effect;
use crate::model::policy::{ArrayTail, Waited};
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
        let effects = self.policy.charge(&d.charges, now);
        self.queue(effects);
        self.carry_out_resumes(d.resumes, &d.still_suspended, now);
        let waiting = d.waiting.into_iter().map(|w| self.waited(w, now)).collect();
        self.policy.record_pass(d.priorities, waiting, shut_out, tails);
        #[cfg(test)]
        if d.passed {
            self.policy.count_pass(d.planned, d.backfilled);
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
            let waited = self.waited(p.waited, now);
            self.policy.waits(waited);
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

    /// A job left waiting, as users are shown it: its reason and expected start. A member of
    /// an advance reservation waiting for resources is told it waits for the window.
    fn waited(&self, w: Waiting, now: f64) -> Waited {
        let window = match w.reason {
            PendingReason::Resources(_) => self.jobs.get(&w.id).and_then(|j| self.advance_wait_reason(j, now)),
            _ => None,
        };
        Waited { id: w.id, reason: w.reason, expected_start: w.expected_start, window }
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
