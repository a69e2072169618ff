//! Invariants of a pass on random clusters and queues: no PU or memory is booked twice, EASY
//! never delays the head's reservation, conservative backfill never delays any reservation.

use super::*;
use crate::job::{Allocation, Shape};
use crate::placement::JobRequest;
use crate::sched::testkit::{ClusterBuilder, G};
use crate::sched::{place, ClusterState, Placement};
use crate::{CpuSet, JobId};
use proptest::prelude::*;
use std::collections::HashMap;

/// A random request: (per node?, count, cores, memory in half GiB, count PUs?).
type Ask = (bool, u32, u32, u64, bool);

pub(super) fn request((per_node, count, cores, mem, threads): Ask) -> JobRequest {
    let shape = if per_node {
        Shape::PerNode { nodes: count.clamp(1, 2), cores_per_node: cores }
    } else {
        Shape::Total { cores: cores * count, chunk: 1 }
    };
    JobRequest { threads, ..JobRequest::simple(shape, mem * G / 2) }
}

pub(super) fn ask() -> impl Strategy<Value = Ask> {
    (any::<bool>(), 1u32..3, 1u32..5, 0u64..3, proptest::bool::weighted(0.2))
}

/// A cluster with running jobs placed on it (each with an end, some overdue), and a queue.
pub(super) struct Scenario {
    pub cluster: ClusterState,
    pub running: Vec<RunningJob<Allocation>>,
    pub queue: Vec<QueuedJob>,
    /// Mostly enough for every job; sometimes 1 or 2, to go past the limit.
    pub max_reservations: usize,
}

/// Compact, for failure reports: the nodes, what runs where until when, the queue.
impl std::fmt::Debug for Scenario {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = &self.cluster.nodes()[0].topology;
        let (nodes, cores, pus) = (self.cluster.nodes().len(), n.core_count(), n.pu_count());
        writeln!(
            f,
            "{nodes} nodes of {cores} cores ({pus} PUs), {}G; {} reservations",
            n.memory_bytes() / G,
            self.max_reservations
        )?;
        for r in &self.running {
            let mem: u64 = r.alloc.iter().map(|na| na.memory_bytes).sum();
            writeln!(
                f,
                "  running {} until {}: {} ({mem} B)",
                r.id,
                r.end,
                crate::sched::testkit::alloc_text(&r.alloc)
            )?;
        }
        for j in &self.queue {
            writeln!(
                f,
                "  queued {} {:?} {:?} w={} held={}",
                j.id, j.request.shape, j.request.mem, j.walltime, j.held
            )?;
        }
        Ok(())
    }
}

pub(super) fn scenario() -> impl Strategy<Value = Scenario> {
    let nodes = (1u32..4, 1u32..3, 2u32..5, 1u32..3);
    let running = proptest::collection::vec((ask(), -20i32..200), 0..10);
    let queue = proptest::collection::vec((ask(), 1u32..300, proptest::bool::weighted(0.1)), 1..14);
    (nodes, running, queue, 1usize..4).prop_map(|((count, packages, cores, pus), running_asks, queue_asks, limit)| {
        let mut cluster = ClusterBuilder::new().smt_nodes(count, packages, cores, pus, 4 * G).build();
        let mut running = vec![];
        for (i, (a, end)) in running_asks.into_iter().enumerate() {
            if let Placement::Now(alloc) = place(&cluster, &request(a)) {
                cluster.claim(&alloc);
                running.push(RunningJob { id: JobId(1000 + i as u64), alloc, end: end as f64 });
            }
        }
        let queue = queue_asks
            .into_iter()
            .enumerate()
            .map(|(i, (a, w, held))| QueuedJob {
                id: JobId(i as u64 + 1),
                request: request(a),
                walltime: w as f64,
                held,
            })
            .collect();
        Scenario { cluster, running, queue, max_reservations: if limit == 3 { 50 } else { limit } }
    })
}

fn run(s: &Scenario, policy: BackfillPolicy) -> (PassOutput<Allocation>, Vec<Reservation<Allocation>>) {
    let input = PassInput { machine: &s.cluster, running: &s.running, queue: &s.queue, now: 0.0 };
    plan_with_reservations(&input, &PassLimits { policy, max_reservations: s.max_reservations, deadline: None })
}

/// The cluster with nothing running: the running jobs released.
pub(super) fn idle(s: &Scenario) -> ClusterState {
    let mut c = s.cluster.clone();
    for r in &s.running {
        c.release(&r.alloc);
    }
    c
}

/// Every allocation that holds resources after the pass, over `[start, end)`: running jobs and
/// the pass's starts from now (0), then its reservations.
fn schedule(
    s: &Scenario,
    out: &PassOutput<Allocation>,
    booked: &[Reservation<Allocation>],
) -> Vec<(f64, f64, Allocation)> {
    let walltime: HashMap<JobId, f64> = s.queue.iter().map(|j| (j.id, j.walltime)).collect();
    let running = s.running.iter().map(|r| (0.0, r.end.max(0.0), r.alloc.clone()));
    let started = out.starts.iter().map(|(id, a)| (0.0, walltime[id], a.clone()));
    let reserved = booked.iter().map(|r| (r.start, r.end, r.alloc.clone()));
    running.chain(started).chain(reserved).collect()
}

/// No PU is held twice and no node's memory is exceeded at any moment of `schedule`.
pub(super) fn consistent(s: &Scenario, schedule: &[(f64, f64, Allocation)]) -> Result<(), String> {
    for &(t, _, _) in schedule {
        let mut used: HashMap<u32, CpuSet> = HashMap::new();
        let mut mem: HashMap<u32, u64> = HashMap::new();
        let active = schedule.iter().filter(|(start, end, _)| *start <= t && *end > t);
        for na in active.flat_map(|(_, _, a)| a) {
            let pus = used.entry(na.node_id.0).or_default();
            if pus.intersects(&na.cpus) {
                return Err(format!("at {t}: PUs {} of {} held twice", na.cpus, na.node));
            }
            pus.union_with(&na.cpus);
            *mem.entry(na.node_id.0).or_default() += na.memory_bytes;
        }
        for n in s.cluster.nodes() {
            if mem.get(&n.id.0).copied().unwrap_or(0) > n.topology.memory_bytes() {
                return Err(format!("at {t}: memory of {} exceeded", n.name));
            }
        }
    }
    Ok(())
}

/// The earliest end time (or now) after which `req` fits, every end checked in turn.
fn first_fit(s: &Scenario, holders: &[(f64, f64, Allocation)], req: &JobRequest) -> Option<f64> {
    let idle = idle(s);
    let mut times: Vec<f64> = holders.iter().map(|(_, end, _)| *end).chain([0.0]).collect();
    times.sort_by(f64::total_cmp);
    times.into_iter().find(|&t| {
        let mut c = idle.clone();
        for (_, _, a) in holders.iter().filter(|(_, end, _)| *end > t) {
            c.claim(a);
        }
        matches!(place(&c, req), Placement::Now(_))
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Starts never share a PU with each other or a running job, nor exceed memory; with the
    /// reservations, the whole planned schedule never does at any moment (so a reservation is
    /// never delayed by a start: conservative for every job, EASY for the head).
    #[test]
    fn schedule_never_books_a_pu_twice(s in scenario()) {
        for policy in [BackfillPolicy::Fcfs, BackfillPolicy::Easy, BackfillPolicy::Conservative] {
            let (out, booked) = run(&s, policy);
            prop_assert_eq!(out.starts.len() + out.waiting.len(), s.queue.len());
            let plan = schedule(&s, &out, &booked);
            if let Err(e) = consistent(&s, &plan) {
                prop_assert!(false, "{:?}: {}", policy, e);
            }
            for w in &out.waiting {
                let reserved = booked.iter().find(|r| r.id == w.id).map(|r| r.start);
                prop_assert_eq!(w.expected_start, reserved);
            }
        }
    }

    /// A starts-only pass (the simulator's) starts the same jobs on the same resources, counts
    /// the same backfills, and reports no waiting job.
    #[test]
    fn starts_only_pass_starts_the_same(s in scenario()) {
        for policy in [BackfillPolicy::Fcfs, BackfillPolicy::Easy, BackfillPolicy::Conservative] {
            let (full, _) = run(&s, policy);
            let input = PassInput { machine: &s.cluster, running: &s.running, queue: &s.queue, now: 0.0 };
            let quick = plan_starts(&input, &PassLimits { policy, max_reservations: s.max_reservations, deadline: None });
            prop_assert_eq!(&quick.starts, &full.starts, "{:?}", policy);
            prop_assert_eq!(&quick.backfilled, &full.backfilled, "{:?}", policy);
            prop_assert!(quick.waiting.is_empty());
        }
    }

    /// The head's start, recomputed with every job the pass started holding its resources until
    /// its walltime ends (checking every end time, not bisecting), is never later than promised.
    #[test]
    fn easy_never_delays_the_head(s in scenario()) {
        let (out, booked) = run(&s, BackfillPolicy::Easy);
        let Some(head) = booked.first() else { return Ok(()) };
        let req = &s.queue.iter().find(|j| j.id == head.id).unwrap().request;
        let holders = schedule(&s, &out, &[]);
        let first = first_fit(&s, &holders, req);
        prop_assert!(first.is_some_and(|t| t <= head.start), "head {} promised {}, fits first at {first:?}", head.id, head.start);
    }

    /// Conservative: each reserved job, recomputed with the starts and the reservations of the
    /// jobs before it, still fits at its reserved time.
    #[test]
    fn conservative_starts_delay_no_earlier_reservation(s in scenario()) {
        let (out, booked) = run(&s, BackfillPolicy::Conservative);
        let holders = schedule(&s, &out, &[]);
        for (k, r) in booked.iter().enumerate() {
            let mut c = idle(&s);
            let overlapping = booked[..k].iter().filter(|e| e.end > r.start && e.start < r.end.max(r.start + 1e-9));
            for a in holders.iter().filter(|(_, end, _)| *end > r.start).map(|h| &h.2).chain(overlapping.map(|e| &e.alloc)) {
                c.claim(a);
            }
            let req = &s.queue.iter().find(|j| j.id == r.id).unwrap().request;
            prop_assert!(matches!(place(&c, req), Placement::Now(_)), "job {} no longer fits at {}", r.id, r.start);
        }
    }
}

/// A scenario with advance reservations made as the controller makes them (placed for their
/// window beside the running jobs that will still run then and the earlier reservations), and
/// some queued jobs their members.
fn advance_scenario() -> impl Strategy<Value = (Scenario, Vec<AdvanceReservation<Allocation>>)> {
    let members = proptest::collection::vec(proptest::bool::weighted(0.3), 14);
    let resv = proptest::collection::vec((ask(), -50i32..200, 1i32..200, members), 1..4);
    (scenario(), resv).prop_map(|(s, asks)| {
        let mut advance: Vec<AdvanceReservation<Allocation>> = vec![];
        let mut taken = std::collections::HashSet::new();
        for (i, (a, start, len, mask)) in asks.into_iter().enumerate() {
            let (start, end) = (start as f64, (start + len) as f64);
            if end <= 0.0 {
                continue;
            }
            if let Fit::Now(alloc) = place_for_window(&s.cluster, &s.running, &advance, &request(a), (start, end), 0.0)
            {
                let members =
                    s.queue.iter().zip(&mask).filter(|(j, &m)| m && taken.insert(j.id)).map(|(j, _)| j.id).collect();
                advance.push(AdvanceReservation { id: format!("r{i}"), alloc, start, end, members });
            }
        }
        (s, advance)
    })
}

/// PUs per node of an allocation.
fn pus(alloc: &Allocation) -> HashMap<u32, CpuSet> {
    let mut m: HashMap<u32, CpuSet> = HashMap::new();
    for na in alloc {
        m.entry(na.node_id.0).or_default().union_with(&na.cpus);
    }
    m
}

fn disjoint(a: &Allocation, b: &Allocation) -> bool {
    let b = pus(b);
    pus(a).iter().all(|(n, c)| b.get(n).is_none_or(|d| !c.intersects(d)))
}

fn inside(a: &Allocation, within: &Allocation) -> bool {
    let w = pus(within);
    pus(a).iter().all(|(n, c)| w.get(n).is_some_and(|d| c.is_subset_of(d)))
}

/// Whether a job over `[at, at + w)` runs into `r`'s window (a zero-length job occupies its
/// start instant).
fn runs_into(r: &AdvanceReservation<Allocation>, at: f64, w: f64) -> bool {
    r.end > at && (r.start < at + w || r.start <= at)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Advance reservations: no job that is not a member holds (or is promised, by the EASY
    /// head's or a conservative reservation) a reserved PU during the window; with the windows
    /// as holders, the whole schedule books no PU twice and exceeds no memory. Members start
    /// only inside their window, end by its end, on its PUs, and together take no more PUs or
    /// memory than it holds.
    #[test]
    fn advance_reservations_are_kept(sa in advance_scenario()) {
        let (s, advance) = sa;
        let walltime: HashMap<JobId, f64> = s.queue.iter().map(|j| (j.id, j.walltime.max(0.0))).collect();
        let member: HashMap<JobId, &AdvanceReservation<Allocation>> =
            advance.iter().flat_map(|r| r.members.iter().map(move |m| (*m, r))).collect();
        for policy in [BackfillPolicy::Fcfs, BackfillPolicy::Easy, BackfillPolicy::Conservative] {
            let input = PassInput { machine: &s.cluster, running: &s.running, queue: &s.queue, now: 0.0 };
            let limits = PassLimits { policy, max_reservations: s.max_reservations, deadline: None };
            let (out, booked) = plan_with_advance(&input, &advance, &limits);
            let mut seen: Vec<JobId> = out.starts.iter().map(|(id, _)| *id).chain(out.waiting.iter().map(|w| w.id)).collect();
            seen.sort();
            let mut ids: Vec<JobId> = s.queue.iter().map(|j| j.id).collect();
            ids.sort();
            prop_assert_eq!(seen, ids, "{:?}: every job once", policy);
            let mut used: HashMap<&str, Vec<&Allocation>> = HashMap::new();
            for (id, alloc) in &out.starts {
                let w = walltime[id];
                match member.get(id) {
                    Some(r) => {
                        prop_assert!(r.start <= 0.0 && w <= r.end, "{:?}: member {} started outside {}", policy, id, r.id);
                        prop_assert!(inside(alloc, &r.alloc), "{:?}: member {} off {}'s PUs", policy, id, r.id);
                        used.entry(&r.id).or_default().push(alloc);
                    }
                    None => {
                        for r in advance.iter().filter(|r| runs_into(r, 0.0, w)) {
                            prop_assert!(disjoint(alloc, &r.alloc), "{:?}: job {} runs on {}'s PUs", policy, id, r.id);
                        }
                    }
                }
            }
            for b in &booked {
                prop_assert!(!member.contains_key(&b.id));
                for r in advance.iter().filter(|r| runs_into(r, b.start, b.end - b.start)) {
                    prop_assert!(disjoint(&b.alloc, &r.alloc), "{:?}: job {} promised {}'s PUs", policy, b.id, r.id);
                }
            }
            // The schedule of everyone else, with the windows holding their resources.
            let others = PassOutput {
                starts: out.starts.iter().filter(|(id, _)| !member.contains_key(id)).cloned().collect(),
                waiting: vec![],
                backfilled: vec![],
            };
            let mut plan = schedule(&s, &others, &booked);
            plan.extend(advance.iter().map(|r| (r.start, r.end, r.alloc.clone())));
            if let Err(e) = consistent(&s, &plan) {
                prop_assert!(false, "{:?}: {}", policy, e);
            }
            // Members inside each reservation: no PU twice, no more memory than it holds.
            for r in &advance {
                let mine = used.remove(r.id.as_str()).unwrap_or_default();
                let mut taken: HashMap<u32, CpuSet> = HashMap::new();
                let mut mem: HashMap<u32, u64> = HashMap::new();
                for na in mine.iter().flat_map(|a| a.iter()) {
                    let t = taken.entry(na.node_id.0).or_default();
                    prop_assert!(!t.intersects(&na.cpus), "{:?}: members of {} share PUs", policy, r.id);
                    t.union_with(&na.cpus);
                    *mem.entry(na.node_id.0).or_default() += na.memory_bytes;
                }
                for na in &r.alloc {
                    prop_assert!(mem.get(&na.node_id.0).copied().unwrap_or(0) <= na.memory_bytes,
                        "{:?}: members of {} take more memory than it holds on {}", policy, r.id, na.node);
                }
            }
        }
    }

    /// Without advance reservations, `plan_with_advance` is the plain pass.
    #[test]
    fn no_advance_reservation_changes_nothing(s in scenario()) {
        for policy in [BackfillPolicy::Fcfs, BackfillPolicy::Easy, BackfillPolicy::Conservative] {
            let input = PassInput { machine: &s.cluster, running: &s.running, queue: &s.queue, now: 0.0 };
            let limits = PassLimits { policy, max_reservations: s.max_reservations, deadline: None };
            let (a, ra) = plan_with_advance(&input, &[], &limits);
            let (b, rb) = plan_with_reservations(&input, &limits);
            prop_assert_eq!(crate::sched::testkit::summary(&a), crate::sched::testkit::summary(&b));
            prop_assert_eq!(ra.len(), rb.len());
        }
    }
}
