//! A node's hardware topology, read with hwloc and converted to berth's model
//! ([`berth_core::topology::Topology`]).
//!
//! Three sources: the real machine, an hwloc synthetic description (e.g.
//! `"package:2 numa:2 core:4 pu:2"`) and an hwloc XML export (`lstopo FILE.xml`). The last
//! two let a small test box pretend to be a large compute node.
//!
//! Test data: the real-machine XML exports the tests load come from the hwloc project's test
//! suite (open-mpi/hwloc, BSD licence), via ../shared/data/hwloc, vendored in this repository
//! as `data/hwloc` (reached from this crate as `../../data/hwloc`); its README lists the
//! machines and their shapes. Berth's model of each is kept as JSON in
//! `crates/core/tests/fixtures/topologies` for the core crate's tests (which have no hwloc);
//! `fixtures_match_xml` below checks and regenerates them. Hand-made files for shapes those
//! exports lack (NUMA nodes without memory, a cgroup-restricted nodeset, 4- and 8-GPU nodes
//! with NVLink) are in `tests/data/hwloc`, whose README says how each was made.
//!
//! I/O objects are kept (hwloc drops them by default) so that `crate::gpus` finds the GPUs.

use berth_core::topology::{Core, MemorySource, NumaNode, Package, Topology};
use berth_core::units::{format_size, parse_size};
use berth_core::{CoreError, CpuSet};
use hwlocality::bitmap::Bitmap;
use hwlocality::errors::{FlagsError, HybridError};
use hwlocality::object::attributes::ObjectAttributes;
use hwlocality::object::depth::Depth;
use hwlocality::object::types::ObjectType;
use hwlocality::object::TopologyObject;
use hwlocality::topology::builder::{BuildFlags, TopologyBuilder, TypeFilter, TypeFilterError};
use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};

type HwTopology = hwlocality::Topology;

/// hwloc's own example of a synthetic description, shown when one does not parse.
const SYNTHETIC_EXAMPLE: &str = "package:2 numa:2 core:4 pu:2";

/// The most PUs a synthetic description may make. hwloc's time and memory grow about
/// quadratically with the PU count (32768 PUs take seconds, 100000 most of a minute and 2 GB),
/// so a typo like "core:4000000" must not reach it.
pub const MAX_SYNTHETIC_PUS: u64 = 1 << 15;

/// The most objects a synthetic description may put under one parent (one level's count).
/// Within the PU limit, hwloc's time grows with the square of it: 1024 cores under one parent
/// (2048 PUs) load at once and "pack:32 core:1024 pu:1" in 36 s, but 2048 take 47 s with
/// 16 PUs each, 8192 (2 PUs each) 4.5 minutes and 16384 over 15 minutes.
pub const MAX_SYNTHETIC_ARITY: u128 = 1024;

/// Where a node's topology comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum TopologySource {
    /// This machine, as hwloc discovers it (restricted to the PUs this process may use).
    Real,
    /// An hwloc synthetic description such as `"package:2 numa:2 core:4 pu:2"`.
    Synthetic(String),
    /// An hwloc XML export, e.g. from `lstopo FILE.xml` on the machine to emulate.
    Xml(PathBuf),
    /// An emulated node (`base` synthetic or XML) with `per_numa` emulated GPUs added to each
    /// NUMA node (`berth agent --gpus-per-numa N`, see [`Topology::add_emulated_gpus`]).
    WithGpus { base: Box<TopologySource>, per_numa: u32 },
}

impl TopologySource {
    /// `self` with `per_numa` emulated GPUs per NUMA node (none: `self` unchanged).
    pub fn with_emulated_gpus(self, per_numa: u32) -> Self {
        if per_numa == 0 {
            self
        } else {
            TopologySource::WithGpus { base: Box::new(self), per_numa }
        }
    }
}

impl fmt::Display for TopologySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TopologySource::Real => f.write_str("this machine"),
            TopologySource::Synthetic(spec) => write!(f, "synthetic topology {spec:?}"),
            TopologySource::Xml(path) => write!(f, "topology XML file {}", path.display()),
            TopologySource::WithGpus { base, per_numa } => {
                write!(f, "{base} with {per_numa} emulated GPUs per NUMA node")
            }
        }
    }
}

/// Why a topology could not be loaded. Each message says what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error(
        "hwloc rejected the synthetic topology {spec:?}: give space-separated levels from the \
         largest down, each TYPE:COUNT, e.g. \"{SYNTHETIC_EXAMPLE}\" (or use `real` or `xml:FILE`)"
    )]
    BadSynthetic { spec: String },

    #[error(
        "the synthetic topology {spec:?} makes about {pus} PUs, more than the {MAX_SYNTHETIC_PUS} \
         berth accepts: check the counts (e.g. \"{SYNTHETIC_EXAMPLE}\" makes 32)"
    )]
    SyntheticTooLarge { spec: String, pus: u128 },

    #[error(
        "the synthetic topology {spec:?} puts {count} objects under one parent, more than the \
         {MAX_SYNTHETIC_ARITY} berth accepts (hwloc would take minutes): check the counts \
         (e.g. \"{SYNTHETIC_EXAMPLE}\")"
    )]
    SyntheticTooWide { spec: String, count: u128 },

    #[error("xml: needs a file name after it, e.g. xml:/etc/berth/node.xml (an export made with `lstopo FILE.xml`)")]
    NoXmlPath,

    #[error(
        "topology XML file {} does not exist: give the path of an hwloc XML export \
         (made with `lstopo FILE.xml` on the machine to emulate) as xml:FILE",
        path.display()
    )]
    XmlNotFound { path: PathBuf },

    #[error("cannot read topology XML file {}: {source}; check the path and its permissions", path.display())]
    XmlUnreadable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error(
        "hwloc cannot load {} as a topology ({detail}): give an hwloc XML export \
         made with `lstopo FILE.xml`",
        path.display()
    )]
    BadXml { path: PathBuf, detail: String },

    #[error(
        "hwloc could not discover this machine's topology ({detail}): check that /sys and /proc \
         are mounted, or give a synthetic description or xml:FILE instead of `real`"
    )]
    Discovery { detail: String },

    #[error("the topology from {origin} cannot be used: {detail}")]
    Unusable { origin: String, detail: ConvertError },

    #[error(
        "--numa-memory {spec:?}: {detail}; give one size for every NUMA node (\"64G\"), sizes by \
         NUMA node number (\"0=64G,1=64G\"), or both (\"32G,3=16G\")"
    )]
    BadNumaMemory { spec: String, detail: String },

    #[error("--numa-memory names NUMA node {node}, which {origin} does not let berth use (it may use {usable})")]
    NumaMemoryUnknownNode { node: u32, origin: String, usable: String },

    #[error(
        "--gpus-per-numa emulates GPUs on an emulated node only: give a synthetic topology or \
         xml:FILE too (this machine's own GPUs are found by hwloc)"
    )]
    GpusOnRealMachine,

    #[error("the topology from {origin} is not valid for berth: {error}")]
    Invalid {
        origin: String,
        #[source]
        error: CoreError,
    },
}

/// Parse the `berth up --topology SPEC` form: `"xml:FILE"` is an XML file, `"real"` this
/// machine, anything else an hwloc synthetic description.
pub fn parse_spec(spec: &str) -> TopologySource {
    let spec = spec.trim();
    if let Some(file) = spec.strip_prefix("xml:") {
        TopologySource::Xml(PathBuf::from(file))
    } else if spec == "real" {
        TopologySource::Real
    } else {
        TopologySource::Synthetic(spec.to_string())
    }
}

/// An admin's memory sizes for NUMA nodes (`berth agent --numa-memory`), which win over every
/// other source: one size for every NUMA node, sizes by NUMA node OS index, or both.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NumaMemory {
    /// The size of every NUMA node not named in `by_node`.
    pub all: Option<u64>,
    /// Sizes by NUMA node OS index.
    pub by_node: BTreeMap<u32, u64>,
}

impl NumaMemory {
    /// Parse `"64G"`, `"0=64G,1=64G"` or `"32G,3=16G"`. A size of 0 is refused: a NUMA node
    /// without memory takes no job, which is not what an admin giving a size means.
    pub fn parse(spec: &str) -> Result<Self, TopologyError> {
        let bad = |detail: String| TopologyError::BadNumaMemory { spec: spec.to_string(), detail };
        let size = |text: &str| match parse_size(text) {
            Ok(0) => Err(bad(format!("{text:?} is no memory (to keep jobs off a node, drain it)"))),
            Ok(bytes) => Ok(bytes),
            Err(e) => Err(bad(e.to_string())),
        };
        let mut out = NumaMemory::default();
        for item in spec.split(',').map(str::trim) {
            if item.is_empty() {
                return Err(bad("an item is empty".into()));
            }
            match item.split_once('=') {
                Some((node, bytes)) => {
                    let node: u32 =
                        node.trim().parse().map_err(|_| bad(format!("{:?} is not a NUMA node number", node.trim())))?;
                    if out.by_node.insert(node, size(bytes.trim())?).is_some() {
                        return Err(bad(format!("NUMA node {node} is given twice")));
                    }
                }
                None if out.all.is_some() => return Err(bad("two sizes for every NUMA node".into())),
                None => out.all = Some(size(item)?),
            }
        }
        Ok(out)
    }

    fn get(&self, os_index: u32) -> Option<u64> {
        self.by_node.get(&os_index).copied().or(self.all)
    }
}

/// What the agent knows of memory besides hwloc: an admin's sizes, and the operating system's
/// counts for the NUMA nodes hwloc gives no memory (a dump or a container where hwloc could not
/// read the kernel's per-node counts).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryFacts {
    /// The admin's sizes (`--numa-memory`): they win over every other source.
    pub config: NumaMemory,
    /// The OS's size of each NUMA node, by OS index (this machine's: only for `Real`).
    pub os_nodes: BTreeMap<u32, u64>,
    /// The machine's total memory, split over the NUMA nodes no other source gives any.
    pub machine_total: Option<u64>,
}

impl MemoryFacts {
    /// Read this host's counts: per-node sizes from `/sys/devices/system/node` only when the
    /// topology is this machine's (an emulated node's NUMA nodes are not the host's); the
    /// total from `/proc/meminfo` in every case, since an emulated node's jobs run on this
    /// host and share its memory.
    pub fn from_host(config: NumaMemory, source: &TopologySource) -> Self {
        let mut os_nodes = BTreeMap::new();
        if *source == TopologySource::Real {
            if let Ok(dir) = std::fs::read_dir("/sys/devices/system/node") {
                for entry in dir.flatten() {
                    let name = entry.file_name();
                    let Some(index) = name.to_str().and_then(|n| n.strip_prefix("node")?.parse::<u32>().ok()) else {
                        continue;
                    };
                    let bytes = std::fs::read_to_string(entry.path().join("meminfo"))
                        .ok()
                        .and_then(|text| meminfo_total(&text));
                    if let Some(bytes) = bytes {
                        os_nodes.insert(index, bytes);
                    }
                }
            }
        }
        let machine_total = std::fs::read_to_string("/proc/meminfo").ok().and_then(|text| meminfo_total(&text));
        MemoryFacts { config, os_nodes, machine_total }
    }
}

/// The `MemTotal` of `/proc/meminfo` (`MemTotal:  16318412 kB`) or of a NUMA node's
/// `meminfo` (`Node 0 MemTotal:  16318412 kB`), in bytes; `None` if absent or 0.
fn meminfo_total(text: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        if !key.trim_end().ends_with("MemTotal") {
            return None;
        }
        let mut words = value.split_whitespace();
        let number: u64 = words.next()?.parse().ok()?;
        let unit = match words.next() {
            None => 1,
            Some(u) if u.eq_ignore_ascii_case("kB") => 1024,
            Some(_) => return None,
        };
        number.checked_mul(unit).filter(|&b| b > 0)
    })
}

/// Load with hwloc and convert to berth's model; NUMA nodes hwloc gives no memory keep 0
/// (see [`load_with`]).
pub fn load(source: &TopologySource) -> Result<Topology, TopologyError> {
    load_with(source, &MemoryFacts::default())
}

/// Load with hwloc and convert to berth's model, each NUMA node's memory from the best source
/// `facts` offer: the admin's size, hwloc's, the OS's, the machine's total split over the
/// nodes still without; 0 (source `unknown`, and the node takes no job) when none knows.
pub fn load_with(source: &TopologySource, facts: &MemoryFacts) -> Result<Topology, TopologyError> {
    let (hw_source, emulated_gpus) = match source {
        TopologySource::WithGpus { base, .. } if matches!(**base, TopologySource::Real) => {
            return Err(TopologyError::GpusOnRealMachine)
        }
        TopologySource::WithGpus { base, per_numa } => (&**base, *per_numa),
        other => (other, 0),
    };
    let hw = build(hw_source)?;
    let mut topology = convert(&hw).map_err(|detail| TopologyError::Unusable { origin: source.to_string(), detail })?;
    assign_memory(&mut topology.numa_nodes, facts, source)?;
    if emulated_gpus > 0 {
        topology
            .add_emulated_gpus(emulated_gpus)
            .map_err(|error| TopologyError::Invalid { origin: source.to_string(), error })?;
    }
    topology.validate().map_err(|error| TopologyError::Invalid { origin: source.to_string(), error })?;
    tracing::debug!(
        source = %source,
        packages = topology.packages.len(),
        numa_nodes = topology.numa_nodes.len(),
        cores = topology.core_count(),
        pus = topology.pu_count(),
        memory_bytes = topology.memory_bytes(),
        gpus = topology.gpus.len(),
        "loaded topology"
    );
    Ok(topology)
}

/// Flags for topologies that do not describe this process's machine: keep every PU and NUMA
/// node of the description, whatever the description or this process's binding allows.
fn foreign_builder() -> Result<TopologyBuilder, BuilderError> {
    Ok(HwTopology::builder().with_flags(BuildFlags::INCLUDE_DISALLOWED)?)
}

/// Keep hwloc's important I/O objects (PCI devices, their bridges and OS devices such as
/// `cuda0`): hwloc 2 drops them by default, and GPUs are found among them (crate::gpus).
fn with_io(builder: TopologyBuilder) -> Result<TopologyBuilder, BuilderError> {
    Ok(builder.with_io_type_filter(TypeFilter::KeepImportant)?)
}

/// hwloc refused a setting of a topology builder (its words).
#[derive(Debug, thiserror::Error)]
enum BuilderError {
    /// The build flags (`INCLUDE_DISALLOWED`).
    #[error(transparent)]
    Flags(#[from] HybridError<FlagsError<BuildFlags>>),
    /// The filter keeping I/O objects.
    #[error(transparent)]
    IoFilter(#[from] HybridError<TypeFilterError>),
}

fn build(source: &TopologySource) -> Result<HwTopology, TopologyError> {
    match source {
        TopologySource::Real => {
            // Default flags: hwloc leaves out PUs and NUMA nodes this process may not use
            // (cgroup cpusets), so they are absent from berth's model too.
            crate::hwguard::guarded(|| {
                with_io(HwTopology::builder()).map_err(|e| e.to_string())?.build().map_err(|e| e.to_string())
            })
            .map_err(|p| p.to_string())
            .and_then(|r| r)
            .map_err(|detail| TopologyError::Discovery { detail })
        }
        TopologySource::Synthetic(spec) => {
            let pus = synthetic_pu_bound(spec);
            if pus > u128::from(MAX_SYNTHETIC_PUS) {
                return Err(TopologyError::SyntheticTooLarge { spec: spec.clone(), pus });
            }
            if let Some(count) = synthetic_counts(spec).into_iter().find(|&c| c > MAX_SYNTHETIC_ARITY) {
                return Err(TopologyError::SyntheticTooWide { spec: spec.clone(), count });
            }
            let bad = |_| TopologyError::BadSynthetic { spec: spec.clone() };
            let builder = foreign_builder().map_err(|e| bad(e.to_string()))?;
            let builder = crate::hwguard::guarded(|| builder.from_synthetic(spec).map_err(|e| e.to_string()))
                .map_err(|p| p.to_string())
                .and_then(|r| r)
                .map_err(bad)?;
            crate::hwguard::guarded(|| builder.build().map_err(|e| e.to_string()))
                .map_err(|p| p.to_string())
                .and_then(|r| r)
                .map_err(bad)
        }
        TopologySource::WithGpus { base, .. } => build(base),
        TopologySource::Xml(path) => {
            if path.as_os_str().is_empty() {
                return Err(TopologyError::NoXmlPath);
            }
            check_readable(path)?;
            let bad = |detail| TopologyError::BadXml { path: path.clone(), detail };
            let builder = foreign_builder().and_then(with_io).map_err(|e| bad(e.to_string()))?;
            let builder = crate::hwguard::guarded(|| builder.from_xml_file(path).map_err(|e| e.to_string()))
                .map_err(|p| p.to_string())
                .and_then(|r| r)
                .map_err(bad)?;
            crate::hwguard::guarded(|| builder.build().map_err(|e| e.to_string()))
                .map_err(|p| p.to_string())
                .and_then(|r| r)
                .map_err(bad)
        }
    }
}

/// How many PUs a synthetic description makes, at most: the product of its level counts.
fn synthetic_pu_bound(spec: &str) -> u128 {
    synthetic_counts(spec).into_iter().fold(1u128, u128::saturating_mul)
}

/// The level counts of a synthetic description (`TYPE:COUNT` or a bare `COUNT`; attributes in
/// parentheses and attached memory in brackets make no PUs). Tokens it cannot read are left
/// for hwloc to judge.
fn synthetic_counts(spec: &str) -> Vec<u128> {
    spec.split_whitespace()
        .filter(|token| !token.starts_with('[') && !token.starts_with('('))
        .filter_map(|token| {
            // Attributes first: in `3(indexes=pu:0,1)` the count is 3, not the `0` after `:`.
            let token = token.split(['(', '[']).next().unwrap_or(token);
            let count = token.split_once(':').map_or(token, |(_, count)| count);
            // hwloc reads counts with strtoul(.., 0): `+16` and `0x10` are 16 (not read here,
            // they let `pu:0x10000` through). Octal `010` is 8: reading 10 over-estimates.
            let count = count.strip_prefix('+').unwrap_or(count);
            let (digits, radix) = match count.strip_prefix("0x").or_else(|| count.strip_prefix("0X")) {
                Some(hex) => (hex.chars().take_while(char::is_ascii_hexdigit).collect::<String>(), 16),
                None => (count.chars().take_while(char::is_ascii_digit).collect(), 10),
            };
            if digits.is_empty() {
                return None;
            }
            // Beyond u128 is as good as infinite.
            Some(u128::from_str_radix(&digits, radix).unwrap_or(u128::MAX))
        })
        .collect()
}

/// Give a clear error for a missing or unreadable file before hwloc sees the path.
fn check_readable(path: &Path) -> Result<(), TopologyError> {
    match std::fs::File::open(path) {
        Ok(file) => match file.metadata() {
            Ok(meta) if meta.is_dir() => {
                Err(TopologyError::BadXml { path: path.to_path_buf(), detail: "it is a directory".into() })
            }
            _ => Ok(()),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(TopologyError::XmlNotFound { path: path.to_path_buf() })
        }
        Err(source) => Err(TopologyError::XmlUnreadable { path: path.to_path_buf(), source }),
    }
}

/// An hwloc cpuset or nodeset as berth's set; `None` if it is infinite or holds an index
/// beyond u32.
fn to_berth<B: AsRef<Bitmap>>(set: &B) -> Option<CpuSet> {
    let set = set.as_ref();
    set.weight()?;
    let mut out = CpuSet::new();
    for index in set.iter_set() {
        out.insert(u32::try_from(usize::from(index)).ok()?);
    }
    Some(out)
}

/// Why a loaded hwloc topology cannot be converted into berth's model
/// ([`TopologyError::Unusable`] says from where).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConvertError {
    /// `what`: "allowed PUs", "allowed NUMA nodes", "PUs".
    #[error("hwloc reports an infinite or out-of-range set of {0}")]
    BadSet(&'static str),
    /// An object's OS (else logical) index does not fit berth's numbering.
    #[error("{kind} index {index} is too large")]
    IndexTooLarge { kind: String, index: usize },
    #[error("{kind} L#{index} is too large")]
    LogicalTooLarge { kind: String, index: usize },
    #[error("NUMA node L#{0} has a bad cpuset")]
    BadNumaCpuset(usize),
    #[error("hwloc allows none of its {0} NUMA nodes")]
    NoAllowedNuma(usize),
    #[error("PU L#{0} has no OS index")]
    PuWithoutOsIndex(usize),
    #[error("PU P#{0} is too large")]
    PuTooLarge(usize),
    #[error("it has no usable PUs")]
    NoPus,
}

/// An object's OS index, or its logical index if hwloc does not know the OS one.
fn os_or_logical(obj: &TopologyObject) -> Result<u32, ConvertError> {
    let index = obj.os_index().unwrap_or_else(|| obj.logical_index());
    u32::try_from(index).map_err(|_| ConvertError::IndexTooLarge { kind: obj.object_type().to_string(), index })
}

/// Convert a loaded hwloc topology. Only the PUs and NUMA nodes hwloc allows are used (cores
/// left without PUs and packages left without cores are dropped); the other PUs it knows of
/// are listed in `Topology::disallowed`. On the real machine hwloc already left the disallowed
/// PUs and NUMA nodes out (default flags, see `build`); a synthetic or XML topology (built
/// with INCLUDE_DISALLOWED) is whole except for what the file itself marks disallowed (its
/// `allowed_cpuset` and `allowed_nodeset`), so an export from a cgroup-restricted machine
/// yields the same model there and here. NUMA nodes keep hwloc's memory, 0 if it has none
/// (`assign_memory` looks further).
fn convert(hw: &HwTopology) -> Result<Topology, ConvertError> {
    let allowed = to_berth(&hw.allowed_cpuset()).ok_or(ConvertError::BadSet("allowed PUs"))?;
    let allowed_numa = to_berth(&hw.allowed_nodeset()).ok_or(ConvertError::BadSet("allowed NUMA nodes"))?;
    let mut disallowed = to_berth(&hw.complete_cpuset()).ok_or(ConvertError::BadSet("PUs"))?;
    disallowed.subtract(&allowed);

    // Packages, in logical order; remembered by hwloc's persistent object id.
    let mut packages = Vec::new();
    let mut package_of: HashMap<u64, usize> = HashMap::new();
    for obj in hw.objects_with_type(ObjectType::Package) {
        package_of.insert(obj.global_persistent_index(), packages.len());
        packages.push(Package { os_index: os_or_logical(obj)? });
    }

    // NUMA nodes, in logical order, with their memory and allowed PUs. Nodes without PUs
    // (CXL memory) or sharing their PUs with another node (KNL's MCDRAM) are listed too.
    let mut numa_nodes = Vec::new();
    let mut numa_objects: usize = 0;
    for obj in hw.objects_with_type(ObjectType::NUMANode) {
        numa_objects += 1;
        // Memory outside the allowed nodeset (a cgroup's cpuset.mems) is not berth's to give.
        let os_index = os_or_logical(obj)?;
        if !allowed_numa.contains(os_index) {
            continue;
        }
        let memory_bytes = match obj.attributes() {
            Some(ObjectAttributes::NUMANode(attr)) => attr.local_memory().map_or(0, |m| m.get()),
            _ => 0,
        };
        let mut cpus = match obj.cpuset() {
            Some(set) => to_berth(&set).ok_or(ConvertError::BadNumaCpuset(obj.logical_index()))?,
            None => CpuSet::new(),
        };
        cpus = cpus.iter().filter(|&pu| allowed.contains(pu)).collect();
        // hwloc marks special memory (MCDRAM, HBM, NVM, GPU memory) with a subtype;
        // ordinary memory has none (or "DRAM" in newer hwloc).
        let ordinary_memory = obj.subtype().is_none_or(|s| s.to_bytes().eq_ignore_ascii_case(b"DRAM"));
        numa_nodes.push(NumaNode {
            os_index,
            memory_bytes,
            cpus,
            special: !ordinary_memory,
            memory_source: MemorySource::Hwloc,
        });
    }
    if numa_objects > 0 && numa_nodes.is_empty() {
        return Err(ConvertError::NoAllowedNuma(numa_objects));
    }

    // Cores: walk PUs in logical order (which follows cores' logical order) and group them by
    // their Core ancestor; a PU without one becomes a core of its own. `first_pu` keeps each
    // core's first PU object, the starting point for finding its shared cache or cluster.
    let mut cores: Vec<Core> = Vec::new();
    let mut first_pu: Vec<&TopologyObject> = Vec::new();
    let mut core_of: HashMap<u64, usize> = HashMap::new();
    let mut orphan_package: Option<usize> = None;
    for pu in hw.objects_with_type(ObjectType::PU) {
        let os_index = pu.os_index().ok_or(ConvertError::PuWithoutOsIndex(pu.logical_index()))?;
        let os_index = u32::try_from(os_index).map_err(|_| ConvertError::PuTooLarge(os_index))?;
        if !allowed.contains(os_index) {
            continue;
        }
        let core_obj = pu.first_ancestor_with_type(ObjectType::Core);
        if let Some(&i) = core_obj.and_then(|c| core_of.get(&c.global_persistent_index())) {
            cores[i].pus.push(os_index);
            continue;
        }
        let package = match pu
            .first_ancestor_with_type(ObjectType::Package)
            .and_then(|p| package_of.get(&p.global_persistent_index()))
        {
            Some(&p) => p,
            // No Package object above this PU (e.g. synthetic "core:4 pu:2"): one stand-in
            // package, numbered after any real ones.
            None => *orphan_package.get_or_insert_with(|| {
                let os_index = packages.iter().map(|p: &Package| p.os_index.saturating_add(1)).max().unwrap_or(0);
                packages.push(Package { os_index });
                packages.len() - 1
            }),
        };
        if let Some(c) = core_obj {
            core_of.insert(c.global_persistent_index(), cores.len());
        }
        cores.push(Core { package, numa: None, pus: vec![os_index], kind: 0, group: None });
        first_pu.push(pu);
    }
    if cores.is_empty() {
        return Err(ConvertError::NoPus);
    }

    // Packages none of whose PUs are allowed are not berth's (a cgroup confined to some
    // sockets): drop them and renumber the cores' packages.
    let mut renumbered: Vec<Option<usize>> = vec![None; packages.len()];
    let mut kept = Vec::new();
    for core in &mut cores {
        core.package = *renumbered[core.package].get_or_insert_with(|| {
            kept.push(packages[core.package].clone());
            kept.len() - 1
        });
    }
    let packages = kept;
    // berth's package index of each hwloc Package object that kept cores (for GPU locality).
    let package_index: HashMap<u64, usize> =
        package_of.iter().filter_map(|(&gp, &old)| Some((gp, renumbered[old]?))).collect();

    // A machine without NUMA information: one node with all memory and all PUs.
    if numa_nodes.is_empty() {
        numa_nodes.push(NumaNode {
            os_index: 0,
            memory_bytes: hw.root_object().total_memory(),
            cpus: cores.iter().flat_map(|c| c.pus.iter().copied()).collect(),
            special: false,
            memory_source: MemorySource::Hwloc,
        });
    }

    // Each core's NUMA node: hwloc 2 attaches NUMA nodes as memory children of some parent
    // object, so go by cpusets. Of the nodes covering the core take the most local (fewest
    // PUs), then ordinary memory over special memory (KNL's MCDRAM shares its DDR node's
    // cpuset), then the first in logical order.
    for core in &mut cores {
        let pus = CpuSet::from_iter_u32(core.pus.iter().copied());
        core.numa = numa_nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| pus.is_subset_of(&n.cpus))
            .min_by_key(|&(i, n)| (n.cpus.len(), n.special, i))
            .map(|(i, _)| i);
    }

    // A core's kind is the lowest rank among its PUs' (they are one kind on real hardware).
    let pu_kinds = pu_kind_ranks(hw);
    for core in &mut cores {
        core.kind = core.pus.iter().map(|pu| pu_kinds.get(pu).copied().unwrap_or(0)).min().unwrap_or(0);
    }

    let groups = core_groups(&cores, &first_pu)?;
    for (core, group) in cores.iter_mut().zip(groups) {
        core.group = group;
    }

    let (gpus, gpu_links) = crate::gpus::discover(hw, &numa_nodes, &allowed, &package_index);
    Ok(Topology { packages, numa_nodes, cores, disallowed, gpus, gpu_links, derived: Default::default() })
}

/// Give every NUMA node its memory from the best source (see [`load_with`]) and record which.
fn assign_memory(nodes: &mut [NumaNode], facts: &MemoryFacts, source: &TopologySource) -> Result<(), TopologyError> {
    // A size for a node berth does not have is a typo, or a node the cgroup leaves out.
    if let Some(&node) = facts.config.by_node.keys().find(|&&os| !nodes.iter().any(|n| n.os_index == os)) {
        let usable: CpuSet = nodes.iter().map(|n| n.os_index).collect();
        return Err(TopologyError::NumaMemoryUnknownNode {
            node,
            origin: source.to_string(),
            usable: format!("NUMA nodes {}", usable.to_list()),
        });
    }
    let mut missing = Vec::new();
    for (i, node) in nodes.iter_mut().enumerate() {
        if let Some(bytes) = facts.config.get(node.os_index) {
            (node.memory_bytes, node.memory_source) = (bytes, MemorySource::Config);
        } else if node.memory_bytes > 0 {
            node.memory_source = MemorySource::Hwloc;
        } else if let Some(&bytes) = facts.os_nodes.get(&node.os_index).filter(|&&b| b > 0) {
            (node.memory_bytes, node.memory_source) = (bytes, MemorySource::Os);
        } else {
            missing.push(i);
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    // What the nodes with a size leave of the total goes to the others in equal parts; if they
    // leave nothing (an emulated machine larger than this host), the total over all nodes.
    let known = nodes.iter().fold(0u64, |sum, n| sum.saturating_add(n.memory_bytes));
    let share = facts.machine_total.and_then(|total| {
        let left = total.saturating_sub(known) / missing.len() as u64;
        let share = if left > 0 { left } else { total / nodes.len() as u64 };
        (share > 0).then_some(share)
    });
    let (bytes, memory_source) = match share {
        Some(share) => (share, MemorySource::Split),
        None => (0, MemorySource::Unknown),
    };
    for &i in &missing {
        (nodes[i].memory_bytes, nodes[i].memory_source) = (bytes, memory_source);
    }
    let listed: CpuSet = missing.iter().map(|&i| nodes[i].os_index).collect();
    match share {
        Some(share) => tracing::warn!(
            "{source}: hwloc gives NUMA nodes {} no memory; each gets {} of the machine's total",
            listed.to_list(),
            format_size(share)
        ),
        None => tracing::warn!(
            "{source}: no source gives NUMA nodes {} any memory: they take no job; set their size with \
             --numa-memory",
            listed.to_list()
        ),
    }
    Ok(())
}

/// Each PU's CPU kind as berth numbers kinds: the rank of the kind's hwloc efficiency among
/// the distinct efficiencies, so the least performant kind is 0 and faster kinds count up
/// (hwloc lists kinds from most power-efficient to most performant). PUs in no kind are left
/// out (kind 0). With fewer than two kinds, or when hwloc could not rank some kind (unknown
/// efficiency, listed in no particular order), every PU is kind 0: berth would rather claim
/// no difference than a wrong order.
fn pu_kind_ranks(hw: &HwTopology) -> HashMap<u32, u32> {
    // hwlocality asserts on efficiency values it does not expect; whatever an XML file
    // declares must not crash the agent, and kinds are an optimisation: fall back to none.
    let kinds = crate::hwguard::guarded(|| {
        hw.cpu_kinds()
            .map(|kinds| kinds.map(|k| (k.cpuset.clone(), k.efficiency)).collect::<Vec<_>>())
            .unwrap_or_default()
    });
    let kinds = match kinds {
        Ok(kinds) => kinds,
        Err(detail) => {
            tracing::warn!(%detail, "cannot read hwloc's CPU kinds; treating all cores as one kind");
            return HashMap::new();
        }
    };
    let Some(efficiencies) = kinds.iter().map(|(_, e)| *e).collect::<Option<Vec<usize>>>() else {
        return HashMap::new();
    };
    let mut distinct = efficiencies.clone();
    distinct.sort_unstable();
    distinct.dedup();
    if distinct.len() < 2 {
        return HashMap::new();
    }
    let mut ranks = HashMap::new();
    for ((cpuset, _), efficiency) in kinds.iter().zip(efficiencies) {
        // The position in the sorted distinct values; found since it was taken from them.
        let rank = distinct.partition_point(|&e| e < efficiency) as u32;
        for pu in cpuset.iter_set() {
            if let Ok(pu) = u32::try_from(usize::from(pu)) {
                ranks.insert(pu, rank);
            }
        }
    }
    ranks
}

/// Candidate levels for `Core::group`, in order of preference (lower first).
fn group_preference(ty: ObjectType) -> Option<u8> {
    match ty {
        ObjectType::L3Cache => Some(0),
        ObjectType::Group => Some(1),
        ObjectType::L2Cache => Some(2),
        _ => None,
    }
}

/// Each core's `group`: the logical index of the object it shares with a few other cores
/// inside its NUMA node, for placement to keep a job's cores close (an AMD L3 slice, an ARM
/// 4-core cluster, a KNL tile, a 4-E-core module sharing its L2).
///
/// The rule: an object qualifies for a core if it lies between the core and its package,
/// holds at least 2 of berth's cores, all of them in the core's package and NUMA node, and
/// fewer cores than either (a cache or group as large as the NUMA node or package says
/// nothing the model does not already say; on the KNL and AMD exports the Group and L3 are
/// exactly the NUMA node). The candidate levels (hwloc depths) are tried in order: L3 caches,
/// then Group levels from the innermost out, then L2 caches; the first level where some core
/// has a qualifying object is used for the whole machine, and cores whose object at that level
/// does not qualify (a P-core alone in its L2 next to E-core modules) get `None`. One level
/// for all cores keeps group numbers comparable (hwloc numbers logical indexes per depth) and
/// the result a pure function of hwloc's tree, so the same file always gives the same groups.
fn core_groups(cores: &[Core], first_pu: &[&TopologyObject]) -> Result<Vec<Option<u32>>, ConvertError> {
    /// An object of a candidate level: how many cores share it, and whether they all lie in
    /// one (package, NUMA node).
    struct Shared {
        cores: usize,
        home: (usize, Option<usize>),
        mixed: bool,
    }

    // Cores per package and per NUMA node, counting only berth's (allowed) cores.
    let mut per_package: HashMap<usize, usize> = HashMap::new();
    let mut per_numa: HashMap<usize, usize> = HashMap::new();
    for core in cores {
        *per_package.entry(core.package).or_default() += 1;
        if let Some(numa) = core.numa {
            *per_numa.entry(numa).or_default() += 1;
        }
    }

    // Each core's candidate ancestors below its package, as (preference, depth) -> object;
    // and for each such object, its cores' count and whether they share one package and node.
    let mut chains: Vec<HashMap<(u8, Reverse<usize>), &TopologyObject>> = Vec::with_capacity(cores.len());
    let mut shared: HashMap<u64, Shared> = HashMap::new();
    let mut levels: Vec<(u8, Reverse<usize>)> = Vec::new();
    for (core, pu) in cores.iter().zip(first_pu) {
        let mut chain = HashMap::new();
        for obj in pu.ancestors() {
            if matches!(obj.object_type(), ObjectType::Package | ObjectType::Machine) {
                break;
            }
            let (Some(preference), Depth::Normal(depth)) = (group_preference(obj.object_type()), obj.depth()) else {
                continue;
            };
            // Deeper (closer to the cores) first among levels of the same preference.
            let level = (preference, Reverse(usize::from(depth)));
            chain.insert(level, obj);
            if !levels.contains(&level) {
                levels.push(level);
            }
            let home = (core.package, core.numa);
            shared
                .entry(obj.global_persistent_index())
                .and_modify(|s| {
                    s.cores += 1;
                    s.mixed |= s.home != home;
                })
                .or_insert(Shared { cores: 1, home, mixed: false });
        }
        chains.push(chain);
    }
    levels.sort_unstable();

    for level in levels {
        let mut any = false;
        let mut groups = Vec::with_capacity(cores.len());
        for (core, chain) in cores.iter().zip(&chains) {
            let group = match chain.get(&level) {
                Some(obj) => {
                    let s = &shared[&obj.global_persistent_index()];
                    let smaller_than_numa = core.numa.is_none_or(|n| s.cores < per_numa[&n]);
                    if s.cores >= 2 && !s.mixed && smaller_than_numa && s.cores < per_package[&core.package] {
                        let index = obj.logical_index();
                        Some(u32::try_from(index).map_err(|_| ConvertError::LogicalTooLarge {
                            kind: obj.object_type().to_string(),
                            index,
                        })?)
                    } else {
                        None
                    }
                }
                None => None,
            };
            any |= group.is_some();
            groups.push(group);
        }
        if any {
            return Ok(groups);
        }
    }
    Ok(vec![None; cores.len()])
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn data(file: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/hwloc").join(file)
    }

    fn synthetic(spec: &str) -> Topology {
        load(&TopologySource::Synthetic(spec.into())).unwrap()
    }

    fn xml(file: &str) -> Topology {
        load(&TopologySource::Xml(data(file))).unwrap_or_else(|e| panic!("{file}: {e}"))
    }

    /// Cores per group, in order of first appearance.
    fn group_sizes(t: &Topology) -> Vec<(u32, usize)> {
        let mut sizes: Vec<(u32, usize)> = Vec::new();
        for group in t.cores.iter().filter_map(|c| c.group) {
            match sizes.iter_mut().find(|(g, _)| *g == group) {
                Some((_, n)) => *n += 1,
                None => sizes.push((group, 1)),
            }
        }
        sizes
    }

    #[test]
    fn raptor_lake_kinds_and_e_core_modules() {
        let t = xml("Intel-RaptorLake-Corei7-1370P.xml");
        let p_cores: Vec<&Core> = t.cores.iter().filter(|c| c.kind > 0).collect();
        let e_cores: Vec<&Core> = t.cores.iter().filter(|c| c.kind == 0).collect();
        assert_eq!((p_cores.len(), e_cores.len()), (6, 8));
        assert!(p_cores.iter().all(|c| c.pus.len() == 2 && c.kind == 1), "{p_cores:?}");
        assert!(e_cores.iter().all(|c| c.pus.len() == 1), "{e_cores:?}");
        // The L3 spans the package, so the level is L2: E-cores share one per 4-core module,
        // each P-core has its own.
        assert!(p_cores.iter().all(|c| c.group.is_none()), "{p_cores:?}");
        assert_eq!(group_sizes(&t), vec![(6, 4), (7, 4)]);
    }

    #[test]
    fn arm_clusters_are_groups_of_four() {
        let t = xml("128arm-2pa2n8cluster4co.xml");
        assert!(t.cores.iter().all(|c| c.kind == 0));
        let sizes = group_sizes(&t);
        assert_eq!(sizes.len(), 32);
        assert!(sizes.iter().all(|&(_, n)| n == 4), "{sizes:?}");
        // hwloc's logical order: cluster i holds cores 4i..4i+3, inside one NUMA node.
        for (i, core) in t.cores.iter().enumerate() {
            assert_eq!(core.group, Some(i as u32 / 4), "core {i}");
            let cluster: Vec<&Core> = t.cores.iter().filter(|c| c.group == core.group).collect();
            assert!(cluster.iter().all(|c| c.numa == core.numa && c.package == core.package));
        }
    }

    #[test]
    fn knl_special_memory_and_tiles() {
        let t = xml("knl.xml");
        let special: Vec<u32> = t.numa_nodes.iter().filter(|n| n.special).map(|n| n.os_index).collect();
        let ordinary: Vec<u32> = t.numa_nodes.iter().filter(|n| !n.special).map(|n| n.os_index).collect();
        assert_eq!((special.len(), ordinary.len()), (4, 4));
        assert!(t.numa_nodes.iter().filter(|n| n.special).all(|n| n.memory_bytes == 4 * GIB));
        assert!(t.cores.iter().all(|c| !t.numa_nodes[c.numa.unwrap()].special));
        // The SNC quadrant Groups are the NUMA nodes, so the level is the L2 of 2-core tiles.
        let sizes = group_sizes(&t);
        assert_eq!(sizes.len(), 32);
        assert!(sizes.iter().all(|&(_, n)| n == 2), "{sizes:?}");
    }

    #[test]
    fn groups_on_other_machines() {
        // Opteron 6272: the L3 is the NUMA node; 2-core modules share an L2.
        let amd = xml("64amd64-4p2n4ca2co.xml");
        let sizes = group_sizes(&amd);
        assert_eq!(sizes.len(), 32);
        assert!(sizes.iter().all(|&(_, n)| n == 2), "{sizes:?}");
        // Xeons: the L3 is the package and NUMA node, the L2 private: no groups.
        for file in ["32em64t-2n8c2t-pci-normalio.xml", "192em64t-24n8c2t.xml"] {
            let t = xml(file);
            assert!(t.cores.iter().all(|c| c.group.is_none() && c.kind == 0), "{file}");
            assert!(t.numa_nodes.iter().all(|n| !n.special), "{file}");
        }
    }

    #[test]
    fn synthetic_has_one_kind_and_no_groups() {
        for spec in [SYNTHETIC_EXAMPLE, "package:2 core:3 pu:1", "core:4 pu:2", "package:2 pu:3"] {
            let t = synthetic(spec);
            assert!(t.cores.iter().all(|c| c.kind == 0 && c.group.is_none()), "{spec}: {:?}", t.cores);
            assert!(t.numa_nodes.iter().all(|n| !n.special), "{spec}");
            assert!(t.disallowed.is_empty(), "{spec}");
        }
    }

    #[test]
    fn synthetic_l3_slices_are_groups() {
        // Two L3s per package and NUMA node: each is a group; L2s of one core are not.
        let t = synthetic("package:2 l3:2 l2:4 core:1 pu:2");
        let expected: Vec<Option<u32>> = (0..16).map(|i| Some(i / 4)).collect();
        assert_eq!(t.cores.iter().map(|c| c.group).collect::<Vec<_>>(), expected);
        // One L3 per package: it says nothing more than the package; the shared L2s do.
        let t = synthetic("package:2 l3:1 l2:2 core:2 pu:1");
        let expected: Vec<Option<u32>> = (0..8).map(|i| Some(i / 2)).collect();
        assert_eq!(t.cores.iter().map(|c| c.group).collect::<Vec<_>>(), expected);
    }

    #[test]
    fn xml_disallowed_pus_are_left_out() {
        // The 2-package Xeon with PU 0 and its hyperthread sibling PU 16 (core 0) and PU 1
        // (half of core 1) marked disallowed, as an export from inside a cgroup would be.
        let original = std::fs::read_to_string(data("32em64t-2n8c2t-pci-normalio.xml")).unwrap();
        let marker = r#"allowed_cpuset="0xffffffff""#;
        assert_eq!(original.matches(marker).count(), 1);
        let restricted = original.replace(marker, r#"allowed_cpuset="0xfffefffc""#);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("restricted.xml");
        std::fs::write(&path, restricted).unwrap();

        let whole = xml("32em64t-2n8c2t-pci-normalio.xml");
        assert!(whole.disallowed.is_empty());
        assert_eq!(whole.cores[0].pus, vec![0, 16]);
        assert_eq!(whole.cores[1].pus, vec![1, 17]);

        let t = load(&TopologySource::Xml(path.clone())).unwrap();
        assert_eq!(t.disallowed.to_list(), "0-1,16");
        assert_eq!((t.core_count(), t.pu_count()), (15, 29));
        assert!(!t.all_pus().intersects(&t.disallowed));
        assert_eq!(t.cores[0].pus, vec![17]);
        assert!(!t.numa_nodes[0].cpus.intersects(&t.disallowed));
        assert_eq!(t.cores[1..], whole.cores[2..]);

        // The real machine's path (default flags: hwloc itself drops the disallowed PUs and
        // keeps them only in the complete cpuset; I/O kept, for GPUs) gives the same model.
        let hw = with_io(HwTopology::builder()).unwrap().from_xml_file(&path).unwrap().build().unwrap();
        assert_eq!(convert(&hw).unwrap(), t);
    }

    /// The hand-made XML files of issue 17 (made with lstopo and edited by hand; how, in
    /// crates/agent/tests/data/hwloc/README.md).
    fn issue17(file: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/hwloc").join(file)
    }

    fn node_of(t: &Topology) -> berth_core::node::NodeCapacity {
        berth_core::node::NodeCapacity::new(berth_core::NodeId(0), "n0", std::sync::Arc::new(t.clone()))
    }

    /// `cores` whole cores with `mem` bytes on one node.
    fn ask(cores: u32, mem: u64) -> berth_core::placement::JobRequest {
        use berth_core::job::Shape;
        berth_core::placement::JobRequest::simple(Shape::PerNode { nodes: 1, cores_per_node: cores }, mem)
    }

    /// Placement rules with no "large parallel" jobs, so that wide jobs are placed like others.
    fn no_large() -> berth_core::placement::PlacementPolicy {
        berth_core::placement::PlacementPolicy { large_parallel_cpus: 0, ..Default::default() }
    }

    /// Whether a job could ever run on this node, as the controller judges it at submit.
    fn feasible_on(t: &Topology, req: &berth_core::placement::JobRequest) -> Result<(), String> {
        let policy = no_large();
        berth_core::placement::cluster::feasible(&[node_of(t)], &policy, req, |_| true).map_err(|e| e.to_string())
    }

    fn place_on(t: &Topology, req: &berth_core::placement::JobRequest) -> berth_core::job::NodeAllocation {
        use berth_core::placement::cluster::{place, Placement};
        let policy = no_large();
        match place(&[node_of(t)], &policy, req) {
            Placement::Now(mut a) => a.remove(0),
            other => panic!("{req:?}: {other:?}"),
        }
    }

    /// Issue 17 item 1: an EPYC dump whose NUMA nodes have no `local_memory` gave 0-byte NUMA
    /// nodes, and every job there a 0-byte memory limit (killed at once). Each node's memory
    /// now comes from the best source there is, which `berth nodes` shows.
    #[test]
    fn issue17_numa_nodes_without_local_memory_get_memory_from_the_best_source() {
        let file = TopologySource::Xml(issue17("epyc-2p-no-local-memory.xml"));
        let with = |facts: &MemoryFacts| load_with(&file, facts).unwrap_or_else(|e| panic!("{e}"));
        let memory = |t: &Topology| -> Vec<(u32, u64, MemorySource)> {
            t.numa_nodes.iter().map(|n| (n.os_index, n.memory_bytes, n.memory_source)).collect()
        };
        let config = |spec: &str| NumaMemory::parse(spec).unwrap();

        // The OS's per-node counts (the real node's /sys/devices/system/node/nodeN/meminfo).
        let os = MemoryFacts { os_nodes: BTreeMap::from([(0, 32 * GIB), (1, 31 * GIB)]), ..Default::default() };
        assert_eq!(memory(&with(&os)), vec![(0, 32 * GIB, MemorySource::Os), (1, 31 * GIB, MemorySource::Os)]);
        // The machine's total (MemTotal of /proc/meminfo) split over the NUMA nodes.
        let total = MemoryFacts { machine_total: Some(64 * GIB), ..Default::default() };
        let t = with(&total);
        assert_eq!(memory(&t), vec![(0, 32 * GIB, MemorySource::Split), (1, 32 * GIB, MemorySource::Split)]);
        assert_eq!(t.memory_bytes(), 64 * GIB);
        // The admin's sizes win over every other source; what they leave of the total goes to
        // the rest.
        let admin = MemoryFacts { config: config("0=20G"), ..total.clone() };
        assert_eq!(
            memory(&with(&admin)),
            vec![(0, 20 * GIB, MemorySource::Config), (1, 44 * GIB, MemorySource::Split)]
        );
        let admin = MemoryFacts { config: config("16G"), ..os.clone() };
        assert_eq!(
            memory(&with(&admin)),
            vec![(0, 16 * GIB, MemorySource::Config), (1, 16 * GIB, MemorySource::Config)]
        );
        // An admin's size for a NUMA node the machine does not have is refused, naming it.
        let err = load_with(&file, &MemoryFacts { config: config("7=16G"), ..Default::default() }).unwrap_err();
        assert!(matches!(err, TopologyError::NumaMemoryUnknownNode { node: 7, .. }), "{err:?}");
        assert!(err.to_string().contains("NUMA nodes 0-1"), "{err}");
        // Memory hwloc gives is kept (and marked as hwloc's) unless the admin says otherwise.
        let hwloc = synthetic("package:2 numa:1 core:2 pu:1");
        let t = load_with(&TopologySource::Synthetic("package:2 numa:1 core:2 pu:1".into()), &total).unwrap();
        assert_eq!(t, hwloc);
        assert!(t.numa_nodes.iter().all(|n| n.memory_source == MemorySource::Hwloc && n.memory_bytes == GIB));

        // A job placed there gets real memory, never a 0-byte limit.
        let t = with(&total);
        let a = place_on(&t, &ask(4, 8 * GIB));
        assert_eq!((a.memory_bytes, a.numa_memory.iter().map(|s| s.bytes).sum::<u64>()), (8 * GIB, 8 * GIB));

        // No source at all: the NUMA nodes keep 0 bytes, marked unknown, and the node accepts
        // no job (every job the controller accepts asks some memory): it is infeasible at
        // submit, with the reason.
        let t = load(&file).unwrap();
        assert_eq!(memory(&t), vec![(0, 0, MemorySource::Unknown), (1, 0, MemorySource::Unknown)]);
        for mem in [1 << 20, GIB] {
            let why = feasible_on(&t, &ask(1, mem)).unwrap_err();
            assert!(why.contains("node n0 has no usable memory") && why.contains("--numa-memory"), "{why}");
        }
        // One NUMA node with memory, one without: the one without takes no job, its CPUs
        // included, and lends no memory.
        let t = load_with(&file, &MemoryFacts { config: config("0=16G"), ..Default::default() }).unwrap();
        assert_eq!(memory(&t), vec![(0, 16 * GIB, MemorySource::Config), (1, 0, MemorySource::Unknown)]);
        let a = place_on(&t, &ask(8, GIB));
        assert_eq!((a.cpus.to_list(), a.mems.to_list()), ("0-15".to_string(), "0".to_string()));
        let why = feasible_on(&t, &ask(9, GIB)).unwrap_err();
        assert!(why.contains("NUMA node P#1 take no job: it has no memory"), "{why}");
        assert!(feasible_on(&t, &ask(1, 17 * GIB)).is_err());
    }

    #[test]
    fn numa_memory_override_forms() {
        let parse = |spec: &str| NumaMemory::parse(spec);
        assert_eq!(parse("64G").unwrap(), NumaMemory { all: Some(64 * GIB), by_node: BTreeMap::new() });
        assert_eq!(
            parse(" 0=64G, 1 = 32G ").unwrap(),
            NumaMemory { all: None, by_node: BTreeMap::from([(0, 64 * GIB), (1, 32 * GIB)]) }
        );
        let mixed = parse("32G,3=16G").unwrap();
        assert_eq!((mixed.get(0), mixed.get(3)), (Some(32 * GIB), Some(16 * GIB)));
        for bad in ["", "0", "0=0", "x=1G", "1G,2G", "0=1G,0=2G", "0=lots", "-1=1G", "1G,"] {
            let err = parse(bad).unwrap_err();
            assert!(matches!(err, TopologyError::BadNumaMemory { .. }), "{bad:?}: {err:?}");
            assert!(err.to_string().contains("0=64G,1=64G"), "{err}");
        }
    }

    #[test]
    fn meminfo_totals() {
        assert_eq!(meminfo_total("MemTotal:       16318412 kB\nMemFree: 1 kB\n"), Some(16318412 * 1024));
        let node = "Node 1 MemTotal:       65536 kB\nNode 1 MemFree:        1024 kB\n";
        assert_eq!(meminfo_total(node), Some(64 << 20));
        for bad in ["", "MemTotal: 0 kB", "MemTotal: lots kB", "MemTotal: 5 MB", "MemFree: 5 kB"] {
            assert_eq!(meminfo_total(bad), None, "{bad:?}");
        }
    }

    /// Issue 17 item 2: an SGI UV export made inside a cgroup allowing 2 NUMA nodes of 8.
    /// berth counted all 8 nodes' memory (248 GiB where hwloc says 62), 8 sockets, and put
    /// memory on nodes it may not use. Only the allowed PUs and NUMA nodes count now.
    #[test]
    fn issue17_only_the_allowed_nodeset_counts() {
        let path = issue17("uv-8n-2-allowed.xml");
        let t = load(&TopologySource::Xml(path.clone())).unwrap();
        // Capacity: what lstopo -i shows for the file ("Machine (62GB total)", 2 packages).
        let os = |v: &[NumaNode]| v.iter().map(|n| n.os_index).collect::<Vec<_>>();
        assert_eq!(os(&t.numa_nodes), vec![2, 5]);
        assert_eq!(t.memory_bytes(), 62 * GIB);
        assert_eq!(t.packages, vec![Package { os_index: 2 }, Package { os_index: 5 }]);
        assert_eq!((t.ge_counts(), t.all_pus().to_list()), ((2, 8, 16), "16-23,40-47".to_string()));
        assert_eq!(t.disallowed.to_list(), "0-15,24-39,48-63");
        assert!(t.cores.iter().all(|c| c.package == c.numa.unwrap()), "{:?}", t.cores);
        assert_eq!(t.numa_nodes[1].cpus.to_list(), "40-47");
        // Topology and free strings: two sockets.
        let socket = format!("S{}", "CTT".repeat(4));
        assert_eq!(t.ge_string(&CpuSet::new()), socket.repeat(2));
        let node = node_of(&t);
        assert_eq!(t.ge_string(&node.busy_pus()), socket.repeat(2));
        assert_eq!((node.free_memory, node.free_core_count), (62 * GIB, 8));

        // Placement: memory only on the allowed nodes, and never more than they have.
        let why = feasible_on(&t, &ask(1, 70 * GIB)).unwrap_err();
        assert!(why.contains("62G memory"), "{why}");
        let a = place_on(&t, &ask(1, 40 * GIB));
        assert_eq!(a.mems.to_list(), "2,5");
        assert_eq!(a.numa_memory.iter().map(|s| (s.numa, s.bytes)).collect::<Vec<_>>(), [(2, 31 * GIB), (5, 9 * GIB)]);

        // The real machine's path (default flags: hwloc itself drops what is not allowed)
        // gives the same model.
        let hw = HwTopology::builder().from_xml_file(&path).unwrap().build().unwrap();
        assert_eq!(convert(&hw).unwrap(), t);

        // A cgroup whose CPUs reach a package whose memory it may not use (PUs 48-51 of NUMA
        // node 6): those cores are berth's, node 6 is not; again as hwloc itself sees it.
        let text = std::fs::read_to_string(&path).unwrap();
        let wider =
            text.replace(r#"allowed_cpuset="0x0000ff00,0x00ff0000""#, r#"allowed_cpuset="0x000fff00,0x00ff0000""#);
        assert_ne!(wider, text);
        let dir = tempfile::tempdir().unwrap();
        let wider_path = dir.path().join("wider.xml");
        std::fs::write(&wider_path, wider).unwrap();
        let w = load(&TopologySource::Xml(wider_path.clone())).unwrap();
        assert_eq!((os(&w.numa_nodes), w.memory_bytes(), w.packages.len()), (vec![2, 5], 62 * GIB, 3));
        assert_eq!(w.all_pus().to_list(), "16-23,40-51");
        assert!(w.cores[8..].iter().all(|c| c.numa.is_none() && c.package == 2), "{:?}", w.cores);
        let hw = HwTopology::builder().from_xml_file(&wider_path).unwrap().build().unwrap();
        assert_eq!(convert(&hw).unwrap(), w);
        // An admin's size for a node outside the allowed set is refused.
        let facts = MemoryFacts { config: NumaMemory::parse("6=31G").unwrap(), ..Default::default() };
        let err = load_with(&TopologySource::Xml(path), &facts).unwrap_err();
        assert!(err.to_string().contains("it may use NUMA nodes 2,5"), "{err}");
    }

    /// Golden files for berth-core's placement tests, which cannot run hwloc: berth's model of
    /// every XML in data/hwloc, as JSON.
    #[test]
    fn fixtures_match_xml() {
        const BLESS: &str = "BERTH_BLESS=1 cargo test -p berth-agent fixtures_match_xml";
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../core/tests/fixtures/topologies");
        let bless = std::env::var("BERTH_BLESS").is_ok_and(|v| v == "1");
        let mut xmls: Vec<PathBuf> = std::fs::read_dir(data(""))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "xml"))
            .collect();
        xmls.sort();
        assert!(!xmls.is_empty());

        let mut problems = Vec::new();
        for path in xmls {
            let stem = path.file_stem().unwrap().to_str().unwrap().to_string();
            // As an agent on a 16 GiB host emulates it: only an export without memory (Raptor
            // Lake) takes anything from that, and its golden placements need memory to mean much.
            let host = MemoryFacts { machine_total: Some(16 * GIB), ..Default::default() };
            let topology = load_with(&TopologySource::Xml(path.clone()), &host).unwrap();
            let json = serde_json::to_string_pretty(&topology).unwrap() + "\n";
            // What the core crate will read back must be what the agent produced.
            assert_eq!(serde_json::from_str::<Topology>(&json).unwrap(), topology, "{stem}");
            let fixture = fixtures.join(format!("{stem}.json"));
            if bless {
                std::fs::create_dir_all(&fixtures).unwrap();
                std::fs::write(&fixture, &json).unwrap();
                continue;
            }
            match std::fs::read_to_string(&fixture) {
                Ok(stored) if stored == json => {}
                Ok(stored) => {
                    let (line, (old, new)) = stored
                        .lines()
                        .chain(std::iter::repeat(""))
                        .zip(json.lines().chain(std::iter::repeat("")))
                        .enumerate()
                        .find(|(_, (old, new))| old != new)
                        .unwrap();
                    problems.push(format!(
                        "{} differs from the model of {} at line {}: stored {old:?}, now {new:?}",
                        fixture.display(),
                        path.display(),
                        line + 1
                    ));
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    problems.push(format!("{} is missing (the model of {})", fixture.display(), path.display()))
                }
                Err(e) => problems.push(format!("cannot read {}: {e}", fixture.display())),
            }
        }
        assert!(
            problems.is_empty(),
            "{}\nto (re)generate the fixtures, if the change is intended, run `{BLESS}`",
            problems.join("\n")
        );
    }

    /// The hand-made GPU exports (`tests/data/hwloc/gpu*.xml`) as the core crate's GPU
    /// placement tests read them (`crates/core/tests/fixtures/gpu/`), checked like the others.
    #[test]
    fn gpu_fixtures_match_xml() {
        const BLESS: &str = "BERTH_BLESS=1 cargo test -p berth-agent gpu_fixtures_match_xml";
        let here = Path::new(env!("CARGO_MANIFEST_DIR"));
        let fixtures = here.join("../core/tests/fixtures/gpu");
        let bless = std::env::var("BERTH_BLESS").is_ok_and(|v| v == "1");
        let mut problems = Vec::new();
        // The hand-made GPU nodes, and the real Supermicro export (data/hwloc, from hwloc's
        // test suite: a K40m and an AMD Radeon on NUMA node 1).
        for (stem, dir, gpus) in [
            ("gpu4-2p-nvlink-pairs", "tests/data/hwloc", 4),
            ("gpu8-2p4n-nvlink-quads", "tests/data/hwloc", 8),
            ("32em64t-2n8c2t-pci-normalio", "../../data/hwloc", 2),
        ] {
            let path = here.join(dir).join(format!("{stem}.xml"));
            let host = MemoryFacts { machine_total: Some(16 * GIB), ..Default::default() };
            let topology = load_with(&TopologySource::Xml(path.clone()), &host).unwrap();
            assert_eq!(topology.gpus.len(), gpus, "{stem}");
            let json = serde_json::to_string_pretty(&topology).unwrap() + "\n";
            assert_eq!(serde_json::from_str::<Topology>(&json).unwrap(), topology, "{stem}");
            let fixture = fixtures.join(format!("{stem}.json"));
            if bless {
                std::fs::create_dir_all(&fixtures).unwrap();
                std::fs::write(&fixture, &json).unwrap();
                continue;
            }
            match std::fs::read_to_string(&fixture) {
                Ok(stored) if stored == json => {}
                Ok(_) => problems.push(format!("{} differs from the model of {}", fixture.display(), path.display())),
                Err(e) => problems.push(format!("cannot read {}: {e}", fixture.display())),
            }
        }
        assert!(problems.is_empty(), "{}\nto (re)generate them, if intended, run `{BLESS}`", problems.join("\n"));
    }

    #[test]
    fn parse_spec_forms() {
        assert_eq!(parse_spec("real"), TopologySource::Real);
        assert_eq!(parse_spec("xml:/tmp/a b.xml"), TopologySource::Xml("/tmp/a b.xml".into()));
        assert_eq!(parse_spec("package:2 core:4 pu:2"), TopologySource::Synthetic("package:2 core:4 pu:2".into()));
    }

    #[test]
    fn synthetic_with_numa() {
        let t = synthetic("package:2 numa:2 core:4 pu:2");
        assert_eq!(t.packages, vec![Package { os_index: 0 }, Package { os_index: 1 }]);
        assert_eq!(t.numa_nodes.len(), 4);
        for (i, n) in t.numa_nodes.iter().enumerate() {
            assert_eq!(n.os_index, i as u32);
            assert_eq!(n.memory_bytes, GIB, "hwloc's default synthetic NUMA memory");
            let first = 8 * i as u32;
            assert_eq!(n.cpus.to_list(), format!("{first}-{}", first + 7));
        }
        assert_eq!(t.core_count(), 16);
        assert_eq!(t.pu_count(), 32);
        assert_eq!(t.memory_bytes(), 4 * GIB);
        for (i, c) in t.cores.iter().enumerate() {
            assert_eq!(c.package, i / 8);
            assert_eq!(c.numa, Some(i / 4));
            assert_eq!(c.pus, vec![2 * i as u32, 2 * i as u32 + 1]);
        }
        let package = format!("S{}", "CTT".repeat(8));
        assert_eq!(t.ge_string(&CpuSet::new()), package.repeat(2));
        assert_eq!(t, Topology::uniform(2, 2, 4, 2, GIB));
    }

    #[test]
    fn synthetic_without_numa() {
        let t = synthetic("package:2 core:3 pu:1");
        assert_eq!(t.packages.len(), 2);
        assert_eq!(t.numa_nodes.len(), 1);
        assert_eq!(t.numa_nodes[0].cpus.to_list(), "0-5");
        assert_eq!(t.core_count(), 6);
        assert_eq!(t.pu_count(), 6);
        assert!(t.cores.iter().all(|c| c.numa == Some(0)));
        assert_eq!(t.ge_string(&CpuSet::new()), "SCCCSCCC");
    }

    #[test]
    fn synthetic_without_package() {
        let t = synthetic("core:4 pu:2");
        assert_eq!(t.packages, vec![Package { os_index: 0 }]);
        assert_eq!(t.numa_nodes.len(), 1);
        assert_eq!(t.core_count(), 4);
        assert_eq!(t.pu_count(), 8);
        assert!(t.cores.iter().all(|c| c.package == 0 && c.numa == Some(0)));
        assert_eq!(t.ge_string(&CpuSet::new()), "SCTTCTTCTTCTT");
    }

    #[test]
    fn synthetic_without_cores() {
        let t = synthetic("package:2 pu:3");
        assert_eq!(t.packages.len(), 2);
        assert_eq!(t.core_count(), 6);
        assert!(t.cores.iter().all(|c| c.pus.len() == 1));
        assert_eq!(t.cores[3].package, 1);
    }

    #[test]
    fn real_machine_loads() {
        let t = load(&TopologySource::Real).unwrap();
        assert!(t.core_count() >= 1);
        assert!(!t.numa_nodes.is_empty());
        t.validate().unwrap();
        // PUs outside this process's cgroup are listed, never used.
        assert!(!t.all_pus().intersects(&t.disallowed), "{:?}", t.disallowed);
    }

    /// Counts from data/hwloc/README.md: packages / NUMA / cores / PUs.
    #[test]
    fn every_shared_xml_loads() {
        let cases = [
            ("32em64t-2n8c2t-pci-normalio.xml", 2, 2, 16, 32),
            ("64amd64-4p2n4ca2co.xml", 4, 8, 64, 64),
            ("192em64t-24n8c2t.xml", 24, 24, 192, 384),
            ("knl.xml", 1, 8, 64, 256),
            ("Intel-RaptorLake-Corei7-1370P.xml", 1, 1, 14, 20),
            ("128arm-2pa2n8cluster4co.xml", 2, 4, 128, 128),
        ];
        let dir = data("");
        let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".xml"))
            .collect();
        on_disk.sort();
        let mut listed: Vec<String> = cases.iter().map(|c| c.0.to_string()).collect();
        listed.sort();
        assert_eq!(on_disk, listed, "an XML in {} has no expected counts here", dir.display());

        for (file, packages, numa, cores, pus) in cases {
            let t = load(&TopologySource::Xml(data(file))).unwrap_or_else(|e| panic!("{file}: {e}"));
            t.validate().unwrap();
            assert_eq!(
                (t.packages.len(), t.numa_nodes.len(), t.core_count(), t.pu_count()),
                (packages, numa, cores, pus),
                "{file}"
            );
            // Every core lies under a NUMA node; memory comes with NUMA nodes.
            assert!(t.cores.iter().all(|c| c.numa.is_some()), "{file}");
            if file.starts_with("Intel-RaptorLake") {
                assert_eq!(t.memory_bytes(), 0, "{file} has no memory information");
                assert!(t.numa_nodes.iter().all(|n| n.memory_source == MemorySource::Unknown), "{file}");
            } else {
                assert!(t.numa_nodes.iter().all(|n| n.memory_bytes > 0), "{file}");
                assert!(t.numa_nodes.iter().all(|n| n.memory_source == MemorySource::Hwloc), "{file}");
            }
            // Cores are grouped by package, packages in order.
            assert!(t.cores.windows(2).all(|w| w[0].package <= w[1].package), "{file}");
        }
    }

    #[test]
    fn raptor_lake_is_hybrid() {
        let t = load(&TopologySource::Xml(data("Intel-RaptorLake-Corei7-1370P.xml"))).unwrap();
        let smt = t.cores.iter().filter(|c| c.pus.len() == 2).count();
        let single = t.cores.iter().filter(|c| c.pus.len() == 1).count();
        assert_eq!((smt, single), (6, 8));
        assert_eq!(t.threads_per_core(), 2);
        assert_eq!(t.all_pus().to_list(), "0-19");
    }

    #[test]
    fn knl_mcdram_nodes_are_listed_with_memory() {
        let t = load(&TopologySource::Xml(data("knl.xml"))).unwrap();
        assert_eq!(t.threads_per_core(), 4);
        let mcdram: Vec<&NumaNode> = t.numa_nodes.iter().filter(|n| n.memory_bytes == 4 * GIB).collect();
        assert_eq!(mcdram.len(), 4);
        let mut os: Vec<u32> = mcdram.iter().map(|n| n.os_index).collect();
        os.sort_unstable();
        assert_eq!(os, vec![4, 5, 6, 7]);
        // Cores map to their DDR node, never to the MCDRAM one sharing its cpuset.
        for core in &t.cores {
            let node = &t.numa_nodes[core.numa.unwrap()];
            assert!(node.os_index < 4, "core {:?} mapped to MCDRAM node {}", core.pus, node.os_index);
        }
        assert_eq!(t.mems_for(&CpuSet::parse_list("0").unwrap()).len(), 1);
    }

    #[test]
    fn numa_numbering_out_of_order() {
        let t = load(&TopologySource::Xml(data("64amd64-4p2n4ca2co.xml"))).unwrap();
        let os: Vec<u32> = t.numa_nodes.iter().map(|n| n.os_index).collect();
        assert_eq!(os, vec![0, 1, 6, 7, 2, 3, 4, 5]);
        for core in &t.cores {
            let node = &t.numa_nodes[core.numa.unwrap()];
            assert!(core.pus.iter().all(|&pu| node.cpus.contains(pu)));
        }
    }

    #[test]
    fn bad_synthetic_is_an_error() {
        for spec in ["package:2 numa:x", "banana", "", "core:4\0"] {
            let err = load(&TopologySource::Synthetic(spec.into())).unwrap_err();
            assert!(matches!(err, TopologyError::BadSynthetic { .. }), "{spec:?}: {err:?}");
            assert!(err.to_string().contains(SYNTHETIC_EXAMPLE), "{err}");
        }
    }

    #[test]
    fn huge_synthetic_is_refused_before_hwloc() {
        assert_eq!(synthetic_pu_bound(SYNTHETIC_EXAMPLE), 32);
        assert_eq!(synthetic_pu_bound("pack:2 numa:2(memory=1GB) [numa(memory=4GB)] pu:3"), 12);
        assert_eq!(synthetic_pu_bound("2 4 2"), 16);
        assert_eq!(synthetic_pu_bound("core:99999999999999999999999999999999999999999999"), u128::MAX);
        let err = load(&TopologySource::Synthetic("package:2 core:4000000 pu:2".into())).unwrap_err();
        assert!(matches!(err, TopologyError::SyntheticTooLarge { pus: 16_000_000, .. }), "{err:?}");
        // A big but plausible node still loads.
        assert_eq!(synthetic("package:4 core:64 pu:2").pu_count(), 512);
    }

    #[test]
    fn missing_xml_names_the_path() {
        let path = PathBuf::from("/nonexistent/berth-topology.xml");
        let err = load(&TopologySource::Xml(path)).unwrap_err();
        assert!(matches!(err, TopologyError::XmlNotFound { .. }), "{err:?}");
        assert!(err.to_string().contains("/nonexistent/berth-topology.xml"), "{err}");
        let err = load(&parse_spec("xml:")).unwrap_err();
        assert!(matches!(err, TopologyError::NoXmlPath), "{err:?}");
    }

    #[test]
    fn non_topology_files_are_errors() {
        for path in [data("README.md"), data("")] {
            let err = load(&TopologySource::Xml(path.clone())).unwrap_err();
            assert!(matches!(err, TopologyError::BadXml { .. }), "{}: {err:?}", path.display());
        }
    }

    /// What an unusable topology says, word for word (the agent prints it and stops).
    #[test]
    fn conversion_refusals_read_as_before() {
        let kind = || "Package".to_string();
        for (e, message) in [
            (ConvertError::BadSet("allowed PUs"), "hwloc reports an infinite or out-of-range set of allowed PUs"),
            (
                ConvertError::BadSet("allowed NUMA nodes"),
                "hwloc reports an infinite or out-of-range set of allowed NUMA nodes",
            ),
            (ConvertError::IndexTooLarge { kind: kind(), index: 1 << 40 }, "Package index 1099511627776 is too large"),
            (ConvertError::LogicalTooLarge { kind: kind(), index: 1 << 33 }, "Package L#8589934592 is too large"),
            (ConvertError::BadNumaCpuset(3), "NUMA node L#3 has a bad cpuset"),
            (ConvertError::NoAllowedNuma(2), "hwloc allows none of its 2 NUMA nodes"),
            (ConvertError::PuWithoutOsIndex(5), "PU L#5 has no OS index"),
            (ConvertError::PuTooLarge(1 << 32), "PU P#4294967296 is too large"),
            (ConvertError::NoPus, "it has no usable PUs"),
        ] {
            assert_eq!(e.to_string(), message);
        }
        let e = TopologyError::Unusable { origin: "xml:/etc/node.xml".into(), detail: ConvertError::NoPus };
        assert_eq!(e.to_string(), "the topology from xml:/etc/node.xml cannot be used: it has no usable PUs");
    }
}
