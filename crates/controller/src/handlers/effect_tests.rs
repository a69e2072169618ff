//! A refused action decided without a store: the event `denied` is a plain value.

use super::*;
use crate::testkit::{ann, bob};

fn denied_event(job: Option<JobId>, detail: &str) -> Effect {
    Effect::Event { kind: "denied".into(), job, node: None, detail: detail.into() }
}

#[test]
fn a_refusal_names_the_user_the_action_the_job_and_its_owner_when_known() {
    assert_eq!(
        denial(&bob(), "cancel", Some(JobId(7)), "ann"),
        denied_event(Some(JobId(7)), "user bob may not cancel job 7 of user ann")
    );
    // A job whose owner is not known (it is not in memory): no owner named.
    assert_eq!(
        denial(&ann(), "suspend", Some(JobId(9)), ""),
        denied_event(Some(JobId(9)), "user ann may not suspend job 9")
    );
    // No job: a node's settings.
    assert_eq!(
        denial(&ann(), "change nodes of node n0", None, ""),
        denied_event(None, "user ann may not change nodes of node n0")
    );
}

#[test]
fn a_pending_job_cancelled_ends_now_with_its_reason_then_the_event_follows_its_row() {
    let mut job = crate::testkit::running_job(7, &ann(), &[]);
    job.state = JobState::Queued;
    let effects = cancelled_pending(&mut job, "cancelled before it started", "", 1500.0);
    assert_eq!(job.state, JobState::Cancelled);
    assert_eq!(job.end_time, Some(1500.0));
    assert_eq!(job.reason.as_deref(), Some("cancelled before it started"));
    assert_eq!(
        effects,
        vec![Effect::UpdateJob(Box::new(job.clone())), Effect::job_event("cancel", JobId(7), None, "")]
    );
    // A dependency never met: the reason is the event's detail too.
    let mut other = crate::testkit::running_job(8, &ann(), &[]);
    other.state = JobState::Queued;
    let effects = cancelled_pending(&mut other, "dependency afterok:7 failed", "dependency afterok:7 failed", 1600.0);
    assert_eq!(effects[1], Effect::job_event("cancel", JobId(8), None, "dependency afterok:7 failed"));
}

#[test]
fn the_live_connection_of_a_node_closing_leaves_it_without_agent_and_is_logged_an_old_one_is_not() {
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let now = std::time::Instant::now();
    let mut ex = NodeExtra::new(NodeState::Up, String::new(), String::new(), "i1".into(), now);
    ex.connect(5, tx, now);
    // A connection replaced already: nothing changes.
    assert!(disconnected(&mut ex, "n0", 4).is_empty());
    assert!(ex.connected());
    assert_eq!(disconnected(&mut ex, "n0", 5), vec![Effect::node_event("node_disconnect", "n0", "")]);
    assert!(!ex.connected());
    // Once gone, a second close of it changes nothing.
    assert!(disconnected(&mut ex, "n0", 5).is_empty());
}

fn queued(id: u64) -> JobRecord {
    let mut job = crate::testkit::running_job(id, &ann(), &[]);
    (job.state, job.start_time) = (JobState::Queued, None);
    job
}

#[test]
fn a_job_submitted_gets_its_id_and_paths_then_its_row_then_the_event_naming_its_user() {
    let mut job = queued(0);
    job.stdout = "out/%j.out".into();
    job.stderr = "err/%j-%N.err".into();
    let effects = submitted(&mut job, JobId(42));
    assert_eq!(job.id, JobId(42));
    assert_eq!(job.stdout, "out/42.out");
    // A path naming nodes waits for the start, whole.
    assert_eq!(job.stderr, "err/%j-%N.err");
    assert_eq!(
        effects,
        vec![Effect::InsertJob(Box::new(job.clone())), Effect::job_event("submit", JobId(42), None, "ann")]
    );
}

#[test]
fn a_first_task_accepted_gives_the_array_its_id() {
    let task =
        berth_core::directives::array::ArrayTask { job: 0, index: 3, count: 2, min: 3, max: 4, step: 1, limit: None };
    let mut first = queued(0);
    first.options.array_task = Some(task);
    assert_eq!(crate::array::accepted(&mut first, JobId(10)), Effect::InsertJob(Box::new(first.clone())));
    assert_eq!(first.options.array_task.map(|t| t.job), Some(10));
    assert_eq!(first.id, JobId(10));
}

fn outcome(reason: Option<&str>, user_cpu_us: u64, peak: u64) -> JobOutcome {
    JobOutcome {
        exit_code: Some(0),
        signal: None,
        reason: reason.map(str::to_string),
        wall_ms: 5000,
        user_cpu_us,
        system_cpu_us: 7,
        peak_memory_bytes: peak,
    }
}

#[test]
fn a_job_ended_on_its_first_node_adds_its_other_nodes_usage_then_row_accounting_and_event_follow() {
    let mut job = crate::testkit::running_job(7, &ann(), &[(0, "0"), (1, "0")]);
    let members = Usage { wall_ms: 0, user_cpu_us: 100, system_cpu_us: 20, peak_memory_bytes: 4096 };
    let effects = job_ended(&mut job, &outcome(None, 50, 1024), &members, "n0", 2000.0);
    assert_eq!(job.state, JobState::Completed);
    assert_eq!(job.end_time, Some(2000.0));
    assert_eq!(job.usage, Some(Usage { wall_ms: 5000, user_cpu_us: 150, system_cpu_us: 27, peak_memory_bytes: 4096 }));
    assert_eq!(
        effects,
        vec![
            Effect::UpdateJob(Box::new(job.clone())),
            Effect::InsertAccounting(Box::new(job.clone())),
            Effect::job_event("end", JobId(7), Some("n0"), "completed"),
        ]
    );
    // The walltime: the state says so, and the event too.
    let mut late = crate::testkit::running_job(8, &ann(), &[(0, "0")]);
    let effects = job_ended(&mut late, &outcome(Some("walltime"), 1, 1), &Usage::default(), "n0", 2100.0);
    assert_eq!(effects[2], Effect::job_event("end", JobId(8), Some("n0"), JobState::Timeout.as_str()));
}

#[test]
fn a_part_ended_on_another_node_records_its_usage_and_only_an_early_end_is_an_event() {
    let usage = Usage { wall_ms: 0, user_cpu_us: 50, system_cpu_us: 7, peak_memory_bytes: 1024 };
    let mut job = crate::testkit::running_job(7, &ann(), &[(0, "0"), (1, "0")]);
    // While the job runs and no kill was sent: usage, then the event with the agent's reason.
    assert_eq!(
        part_ended(JobId(7), Some(&job), "n1", &outcome(Some("oom"), 50, 1024)),
        vec![
            Effect::AddMemberUsage { job: JobId(7), node: "n1".into(), usage, to_accounting: false },
            Effect::job_event("member_ended", JobId(7), Some("n1"), "oom"),
        ]
    );
    // After the kill that follows the job's end: its usage only.
    job.kill_sent = Some("job ended".into());
    assert_eq!(
        part_ended(JobId(7), Some(&job), "n1", &outcome(None, 50, 1024)),
        vec![Effect::AddMemberUsage { job: JobId(7), node: "n1".into(), usage, to_accounting: false }]
    );
    // The job's end was recorded already: the usage goes to its accounting row too.
    assert_eq!(
        part_ended(JobId(7), None, "n1", &outcome(None, 50, 1024)),
        vec![Effect::AddMemberUsage { job: JobId(7), node: "n1".into(), usage, to_accounting: true }]
    );
}

#[test]
fn a_started_batch_job_cancelled_is_marked_logged_then_killed_on_every_node_an_allocation_only_logged() {
    let mut job = crate::testkit::running_job(7, &ann(), &[(0, "0"), (2, "1")]);
    let kill = |node| Effect::Send { node, msg: ControllerMessage::Kill { id: JobId(7), reason: "cancelled".into() } };
    assert_eq!(
        cancelled_started(&mut job),
        vec![Effect::job_event("cancel", JobId(7), None, "running: kill sent"), kill(0), kill(2)]
    );
    assert_eq!(job.kill_sent.as_deref(), Some("cancelled"));
    let mut held = crate::testkit::running_job(8, &ann(), &[(0, "0")]);
    held.queue = crate::model::job::INTERACTIVE_QUEUE.into();
    assert_eq!(cancelled_started(&mut held), vec![Effect::job_event("cancel", JobId(8), None, "interactive")]);
    assert_eq!(held.kill_sent, None);
}

#[test]
fn a_pending_job_held_or_released_is_written_then_logged() {
    let mut job = queued(7);
    let effects = moved_pending(&mut job, JobState::Held, "hold");
    assert_eq!(job.state, JobState::Held);
    assert_eq!(effects, vec![Effect::UpdateJob(Box::new(job.clone())), Effect::job_event("hold", JobId(7), None, "")]);
}

#[test]
fn a_registration_writes_the_node_then_says_whether_its_agent_restarted_and_an_admin_down_holds() {
    assert_eq!(
        registered(3, "n3", "10.0.0.3:7000", true),
        vec![Effect::UpsertNode { node: 3 }, Effect::node_event("node_register", "n3", "10.0.0.3:7000")]
    );
    assert_eq!(registered(3, "n3", "a", false)[1], Effect::node_event("node_reconnect", "n3", "a"));
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let now = std::time::Instant::now();
    let mut ex = NodeExtra::new(NodeState::Cleaning, String::new(), String::new(), "i1".into(), now);
    ex.connect(5, tx, now);
    assert_eq!(
        held_down(&mut ex, 3, "n3", "disk swap"),
        vec![Effect::UpsertNode { node: 3 }, Effect::node_event("node_held_down", "n3", "admin: disk swap")]
    );
    assert_eq!(ex.state, NodeState::Down);
}

#[test]
fn refusals_of_agents_and_of_connections_are_events_an_agents_detail_bounded() {
    let long = "x".repeat(5000);
    let Effect::Event { kind, job, node, detail } = agent_refused("step_refused", Some(JobId(4)), "n1", &long) else {
        panic!("an event")
    };
    assert_eq!((kind.as_str(), job, node.as_deref(), detail.len()), ("step_refused", Some(JobId(4)), Some("n1"), 2000));
    assert_eq!(
        auth_refused(Some("n9".into()), "bad MAC".into()),
        Effect::Event { kind: "auth_refused".into(), job: None, node: Some("n9".into()), detail: "bad MAC".into() }
    );
}
