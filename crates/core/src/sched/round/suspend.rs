//! The round's resumes (first) and preemptions (last).

use super::{PreemptStart, ResumeRule, RoundDecisions, RoundInput, RoundMachine, SuspendedInput, UserKey};
use crate::job::Allocation;
use crate::sched::backfill::{AdvanceReservation, Machine, QueuedJob, RunningJob};
use crate::sched::preempt::{
    beside_windows, cpus_only, plan_preemption_beside, resume_candidates, resume_parts, resumed_on, score,
    windows_held, Preemptible, Preemptor, Resume, ResumeWait, SuspendedJob, PREEMPTORS_PER_PASS,
};
use crate::sched::PendingReason;
use crate::JobId;
use std::collections::HashMap;

/// The state after the resumes: a copy of the machine when any job resumed, of the running
/// jobs when any resumed or any held back, and the jobs preemption may suspend (those given,
/// then the resumed ones).
pub(super) struct Resumed<M: Machine> {
    pub machine: Option<M>,
    pub running: Option<Vec<RunningJob<M::Alloc>>>,
    pub resumes: Vec<(JobId, Resume)>,
    /// Jobs that stay suspended, with why (part by part only).
    pub still: Vec<(JobId, ResumeWait)>,
    pub victims: Vec<Preemptible>,
    /// Whose the resumed jobs are and their cores, for per-user limits.
    pub users: Vec<(UserKey, u64)>,
}

/// Suspended jobs that can run now resume, in the order given, each on the state the ones
/// before it left. Their CPUs are claimed (their memory already is; moved with them, part by
/// part).
pub(super) fn resumes<M: RoundMachine>(
    input: &RoundInput<M>,
    windows: &[AdvanceReservation<Allocation>],
    now: f64,
) -> Resumed<M> {
    let victims = input.preempt.map(|p| p.victims.to_vec()).unwrap_or_default();
    let mut out = Resumed { machine: None, running: None, resumes: vec![], still: vec![], victims, users: vec![] };
    if input.machine.cluster().is_none() || input.suspended.is_empty() {
        return out;
    }
    let mut machine = input.machine.clone();
    let resumed: Vec<(usize, Resume, Allocation)> = match input.resume {
        ResumeRule::Whole { relocate } => whole(input, &mut machine, relocate),
        ResumeRule::Parts { connected } => parts(input, &mut machine, windows, connected, now, &mut out.still),
    };
    let mut running = input.running.to_vec();
    for (i, how, alloc) in resumed {
        let s = &input.suspended[i];
        out.resumes.push((s.job.id, how));
        if let Some(user) = &s.user {
            out.users.push(user.clone());
        }
        let Some(typed) = M::from_allocation(alloc.clone()) else { continue };
        running.push(RunningJob { id: s.job.id, alloc: typed, end: s.resumed_end });
        if let (Some((score, suspended_secs, start)), true) = (s.victim, input.preempt.is_some()) {
            out.victims.push(Preemptible { id: s.job.id, alloc, score, suspended_secs, start });
        }
    }
    let any_resumed = !out.resumes.is_empty();
    let held_back = hold_back::<M>(input.suspended, &out.resumes, &mut running);
    if any_resumed {
        out.machine = Some(machine);
    }
    if any_resumed || held_back {
        out.running = Some(running);
    }
    out
}

/// Whole jobs, in place or moved ([`resume_candidates`]), claimed on `machine`: (index in the
/// input, how, the allocation it resumes on).
fn whole<M: RoundMachine>(input: &RoundInput<M>, machine: &mut M, relocate: bool) -> Vec<(usize, Resume, Allocation)> {
    let Some(cluster) = input.machine.cluster() else { return vec![] };
    let list: Vec<SuspendedJob> = input.suspended.iter().map(|s| s.job.clone()).collect();
    let by_id: HashMap<JobId, usize> = input.suspended.iter().enumerate().map(|(i, s)| (s.job.id, i)).collect();
    let mut out = vec![];
    for (id, how) in resume_candidates(cluster, &list, relocate) {
        let Some(&i) = by_id.get(&id) else { continue };
        let alloc = match &how {
            Resume::InPlace => input.suspended[i].job.alloc.clone(),
            Resume::Relocated(moved) => moved.clone(),
        };
        if let Some(cpus) = M::from_allocation(cpus_only(&alloc)) {
            machine.claim(&cpus);
        }
        out.push((i, how, alloc));
    }
    out
}

/// Part by part ([`resume_parts`]), each job on the state the ones before it left, beside the
/// advance reservations' windows it would run into; those that stay suspended go to `still`.
fn parts<M: RoundMachine>(
    input: &RoundInput<M>,
    machine: &mut M,
    windows: &[AdvanceReservation<Allocation>],
    connected: &dyn Fn(crate::NodeId) -> bool,
    now: f64,
    still: &mut Vec<(JobId, ResumeWait)>,
) -> Vec<(usize, Resume, Allocation)> {
    let mut out = vec![];
    for (i, s) in input.suspended.iter().enumerate() {
        let plan = {
            let Some(cluster) = machine.cluster() else { return out };
            let view = match s.keep_off {
                Some(left) => beside_windows(cluster, windows, now, left).0,
                None => std::borrow::Cow::Borrowed(cluster),
            };
            resume_parts(&view, &s.job.alloc, s.parts, connected)
        };
        let plan = match plan {
            Ok(plan) => plan,
            Err(why) => {
                still.push((s.job.id, why));
                continue;
            }
        };
        let Some(cluster) = machine.cluster_mut() else { return out };
        let alloc = resumed_on(cluster, &s.job.alloc, &plan);
        let how = match plan.iter().all(Option::is_none) {
            true => Resume::InPlace,
            false => Resume::Relocated(alloc.clone()),
        };
        out.push((i, how, alloc));
    }
    out
}

/// Jobs that stay suspended and resume as soon as they can ([`SuspendedInput::holds_back`])
/// hold back the running jobs on their CPUs: each ends later by the longest of their
/// remaining runs. Whether any did.
fn hold_back<M: RoundMachine>(
    suspended: &[SuspendedInput],
    resumes: &[(JobId, Resume)],
    running: &mut [RunningJob<M::Alloc>],
) -> bool {
    let holding: Vec<(&Allocation, f64)> = suspended
        .iter()
        .filter(|s| !resumes.iter().any(|(id, _)| *id == s.job.id))
        .filter_map(|s| Some((&s.job.alloc, s.holds_back?)))
        .collect();
    if holding.is_empty() {
        return false;
    }
    for r in running.iter_mut() {
        let Some(alloc) = M::as_allocation(&r.alloc) else { continue };
        let mut longest: Option<f64> = None;
        for (held, left) in &holding {
            let overlaps =
                alloc.iter().any(|a| held.iter().any(|b| a.node_id == b.node_id && a.cpus.intersects(&b.cpus)));
            if overlaps {
                longest = Some(longest.unwrap_or(0.0).max(*left));
            }
        }
        if let Some(extra) = longest {
            r.end += extra;
        }
    }
    true
}

/// Up to [`PREEMPTORS_PER_PASS`] jobs the pass left waiting for resources, in its order, whose
/// score is high enough each suspend the cheapest running jobs that make room (beside the
/// advance reservations' `windows` they would run into) and start.
pub(super) fn preempt<M: RoundMachine>(
    input: &RoundInput<M>,
    windows: &[AdvanceReservation<Allocation>],
    victims: &[Preemptible],
    queue: &[QueuedJob],
    machine: &M,
    out: &mut RoundDecisions<M::Alloc>,
    now: f64,
) {
    let Some(p) = input.preempt else { return };
    let cfg = p.config;
    let index: HashMap<JobId, usize> = input.queue.iter().enumerate().map(|(i, q)| (q.id, i)).collect();
    // The pass reports its waiting jobs in its queue's order.
    let waiting: HashMap<JobId, usize> = out
        .waiting
        .iter()
        .enumerate()
        .filter(|(_, w)| matches!(w.reason, PendingReason::Resources(_)))
        .map(|(k, w)| (w.id, k))
        .collect();
    let mut trial: Option<(M, Vec<Preemptible>)> = None;
    let mut tried = 0;
    let mut done: Vec<PreemptStart<M::Alloc>> = vec![];
    for q in queue.iter().filter(|q| waiting.contains_key(&q.id)) {
        if tried >= PREEMPTORS_PER_PASS {
            break;
        }
        let Some(&i) = index.get(&q.id) else { continue };
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
        if p.by_id {
            running.sort_by_key(|r| r.id);
        }
        let candidate = Preemptor { request: &q.request, score: job_score, walltime: q.walltime };
        let plan = {
            let Some(cluster) = state.cluster() else { break };
            let (view, any) = beside_windows(cluster, windows, now, q.walltime);
            // Victims on the windows' PUs give back only the rest: the windows stay claimed.
            let held = if any { windows_held(windows, now, q.walltime) } else { vec![] };
            plan_preemption_beside(&view, running, &candidate, cfg, now, &held)
        };
        let Some(plan) = plan else { continue };
        let Some(alloc) = M::from_allocation(plan.alloc.clone()) else { break };
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
            let suspended_secs = job.suspended_secs;
            running.push(Preemptible { id: q.id, alloc: plan.alloc, score: job_score, suspended_secs, start: now });
        }
        let waited = out.waiting[waiting[&q.id]].clone();
        done.push(PreemptStart { id: q.id, victims: plan.victims, alloc, waited });
    }
    out.waiting.retain(|w| !done.iter().any(|d| d.id == w.id));
    out.preemptions = done;
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
            let suspended_secs = job.suspended_secs;
            running.push(Preemptible { id: s.id, alloc: alloc.clone(), score, suspended_secs, start: now });
        }
    }
    (state, running)
}
