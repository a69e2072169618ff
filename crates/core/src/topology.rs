//! A node's hardware as the scheduler sees it: packages, NUMA nodes with memory, cores, PUs.
//!
//! Built by the agent from hwloc (real machine, synthetic string or XML) and sent to the
//! controller at registration. PUs are named by their OS index, as the kernel's cpusets do.

use crate::gpu::{self, Gpu, GpuLink, GpuVendor};
use crate::{CoreError, CpuSet};
use serde::{Deserialize, Serialize};

/// PU and NUMA node numbers (OS indexes) are below this, as in the kernel lists
/// [`CpuSet::parse_list`] reads: a [`CpuSet`] holding u32::MAX would be a 512 MB bitmap.
pub const MAX_OS_INDEX: u32 = 1 << 20;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Package {
    pub os_index: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NumaNode {
    pub os_index: u32,
    pub memory_bytes: u64,
    pub cpus: CpuSet,
    /// Special memory (MCDRAM, HBM, NVM): listed and accounted, but not given to jobs by
    /// default since it is usually small or slow.
    #[serde(default, skip_serializing_if = "is_false")]
    pub special: bool,
    /// Where `memory_bytes` came from. Absent on the wire means hwloc (what agents before
    /// this field always used).
    #[serde(default, skip_serializing_if = "MemorySource::is_hwloc")]
    pub memory_source: MemorySource,
}

impl NumaNode {
    /// Whether jobs may be given this node's CPUs or memory: a node with no memory would
    /// give a job a 0-byte memory limit, and the kernel would kill it at once.
    pub fn has_memory(&self) -> bool {
        self.memory_bytes > 0
    }
}

/// Where a NUMA node's memory size comes from, best first after the admin's word.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemorySource {
    /// hwloc's `local_memory` of the node.
    #[default]
    Hwloc,
    /// The operating system's count for the node (`/sys/devices/system/node/nodeN/meminfo`).
    Os,
    /// The machine's total memory split over the NUMA nodes hwloc gave none.
    Split,
    /// The admin's override in the agent's configuration (`--numa-memory`).
    Config,
    /// No source knew: the node has no usable memory and takes no job. Also what a newer
    /// agent's unknown source reads as.
    #[serde(other)]
    Unknown,
}

impl MemorySource {
    pub fn is_hwloc(&self) -> bool {
        *self == MemorySource::Hwloc
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            MemorySource::Hwloc => "hwloc",
            MemorySource::Os => "os",
            MemorySource::Split => "split",
            MemorySource::Config => "config",
            MemorySource::Unknown => "unknown",
        }
    }
}

impl std::fmt::Display for MemorySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Core {
    /// Index into `Topology::packages`.
    pub package: usize,
    /// Index into `Topology::numa_nodes`, if the core lies under one.
    pub numa: Option<usize>,
    /// OS indexes of the core's PUs (hardware threads), in logical order.
    pub pus: Vec<u32>,
    /// CPU kind on hybrid machines (hwloc cpukinds), 0 the least efficient-for-performance
    /// kind (e.g. E-cores), higher for faster kinds (P-cores). 0 everywhere on ordinary machines.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub kind: u32,
    /// The cache or group shared by a set of cores inside a NUMA node (L3 slice, 4-core
    /// cluster), by logical index; the level between NUMA node and core in the hierarchy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<u32>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// One node's topology. Cores are in hwloc's logical order, grouped by package.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topology {
    pub packages: Vec<Package>,
    pub numa_nodes: Vec<NumaNode>,
    pub cores: Vec<Core>,
    /// PUs the hardware has but the OS does not let berth use (offline, or outside the
    /// agent's own cpuset); never allocated, shown in the topology drawing.
    #[serde(default, skip_serializing_if = "CpuSet::is_empty")]
    pub disallowed: CpuSet,
    /// The node's GPUs, by [`Gpu::index`] (see [`crate::gpu`]); absent on the wire when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<Gpu>,
    /// GPU-to-GPU links (NVLink and the like) between `gpus`, when the hardware reports them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_links: Vec<GpuLink>,
    /// What is worked out from the fields above on first use and kept with them (never sent,
    /// never compared): every node sharing this topology (`Arc<Topology>`) shares it too.
    /// Made from the topology as it is at first use: change no field after that (a shared
    /// topology is not changed; copies start without it).
    #[serde(skip)]
    pub derived: Derived,
}

/// Facts computed from a [`Topology`] once, when first asked ([`Topology::gpu_types`]).
/// Two topologies are equal whatever each has computed; a copy computes its own again.
#[derive(Default)]
pub struct Derived {
    gpu_types: std::sync::OnceLock<gpu::GpuTypes>,
}

impl Clone for Derived {
    fn clone(&self) -> Self {
        Derived::default()
    }
}

impl PartialEq for Derived {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Derived {}

impl std::fmt::Debug for Derived {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Derived")
    }
}

impl Topology {
    /// The words naming this topology's GPUs for `--gpu-type`, with the GPUs each names: made
    /// on first use and shared by every node holding this topology.
    pub fn gpu_types(&self) -> &gpu::GpuTypes {
        self.derived.gpu_types.get_or_init(|| gpu::GpuTypes::of(&self.gpus))
    }

    /// Where the GPUs `held` of a job on node `node` of this topology sit, in `held`'s order;
    /// `job_cpus` are the job's PUs there. A GPU the topology does not have (the node came back
    /// smaller) is left out.
    pub fn gpu_places(&self, node: &str, held: &[u32], job_cpus: &CpuSet) -> Vec<gpu::GpuPlace> {
        held.iter()
            .filter_map(|&i| self.gpus.get(i as usize))
            .map(|g| gpu::GpuPlace {
                node: node.to_string(),
                index: g.index,
                type_name: g.type_name(),
                numa: g.numa,
                socket: g.package.and_then(|p| self.packages.get(p)).map(|p| p.os_index),
                cpus: g.cpus.clone(),
                link_group: g.link_group,
                job_cpus_local: job_cpus.iter().filter(|&c| g.cpus.contains(c)).count() as u32,
            })
            .collect()
    }

    /// A regular machine, for tests and simulation: `packages` x `numa_per_package` x
    /// `cores_per_numa` x `pus_per_core`, PUs numbered in logical order.
    pub fn uniform(
        packages: u32,
        numa_per_package: u32,
        cores_per_numa: u32,
        pus_per_core: u32,
        mem_per_numa: u64,
    ) -> Self {
        let mut t = Topology {
            packages: vec![],
            numa_nodes: vec![],
            cores: vec![],
            disallowed: CpuSet::new(),
            gpus: vec![],
            gpu_links: vec![],
            derived: Derived::default(),
        };
        let mut pu = 0;
        for p in 0..packages {
            t.packages.push(Package { os_index: p });
            for _ in 0..numa_per_package {
                let numa = t.numa_nodes.len();
                let mut cpus = CpuSet::new();
                for _ in 0..cores_per_numa {
                    let pus: Vec<u32> = (pu..pu + pus_per_core).collect();
                    pu += pus_per_core;
                    pus.iter().for_each(|&i| cpus.insert(i));
                    t.cores.push(Core { package: p as usize, numa: Some(numa), pus, kind: 0, group: None });
                }
                t.numa_nodes.push(NumaNode {
                    os_index: numa as u32,
                    memory_bytes: mem_per_numa,
                    cpus,
                    special: false,
                    memory_source: MemorySource::Hwloc,
                });
            }
        }
        t
    }

    /// Check the invariants the scheduler relies on; a topology from the wire must pass this.
    pub fn validate(&self) -> Result<(), CoreError> {
        let bad = |m: String| Err(CoreError::BadTopology(m));
        if self.cores.is_empty() {
            return bad("no cores".into());
        }
        // memory_bytes() sums them: a total beyond u64 would overflow it.
        if self.numa_nodes.iter().try_fold(0u64, |sum, n| sum.checked_add(n.memory_bytes)).is_none() {
            return bad("the NUMA nodes' memory adds up to more than 2^64 bytes".into());
        }
        if let Some(n) = self.numa_nodes.iter().find(|n| n.os_index >= MAX_OS_INDEX) {
            return bad(format!("NUMA node {}: NUMA node numbers are below {MAX_OS_INDEX}", n.os_index));
        }
        let mut seen = CpuSet::new();
        for (i, core) in self.cores.iter().enumerate() {
            if core.package >= self.packages.len() {
                return bad(format!("core {i} names package {} of {}", core.package, self.packages.len()));
            }
            if core.numa.is_some_and(|n| n >= self.numa_nodes.len()) {
                return bad(format!("core {i} names a NUMA node that does not exist"));
            }
            if core.pus.is_empty() {
                return bad(format!("core {i} has no PUs"));
            }
            for &pu in &core.pus {
                if pu >= MAX_OS_INDEX {
                    return bad(format!("core {i} names PU {pu}; PU numbers are below {MAX_OS_INDEX}"));
                }
                if seen.contains(pu) {
                    return bad(format!("PU {pu} appears twice"));
                }
                seen.insert(pu);
            }
        }
        self.validate_gpus(&seen)
    }

    /// The GPUs' invariants: bounded counts and texts, indexes in order, locality naming NUMA
    /// nodes, packages and PUs the node has, links between distinct existing GPUs.
    fn validate_gpus(&self, pus: &CpuSet) -> Result<(), CoreError> {
        let bad = |m: String| Err(CoreError::BadTopology(m));
        if self.gpus.len() > gpu::MAX_GPUS {
            return bad(format!("{} GPUs, more than the {} berth accepts", self.gpus.len(), gpu::MAX_GPUS));
        }
        let long = |s: &str| s.is_empty() || s.len() > gpu::MAX_GPU_TEXT;
        let mut names = std::collections::HashSet::new();
        for (i, g) in self.gpus.iter().enumerate() {
            if g.index as usize != i {
                return bad(format!("GPU {i} is numbered {}; GPUs are numbered 0, 1, ... in order", g.index));
            }
            if let Some(n) = g.numa.filter(|&n| self.numa_by_os(n).is_none()) {
                return bad(format!("GPU {i} names NUMA node {n}, which the node does not have"));
            }
            if let Some(p) = g.package.filter(|&p| p >= self.packages.len()) {
                return bad(format!("GPU {i} names package {p} of {}", self.packages.len()));
            }
            if let Some(pu) = g.cpus.iter().find(|&pu| !pus.contains(pu) && !self.disallowed.contains(pu)) {
                return bad(format!("GPU {i} is local to PU {pu}, which the node does not have"));
            }
            if g.os_devices.len() > gpu::MAX_OS_DEVICES {
                return bad(format!(
                    "GPU {i} lists {} OS devices, more than {}",
                    g.os_devices.len(),
                    gpu::MAX_OS_DEVICES
                ));
            }
            for name in &g.os_devices {
                if long(name) {
                    return bad(format!("GPU {i} has an empty or overlong OS device name"));
                }
                if !names.insert(name.as_str()) {
                    return bad(format!("OS device {name:?} belongs to two GPUs"));
                }
            }
            if g.device_files.len() > gpu::MAX_OS_DEVICES {
                return bad(format!(
                    "GPU {i} lists {} device files, more than {}",
                    g.device_files.len(),
                    gpu::MAX_OS_DEVICES
                ));
            }
            if let Some(f) = g.device_files.iter().find(|f| long(f) || !f.starts_with('/') || f.contains("/../")) {
                return bad(format!(
                    "GPU {i} has device file {f:?}: device files are absolute paths of at most {} bytes",
                    gpu::MAX_GPU_TEXT
                ));
            }
            if [&g.model, &g.pci_bus_id, &g.uuid].into_iter().flatten().any(|s| long(s)) {
                return bad(format!("GPU {i} has an empty or overlong model, PCI id or UUID"));
            }
            if g.link_group.is_some_and(|l| l as usize >= self.gpus.len()) {
                return bad(format!("GPU {i} names link group {:?}; groups are numbered by GPU", g.link_group));
            }
        }
        let mut pairs = std::collections::HashSet::new();
        for l in &self.gpu_links {
            if l.a >= l.b || l.b as usize >= self.gpus.len() {
                return bad(format!("GPU link {}-{}: links join two GPUs a < b of {}", l.a, l.b, self.gpus.len()));
            }
            if !pairs.insert((l.a, l.b)) {
                return bad(format!("GPU link {}-{} is listed twice", l.a, l.b));
            }
        }
        Ok(())
    }

    /// Give every NUMA node with PUs and ordinary memory `per_numa` emulated GPUs local to it
    /// (`berth up --gpus-per-numa N`), numbered after any GPUs already there; the GPUs of one
    /// package form one link group, as on a node whose GPUs are linked per socket.
    pub fn add_emulated_gpus(&mut self, per_numa: u32) -> Result<(), CoreError> {
        let bad = |m: String| Err(CoreError::BadTopology(m));
        if per_numa > gpu::MAX_EMULATED_PER_NUMA {
            return bad(format!("{per_numa} emulated GPUs per NUMA node, more than {}", gpu::MAX_EMULATED_PER_NUMA));
        }
        let mut added = vec![];
        for (n, node) in self.numa_nodes.iter().enumerate() {
            if node.special || node.cpus.is_empty() {
                continue;
            }
            let package = self.cores.iter().find(|c| c.numa == Some(n)).map(|c| c.package);
            for _ in 0..per_numa {
                added.push((node.os_index, package, node.cpus.clone()));
            }
        }
        if self.gpus.len() + added.len() > gpu::MAX_GPUS {
            return bad(format!(
                "{} GPUs, more than the {} berth accepts",
                self.gpus.len() + added.len(),
                gpu::MAX_GPUS
            ));
        }
        // The first emulated GPU of each package names its link group.
        let mut group_of_package = std::collections::HashMap::new();
        for (numa, package, cpus) in added {
            let index = self.gpus.len() as u32;
            let link_group = package.map(|p| *group_of_package.entry(p).or_insert(index));
            self.gpus.push(Gpu {
                index,
                vendor: GpuVendor::Other,
                model: Some("emulated".into()),
                pci_bus_id: None,
                numa: Some(numa),
                package,
                cpus,
                os_devices: vec![],
                uuid: None,
                memory_bytes: None,
                link_group,
                emulated: true,
                device_files: vec![],
            });
        }
        Ok(())
    }

    /// The GPUs local to the NUMA node with OS index `os_index`.
    pub fn numa_gpus(&self, os_index: u32) -> impl Iterator<Item = &Gpu> + '_ {
        self.gpus.iter().filter(move |g| g.numa == Some(os_index))
    }

    pub fn pu_count(&self) -> usize {
        self.cores.iter().map(|c| c.pus.len()).sum()
    }

    pub fn core_count(&self) -> usize {
        self.cores.len()
    }

    pub fn threads_per_core(&self) -> usize {
        self.cores.iter().map(|c| c.pus.len()).max().unwrap_or(1)
    }

    pub fn memory_bytes(&self) -> u64 {
        self.numa_nodes.iter().map(|n| n.memory_bytes).sum()
    }

    pub fn all_pus(&self) -> CpuSet {
        self.cores.iter().flat_map(|c| c.pus.iter().copied()).collect()
    }

    /// The NUMA nodes (by os index) local to `cpus`; all of them if none is known.
    pub fn mems_for(&self, cpus: &CpuSet) -> CpuSet {
        let mut mems: CpuSet = self
            .cores
            .iter()
            .filter(|c| c.pus.iter().any(|&p| cpus.contains(p)))
            .filter_map(|c| c.numa.map(|n| self.numa_nodes[n].os_index))
            .collect();
        if mems.is_empty() {
            mems = self.numa_nodes.iter().map(|n| n.os_index).collect();
        }
        mems
    }

    /// Grid Engine topology string: `S` per package, `C` per core, `T` per thread when cores
    /// have more than one (e.g. `SCCSCC`, `SCTTCTT`). Everything all of whose PUs are in
    /// `busy` is printed as `.` (e.g. `...SCC` when the first package is fully used).
    pub fn ge_string(&self, busy: &CpuSet) -> String {
        let smt = self.threads_per_core() > 1;
        let mut out = String::new();
        for (p, _) in self.packages.iter().enumerate() {
            let cores: Vec<&Core> = self.cores.iter().filter(|c| c.package == p).collect();
            let all_busy = |pus: &[u32]| pus.iter().all(|&pu| busy.contains(pu));
            let package_busy = !cores.is_empty() && cores.iter().all(|c| all_busy(&c.pus));
            out.push(if package_busy { '.' } else { 'S' });
            for core in cores {
                out.push(if all_busy(&core.pus) { '.' } else { 'C' });
                if smt {
                    for pu in &core.pus {
                        out.push(if busy.contains(*pu) { '.' } else { 'T' });
                    }
                }
            }
        }
        out
    }

    /// Grid Engine's logical (socket, core) of the core at `index`: the package's position
    /// and the core's position among that package's cores, both from 0.
    pub fn socket_core(&self, index: usize) -> (u32, u32) {
        let package = self.cores[index].package;
        let before = self.cores[..index].iter().filter(|c| c.package == package).count();
        (package as u32, before as u32)
    }

    /// The index of Grid Engine's logical core `core` on socket `socket`, if it exists.
    pub fn core_index(&self, socket: u32, core: u32) -> Option<usize> {
        self.cores.iter().enumerate().filter(|(_, c)| c.package == socket as usize).nth(core as usize).map(|(i, _)| i)
    }

    /// Indexes of the cores of NUMA node `numa` (an index into `numa_nodes`).
    pub fn numa_cores(&self, numa: usize) -> impl Iterator<Item = usize> + '_ {
        self.cores.iter().enumerate().filter(move |(_, c)| c.numa == Some(numa)).map(|(i, _)| i)
    }

    /// Index into `numa_nodes` of the NUMA node with OS index `os_index`.
    pub fn numa_by_os(&self, os_index: u32) -> Option<usize> {
        self.numa_nodes.iter().position(|n| n.os_index == os_index)
    }

    /// Grid Engine's load values: m_socket, m_core, m_thread.
    pub fn ge_counts(&self) -> (usize, usize, usize) {
        (self.packages.len(), self.core_count(), self.pu_count())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ge_strings() {
        let t = Topology::uniform(2, 1, 2, 1, 1 << 30);
        assert_eq!(t.ge_string(&CpuSet::new()), "SCCSCC");
        assert_eq!(t.ge_string(&CpuSet::parse_list("0-1").unwrap()), "...SCC");
        assert_eq!(t.ge_string(&CpuSet::parse_list("2").unwrap()), "SCCS.C");
        let smt = Topology::uniform(1, 1, 2, 2, 1 << 30);
        assert_eq!(smt.ge_string(&CpuSet::new()), "SCTTCTT");
        assert_eq!(smt.ge_string(&CpuSet::parse_list("1").unwrap()), "SCT.CTT");
        assert_eq!(smt.ge_string(&CpuSet::parse_list("0-1").unwrap()), "S...CTT");
        assert_eq!(smt.ge_counts(), (1, 2, 4));
    }

    #[test]
    fn uniform_shape_and_mems() {
        let t = Topology::uniform(2, 2, 4, 2, 1 << 30);
        t.validate().unwrap();
        assert_eq!(t.pu_count(), 32);
        assert_eq!(t.core_count(), 16);
        assert_eq!(t.memory_bytes(), 4 << 30);
        assert_eq!(t.mems_for(&CpuSet::parse_list("0-1").unwrap()).to_list(), "0");
        assert_eq!(t.mems_for(&CpuSet::parse_list("7-8").unwrap()).to_list(), "0-1");
    }

    #[test]
    fn memory_source_on_the_wire() {
        // Older agents send no source: hwloc. A source this version does not know: unknown.
        let old = r#"{"os_index":0,"memory_bytes":1,"cpus":"0"}"#;
        assert_eq!(serde_json::from_str::<NumaNode>(old).unwrap().memory_source, MemorySource::Hwloc);
        let newer = r#"{"os_index":0,"memory_bytes":1,"cpus":"0","memory_source":"bios"}"#;
        assert_eq!(serde_json::from_str::<NumaNode>(newer).unwrap().memory_source, MemorySource::Unknown);
        let mut n = Topology::uniform(1, 1, 1, 1, 1).numa_nodes.remove(0);
        assert!(!serde_json::to_string(&n).unwrap().contains("memory_source"));
        n.memory_source = MemorySource::Split;
        let text = serde_json::to_string(&n).unwrap();
        assert!(text.contains(r#""memory_source":"split""#), "{text}");
        assert_eq!(serde_json::from_str::<NumaNode>(&text).unwrap(), n);
    }

    #[test]
    fn validate_rejects_duplicates() {
        let mut t = Topology::uniform(1, 1, 2, 1, 0);
        t.cores[1].pus = vec![0];
        assert!(t.validate().is_err());
        t.cores[1].package = 5;
        assert!(t.validate().is_err());
    }

    #[test]
    fn gpus_off_the_wire_when_none() {
        // A topology without GPUs serializes as before GPUs existed, and old data parses.
        let t = Topology::uniform(1, 2, 2, 1, 1 << 30);
        let text = serde_json::to_string(&t).unwrap();
        assert!(!text.contains("gpu"), "{text}");
        assert_eq!(serde_json::from_str::<Topology>(&text).unwrap(), t);
    }

    #[test]
    fn emulated_gpus_are_local_to_their_numa_node() {
        let mut t = Topology::uniform(2, 2, 2, 2, 1 << 30);
        t.add_emulated_gpus(2).unwrap();
        t.validate().unwrap();
        assert_eq!(t.gpus.len(), 8);
        for (i, g) in t.gpus.iter().enumerate() {
            assert_eq!(g.index as usize, i);
            assert!(g.emulated);
            assert_eq!(g.type_name(), "emulated");
            let numa = t.numa_by_os(g.numa.unwrap()).unwrap();
            assert_eq!(numa, i / 2, "two GPUs per NUMA node, in order");
            assert_eq!(g.cpus, t.numa_nodes[numa].cpus);
            assert_eq!(g.package, Some(i / 4));
            // One link group per package, named by its first GPU.
            assert_eq!(g.link_group, Some(if i < 4 { 0 } else { 4 }));
        }
        assert_eq!(t.numa_gpus(1).map(|g| g.index).collect::<Vec<_>>(), vec![2, 3]);
        let text = serde_json::to_string(&t).unwrap();
        assert_eq!(serde_json::from_str::<Topology>(&text).unwrap(), t);
        // Bounded.
        let mut big = Topology::uniform(1, 1, 1, 1, 1);
        assert!(big.add_emulated_gpus(gpu::MAX_EMULATED_PER_NUMA + 1).is_err());
        assert!(big.gpus.is_empty());
    }

    #[test]
    fn validate_refuses_bad_gpus() {
        let mut good = Topology::uniform(2, 1, 2, 1, 1 << 30);
        good.add_emulated_gpus(1).unwrap();
        good.gpu_links = vec![GpuLink { a: 0, b: 1, bandwidth_mbs: 25_000 }];
        good.validate().unwrap();
        let refused = |edit: &dyn Fn(&mut Topology), why: &str| {
            let mut t = good.clone();
            edit(&mut t);
            let err = t.validate().unwrap_err().to_string();
            assert!(err.contains(why), "{err}");
        };
        refused(&|t| t.gpus[1].numa = Some(7), "NUMA node 7");
        refused(&|t| t.gpus[0].package = Some(2), "package 2");
        refused(&|t| t.gpus[0].index = 1, "numbered 1");
        refused(&|t| t.gpus[0].cpus.insert(99), "PU 99");
        refused(&|t| t.gpus[0].link_group = Some(5), "link group");
        refused(&|t| t.gpu_links[0].b = 2, "link 0-2");
        refused(&|t| t.gpu_links.push(GpuLink { a: 1, b: 0, bandwidth_mbs: 0 }), "link 1-0");
        refused(&|t| t.gpu_links.push(t.gpu_links[0].clone()), "twice");
        refused(
            &|t| {
                t.gpus[0].os_devices = vec!["cuda0".into()];
                t.gpus[1].os_devices = vec!["cuda0".into()];
            },
            "two GPUs",
        );
        refused(&|t| t.gpus[0].model = Some("x".repeat(gpu::MAX_GPU_TEXT + 1)), "overlong");
        refused(
            &|t| {
                let g = t.gpus[0].clone();
                t.gpus = (0..=gpu::MAX_GPUS as u32).map(|index| Gpu { index, ..g.clone() }).collect();
            },
            "more than",
        );
    }

    #[test]
    fn link_groups_are_connected_parts() {
        let link = |a, b| GpuLink { a, b, bandwidth_mbs: 1 };
        // 0-1, 2-3-4 (chain), 5 alone.
        let groups = gpu::link_groups(6, &[link(0, 1), link(3, 4), link(2, 3)]);
        assert_eq!(groups, vec![Some(0), Some(0), Some(2), Some(2), Some(2), None]);
        assert_eq!(gpu::link_groups(2, &[link(0, 5)]), vec![None, None]);
    }
}
