//! Scheduler v0: FIFO order; placement (where) is `placement`'s.
//!
//! `schedule` is a pure function of the cluster's free resources and the queue: it never
//! oversubscribes a node's PUs or a NUMA node's memory, and answers "busy now" apart from
//! "can never fit" so that users are told which.

use crate::hierarchy::NodeOrder;
use crate::job::Allocation;
use crate::node::NodeCapacity;
pub use crate::placement::cluster::Placement;
use crate::placement::order::NodeRanks;
use crate::placement::{cluster, JobRequest, PlacementPolicy};

use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// The cluster as the scheduler sees it.
///
/// Its nodes are indexed by free cores for placement (the index is kept in `policy`, out of
/// sight). `claim` and `release` keep the index up to date. Nodes may still be changed
/// directly: a change to a node's cached counts goes through `NodeCapacity::refresh` (or a new
/// node, or a copy of one), and nodes added or removed change `nodes`' length, which placement
/// notices: it then looks at every node until the next `claim` or `release` rebuilds the index.
/// Not noticed, so not to be done: reordering `nodes` in place, or moving into it a node made
/// before the index was last rebuilt without refreshing it (the index would not see the new
/// counts at that position).
///
/// Its node order (the order placement tries nodes in, breaks ties in and lists a job's nodes
/// in: `placement::order`) is the cluster's configured one, written into the nodes by
/// [`arrange`](Self::arrange): call it whenever nodes are added, removed or replaced (a
/// cluster never arranged goes by names in natural order, at the cost of a sort per placement).
#[derive(Debug, Default)]
pub struct ClusterState {
    /// In id order (ids are the order nodes joined; placement goes by `NodeCapacity::order`).
    pub nodes: Vec<NodeCapacity>,
    pub policy: PlacementPolicy,
    /// The cluster-wide licenses and what running and suspended jobs hold of them (a job's
    /// are on its allocation's first part: [`NodeAllocation::licenses`](crate::job::NodeAllocation::licenses)).
    pub licenses: crate::gres::Licenses,
}

impl Clone for ClusterState {
    /// A copy with its own copy of the index (the nodes are copied exactly, so it stays true).
    fn clone(&self) -> Self {
        let nodes: Vec<NodeCapacity> = self.nodes.iter().map(NodeCapacity::clone_quiet).collect();
        let mut policy = self.policy.clone();
        policy.index = self.policy.index.copied_for(&self.nodes, &nodes);
        ClusterState { nodes, policy, licenses: self.licenses.clone() }
    }
}

/// Why a pending job is not running.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PendingReason {
    /// Waiting for resources to free up, with what is missing.
    Resources(String),
    /// It fits what is free now, but that is kept for higher-priority jobs waiting before it
    /// (or, without backfill, an earlier job waits first).
    Priority,
    Held,
    /// No node that is up can ever hold it; it waits for larger nodes to come up.
    NoSuitableNodes(String),
    /// A limit of its queue holds it back (e.g. the user's running cores), with which.
    QueueLimit(String),
}

impl PendingReason {
    pub fn describe(&self) -> String {
        match self {
            PendingReason::Resources(what) if what.is_empty() => {
                "resources: waiting for cores or memory to free up".into()
            }
            PendingReason::Resources(what) => format!("resources: {what}"),
            PendingReason::Priority => {
                "priority: what it needs is free now but kept for higher-priority jobs waiting before it; it starts after them, or sooner if more frees up".into()
            }
            PendingReason::Held => "held: run `berth release <id>`".into(),
            PendingReason::NoSuitableNodes(why) => format!("no suitable node up: {why}"),
            PendingReason::QueueLimit(which) => format!("queue limit: {which}"),
        }
    }
}

impl ClusterState {
    /// `nodes` (in id order) under `policy`, in natural name order ([`arrange`](Self::arrange)d).
    pub fn new(nodes: Vec<NodeCapacity>, policy: PlacementPolicy) -> Self {
        let mut c = ClusterState { nodes, policy, licenses: Default::default() };
        c.arrange(&NodeOrder::default());
        c
    }

    /// Write each node's place in `rule`'s order (the admin's `[interconnect] order`, then
    /// names in natural order) into it: the one node order placement and every list of nodes
    /// follow. Call after nodes are added, removed or replaced, or the rule changes.
    pub fn arrange(&mut self, rule: &NodeOrder) {
        let order = rule.arrange(self.nodes.iter().map(|n| n.name.as_str()));
        for (rank, i) in order.into_iter().enumerate() {
            self.nodes[i].order = rank as u32;
        }
        // The index files nodes by rank: it is rebuilt.
        crate::node::untracked_change();
    }

    /// The cluster's node order: positions in `nodes`, first first (the index's when it is
    /// true, else read from the nodes in one pass).
    pub fn ranks(&self) -> std::borrow::Cow<'_, NodeRanks> {
        match self.policy.index.get(&self.nodes) {
            Some(ix) => std::borrow::Cow::Borrowed(ix.ranks()),
            None => std::borrow::Cow::Owned(NodeRanks::of(&self.nodes)),
        }
    }

    /// Positions in `nodes` in the cluster's node order.
    pub fn in_order(&self) -> Vec<usize> {
        self.ranks().positions().collect()
    }

    pub fn node_mut(&mut self, id: crate::NodeId) -> Option<&mut NodeCapacity> {
        match self.nodes.binary_search_by_key(&id, |n| n.id) {
            Ok(i) => Some(&mut self.nodes[i]),
            Err(_) => self.nodes.iter_mut().find(|n| n.id == id),
        }
    }

    /// Mark an allocation's PUs and memory (and its generic resources and licenses) as used.
    pub fn claim(&mut self, alloc: &Allocation) {
        self.claim_licenses(alloc);
        let index = self.policy.index.ensure(&self.nodes);
        for na in alloc {
            if let Some(i) = node_position(&self.nodes, na.node_id) {
                self.nodes[i].claim_quiet(na);
                index.refile(i, &self.nodes[i]);
            }
        }
    }

    /// Return an allocation's PUs and memory (and its generic resources and licenses).
    pub fn release(&mut self, alloc: &Allocation) {
        self.release_licenses(alloc);
        let index = self.policy.index.ensure(&self.nodes);
        for na in alloc {
            if let Some(i) = node_position(&self.nodes, na.node_id) {
                self.nodes[i].release_quiet(na);
                index.refile(i, &self.nodes[i]);
            }
        }
    }
}

impl ClusterState {
    /// Count the licenses `alloc` holds as used (a suspended job's stay so: its memory is
    /// claimed with [`NodeCapacity::claim_memory`], its licenses with this).
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

use crate::placement::cluster::node_position;

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
    match (cluster::place(&cluster.nodes, &cluster.policy, req), licenses) {
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
        self.nodes.iter().filter(|n| n.state.accepts_work()).map(|n| n.free_core_count as u64).sum()
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
        let mut touched: Vec<usize> =
            extra.iter().flat_map(|a| a.iter()).filter_map(|na| self.node_index(na.node_id)).collect();
        touched.sort_unstable();
        touched.dedup();
        let saved: Vec<(usize, NodeCapacity)> = touched.into_iter().map(|i| (i, self.nodes[i].clone_quiet())).collect();
        let saved_licenses = self.licenses.clone();
        for alloc in extra {
            ClusterState::claim(self, alloc);
        }
        let fit = backfill::Machine::place(self, req);
        self.licenses = saved_licenses;
        let mut put_back = Vec::with_capacity(saved.len());
        for (i, node) in saved {
            self.nodes[i] = node;
            put_back.push(i);
        }
        // File them again as they were (or rebuild, if the index went stale meanwhile).
        let index = self.policy.index.ensure(&self.nodes);
        for i in put_back {
            index.refile(i, &self.nodes[i]);
        }
        fit
    }

    fn place_preferring(&self, prefer: &[&Allocation], req: &JobRequest) -> backfill::Fit<Allocation> {
        backfill::place_preferring_on_cluster(self, prefer, req)
    }

    /// The same rules and the same nodes, each with the same hardware, state and free
    /// resources (the cached counts follow from those).
    fn same_state(&self, other: &Self) -> bool {
        self.policy == other.policy
            && self.licenses == other.licenses
            && self.nodes.len() == other.nodes.len()
            && self.nodes.iter().zip(&other.nodes).all(|(a, b)| {
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
    /// Index in `nodes` of the node with id `id`.
    fn node_index(&self, id: crate::NodeId) -> Option<usize> {
        node_position(&self.nodes, id)
    }

    /// Free whole cores (as `Machine::free_cpus` counts them) on the nodes of `alloc`.
    fn free_cores_on(&self, alloc: &Allocation) -> u64 {
        let mut ids: Vec<crate::NodeId> = alloc.iter().map(|na| na.node_id).collect();
        ids.sort_unstable();
        ids.dedup();
        ids.into_iter()
            .filter_map(|id| cluster::node_by_id(&self.nodes, id))
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
pub mod fairshare;
pub mod preempt;
pub mod priority;
pub mod queue;
pub mod round;

#[cfg(test)]
mod testkit;
#[cfg(test)]
mod tests;
