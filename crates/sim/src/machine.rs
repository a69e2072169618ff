//! The machines a trace is replayed on, as [`Machine`]s the scheduler's `plan` drives.
//!
//! - [`PoolMachine`]: N identical nodes of C cores, cores only (no memory, no topology): the
//!   default for a trace is its `MaxProcs` single-core nodes. A pass on it costs little
//!   beyond the policy itself.
//! - [`ClusterMachine`]: N nodes of a berth [`Topology`] under berth's real topology-aware
//!   placement: the controller's [`ClusterState`] machine.

mod bits;

use crate::error::SimError;
use berth_core::job::{Allocation, Shape};
use berth_core::node::NodeCapacity;
use berth_core::placement::reason::{Busy, Never};
use berth_core::placement::{JobRequest, PlacementPolicy};
use berth_core::sched::backfill::{Fit, Machine};
use berth_core::sched::counted::CountedMachine;
use berth_core::sched::round::RoundMachine;
use berth_core::sched::ClusterState;
use berth_core::topology::Topology;
use berth_core::NodeId;
use bits::Bits;
use std::sync::Arc;

/// Memory per NUMA node of simulated topologies: traces carry no usable memory figures, so
/// jobs ask for none and this only has to be non-zero.
const SIM_MEM_PER_NUMA: u64 = 64 << 30;

/// Most cores a pool models (its free set is a bitmap, copied by every pass).
const MAX_POOL_CORES: u64 = 1 << 24;

/// N identical nodes of `cores_per_node` cores each; core `i` is core `i % C` of node `i / C`.
///
/// Cores are tracked one by one (a bitmap), not only counted: a pass claims a reservation's
/// cores, found on the machine as it will be later, on the machine as it is now, where some of
/// them are still busy; claiming is a set union, as on berth's real nodes. Placement is first
/// fit by core index.
#[derive(Debug, Clone)]
pub struct PoolMachine {
    nodes: u32,
    cores_per_node: u32,
    free: Bits,
    free_total: u64,
}

/// Cores taken from a [`PoolMachine`], as runs `(first core, count)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolAlloc {
    pub cpus: u64,
    pub runs: Vec<(u32, u32)>,
}

impl PoolMachine {
    pub fn new(nodes: u64, cores_per_node: u32) -> Result<Self, SimError> {
        if nodes == 0 || cores_per_node == 0 {
            return Err(SimError::BadOption("a machine needs at least one node of at least one core".into()));
        }
        let total = nodes.saturating_mul(cores_per_node as u64);
        if total > MAX_POOL_CORES {
            return Err(SimError::BadOption(format!(
                "{total} cores are more than the simulator models ({MAX_POOL_CORES}); pass a smaller --nodes"
            )));
        }
        Ok(PoolMachine { nodes: nodes as u32, cores_per_node, free: Bits::full(total), free_total: total })
    }

    pub fn total_cpus(&self) -> u64 {
        self.nodes as u64 * self.cores_per_node as u64
    }

    /// `units` pieces of `size` cores, each within one node (at most one per node if
    /// `one_per_node`), first fit.
    fn take(&self, units: u64, size: u32, one_per_node: bool) -> Option<PoolAlloc> {
        let c = self.cores_per_node;
        let mut runs = vec![];
        let mut left = units;
        for node in 0..self.nodes {
            if left == 0 {
                break;
            }
            let first = node * c;
            let free = self.free.count_range(first, c);
            let pieces = if one_per_node { u64::from(free >= size) } else { (free / size) as u64 }.min(left);
            if pieces > 0 {
                self.free.take_first(first, first + c, pieces as u32 * size, &mut runs);
                left -= pieces;
            }
        }
        (left == 0).then(|| PoolAlloc { cpus: units * size as u64, runs })
    }

    /// [`PoolMachine::take`] using the cores of `pref` (free ones) first: whole pieces from
    /// them, node by node, then the other pieces from the other nodes (at most one per node if
    /// `one_per_node`), each again from `pref`'s cores first. A node holds as many pieces
    /// either way, so this fits exactly when `take` does.
    fn take_preferring(&self, mut pref: Bits, units: u64, size: u32, one_per_node: bool) -> Option<PoolAlloc> {
        let c = self.cores_per_node;
        let mut avail = self.free.clone();
        let mut runs = vec![];
        let mut left = units;
        let mut used = vec![false; if one_per_node { self.nodes as usize } else { 0 }];
        for node in 0..self.nodes {
            let first = node * c;
            let have = pref.count_range(first, c);
            let pieces = if one_per_node { u64::from(have >= size) } else { (have / size) as u64 }.min(left);
            if pieces > 0 {
                take_both(&mut pref, &mut avail, true, (first, first + c), pieces as u32 * size, &mut runs);
                left -= pieces;
                if one_per_node {
                    used[node as usize] = true;
                }
            }
        }
        for node in 0..self.nodes {
            if left == 0 {
                break;
            }
            let first = node * c;
            let free = avail.count_range(first, c);
            let pieces =
                if one_per_node { u64::from(free >= size && !used[node as usize]) } else { (free / size) as u64 };
            let want = pieces.min(left) as u32 * size;
            if want > 0 {
                let got = take_both(&mut pref, &mut avail, true, (first, first + c), want, &mut runs);
                take_both(&mut pref, &mut avail, false, (first, first + c), want - got, &mut runs);
                left -= pieces.min(left);
            }
        }
        (left == 0).then(|| PoolAlloc { cpus: units * size as u64, runs })
    }
}

/// Take the first `want` cores in `range` of `pref` (if `from_pref`) or of `avail`, off both
/// sets, appending their runs; returns how many were found.
fn take_both(
    pref: &mut Bits,
    avail: &mut Bits,
    from_pref: bool,
    range: (u32, u32),
    want: u32,
    runs: &mut Vec<(u32, u32)>,
) -> u32 {
    if want == 0 {
        return 0;
    }
    let mut got = vec![];
    let n = if from_pref {
        pref.take_first(range.0, range.1, want, &mut got)
    } else {
        avail.take_first(range.0, range.1, want, &mut got)
    };
    for &(start, len) in &got {
        pref.clear_range(start, len);
        avail.clear_range(start, len);
    }
    runs.extend(got);
    n
}

impl Machine for PoolMachine {
    type Alloc = PoolAlloc;

    fn place(&self, req: &JobRequest) -> Fit<PoolAlloc> {
        let (nodes, c) = (self.nodes as u64, self.cores_per_node);
        let (units, size, one_per_node) = pieces(req);
        let capacity = if one_per_node { nodes } else { nodes * (c / size) as u64 };
        if size > c || units > capacity {
            return Fit::Never(Never::Cores { cores: units * size as u64, nodes, per_node: c });
        }
        let cpus = units * size as u64;
        if cpus > self.free_total {
            // The reason is never shown by the simulator: no allocation on this hot path.
            return Fit::Busy(Busy::Unstated);
        }
        if size == 1 && !one_per_node {
            let mut runs = vec![];
            let got = self.free.take_first(0, self.total_cpus() as u32, cpus as u32, &mut runs);
            debug_assert_eq!(got as u64, cpus, "free count and free set disagree");
            return Fit::Now(PoolAlloc { cpus, runs });
        }
        match self.take(units, size, one_per_node) {
            Some(alloc) => Fit::Now(alloc),
            None => Fit::Busy(Busy::Unstated),
        }
    }

    fn claim(&mut self, alloc: &PoolAlloc) {
        for &(start, len) in &alloc.runs {
            self.free_total -= self.free.clear_range(start, len) as u64;
        }
    }

    fn release(&mut self, alloc: &PoolAlloc) {
        for &(start, len) in &alloc.runs {
            self.free_total += self.free.set_range(start, len) as u64;
        }
    }

    fn free_cpus(&self) -> u64 {
        self.free_total
    }

    fn place_preferring(&self, prefer: &[&PoolAlloc], req: &JobRequest) -> Fit<PoolAlloc> {
        let fit = self.place(req);
        if prefer.is_empty() || !matches!(fit, Fit::Now(_)) {
            return fit;
        }
        let mut pref = Bits::empty(self.total_cpus());
        for &(start, len) in prefer.iter().flat_map(|a| a.runs.iter()) {
            pref.set_range(start, len);
        }
        pref.and_with(&self.free);
        let (units, size, one_per_node) = pieces(req);
        if size == 1 && !one_per_node {
            // Cores anywhere: the first preferred ones, then the first others (as `place`).
            let (mut avail, mut runs) = (self.free.clone(), vec![]);
            let all = (0, self.total_cpus() as u32);
            let got = take_both(&mut pref, &mut avail, true, all, units as u32, &mut runs);
            take_both(&mut pref, &mut avail, false, all, units as u32 - got, &mut runs);
            return Fit::Now(PoolAlloc { cpus: units, runs });
        }
        self.take_preferring(pref, units, size, one_per_node).map_or(fit, Fit::Now)
    }
}

/// A request as the pool sees it: (pieces, cores per piece, at most one piece per node).
fn pieces(req: &JobRequest) -> (u64, u32, bool) {
    match req.shape {
        Shape::Total { cores, chunk } => {
            let chunk = chunk.max(1);
            ((cores as u64).div_ceil(chunk as u64), chunk, false)
        }
        Shape::PerNode { nodes, cores_per_node } => (nodes as u64, cores_per_node.max(1), true),
    }
}

/// N nodes of one topology under berth's topology-aware placement: the controller's own
/// [`ClusterState`] machine, with the free core count kept up to date instead of recounted
/// over every node (the simulator asks for it at every event time).
#[derive(Debug, Clone)]
pub struct ClusterMachine {
    pub state: ClusterState,
    free_cores: u64,
}

impl ClusterMachine {
    pub fn new(nodes: u32, topology: Topology) -> Result<Self, SimError> {
        if nodes == 0 {
            return Err(SimError::BadOption("--nodes must be at least 1".into()));
        }
        let topology = Arc::new(topology);
        let nodes: Vec<NodeCapacity> =
            (0..nodes).map(|i| NodeCapacity::new(NodeId(i), format!("n{i}"), topology.clone())).collect();
        let state = ClusterState::new(nodes, PlacementPolicy::default());
        let free_cores = state.free_cpus();
        Ok(ClusterMachine { state, free_cores })
    }

    pub fn total_cpus(&self) -> u64 {
        self.state.nodes().iter().map(|n| n.topology.core_count() as u64).sum()
    }
}

impl Machine for ClusterMachine {
    type Alloc = Allocation;

    fn place(&self, req: &JobRequest) -> Fit<Allocation> {
        self.state.place(req)
    }

    fn claim(&mut self, alloc: &Allocation) {
        self.free_cores = self.state.claim_counting(alloc, self.free_cores);
    }

    fn release(&mut self, alloc: &Allocation) {
        self.free_cores = self.state.release_counting(alloc, self.free_cores);
    }

    fn free_cpus(&self) -> u64 {
        self.free_cores
    }

    /// Placement's own words, as the controller's machine gives them (a job the free count
    /// rejects reads as one placed, in the simulator as in the controller).
    fn busy_by_count(&self, req: &JobRequest, need: u64, free: u64) -> Busy {
        Machine::busy_by_count(&self.state, req, need, free)
    }

    fn claim_counting(&mut self, alloc: &Allocation, _free_before: u64) -> u64 {
        self.claim(alloc);
        self.free_cores
    }

    fn release_counting(&mut self, alloc: &Allocation, _free_before: u64) -> u64 {
        self.release(alloc);
        self.free_cores
    }

    fn place_with_claimed(&mut self, extra: &[&Allocation], req: &JobRequest) -> Fit<Allocation> {
        self.state.place_with_claimed(extra, req)
    }

    fn place_preferring(&self, prefer: &[&Allocation], req: &JobRequest) -> Fit<Allocation> {
        self.state.place_preferring(prefer, req)
    }
}

/// A pool has no topology: no preemption, no resumes.
impl RoundMachine for PoolMachine {}

/// Single-core nodes: counts decide (every request of the simulator is "N cores anywhere"), so
/// conservative backfill plans by counts (core's `sched::counted`).
impl CountedMachine for PoolMachine {
    fn counts_suffice(&self) -> bool {
        self.cores_per_node == 1
    }
    fn cpus_held(alloc: &PoolAlloc) -> u64 {
        alloc.cpus
    }
}

impl RoundMachine for ClusterMachine {
    fn cluster(&self) -> Option<&ClusterState> {
        Some(&self.state)
    }
    fn as_allocation(alloc: &Allocation) -> Option<&Allocation> {
        Some(alloc)
    }
    fn from_allocation(alloc: Allocation) -> Option<Allocation> {
        Some(alloc)
    }
}

/// Topology-aware: counts never decide.
impl CountedMachine for ClusterMachine {
    fn cpus_held(alloc: &Allocation) -> u64 {
        alloc.iter().map(|na| na.cores as u64).sum()
    }
}

/// A node topology from an hwloc-style synthetic string, e.g. `package:2 numa:2 core:8 pu:2`
/// (counts per parent level; levels left out count 1).
pub fn parse_topology(spec: &str) -> Result<Topology, SimError> {
    let bad = |problem: String| SimError::BadTopology { spec: spec.to_string(), problem };
    let mut counts = [None::<u32>; 4]; // package, numa, core, pu
    for token in spec.split_whitespace() {
        let (key, value) = token.split_once(':').ok_or_else(|| bad(format!("{token:?} is not LEVEL:COUNT")))?;
        let level = match key.to_ascii_lowercase().as_str() {
            "package" | "socket" => 0,
            "numa" | "numanode" | "node" => 1,
            "core" => 2,
            "pu" | "thread" => 3,
            other => return Err(bad(format!("unknown level {other:?}; levels are package, numa, core, pu"))),
        };
        let count: u32 = value.parse().ok().filter(|&c| c > 0).ok_or_else(|| bad(format!("{token:?}: bad count")))?;
        if counts[level].replace(count).is_some() {
            return Err(bad(format!("level {key:?} given twice")));
        }
    }
    if counts.iter().all(Option::is_none) {
        return Err(bad("empty".into()));
    }
    // u128: four u32 counts multiply without overflow (in u64 they wrapped, e.g. to 0 PUs).
    let [packages, numa, cores, pus] = counts.map(|c| c.unwrap_or(1) as u128);
    let total_pus = packages * numa * cores * pus;
    if total_pus > 4096 {
        return Err(bad(format!("{total_pus} PUs per node; at most 4096 are supported")));
    }
    Ok(Topology::uniform(packages as u32, numa as u32, cores as u32, pus as u32, SIM_MEM_PER_NUMA))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn total(cores: u32) -> JobRequest {
        JobRequest::simple(Shape::Total { cores, chunk: 1 }, 0)
    }

    #[test]
    fn single_core_pool_counts() {
        let mut m = PoolMachine::new(4, 1).unwrap();
        let Fit::Now(a) = m.place(&total(3)) else { panic!() };
        m.claim(&a);
        assert_eq!(m.free_cpus(), 1);
        assert_eq!(m.place(&total(2)), Fit::Busy(Busy::Unstated));
        assert!(matches!(m.place(&total(5)), Fit::Never(_)));
        m.release(&a);
        assert_eq!(m.free_cpus(), 4);
    }

    /// A pass claims a reservation found on a later state onto the state now: cores already
    /// busy stay busy once, and the count follows the set.
    #[test]
    fn claiming_busy_cores_again_is_a_union() {
        let mut now = PoolMachine::new(4, 1).unwrap();
        let Fit::Now(running) = now.place(&total(2)) else { panic!() };
        now.claim(&running);
        let mut later = now.clone();
        later.release(&running);
        let Fit::Now(reservation) = later.place(&total(3)) else { panic!() };
        assert_eq!(reservation.runs, vec![(0, 3)]);
        now.claim(&reservation);
        assert_eq!(now.free_cpus(), 1, "only core 2 was free and taken by the reservation");
    }

    #[test]
    fn multi_core_pool_tracks_nodes() {
        let mut m = PoolMachine::new(2, 4).unwrap();
        let Fit::Now(a) = m.place(&total(3)) else { panic!() };
        m.claim(&a);
        assert_eq!(a.runs, vec![(0, 3)]);
        // Two whole nodes of 2 cores: node 0 has only 1 free, so not now.
        let two_by_two = JobRequest::simple(Shape::PerNode { nodes: 2, cores_per_node: 2 }, 0);
        assert_eq!(m.place(&two_by_two), Fit::Busy(Busy::Unstated));
        let Fit::Now(b) = m.place(&total(5)) else { panic!() };
        assert_eq!(b.runs, vec![(3, 5)]);
        m.claim(&b);
        assert_eq!(m.free_cpus(), 0);
        m.release(&a);
        assert!(matches!(m.place(&two_by_two), Fit::Busy(_)));
        assert!(matches!(m.place(&JobRequest::simple(Shape::Total { cores: 4, chunk: 8 }, 0)), Fit::Never(_)));
    }

    /// `place_preferring` fits exactly when `place` does, takes only free cores, keeps the
    /// request's shape, and (cores anywhere) takes as many preferred cores as it can.
    #[test]
    fn preferring_fits_as_place_does() {
        let mut seed = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for _ in 0..3000 {
            let (nodes, c) = (1 + next(6), 1 + next(4) as u32);
            let total = nodes as u32 * c;
            let some = |next: &mut dyn FnMut(u64) -> u64| {
                let runs: Vec<(u32, u32)> = (0..total).filter(|_| next(2) == 0).map(|i| (i, 1)).collect();
                PoolAlloc { cpus: runs.len() as u64, runs }
            };
            let mut m = PoolMachine::new(nodes, c).unwrap();
            m.claim(&some(&mut next));
            let prefer = some(&mut next);
            let req = if next(2) == 0 {
                let (cores, chunk) = (1 + next(total as u64) as u32, 1 + next(c as u64) as u32);
                JobRequest::simple(Shape::Total { cores, chunk }, 0)
            } else {
                let (n, per) = (1 + next(nodes) as u32, 1 + next(c as u64) as u32);
                JobRequest::simple(Shape::PerNode { nodes: n, cores_per_node: per }, 0)
            };
            let (plain, preferred) = (m.place(&req), m.place_preferring(&[&prefer], &req));
            let Fit::Now(a) = &preferred else {
                assert_eq!(plain, preferred, "{req:?}");
                continue;
            };
            assert!(matches!(plain, Fit::Now(_)), "{req:?}");
            let mut copy = m.clone();
            copy.claim(a);
            assert_eq!(copy.free_cpus(), m.free_cpus() - a.cpus, "{req:?}: free cores only");
            let mut wanted = Bits::empty(total as u64);
            for &(s, l) in &prefer.runs {
                wanted.set_range(s, l);
            }
            wanted.and_with(&m.free);
            let per_node: Vec<u32> = (0..nodes as u32)
                .map(|n| a.runs.iter().map(|&(s, l)| (s..s + l).filter(|i| i / c == n).count() as u32).sum())
                .collect();
            match req.shape {
                Shape::PerNode { nodes, cores_per_node } => {
                    assert!(per_node.iter().all(|&k| k == 0 || k == cores_per_node), "{req:?} {per_node:?}");
                    assert_eq!(per_node.iter().filter(|&&k| k > 0).count(), nodes as usize, "{req:?}");
                }
                Shape::Total { chunk, .. } => {
                    assert!(per_node.iter().all(|&k| k % chunk == 0), "{req:?} {per_node:?}");
                    if chunk == 1 {
                        let got: u32 = a.runs.iter().map(|&(s, l)| wanted.count_range(s, l)).sum();
                        assert_eq!(got as u64, (wanted.count_range(0, total) as u64).min(a.cpus), "{req:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn topology_strings() {
        let t = parse_topology("package:2 numa:2 core:4 pu:2").unwrap();
        assert_eq!((t.core_count(), t.pu_count(), t.numa_nodes.len()), (16, 32, 4));
        assert_eq!(parse_topology("core:8").unwrap().core_count(), 8);
        for bad in ["", "core:0", "core:x", "cache:2", "core:2 core:4", "core"] {
            assert!(matches!(parse_topology(bad), Err(SimError::BadTopology { .. })), "{bad:?}");
        }
    }

    #[test]
    fn cluster_machine_places_on_the_topology() {
        let mut m = ClusterMachine::new(2, parse_topology("package:1 numa:2 core:2 pu:1").unwrap()).unwrap();
        assert_eq!((m.total_cpus(), m.free_cpus()), (8, 8));
        let Fit::Now(a) = m.place(&total(3)) else { panic!() };
        m.claim(&a);
        assert_eq!(m.free_cpus(), 5);
        assert!(matches!(m.place(&total(9)), Fit::Never(_)));
        m.release(&a);
        assert_eq!(m.free_cpus(), 8);
    }

    /// A job the free count rejects waits in the words the controller's machine gives it
    /// (placement's own), not the bare count: the same pass on the simulator's machine and on
    /// the controller's `ClusterState` says the same for every waiting job.
    #[test]
    fn a_count_rejection_reads_as_the_controller_says_it() {
        use berth_core::sched::backfill::{plan, BackfillPolicy, PassInput, PassLimits, QueuedJob, RunningJob};
        use berth_core::JobId;
        let topology = parse_topology("package:1 numa:1 core:4 pu:1").unwrap();
        let mut m = ClusterMachine::new(2, topology).unwrap();
        let Fit::Now(running) = m.place(&total(3)) else { panic!("3 of 8 cores fit") };
        m.claim(&running);
        let per_node = JobRequest::simple(Shape::PerNode { nodes: 1, cores_per_node: 4 }, 0);
        let queued = |id: u64| QueuedJob { id: JobId(id), request: per_node.clone(), walltime: 10.0, held: false };
        // Job 1 takes the free node; job 2, the same request, is then rejected by the free
        // count (4 wanted, 1 free) without a placement.
        let queue = [queued(1), queued(2)];
        let running = [RunningJob { id: JobId(9), alloc: running, end: 100.0 }];
        for policy in [BackfillPolicy::Fcfs, BackfillPolicy::Easy, BackfillPolicy::Conservative] {
            let limits = PassLimits { policy, max_reservations: 10, deadline: None };
            let sim = plan(&PassInput { machine: &m, running: &running, queue: &queue, now: 0.0 }, &limits);
            let ctl = plan(&PassInput { machine: &m.state, running: &running, queue: &queue, now: 0.0 }, &limits);
            assert_eq!(sim.starts, ctl.starts, "{policy:?}");
            assert_eq!(sim.waiting, ctl.waiting, "{policy:?}");
            assert_eq!(sim.waiting.len(), 1, "{policy:?}");
            let words: Vec<String> = sim.waiting.iter().map(|w| w.reason.to_string()).collect();
            assert!(words.iter().all(|w| !w.contains("wanted, 1 free now")), "{policy:?}: {words:?}");
        }
    }
}
