//! Why a request does not go on the cluster now ([`Busy`]) or ever ([`Never`]): typed, with
//! the words users read as a pending job's reason (`berth jobs`, `berth show`) as their
//! Display. The words are part of the interface: tests and system tests assert them.

use super::Miss;
use crate::units::format_size;
use std::fmt;

/// Fits the machine, but not what is free now: what is missing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Busy {
    /// Fewer than `nodes` nodes have `slots` free units (`unit`: "cores" or "PUs") each.
    Units { unit: &'static str, nodes: u32, slots: u32, have: usize },
    /// Fewer than `nodes` nodes have `gpus` free GPUs (of `gpu_type`) beside `slots` units.
    Gpus { gpu_type: Option<String>, nodes: u32, gpus: u32, unit: &'static str, slots: u32, have: usize },
    /// Fewer than `nodes` nodes have the generic resources `gres` (rendered `name:count,...`)
    /// free beside `slots` units.
    Gres { gres: String, nodes: u32, unit: &'static str, slots: u32, have: usize },
    /// The licenses are taken now (the nodes would fit).
    Licenses(crate::gres::LicensesBusy),
    /// Neither the nodes nor the licenses are free now.
    AndLicenses(Box<Busy>, crate::gres::LicensesBusy),
    /// A large parallel job (more than `large_cpus` CPUs) finds fewer than `nodes` nodes with
    /// `cores` cores in NUMA nodes nobody uses.
    WholeNumaNodes { large_cpus: u32, nodes: u32, cores: u32, have: usize },
    /// The nodes with `slots` free units have at most `most` bytes free, `need` wanted.
    NodeMemory { need: u64, unit: &'static str, slots: u32, nodes: u32, most: u64 },
    /// `have` nodes have the units and memory by the counts, but the exact fit refuses them.
    Layout { unit: &'static str, slots: u32, have: usize },
    /// A node's own answer, the last tried.
    Node(Miss),
    /// No node set fits (first fit only).
    NoNodesFit,
    /// Fewer than `cores` units free (in chunks of `chunk`): `free` of them.
    TotalUnits { unit: &'static str, cores: u32, chunk: u32, free: u64 },
    /// Enough units free, but only `have` on nodes with `need` bytes free beside a chunk.
    TotalMemory { need: u64, unit: &'static str, chunk: u32, free: u64, have: u64, most: u64 },
    /// Spread over the nodes, whole NUMA nodes free now hold `given` of a large job's `cores`.
    SpreadWholeNuma { large_cpus: u32, cores: u32, unit: &'static str, given: u32 },
    /// Spread over the nodes, they take `given` of `cores`; `miss`: the first node's answer.
    Spread { unit: &'static str, cores: u32, given: u32, miss: Option<Miss> },
    /// More CPUs wanted than are free on the whole machine, by the count alone: the words of a
    /// machine that cannot say more (`Machine::busy_by_count`'s default; the topology-aware
    /// cluster gives placement's own, `Units` or `TotalUnits`).
    Counted { need: u64, free: u64 },
    /// A machine that does not say (the simulator's, counted in cores only): no words.
    Unstated,
}

/// Can never fit the machine (its nodes that are up), even empty: why, and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Never {
    NoNodeUp,
    /// Every node up could hold a part, but `wanted` nodes are more than the `up` ones.
    TooFewNodes {
        wanted: u32,
        up: usize,
    },
    /// Only `ok` of the `up` nodes could ever hold a part; `miss`: another node's answer.
    NoNodeHolds {
        wanted: u32,
        ok: usize,
        up: usize,
        miss: Miss,
        advice: Option<SizeAdvice>,
    },
    /// The `up` nodes have `total` units in all, fewer than `cores`.
    TooFewUnits {
        unit: &'static str,
        cores: u32,
        up: usize,
        total: u64,
    },
    /// Spread over the `up` nodes, at most `total` of `cores` fit; `miss`: a node's answer.
    TooLarge {
        unit: &'static str,
        cores: u32,
        up: usize,
        total: u64,
        miss: Miss,
        advice: Option<SizeAdvice>,
    },
    /// A license the cluster does not have, or not that many of.
    License(crate::gres::LicenseNever),
    /// A machine counted in cores only (the simulator's): `cores` wanted, `nodes` of `per_node`.
    Cores {
        cores: u64,
        nodes: u64,
        per_node: u32,
    },
}

/// What to ask for instead, after a size that does not fit (none when the job names node
/// properties: their reasons carry their fix).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SizeAdvice {
    /// The largest node up (by cores, then memory).
    pub largest: Option<NodeSize>,
}

/// A node's size, as the advice shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeSize {
    pub cores: usize,
    pub pus: usize,
    pub memory: u64,
}

impl std::error::Error for Busy {}
impl std::error::Error for Never {}

/// "1 node", "3 nodes".
pub(crate) fn count(n: usize, word: &str) -> String {
    format!("{n} {word}{}", if n == 1 { "" } else { "s" })
}

/// "1 core", "4 cores", "1 free PU": `units` is plural.
pub(crate) fn amount(n: u64, units: &str) -> String {
    if n == 1 {
        format!("1 {}", units.strip_suffix('s').unwrap_or(units))
    } else {
        format!("{n} {units}")
    }
}

/// "no node has", "1 node has", "2 nodes have".
fn have_now(n: usize) -> String {
    match n {
        0 => "no node has".into(),
        1 => "1 node has".into(),
        n => format!("{n} nodes have"),
    }
}

impl fmt::Display for Busy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Busy::Units { unit, nodes, slots, have } => write!(
                f,
                "{unit}: {} with {} each wanted, {} that many free now; it starts when running jobs free them",
                count(*nodes as usize, "node"),
                amount(*slots as u64, &format!("free {unit}")),
                have_now(*have)
            ),
            Busy::Gpus { gpu_type, nodes, gpus, unit, slots, have } => {
                let what = gpu_type.as_deref().map_or("GPUs".to_string(), |t| format!("GPUs of type {t}"));
                write!(
                    f,
                    "{what}: {} with {gpus} free {what} and {} each wanted, {} that many free now; it starts when running or suspended jobs free them",
                    count(*nodes as usize, "node"),
                    amount(*slots as u64, &format!("free {unit}")),
                    have_now(*have)
                )
            }
            Busy::Gres { gres, nodes, unit, slots, have } => write!(
                f,
                "gres {gres}: {} with that free and {} each wanted, {} that many free now; it starts when running or suspended jobs free them",
                count(*nodes as usize, "node"),
                amount(*slots as u64, &format!("free {unit}")),
                have_now(*have)
            ),
            Busy::Licenses(why) => write!(f, "{why}"),
            Busy::AndLicenses(what, why) => write!(f, "{what}; {why}"),
            Busy::WholeNumaNodes { large_cpus, nodes, cores, have } => write!(
                f,
                "whole NUMA nodes: a large parallel job (more than {large_cpus} CPUs) gets NUMA nodes nobody else uses; {} with {cores} cores in such NUMA nodes wanted, {} that many now; it starts when the jobs on them end",
                count(*nodes as usize, "node"),
                have_now(*have)
            ),
            Busy::NodeMemory { need, unit, slots, nodes, most } => write!(
                f,
                "memory: {} free beside {} wanted on {}, the nodes with that many free have at most {} free now; it starts when memory frees up",
                format_size(*need),
                amount(*slots as u64, &format!("free {unit}")),
                count(*nodes as usize, "node"),
                format_size(*most)
            ),
            Busy::Layout { unit, slots, have } => write!(
                f,
                "NUMA layout: {} {} and the memory wanted, but not where the job's placement rules allow; it starts when running jobs free more",
                have_now(*have),
                amount(*slots as u64, &format!("free {unit}"))
            ),
            Busy::Node(miss) => write!(f, "{miss}"),
            Busy::NoNodesFit => f.write_str("no nodes fit"),
            Busy::TotalUnits { unit, cores, chunk, free } => {
                let in_chunks = if *chunk > 1 { format!(" in chunks of {chunk}") } else { String::new() };
                write!(
                    f,
                    "{unit}: {cores} wanted{in_chunks}, {free} free now; it starts when running jobs free {} more",
                    *cores as u64 - free
                )
            }
            Busy::TotalMemory { need, unit, chunk, free, have, most } => {
                let per = if *chunk > 1 { format!("each {chunk} {unit}") } else { amount(1, unit) };
                write!(
                    f,
                    "memory: {} free wanted on a node beside {per}; {free} {unit} are free now, {have} of them on nodes with that much memory free (at most {} on one node); it starts when memory frees up",
                    format_size(*need),
                    format_size(*most)
                )
            }
            Busy::SpreadWholeNuma { large_cpus, cores, unit, given } => write!(
                f,
                "whole NUMA nodes: a large parallel job (more than {large_cpus} CPUs) gets NUMA nodes nobody else uses; {cores} {unit} wanted, such NUMA nodes free now hold {given}; it starts when the jobs on them end"
            ),
            Busy::Spread { unit, cores, given, miss: Some(m) } => write!(
                f,
                "{} wanted, the nodes free now can take {given} of them ({})",
                amount(*cores as u64, unit),
                m
            ),
            Busy::Spread { unit, cores, given, miss: None } => write!(
                f,
                "{unit}: {cores} wanted, the nodes free now can take {given} of them; it starts when running jobs free more"
            ),
            Busy::Counted { need, free } => {
                write!(f, "cores: {need} wanted, {free} free now; it starts when running jobs free them")
            }
            Busy::Unstated => Ok(()),
        }
    }
}

impl fmt::Display for SizeAdvice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(n) = &self.largest {
            write!(f, "; the largest node up has {} cores, {} PUs, {} memory", n.cores, n.pus, format_size(n.memory))?;
        }
        f.write_str("; ask for less, or wait for nodes that have it to come up")
    }
}

impl fmt::Display for Never {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let advice = |a: &Option<SizeAdvice>| a.as_ref().map_or(String::new(), ToString::to_string);
        match self {
            Never::NoNodeUp => f.write_str("nodes: no node is up; it starts once nodes come up"),
            Never::TooFewNodes { wanted, up } => write!(
                f,
                "nodes: {} wanted, {}; ask for at most {up} nodes, or wait for more nodes to come up",
                count(*wanted as usize, "node"),
                up_count(*up)
            ),
            Never::NoNodeHolds { wanted, ok, up, miss, advice: a } => write!(
                f,
                "{} wanted, {ok} of the {} could ever hold a part: {}{}",
                count(*wanted as usize, "node"),
                up_count(*up),
                miss,
                advice(a)
            ),
            Never::TooFewUnits { unit, cores, up, total } => write!(
                f,
                "{unit}: {cores} wanted, the {} have {total} in all; ask for at most {total}, or wait for more nodes to come up",
                up_count(*up)
            ),
            Never::TooLarge { unit, cores, up, total, miss, advice: a } => write!(
                f,
                "{} wanted, the {} could hold at most {total} of them: {}{}",
                amount(*cores as u64, unit),
                up_count(*up),
                miss,
                advice(a)
            ),
            Never::License(why) => write!(f, "{why}"),
            Never::Cores { cores, nodes, per_node } => {
                write!(f, "needs {cores} cores; the machine has {nodes} nodes of {per_node}")
            }
        }
    }
}

/// "1 node up", "3 nodes up".
fn up_count(n: usize) -> String {
    format!("{} up", count(n, "node"))
}
