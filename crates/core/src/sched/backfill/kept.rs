//! A conservative plan kept from one pass to the next, so that a pass plans again only what
//! changed (Mu'alem and Feitelson keep their schedule between events the same way).
//!
//! A conservative reservation depends on the machine at every future time (the running jobs
//! and when they end) and on the reservations of the jobs before it. The next pass reuses the
//! kept decisions of the longest prefix of its queue for which none of these changed:
//! - the running jobs are those of the last pass and the jobs it started, with the same
//!   allocations and expected ends, less jobs that ended no earlier than expected (a job that
//!   ended early frees resources sooner: everything is planned again);
//! - the machine is otherwise the same ([`Machine::same_state`]): no node added, drained or
//!   changed;
//! - the queue starts with the same jobs in the same order, with the same requests,
//!   walltimes and holds (a job cancelled, inserted, reordered or changed ends the prefix
//!   there: the jobs before it never depended on it).
//!
//! In the prefix every job is still tried now as a full pass tries it (a due one first on its
//! reserved resources); one that starts now gives up its reservation. A kept reservation that
//! may share resources ([`Machine::may_share`]) with something this pass changed (a job
//! started now, a reservation planned again; on the same allocation only the time outside the
//! old reservation counts) while both hold them is planned again, from its old start; so is a
//! due one that cannot start. A job left without a reservation (past the limit or the pass's
//! time budget) ends the prefix. So a kept reservation is always valid (its resources are
//! free then, beside every earlier job), and no later job ever delays it; it may be later than
//! a fresh plan would find when the last pass's search skipped a time (see `conservative`'s
//! thinning), as a fresh plan's may be.

use super::timeline::clamp_end;
use super::{Machine, PassInput, PassLimits, RunningJob};
use crate::placement::JobRequest;
use crate::JobId;
use rustc_hash::FxHashMap as HashMap;

/// What a conservative pass leaves for the next one (see the module's documentation). Opaque:
/// a caller only stores it between passes ([`plan_keeping`](super::plan_keeping)).
#[derive(Clone)]
pub struct KeptPlan<M: Machine> {
    now: f64,
    max_reservations: usize,
    /// The machine as the pass left it: its input's with the pass's starts claimed.
    machine: M,
    /// The jobs holding resources after the pass: (expected end as given, allocation).
    held: HashMap<JobId, (f64, M::Alloc)>,
    /// The pass's decisions for the jobs it did not start, in queue order, up to the first one
    /// it could not plan (past the reservation limit or its time budget).
    planned: Vec<Planned<M::Alloc>>,
    /// How many reservations of the plan before it the pass that made this one kept.
    reused: usize,
}

impl<M: Machine> std::fmt::Debug for KeptPlan<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeptPlan {{ now: {}, planned: {}, reused: {} }}", self.now, self.planned.len(), self.reused)
    }
}

/// A job as the last pass saw it, and what it decided.
#[derive(Debug, Clone)]
pub(super) struct Planned<A> {
    pub id: JobId,
    pub request: JobRequest,
    pub walltime: f64,
    pub held: bool,
    pub decision: Decision<A>,
}

#[derive(Debug, Clone)]
pub(super) enum Decision<A> {
    Held,
    Never(crate::placement::reason::Never),
    Reserved { start: f64, alloc: A },
}

impl<A> Planned<A> {
    /// Whether queued job `job` (walltime `w`) is this one, unchanged.
    pub fn is(&self, job: &super::QueuedJob, w: f64) -> bool {
        self.id == job.id && self.held == job.held && self.walltime.total_cmp(&w).is_eq() && self.request == job.request
    }
}

impl<M: Machine> KeptPlan<M> {
    /// What a pass over `input` leaves: `machine` is its input's with its starts claimed,
    /// `started` those starts with their expected ends.
    pub(super) fn new(
        input: &PassInput<M>,
        limits: &PassLimits,
        machine: M,
        started: impl Iterator<Item = (JobId, f64, M::Alloc)>,
        planned: Vec<Planned<M::Alloc>>,
        reused: usize,
    ) -> Self {
        let mut held: HashMap<JobId, (f64, M::Alloc)> = HashMap::default();
        held.reserve(input.running.len());
        for r in input.running {
            held.insert(r.id, (r.end, r.alloc.clone()));
        }
        for (id, end, alloc) in started {
            held.insert(id, (end, alloc));
        }
        KeptPlan { now: input.now, max_reservations: limits.max_reservations, machine, held, planned, reused }
    }

    /// How many reservations the pass that made this plan kept from the one before.
    pub fn reused(&self) -> usize {
        self.reused
    }

    /// How many reservations this plan holds.
    pub fn reservations(&self) -> usize {
        self.planned.iter().filter(|p| matches!(p.decision, Decision::Reserved { .. })).count()
    }

    /// The kept decisions, if the machine and its running jobs at `input` are what this plan
    /// expected (see the module's documentation); none if anything differs.
    pub(super) fn still_valid(self, input: &PassInput<M>, limits: &PassLimits) -> Option<Vec<Planned<M::Alloc>>> {
        let KeptPlan { now, max_reservations, mut machine, mut held, planned, .. } = self;
        if max_reservations != limits.max_reservations || input.now.total_cmp(&now).is_lt() {
            return None;
        }
        for RunningJob { id, alloc, end } in input.running {
            // A job held then with the same allocation and end (each id at most once).
            match held.remove(id) {
                Some((e, a)) if e.total_cmp(end).is_eq() && a == *alloc => {}
                _ => return None,
            }
        }
        // What is left has ended since: as expected, or sooner (the plan no longer holds).
        for (end, alloc) in held.values() {
            if clamp_end(*end, now) > input.now {
                return None;
            }
            machine.release(alloc);
        }
        machine.same_state(input.machine).then_some(planned)
    }
}
