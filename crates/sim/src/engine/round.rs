//! One scheduling round in the simulation: the simulator gathers the round's input from its
//! state, calls `berth_core::sched::round` (as the controller does; `round_counted` for
//! conservative backfill where processor counts decide, its plan kept in `Replay::counted`)
//! and carries out the decisions on its virtual clock: resumes, starts, then preemptions (suspensions, then the
//! preemptor's start).
//!
//! Preemption by suspension: suspended jobs resume first, longest suspended first, on their
//! own cores or other free cores of the same nodes; after the pass, up to
//! `PREEMPTORS_PER_PASS` jobs still waiting for resources whose score is high enough suspend
//! the cheapest set of running jobs that makes room, and start. A suspended job stops
//! progressing (its remaining run time is kept) and gives its cores back; it would keep its
//! memory, but trace jobs ask for none. The bound on total suspension is checked against the
//! preemptor's estimate, as the controller does; the simulator runs jobs to their actual run
//! time, so a preemptor overrunning its estimate can take a victim past it.

use super::replay::{Replay, Suspended};
use berth_core::job::Shape;
use berth_core::placement::JobRequest;
use berth_core::sched::backfill::PassLimits;
use berth_core::sched::counted::CountedMachine;
use berth_core::sched::preempt::{score, Preemptible, Resume, SuspendedJob};
use berth_core::sched::round::{
    round, round_counted, PreemptJob, PreemptRound, PriorityRound, ResumeRule, RoundDecisions, RoundInput,
    RoundMachine, SuspendedInput,
};
use berth_core::JobId;

impl<M: RoundMachine + CountedMachine> Replay<'_, M> {
    /// One round at `now`; `every`: run the pass even when it provably starts nothing.
    pub(super) fn round(&mut self, now: f64, every: bool) {
        if self.queue.is_empty() && self.suspended.is_empty() {
            return;
        }
        let work = self.work;
        let preempt_cfg = self.config.preempt.clone().filter(|_| self.may_preempt());
        let suspended: Vec<SuspendedInput> = match self.machine.cluster() {
            Some(_) => self.suspended.iter().filter_map(|s| self.suspended_input(s, now)).collect(),
            None => vec![],
        };
        let victims: Vec<Preemptible> = match &preempt_cfg {
            Some(cfg) => self
                .running
                .iter()
                .filter_map(|r| {
                    let j = r.id.0 as usize;
                    Some(Preemptible {
                        id: r.id,
                        alloc: <M as RoundMachine>::as_allocation(&r.alloc)?.clone(),
                        score: score(&work.jobs[j].request, 0, cfg),
                        suspended_secs: self.outcomes.suspended[j],
                        start: self.outcomes.start[j],
                    })
                })
                .collect(),
            None => vec![],
        };
        // Trace jobs have no queue class: any may preempt, and be preempted.
        let preempt_jobs = match preempt_cfg {
            Some(_) => vec![
                PreemptJob { class: 0, may_preempt: true, suspendable: true, suspended_secs: 0.0 };
                self.queue.len()
            ],
            None => vec![],
        };
        let priorities =
            self.accounting.as_ref().map(|acc| acc.priorities(self.queue.jobs(), &work.jobs, &work.accounts));
        let weights = self.accounting.as_ref().map(|acc| acc.weights().clone()).unwrap_or_default();
        let input = RoundInput {
            machine: &self.machine,
            running: &self.running,
            queue: self.queue.jobs(),
            priority: priorities.as_deref().map(|jobs| PriorityRound {
                weights: &weights,
                machine_cpus: self.total_cpus,
                jobs,
            }),
            user_limits: None,
            // Charged at every event of the clock, before the round (`Accounting::charge_to`).
            usage: None,
            suspended: &suspended,
            barred: None,
            resume: ResumeRule::Whole { relocate: true },
            preempt: preempt_cfg.as_ref().map(|config| PreemptRound {
                config,
                jobs: &preempt_jobs,
                victims: &victims,
                by_id: false,
            }),
            limits: PassLimits {
                policy: self.config.policy,
                max_reservations: self.config.max_reservations,
                deadline: None,
            },
            // Why jobs wait matters only to preemption (who waits for resources).
            reasons: self.config.preempt.is_some(),
            idle_unless: if every { None } else { Some(self.queue.smallest().unwrap_or(u64::MAX)) },
        };
        let decisions = match self.counted.as_mut() {
            Some(plan) => round_counted(&input, plan, now),
            None => round(&input, now),
        };
        self.carry_out(now, decisions);
    }

    /// A suspended job as the round sees it.
    fn suspended_input(&self, s: &Suspended<M::Alloc>, now: f64) -> Option<SuspendedInput> {
        let job = &self.work.jobs[s.job];
        let alloc = <M as RoundMachine>::as_allocation(&s.alloc)?.clone();
        let walltime_left = (job.estimate - (job.run - self.remaining[s.job])).max(0.0);
        let victim = self.config.preempt.as_ref().map(|cfg| {
            let suspended_secs = self.outcomes.suspended[s.job] + (now - s.since);
            (score(&job.request, 0, cfg), suspended_secs, self.outcomes.start[s.job])
        });
        Some(SuspendedInput::whole(SuspendedJob { id: JobId(s.job as u64), alloc }, now + walltime_left, victim))
    }

    /// The round's effects on the virtual clock, in its order.
    fn carry_out(&mut self, now: f64, d: RoundDecisions<M::Alloc>) {
        for (id, how) in d.resumes {
            let Some(at) = self.suspended.iter().position(|s| s.job == id.0 as usize) else { continue };
            let s = self.suspended.remove(at);
            let alloc = match how {
                Resume::InPlace => s.alloc,
                Resume::Relocated(moved) => <M as RoundMachine>::from_allocation(moved).unwrap_or(s.alloc),
            };
            self.outcomes.suspended[s.job] += now - s.since;
            self.run(now, s.job, alloc);
        }
        if d.passed {
            self.passes += 1;
            self.backfilled_total += d.backfilled;
        }
        let work = self.work;
        let count = d.starts.len();
        for s in d.starts {
            let index = s.id.0 as usize;
            self.outcomes.backfilled[index] = s.backfilled;
            self.start(now, index, s.alloc);
        }
        if count > 0 {
            self.queue.remove_started(&self.started, count, |i| work.jobs[i].procs);
        }
        for p in d.preemptions {
            for victim in p.victims {
                self.suspend(now, victim.0 as usize);
            }
            self.start(now, p.id.0 as usize, p.alloc);
            self.preemptions += 1;
            self.queue.remove_started(&self.started, 1, |i| work.jobs[i].procs);
        }
    }

    /// Whether a queued job scores high enough to preempt (the largest scores highest: trace
    /// jobs have no queue class, so a job's score grows with its CPUs).
    pub(super) fn may_preempt(&self) -> bool {
        let (Some(cfg), Some(largest)) = (&self.config.preempt, self.queue.largest()) else { return false };
        let cores = u32::try_from(largest).unwrap_or(u32::MAX);
        score(&JobRequest::simple(Shape::Total { cores, chunk: 1 }, 0), 0, cfg) >= cfg.min_score
    }
}
