//! Why a job does not fit one node: typed, shown in words only where a reason is displayed.

use std::fmt;

use crate::binding::{BindBusy, BindNever};
use crate::node::{SubnodeState, PROP_ONLY_PARALLEL, PROP_SINGLE_CPU};
use crate::units::format_size;

/// Why a job does not fit a node now (boxed: it rides in every placement's `Err`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Miss {
    /// Not now: the resources are taken.
    Busy(Box<NodeMiss>),
    /// Never on this node, even empty.
    Never(Box<NodeMiss>),
}

impl Miss {
    pub fn busy(why: NodeMiss) -> Miss {
        Miss::Busy(Box::new(why))
    }

    pub fn never(why: NodeMiss) -> Miss {
        Miss::Never(Box::new(why))
    }

    /// The miss of a node fitted as if empty (whether a job can ever fit): whatever it lacks,
    /// it lacks for good, so it is `Never`, and its words say what the node has, not what is
    /// free on it now.
    pub fn on_empty(self) -> Miss {
        match self {
            Miss::Busy(m) | Miss::Never(m) => Miss::Never(m),
        }
    }
}

/// A `Busy` miss says what is free on the node now; a `Never` one what the node has.
impl fmt::Display for Miss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Miss::Busy(m) => m.fmt(f),
            Miss::Never(m) => m.fmt_never(f),
        }
    }
}

/// "GPUs" or "GPUs of type T".
fn gpus_of(f: &mut fmt::Formatter<'_>, gpu_type: &Option<String>) -> fmt::Result {
    match gpu_type {
        Some(k) => write!(f, "GPUs of type {k}"),
        None => f.write_str("GPUs"),
    }
}

/// What one node lacks for one job. `node` is the node's name; `unit` is "cores" or "PUs".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeMiss {
    /// Properties wanted, but the node has no subnodes.
    NoSubnodes {
        properties: Vec<String>,
        node: String,
    },
    /// No NUMA node of the node has memory.
    NoMemory {
        node: String,
    },
    /// The generic resources `gres` (rendered) are not free together.
    GresNotFree {
        gres: String,
        node: String,
    },
    /// The node has fewer of `name` than wanted.
    GresTooFew {
        name: String,
        want: u32,
        node: String,
        total: u32,
    },
    /// Jobs hold the node's `name`.
    GresTaken {
        name: String,
        want: u32,
        free: u32,
        total: u32,
        node: String,
    },
    /// Each key fits alone, not all together.
    GresTooMany {
        gres: String,
        node: String,
    },
    GresNotAllFree {
        gres: String,
        node: String,
    },
    /// Strict GPU locality: no GPU choice has `want` units near it at all.
    StrictNever {
        want: u32,
        unit: &'static str,
        gpus: u32,
        node: String,
        most_local: usize,
    },
    /// Strict GPU locality: no GPU choice has `want` free units near it now.
    StrictBusy {
        want: u32,
        unit: &'static str,
        gpus: u32,
        node: String,
        most_free: usize,
    },
    /// The node has fewer GPUs (of the type) than wanted; `types` its GPU types when a type is wanted.
    GpusTooFew {
        gpu_type: Option<String>,
        node: String,
        have: usize,
        want: usize,
        types: Vec<String>,
    },
    GpusTaken {
        gpu_type: Option<String>,
        free: usize,
        node: String,
        want: usize,
    },
    /// `--gpus-per-socket`: fewer than `sockets` sockets have `per_socket` such GPUs.
    SocketGpusTooFew {
        gpu_type: Option<String>,
        per_socket: usize,
        sockets: usize,
        node: String,
        able: usize,
    },
    SocketGpusTaken {
        gpu_type: Option<String>,
        per_socket: usize,
        sockets: usize,
        node: String,
        ready: usize,
    },
    BindBusy(BindBusy),
    BindNever(BindNever),
    /// Fewer usable units than wanted; `memless_numa` the OS indexes of NUMA nodes whose CPUs
    /// take no job for want of memory.
    ShortUnits {
        unit: &'static str,
        have: usize,
        node: String,
        properties: Vec<String>,
        want: u32,
        notes: Vec<UnitNote>,
        memless_numa: Vec<u32>,
    },
    /// No candidate had room.
    NoRoom {
        slots: u32,
        unit: &'static str,
        node: String,
    },
    /// A large parallel job finds too few units in untouched NUMA nodes.
    WholeNuma {
        large_cpus: u32,
        node: String,
        have: usize,
        unit: &'static str,
        slots: usize,
        system: Option<UnitNote>,
    },
    /// Memory: `need` bytes wanted, `free` in the NUMA nodes the job may use.
    Memory {
        need: u64,
        node: String,
        free: u64,
    },
}

/// Why some of a node's units are not usable by a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnitNote {
    SubnodeState {
        subnode: usize,
        state: SubnodeState,
    },
    /// Kept for another queue's jobs by `property`.
    SubnodeKept {
        subnode: usize,
        property: String,
    },
    OnlyParallel {
        subnode: usize,
    },
    SingleCpu {
        subnode: usize,
    },
    NoSubnodeHas {
        node: String,
        properties: Vec<String>,
    },
    /// This many free PUs are system CPUs.
    SystemCpus(usize),
}

impl fmt::Display for UnitNote {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UnitNote::SubnodeState { subnode, state } => write!(f, "subnode {subnode} is {}", state.as_str()),
            UnitNote::SubnodeKept { subnode, property } => {
                write!(f, "subnode {subnode} is kept for another queue's jobs ({property})")
            }
            UnitNote::OnlyParallel { subnode } => {
                write!(f, "subnode {subnode} takes only large parallel jobs ({PROP_ONLY_PARALLEL})")
            }
            UnitNote::SingleCpu { subnode } => {
                write!(f, "subnode {subnode} takes only single-CPU jobs ({PROP_SINGLE_CPU})")
            }
            UnitNote::NoSubnodeHas { node, properties } => write!(
                f,
                "no subnode of {node} has property {}; drop --property, or ask an admin to set it on a subnode",
                properties.join(",")
            ),
            UnitNote::SystemCpus(1) => f.write_str("1 more PU is a system CPU, which only --system-cpus jobs use"),
            UnitNote::SystemCpus(n) => write!(f, "{n} more PUs are system CPUs, which only --system-cpus jobs use"),
        }
    }
}

impl NodeMiss {
    /// The words of this miss as one that holds for good (a [`Miss::Never`], such as a node
    /// fitted as if empty): what the node has, never "free", and no "it starts when ..."
    /// (nothing running holds what it lacks). Misses that only a busy node gives are told as
    /// their never-fitting kin (taken GPUs as too few GPUs, and so on).
    fn fmt_never(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeMiss::GresNotFree { gres, node } | NodeMiss::GresNotAllFree { gres, node } => {
                fmt::Display::fmt(&NodeMiss::GresTooMany { gres: gres.clone(), node: node.clone() }, f)
            }
            NodeMiss::GresTaken { name, want, total, node, .. } => fmt::Display::fmt(
                &NodeMiss::GresTooFew { name: name.clone(), want: *want, node: node.clone(), total: *total },
                f,
            ),
            NodeMiss::StrictBusy { want, unit, gpus, node, most_free } => {
                let never = NodeMiss::StrictNever {
                    want: *want,
                    unit,
                    gpus: *gpus,
                    node: node.clone(),
                    most_local: *most_free,
                };
                fmt::Display::fmt(&never, f)
            }
            NodeMiss::GpusTaken { gpu_type, free, node, want } => {
                gpus_of(f, gpu_type)?;
                write!(f, ": node {node} has {free}, {want} wanted")
            }
            NodeMiss::SocketGpusTaken { gpu_type, per_socket, sockets, node, ready } => {
                let never = NodeMiss::SocketGpusTooFew {
                    gpu_type: gpu_type.clone(),
                    per_socket: *per_socket,
                    sockets: *sockets,
                    node: node.clone(),
                    able: *ready,
                };
                fmt::Display::fmt(&never, f)
            }
            NodeMiss::ShortUnits { unit, have, node, properties, want, notes, memless_numa } => {
                write!(f, "{unit}: {node} has {have}")?;
                units_rest(f, properties, *want, notes, memless_numa)
            }
            NodeMiss::WholeNuma { large_cpus, node, have, unit, slots, system } => {
                write!(
                    f,
                    "whole NUMA nodes: a large parallel job (more than {large_cpus} CPUs) gets NUMA nodes nobody else uses; {node} has {have} {unit} in such NUMA nodes, {slots} wanted"
                )?;
                match system {
                    Some(n) => write!(f, " ({n})"),
                    None => Ok(()),
                }
            }
            NodeMiss::Memory { need, node, free } => write!(
                f,
                "{} of memory wanted on {node}, the NUMA nodes it may use there have {}",
                format_size(*need),
                format_size(*free)
            ),
            // The others say what the node has, or what cannot be.
            other => fmt::Display::fmt(other, f),
        }
    }
}

/// What follows a unit count: the properties asked for, the units wanted, why some are not
/// usable.
fn units_rest(
    f: &mut fmt::Formatter<'_>,
    properties: &[String],
    want: u32,
    notes: &[UnitNote],
    memless_numa: &[u32],
) -> fmt::Result {
    if !properties.is_empty() {
        write!(f, " in subnodes with property {}", properties.join(","))?;
    }
    write!(f, ", {want} wanted")?;
    if !notes.is_empty() {
        let notes: Vec<String> = notes.iter().map(ToString::to_string).collect();
        write!(f, " ({})", notes.join("; "))?;
    }
    if !memless_numa.is_empty() {
        let numa: Vec<String> = memless_numa.iter().map(|n| format!("P#{n}")).collect();
        write!(f, " (the CPUs of NUMA node {} take no job: it has no memory)", numa.join(", "))?;
    }
    Ok(())
}

/// The words of a miss as found now (a [`Miss::Busy`]): what is free on the node.
impl fmt::Display for NodeMiss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeMiss::NoSubnodes { properties, node } => write!(
                f,
                "subnodes: property {} wanted, but node {node} has no subnodes; drop --property, or ask an admin to set subnode_numa and the properties",
                properties.join(",")
            ),
            NodeMiss::NoMemory { node } => write!(
                f,
                "memory: node {node} has no usable memory (no source gave its NUMA nodes any); \
                 ask an admin to give their size with the node agent's --numa-memory"
            ),
            NodeMiss::GresNotFree { gres, node } => write!(f, "gres {gres}: not free on {node}"),
            NodeMiss::GresTooFew { name, want, node, total } => write!(
                f,
                "gres {name}: {want} wanted on each node, {node} has {total}; ask for at most what a node has (berth nodes)"
            ),
            NodeMiss::GresTaken { name, want, free, total, node } => write!(
                f,
                "gres {name}: {want} wanted on each node, {free} of {total} free on {node}; it starts when running jobs free them"
            ),
            NodeMiss::GresTooMany { gres, node } => {
                write!(f, "gres {gres}: more than {node} has; ask for at most what a node has (berth nodes)")
            }
            NodeMiss::GresNotAllFree { gres, node } => {
                write!(f, "gres {gres}: not all free on {node}; it starts when running jobs free them")
            }
            NodeMiss::StrictNever { want, unit, gpus, node, most_local } => write!(
                f,
                "GPU locality strict: {want} {unit} local to {gpus} GPU(s) wanted, but on node {node} at most {most_local} {unit} are local to {gpus} of its GPUs; ask for fewer {unit} per GPU, or for cores elsewhere on the node with --gpu-locality prefer (Slurm's --gres-flags=disable-binding)"
            ),
            NodeMiss::StrictBusy { want, unit, gpus, node, most_free } => write!(
                f,
                "GPU locality strict: {want} free {unit} local to {gpus} free GPU(s) wanted; node {node} has free GPUs but at most {most_free} free {unit} next to them; it starts when jobs there end (with --gpu-locality prefer it could take {unit} elsewhere on the node)"
            ),
            NodeMiss::GpusTooFew { gpu_type, node, have, want, types } => {
                gpus_of(f, gpu_type)?;
                write!(f, ": node {node} has {have}, {want} wanted")?;
                if !types.is_empty() {
                    write!(f, " (its types: {})", types.join(", "))?;
                }
                Ok(())
            }
            NodeMiss::GpusTaken { gpu_type, free, node, want } => {
                gpus_of(f, gpu_type)?;
                write!(f, ": {free} free on {node}, {want} wanted; it starts when running or suspended jobs free them")
            }
            NodeMiss::SocketGpusTooFew { gpu_type, per_socket: n, sockets, node, able } => {
                gpus_of(f, gpu_type)?;
                write!(
                    f,
                    " per socket: {n} on each of {sockets} socket(s) wanted, node {node} has {able} socket(s) with {n} such GPUs"
                )
            }
            NodeMiss::SocketGpusTaken { gpu_type, per_socket: n, sockets, node, ready } => {
                gpus_of(f, gpu_type)?;
                write!(
                    f,
                    " per socket: {n} free on each of {sockets} socket(s) wanted, node {node} has {ready} socket(s) with that many free; it starts when running or suspended jobs free them"
                )
            }
            NodeMiss::BindBusy(b) => b.fmt(f),
            NodeMiss::BindNever(n) => n.fmt(f),
            NodeMiss::ShortUnits { unit, have, node, properties, want, notes, memless_numa } => {
                write!(f, "{unit}: {have} free on {node}")?;
                units_rest(f, properties, *want, notes, memless_numa)
            }
            NodeMiss::NoRoom { slots, unit, node } => write!(f, "no room for {slots} {unit} on {node}"),
            NodeMiss::WholeNuma { large_cpus, node, have, unit, slots, system } => {
                write!(
                    f,
                    "whole NUMA nodes: a large parallel job (more than {large_cpus} CPUs) gets NUMA nodes nobody else uses; {node} has {have} {unit} free in such NUMA nodes, {slots} wanted"
                )?;
                match system {
                    Some(n) => write!(f, " ({n})"),
                    None => Ok(()),
                }
            }
            NodeMiss::Memory { need, node, free } => write!(
                f,
                "{} of memory wanted on {node}, the NUMA nodes it may use there have {} free",
                format_size(*need),
                format_size(*free)
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::binding::{BindBusy, BindNever, BindProblem};

    fn words(m: NodeMiss) -> String {
        m.to_string()
    }

    /// Each variant's words, exactly as the strings built before they were typed.
    #[test]
    fn every_variant_keeps_its_words() {
        let n = || "n1".to_string();
        let props = || vec!["a".to_string(), "b".to_string()];
        let cases: Vec<(NodeMiss, &str)> = vec![
            (
                NodeMiss::NoSubnodes { properties: props(), node: n() },
                "subnodes: property a,b wanted, but node n1 has no subnodes; drop --property, or ask an admin to set subnode_numa and the properties",
            ),
            (
                NodeMiss::NoMemory { node: n() },
                "memory: node n1 has no usable memory (no source gave its NUMA nodes any); ask an admin to give their size with the node agent's --numa-memory",
            ),
            (NodeMiss::GresNotFree { gres: "fpga:2".into(), node: n() }, "gres fpga:2: not free on n1"),
            (
                NodeMiss::GresTooFew { name: "fpga".into(), want: 3, node: n(), total: 2 },
                "gres fpga: 3 wanted on each node, n1 has 2; ask for at most what a node has (berth nodes)",
            ),
            (
                NodeMiss::GresTaken { name: "fpga".into(), want: 2, free: 1, total: 4, node: n() },
                "gres fpga: 2 wanted on each node, 1 of 4 free on n1; it starts when running jobs free them",
            ),
            (
                NodeMiss::GresTooMany { gres: "fpga:2,fpga:x:2".into(), node: n() },
                "gres fpga:2,fpga:x:2: more than n1 has; ask for at most what a node has (berth nodes)",
            ),
            (
                NodeMiss::GresNotAllFree { gres: "fpga:2".into(), node: n() },
                "gres fpga:2: not all free on n1; it starts when running jobs free them",
            ),
            (
                NodeMiss::StrictNever { want: 8, unit: "cores", gpus: 2, node: n(), most_local: 4 },
                "GPU locality strict: 8 cores local to 2 GPU(s) wanted, but on node n1 at most 4 cores are local to 2 of its GPUs; ask for fewer cores per GPU, or for cores elsewhere on the node with --gpu-locality prefer (Slurm's --gres-flags=disable-binding)",
            ),
            (
                NodeMiss::StrictBusy { want: 8, unit: "PUs", gpus: 1, node: n(), most_free: 3 },
                "GPU locality strict: 8 free PUs local to 1 free GPU(s) wanted; node n1 has free GPUs but at most 3 free PUs next to them; it starts when jobs there end (with --gpu-locality prefer it could take PUs elsewhere on the node)",
            ),
            (
                NodeMiss::GpusTooFew { gpu_type: None, node: n(), have: 2, want: 4, types: vec![] },
                "GPUs: node n1 has 2, 4 wanted",
            ),
            (
                NodeMiss::GpusTooFew {
                    gpu_type: Some("a100".into()),
                    node: n(),
                    have: 0,
                    want: 1,
                    types: vec!["h100".into(), "v100".into()],
                },
                "GPUs of type a100: node n1 has 0, 1 wanted (its types: h100, v100)",
            ),
            (
                NodeMiss::GpusTaken { gpu_type: Some("a100".into()), free: 1, node: n(), want: 2 },
                "GPUs of type a100: 1 free on n1, 2 wanted; it starts when running or suspended jobs free them",
            ),
            (
                NodeMiss::SocketGpusTooFew { gpu_type: None, per_socket: 2, sockets: 2, node: n(), able: 1 },
                "GPUs per socket: 2 on each of 2 socket(s) wanted, node n1 has 1 socket(s) with 2 such GPUs",
            ),
            (
                NodeMiss::SocketGpusTaken { gpu_type: Some("a100".into()), per_socket: 1, sockets: 2, node: n(), ready: 0 },
                "GPUs of type a100 per socket: 1 free on each of 2 socket(s) wanted, node n1 has 0 socket(s) with that many free; it starts when running or suspended jobs free them",
            ),
            (
                NodeMiss::BindBusy(BindBusy::InUse { groups: vec![(0, vec![0, 2]), (1, vec![5])] }),
                "cores 0,2 (socket 0) and 5 (socket 1) are in use",
            ),
            (
                NodeMiss::BindNever(BindNever { problem: BindProblem::NoCore(9), per_socket: vec![4, 4], cores: 8 }),
                "core 9 does not exist: this node has 2 sockets of 4 cores",
            ),
            (
                NodeMiss::ShortUnits {
                    unit: "cores",
                    have: 3,
                    node: n(),
                    properties: vec![],
                    want: 4,
                    notes: vec![],
                    memless_numa: vec![],
                },
                "cores: 3 free on n1, 4 wanted",
            ),
            (
                NodeMiss::ShortUnits {
                    unit: "PUs",
                    have: 0,
                    node: n(),
                    properties: props(),
                    want: 2,
                    notes: vec![
                        UnitNote::SubnodeState { subnode: 0, state: SubnodeState::Drained },
                        UnitNote::SubnodeKept { subnode: 1, property: "gpu".into() },
                        UnitNote::OnlyParallel { subnode: 2 },
                        UnitNote::SingleCpu { subnode: 3 },
                        UnitNote::NoSubnodeHas { node: n(), properties: props() },
                        UnitNote::SystemCpus(1),
                        UnitNote::SystemCpus(2),
                    ],
                    memless_numa: vec![2, 3],
                },
                "PUs: 0 free on n1 in subnodes with property a,b, 2 wanted (subnode 0 is drained; subnode 1 is kept for another queue's jobs (gpu); \
                 subnode 2 takes only large parallel jobs (onlyparallel); subnode 3 takes only single-CPU jobs (singlecpu); \
                 no subnode of n1 has property a,b; drop --property, or ask an admin to set it on a subnode; \
                 1 more PU is a system CPU, which only --system-cpus jobs use; 2 more PUs are system CPUs, which only --system-cpus jobs use) \
                 (the CPUs of NUMA node P#2, P#3 take no job: it has no memory)",
            ),
            (NodeMiss::NoRoom { slots: 4, unit: "cores", node: n() }, "no room for 4 cores on n1"),
            (
                NodeMiss::WholeNuma { large_cpus: 64, node: n(), have: 16, unit: "cores", slots: 32, system: None },
                "whole NUMA nodes: a large parallel job (more than 64 CPUs) gets NUMA nodes nobody else uses; n1 has 16 cores free in such NUMA nodes, 32 wanted",
            ),
            (
                NodeMiss::WholeNuma {
                    large_cpus: 64,
                    node: n(),
                    have: 16,
                    unit: "cores",
                    slots: 32,
                    system: Some(UnitNote::SystemCpus(2)),
                },
                "whole NUMA nodes: a large parallel job (more than 64 CPUs) gets NUMA nodes nobody else uses; n1 has 16 cores free in such NUMA nodes, 32 wanted (2 more PUs are system CPUs, which only --system-cpus jobs use)",
            ),
            (
                NodeMiss::Memory { need: 4 << 30, node: n(), free: 1 << 30 },
                "4G of memory wanted on n1, the NUMA nodes it may use there have 1G free",
            ),
        ];
        // As a `Never` miss (a node fitted as if empty), these say what the node has; the
        // others read the same either way.
        let never = |m: &NodeMiss| -> Option<&str> {
            Some(match m {
                NodeMiss::GresNotFree { .. } => "gres fpga:2: more than n1 has; ask for at most what a node has (berth nodes)",
                NodeMiss::GresTaken { .. } => {
                    "gres fpga: 2 wanted on each node, n1 has 4; ask for at most what a node has (berth nodes)"
                }
                NodeMiss::GresNotAllFree { .. } => {
                    "gres fpga:2: more than n1 has; ask for at most what a node has (berth nodes)"
                }
                NodeMiss::StrictBusy { .. } => {
                    "GPU locality strict: 8 PUs local to 1 GPU(s) wanted, but on node n1 at most 3 PUs are local to 1 of its GPUs; ask for fewer PUs per GPU, or for cores elsewhere on the node with --gpu-locality prefer (Slurm's --gres-flags=disable-binding)"
                }
                NodeMiss::GpusTaken { .. } => "GPUs of type a100: node n1 has 1, 2 wanted",
                NodeMiss::SocketGpusTaken { .. } => {
                    "GPUs of type a100 per socket: 1 on each of 2 socket(s) wanted, node n1 has 0 socket(s) with 1 such GPUs"
                }
                NodeMiss::ShortUnits { notes, .. } if notes.is_empty() => "cores: n1 has 3, 4 wanted",
                NodeMiss::ShortUnits { .. } => {
                    "PUs: n1 has 0 in subnodes with property a,b, 2 wanted (subnode 0 is drained; subnode 1 is kept for another queue's jobs (gpu); \
                     subnode 2 takes only large parallel jobs (onlyparallel); subnode 3 takes only single-CPU jobs (singlecpu); \
                     no subnode of n1 has property a,b; drop --property, or ask an admin to set it on a subnode; \
                     1 more PU is a system CPU, which only --system-cpus jobs use; 2 more PUs are system CPUs, which only --system-cpus jobs use) \
                     (the CPUs of NUMA node P#2, P#3 take no job: it has no memory)"
                }
                NodeMiss::WholeNuma { system: None, .. } => {
                    "whole NUMA nodes: a large parallel job (more than 64 CPUs) gets NUMA nodes nobody else uses; n1 has 16 cores in such NUMA nodes, 32 wanted"
                }
                NodeMiss::WholeNuma { .. } => {
                    "whole NUMA nodes: a large parallel job (more than 64 CPUs) gets NUMA nodes nobody else uses; n1 has 16 cores in such NUMA nodes, 32 wanted (2 more PUs are system CPUs, which only --system-cpus jobs use)"
                }
                NodeMiss::Memory { .. } => "4G of memory wanted on n1, the NUMA nodes it may use there have 1G",
                _ => return None,
            })
        };
        for (miss, want) in cases {
            assert_eq!(words(miss.clone()), want, "{miss:?}");
            assert_eq!(Miss::busy(miss.clone()).to_string(), want);
            let never_words = never(&miss).unwrap_or(want);
            assert_eq!(Miss::never(miss.clone()).to_string(), never_words, "{miss:?}");
            assert_eq!(Miss::busy(miss).on_empty().to_string(), never_words);
        }
    }

    /// No `Never` miss speaks of what is free, nor of waiting for running jobs: a node that
    /// lacks something for good has nothing a running job could give back.
    #[test]
    fn never_words_say_what_a_node_has() {
        let n = || "n0".to_string();
        let misses = vec![
            NodeMiss::ShortUnits {
                unit: "cores",
                have: 4,
                node: n(),
                properties: vec![],
                want: 8,
                notes: vec![],
                memless_numa: vec![],
            },
            NodeMiss::GresTaken { name: "fpga".into(), want: 2, free: 0, total: 1, node: n() },
            NodeMiss::GresNotFree { gres: "fpga:2".into(), node: n() },
            NodeMiss::GresNotAllFree { gres: "fpga:2".into(), node: n() },
            NodeMiss::GpusTaken { gpu_type: None, free: 1, node: n(), want: 2 },
            NodeMiss::SocketGpusTaken { gpu_type: None, per_socket: 1, sockets: 2, node: n(), ready: 1 },
            NodeMiss::StrictBusy { want: 4, unit: "cores", gpus: 1, node: n(), most_free: 2 },
            NodeMiss::WholeNuma { large_cpus: 8, node: n(), have: 3, unit: "cores", slots: 4, system: None },
            NodeMiss::Memory { need: 2 << 30, node: n(), free: 1 << 30 },
            NodeMiss::NoRoom { slots: 4, unit: "cores", node: n() },
        ];
        for m in misses {
            let words = Miss::never(m.clone()).to_string();
            assert!(!words.contains("free"), "{m:?}: {words}");
            assert!(!words.contains("it starts when"), "{m:?}: {words}");
        }
        assert_eq!(
            Miss::busy(NodeMiss::ShortUnits {
                unit: "cores",
                have: 4,
                node: n(),
                properties: vec![],
                want: 8,
                notes: vec![],
                memless_numa: vec![],
            })
            .on_empty()
            .to_string(),
            "cores: n0 has 4, 8 wanted"
        );
    }
}
