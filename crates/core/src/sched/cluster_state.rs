//! The cluster as the scheduler sees it, and the one way its nodes change.
//!
//! The node table is private to this module: it is read through [`ClusterState::nodes`] and
//! [`ClusterState::node`], and changed only through methods that keep the placement index
//! (`placement::index`) true for it: `claim` and `release` re-file the nodes they change, a
//! node borrowed with [`ClusterState::node_mut`] (a [`NodeMut`]) is re-filed when the borrow
//! ends, and a change of the table's shape (a node added or replaced, a new node order) drops
//! the index, which the next `claim` or `release` builds again. So an index the cluster holds is
//! true for its nodes, with nothing to check.

use crate::hierarchy::NodeOrder;
use crate::job::Allocation;
use crate::node::NodeCapacity;
use crate::placement::cluster::{self, node_position, Placement};
use crate::placement::index::IndexSlot;
use crate::placement::order::NodeRanks;
use crate::placement::{JobRequest, PlacementPolicy};
use crate::NodeId;

/// The cluster as the scheduler sees it.
///
/// Its nodes are indexed by free cores for placement (the index is kept beside them, out of
/// sight, and kept true by every method that changes a node: see the module's documentation).
///
/// Its node order (the order placement tries nodes in, breaks ties in and lists a job's nodes
/// in: `placement::order`) is the cluster's configured one, written into the nodes by
/// [`arrange`](Self::arrange): call it whenever nodes are added, removed or replaced (a
/// cluster never arranged goes by names in natural order, at the cost of a sort per placement).
#[derive(Default)]
pub struct ClusterState {
    /// In id order (ids are the order nodes joined; placement goes by `NodeCapacity::order`).
    nodes: Vec<NodeCapacity>,
    pub policy: PlacementPolicy,
    /// The cluster-wide licenses and what running and suspended jobs hold of them (a job's
    /// are on its allocation's first part: [`NodeAllocation::licenses`](crate::job::NodeAllocation::licenses)).
    pub licenses: crate::gres::Licenses,
    /// The index of `nodes` by free cores, when one was built: always true for them.
    index: IndexSlot,
}

impl Clone for ClusterState {
    /// A copy with its own copy of the index (the nodes are copied exactly, so it stays true).
    fn clone(&self) -> Self {
        ClusterState {
            nodes: self.nodes.clone(),
            policy: self.policy.clone(),
            licenses: self.licenses.clone(),
            index: self.index.clone(),
        }
    }
}

impl std::fmt::Debug for ClusterState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterState")
            .field("nodes", &self.nodes)
            .field("policy", &self.policy)
            .field("licenses", &self.licenses)
            .finish()
    }
}

impl ClusterState {
    /// `nodes` (in id order) under `policy`, in natural name order ([`arrange`](Self::arrange)d).
    pub fn new(nodes: Vec<NodeCapacity>, policy: PlacementPolicy) -> Self {
        let mut c = ClusterState::from_parts(nodes, policy, Default::default());
        c.arrange(&NodeOrder::default());
        c
    }

    /// `nodes` (in id order) under `policy` with `licenses`, as they are: not
    /// [`arrange`](Self::arrange)d (nodes keep the places in the node order they have).
    pub fn from_parts(nodes: Vec<NodeCapacity>, policy: PlacementPolicy, licenses: crate::gres::Licenses) -> Self {
        ClusterState { nodes, policy, licenses, index: IndexSlot::default() }
    }

    /// The nodes, in id order.
    pub fn nodes(&self) -> &[NodeCapacity] {
        &self.nodes
    }

    /// The node with id `id`.
    pub fn node(&self, id: NodeId) -> Option<&NodeCapacity> {
        self.position(id).map(|i| &self.nodes[i])
    }

    /// The position in [`nodes`](Self::nodes) of the node with id `id`.
    pub fn position(&self, id: NodeId) -> Option<usize> {
        node_position(&self.nodes, id)
    }

    /// The node with id `id`, to change (re-filed in the index when the borrow ends).
    pub fn node_mut(&mut self, id: NodeId) -> Option<NodeMut<'_>> {
        let pos = self.position(id)?;
        Some(NodeMut { cluster: self, pos })
    }

    /// The node at position `pos` of [`nodes`](Self::nodes), to change (re-filed in the index
    /// when the borrow ends). Panics if there is no such position, as indexing does.
    pub fn node_at_mut(&mut self, pos: usize) -> NodeMut<'_> {
        assert!(pos < self.nodes.len(), "node position {pos} of {}", self.nodes.len());
        NodeMut { cluster: self, pos }
    }

    /// Change every node with `f` (each re-filed in the index afterwards; the index is dropped
    /// if `f` changed the node order).
    pub fn update_nodes<R>(&mut self, f: impl FnOnce(&mut [NodeCapacity]) -> R) -> R {
        let out = f(&mut self.nodes);
        self.index.refile_all(&self.nodes);
        out
    }

    /// Add a node (after the others: its id must be the largest). Call
    /// [`arrange`](Self::arrange) after.
    pub fn push(&mut self, node: NodeCapacity) {
        self.nodes.push(node);
        self.index.clear();
    }

    /// Put `node` in place of the node at position `pos`. Call [`arrange`](Self::arrange)
    /// after. Panics if there is no such position, as indexing does.
    pub fn replace(&mut self, pos: usize, node: NodeCapacity) {
        self.nodes[pos] = node;
        self.index.clear();
    }

    /// Write each node's place in `rule`'s order (the admin's `[interconnect] order`, then
    /// names in natural order) into it: the one node order placement and every list of nodes
    /// follow. Call after nodes are added, removed or replaced, or the rule changes.
    pub fn arrange(&mut self, rule: &NodeOrder) {
        let order = rule.arrange(self.nodes.iter().map(|n| n.name.as_str()));
        for (rank, i) in order.into_iter().enumerate() {
            self.nodes[i].order = rank as u32;
        }
        // The index files nodes by rank: it is built again at the next claim or release.
        self.index.clear();
    }

    /// The cluster's node order: positions in `nodes`, first first (the index's when there is
    /// one, else read from the nodes in one pass).
    pub fn ranks(&self) -> std::borrow::Cow<'_, NodeRanks> {
        match self.index.get() {
            Some(ix) => std::borrow::Cow::Borrowed(ix.ranks()),
            None => std::borrow::Cow::Owned(NodeRanks::of(&self.nodes)),
        }
    }

    /// Positions in `nodes` in the cluster's node order.
    pub fn in_order(&self) -> Vec<usize> {
        self.ranks().positions().collect()
    }

    /// Mark an allocation's PUs and memory (and its generic resources and licenses) as used.
    pub fn claim(&mut self, alloc: &Allocation) {
        self.claim_licenses(alloc);
        let index = self.index.ensure(&self.nodes);
        for na in alloc {
            if let Some(i) = node_position(&self.nodes, na.node_id) {
                self.nodes[i].claim(na);
                index.refile(i, &self.nodes[i]);
            }
        }
    }

    /// Return an allocation's PUs and memory (and its generic resources and licenses).
    pub fn release(&mut self, alloc: &Allocation) {
        self.release_licenses(alloc);
        let index = self.index.ensure(&self.nodes);
        for na in alloc {
            if let Some(i) = node_position(&self.nodes, na.node_id) {
                self.nodes[i].release(na);
                index.refile(i, &self.nodes[i]);
            }
        }
    }

    /// Place one request on the nodes' free resources now (licenses not looked at: see
    /// [`sched::place`](crate::sched::place)), through the index when there is one.
    pub fn place_on_nodes(&self, req: &JobRequest) -> Placement {
        cluster::place_with(&self.nodes, &self.policy, self.index.get(), req)
    }

    /// `f` asked of the cluster with `extra` claimed too; the cluster is then put back as it
    /// was (only the nodes `extra` touches are copied and restored, and re-filed).
    pub(crate) fn with_claimed<R>(&mut self, extra: &[&Allocation], f: impl FnOnce(&Self) -> R) -> R {
        let mut touched: Vec<usize> =
            extra.iter().flat_map(|a| a.iter()).filter_map(|na| self.position(na.node_id)).collect();
        touched.sort_unstable();
        touched.dedup();
        let saved: Vec<(usize, NodeCapacity)> = touched.into_iter().map(|i| (i, self.nodes[i].clone())).collect();
        let saved_licenses = self.licenses.clone();
        for alloc in extra {
            self.claim(alloc);
        }
        let out = f(self);
        self.licenses = saved_licenses;
        let index = self.index.ensure(&self.nodes);
        for (i, node) in saved {
            self.nodes[i] = node;
            index.refile(i, &self.nodes[i]);
        }
        out
    }

    /// The index kept, if any (tests check that it is true).
    #[cfg(test)]
    pub(crate) fn index(&self) -> Option<&crate::placement::index::NodeIndex> {
        self.index.get()
    }

    /// The index, built now if there is none (tests).
    #[cfg(test)]
    pub(crate) fn ensure_index(&mut self) {
        self.index.ensure(&self.nodes);
    }

    /// Re-file the node at `pos` after a change made through a [`NodeMut`].
    fn refile(&mut self, pos: usize) {
        self.index.refile_one(pos, &self.nodes[pos]);
    }
}

/// A node of a [`ClusterState`] borrowed to change: it derefs to the node, and when dropped
/// files the node again in the cluster's index under its new counts (or drops the index if its
/// place in the node order changed).
pub struct NodeMut<'a> {
    cluster: &'a mut ClusterState,
    pos: usize,
}

impl NodeMut<'_> {
    /// The node's position in the cluster's [`nodes`](ClusterState::nodes).
    pub fn position(&self) -> usize {
        self.pos
    }
}

impl std::ops::Deref for NodeMut<'_> {
    type Target = NodeCapacity;

    fn deref(&self) -> &NodeCapacity {
        &self.cluster.nodes[self.pos]
    }
}

impl std::ops::DerefMut for NodeMut<'_> {
    fn deref_mut(&mut self) -> &mut NodeCapacity {
        &mut self.cluster.nodes[self.pos]
    }
}

impl Drop for NodeMut<'_> {
    fn drop(&mut self) {
        self.cluster.refile(self.pos);
    }
}
