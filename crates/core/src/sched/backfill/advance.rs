//! Advance reservations: resources set aside for a time window `[start, end)` for some jobs,
//! its *members* (an admin's reservation for users or projects, made ahead of time).
//!
//! A pass with advance reservations ([`plan_with_advance`]) first plans the members of each
//! reservation, then every other job with the policy's pass:
//!
//! * **Members** run only inside their reservation: on its resources (the machine confined to
//!   them, [`Confine`]), from its start, and only if they end (start + walltime) by its end.
//!   They start in queue order while its window is open; before it opens they wait, expected
//!   at its start if they fit its resources then. Several may share its resources.
//! * **Everyone else** keeps off every reservation whose window they would run into: a job
//!   starting now for `w` seconds is placed beside (as if claimed) the reservations that start
//!   before `now + w`, and the EASY head's or a conservative reservation at `t` beside those
//!   overlapping `[t, t + w)`. So a job may use reserved resources now only if it ends by the
//!   window's start. The windows are the pass's book of reservations made before any job's:
//!   conservative backfill holds them in its book, EASY and FCFS place beside them (one memo
//!   of answers per set of windows, so a huge queue still costs few placements).
//!
//! Pure: the controller decides who is a member and passes their job ids.

use super::pass::{Memo, RequestKey, Tracked, NOW};
use super::timeline::Timeline;
use super::{Fit, Machine, PassInput, PassLimits, PassOutput, Reservation, RunningJob, Waiting};
use crate::gres::Counts;
use crate::job::{Allocation, NodeAllocation, NumaShare};
use crate::placement::reason::Busy;
use crate::placement::JobRequest;
use crate::sched::reason::{PendingReason, Unsuitable, Wanting};
use crate::sched::ClusterState;
use crate::{CpuSet, JobId};
use rustc_hash::FxHashMap as HashMap;

/// Resources set aside over `[start, end)` for the jobs `members`.
#[derive(Debug, Clone, PartialEq)]
pub struct AdvanceReservation<A> {
    /// Its name, for reasons.
    pub id: String,
    pub alloc: A,
    pub start: f64,
    pub end: f64,
    /// The jobs that may use it, queued or running: they run only on `alloc`, inside the
    /// window. Running members hold part of `alloc` (their allocations are inside it).
    pub members: Vec<JobId>,
}

/// The node id of a window's part on no node: licenses alone ([`licenses_only`]). No node
/// has it, so claiming or releasing such a part counts its licenses only.
pub const NO_NODE: crate::NodeId = crate::NodeId(u32::MAX);

/// An allocation part holding `licenses` and nothing on any node: an advance reservation of
/// licenses alone (`berth resv create -L matlab:2` without nodes or cores). Its members run
/// on any free resources of the machine and take their licenses from it; everyone else keeps
/// off those licenses during its window.
pub fn licenses_only(licenses: Counts) -> NodeAllocation {
    NodeAllocation {
        node_id: NO_NODE,
        node: String::new(),
        cpus: CpuSet::new(),
        cores: 0,
        mems: CpuSet::new(),
        memory_bytes: 0,
        numa_memory: vec![],
        exclusive_numa: CpuSet::new(),
        subnodes: vec![],
        binding: vec![],
        ranks: vec![],
        gpus: vec![],
        gres: Counts::new(),
        licenses,
    }
}

/// Whether `alloc` holds anything on a node (not licenses alone).
pub fn on_nodes(alloc: &Allocation) -> bool {
    alloc.iter().any(|na| na.node_id != NO_NODE)
}

/// A machine that can be narrowed to what one allocation holds (a reservation's resources),
/// for placing the reservation's members.
pub trait Confine: Machine {
    /// This machine with only `within` usable: its parts that are free now, its memory less
    /// what `used` (allocations inside it, e.g. running members) hold of it. Everything else is
    /// taken.
    fn confine(&self, within: &Self::Alloc, used: &[&Self::Alloc]) -> Self;

    /// What a window (`window`, an advance reservation's resources) still keeps from jobs that
    /// are not its members when its members hold `held` (allocations inside it). Counted
    /// resources a member holds (licenses, generic resources) are part of the window's counts:
    /// claiming both would count them twice. The default: the whole window (what is claimed
    /// twice, like PUs, counts once).
    fn unheld(window: &Self::Alloc, held: &[&Self::Alloc]) -> Self::Alloc {
        let _ = held;
        window.clone()
    }
}

impl Confine for ClusterState {
    fn confine(&self, within: &Allocation, used: &[&Allocation]) -> Self {
        let mut out = self.clone();
        let mut take: Allocation = Vec::new();
        // A window of licenses alone confines no node: its members use any free ones.
        let nodes = if on_nodes(within) { self.nodes() } else { &[] };
        for node in nodes {
            let numa = &node.topology.numa_nodes;
            let mut keep_pus = CpuSet::new();
            let mut keep_gpus: Vec<u32> = vec![];
            let mut keep_mem = vec![0u64; numa.len()];
            let mut keep_gres = Counts::new();
            for na in within.iter().filter(|na| na.node_id == node.id) {
                keep_pus.union_with(&na.cpus);
                keep_gpus.extend_from_slice(&na.gpus);
                for (i, bytes) in numa_shares(node, na) {
                    keep_mem[i] = keep_mem[i].saturating_add(bytes);
                }
                add_counts(&mut keep_gres, &na.gres);
            }
            for na in used.iter().flat_map(|a| a.iter()).filter(|na| na.node_id == node.id) {
                for (i, bytes) in numa_shares(node, na) {
                    keep_mem[i] = keep_mem[i].saturating_sub(bytes);
                }
                sub_counts(&mut keep_gres, &na.gres);
            }
            // The node's free generic resources beyond what the reservation keeps are taken.
            let gres: Counts = node
                .gres_free
                .iter()
                .map(|(name, &free)| (name.clone(), free.saturating_sub(keep_gres.get(name).copied().unwrap_or(0))))
                .filter(|&(_, n)| n > 0)
                .collect();
            let mut pus = node.free_pus.clone();
            pus.subtract(&keep_pus);
            let numa_memory: Vec<NumaShare> = node
                .numa_free
                .iter()
                .enumerate()
                .filter_map(|(i, &free)| {
                    let bytes = free.saturating_sub(keep_mem[i]);
                    (bytes > 0).then(|| NumaShare { numa: numa[i].os_index, bytes })
                })
                .collect();
            // The free GPUs the reservation does not hold are taken like its other PUs.
            let gpus: Vec<u32> = node.free_gpus_of(None).filter(|g| !keep_gpus.contains(g)).collect();
            if pus.is_empty() && numa_memory.is_empty() && gpus.is_empty() && gres.is_empty() {
                continue;
            }
            take.push(NodeAllocation {
                gres,
                licenses: Default::default(),
                node_id: node.id,
                node: node.name.clone(),
                cores: 0,
                mems: CpuSet::new(),
                memory_bytes: numa_memory.iter().map(|s| s.bytes).sum(),
                numa_memory,
                cpus: pus,
                exclusive_numa: CpuSet::new(),
                subnodes: vec![],
                binding: vec![],
                ranks: vec![],
                gpus,
            });
        }
        out.claim(&take);
        // Members use the reservation's licenses only: those it holds less those its running
        // members hold, as far as they are free (a job running past its walltime may hold some).
        let mut keep = licenses_of(within);
        for a in used {
            sub_counts(&mut keep, &licenses_of(a));
        }
        let beyond: Counts = out
            .licenses
            .total
            .keys()
            .map(|name| {
                let free = out.licenses.free(name);
                (name.clone(), free.saturating_sub(keep.get(name).copied().unwrap_or(0)))
            })
            .filter(|&(_, n)| n > 0)
            .collect();
        out.licenses.claim(&beyond);
        out
    }

    fn unheld(window: &Allocation, held: &[&Allocation]) -> Allocation {
        let mut out = window.clone();
        let mut held_licenses = Counts::new();
        for na in held.iter().flat_map(|a| a.iter()) {
            add_counts(&mut held_licenses, &na.licenses);
            if let Some(part) = out.iter_mut().find(|p| p.node_id == na.node_id) {
                sub_counts(&mut part.gres, &na.gres);
            }
        }
        // The window's licenses are on its parts (the first, as a job's): take the members'
        // off where they are.
        for part in out.iter_mut() {
            for (name, n) in part.licenses.iter_mut() {
                let h = held_licenses.entry(name.clone()).or_insert(0);
                let off = (*n).min(*h);
                *n -= off;
                *h -= off;
            }
            part.licenses.retain(|_, n| *n > 0);
        }
        out
    }
}

/// Add `b`'s counts to `a`'s.
fn add_counts(a: &mut Counts, b: &Counts) {
    for (name, &n) in b {
        let c = a.entry(name.clone()).or_insert(0);
        *c = c.saturating_add(n);
    }
}

/// Take `b`'s counts off `a`'s (none below 0; names at 0 removed).
fn sub_counts(a: &mut Counts, b: &Counts) {
    for (name, &n) in b {
        if let Some(c) = a.get_mut(name) {
            *c = c.saturating_sub(n);
        }
    }
    a.retain(|_, n| *n > 0);
}

/// The licenses an allocation holds (on any of its parts).
fn licenses_of(alloc: &Allocation) -> Counts {
    let mut out = Counts::new();
    for na in alloc {
        add_counts(&mut out, &na.licenses);
    }
    out
}

/// The memory of `na` per NUMA node (index in the node's topology), as a claim takes it.
fn numa_shares(node: &crate::node::NodeCapacity, na: &NodeAllocation) -> Vec<(usize, u64)> {
    let topo = &node.topology;
    if !na.numa_memory.is_empty() {
        return na.numa_memory.iter().filter_map(|s| Some((topo.numa_by_os(s.numa)?, s.bytes))).collect();
    }
    let idx: Vec<usize> = na.mems.iter().filter_map(|os| topo.numa_by_os(os)).collect();
    let Some(n) = u64::try_from(idx.len()).ok().filter(|&n| n > 0) else { return vec![] };
    let (each, extra) = (na.memory_bytes / n, na.memory_bytes % n);
    idx.iter().enumerate().map(|(k, &i)| (i, each + if k == 0 { extra } else { 0 })).collect()
}

/// The windows jobs that are not members keep off: those not over, by start, as reservations
/// of a pass's book (their job id means nothing).
pub(super) struct Windows<A> {
    pub book: Vec<Reservation<A>>,
    names: Vec<String>,
}

impl<A: Clone> Windows<A> {
    pub fn none() -> Self {
        Windows { book: vec![], names: vec![] }
    }

    fn new(advance: &[AdvanceReservation<A>], now: f64) -> Self {
        let mut live: Vec<&AdvanceReservation<A>> = advance.iter().filter(|r| r.end > now && r.end > r.start).collect();
        live.sort_by(|a, b| a.start.total_cmp(&b.start));
        Windows {
            book: live
                .iter()
                .map(|r| Reservation { id: JobId(u64::MAX), start: r.start, end: r.end, alloc: r.alloc.clone() })
                .collect(),
            names: live.iter().map(|r| r.id.clone()).collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.book.is_empty()
    }

    /// How many windows a job starting at `now` for `w` seconds runs into: the first ones by
    /// start (every window ends after now).
    pub fn layer(&self, now: f64, w: f64) -> usize {
        if self.book.is_empty() {
            return 0;
        }
        self.book.partition_point(|r| r.start < now + w || r.start <= now)
    }

    fn first(&self, k: usize) -> Vec<&A> {
        self.book[..k].iter().map(|r| &r.alloc).collect()
    }

    /// The reason of a job that fits now but not beside the first `k` windows.
    fn reason(&self, k: usize) -> PendingReason {
        PendingReason::Resources(Wanting::HeldForAdvance(self.names[..k].to_vec()))
    }
}

/// The memos of a pass with windows: one per number of windows a job runs into (the first
/// without any, as a pass without windows has).
pub(super) struct Layers {
    memos: Vec<Memo>,
    /// [`Layers::why_not_now`]'s answers, with the number of starts they were found after.
    reasons: HashMap<(RequestKey, usize), (usize, Option<PendingReason>)>,
}

impl Layers {
    pub fn new<A>(windows: &Windows<A>) -> Self {
        Layers { memos: (0..=windows.book.len()).map(|_| Memo::default()).collect(), reasons: HashMap::default() }
    }

    /// For a job that cannot start now although nothing says it does not fit now: whether the
    /// first `k` windows are why (it fits `machine`, the pass's state now, without them but not
    /// beside them). Remembered for identical requests until the next start (`starts` counts
    /// them): it only explains a wait.
    pub fn why_not_now<M: Machine>(
        &mut self,
        windows: &Windows<M::Alloc>,
        machine: &mut Tracked<M>,
        k: usize,
        req: &JobRequest,
        starts: usize,
    ) -> Option<PendingReason> {
        if k == 0 {
            return None;
        }
        let key = (RequestKey::of(req), k);
        if let Some((at, why)) = self.reasons.get(&key) {
            if *at == starts {
                return why.clone();
            }
        }
        let why = match self.memos[k].place_beside(machine, NOW, &windows.first(k), req) {
            Fit::Now(_) => None,
            _ => match self.memos[0].place(machine, NOW, req) {
                Fit::Now(_) => Some(windows.reason(k)),
                _ => None,
            },
        };
        self.reasons.insert(key, (starts, why.clone()));
        why
    }

    /// Why a job that cannot start (beside what is kept for earlier jobs) waits when nothing
    /// counted says it is busy: the windows ([`Layers::why_not_now`]), what it misses on what is
    /// free now (a bound job's cores in use, memory), or, when it fits what is free now,
    /// priority: what it would take is kept for jobs before it. Remembered as `why_not_now`.
    pub fn why_waiting<M: Machine>(
        &mut self,
        windows: &Windows<M::Alloc>,
        machine: &mut Tracked<M>,
        k: usize,
        req: &JobRequest,
        starts: usize,
    ) -> PendingReason {
        if let Some(why) = self.why_not_now(windows, machine, k, req, starts) {
            return why;
        }
        // `usize::MAX` windows: this answer's slot beside `why_not_now`'s.
        let key = (RequestKey::of(req), usize::MAX);
        if let Some((at, Some(why))) = self.reasons.get(&key) {
            if *at == starts {
                return why.clone();
            }
        }
        let why = match self.memos[0].place(machine, NOW, req) {
            Fit::Busy(what) => PendingReason::Resources(Wanting::Busy(what)),
            Fit::Never(why) => PendingReason::NoSuitableNodes(Unsuitable::Never(why)),
            Fit::Now(_) => PendingReason::Priority,
        };
        self.reasons.insert(key, (starts, Some(why.clone())));
        why
    }

    /// The memo of placements beside no window.
    pub fn base(&mut self) -> &mut Memo {
        &mut self.memos[0]
    }

    /// Place `req` on `machine` (the pass's state `state`) beside the first `k` windows.
    pub fn place<M: Machine>(
        &mut self,
        windows: &Windows<M::Alloc>,
        machine: &mut Tracked<M>,
        state: usize,
        k: usize,
        req: &JobRequest,
    ) -> Fit<M::Alloc> {
        if k == 0 {
            self.memos[0].place(machine, state, req)
        } else {
            self.memos[k].place_beside(machine, state, &windows.first(k), req)
        }
    }

    /// Why a job busy beside the first `k` windows waits: what it misses now (`what`), or the
    /// windows when it fits now without them.
    pub fn busy_reason<M: Machine>(
        &mut self,
        windows: &Windows<M::Alloc>,
        machine: &mut Tracked<M>,
        state: usize,
        k: usize,
        req: &JobRequest,
        what: Busy,
    ) -> PendingReason {
        if k > 0 && matches!(self.memos[0].place(machine, state, req), Fit::Now(_)) {
            windows.reason(k)
        } else {
            PendingReason::Resources(Wanting::Busy(what))
        }
    }
}

/// [`plan_with_advance`] keeping a conservative plan for the next pass
/// ([`plan_keeping`](super::plan_keeping)) while no advance reservation is in force (with one,
/// every pass plans from scratch).
pub fn plan_with_advance_keeping<M: Confine>(
    input: &PassInput<M>,
    advance: &[AdvanceReservation<M::Alloc>],
    limits: &PassLimits,
    kept: &mut Option<super::KeptPlan<M>>,
) -> (PassOutput<M::Alloc>, Vec<Reservation<M::Alloc>>) {
    if advance.is_empty() {
        return super::plan_keeping(input, limits, kept);
    }
    *kept = None;
    plan_with_advance(input, advance, limits)
}

/// [`plan_with_reservations`](super::plan_with_reservations) with advance reservations: their
/// members run only inside them, every other job keeps off them while it would run (see the
/// module's documentation). The reservations returned are the pass's (EASY's head or the
/// conservative ones), not the advance ones. Without advance reservations it is exactly
/// `plan_with_reservations`.
pub fn plan_with_advance<M: Confine>(
    input: &PassInput<M>,
    advance: &[AdvanceReservation<M::Alloc>],
    limits: &PassLimits,
) -> (PassOutput<M::Alloc>, Vec<Reservation<M::Alloc>>) {
    if advance.is_empty() {
        return super::plan_with_reservations(input, limits);
    }
    let now = input.now;
    let mut member_of: HashMap<JobId, usize> = HashMap::default();
    for (i, r) in advance.iter().enumerate() {
        for id in &r.members {
            member_of.entry(*id).or_insert(i);
        }
    }
    let members = plan_members(input, advance, &member_of);
    // The others, on the machine with the members' starts claimed, those held until they end.
    let mut machine = input.machine.clone();
    let mut running = input.running.to_vec();
    for (id, alloc, end) in &members.starts {
        machine.claim(alloc);
        running.push(RunningJob { id: *id, alloc: alloc.clone(), end: *end });
    }
    let queue: Vec<super::QueuedJob> = input.queue.iter().filter(|j| !member_of.contains_key(&j.id)).cloned().collect();
    let others = PassInput { machine: &machine, running: &running, queue: &queue, now };
    // What each window keeps from the others: less the counts its running members hold.
    let kept: Vec<AdvanceReservation<M::Alloc>> = advance
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let held: Vec<&M::Alloc> =
                running.iter().filter(|j| member_of.get(&j.id) == Some(&i)).map(|j| &j.alloc).collect();
            AdvanceReservation { alloc: M::unheld(&r.alloc, &held), ..r.clone() }
        })
        .collect();
    let (mut out, reservations) =
        super::plan_beside(&others, limits, &Windows::new(&kept, now), super::pass::Detail::Full);
    let mut starts: Vec<(JobId, M::Alloc)> = members.starts.into_iter().map(|(id, a, _)| (id, a)).collect();
    starts.append(&mut out.starts);
    out.starts = starts;
    let mut waiting = members.waiting;
    waiting.append(&mut out.waiting);
    out.waiting = waiting;
    (out, reservations)
}

/// What the members' part of a pass decided: starts with their expected ends, and waits.
struct Members<A> {
    starts: Vec<(JobId, A, f64)>,
    waiting: Vec<Waiting>,
}

fn plan_members<M: Confine>(
    input: &PassInput<M>,
    advance: &[AdvanceReservation<M::Alloc>],
    member_of: &HashMap<JobId, usize>,
) -> Members<M::Alloc> {
    let now = input.now;
    let mut out = Members { starts: vec![], waiting: vec![] };
    // Members started here, claimed on the machine the next reservations are confined from.
    let mut machine = input.machine.clone();
    let mut timeline: Option<Timeline<M>> = None;
    for (i, r) in advance.iter().enumerate() {
        let queued: Vec<&super::QueuedJob> = input.queue.iter().filter(|j| member_of.get(&j.id) == Some(&i)).collect();
        if queued.is_empty() {
            continue;
        }
        let ended = r.end <= now || r.end <= r.start;
        let open = r.start <= now && !ended;
        // Running members hold part of the reservation (until they end, for a future window).
        let at = if open { now } else { r.start };
        let used: Vec<&M::Alloc> = input
            .running
            .iter()
            .filter(|j| r.members.contains(&j.id) && (open || j.end > at))
            .map(|j| &j.alloc)
            .collect();
        let mut confined = if ended {
            None
        } else if open {
            Some(machine.confine(&r.alloc, &used))
        } else {
            let t = timeline
                .get_or_insert_with(|| Timeline::new(&Tracked::new(input.machine.clone()), input.running, &[], now));
            t.move_to(r.start);
            Some(t.scratch.machine.confine(&r.alloc, &used))
        };
        for job in queued {
            let w = super::easy::walltime(job);
            let (reason, expected) = match confined.as_mut() {
                _ if job.held => (PendingReason::Held, None),
                None => (PendingReason::NoSuitableNodes(Unsuitable::AdvanceEnded(r.id.clone())), None),
                Some(_) if at + w > r.end => {
                    (PendingReason::NoSuitableNodes(Unsuitable::AdvanceTooShort(r.id.clone())), None)
                }
                Some(confined) => match (confined.place(&job.request), open) {
                    (Fit::Now(alloc), true) => {
                        confined.claim(&alloc);
                        machine.claim(&alloc);
                        out.starts.push((job.id, alloc, now + w));
                        continue;
                    }
                    (Fit::Now(alloc), false) => {
                        // Expected at the start; what it would take is kept for the next ones.
                        confined.claim(&alloc);
                        (not_started(r), Some(r.start))
                    }
                    (Fit::Busy(_), false) => (not_started(r), None),
                    (Fit::Busy(what), true) => {
                        (PendingReason::Resources(Wanting::InAdvance { name: r.id.clone(), busy: what }), None)
                    }
                    (Fit::Never(why), _) => {
                        (PendingReason::NoSuitableNodes(Unsuitable::InAdvance { name: r.id.clone(), never: why }), None)
                    }
                },
            };
            out.waiting.push(Waiting { id: job.id, reason, expected_start: expected });
        }
    }
    out
}

/// A member waiting for its reservation's window to open.
fn not_started<A>(r: &AdvanceReservation<A>) -> PendingReason {
    PendingReason::Resources(Wanting::AdvanceNotStarted(r.id.clone()))
}

/// The machine as it will be at `at`: the running jobs that end by then gone (`machine` has
/// every running job claimed). At or before `now`, the machine as it is.
pub fn machine_at<M: Machine>(machine: &M, running: &[RunningJob<M::Alloc>], at: f64, now: f64) -> M {
    if at <= now {
        return machine.clone();
    }
    let mut timeline = Timeline::new(&Tracked::new(machine.clone()), running, &[], now);
    timeline.move_to(at);
    timeline.scratch.machine
}

/// Where a new advance reservation of `req` over `[start, end)` could be: placed on the
/// machine as it will be at `start` (running jobs still there then, by their expected ends,
/// kept off) beside every advance reservation of `advance` whose window overlaps. `Busy`: not
/// free for the whole window.
pub fn place_for_window<M: Machine>(
    machine: &M,
    running: &[RunningJob<M::Alloc>],
    advance: &[AdvanceReservation<M::Alloc>],
    req: &JobRequest,
    (start, end): (f64, f64),
    now: f64,
) -> Fit<M::Alloc> {
    let mut at = machine_at(machine, running, start, now);
    let overlapping: Vec<&M::Alloc> = advance
        .iter()
        .filter(|r| r.end > start && r.end > r.start && (r.start < end || r.start <= start))
        .map(|r| &r.alloc)
        .collect();
    at.place_with_claimed(&overlapping, req)
}
