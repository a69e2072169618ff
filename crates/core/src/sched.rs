//! Scheduling: the pure round (`round`: priority, limits, backfill, preemption by suspension,
//! resumes, reasons, expected starts) the controller and the simulator both call, and the
//! cluster as the round's [`Machine`](backfill::Machine): `place` puts one request on what is
//! free now, answering "busy now" apart from "can never fit" so that users are told which.
//! Placement itself (where on a node) is `placement`'s.

use crate::job::Allocation;
pub use crate::placement::cluster::Placement;
use crate::placement::JobRequest;
pub use reason::PendingReason;

use std::sync::Arc;

impl ClusterState {
    /// Count the licenses `alloc` holds as used (a suspended job's stay so: its memory is
    /// claimed with [`NodeCapacity::claim_memory`](crate::node::NodeCapacity::claim_memory), its licenses with this).
    pub fn claim_licenses(&mut self, alloc: &Allocation) {
        for na in alloc.iter().filter(|na| !na.licenses.is_empty()) {
            self.licenses.claim(&na.licenses);
        }
    }

    /// Give back the licenses `alloc` holds.
    pub fn release_licenses(&mut self, alloc: &Allocation) {
        for na in alloc.iter().filter(|na| !na.licenses.is_empty()) {
            self.licenses.release(&na.licenses);
        }
    }
}

/// Place one request on what is free now: its nodes, and its licenses (held on the
/// allocation's first part). A request that can never have its licenses is `Never`; one
/// whose licenses are taken now is `Busy` with the license named.
pub fn place(cluster: &ClusterState, req: &JobRequest) -> Placement {
    use crate::gres::LicenseMiss;
    use crate::placement::reason::{Busy, Never};
    let licenses = if req.licenses.is_empty() { Ok(()) } else { cluster.licenses.check(&req.licenses) };
    if let Err(LicenseMiss::Never(why)) = licenses {
        return Placement::Never(Never::License(why));
    }
    match (cluster.place_on_nodes(req), licenses) {
        (Placement::Now(mut alloc), Ok(())) => {
            if let Some(first) = alloc.first_mut() {
                first.licenses = req.licenses.clone();
            }
            Placement::Now(alloc)
        }
        (Placement::Now(_), Err(LicenseMiss::Busy(why))) => Placement::Busy(Busy::Licenses(why)),
        (Placement::Busy(what), Err(LicenseMiss::Busy(why))) => Placement::Busy(Busy::AndLicenses(Box::new(what), why)),
        (other, _) => other,
    }
}

/// The topology-aware cluster as a backfill [`Machine`](backfill::Machine): what the controller
/// plans with.
impl backfill::Machine for ClusterState {
    type Alloc = Allocation;

    fn place(&self, req: &JobRequest) -> backfill::Fit<Allocation> {
        place(self, req)
    }

    fn claim(&mut self, alloc: &Allocation) {
        ClusterState::claim(self, alloc);
    }

    fn release(&mut self, alloc: &Allocation) {
        ClusterState::release(self, alloc);
    }

    /// Whole free cores (outside system CPUs and exclusive NUMA nodes) of the nodes taking
    /// work. A scan of the nodes: the pass caches it between changes.
    fn free_cpus(&self) -> u64 {
        self.nodes().iter().filter(|n| n.state.accepts_work()).map(|n| n.free_core_count as u64).sum()
    }

    /// Placement's own words for a shape too large for the free cores (with the licenses, as
    /// [`place`] names them when they are taken too).
    fn busy_by_count(&self, req: &JobRequest, need: u64, free: u64) -> crate::placement::reason::Busy {
        use crate::gres::LicenseMiss;
        use crate::placement::reason::Busy;
        let what = crate::placement::cluster::short_by_count(self.nodes(), &self.policy, req)
            .unwrap_or(Busy::Counted { need, free });
        if req.licenses.is_empty() {
            return what;
        }
        match self.licenses.check(&req.licenses) {
            Err(LicenseMiss::Busy(why)) => Busy::AndLicenses(Box::new(what), why),
            _ => what,
        }
    }

    // Only the allocation's nodes change: count those before and after.
    fn claim_counting(&mut self, alloc: &Allocation, free_before: u64) -> u64 {
        let before = self.free_cores_on(alloc);
        ClusterState::claim(self, alloc);
        (free_before + self.free_cores_on(alloc)).saturating_sub(before)
    }

    fn release_counting(&mut self, alloc: &Allocation, free_before: u64) -> u64 {
        let before = self.free_cores_on(alloc);
        ClusterState::release(self, alloc);
        (free_before + self.free_cores_on(alloc)).saturating_sub(before)
    }
    // Only the nodes the extra allocations touch change: keep copies of those and put them back.
    fn place_with_claimed(&mut self, extra: &[&Allocation], req: &JobRequest) -> backfill::Fit<Allocation> {
        self.with_claimed(extra, |c| backfill::Machine::place(c, req))
    }

    fn place_preferring(&self, prefer: &[&Allocation], req: &JobRequest) -> backfill::Fit<Allocation> {
        backfill::place_preferring_on_cluster(self, prefer, req)
    }

    /// The same rules and the same nodes, each with the same hardware, state and free
    /// resources (the cached counts follow from those).
    fn same_state(&self, other: &Self) -> bool {
        self.policy == other.policy
            && self.licenses == other.licenses
            && self.nodes().len() == other.nodes().len()
            && self.nodes().iter().zip(other.nodes()).all(|(a, b)| {
                a.id == b.id
                    && a.state == b.state
                    && a.free_pus == b.free_pus
                    && a.numa_free == b.numa_free
                    && a.numa_exclusive == b.numa_exclusive
                    && a.system_pus == b.system_pus
                    && a.subnodes == b.subnodes
                    && a.location == b.location
                    && a.order == b.order
                    && a.name == b.name
                    && a.gres_free == b.gres_free
                    && a.gres_total == b.gres_total
                    && (Arc::ptr_eq(&a.topology, &b.topology) || a.topology == b.topology)
            })
    }

    /// The same parts, in any order.
    fn same_holding(a: &Allocation, b: &Allocation) -> bool {
        a.len() == b.len() && a.iter().all(|x| b.contains(x))
    }

    /// Allocations on different nodes share nothing, unless both hold a license.
    fn may_share(a: &Allocation, b: &Allocation) -> bool {
        let licensed = |x: &Allocation| x.iter().flat_map(|na| na.licenses.keys().cloned()).collect::<Vec<String>>();
        let (la, lb) = (licensed(a), licensed(b));
        la.iter().any(|n| lb.contains(n)) || a.iter().any(|x| b.iter().any(|y| x.node_id == y.node_id))
    }
}

impl ClusterState {
    /// Free whole cores (as `Machine::free_cpus` counts them) on the nodes of `alloc`.
    fn free_cores_on(&self, alloc: &Allocation) -> u64 {
        let mut ids: Vec<crate::NodeId> = alloc.iter().map(|na| na.node_id).collect();
        ids.sort_unstable();
        ids.dedup();
        ids.into_iter()
            .filter_map(|id| self.node(id))
            .filter(|n| n.state.accepts_work())
            .map(|n| n.free_core_count as u64)
            .sum()
    }
}

/// A pending job as the scheduler sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingJob {
    pub id: crate::JobId,
    pub request: crate::placement::JobRequest,
    pub held: bool,
}

pub mod backfill;
mod cluster_state;
pub mod counted;
pub use cluster_state::{ClusterState, NodeMut};
pub mod fairshare;
pub mod preempt;
pub mod priority;
pub mod queue;
pub mod reason;
pub mod round;
pub mod tail;

#[cfg(test)]
mod testkit;
#[cfg(test)]
mod tests;
