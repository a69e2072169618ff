//! Mapping a node's PUs and NUMA nodes onto the host's real CPUs and memory nodes.
//!
//! An emulated node (hwloc synthetic string or XML of another machine) has more PUs than the
//! host. Rule: the node's PUs, taken in topology (logical) order, are dealt round-robin onto
//! the host CPUs the agent may use, in increasing order: logical PU i runs on real CPU
//! `real[i % real.len()]`. NUMA nodes likewise: logical NUMA node j uses real memory node
//! `real_mems[j % real_mems.len()]`. On the real machine the map is the identity. The job's
//! cgroup holds the mapped CPUs, so containment is real even when the topology is not.

use berth_core::topology::Topology;
use berth_core::CpuSet;
use std::collections::HashMap;

#[derive(Debug, Clone)]
pub struct CpuMap {
    pus: HashMap<u32, u32>,
    mems: HashMap<u32, u32>,
    pub real_cpus: CpuSet,
    pub real_mems: CpuSet,
}

impl CpuMap {
    pub fn identity(topo: &Topology, real_cpus: CpuSet, real_mems: CpuSet) -> Self {
        let pus = topo.all_pus().iter().map(|p| (p, p)).collect();
        let mems = topo.numa_nodes.iter().map(|n| (n.os_index, n.os_index)).collect();
        CpuMap { pus, mems, real_cpus, real_mems }
    }

    pub fn round_robin(topo: &Topology, real_cpus: CpuSet, real_mems: CpuSet) -> Self {
        let real: Vec<u32> = real_cpus.iter().collect();
        let rmems: Vec<u32> = real_mems.iter().collect();
        let mut pus = HashMap::new();
        if !real.is_empty() {
            for (i, pu) in topo.cores.iter().flat_map(|c| c.pus.iter().copied()).enumerate() {
                pus.insert(pu, real[i % real.len()]);
            }
        }
        let mut mems = HashMap::new();
        if !rmems.is_empty() {
            for (j, n) in topo.numa_nodes.iter().enumerate() {
                mems.insert(n.os_index, rmems[j % rmems.len()]);
            }
        }
        CpuMap { pus, mems, real_cpus, real_mems }
    }

    /// The real CPUs backing `cpus`.
    pub fn cpus(&self, cpus: &CpuSet) -> CpuSet {
        cpus.iter().filter_map(|p| self.pus.get(&p).copied()).collect()
    }

    /// The real memory nodes backing `mems`; all real ones if none maps.
    pub fn mems(&self, mems: &CpuSet) -> CpuSet {
        let m: CpuSet = mems.iter().filter_map(|n| self.mems.get(&n).copied()).collect();
        if m.is_empty() {
            self.real_mems.clone()
        } else {
            m
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_robin_onto_two_cpus() {
        let topo = Topology::uniform(2, 2, 4, 2, 1 << 30);
        let map = CpuMap::round_robin(&topo, CpuSet::parse_list("0-1").unwrap(), CpuSet::parse_list("0").unwrap());
        assert_eq!(map.cpus(&CpuSet::parse_list("0").unwrap()).to_list(), "0");
        assert_eq!(map.cpus(&CpuSet::parse_list("1").unwrap()).to_list(), "1");
        assert_eq!(map.cpus(&CpuSet::parse_list("4").unwrap()).to_list(), "0");
        assert_eq!(map.cpus(&CpuSet::parse_list("4-5").unwrap()).to_list(), "0-1");
        assert_eq!(map.mems(&CpuSet::parse_list("1-3").unwrap()).to_list(), "0");
    }

    #[test]
    fn identity_keeps_numbers() {
        let topo = Topology::uniform(1, 1, 2, 1, 1 << 30);
        let map = CpuMap::identity(&topo, CpuSet::parse_list("0-1").unwrap(), CpuSet::parse_list("0").unwrap());
        assert_eq!(map.cpus(&CpuSet::parse_list("1").unwrap()).to_list(), "1");
    }
}
