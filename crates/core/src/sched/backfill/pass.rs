//! What every policy's pass shares: a machine with a cached free count, the memo of answers
//! for identical requests, and the output being built.

use super::{Fit, Machine, PassOutput, QueuedJob, Waiting};
use crate::placement::reason::{Busy, Never};
use crate::placement::{JobRequest, MemRequest};
use crate::sched::PendingReason;
use crate::JobId;
use rustc_hash::FxHashMap as HashMap;
use std::cell::Cell;

/// A machine whose free CPU count is computed once per change, not once per question (the
/// topology-aware cluster counts it with a scan of its nodes).
#[derive(Clone)]
pub(super) struct Tracked<M: Machine> {
    pub machine: M,
    free: Cell<Option<u64>>,
    /// Keep the count up to date on each change (else forget it until asked again).
    counting: bool,
}

impl<M: Machine> Tracked<M> {
    pub fn new(machine: M) -> Self {
        Tracked { machine, free: Cell::new(None), counting: true }
    }

    /// Whether to keep the count up to date on each change: worth it where counts are asked
    /// for about as often as the machine changes, not where it changes far more often.
    pub fn count_changes(&mut self, counting: bool) {
        self.counting = counting;
    }

    pub fn free_cpus(&self) -> u64 {
        match self.free.get() {
            Some(free) => free,
            None => {
                let free = self.machine.free_cpus();
                self.free.set(Some(free));
                free
            }
        }
    }

    pub fn claim(&mut self, alloc: &M::Alloc) {
        match self.free.get().filter(|_| self.counting) {
            Some(before) => self.free.set(Some(self.machine.claim_counting(alloc, before))),
            None => {
                self.machine.claim(alloc);
                self.free.set(None);
            }
        }
    }

    /// Place as if `extra` were claimed too; the machine is left as it was.
    pub fn place_with_claimed(&mut self, extra: &[&M::Alloc], req: &JobRequest) -> Fit<M::Alloc> {
        self.machine.place_with_claimed(extra, req)
    }

    pub fn release(&mut self, alloc: &M::Alloc) {
        match self.free.get().filter(|_| self.counting) {
            Some(before) => self.free.set(Some(self.machine.release_counting(alloc, before))),
            None => {
                self.machine.release(alloc);
                self.free.set(None);
            }
        }
    }
}

/// CPUs a request takes that `Machine::free_cpus` counts, when that is certain: plain requests
/// of whole cores outside system CPUs, without a binding (which may name its own core count).
/// Other requests are never rejected by count, only by trying them.
pub(super) fn counted_cpus(req: &JobRequest) -> Option<u64> {
    (!req.threads && !req.system_cpus && req.binding.is_none()).then(|| req.total_cpus())
}

/// Which state of a pass a memo answer belongs to.
pub(super) const NOW: usize = 0;
/// The state now with the reservations claimed too (EASY: the head's; conservative: all).
pub(super) const RESERVED: usize = 1;
const STATES: usize = 2;

/// Requests compared by value: identical requests get identical answers on the same state.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct RequestKey {
    /// (per node?, nodes or total cores, cores per node or chunk)
    shape: (bool, u32, u32),
    /// (per cpu?, bytes)
    mem: (bool, u64),
    threads: bool,
    system_cpus: bool,
    rank_cpus: u32,
    properties: Vec<String>,
    avoid_properties: Vec<String>,
    binding: Option<String>,
    /// (GPUs per node, type, per socket, locality)
    gpus: (u32, Option<String>, u32, Option<String>),
    gres: crate::gres::Counts,
    licenses: crate::gres::Counts,
}

impl RequestKey {
    pub fn of(req: &JobRequest) -> Self {
        use crate::job::Shape;
        RequestKey {
            shape: match req.shape {
                Shape::PerNode { nodes, cores_per_node } => (true, nodes, cores_per_node),
                Shape::Total { cores, chunk } => (false, cores, chunk),
            },
            mem: match req.mem {
                MemRequest::PerNode(b) => (false, b),
                MemRequest::PerCpu(b) => (true, b),
            },
            threads: req.threads,
            system_cpus: req.system_cpus,
            rank_cpus: req.rank_cpus,
            properties: req.properties.clone(),
            avoid_properties: req.avoid_properties.clone(),
            binding: req.binding.as_ref().map(|b| b.to_string()),
            gpus: (
                req.gpus_per_node,
                req.gpu_type.clone(),
                req.gpus_per_socket,
                req.gpu_locality.map(|l| l.to_string()),
            ),
            gres: req.gres.clone(),
            licenses: req.licenses.clone(),
        }
    }
}

#[derive(Debug, Default)]
struct Known {
    /// A placement has answered (so the request is not "never").
    placed: bool,
    never: Option<Never>,
    busy: [Option<Busy>; STATES],
}

/// Answers remembered for the rest of a pass. "Never" holds whatever the state; "busy" holds
/// because a pass only claims on the states it keeps (a start, a reservation), never releases.
#[derive(Debug, Default)]
pub(super) struct Memo {
    known: HashMap<RequestKey, Known>,
    pub placements: usize,
}

impl Memo {
    /// `machine.place(req)` unless the answer is known, or a count shows it is busy. `state`
    /// names which of the pass's kept states `machine` is ([`NOW`] or [`RESERVED`]).
    pub fn place<M: Machine>(&mut self, machine: &Tracked<M>, state: usize, req: &JobRequest) -> Fit<M::Alloc> {
        self.place_preferring(machine, state, &[], req)
    }

    /// [`Memo::place`], the placement preferring what `prefer` holds
    /// ([`Machine::place_preferring`], which fits exactly when `place` does: the same answers
    /// are remembered).
    pub fn place_preferring<M: Machine>(
        &mut self,
        machine: &Tracked<M>,
        state: usize,
        prefer: &[&M::Alloc],
        req: &JobRequest,
    ) -> Fit<M::Alloc> {
        let known = self.known.entry(RequestKey::of(req)).or_default();
        if let Some(why) = &known.never {
            return Fit::Never(why.clone());
        }
        if let Some(what) = &known.busy[state] {
            return Fit::Busy(what.clone());
        }
        // A count rejects only once a placement has said whether the request can ever fit.
        if let (true, Some(busy)) = (known.placed, count_busy(machine, req)) {
            // Remembered like a placement's answer: the words cost a scan of the nodes.
            known.busy[state] = Some(busy.clone());
            return Fit::Busy(busy);
        }
        self.placements += 1;
        let fit =
            if prefer.is_empty() { machine.machine.place(req) } else { machine.machine.place_preferring(prefer, req) };
        known.placed = true;
        match &fit {
            Fit::Never(why) => known.never = Some(why.clone()),
            Fit::Busy(what) => known.busy[state] = Some(what.clone()),
            Fit::Now(_) => {}
        }
        fit
    }

    /// [`Memo::place`] as if `extra` were claimed on `machine` too (advance reservations in
    /// force while the job would run). Keep one memo per set of `extra`: the answers are those
    /// of a machine with `extra` claimed (the sets a pass uses only grow with the walltime, and
    /// the states only take claims, so busy stays busy).
    pub fn place_beside<M: Machine>(
        &mut self,
        machine: &mut Tracked<M>,
        state: usize,
        extra: &[&M::Alloc],
        req: &JobRequest,
    ) -> Fit<M::Alloc> {
        if extra.is_empty() {
            return self.place(machine, state, req);
        }
        let known = self.known.entry(RequestKey::of(req)).or_default();
        if let Some(why) = &known.never {
            return Fit::Never(why.clone());
        }
        if let Some(what) = &known.busy[state] {
            return Fit::Busy(what.clone());
        }
        // The count without `extra` is an upper bound of the count with it: busy by it is busy.
        if let (true, Some(busy)) = (known.placed, count_busy(machine, req)) {
            // Remembered like a placement's answer: the words cost a scan of the nodes.
            known.busy[state] = Some(busy.clone());
            return Fit::Busy(busy);
        }
        self.placements += 1;
        let fit = machine.place_with_claimed(extra, req);
        known.placed = true;
        match &fit {
            Fit::Never(why) => known.never = Some(why.clone()),
            Fit::Busy(what) => known.busy[state] = Some(what.clone()),
            Fit::Now(_) => {}
        }
        fit
    }

    /// Whether `req` is known (or counted) not to fit `machine` as state `state`.
    pub fn busy_on<M: Machine>(&self, machine: &Tracked<M>, state: usize, req: &JobRequest) -> Option<Busy> {
        match self.known.get(&RequestKey::of(req)).and_then(|k| k.busy[state].clone()) {
            Some(what) => Some(what),
            None => count_busy(machine, req),
        }
    }
}

/// "Busy" from the free count alone, when the request needs more CPUs than are free, in the
/// machine's words for it ([`Machine::busy_by_count`]: placement's own, on the cluster).
fn count_busy<M: Machine>(machine: &Tracked<M>, req: &JobRequest) -> Option<Busy> {
    let need = counted_cpus(req)?;
    let free = machine.free_cpus();
    (need > free).then(|| machine.machine.busy_by_count(req, need, free))
}

/// How much a pass reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Detail {
    /// Starts, and every waiting job with its reason and expected start.
    Full,
    /// Starts only (`waiting` left empty): the pass stops as soon as no later job can start.
    StartsOnly,
}

/// The output being built, and whether a job is already waiting for resources or priority
/// (every start after that one overtook it: a backfill).
pub(super) struct Outcome<'q, A> {
    out: PassOutput<A>,
    blocked: bool,
    /// Starts only: the queue, and per queue index the fewest CPUs any job from there on needs
    /// by count (0 when a request is not counted; held jobs never start: "infinitely" many),
    /// worked out when first asked.
    starts_only: Option<(&'q [QueuedJob], std::cell::OnceCell<Vec<u64>>)>,
}

impl<'q, A> Outcome<'q, A> {
    pub fn new(queue: &'q [QueuedJob], detail: Detail) -> Self {
        let starts_only = (detail == Detail::StartsOnly).then(|| (queue, std::cell::OnceCell::new()));
        let waiting = if starts_only.is_some() { vec![] } else { Vec::with_capacity(queue.len()) };
        Outcome { out: PassOutput { starts: vec![], waiting, backfilled: vec![] }, blocked: false, starts_only }
    }

    /// Starts only: whether no job from queue index `i` on can start on a machine with `free`
    /// CPUs free (each needs more by count; every state a pass places on has at most that many
    /// free), so the pass can stop there.
    pub fn nothing_more_starts(&self, i: usize, free: u64) -> bool {
        let Some((queue, rest)) = &self.starts_only else {
            return false;
        };
        let rest = rest.get_or_init(|| {
            let mut rest = vec![u64::MAX; queue.len() + 1];
            for (i, job) in queue.iter().enumerate().rev() {
                let need = if job.held { u64::MAX } else { counted_cpus(&job.request).unwrap_or(0) };
                rest[i] = rest[i + 1].min(need);
            }
            rest
        });
        free < rest[i]
    }

    /// Whether waiting jobs are reported (else a pass may skip working out why they wait).
    pub fn reports_waiting(&self) -> bool {
        self.starts_only.is_none()
    }

    pub fn blocked(&self) -> bool {
        self.blocked
    }

    /// How many jobs it starts so far.
    pub fn started(&self) -> usize {
        self.out.starts.len()
    }

    pub fn start(&mut self, id: JobId, alloc: A) {
        if self.blocked {
            self.out.backfilled.push(id);
        }
        self.out.starts.push((id, alloc));
    }

    pub fn wait(&mut self, id: JobId, reason: PendingReason, expected_start: Option<f64>) {
        if matches!(reason, PendingReason::Resources(_) | PendingReason::Priority) {
            self.blocked = true;
        }
        if self.reports_waiting() {
            self.out.waiting.push(Waiting { id, reason, expected_start });
        }
    }

    pub fn finish(self) -> PassOutput<A> {
        self.out
    }
}
