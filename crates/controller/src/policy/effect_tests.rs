//! The scheduling pass's effects decided without a store: usage charges, starts and
//! preemptions carried out on plain values (no SQLite, no controller).

use super::effects::preempted;
use super::*;
use crate::lifecycle::started;
use crate::model::effect::Effect;
use crate::testkit::{ann, running_job, topo};
use berth_core::node::NodeCapacity;
use berth_core::placement::reason::Busy;
use berth_core::placement::PlacementPolicy;
use berth_core::sched::backfill::Waiting;
use berth_core::sched::reason::Wanting;
use berth_core::sched::round::PreemptStart;
use berth_core::sched::{ClusterState, PendingReason};
use berth_core::JobId;
use std::sync::Arc;

#[test]
fn a_start_claims_its_allocation_then_writes_the_row_then_the_event_on_its_first_node() {
    let nodes = (0..2).map(|i| NodeCapacity::new(NodeId(i), format!("n{i}"), Arc::new(topo()))).collect();
    let mut c = ClusterState::new(nodes, PlacementPolicy::default());
    let mut job = running_job(5, &ann(), &[(1, "0-3"), (0, "4-7")]);
    let alloc = std::mem::take(&mut job.allocation);
    job.state = JobState::Queued;
    job.start_time = None;
    job.reason = Some("waiting for resources".into());
    let effects = started(&mut job, &mut c, alloc.clone(), 1300.0);
    assert_eq!((job.state, job.start_time, job.reason.as_deref()), (JobState::Running, Some(1300.0), None));
    assert_eq!(job.allocation, alloc);
    assert_eq!((c.nodes()[0].free_pus.to_list(), c.nodes()[1].free_pus.to_list()), ("0-3".into(), "4-7".into()));
    assert_eq!(
        effects,
        vec![Effect::UpdateJob(Box::new(job.clone())), Effect::job_event("start", JobId(5), Some("n1"), "")]
    );
}

#[test]
fn a_preemption_is_logged_with_its_victims_before_its_start() {
    let p = PreemptStart {
        id: JobId(12),
        victims: vec![JobId(3), JobId(7)],
        alloc: vec![],
        waited: Waiting {
            id: JobId(12),
            reason: PendingReason::Resources(Wanting::Busy(Busy::Counted { need: 8, free: 0 })),
            expected_start: None,
        },
    };
    assert_eq!(preempted(&p), Effect::job_event("preempt", JobId(12), None, "suspended jobs 3,7"));
}
