//! Array tails left out of the round (`gather`'s `TailRun`): every decision and everything
//! users see is what a round over every task gives.

use crate::testkit::*;
use berth_core::directives::{ArraySpec, SubmitOptions};
use berth_core::job::{JobOutcome, JobState};
use berth_core::sched::backfill::BackfillPolicy;
use berth_core::JobId;
use berth_protocol::agent::AgentMessage;
use berth_protocol::client::{ClientRequest, ClientResponse};

fn opts(cores: u32, walltime: u64, array: Option<&str>) -> SubmitOptions {
    SubmitOptions {
        cores: Some(cores),
        walltime: Some(walltime),
        mem: Some(1 << 20),
        array: array.map(|a| ArraySpec::parse_slurm(a).unwrap()),
        ..Default::default()
    }
}

/// A job as `berth show` has it: id, state, reason, priority, expected start.
type Seen = (JobId, JobState, Option<String>, Option<String>, Option<f64>);

/// Every job in memory, as `berth show` has it.
fn seen(h: &mut Harness) -> Vec<Seen> {
    let ids: Vec<JobId> = h.ctl.jobs.keys().copied().collect();
    ids.into_iter()
        .map(|id| {
            let ClientResponse::Job { job } = h.call(ClientRequest::ShowJob { id }, &ann()) else {
                panic!("no job {id}")
            };
            (id, job.state, job.reason, job.priority.map(|p| format!("{p:?}")), job.expected_start)
        })
        .collect()
}

fn end_first_running(h: &mut Harness) {
    let Some((&id, job)) = h.ctl.jobs.iter().find(|(_, j)| j.state == JobState::Running) else { return };
    let node = job.allocation[0].node_id.0 as usize;
    h.agent(node, AgentMessage::JobEnded { id, outcome: JobOutcome { exit_code: Some(0), ..Default::default() } });
}

/// The same jobs on two controllers, one leaving array tails out of its rounds, one not:
/// after every pass each job is in the same state and shows the same reason, priority and
/// expected start; the first did leave tasks out.
fn same_as_whole(policy: BackfillPolicy) {
    let config = |c: &mut crate::config::ControllerConfig| {
        c.scheduler.policy = policy;
        c.scheduler.max_reservations = 3;
        c.scheduler.reservation_budget_ms = 0;
    };
    let mut hs = [Harness::with_config(2, config), Harness::with_config(2, config)];
    hs[1].ctl.policy.send_whole_arrays();
    let mut left_out = 0;
    let mut arrays = vec![];
    for h in hs.iter_mut() {
        h.batch(opts(8, 1000, None), &ann());
        h.submit_as(opts(12, 100, None), false, &ann());
        let a = h.submit_as(opts(1, 600, Some("0-79")), false, &ann());
        let b = h.submit_as(opts(1, 600, Some("0-39")), true, &ann());
        h.submit_as(opts(1, 50, None), false, &ann());
        h.submit_as(opts(2, 30, Some("0-49")), false, &ann());
        h.submit_as(opts(1, 5, None), false, &ann());
        arrays.push((a, b));
    }
    assert_eq!(arrays[0], arrays[1]);
    let (a, b) = arrays[0];
    for round in 0..60 {
        let mut views = vec![];
        for h in hs.iter_mut() {
            h.ctl.schedule(h.now).unwrap();
            views.push(seen(h));
        }
        assert_eq!(views[0], views[1], "{policy:?}, round {round}");
        assert!(hs[1].ctl.policy.tails().is_empty());
        left_out += hs[0].ctl.policy.tails().iter().map(|t| t.count).sum::<usize>();
        assert_eq!(hs[0].ctl.policy.last_pass().pending, hs[1].ctl.policy.last_pass().pending, "{policy:?}");
        let tail_task = JobId(a.0 + 67);
        for h in hs.iter_mut() {
            match round {
                // A task in the first array's tail cancelled, the held array released.
                10 => {
                    let ClientResponse::Done { .. } =
                        h.call(ClientRequest::Cancel { ids: vec![tail_task], only: vec![tail_task] }, &ann())
                    else {
                        panic!("not cancelled")
                    };
                }
                20 => {
                    h.call(ClientRequest::Release { ids: vec![b], only: vec![] }, &ann());
                }
                _ => {}
            }
            h.advance(7.0);
            end_first_running(h);
            end_first_running(h);
        }
    }
    assert!(left_out > 0, "{policy:?}: no task left out of a round");
}

#[test]
fn tails_left_out_change_nothing_under_easy_backfill() {
    same_as_whole(BackfillPolicy::Easy);
}

#[test]
fn tails_left_out_change_nothing_under_conservative_backfill() {
    same_as_whole(BackfillPolicy::Conservative);
}

#[test]
fn tails_left_out_change_nothing_under_fcfs() {
    same_as_whole(BackfillPolicy::Fcfs);
}
