//! Preemption by suspension: which running jobs a high-score job may suspend (freeze) to start
//! now, and which suspended jobs may resume.
//!
//! A suspended job keeps its memory (it stays resident and accounted per NUMA node); only its
//! CPUs are lent. So the trial state releases the victims' PUs (and exclusive NUMA nodes) with
//! their memory left claimed, and a preemptor that needs memory the victims hold cannot use it.
//! A large parallel preemptor needs NUMA nodes nobody uses at all, so it can only take nodes
//! whose victims hold no memory there.
//!
//! Bounds: a job is never suspended if that could take its total suspension past
//! `max_suspended_secs` (its time suspended so far plus the preemptor's walltime, which is how
//! long it may have to wait), nor before it ran `min_run_secs_before_suspend`. The controller
//! resumes suspended jobs first thing each pass ([`resume_candidates`]), and should keep the
//! PUs of jobs suspended for a preemptor that ended off-limits to new starts until they resume.

use super::{place, ClusterState, Placement};
use crate::job::{Allocation, NodeAllocation};
use crate::placement::cluster::node_by_id;
use crate::placement::spread::spread;
use crate::placement::JobRequest;
use crate::{JobId, NodeId};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

mod resume;
pub use resume::{beside_windows, resume_parts, resumed_on, windows_held, PartsJob, ResumeWait};

/// `[preempt]` in the controller's config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PreemptConfig {
    pub enabled: bool,
    /// Score a job needs to suspend others (it may suspend only jobs of strictly lower score).
    pub min_score: f64,
    /// Jobs with more CPUs than this count as large parallel for scoring (0: none do).
    pub large_cpus: u64,
    /// Score per CPU of a large parallel job.
    pub large_score_per_cpu: f64,
    /// Score per preemption class of the job's queue.
    pub class_weight: f64,
    /// Cost of each node the victims span, added to their scores: prefers victims packed on
    /// few nodes over cheaper ones scattered. The preemptor's own spread where it then lands
    /// (see `placement::spread`: nodes, packages, NUMA nodes) costs as much per unit, so
    /// victims it runs compactly in win over equally cheap ones it would straddle.
    pub spread_penalty: f64,
    /// Most seconds any job spends suspended, in total over its life.
    pub max_suspended_secs: f64,
    /// Jobs that have run less than this are left alone.
    pub min_run_secs_before_suspend: f64,
}

impl Default for PreemptConfig {
    fn default() -> Self {
        PreemptConfig {
            enabled: false,
            min_score: 1000.0,
            large_cpus: 64,
            large_score_per_cpu: 1.0,
            class_weight: 1000.0,
            spread_penalty: 10.0,
            max_suspended_secs: 3600.0,
            min_run_secs_before_suspend: 300.0,
        }
    }
}

/// A job's preemption score: its queue's class, plus its size if it is large parallel.
pub fn score(request: &JobRequest, preempt_class: u32, cfg: &PreemptConfig) -> f64 {
    let cpus = request.total_cpus();
    let large = cfg.large_cpus > 0 && cpus > cfg.large_cpus;
    cfg.class_weight * preempt_class as f64 + if large { cfg.large_score_per_cpu * cpus as f64 } else { 0.0 }
}

/// A running job as preemption sees it.
#[derive(Debug, Clone)]
pub struct Preemptible {
    pub id: JobId,
    pub alloc: Allocation,
    pub score: f64,
    /// Seconds it has already spent suspended.
    pub suspended_secs: f64,
    /// When it started.
    pub start: f64,
}

/// The job that would preempt.
#[derive(Debug, Clone)]
pub struct Preemptor<'a> {
    pub request: &'a JobRequest,
    pub score: f64,
    /// Seconds: how long its victims may stay suspended.
    pub walltime: f64,
}

/// What a preemption does: suspend `victims`, then start the preemptor on `alloc`.
#[derive(Debug, Clone, PartialEq)]
pub struct Preemption {
    pub victims: Vec<JobId>,
    pub alloc: Allocation,
}

/// The part of an allocation a suspended job gives up: its PUs and exclusive NUMA nodes, not
/// its memory nor its GPUs.
pub fn cpus_only(alloc: &Allocation) -> Allocation {
    alloc
        .iter()
        .map(|na| NodeAllocation {
            memory_bytes: 0,
            numa_memory: vec![],
            gpus: vec![],
            gres: Default::default(),
            licenses: Default::default(),
            ..na.clone()
        })
        .collect()
}

/// The victims `choose_victims` would pick (see [`plan_preemption`]).
pub fn choose_victims(
    machine: &ClusterState,
    running: &[Preemptible],
    candidate: &Preemptor,
    cfg: &PreemptConfig,
    now: f64,
) -> Option<Vec<JobId>> {
    plan_preemption(machine, running, candidate, cfg, now).map(|p| p.victims)
}

/// Waiting jobs tried as preemptors per scheduling pass (by the controller and the
/// simulator alike), highest priority first: preemption stays bounded on a long queue.
pub const PREEMPTORS_PER_PASS: usize = 4;

/// Most victims considered: the cheapest ones, so a decision stays quick on a big machine.
const MAX_POOL: usize = 512;
/// Greedy searches tried, each starting from a different one of the cheapest victims.
const SEEDS: usize = 8;

/// The cheapest set of jobs whose suspension lets `candidate` start now, and where it starts.
/// None when preemption is off, the candidate's score is below `min_score`, it can start
/// without preemption (or can never fit), or no allowed set of victims makes room.
///
/// Cheapest: lowest total of the victims' scores plus `spread_penalty` per node they span and
/// per unit of the candidate's spread where it lands (seeds/000 scores with the spread). A
/// greedy search adds victims by lowest added cost (at equal cost those in packages it already
/// frees first, then more CPUs) until the candidate fits, then drops any it fits without, most
/// expensive first; it is run from each of the few cheapest victims, and the cheapest outcome
/// wins.
pub fn plan_preemption(
    machine: &ClusterState,
    running: &[Preemptible],
    candidate: &Preemptor,
    cfg: &PreemptConfig,
    now: f64,
) -> Option<Preemption> {
    plan_preemption_beside(machine, running, candidate, cfg, now, &vec![])
}

/// [`plan_preemption`] on a machine with `held` claimed (the advance reservations' windows the
/// candidate would run into, [`windows_held`]), which stays claimed as victims are suspended:
/// a victim on PUs of a window gives back only its PUs outside it (suspended, then the windows
/// claimed again, as the controller keeps them), so the candidate never lands in a window.
pub fn plan_preemption_beside(
    machine: &ClusterState,
    running: &[Preemptible],
    candidate: &Preemptor,
    cfg: &PreemptConfig,
    now: f64,
    held: &Allocation,
) -> Option<Preemption> {
    if !cfg.enabled || candidate.score < cfg.min_score {
        return None;
    }
    if !matches!(place(machine, candidate.request), Placement::Busy(_)) {
        return None;
    }
    let mut pool: Vec<&Preemptible> = running
        .iter()
        .filter(|r| {
            r.score < candidate.score
                && now - r.start >= cfg.min_run_secs_before_suspend
                && r.suspended_secs + candidate.walltime.max(0.0) <= cfg.max_suspended_secs
        })
        .collect();
    let alone = |r: &Preemptible| r.score + cfg.spread_penalty * r.alloc.len() as f64;
    pool.sort_by(|a, b| alone(a).total_cmp(&alone(b)));
    pool.truncate(MAX_POOL);
    let total_cost = |victims: &[&Preemptible], alloc: &Allocation| {
        let nodes: BTreeSet<NodeId> = victims.iter().flat_map(|r| r.alloc.iter().map(|na| na.node_id)).collect();
        let landing = spread(alloc.iter().filter_map(|na| node_by_id(machine.nodes(), na.node_id).map(|n| (n, na))));
        victims.iter().map(|r| r.score).sum::<f64>() + cfg.spread_penalty * (nodes.len() as u64 + landing) as f64
    };
    let mut best: Option<(f64, Vec<&Preemptible>, Allocation)> = None;
    for seed in 0..pool.len().min(SEEDS) {
        let Some((victims, alloc)) = greedy(machine, &pool, seed, candidate.request, cfg, held) else { continue };
        let cost = total_cost(&victims, &alloc);
        if best.as_ref().is_none_or(|(c, _, _)| cost < *c) {
            best = Some((cost, victims, alloc));
        }
    }
    best.map(|(_, victims, alloc)| Preemption { victims: victims.iter().map(|r| r.id).collect(), alloc })
}

/// Victims from `pool`, starting with `pool[seed]`, until `req` fits; then pruned.
fn greedy<'a>(
    machine: &ClusterState,
    pool: &[&'a Preemptible],
    seed: usize,
    req: &JobRequest,
    cfg: &PreemptConfig,
    held: &Allocation,
) -> Option<(Vec<&'a Preemptible>, Allocation)> {
    // A victim's PUs given back, but those `held` (claimed again: claiming is idempotent).
    let release = |trial: &mut ClusterState, victim: &Allocation| {
        trial.release(victim);
        if !held.is_empty() {
            trial.claim(held);
        }
    };
    let mut left: Vec<&Preemptible> = pool.to_vec();
    let mut trial = machine.clone();
    let mut chosen: Vec<(&Preemptible, f64)> = vec![];
    let mut nodes: BTreeSet<NodeId> = BTreeSet::new();
    let mut packages: BTreeSet<(NodeId, usize)> = BTreeSet::new();
    let mut next = Some(seed);
    let mut fit = None;
    while fit.is_none() {
        let cost = |r: &Preemptible| {
            let new_nodes = r.alloc.iter().filter(|na| !nodes.contains(&na.node_id)).count();
            r.score + cfg.spread_penalty * new_nodes as f64
        };
        let cpus = |r: &Preemptible| r.alloc.iter().map(|na| na.cores as u64).sum::<u64>();
        // Packages it would free that no victim so far frees: fewer keeps the candidate compact.
        let new_packages = |r: &Preemptible| packages_of(machine, &r.alloc).difference(&packages).count();
        let pick = next.take().or_else(|| {
            let cheapest = left.iter().enumerate().min_by(|(_, a), (_, b)| {
                cost(a)
                    .total_cmp(&cost(b))
                    .then_with(|| new_packages(a).cmp(&new_packages(b)))
                    .then_with(|| cpus(b).cmp(&cpus(a)))
            });
            cheapest.map(|(i, _)| i)
        })?;
        // `remove`, not `swap_remove`: ties keep going to the earlier (cheaper alone) victim.
        let victim = left.remove(pick);
        let victim_cost = cost(victim);
        release(&mut trial, &cpus_only(&victim.alloc));
        nodes.extend(victim.alloc.iter().map(|na| na.node_id));
        packages.extend(packages_of(machine, &victim.alloc));
        chosen.push((victim, victim_cost));
        match place(&trial, req) {
            Placement::Now(alloc) => fit = Some(alloc),
            Placement::Busy(_) => {}
            Placement::Never(_) => return None,
        }
    }
    let mut alloc = fit?;
    // Drop victims the candidate fits without, most expensive first.
    let mut order: Vec<usize> = (0..chosen.len()).collect();
    order.sort_by(|&a, &b| chosen[b].1.total_cmp(&chosen[a].1));
    let mut keep = vec![true; chosen.len()];
    for i in order {
        let part = cpus_only(&chosen[i].0.alloc);
        trial.claim(&part);
        match place(&trial, req) {
            Placement::Now(without) => {
                keep[i] = false;
                alloc = without;
            }
            _ => release(&mut trial, &part),
        }
    }
    let victims = chosen.iter().zip(keep).filter(|(_, k)| *k).map(|((r, _), _)| *r).collect();
    Some((victims, alloc))
}

/// The (node, package) pairs an allocation's CPUs lie in.
fn packages_of(machine: &ClusterState, alloc: &Allocation) -> BTreeSet<(NodeId, usize)> {
    let mut out = BTreeSet::new();
    for na in alloc {
        let Some(node) = node_by_id(machine.nodes(), na.node_id) else { continue };
        for c in &node.topology.cores {
            if c.pus.iter().any(|&p| na.cpus.contains(p)) {
                out.insert((na.node_id, c.package));
            }
        }
    }
    out
}

/// A suspended job: its allocation as it was when it ran.
#[derive(Debug, Clone)]
pub struct SuspendedJob {
    pub id: JobId,
    pub alloc: Allocation,
}

/// How a suspended job can resume now.
#[derive(Debug, Clone, PartialEq)]
pub enum Resume {
    /// On its own PUs, which are free again.
    InPlace,
    /// On other free PUs of the same nodes (a cpuset change; the job keeps its memory nodes).
    Relocated(Allocation),
}

/// Which suspended jobs can resume now on `machine` (where their memory is still claimed and
/// their PUs are not), in the order given (put the longest-suspended first). With `relocate`,
/// a job whose PUs are taken may resume on other whole free cores of the same nodes, on the
/// NUMA nodes holding its memory (so no memory has to move; per-rank cpusets and core binding
/// are carried over position by position).
pub fn resume_candidates(machine: &ClusterState, suspended: &[SuspendedJob], relocate: bool) -> Vec<(JobId, Resume)> {
    let mut trial = machine.clone();
    let mut out = vec![];
    for job in suspended {
        let own_pus_free = job.alloc.iter().all(|na| {
            trial.nodes().iter().find(|n| n.id == na.node_id).is_some_and(|n| na.cpus.is_subset_of(&n.free_pus))
        });
        let resume = if own_pus_free {
            Some((Resume::InPlace, job.alloc.clone()))
        } else if relocate {
            relocated(&trial, &job.alloc).map(|a| (Resume::Relocated(a.clone()), a))
        } else {
            None
        };
        if let Some((how, alloc)) = resume {
            trial.claim(&cpus_only(&alloc));
            out.push((job.id, how));
        }
    }
    out
}

/// The allocation moved to other free whole cores of the same nodes, on its memory's NUMA
/// nodes, if every node has enough.
fn relocated(machine: &ClusterState, alloc: &Allocation) -> Option<Allocation> {
    alloc.iter().map(|na| relocate_part(machine, na)).collect()
}

fn relocate_part(machine: &ClusterState, na: &NodeAllocation) -> Option<NodeAllocation> {
    let node = machine.nodes().iter().find(|n| n.id == na.node_id)?;
    let topo = &node.topology;
    let want = na.cpus.len();
    let mut cpus = crate::CpuSet::new();
    let mut binding = vec![];
    for (index, core) in topo.cores.iter().enumerate() {
        if cpus.len() >= want {
            break;
        }
        let local = core.numa.is_some_and(|i| na.mems.contains(topo.numa_nodes[i].os_index));
        let free = core.pus.iter().all(|&p| node.free_pus.contains(p) && !node.system_pus.contains(p));
        if local && free {
            for &pu in core.pus.iter().take(want - cpus.len()) {
                cpus.insert(pu);
            }
            binding.push(topo.socket_core(index));
        }
    }
    if cpus.len() < want {
        return None;
    }
    // Old PU at position k becomes new PU at position k: ranks keep their shares.
    let old: Vec<u32> = na.cpus.iter().collect();
    let new: Vec<u32> = cpus.iter().collect();
    let map = |set: &crate::CpuSet| {
        crate::CpuSet::from_iter_u32(set.iter().filter_map(|p| old.iter().position(|&o| o == p).map(|k| new[k])))
    };
    let ranks = na.ranks.iter().map(|r| crate::job::RankSet { cpus: map(&r.cpus), mems: r.mems.clone() }).collect();
    let binding = if na.binding.is_empty() { vec![] } else { binding };
    Some(NodeAllocation { cpus, ranks, binding, ..na.clone() })
}

#[cfg(test)]
mod tests;
