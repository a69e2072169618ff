//! The cluster's node order, as placement uses it: the order nodes are tried in, ties are broken
//! in and a job's nodes are listed in (so its head node, rank 0's node and its node list).
//!
//! The order is the cluster's configured one: the admin's `[interconnect] order` list, else
//! names in natural order (node2 before node10), never node ids, which are the order agents
//! happened to register in. [`ClusterState::arrange`](crate::sched::ClusterState::arrange)
//! writes each node's place in it (`NodeCapacity::order`) once, when nodes are added or the
//! rule changes; [`NodeRanks`] reads those places back as a permutation of node positions, in
//! one pass over the nodes (no sort), and the index of a cluster keeps one.

use crate::hierarchy::natural_cmp;
use crate::node::NodeCapacity;

/// Node positions (in their vector) by rank in the cluster's node order, and each position's
/// rank.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeRanks {
    by_rank: Vec<u32>,
    rank: Vec<u32>,
}

impl NodeRanks {
    /// The order of `nodes`: by their `order` (what `ClusterState::arrange` wrote). When those
    /// are exactly `0..nodes.len()`, one pass; otherwise (nodes not arranged, or a part of a
    /// cluster) a sort by (`order`, name in natural order, position).
    pub fn of(nodes: &[NodeCapacity]) -> Self {
        let n = nodes.len();
        let mut by_rank = vec![u32::MAX; n];
        let mut arranged = true;
        for (i, node) in nodes.iter().enumerate() {
            match by_rank.get_mut(node.order as usize) {
                Some(slot) if *slot == u32::MAX => *slot = i as u32,
                _ => {
                    arranged = false;
                    break;
                }
            }
        }
        if !arranged {
            by_rank = (0..n as u32).collect();
            by_rank.sort_by(|&a, &b| {
                let (x, y) = (&nodes[a as usize], &nodes[b as usize]);
                x.order.cmp(&y.order).then_with(|| natural_cmp(&x.name, &y.name)).then(a.cmp(&b))
            });
        }
        let mut rank = vec![0u32; n];
        for (r, &i) in by_rank.iter().enumerate() {
            rank[i as usize] = r as u32;
        }
        NodeRanks { by_rank, rank }
    }

    /// The rank of the node at `pos`.
    pub fn rank(&self, pos: usize) -> u32 {
        self.rank[pos]
    }

    /// The position of the node of rank `rank`.
    pub fn at(&self, rank: usize) -> usize {
        self.by_rank[rank] as usize
    }

    /// Node positions in the cluster's order.
    pub fn positions(&self) -> impl Iterator<Item = usize> + '_ {
        self.by_rank.iter().map(|&i| i as usize)
    }

    pub fn len(&self) -> usize {
        self.by_rank.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_rank.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::Topology;
    use crate::NodeId;
    use std::sync::Arc;

    fn nodes(names: &[&str]) -> Vec<NodeCapacity> {
        let topo = Arc::new(Topology::uniform(1, 1, 2, 1, 1 << 30));
        names.iter().enumerate().map(|(i, n)| NodeCapacity::new(NodeId(i as u32), *n, topo.clone())).collect()
    }

    #[test]
    fn arranged_nodes_go_by_their_places() {
        let mut ns = nodes(&["a", "b", "c"]);
        for (n, o) in ns.iter_mut().zip([2, 0, 1]) {
            n.order = o;
        }
        let r = NodeRanks::of(&ns);
        assert_eq!(r.positions().collect::<Vec<_>>(), vec![1, 2, 0]);
        assert_eq!((r.rank(0), r.rank(1), r.rank(2)), (2, 0, 1));
        assert_eq!(r.at(0), 1);
    }

    #[test]
    fn nodes_not_arranged_go_by_natural_name_after_arranged_ones() {
        let mut ns = nodes(&["node10", "node2", "node1", "x"]);
        assert_eq!(NodeRanks::of(&ns).positions().collect::<Vec<_>>(), vec![2, 1, 0, 3]);
        // A part of a cluster: places kept but not 0..n.
        ns[3].order = 7;
        ns[0].order = 9;
        assert_eq!(NodeRanks::of(&ns).positions().collect::<Vec<_>>(), vec![3, 0, 2, 1]);
    }
}
