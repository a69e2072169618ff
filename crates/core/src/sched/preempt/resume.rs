//! How one suspended job resumes part by part: the controller's rule, used by its scheduling
//! round ([`round_keeping`](crate::sched::round::round_keeping)) and by `berth resume` alike.
//! (The trace simulator resumes whole jobs: [`resume_candidates`](super::resume_candidates).)
//!
//! Each part (one node of the allocation) resumes on its own PUs where they are free, else on
//! as many free cores of the same node ([`NodeCapacity::relocation_for`]: same PUs first, then
//! the NUMA nodes its memory is on; its memory follows its CPUs). A part on a node that is not
//! connected cannot be thawed; a job whose steps hold PUs by index resumes only in place.

use crate::job::{Allocation, NodeAllocation};
use crate::node::{NodeCapacity, RelocateError};
use crate::placement::cluster::node_by_id;
use crate::sched::backfill::AdvanceReservation;
use crate::sched::ClusterState;
use crate::NodeId;
use std::borrow::Cow;

// Why a job does not resume is a reason (`sched::reason`), said to users.
pub use crate::sched::reason::ResumeWait;

/// What a part-by-part resume needs of a suspended job beside its allocation.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PartsJob {
    /// Its request counts PUs rather than whole cores.
    pub threads: bool,
    /// It asked for system CPUs: it may move onto them.
    pub system_cpus: bool,
    /// Its steps hold PUs by index in the allocation: it resumes only on its own PUs.
    pub steps_hold: bool,
}

/// Where each part of suspended `alloc` resumes now on `cluster` (None: on its own PUs), or
/// why it cannot (said to users as the job's reason, e.g. "waiting for 4 cores on n2 to
/// resume (1 free)"). `connected`: whether a node's agent can be told to thaw it.
pub fn resume_parts(
    cluster: &ClusterState,
    alloc: &Allocation,
    job: PartsJob,
    connected: &dyn Fn(NodeId) -> bool,
) -> Result<Vec<Option<NodeAllocation>>, ResumeWait> {
    let mut plan = Vec::with_capacity(alloc.len());
    for na in alloc {
        if !connected(na.node_id) {
            return Err(ResumeWait::NotConnected(na.node.clone()));
        }
        let Some(cap) = node_by_id(cluster.nodes(), na.node_id) else {
            return Err(ResumeWait::UnknownNode(na.node.clone()));
        };
        plan.push(part(cap, na, job)?);
    }
    Ok(plan)
}

fn part(cap: &NodeCapacity, na: &NodeAllocation, job: PartsJob) -> Result<Option<NodeAllocation>, ResumeWait> {
    if cap.pus_free_for(na) {
        return Ok(None);
    }
    if job.steps_hold {
        return Err(ResumeWait::StepsHold { cpus: na.cpus.clone(), node: na.node.clone() });
    }
    match cap.relocation_for(na, job.threads, job.system_cpus) {
        Ok(to) => Ok(Some(to)),
        Err(RelocateError::Short { need, free, unit }) => {
            Err(ResumeWait::Short { need, unit, node: na.node.clone(), free })
        }
        Err(RelocateError::Pinned(why)) => {
            Err(ResumeWait::Pinned { cpus: na.cpus.clone(), node: na.node.clone(), why })
        }
    }
}

/// Carry out `plan` (from [`resume_parts`]) on `cluster`: a moved part's memory moves with it
/// (released where it was, claimed where it goes), and every part's PUs are claimed. Returns
/// the job's allocation once resumed.
pub fn resumed_on(cluster: &mut ClusterState, alloc: &Allocation, plan: &[Option<NodeAllocation>]) -> Allocation {
    let mut out = alloc.clone();
    for (k, to) in plan.iter().enumerate() {
        let (Some(to), Some(from)) = (to, alloc.get(k)) else { continue };
        if let Some(mut n) = cluster.node_mut(from.node_id) {
            n.release_memory(from);
            n.claim_memory(to);
        }
        out[k] = to.clone();
    }
    for na in &out {
        if let Some(mut n) = cluster.node_mut(na.node_id) {
            n.claim_pus(na);
        }
    }
    out
}

/// The machine for a job that is not a member of the advance reservations `windows`, starting
/// (or resuming) at `now` for `w` seconds: with every window it would run into claimed (those
/// not over that open before `now + w`); and whether there was any.
pub fn beside_windows<'c>(
    cluster: &'c ClusterState,
    windows: &[AdvanceReservation<Allocation>],
    now: f64,
    w: f64,
) -> (Cow<'c, ClusterState>, bool) {
    let mut view = Cow::Borrowed(cluster);
    let mut any = false;
    for r in windows.iter().filter(|r| runs_into(r, now, w)) {
        view.to_mut().claim(&r.alloc);
        any = true;
    }
    (view, any)
}

/// The PUs (and exclusive NUMA nodes) of the windows [`beside_windows`] claims for a job
/// starting at `now` for `w` seconds: what stays claimed when a running job on them is
/// suspended to make room ([`plan_preemption_beside`](super::plan_preemption_beside)).
pub fn windows_held(windows: &[AdvanceReservation<Allocation>], now: f64, w: f64) -> Allocation {
    windows.iter().filter(|r| runs_into(r, now, w)).flat_map(|r| super::cpus_only(&r.alloc)).collect()
}

/// Whether a job starting at `now` for `w` seconds runs into window `r` (not over, opening
/// before `now + w`).
fn runs_into(r: &AdvanceReservation<Allocation>, now: f64, w: f64) -> bool {
    r.end > now && (r.start < now + w || r.start <= now)
}
