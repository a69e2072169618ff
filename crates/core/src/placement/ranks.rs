//! Per-rank sub-cpusets: a job's CPUs on a node divided evenly among its ranks (seeds/000:
//! "creates a fine-grained sub-cpuset for each MPI process and evenly divides the cpus and
//! mems amongst them"), so each rank's memory stays local even next to suspended jobs.

use crate::job::{NodeAllocation, RankSet};
use crate::topology::Topology;
use crate::CpuSet;

/// Split `alloc` into `ranks` sub-cpusets: whole cores in topology order, contiguous, sizes
/// differing by at most one; each rank's memory nodes are those local to its CPUs (within the
/// job's), or all the job's when none is. More ranks than CPUs share CPUs round-robin.
pub fn split(topo: &Topology, alloc: &NodeAllocation, ranks: u32) -> Vec<RankSet> {
    let ranks = ranks as usize;
    if ranks == 0 {
        return vec![];
    }
    // Units: the job's PUs grouped by core, so a rank never splits a core unless it must.
    let mut units: Vec<Vec<u32>> = topo
        .cores
        .iter()
        .map(|c| c.pus.iter().copied().filter(|&p| alloc.cpus.contains(p)).collect::<Vec<u32>>())
        .filter(|pus| !pus.is_empty())
        .collect();
    if units.len() < ranks {
        units = units.into_iter().flatten().map(|p| vec![p]).collect();
    }
    if units.is_empty() {
        return vec![];
    }
    let n = units.len();
    (0..ranks)
        .map(|r| {
            let cpus: CpuSet = if n >= ranks {
                let (base, extra) = (n / ranks, n % ranks);
                let start = r * base + r.min(extra);
                let len = base + usize::from(r < extra);
                units[start..start + len].iter().flatten().copied().collect()
            } else {
                units[r % n].iter().copied().collect()
            };
            let mut mems: CpuSet = topo.mems_for(&cpus).iter().filter(|&m| alloc.mems.contains(m)).collect();
            if mems.is_empty() {
                mems = alloc.mems.clone();
            }
            RankSet { cpus, mems }
        })
        .collect()
}

/// An Open MPI style rankfile for a bound job (`--binding-mode pe`): one rank per bound core,
/// nodes in allocation order, `rank N=HOST slot=SOCKET:CORE`.
pub fn rankfile(alloc: &[NodeAllocation]) -> String {
    let mut out = String::new();
    let mut rank = 0;
    for na in alloc {
        for (socket, core) in &na.binding {
            out.push_str(&format!("rank {rank}={} slot={socket}:{core}\n", na.node));
            rank += 1;
        }
    }
    out
}
