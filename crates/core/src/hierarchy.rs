//! The cluster's interconnect as a tree, for placing jobs close together.
//!
//! Either switches as in Slurm's topology.conf (leaf switches list nodes, upper switches list
//! switches), or the seed's building blocks: groups of 8/32/128/512 CPUs taken over the
//! nodes in their [`NodeOrder`] (seeds/000: "a hierarchy of building blocks of 8, 32, 128 and
//! 512 CPUs"): an admin's list, else names in natural order (node2 before node10), never the
//! order agents happened to register in. Each node gets a location: its group at every level,
//! leaf level first.

use crate::node::NodeCapacity;
use crate::CoreError;
use serde::{Deserialize, Serialize};
use std::cmp::Ordering;
use std::collections::HashMap;

/// Names in natural order: runs of digits compare as numbers (node2 before node10), the rest
/// character by character; equal numbers with more leading zeros come later, so the order is
/// total and agrees with equality.
pub fn natural_cmp(a: &str, b: &str) -> Ordering {
    let (mut x, mut y) = (a.as_bytes(), b.as_bytes());
    let digits = |s: &[u8]| s.iter().take_while(|c| c.is_ascii_digit()).count();
    let mut zeros = Ordering::Equal;
    while let (Some(&c), Some(&d)) = (x.first(), y.first()) {
        if c.is_ascii_digit() && d.is_ascii_digit() {
            let (m, n) = (digits(x), digits(y));
            let (p, q) = (&x[..m], &y[..n]);
            let (ps, qs) = (trim_zeros(p), trim_zeros(q));
            let by_value = ps.len().cmp(&qs.len()).then_with(|| ps.cmp(qs));
            if by_value != Ordering::Equal {
                return by_value;
            }
            zeros = zeros.then(m.cmp(&n));
            x = &x[m..];
            y = &y[n..];
        } else {
            if c != d {
                return c.cmp(&d);
            }
            x = &x[1..];
            y = &y[1..];
        }
    }
    x.len().cmp(&y.len()).then(zeros)
}

fn trim_zeros(s: &[u8]) -> &[u8] {
    let k = s.iter().take_while(|&&c| c == b'0').count();
    &s[k..]
}

/// The order nodes are listed and grouped in: the admin's list first, in its order
/// (`[interconnect] order`, host lists like `n[1-4]` expanded), then every other node by name
/// in natural order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeOrder {
    rank: HashMap<String, usize>,
}

impl NodeOrder {
    /// From the admin's list; a name given twice is refused.
    pub fn listed(patterns: &[String]) -> Result<Self, CoreError> {
        let mut rank = HashMap::new();
        for pattern in patterns {
            for name in expand_hostlist(pattern).map_err(|m| CoreError::BadRequest(format!("interconnect: {m}")))? {
                let next = rank.len();
                if rank.insert(name.clone(), next).is_some() {
                    return Err(CoreError::BadRequest(format!("interconnect: order names node {name} twice")));
                }
            }
        }
        Ok(NodeOrder { rank })
    }

    pub fn cmp(&self, a: &str, b: &str) -> Ordering {
        match (self.rank.get(a), self.rank.get(b)) {
            (Some(i), Some(j)) => i.cmp(j),
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (None, None) => natural_cmp(a, b),
        }
    }

    /// Positions `0..names.len()` of `names` in this order (ties, i.e. the same name twice,
    /// keep their positions' order).
    pub fn arrange<'a>(&self, names: impl IntoIterator<Item = &'a str>) -> Vec<usize> {
        let names: Vec<&str> = names.into_iter().collect();
        let mut order: Vec<usize> = (0..names.len()).collect();
        order.sort_by(|&i, &j| self.cmp(names[i], names[j]));
        order
    }
}

/// A switch: leaf switches name nodes, upper switches name switches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SwitchDef {
    pub name: String,
    /// Node names; `n[1-4,7]` ranges are expanded.
    #[serde(default)]
    pub nodes: Vec<String>,
    #[serde(default)]
    pub switches: Vec<String>,
}

/// Group id at every level for nodes the tree does not name: they share one group.
pub const UNPLACED: u32 = u32::MAX;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Hierarchy {
    /// Flat: all nodes alike.
    #[default]
    Flat,
    /// Node name -> group per level (leaf first).
    Switches { levels: usize, location: HashMap<String, Vec<u32>> },
    /// Building-block sizes in CPUs, increasing, taken over the nodes in `order`.
    Blocks { sizes: Vec<u64>, order: NodeOrder },
}

impl Hierarchy {
    pub fn from_switches(defs: &[SwitchDef]) -> Result<Self, CoreError> {
        let bad = |m: String| Err(CoreError::BadRequest(format!("interconnect: {m}")));
        let index: HashMap<&str, usize> = defs.iter().enumerate().map(|(i, d)| (d.name.as_str(), i)).collect();
        if index.len() != defs.len() {
            return bad("two switches have the same name".into());
        }
        let mut parent: Vec<Option<usize>> = vec![None; defs.len()];
        for (i, d) in defs.iter().enumerate() {
            if !d.nodes.is_empty() && !d.switches.is_empty() {
                return bad(format!("switch {} lists both nodes and switches; a switch has one or the other", d.name));
            }
            for child in &d.switches {
                let Some(&c) = index.get(child.as_str()) else {
                    return bad(format!("switch {} names unknown switch {child}", d.name));
                };
                if parent[c].replace(i).is_some() {
                    return bad(format!("switch {child} has two parents"));
                }
            }
        }
        // Height of each switch (leaf = 0); a cycle shows as a height above the switch count.
        let mut height = vec![0usize; defs.len()];
        for i in 0..defs.len() {
            let (mut cur, mut h) = (i, 0);
            while let Some(p) = parent[cur] {
                h += 1;
                if h > defs.len() {
                    return bad(format!("switches form a cycle through {}", defs[i].name));
                }
                height[p] = height[p].max(h);
                cur = p;
            }
        }
        let levels = height.iter().max().map_or(0, |h| h + 1);
        let mut location = HashMap::new();
        for (i, d) in defs.iter().enumerate().filter(|(_, d)| !d.nodes.is_empty()) {
            // The node's group at level l is its ancestor of the largest height <= l.
            let mut path = vec![i as u32; levels];
            let mut cur = i;
            while let Some(p) = parent[cur] {
                for slot in path.iter_mut().skip(height[p]) {
                    *slot = p as u32;
                }
                cur = p;
            }
            for pattern in &d.nodes {
                for name in expand_hostlist(pattern).map_err(|m| CoreError::BadRequest(format!("interconnect: {m}")))? {
                    if location.insert(name.clone(), path.clone()).is_some() {
                        return bad(format!("node {name} is under two leaf switches"));
                    }
                }
            }
        }
        Ok(Hierarchy::Switches { levels, location })
    }

    /// Building blocks over the nodes in natural name order.
    pub fn blocks(sizes: Vec<u64>) -> Self {
        Self::blocks_in(sizes, NodeOrder::default())
    }

    /// Building blocks over the nodes in `order`.
    pub fn blocks_in(mut sizes: Vec<u64>, order: NodeOrder) -> Self {
        sizes.retain(|&s| s > 0);
        sizes.sort_unstable();
        sizes.dedup();
        Hierarchy::Blocks { sizes, order }
    }

    /// Set every node's `location` (building blocks over the nodes in their order, whatever
    /// their ids).
    pub fn locate_all(&self, nodes: &mut [NodeCapacity]) {
        match self {
            Hierarchy::Flat => nodes.iter_mut().for_each(|n| n.location.clear()),
            Hierarchy::Switches { levels, location } => {
                for n in nodes.iter_mut() {
                    n.location = location.get(&n.name).cloned().unwrap_or_else(|| vec![UNPLACED; *levels]);
                }
            }
            Hierarchy::Blocks { sizes, order } => {
                let largest = nodes.iter().map(|n| n.topology.pu_count() as u64).max().unwrap_or(0);
                let levels: Vec<u64> = sizes.iter().copied().filter(|&s| s > largest).collect();
                let mut offset = 0u64;
                for i in order.arrange(nodes.iter().map(|n| n.name.as_str())) {
                    let pus = nodes[i].topology.pu_count() as u64;
                    nodes[i].location = levels.iter().map(|&s| (offset / s) as u32).collect();
                    offset += pus;
                }
            }
        }
    }
}

/// Most names one host list may expand to.
pub const MAX_HOSTLIST_NAMES: usize = 100_000;

/// Why a host list (`n[1-3,7]`, `node[1-3],login`) cannot be expanded. `list` is the
/// pattern or list as given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostlistError {
    #[error("{list:?}: unbalanced [ ]")]
    Unbalanced { list: String },
    #[error("{list:?}: {part:?} is not a range like 1-4")]
    BadRange { list: String, part: String },
    /// Too many names: `what` is "nodes" or "hosts", as the caller says.
    #[error("{list:?} names more than {MAX_HOSTLIST_NAMES} {what}")]
    TooMany { list: String, what: &'static str },
}

/// For callers that gather errors as text.
impl From<HostlistError> for String {
    fn from(e: HostlistError) -> String {
        e.to_string()
    }
}

/// Expand `n[1-3,7]` into n1 n2 n3 n7 (zero padding kept: `n[01-02]` gives n01 n02).
pub fn expand_hostlist(pattern: &str) -> Result<Vec<String>, HostlistError> {
    let Some(open) = pattern.find('[') else { return Ok(vec![pattern.to_string()]) };
    let close = pattern
        .find(']')
        .filter(|&c| c > open)
        .ok_or_else(|| HostlistError::Unbalanced { list: pattern.to_string() })?;
    let (prefix, body, suffix) = (&pattern[..open], &pattern[open + 1..close], &pattern[close + 1..]);
    // Expanded once, and the product bounded: `n[0-99999][0-99999]` would be 10^10 names.
    let rests = expand_hostlist(suffix)?;
    let mut out = Vec::new();
    for part in body.split(',') {
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        let width = lo.len();
        let (a, b) = match (lo.parse::<u64>(), hi.parse::<u64>()) {
            (Ok(a), Ok(b)) if a <= b && b - a < 100_000 => (a, b),
            _ => return Err(HostlistError::BadRange { list: pattern.to_string(), part: part.to_string() }),
        };
        if out.len() as u64 + (b - a + 1) * rests.len() as u64 > MAX_HOSTLIST_NAMES as u64 {
            return Err(HostlistError::TooMany { list: pattern.to_string(), what: "nodes" });
        }
        for i in a..=b {
            for rest in &rests {
                out.push(format!("{prefix}{i:0width$}{rest}"));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::Topology;
    use crate::NodeId;
    use std::sync::Arc;

    fn nodes(n: u32, topo: Topology) -> Vec<NodeCapacity> {
        let t = Arc::new(topo);
        (0..n).map(|i| NodeCapacity::new(NodeId(i), format!("n{i}"), t.clone())).collect()
    }

    #[test]
    fn switches_give_paths() {
        let defs = vec![
            SwitchDef { name: "l0".into(), nodes: vec!["n[0-1]".into()], switches: vec![] },
            SwitchDef { name: "l1".into(), nodes: vec!["n[2-3]".into()], switches: vec![] },
            SwitchDef { name: "top".into(), nodes: vec![], switches: vec!["l0".into(), "l1".into()] },
        ];
        let h = Hierarchy::from_switches(&defs).unwrap();
        let mut ns = nodes(5, Topology::uniform(1, 1, 2, 1, 1 << 30));
        h.locate_all(&mut ns);
        assert_eq!(ns[0].location, vec![0, 2]);
        assert_eq!(ns[1].location, vec![0, 2]);
        assert_eq!(ns[3].location, vec![1, 2]);
        assert_eq!(ns[4].location, vec![UNPLACED, UNPLACED]);
    }

    #[test]
    fn bad_switch_trees_are_refused() {
        let cyc = vec![
            SwitchDef { name: "a".into(), nodes: vec![], switches: vec!["b".into()] },
            SwitchDef { name: "b".into(), nodes: vec![], switches: vec!["a".into()] },
        ];
        assert!(Hierarchy::from_switches(&cyc).unwrap_err().to_string().contains("cycle"));
        let unknown = vec![SwitchDef { name: "a".into(), nodes: vec![], switches: vec!["zz".into()] }];
        assert!(Hierarchy::from_switches(&unknown).is_err());
        let twice = vec![
            SwitchDef { name: "a".into(), nodes: vec!["n1".into()], switches: vec![] },
            SwitchDef { name: "b".into(), nodes: vec!["n[1-2]".into()], switches: vec![] },
        ];
        assert!(Hierarchy::from_switches(&twice).unwrap_err().to_string().contains("two leaf"));
    }

    #[test]
    fn building_blocks_over_32_cpu_nodes() {
        // The Altix: 32-CPU hosts; blocks of 8 and 32 are inside a host, 128 = 4 hosts, 512 = 16.
        let h = Hierarchy::blocks(vec![8, 32, 128, 512]);
        let mut ns = nodes(20, Topology::uniform(1, 16, 2, 1, 1 << 30));
        h.locate_all(&mut ns);
        assert_eq!(ns[0].location, vec![0, 0]);
        assert_eq!(ns[3].location, vec![0, 0]);
        assert_eq!(ns[4].location, vec![1, 0]);
        assert_eq!(ns[17].location, vec![4, 1]);
    }

    /// Issue 17 item 5: blocks followed the order agents registered in, so "adjacent" nodes
    /// differed from run to run. They follow names in natural order, or the admin's list.
    #[test]
    fn blocks_follow_names_not_registration() {
        let t = Arc::new(Topology::uniform(1, 16, 2, 1, 1 << 30));
        // Registered (ids) in a scrambled order.
        let names = ["node10", "node2", "node1", "node3", "node11", "node4", "node12", "node9"];
        let mut ns: Vec<NodeCapacity> =
            names.iter().enumerate().map(|(i, n)| NodeCapacity::new(NodeId(i as u32), *n, t.clone())).collect();
        Hierarchy::blocks(vec![128]).locate_all(&mut ns);
        let block = |ns: &[NodeCapacity], name: &str| ns.iter().find(|n| n.name == name).unwrap().location.clone();
        for n in ["node1", "node2", "node3", "node4"] {
            assert_eq!(block(&ns, n), vec![0], "{n}");
        }
        for n in ["node9", "node10", "node11", "node12"] {
            assert_eq!(block(&ns, n), vec![1], "{n}");
        }
        let order = NodeOrder::listed(&["node[9-12]".into(), "node1".into()]).unwrap();
        Hierarchy::blocks_in(vec![128], order).locate_all(&mut ns);
        for n in ["node9", "node10", "node11", "node12"] {
            assert_eq!(block(&ns, n), vec![0], "{n}");
        }
        for n in ["node1", "node2", "node3", "node4"] {
            assert_eq!(block(&ns, n), vec![1], "{n}");
        }
        assert!(NodeOrder::listed(&["n[1-3]".into(), "n2".into()]).is_err());
    }

    #[test]
    fn natural_order() {
        let mut v =
            vec!["node10", "node2", "node1", "n01", "n1", "node", "rack2-n3", "rack10-n1", "rack2-n10", "a", "B"];
        v.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(
            v,
            ["B", "a", "n1", "n01", "node", "node1", "node2", "node10", "rack2-n3", "rack2-n10", "rack10-n1"]
        );
        assert_eq!(natural_cmp("x007", "x7"), Ordering::Greater);
        assert_eq!(natural_cmp("x7", "x7"), Ordering::Equal);
        assert_eq!(natural_cmp("99999999999999999999999", "100000000000000000000000"), Ordering::Less);
        let order = NodeOrder::default();
        assert_eq!(order.arrange(["c10", "c9", "b"]), vec![2, 1, 0]);
    }

    #[test]
    fn hostlists() {
        assert_eq!(expand_hostlist("n[01-03,7]").unwrap(), vec!["n01", "n02", "n03", "n7"]);
        assert_eq!(expand_hostlist("plain").unwrap(), vec!["plain"]);
        assert!(expand_hostlist("n[3-1]").is_err());
        assert!(expand_hostlist("n[1-").is_err());
    }
}
