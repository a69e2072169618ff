//! An index of a cluster's nodes by their cached free counts, so that a placement looks only at
//! the nodes that could hold the request instead of scanning every node.
//!
//! Kept by [`ClusterState`](crate::sched::ClusterState) beside its nodes, which are private to
//! it: every change to a node goes through the cluster, which re-files the node (`claim`,
//! `release`, a node borrowed with `node_mut`), or drops the index when the table changes shape
//! (a node added or replaced, a new node order) and builds it again at its next `claim` or
//! `release` (placement scans every node meanwhile). An index the cluster holds is therefore
//! true for its nodes. Candidates found through the index are still checked against the node's
//! own counts.

use super::order::NodeRanks;
use crate::node::NodeCapacity;

/// Which cached count a lookup goes by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Count {
    /// `free_core_count`: whole free cores outside system CPUs and exclusive NUMA nodes.
    FreeCores,
    /// `untouched_cores`: cores of NUMA nodes nobody uses at all.
    UntouchedCores,
}

/// Nodes by one count: `by[k]` is the set of ranks (in the cluster's node order, see
/// `placement::order`) of the nodes whose count is `k`, as bits (so filing a node again is two
/// bit flips, and a set lists in the cluster's order).
/// Count 0 is not kept: lookups ask for at least 1.
#[derive(Debug, Clone, Default)]
struct Buckets {
    /// Words per set: the number of nodes, rounded up to 64.
    words: usize,
    /// Sets by count; empty (no words) until a node has that count.
    by: Vec<Vec<u64>>,
    /// Nodes in each set.
    len: Vec<usize>,
}

/// The positions in a set of bits, ascending.
struct Bits<'a> {
    words: &'a [u64],
    at: usize,
    word: u64,
}

impl<'a> Bits<'a> {
    fn new(words: &'a [u64]) -> Self {
        Bits { words, at: 0, word: words.first().copied().unwrap_or(0) }
    }
}

impl Iterator for Bits<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        while self.word == 0 {
            self.at += 1;
            self.word = *self.words.get(self.at)?;
        }
        let bit = self.word.trailing_zeros() as usize;
        self.word &= self.word - 1;
        Some(self.at * 64 + bit)
    }
}

impl Buckets {
    fn new(nodes: usize) -> Self {
        Buckets { words: nodes.div_ceil(64), by: vec![], len: vec![] }
    }

    fn insert(&mut self, key: u32, pos: usize) {
        if key == 0 {
            return;
        }
        let k = key as usize;
        if self.by.len() <= k {
            self.by.resize_with(k + 1, Vec::new);
            self.len.resize(k + 1, 0);
        }
        if self.by[k].is_empty() {
            self.by[k] = vec![0; self.words];
        }
        self.by[k][pos / 64] |= 1 << (pos % 64);
        self.len[k] += 1;
    }

    fn remove(&mut self, key: u32, pos: usize) {
        let k = key as usize;
        if key == 0 || self.len.get(k).is_none_or(|&n| n == 0) {
            return;
        }
        let word = &mut self.by[k][pos / 64];
        if *word & (1 << (pos % 64)) != 0 {
            *word &= !(1 << (pos % 64));
            self.len[k] -= 1;
        }
    }

    /// Ranks with exactly `key`, ascending.
    fn bucket(&self, key: u32) -> Bits<'_> {
        match self.len.get(key as usize) {
            Some(&n) if n > 0 && key > 0 => Bits::new(&self.by[key as usize]),
            _ => Bits::new(&[]),
        }
    }

    /// The largest count kept (0 if none).
    fn top(&self) -> u32 {
        self.len.iter().rposition(|&n| n > 0).unwrap_or(0) as u32
    }

    fn count_from(&self, min: u32) -> usize {
        self.len.iter().skip(min.max(1) as usize).sum()
    }

    /// Ranks with a count of at least `min`: counts ascending, ranks ascending within.
    fn from(&self, min: u32) -> impl Iterator<Item = usize> + '_ {
        (min.max(1)..self.len.len() as u32).flat_map(|k| self.bucket(k))
    }

    /// Ranks with a count of at least `min`, ascending.
    fn union_from(&self, min: u32) -> Vec<usize> {
        let mut all = vec![0u64; self.words];
        for k in min.max(1) as usize..self.len.len() {
            if self.len[k] > 0 {
                all.iter_mut().zip(&self.by[k]).for_each(|(a, b)| *a |= b);
            }
        }
        Bits::new(&all).collect()
    }
}

/// Nodes (by position in their vector) by free and untouched cores; every list comes in the
/// cluster's node order (by rank, not position).
#[derive(Debug, Clone)]
pub struct NodeIndex {
    /// The nodes' order: the buckets hold ranks, lookups answer positions.
    ranks: NodeRanks,
    /// Whether every node's `order` is its rank (the nodes were arranged): then a change to a
    /// node that keeps its `order` keeps the ranks true.
    arranged: bool,
    /// The counts each node is filed under: (free cores, untouched cores).
    keys: Vec<(u32, u32)>,
    free: Buckets,
    untouched: Buckets,
}

fn keys_of(n: &NodeCapacity) -> (u32, u32) {
    (n.free_core_count, n.untouched_cores)
}

impl NodeIndex {
    /// An index of `nodes` as they are now.
    pub(crate) fn build(nodes: &[NodeCapacity]) -> Self {
        let ranks = NodeRanks::of(nodes);
        let arranged = nodes.iter().enumerate().all(|(i, n)| n.order == ranks.rank(i));
        let mut ix = NodeIndex {
            ranks,
            arranged,
            keys: Vec::with_capacity(nodes.len()),
            free: Buckets::new(nodes.len()),
            untouched: Buckets::new(nodes.len()),
        };
        for (i, n) in nodes.iter().enumerate() {
            let (f, u) = keys_of(n);
            let r = ix.ranks.rank(i) as usize;
            ix.keys.push((f, u));
            ix.free.insert(f, r);
            ix.untouched.insert(u, r);
        }
        ix
    }

    /// The order of the nodes it describes.
    pub(crate) fn ranks(&self) -> &NodeRanks {
        &self.ranks
    }

    /// Whether the ranks still hold for node `pos` as it is now (its place in the order did not
    /// change).
    fn keeps_rank(&self, pos: usize, node: &NodeCapacity) -> bool {
        self.arranged && pos < self.keys.len() && self.ranks.rank(pos) == node.order
    }

    /// File node `pos` again under its current counts (after its owner changed it quietly).
    pub(crate) fn refile(&mut self, pos: usize, node: &NodeCapacity) {
        let (old_f, old_u) = self.keys[pos];
        let (f, u) = keys_of(node);
        let r = self.ranks.rank(pos) as usize;
        if f != old_f {
            self.free.remove(old_f, r);
            self.free.insert(f, r);
        }
        if u != old_u {
            self.untouched.remove(old_u, r);
            self.untouched.insert(u, r);
        }
        self.keys[pos] = (f, u);
    }

    fn buckets(&self, count: Count) -> &Buckets {
        match count {
            Count::FreeCores => &self.free,
            Count::UntouchedCores => &self.untouched,
        }
    }

    /// How many nodes have at least `min` (at least 1) of `count`.
    pub(crate) fn count_from(&self, count: Count, min: u32) -> usize {
        self.buckets(count).count_from(min)
    }

    /// Positions of the nodes with at least `min` (at least 1) of `count`, fewest first, then
    /// in the cluster's order.
    pub(crate) fn from(&self, count: Count, min: u32) -> impl Iterator<Item = usize> + '_ {
        self.buckets(count).from(min).map(|r| self.ranks.at(r))
    }

    /// Positions of the nodes with at least `min` (at least 1) of `count`, in the cluster's
    /// order.
    pub(crate) fn all_from(&self, count: Count, min: u32) -> Vec<usize> {
        let mut v = self.buckets(count).union_from(min);
        v.iter_mut().for_each(|r| *r = self.ranks.at(*r));
        v
    }

    /// Positions of the nodes with exactly `key` (at least 1) of `count`, in the cluster's
    /// order.
    pub(crate) fn with(&self, count: Count, key: u32) -> impl Iterator<Item = usize> + '_ {
        self.buckets(count).bucket(key).map(|r| self.ranks.at(r))
    }

    /// The largest value of `count` any node has (0 if none).
    pub(crate) fn top(&self, count: Count) -> u32 {
        self.buckets(count).top()
    }

    /// Everything the index says, for tests: (free cores, untouched cores) per position, and
    /// whether the buckets hold exactly that.
    #[cfg(test)]
    pub(crate) fn consistent_with(&self, nodes: &[NodeCapacity]) -> bool {
        let fresh = NodeIndex::build(nodes);
        let same = |a: &Buckets, b: &Buckets| {
            (1..=a.by.len().max(b.by.len()) as u32).all(|k| a.bucket(k).eq(b.bucket(k)))
                && a.top() == b.top()
                && (1..=a.by.len().max(b.by.len()) as u32).all(|k| a.count_from(k) == b.count_from(k))
        };
        self.keys == fresh.keys
            && self.ranks == fresh.ranks
            && same(&self.free, &fresh.free)
            && same(&self.untouched, &fresh.untouched)
    }
}

/// Where a `ClusterState` keeps the index of its nodes: none until its first `claim` or
/// `release`, and none again after a change of the nodes' shape or order.
#[derive(Clone, Default)]
pub(crate) struct IndexSlot(Option<Box<NodeIndex>>);

impl IndexSlot {
    /// The index, if there is one (true for the cluster's nodes: its owner keeps it so).
    pub(crate) fn get(&self) -> Option<&NodeIndex> {
        self.0.as_deref()
    }

    /// The index of `nodes`, built if there is none.
    pub(crate) fn ensure(&mut self, nodes: &[NodeCapacity]) -> &mut NodeIndex {
        self.0.get_or_insert_with(|| Box::new(NodeIndex::build(nodes)))
    }

    /// No index until the next `ensure` (the nodes changed shape or order).
    pub(crate) fn clear(&mut self) {
        self.0 = None;
    }

    /// Node `pos` was changed: file it again, or drop the index if its place in the node order
    /// changed.
    pub(crate) fn refile_one(&mut self, pos: usize, node: &NodeCapacity) {
        if let Some(ix) = self.0.as_deref_mut() {
            if ix.keeps_rank(pos, node) {
                ix.refile(pos, node);
            } else {
                self.0 = None;
            }
        }
    }

    /// Any node of `nodes` may have changed: file each again, or drop the index if the node
    /// order changed.
    pub(crate) fn refile_all(&mut self, nodes: &[NodeCapacity]) {
        if let Some(ix) = self.0.as_deref_mut() {
            if ix.keys.len() == nodes.len() && nodes.iter().enumerate().all(|(i, n)| ix.keeps_rank(i, n)) {
                for (i, n) in nodes.iter().enumerate() {
                    ix.refile(i, n);
                }
            } else {
                self.0 = None;
            }
        }
    }
}

impl std::fmt::Debug for IndexSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IndexSlot")
    }
}
