//! The round's resumes (first) and preemptions (last).

use super::{PreemptStart, RoundDecisions, RoundInput, RoundMachine};
use crate::sched::backfill::{Machine, QueuedJob, RunningJob};
use crate::sched::preempt::{
    cpus_only, plan_preemption, resume_candidates, score, Preemptible, Preemptor, Resume, SuspendedJob,
    PREEMPTORS_PER_PASS,
};
use crate::sched::PendingReason;
use crate::JobId;
use std::collections::HashMap;

/// The state after the resumes: a copy of the machine and of the running jobs when any job
/// resumed, and the jobs preemption may suspend (those given, then the resumed ones).
pub(super) struct Resumed<M: Machine> {
    pub machine: Option<M>,
    pub running: Option<Vec<RunningJob<M::Alloc>>>,
    pub resumes: Vec<(JobId, Resume)>,
    pub victims: Vec<Preemptible>,
}

/// Suspended jobs that can run now resume, in the order given, each on the state the ones
/// before it left. Their CPUs are claimed (their memory already is).
pub(super) fn resumes<M: RoundMachine>(input: &RoundInput<M>, now: f64) -> Resumed<M> {
    let victims = input.preempt.map(|p| p.victims.to_vec()).unwrap_or_default();
    let mut out = Resumed { machine: None, running: None, resumes: vec![], victims };
    let Some(cluster) = input.machine.cluster().filter(|_| !input.suspended.is_empty()) else { return out };
    let list: Vec<SuspendedJob> = input.suspended.iter().map(|s| s.job.clone()).collect();
    out.resumes = resume_candidates(cluster, &list, input.relocate);
    if out.resumes.is_empty() {
        return out;
    }
    let by_id: HashMap<JobId, usize> = input.suspended.iter().enumerate().map(|(i, s)| (s.job.id, i)).collect();
    let mut machine = input.machine.clone();
    let mut running = input.running.to_vec();
    for (id, how) in &out.resumes {
        let Some(s) = by_id.get(id).map(|&i| &input.suspended[i]) else { continue };
        let alloc = match how {
            Resume::InPlace => s.job.alloc.clone(),
            Resume::Relocated(moved) => moved.clone(),
        };
        if let Some(cpus) = M::from_allocation(cpus_only(&alloc)) {
            machine.claim(&cpus);
        }
        let Some(typed) = M::from_allocation(alloc.clone()) else { continue };
        running.push(RunningJob { id: *id, alloc: typed, end: now + s.walltime_left });
        if let (Some((score, suspended_secs, start)), true) = (s.victim, input.preempt.is_some()) {
            out.victims.push(Preemptible { id: *id, alloc, score, suspended_secs, start });
        }
    }
    out.machine = Some(machine);
    out.running = Some(running);
    out
}

/// Up to [`PREEMPTORS_PER_PASS`] jobs the pass left waiting for resources, in its order, whose
/// score is high enough each suspend the cheapest running jobs that make room and start.
pub(super) fn preempt<M: RoundMachine>(
    input: &RoundInput<M>,
    victims: &[Preemptible],
    queue: &[QueuedJob],
    machine: &M,
    out: &mut RoundDecisions<M::Alloc>,
    now: f64,
) {
    let Some(p) = input.preempt else { return };
    let cfg = p.config;
    let index: HashMap<JobId, usize> = input.queue.iter().enumerate().map(|(i, q)| (q.id, i)).collect();
    let queued: HashMap<JobId, &QueuedJob> = queue.iter().map(|q| (q.id, q)).collect();
    let waiting: Vec<JobId> =
        out.waiting.iter().filter(|w| matches!(w.reason, PendingReason::Resources(_))).map(|w| w.id).collect();
    let mut trial: Option<(M, Vec<Preemptible>)> = None;
    let mut tried = 0;
    for id in waiting {
        if tried >= PREEMPTORS_PER_PASS {
            break;
        }
        let (Some(&i), Some(q)) = (index.get(&id), queued.get(&id)) else { continue };
        let job = p.jobs[i];
        if !job.may_preempt || q.held {
            continue;
        }
        let job_score = score(&q.request, job.class, cfg);
        if job_score < cfg.min_score {
            continue;
        }
        tried += 1;
        let (state, running) = trial.get_or_insert_with(|| after_starts(input, victims, machine, out, now));
        let Some(cluster) = state.cluster() else { return };
        let candidate = Preemptor { request: &q.request, score: job_score, walltime: q.walltime };
        let Some(plan) = plan_preemption(cluster, running, &candidate, cfg, now) else { continue };
        let Some(alloc) = M::from_allocation(plan.alloc.clone()) else { return };
        for victim in &plan.victims {
            // `swap_remove`, as the simulator keeps its running jobs: ties stay as they were.
            let Some(at) = running.iter().position(|r| r.id == *victim) else { continue };
            let r = running.swap_remove(at);
            if let Some(cpus) = M::from_allocation(cpus_only(&r.alloc)) {
                state.release(&cpus);
            }
        }
        state.claim(&alloc);
        if job.suspendable {
            running.push(Preemptible { id, alloc: plan.alloc, score: job_score, suspended_secs: 0.0, start: now });
        }
        out.waiting.retain(|w| w.id != id);
        out.preemptions.push(PreemptStart { id, victims: plan.victims, alloc });
    }
}

/// The machine and the suspendable running jobs once the pass's starts are claimed.
fn after_starts<M: RoundMachine>(
    input: &RoundInput<M>,
    victims: &[Preemptible],
    machine: &M,
    out: &RoundDecisions<M::Alloc>,
    now: f64,
) -> (M, Vec<Preemptible>) {
    let mut state = machine.clone();
    let mut running = victims.to_vec();
    let Some(p) = input.preempt else { return (state, running) };
    let index: HashMap<JobId, usize> = input.queue.iter().enumerate().map(|(i, q)| (q.id, i)).collect();
    for s in &out.starts {
        state.claim(&s.alloc);
        let Some(&i) = index.get(&s.id) else { continue };
        let (job, q) = (p.jobs[i], &input.queue[i]);
        if let (true, Some(alloc)) = (job.suspendable, M::as_allocation(&s.alloc)) {
            let score = score(&q.request, job.class, p.config);
            running.push(Preemptible { id: s.id, alloc: alloc.clone(), score, suspended_secs: 0.0, start: now });
        }
    }
    (state, running)
}
