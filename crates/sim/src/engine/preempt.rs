//! Preemption by suspension in the simulation, driven as the controller drives it
//! (`berth_core::sched::preempt`): at each event time suspended jobs resume first, longest
//! suspended first, on their own cores or other free cores of the same nodes; after the pass,
//! up to [`PREEMPTORS_PER_PASS`] jobs still waiting for resources whose score is high enough
//! suspend the cheapest set of running jobs that makes room, and start.
//!
//! A suspended job stops progressing (its remaining run time is kept) and gives its cores
//! back; it would keep its memory, but trace jobs ask for none. The bound on total suspension
//! is checked against the preemptor's estimate, as the controller does; the simulator runs jobs
//! to their actual run time, so a preemptor overrunning its estimate can take a victim past it.

use super::replay::Replay;
use crate::machine::Suspending;
use berth_core::job::Shape;
use berth_core::placement::JobRequest;
use berth_core::sched::preempt::{
    plan_preemption, resume_candidates, score, Preemptible, Preemptor, Resume, SuspendedJob, PREEMPTORS_PER_PASS,
};
use berth_core::JobId;

/// A suspended job and the allocation it ran on.
#[derive(Debug, Clone)]
pub(super) struct Suspended<A> {
    pub job: usize,
    pub alloc: A,
    pub since: f64,
}

impl<M: Suspending> Replay<'_, M> {
    /// Resume the suspended jobs that can run now, longest suspended first.
    pub(super) fn resume(&mut self, now: f64) {
        if self.suspended.is_empty() {
            return;
        }
        let Some(cluster) = self.machine.cluster() else { return };
        let list: Vec<SuspendedJob> = self
            .suspended
            .iter()
            .filter_map(|s| Some(SuspendedJob { id: JobId(s.job as u64), alloc: M::as_allocation(&s.alloc)?.clone() }))
            .collect();
        let resumable = resume_candidates(cluster, &list, true);
        for (id, how) in resumable {
            let Some(at) = self.suspended.iter().position(|s| s.job == id.0 as usize) else { continue };
            let s = self.suspended.remove(at);
            let alloc = match how {
                Resume::InPlace => s.alloc,
                Resume::Relocated(moved) => match M::from_allocation(moved) {
                    Some(alloc) => alloc,
                    None => s.alloc,
                },
            };
            self.outcomes.suspended[s.job] += now - s.since;
            self.run(now, s.job, alloc);
        }
    }

    /// Whether a queued job scores high enough to preempt (the largest scores highest: trace
    /// jobs have no queue class, so a job's score grows with its CPUs).
    pub(super) fn may_preempt(&self) -> bool {
        let (Some(cfg), Some(largest)) = (&self.config.preempt, self.queue.largest()) else { return false };
        let cores = u32::try_from(largest).unwrap_or(u32::MAX);
        score(&JobRequest::simple(Shape::Total { cores, chunk: 1 }, 0), 0, cfg) >= cfg.min_score
    }

    /// Let waiting jobs (in priority order, those the pass left waiting for resources) start by
    /// suspending cheaper running jobs.
    pub(super) fn preempt(&mut self, now: f64, waiting_for_resources: &[JobId]) {
        let Some(cfg) = self.config.preempt.clone() else { return };
        let work = self.work;
        let mut tried = 0;
        for id in waiting_for_resources {
            if tried >= PREEMPTORS_PER_PASS {
                break;
            }
            let index = id.0 as usize;
            let job = &work.jobs[index];
            let job_score = score(&job.request, 0, &cfg);
            if job_score < cfg.min_score {
                continue;
            }
            tried += 1;
            let Some(cluster) = self.machine.cluster() else { return };
            let running: Vec<Preemptible> = self
                .running
                .iter()
                .filter_map(|r| {
                    let j = r.id.0 as usize;
                    Some(Preemptible {
                        id: r.id,
                        alloc: M::as_allocation(&r.alloc)?.clone(),
                        score: score(&work.jobs[j].request, 0, &cfg),
                        suspended_secs: self.outcomes.suspended[j],
                        start: self.outcomes.start[j],
                    })
                })
                .collect();
            let candidate = Preemptor { request: &job.request, score: job_score, walltime: job.estimate };
            let Some(preemption) = plan_preemption(cluster, &running, &candidate, &cfg, now) else { continue };
            let Some(alloc) = M::from_allocation(preemption.alloc) else { return };
            for victim in preemption.victims {
                self.suspend(now, victim.0 as usize);
            }
            self.start(now, index, alloc);
            self.preemptions += 1;
            self.queue.remove_started(&self.started, 1, |i| work.jobs[i].procs);
        }
    }
}
