//! Property tests of placement: random machines (regular ones of every small shape, and the
//! fixture machines) and random sequences of jobs and releases; after every step the
//! invariants of seeds/000 must hold (no PU booked twice, no NUMA node's memory
//! oversubscribed, large parallel jobs alone in their NUMA nodes, rank sub-cpusets inside their
//! job's, no more spread than naive first fit, "busy" and "never" told apart truthfully).

use berth_core::binding::BindingStrategy;
use berth_core::job::{NodeAllocation, Shape};
use berth_core::node::{NodeCapacity, PROP_SINGLE_CPU};
use berth_core::placement::cluster::{place, Placement};
use berth_core::placement::fit::{fit, NodeAsk};
use berth_core::placement::spread::spread;
use berth_core::placement::{JobRequest, MemRequest, PlacementPolicy};
use berth_core::topology::Topology;
use berth_core::{CpuSet, NodeId};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use std::path::Path;
use std::sync::{Arc, OnceLock};

const GIB: u64 = 1 << 30;

// ---------------------------------------------------------------------------------------------
// Machines and clusters

fn fixtures() -> &'static [(String, Arc<Topology>)] {
    static FIXTURES: OnceLock<Vec<(String, Arc<Topology>)>> = OnceLock::new();
    FIXTURES.get_or_init(|| {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/topologies");
        let mut files: Vec<_> =
            std::fs::read_dir(&dir).map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect()).unwrap_or_default();
        files.retain(|p| p.extension().is_some_and(|e| e == "json"));
        files.sort();
        files
            .into_iter()
            .map(|p| {
                let text = std::fs::read_to_string(&p).unwrap();
                let t: Topology = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
                (p.file_stem().unwrap().to_string_lossy().into_owned(), Arc::new(t))
            })
            .collect()
    })
}

#[derive(Debug, Clone)]
enum MachineSpec {
    /// packages, NUMA nodes per package, cores per NUMA node, PUs per core, GiB per NUMA node.
    Uniform(u32, u32, u32, u32, u64),
    /// A fixture machine (index modulo their number; a regular machine if there are none).
    Fixture(usize),
}

impl MachineSpec {
    fn build(&self) -> (String, Arc<Topology>) {
        match *self {
            MachineSpec::Uniform(p, n, c, t, g) => {
                (format!("uniform({p},{n},{c},{t},{g}G)"), Arc::new(Topology::uniform(p, n, c, t, g * GIB)))
            }
            MachineSpec::Fixture(i) => match fixtures() {
                [] => MachineSpec::Uniform(2, 2, 4, 2, 4).build(),
                f => f[i % f.len()].clone(),
            },
        }
    }
}

#[derive(Debug, Clone)]
struct ClusterSpec {
    machine: MachineSpec,
    nodes: u32,
    /// Bit i: node i holds its first PU back for the system.
    system: u8,
    /// Split nodes into subnodes of 2 NUMA nodes; subnode 1 for single-CPU jobs only.
    subnodes: bool,
    singlecpu: bool,
}

fn cluster_spec() -> impl Strategy<Value = ClusterSpec> {
    let uniform = (1u32..=3, 1u32..=4, 1u32..=8, 1u32..=2, 1u64..=8)
        .prop_map(|(p, n, c, t, g)| MachineSpec::Uniform(p, n, c, t, g));
    let machine = prop_oneof![4 => uniform, 1 => (0usize..64).prop_map(MachineSpec::Fixture)];
    (machine, 1u32..=4, any::<u8>(), prop::bool::weighted(0.3), any::<bool>()).prop_map(
        |(machine, nodes, system, subnodes, singlecpu)| ClusterSpec { machine, nodes, system, subnodes, singlecpu },
    )
}

fn build_cluster(spec: &ClusterSpec) -> (String, Vec<NodeCapacity>) {
    let (name, topo) = spec.machine.build();
    let nodes = (0..spec.nodes)
        .map(|i| {
            let mut n = NodeCapacity::new(NodeId(i), format!("n{i}"), topo.clone());
            if spec.system & (1 << i) != 0 {
                n.system_pus = CpuSet::from_iter_u32([topo.cores[0].pus[0]]);
            }
            if spec.subnodes {
                n.set_subnode_size(2);
                if spec.singlecpu && n.subnodes.len() > 1 {
                    n.subnodes[1].properties = vec![PROP_SINGLE_CPU.into()];
                }
            }
            n.refresh();
            n
        })
        .collect();
    (name, nodes)
}

// ---------------------------------------------------------------------------------------------
// Requests

/// Bindings the sequences use, with the cores each gives per node.
const BINDINGS: [(&str, u32); 8] = [
    ("linear:2", 2),
    ("linear:1", 1),
    ("striding:2:2", 2),
    ("explicit:0,1", 1),
    ("striding:0-3:1", 4),
    ("linear:9", 9),
    ("linear:2:0,1", 2),
    ("explicit:0,0:0,2", 2),
];

#[derive(Debug, Clone)]
struct ReqSpec {
    /// 0, 1: per node; 2: total.
    shape: u8,
    /// Nodes of a per-node shape, folded into the cluster's size unless `more_nodes`.
    nodes: u32,
    more_nodes: bool,
    cores: u32,
    large: bool,
    chunk: u32,
    /// 0: none, 1: per node, 2: per CPU; in percent of a NUMA node's memory (per CPU: of its
    /// memory per core).
    mem: (u8, u64),
    threads: bool,
    binding: Option<usize>,
    system_cpus: bool,
    property: Option<&'static str>,
    rank_cpus: u32,
}

fn req_spec() -> impl Strategy<Value = ReqSpec> {
    (
        (0u8..3, 1u32..=4, 1u32..=8, prop::bool::weighted(0.15), 1u32..=2),
        ((0u8..3), 0u64..=160),
        prop::bool::weighted(0.2),
        prop::option::weighted(0.15, 0..BINDINGS.len()),
        prop::bool::weighted(0.15),
        (prop::option::weighted(0.06, prop::sample::select(vec!["singlecpu", "nosuch"])), prop::bool::weighted(0.03)),
        prop_oneof![3 => Just(0u32), 1 => 1u32..=3],
    )
        .prop_map(
            |(
                (shape, nodes, cores, large, chunk),
                mem,
                threads,
                binding,
                system_cpus,
                (property, more_nodes),
                rank_cpus,
            )| ReqSpec {
                shape,
                nodes,
                more_nodes,
                cores,
                large,
                chunk,
                mem,
                threads,
                binding,
                system_cpus,
                property,
                rank_cpus,
            },
        )
}

/// Memory of the machine's first ordinary NUMA node with cores, and that node's cores.
fn numa_scale(t: &Topology) -> (u64, u64) {
    (0..t.numa_nodes.len())
        .find(|&n| !t.numa_nodes[n].special && t.numa_cores(n).next().is_some())
        .map_or((0, 1), |n| (t.numa_nodes[n].memory_bytes, t.numa_cores(n).count() as u64))
}

fn build_request(s: &ReqSpec, t: &Topology, cluster_nodes: u32) -> JobRequest {
    let nodes = if s.more_nodes { cluster_nodes + 1 } else { 1 + (s.nodes - 1) % cluster_nodes };
    let cores = if s.large { 9 + 2 * s.cores } else { s.cores };
    let (numa_mem, numa_cores) = numa_scale(t);
    let mem = match s.mem {
        (1, pct) => MemRequest::PerNode(numa_mem / 100 * pct),
        (2, pct) => MemRequest::PerCpu(numa_mem / numa_cores / 100 * pct),
        _ => MemRequest::PerNode(0),
    };
    let (binding, threads, shape) = match s.binding {
        Some(i) => {
            let (spec, count) = BINDINGS[i];
            let b: BindingStrategy = spec.parse().unwrap();
            (Some(b), false, Shape::PerNode { nodes, cores_per_node: count })
        }
        None if s.shape < 2 => (None, s.threads, Shape::PerNode { nodes, cores_per_node: cores }),
        None => {
            let total = cores.div_ceil(s.chunk) * s.chunk;
            (None, s.threads, Shape::Total { cores: total, chunk: s.chunk })
        }
    };
    JobRequest {
        gres: Default::default(),
        licenses: Default::default(),
        shape,
        mem,
        threads,
        binding,
        system_cpus: s.system_cpus,
        properties: s.property.map(|p| vec![p.to_string()]).unwrap_or_default(),
        avoid_properties: vec![],
        rank_cpus: s.rank_cpus,
        gpus_per_node: 0,
        gpu_type: None,
        gpu_locality: None,
        gpus_per_socket: 0,
    }
}

#[derive(Debug, Clone)]
enum Op {
    Submit(ReqSpec),
    /// Release a live job (index modulo their number).
    Release(usize),
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        prop_oneof![4 => req_spec().prop_map(Op::Submit), 1 => any::<usize>().prop_map(Op::Release)],
        1..24,
    )
}

// ---------------------------------------------------------------------------------------------
// The checks

struct Live {
    id: usize,
    alloc: Vec<NodeAllocation>,
}

/// What `cluster::per_node_slots` gives: a binding's own count, else the shape's.
fn per_node_slots(req: &JobRequest, c: u32) -> u32 {
    req.binding.as_ref().and_then(|b| b.fixed_count()).unwrap_or(c)
}

fn cpus_of_numa(t: &Topology, n: usize) -> CpuSet {
    t.numa_cores(n).flat_map(|c| t.cores[c].pus.iter().copied()).collect()
}

/// NUMA node indexes the PUs of `cpus` lie in.
fn numas_of(t: &Topology, cpus: &CpuSet) -> Vec<usize> {
    let mut v: Vec<usize> =
        t.cores.iter().filter(|c| c.pus.iter().any(|&p| cpus.contains(p))).filter_map(|c| c.numa).collect();
    v.sort_unstable();
    v.dedup();
    v
}

fn shares(t: &Topology, a: &NodeAllocation) -> Result<Vec<(usize, u64)>, String> {
    a.numa_memory
        .iter()
        .map(|s| t.numa_by_os(s.numa).map(|i| (i, s.bytes)).ok_or(format!("share on unknown NUMA os {}", s.numa)))
        .collect()
}

fn exclusive_idx(t: &Topology, a: &NodeAllocation) -> Vec<usize> {
    a.exclusive_numa.iter().filter_map(|os| t.numa_by_os(os)).collect()
}

/// Checks of one new allocation against the state before it was claimed.
fn check_new(
    nodes: &[NodeCapacity],
    live: &[Live],
    policy: &PlacementPolicy,
    req: &JobRequest,
    alloc: &[NodeAllocation],
) -> Result<(), String> {
    let large = req.is_large(policy);
    let mut ids: Vec<u32> = alloc.iter().map(|a| a.node_id.0).collect();
    ids.sort_unstable();
    ids.dedup();
    if ids.len() != alloc.len() {
        return Err("two parts on one node".into());
    }
    match req.shape {
        Shape::PerNode { nodes: k, cores_per_node } => {
            if alloc.len() != k as usize {
                return Err(format!("{} parts for {k} nodes", alloc.len()));
            }
            let want = per_node_slots(req, cores_per_node);
            if let Some(a) = alloc.iter().find(|a| a.cores != want) {
                return Err(format!("{} cores on {}, {want} wanted", a.cores, a.node));
            }
        }
        Shape::Total { cores, chunk } => {
            let sum: u32 = alloc.iter().map(|a| a.cores).sum();
            if sum != cores || alloc.iter().any(|a| a.cores == 0 || a.cores % chunk.max(1) != 0) {
                return Err(format!(
                    "parts {:?} for {cores} in chunks of {chunk}",
                    alloc.iter().map(|a| a.cores).collect::<Vec<_>>()
                ));
            }
        }
    }
    for a in alloc {
        let node = nodes.get(a.node_id.0 as usize).ok_or("part on an unknown node")?;
        let t = &node.topology;
        let at = |m: String| format!("{}: {m} (part {a:?})", node.name);
        if !a.cpus.is_subset_of(&t.all_pus()) {
            return Err(at("cpus outside the node's PUs".into()));
        }
        if !a.cpus.is_subset_of(&node.free_pus) {
            return Err(at("cpus not free".into()));
        }
        if !req.system_cpus && a.cpus.intersects(&node.system_pus) {
            return Err(at("system PU given to a job that did not ask".into()));
        }
        // Units: whole cores, or single PUs with threads.
        if req.threads {
            if a.cpus.len() != a.cores as usize {
                return Err(at(format!("{} PUs for {} threads", a.cpus.len(), a.cores)));
            }
        } else {
            let touched: Vec<_> = t.cores.iter().filter(|c| c.pus.iter().any(|&p| a.cpus.contains(p))).collect();
            if touched.len() != a.cores as usize || touched.iter().any(|c| c.pus.iter().any(|&p| !a.cpus.contains(p))) {
                return Err(at("cpus are not whole cores".into()));
            }
        }
        // Memory: sums up, local NUMA nodes in mems, nothing special, nothing oversubscribed.
        let sh = shares(t, a).map_err(at)?;
        if a.memory_bytes != req.mem.on_node(a.cores) {
            return Err(at(format!("memory {} for {:?} x {}", a.memory_bytes, req.mem, a.cores)));
        }
        if sh.iter().map(|s| s.1).sum::<u64>() != a.memory_bytes {
            return Err(at("numa_memory does not sum to memory_bytes".into()));
        }
        for &(n, b) in &sh {
            if t.numa_nodes[n].special {
                return Err(at("memory on a special NUMA node".into()));
            }
            if b > node.numa_free[n] {
                return Err(at(format!("{b} bytes on numa[{n}] which has {} free", node.numa_free[n])));
            }
            if !a.mems.contains(t.numa_nodes[n].os_index) {
                return Err(at(format!("memory on numa[{n}] outside mems")));
            }
        }
        for n in numas_of(t, &a.cpus) {
            if !a.mems.contains(t.numa_nodes[n].os_index) {
                return Err(at(format!("local numa[{n}] of the cpus not in mems")));
            }
        }
        // Exclusive NUMA nodes: large jobs only, untouched before, holding all they use.
        let excl = exclusive_idx(t, a);
        if large == excl.is_empty() {
            return Err(at(format!("large {large} but exclusive NUMA nodes {excl:?}")));
        }
        if large {
            if let Some(n) = numas_of(t, &a.cpus).into_iter().find(|n| !excl.contains(n)) {
                return Err(at(format!("large job's cpus in numa[{n}] it does not hold")));
            }
            if let Some(&(n, _)) = sh.iter().find(|(n, _)| !excl.contains(n)) {
                return Err(at(format!("large job's memory on numa[{n}] it does not hold")));
            }
            // Where the node has subnodes, whole subnodes (seeds/000), listed in `subnodes`.
            if !node.subnodes.is_empty() {
                let mut held: Vec<u32> = (0..node.subnodes.len())
                    .filter(|&s| node.subnodes[s].numa.iter().any(|n| excl.contains(n)))
                    .map(|s| s as u32)
                    .collect();
                held.sort_unstable();
                let whole = held.iter().all(|&s| node.subnodes[s as usize].numa.iter().all(|n| excl.contains(n)));
                let mut listed = a.subnodes.clone();
                listed.sort_unstable();
                if !whole || listed != held {
                    return Err(at(format!("large job holds NUMA nodes {excl:?}: not whole subnodes {held:?}")));
                }
            }
            for &n in &excl {
                if node.numa_exclusive[n]
                    || node.numa_free[n] != t.numa_nodes[n].memory_bytes
                    || !cpus_of_numa(t, n).is_subset_of(&node.free_pus)
                {
                    return Err(at(format!("exclusive numa[{n}] was in use")));
                }
            }
        }
        // Subnodes: properties asked for are there; singlecpu subnodes hold single-CPU jobs.
        for n in numas_of(t, &a.cpus) {
            if let Some(s) = node.subnode_of(n) {
                let props = &node.subnodes[s].properties;
                if !req.properties.iter().all(|p| props.contains(p)) {
                    return Err(at(format!("numa[{n}] lacks the properties asked for")));
                }
                if props.iter().any(|p| p == PROP_SINGLE_CPU) && req.total_cpus() != 1 {
                    return Err(at(format!("a {}-CPU job in singlecpu subnode {s}", req.total_cpus())));
                }
            } else if !req.properties.is_empty() {
                return Err(at("properties asked for on a node without subnodes".into()));
            }
        }
        // Binding: one (socket, core) per core, naming the job's cores.
        if req.binding.is_some() {
            if a.binding.len() != a.cores as usize {
                return Err(at("binding does not name every core".into()));
            }
            for &(s, c) in &a.binding {
                let i = t.core_index(s, c).ok_or(at(format!("binding names {s},{c} which does not exist")))?;
                if !t.cores[i].pus.iter().all(|&p| a.cpus.contains(p)) {
                    return Err(at(format!("bound core {s},{c} not in cpus")));
                }
            }
        }
        // Ranks: inside the job's cpus and mems, partitioning the cpus when there is room.
        if let Some(per_rank) = a.cores.checked_div(req.rank_cpus) {
            let want = per_rank.max(1) as usize;
            if a.ranks.len() != want {
                return Err(at(format!("{} ranks, {want} wanted", a.ranks.len())));
            }
            let mut union = CpuSet::new();
            let mut total = 0;
            for r in &a.ranks {
                if r.cpus.is_empty()
                    || !r.cpus.is_subset_of(&a.cpus)
                    || r.mems.is_empty()
                    || !r.mems.is_subset_of(&a.mems)
                {
                    return Err(at(format!("rank {}/{} not inside the job", r.cpus, r.mems)));
                }
                union.union_with(&r.cpus);
                total += r.cpus.len();
            }
            if a.ranks.len() <= a.cpus.len() && (union != a.cpus || total != a.cpus.len()) {
                return Err(at("rank cpus do not partition the job's cpus".into()));
            }
        } else if !a.ranks.is_empty() {
            return Err(at("ranks nobody asked for".into()));
        }
    }
    // Exclusive NUMA nodes of running large jobs: nothing of the new job there.
    for j in live {
        for ja in &j.alloc {
            let node = &nodes[ja.node_id.0 as usize];
            let t = &node.topology;
            for n in exclusive_idx(t, ja) {
                for a in alloc.iter().filter(|a| a.node_id == ja.node_id) {
                    if a.cpus.intersects(&cpus_of_numa(t, n)) {
                        return Err(format!("{}: cpus in numa[{n}] held by large job {}", node.name, j.id));
                    }
                    if shares(t, a)?.iter().any(|s| s.0 == n && s.1 > 0) {
                        return Err(format!("{}: memory on numa[{n}] held by large job {}", node.name, j.id));
                    }
                }
            }
        }
    }
    Ok(())
}

/// Whole-state checks: the live jobs' bookings against the nodes' books.
fn check_books(nodes: &[NodeCapacity], live: &[Live]) -> Result<(), String> {
    for node in nodes {
        let t = &node.topology;
        let mut booked = CpuSet::new();
        let mut used = vec![0u64; t.numa_nodes.len()];
        let mut exclusive = vec![false; t.numa_nodes.len()];
        let parts =
            || live.iter().flat_map(|j| j.alloc.iter().map(move |a| (j, a))).filter(|(_, a)| a.node_id == node.id);
        for (j, a) in parts() {
            if booked.intersects(&a.cpus) {
                return Err(format!("{}: job {}'s cpus {} booked twice", node.name, j.id, a.cpus));
            }
            booked.union_with(&a.cpus);
            for (n, b) in shares(t, a)? {
                used[n] += b;
            }
            for n in exclusive_idx(t, a) {
                exclusive[n] = true;
                for (k, b) in parts().filter(|(k, _)| k.id != j.id) {
                    if b.cpus.intersects(&cpus_of_numa(t, n)) || shares(t, b)?.iter().any(|s| s.0 == n && s.1 > 0) {
                        return Err(format!("{}: job {} uses numa[{n}] held by large job {}", node.name, k.id, j.id));
                    }
                }
            }
        }
        for (n, numa) in t.numa_nodes.iter().enumerate() {
            if used[n] > numa.memory_bytes {
                return Err(format!("{}: numa[{n}] oversubscribed: {} of {}", node.name, used[n], numa.memory_bytes));
            }
            if node.numa_free[n] != numa.memory_bytes - used[n] {
                return Err(format!("{}: numa[{n}] free {} but {} booked", node.name, node.numa_free[n], used[n]));
            }
            if node.numa_exclusive[n] != exclusive[n] {
                return Err(format!("{}: numa[{n}] exclusive flag {} disagrees", node.name, node.numa_exclusive[n]));
            }
        }
        let mut free = t.all_pus();
        free.subtract(&booked);
        if free != node.free_pus {
            return Err(format!("{}: free PUs {} but {} booked", node.name, node.free_pus, booked));
        }
    }
    Ok(())
}

/// Naive first fit for per-node shapes: the first nodes (in order) that fit in first-fit mode.
fn naive(nodes: &[NodeCapacity], policy: &PlacementPolicy, req: &JobRequest) -> Option<Vec<NodeAllocation>> {
    let Shape::PerNode { nodes: k, cores_per_node } = req.shape else { return None };
    let ask = NodeAsk { slots: per_node_slots(req, cores_per_node), req, large: req.is_large(policy), first_fit: true };
    let parts: Vec<NodeAllocation> = nodes
        .iter()
        .filter(|n| n.state.accepts_work())
        .filter_map(|n| fit(n, policy, &ask).ok())
        .take(k as usize)
        .collect();
    (parts.len() == k as usize).then_some(parts)
}

fn spread_of(nodes: &[NodeCapacity], alloc: &[NodeAllocation]) -> u64 {
    spread(alloc.iter().map(|a| (&nodes[a.node_id.0 as usize], a)))
}

fn outcome(p: &Placement) -> &'static str {
    match p {
        Placement::Now(_) => "now",
        Placement::Busy(_) => "busy",
        Placement::Never(_) => "never",
    }
}

/// Run a sequence, checking everything after each step; the error carries the log.
fn run(spec: &ClusterSpec, ops: &[Op]) -> Result<(), String> {
    let policy = PlacementPolicy::default();
    let (name, mut nodes) = build_cluster(spec);
    let mut live: Vec<Live> = vec![];
    let mut log = vec![format!("{} x {name} system {:#b} subnodes {}", spec.nodes, spec.system, spec.subnodes)];
    let fail = |log: &[String], m: String| Err(format!("{m}\n--- steps:\n{}", log.join("\n")));
    for (step, op) in ops.iter().enumerate() {
        match op {
            Op::Release(i) => {
                if live.is_empty() {
                    continue;
                }
                let j = live.remove(i % live.len());
                for a in &j.alloc {
                    nodes[a.node_id.0 as usize].release(a);
                }
                log.push(format!("{step}: release job {}", j.id));
            }
            Op::Submit(s) => {
                let req = build_request(s, &nodes[0].topology, nodes.len() as u32);
                let got = place(&nodes, &policy, &req);
                let empty: Vec<NodeCapacity> = nodes.iter().map(NodeCapacity::pristine).collect();
                let on_empty = place(&empty, &policy, &req);
                log.push(format!("{step}: {req:?}\n    -> {got:?} (empty cluster: {})", outcome(&on_empty)));
                // Busy and never, against an empty copy of the cluster.
                match (&got, &on_empty) {
                    (Placement::Never(_), Placement::Now(_)) => {
                        return fail(&log, "never, but it fits the empty cluster".into());
                    }
                    (Placement::Busy(_), Placement::Busy(_) | Placement::Never(_)) => {
                        return fail(&log, "busy, but it does not fit the empty cluster either".into());
                    }
                    (Placement::Now(_), Placement::Never(_)) => {
                        return fail(&log, "placed now, but never on the empty cluster".into());
                    }
                    _ => {}
                }
                // Spread against naive first fit on the same state.
                if let Some(n) = naive(&nodes, &policy, &req) {
                    match &got {
                        Placement::Now(a) if spread_of(&nodes, a) > spread_of(&nodes, &n) => {
                            return fail(
                                &log,
                                format!(
                                    "spread {} > naive first fit's {} ({n:?})",
                                    spread_of(&nodes, a),
                                    spread_of(&nodes, &n)
                                ),
                            );
                        }
                        Placement::Now(_) => {}
                        _ => return fail(&log, format!("not placed, but naive first fit places it: {n:?}")),
                    }
                }
                if let Placement::Now(alloc) = got {
                    if let Err(m) = check_new(&nodes, &live, &policy, &req, &alloc) {
                        return fail(&log, m);
                    }
                    for a in &alloc {
                        nodes[a.node_id.0 as usize].claim(a);
                    }
                    log.push(format!("    = job {step}"));
                    live.push(Live { id: step, alloc });
                }
            }
        }
        if let Err(m) = check_books(&nodes, &live) {
            return fail(&log, m);
        }
    }
    // Everything released, the nodes are as new.
    for j in live.drain(..) {
        for a in &j.alloc {
            nodes[a.node_id.0 as usize].release(a);
        }
    }
    for n in &nodes {
        let p = n.pristine();
        if n.free_pus != p.free_pus || n.numa_free != p.numa_free || n.numa_exclusive != p.numa_exclusive {
            return fail(&log, format!("{} not pristine after releasing everything", n.name));
        }
    }
    Ok(())
}

/// `cases` cases, or `PROPTEST_CASES` for a deeper run (e.g. `PROPTEST_CASES=20000 cargo test
/// --release -p berth-core --test placement_props`).
fn config(cases: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(cases);
    // No failure persistence: shrunk failures are kept as the plain tests at the end of this file.
    ProptestConfig { cases, max_shrink_iters: 4000, failure_persistence: None, ..ProptestConfig::default() }
}

proptest! {
    #![proptest_config(config(128))]

    /// Every invariant after every step of random job sequences on random clusters.
    #[test]
    fn placement_invariants_hold(spec in cluster_spec(), ops in ops()) {
        run(&spec, &ops).map_err(TestCaseError::fail)?;
    }
}

proptest! {
    #![proptest_config(config(64))]

    /// The same on the fixture machines only (real topologies: out-of-order NUMA numbering,
    /// special memory, hybrid cores, no memory information).
    #[test]
    fn placement_invariants_hold_on_fixture_machines(
        machine in 0usize..64, nodes in 1u32..=3, system in any::<u8>(), subnodes in prop::bool::weighted(0.3),
        ops in ops()
    ) {
        prop_assume!(!fixtures().is_empty());
        let spec = ClusterSpec { machine: MachineSpec::Fixture(machine), nodes, system, subnodes, singlecpu: true };
        run(&spec, &ops).map_err(TestCaseError::fail)?;
    }
}

// ---------------------------------------------------------------------------------------------
// Engine bugs found by the properties, as plain cases

/// Two empty 8-core nodes with 4G each; 8 cores in total with 1G per CPU: 4 cores on each node
/// fit (feasible() says so), but place() only tries all 8 free cores of each node and answers
/// Busy, on an empty cluster: the job never runs.
#[test]
fn total_shape_with_memory_per_cpu_fits_empty_cluster() {
    let t = Arc::new(Topology::uniform(1, 1, 8, 1, 4 * GIB));
    let nodes: Vec<NodeCapacity> = (0..2).map(|i| NodeCapacity::new(NodeId(i), format!("n{i}"), t.clone())).collect();
    let policy = PlacementPolicy::default();
    let req = JobRequest { mem: MemRequest::PerCpu(GIB), ..JobRequest::simple(Shape::Total { cores: 8, chunk: 1 }, 0) };
    assert_eq!(berth_core::placement::cluster::feasible(&nodes, &policy, &req, |_| true), Ok(()));
    match place(&nodes, &policy, &req) {
        Placement::Now(a) => assert_eq!(a.iter().map(|p| p.cores).collect::<Vec<_>>(), vec![4, 4]),
        other => panic!("expected 4 + 4 cores, got {other:?}"),
    }
}

/// The same with threads and a system PU: room counts the system PU, so the node's whole room
/// never fits and the node is skipped.
#[test]
fn total_threads_shape_with_system_pus_fits_empty_cluster() {
    let t = Arc::new(Topology::uniform(1, 1, 4, 1, 4 * GIB));
    let nodes: Vec<NodeCapacity> = (0..2)
        .map(|i| {
            let mut n = NodeCapacity::new(NodeId(i), format!("n{i}"), t.clone());
            n.system_pus = CpuSet::from_iter_u32([0]);
            n.refresh();
            n
        })
        .collect();
    let policy = PlacementPolicy::default();
    let req = JobRequest { threads: true, ..JobRequest::simple(Shape::Total { cores: 6, chunk: 1 }, 0) };
    assert_eq!(berth_core::placement::cluster::feasible(&nodes, &policy, &req, |_| true), Ok(()));
    match place(&nodes, &policy, &req) {
        Placement::Now(a) => assert_eq!(a.iter().map(|p| p.cores).collect::<Vec<_>>(), vec![3, 3]),
        other => panic!("expected 3 + 3 PUs, got {other:?}"),
    }
}

/// A binding given as a `<socket>,<core>` range names as many cores as the global range that
/// means the same, but `JobRequest::from_options` counts it as 1 core per node: a 16-core bound
/// job is then not a large parallel job and gets no exclusive NUMA nodes.
/// (The count of a socket-named range depends on the node, so placement counts it there.)
#[test]
fn socket_core_striding_range_counts_its_cores() {
    use berth_core::directives::SubmitOptions;
    let t = Arc::new(Topology::uniform(2, 2, 4, 1, 4 * GIB));
    let node = NodeCapacity::new(NodeId(0), "n0", t);
    let policy = PlacementPolicy::default();
    let request = |spec: &str| {
        let o = SubmitOptions { binding: Some(spec.parse().unwrap()), ..Default::default() };
        JobRequest::from_options(&o).unwrap()
    };
    let (global, socket) = (request("striding:0-15:1"), request("striding:0,0-1,7:1"));
    assert_eq!(global.shape, Shape::PerNode { nodes: 1, cores_per_node: 16 });
    let Placement::Now(a) = place(std::slice::from_ref(&node), &policy, &socket) else { panic!("fits") };
    assert_eq!(a[0].exclusive_numa.to_list(), "0-3", "a 16-CPU job holds its NUMA nodes alone");
}

/// One package, 4 NUMA nodes of 2 cores with 1G each, subnodes of 2 NUMA nodes. 3 cores with
/// 2.5G: on the empty node every candidate keeps the cores inside subnode 0 (2G), so the job is
/// "never"; yet once a 1-core job sits on core 0 it is placed (cores in NUMA 1 and 2, memory
/// borrowed from NUMA 0), and that placement is valid on the empty node too.
#[test]
fn placed_now_is_not_never_on_the_empty_node() {
    let t = Arc::new(Topology::uniform(1, 4, 2, 1, GIB));
    let mut empty = NodeCapacity::new(NodeId(0), "n0", t);
    empty.set_subnode_size(2);
    let policy = PlacementPolicy::default();
    let job = JobRequest::simple(Shape::PerNode { nodes: 1, cores_per_node: 3 }, 5 * GIB / 2);
    let mut used = empty.clone();
    let Placement::Now(one) = place(
        std::slice::from_ref(&used),
        &policy,
        &JobRequest::simple(Shape::PerNode { nodes: 1, cores_per_node: 1 }, 0),
    ) else {
        panic!("1 core fits")
    };
    used.claim(&one[0]);
    let Placement::Now(a) = place(std::slice::from_ref(&used), &policy, &job) else {
        panic!("fits next to the 1-core job")
    };
    assert_eq!(a[0].cpus.to_list(), "2-4");
    let mut check = empty.clone();
    check.claim(&a[0]);
    assert!(check.numa_free.iter().all(|&f| f <= GIB), "the same placement is valid on the empty node");
    match place(std::slice::from_ref(&empty), &policy, &job) {
        Placement::Now(_) => {}
        other => panic!("fits the empty node, got {other:?}"),
    }
}

/// 4 NUMA nodes of 4 cores, subnodes of 2 NUMA nodes. An unbound 9-core job gets subnodes 0 and
/// 1 (NUMA 0-3) alone; `linear:9` gets only NUMA 0-2 and no subnode, so a small job then lands in
/// NUMA 3, inside a subnode the large job uses.
#[test]
fn bound_large_job_holds_whole_subnodes() {
    use berth_core::directives::SubmitOptions;
    let t = Arc::new(Topology::uniform(1, 4, 4, 1, 4 * GIB));
    let mut node = NodeCapacity::new(NodeId(0), "n0", t);
    node.set_subnode_size(2);
    let policy = PlacementPolicy::default();
    let unbound = JobRequest::simple(Shape::PerNode { nodes: 1, cores_per_node: 9 }, 0);
    let Placement::Now(u) = place(std::slice::from_ref(&node), &policy, &unbound) else { panic!("fits") };
    assert_eq!((u[0].exclusive_numa.to_list(), u[0].subnodes.clone()), ("0-3".to_string(), vec![0, 1]));
    let o = SubmitOptions { binding: Some("linear:9".parse().unwrap()), ..Default::default() };
    let bound = JobRequest::from_options(&o).unwrap();
    let Placement::Now(b) = place(std::slice::from_ref(&node), &policy, &bound) else { panic!("fits") };
    assert_eq!(b[0].cpus.to_list(), "0-8");
    assert_eq!((b[0].exclusive_numa.to_list(), b[0].subnodes.clone()), ("0-3".to_string(), vec![0, 1]));
}

/// One package of 4 NUMA nodes with 1 core and 1G each, subnodes of 2 NUMA nodes. `linear:2`
/// with 1.6G per CPU (3.2G) takes cores 0-1 on the empty node, whose subnode has only 2G: the
/// binding chose its cores without regard to memory, so the job was "never" there; yet with core
/// 0 taken, cores 1-2 span both subnodes (4G) and it is placed. On the empty node the binding
/// must try its other choices (cores 1-2) too.
#[test]
fn bound_job_cores_chosen_with_memory_in_mind() {
    use berth_core::directives::SubmitOptions;
    let t = Arc::new(Topology::uniform(1, 4, 1, 1, GIB));
    let mut empty = NodeCapacity::new(NodeId(0), "n0", t);
    empty.set_subnode_size(2);
    let policy = PlacementPolicy::default();
    let o = SubmitOptions { binding: Some("linear:2".parse().unwrap()), ..Default::default() };
    let job = JobRequest { mem: MemRequest::PerCpu(GIB / 10 * 16), ..JobRequest::from_options(&o).unwrap() };
    let mut used = empty.clone();
    let Placement::Now(one) = place(
        std::slice::from_ref(&used),
        &policy,
        &JobRequest::simple(Shape::PerNode { nodes: 1, cores_per_node: 1 }, 0),
    ) else {
        panic!("1 core fits")
    };
    used.claim(&one[0]);
    let Placement::Now(busy) = place(std::slice::from_ref(&used), &policy, &job) else {
        panic!("fits next to the 1-core job")
    };
    assert_eq!(busy[0].cpus.to_list(), "1-2");
    match place(std::slice::from_ref(&empty), &policy, &job) {
        Placement::Now(a) => assert_eq!(a[0].numa_memory.iter().map(|s| s.bytes).sum::<u64>(), GIB / 10 * 32),
        other => panic!("fits the empty node, got {other:?}"),
    }
}

/// 4 NUMA nodes of 3 cores with 1G each, no subnodes. A `linear:9` job is large and holds the
/// NUMA nodes of its cores alone, with no borrowing; with 3.5G it needs 4 of them. Cores 0-8 lie
/// in 3, cores 1-9 in 4: the job fits the empty node, with the second choice.
#[test]
fn bound_large_job_cores_chosen_with_memory_in_mind() {
    use berth_core::directives::SubmitOptions;
    let t = Arc::new(Topology::uniform(1, 4, 3, 1, GIB));
    let node = NodeCapacity::new(NodeId(0), "n0", t);
    let policy = PlacementPolicy::default();
    let o = SubmitOptions { binding: Some("linear:9".parse().unwrap()), mem: Some(GIB / 2 * 7), ..Default::default() };
    let job = JobRequest::from_options(&o).unwrap();
    match place(std::slice::from_ref(&node), &policy, &job) {
        Placement::Now(a) => {
            assert_eq!(a[0].cpus.to_list(), "1-9");
            assert_eq!(a[0].exclusive_numa.to_list(), "0-3");
        }
        other => panic!("fits the empty node, got {other:?}"),
    }
}
