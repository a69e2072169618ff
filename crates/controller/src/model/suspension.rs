//! A job's suspensions as persisted, and what a suspended job holds of the machine (its
//! memory, not its PUs). The mechanism (suspending, resuming, moving) is `crate::suspend`'s.

use berth_core::job::Allocation;
use berth_core::sched::reason::SuspendedReason;
use berth_core::sched::ClusterState;

/// A job's suspensions, as persisted (and what is in flight, in memory only).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Suspension {
    /// Seconds spent in suspensions that ended.
    pub total_secs: f64,
    /// When the current suspension began; None when the job is not suspended.
    pub since: Option<f64>,
    /// The current suspension is an admin's: only `berth resume` ends it.
    pub by_admin: bool,
    /// How many times the job was suspended.
    pub count: u32,
    /// A resume was sent and not every node has answered (not persisted).
    pub resuming: Option<Resuming>,
    /// Nodes (indexes) whose cgroup may not hold the job's part as recorded (a move that
    /// failed elsewhere): the next resume sends them their part (not persisted).
    pub unsynced: Vec<usize>,
    /// Why the suspended job is not running (`crate::suspend::give_reason` sets it with its
    /// words, the job's `reason`, which its row keeps): not persisted, read back from those
    /// words when the job is loaded.
    pub reason: Option<SuspendedReason>,
}

/// A resume in flight, to undo it if a node fails to carry it out.
#[derive(Debug, Clone, PartialEq)]
pub struct Resuming {
    /// The suspension it ended, and when.
    pub since: f64,
    pub at: f64,
    pub by_admin: bool,
    /// Nodes (indexes) whose part was moved, or had to be sent again.
    pub moved: Vec<usize>,
    /// Nodes (indexes) that have not answered yet.
    pub waiting: Vec<usize>,
}

impl Suspension {
    /// Seconds suspended in all up to `now` (the current suspension included).
    pub fn seconds(&self, now: f64) -> f64 {
        self.total_secs + self.since.map(|s| (now - s).max(0.0)).unwrap_or(0.0)
    }

    /// The job was ever suspended.
    pub fn ever(&self) -> bool {
        self.count > 0 || self.since.is_some() || self.total_secs > 0.0
    }

    /// End the current suspension at `now` (adding it to the total); whether there was one.
    pub fn close(&mut self, now: f64) -> bool {
        match self.since.take() {
            Some(s) => {
                self.total_secs += (now - s).max(0.0);
                true
            }
            None => false,
        }
    }
}

/// Claim the memory, generic resources and licenses of a suspended job's allocation (not its
/// PUs).
pub fn claim_memory(cluster: &mut ClusterState, alloc: &Allocation) {
    // Its licenses stay held too, as its memory and generic resources.
    cluster.claim_licenses(alloc);
    for na in alloc {
        if let Some(mut n) = cluster.node_mut(na.node_id) {
            n.claim_memory(na);
        }
    }
}

/// Give back what a job holds: all of it, or only the memory when it is suspended (its PUs
/// were given back when it was suspended).
pub fn release(cluster: &mut ClusterState, alloc: &Allocation, suspended: bool) {
    if !suspended {
        cluster.release(alloc);
        return;
    }
    cluster.release_licenses(alloc);
    for na in alloc {
        if let Some(mut n) = cluster.node_mut(na.node_id) {
            n.release_memory(na);
        }
    }
}
