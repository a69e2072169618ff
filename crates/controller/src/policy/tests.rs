use crate::testkit::*;
use berth_core::directives::SubmitOptions;
use berth_core::job::JobState;
use berth_core::sched::PendingReason;
use berth_core::JobId;
use berth_protocol::client::{ClientRequest, ClientResponse, SubmitRequest};

fn opts(cores: u32, walltime: u64, account: &str) -> SubmitOptions {
    SubmitOptions {
        cores: Some(cores),
        walltime: Some(walltime),
        mem: Some(1 << 20),
        account: Some(account.into()),
        ..Default::default()
    }
}

fn submit(h: &mut Harness, options: SubmitOptions) -> JobId {
    let sub = SubmitRequest {
        script: "#!/bin/sh\ntrue\n".into(),
        script_name: "job.sh".into(),
        options,
        env: vec![],
        cwd: "/tmp".into(),
        hold: false,
        ignore_unsupported: false,
    };
    let ClientResponse::Submitted { id } = h.call(ClientRequest::Submit(Box::new(sub)), &ann()) else {
        panic!("not submitted")
    };
    id
}

fn state(h: &Harness, id: JobId) -> JobState {
    h.ctl.jobs[&id].state
}

/// Two nodes of 8 cores. A running 8-core job ends in 1000 s; a 16-core job waits for it with
/// a reservation at +1000 s; a 4-core job that ends before then starts now (backfill), one that
/// would run past it waits.
#[test]
fn easy_backfill_starts_short_jobs_around_the_head_reservation() {
    let mut h = Harness::new(2);
    let running = h.batch(opts(8, 1000, "phys"), &ann());
    let big = submit(&mut h, opts(16, 100, "phys"));
    let short = submit(&mut h, opts(4, 500, "phys"));
    let long = submit(&mut h, opts(4, 5000, "phys"));
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(state(&h, running), JobState::Running);
    assert_eq!(state(&h, big), JobState::Queued);
    assert_eq!(state(&h, short), JobState::Running, "backfilled");
    assert_eq!(state(&h, long), JobState::Queued, "would delay the 16-core job");
    assert_eq!(h.ctl.policy.expected_start(big).as_ref(), Some(&(h.now + 1000.0)));
    assert!(
        matches!(h.ctl.policy.pass_reason(big).unwrap(), PendingReason::Resources(_)),
        "{:?}",
        h.ctl.policy.pass_reason(big).unwrap()
    );
    assert_eq!(h.ctl.policy.last_pass().backfilled, 1);
    // What users see: the head's expected start and every pending job's priority.
    let ClientResponse::Job { job } = h.call(ClientRequest::ShowJob { id: big }, &ann()) else { panic!() };
    assert_eq!(job.expected_start, Some(h.now + 1000.0));
    assert!(job.priority.as_ref().is_some_and(|p| p.total > 0.0), "{:?}", job.priority);
    assert_eq!(job.account, "phys");
    // Its reason: the words, and their code (Slurm's REASON), from the same typed reason.
    assert_eq!(job.reason_code.as_deref(), Some("Resources"));
    assert!(job.reason.as_deref().is_some_and(|r| r.starts_with("resources: ")), "{:?}", job.reason);
}

/// The account that used the machine waits behind the one that did not; usage survives a
/// controller restart and is shown by `berth share`.
#[test]
fn fair_share_orders_accounts_by_decayed_usage_and_survives_restart() {
    let mut h = Harness::new(1);
    let heavy = h.batch(opts(8, 7200, "heavy"), &ann());
    h.now += 3600.0;
    h.ctl.charge_usage(h.now);
    h.ctl.carry_out_effects(h.now).unwrap();
    // Two jobs wait for the node: "heavy" submitted first, "light" second.
    let from_heavy = submit(&mut h, opts(8, 100, "heavy"));
    h.now += 1.0;
    let from_light = submit(&mut h, opts(8, 100, "light"));
    h.ctl.schedule(h.now).unwrap();
    let (light, heavy_p) = (h.ctl.policy.priority(from_light).unwrap(), h.ctl.policy.priority(from_heavy).unwrap());
    assert!(light.total > heavy_p.total, "{light:?} vs {heavy_p:?}");
    // All usage is heavy's and (no shares configured) it is the only account known: factor
    // 2^(-1) = 0.5; light has used nothing: 1.
    assert!((heavy_p.fair_share - 0.5).abs() < 1e-6, "{heavy_p:?}");
    assert_eq!(light.fair_share, 1.0);
    let ClientResponse::Share { accounts, .. } = h.call(ClientRequest::Share, &ann()) else { panic!() };
    let used = accounts.iter().find(|a| a.account == "heavy").expect("heavy is listed");
    // 8 cores for an hour (decay over one hour of a 7-day half-life is under 0.5%).
    assert!((used.usage - 8.0 * 3600.0).abs() < 8.0 * 3600.0 * 0.005, "{used:?}");
    // The running job ends: the light account's job starts first.
    let alloc = h.ctl.jobs[&heavy].allocation.clone();
    h.ctl.cluster.release(&alloc);
    h.ctl.jobs.remove(&heavy);
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(state(&h, from_light), JobState::Running);
    assert_eq!(state(&h, from_heavy), JobState::Queued);
    let before = h.ctl.policy.fair_share().usage["heavy"];
    let h = h.restart();
    let after = h.ctl.policy.fair_share().usage.get("heavy").copied().unwrap_or(0.0);
    assert!((after - before).abs() < 1.0, "usage after restart {after}, before {before}");
}

/// GPU-seconds are billed (Slurm's TRES billing): unset, a GPU costs the PUs per GPU of the GPU
/// nodes (here 8 PUs / 2 GPUs = 4); `[fair_share] gpu_weight` overrides it, 0 bills none.
#[test]
fn fair_share_bills_gpu_seconds() {
    let mut t = berth_core::topology::Topology::uniform(1, 2, 4, 1, 1 << 30);
    t.add_emulated_gpus(1).expect("emulated GPUs");
    let used = |weight: Option<f64>| {
        let mut h = Harness::with_topology(1, t.clone());
        h.ctl.policy.fair_share_mut().config.gpu_weight = weight;
        let gpu = h.batch(SubmitOptions { gpus: Some(2), ..opts(2, 7200, "gpu") }, &ann());
        let cpu = h.batch(opts(2, 7200, "cpu"), &ann());
        assert_eq!((state(&h, gpu), state(&h, cpu)), (JobState::Running, JobState::Running));
        h.ctl.charge_usage(h.now);
        h.ctl.carry_out_effects(h.now).unwrap();
        h.now += 100.0;
        h.ctl.charge_usage(h.now);
        h.ctl.carry_out_effects(h.now).unwrap();
        let u = &h.ctl.policy.fair_share().usage;
        (u["gpu"], u["cpu"])
    };
    let near = |a: f64, b: f64| (a - b).abs() < b * 1e-4;
    let (g, c) = used(None);
    assert!(near(c, 2.0 * 100.0), "{c}");
    assert!(near(g, (2.0 + 2.0 * 4.0) * 100.0), "{g}");
    let (g, _) = used(Some(50.0));
    assert!(near(g, (2.0 + 2.0 * 50.0) * 100.0), "{g}");
    let (g, c) = used(Some(0.0));
    assert!(near(g, c), "{g} vs {c}");
}

/// Issue 20: generic resources and licenses are billed by `[fair_share] gres_weights` and
/// `license_weights` (Slurm's `TRESBillingWeights=GRES/nvme=...,License/matlab=...`): the
/// charge and the `billing` of `berth show` and `acct` add each unit held times its weight.
#[test]
fn fair_share_bills_gres_and_licenses_by_their_weights() {
    let mut h = Harness::with_config(1, |c| {
        c.licenses = counts(&[("matlab", 4)]);
        c.gres.insert("n0".into(), counts(&[("nvme", 800)]));
        c.fair_share.gres_weights.insert("nvme".into(), 0.01);
        c.fair_share.license_weights.insert("matlab".into(), 8.0);
    });
    let held = h.batch(
        SubmitOptions {
            gres: Some(counts(&[("nvme", 500)])),
            licenses: Some(counts(&[("matlab", 2)])),
            ..opts(2, 7200, "lic")
        },
        &ann(),
    );
    let plain = h.batch(opts(2, 7200, "cpu"), &ann());
    assert_eq!((state(&h, held), state(&h, plain)), (JobState::Running, JobState::Running));
    h.ctl.charge_usage(h.now);
    h.ctl.carry_out_effects(h.now).unwrap();
    h.now += 100.0;
    h.ctl.charge_usage(h.now);
    h.ctl.carry_out_effects(h.now).unwrap();
    let u = &h.ctl.policy.fair_share().usage;
    let near = |a: f64, b: f64| (a - b).abs() < b * 1e-4;
    // 2 CPUs + 500 x 0.01 + 2 x 8 = 23 a second.
    assert!(near(u["lic"], 23.0 * 100.0), "{}", u["lic"]);
    assert!(near(u["cpu"], 2.0 * 100.0), "{}", u["cpu"]);
    let ClientResponse::Job { job } = h.call(ClientRequest::ShowJob { id: held }, &ann()) else { panic!() };
    assert_eq!(job.billing, Some(23.0));
}

fn queues() -> Vec<berth_core::sched::queue::QueueSpec> {
    use berth_core::sched::queue::QueueSpec;
    vec![
        QueueSpec { name: "batch".into(), max_cores_per_user: Some(8), ..Default::default() },
        QueueSpec {
            name: "short".into(),
            max_walltime_secs: Some(3600),
            default_walltime_secs: Some(600),
            priority: 10,
            ..Default::default()
        },
    ]
}

fn submit_err(h: &mut Harness, options: SubmitOptions) -> berth_protocol::client::ApiError {
    let sub = SubmitRequest {
        script: "#!/bin/sh\ntrue\n".into(),
        script_name: "job.sh".into(),
        options,
        env: vec![],
        cwd: "/tmp".into(),
        hold: false,
        ignore_unsupported: false,
    };
    match h.call(ClientRequest::Submit(Box::new(sub)), &ann()) {
        ClientResponse::Error(e) => e,
        other => panic!("accepted: {other:?}"),
    }
}

/// Queue limits are checked at submission with a message naming a queue that would take the
/// job; defaults fill in; the per-user limit makes jobs wait; the queue's priority counts.
#[test]
fn queues_check_limits_apply_defaults_and_order_jobs() {
    let mut h = Harness::with_config(2, |c| c.queues = queues());
    let e = submit_err(&mut h, SubmitOptions { queue: Some("nope".into()), ..opts(1, 60, "a") });
    assert!(e.message.contains("no queue \"nope\"") && e.message.contains("batch, short"), "{e}");
    let e = submit_err(&mut h, SubmitOptions { queue: Some("short".into()), ..opts(1, 7200, "a") });
    assert_eq!(e.code, berth_protocol::client::ErrorCode::QueueLimit);
    assert!(e.message.contains("at most 01:00:00") && e.message.contains("use queue batch"), "{e}");
    // The queue's default walltime is given to a job that asks for none.
    let short = submit(&mut h, SubmitOptions { queue: Some("short".into()), walltime: None, ..opts(1, 0, "a") });
    assert_eq!(h.ctl.jobs[&short].walltime, Some(600));
    assert_eq!(h.ctl.jobs[&short].queue, "short");
    // Per user, batch allows 8 running cores: the second 6-core job waits with the reason.
    let first = submit(&mut h, opts(6, 100, "a"));
    let second = submit(&mut h, opts(6, 100, "a"));
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(state(&h, first), JobState::Running);
    assert_eq!(state(&h, second), JobState::Queued);
    let reason = h.ctl.policy.pass_reason(second).unwrap().describe();
    assert!(reason.starts_with("queue limit") && reason.contains("8 cores"), "{reason}");
    // The queue's priority factor: short (10) is 1, batch (0) is 0.
    assert_eq!(h.ctl.queue_factor("short"), 1.0);
    assert_eq!(h.ctl.queue_factor("batch"), 0.0);
    let ClientResponse::Queues { queues } = h.call(ClientRequest::Queues, &ann()) else { panic!() };
    let batch = queues.iter().find(|q| q.spec.name == "batch").unwrap();
    assert_eq!((batch.running, batch.queued, batch.running_cores), (1, 1, 6));
}

/// `nodes` nodes, preemption on: a job of more than 4 CPUs may suspend others at once, each
/// for at most `max_suspended_secs`.
fn preempting(nodes: usize, max_suspended_secs: f64) -> Harness {
    Harness::with_config(nodes, |c| {
        c.preempt.enabled = true;
        c.preempt.large_cpus = 4;
        c.preempt.min_score = 1.0;
        c.preempt.min_run_secs_before_suspend = 0.0;
        c.preempt.max_suspended_secs = max_suspended_secs;
    })
}

/// A large job (score by size) suspends the two small jobs filling the node, starts on their
/// cores, and when it ends they resume on their own.
#[test]
fn a_large_job_suspends_small_ones_which_resume_after_it() {
    use berth_protocol::agent::AgentMessage;
    let mut h = preempting(1, 3600.0);
    let small: Vec<JobId> = (0..2).map(|_| h.batch(opts(4, 7200, "a"), &ann())).collect();
    h.now += 60.0;
    let large = submit(&mut h, opts(8, 600, "b"));
    h.sent();
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(state(&h, large), JobState::Running, "{:?}", h.ctl.policy.pass_reason(large));
    for s in &small {
        assert_eq!(state(&h, *s), JobState::Suspended);
    }
    let sent = h.sent();
    let suspends =
        sent.iter().filter(|(_, m)| matches!(m, berth_protocol::agent::ControllerMessage::Suspend { .. })).count();
    assert_eq!(suspends, 2, "{sent:?}");
    // Suspended jobs keep their memory: the node's free memory did not grow back.
    let node = &h.ctl.cluster.nodes()[0];
    let held: u64 = h.ctl.jobs.values().flat_map(|j| j.allocation.iter()).map(|a| a.memory_bytes).sum();
    assert_eq!(node.topology.numa_nodes.iter().map(|n| n.memory_bytes).sum::<u64>() - node.free_memory, held);
    // The large job ends: both resume in the next pass, before anything else.
    h.now += 600.0;
    h.agent(0, AgentMessage::JobEnded { id: large, outcome: Default::default() });
    h.ctl.schedule(h.now).unwrap();
    for s in &small {
        assert_eq!(state(&h, *s), JobState::Running, "job {s} resumed");
        assert!((h.ctl.jobs[s].suspension.seconds(h.now) - 600.0).abs() < 1.0);
    }
}

/// Drained or offline subnodes are temporary, like a drained node: a job only they could hold
/// is taken at submission (not "can never run here"), waits with the reason, and starts once
/// a subnode is back.
#[test]
fn job_for_drained_subnodes_waits_rather_than_being_refused() {
    use berth_protocol::user::UserIdentity;
    let root = crate::model::request::Peer {
        user: UserIdentity { uid: 0, gid: 0, groups: vec![0], name: "root".into() },
        conn: 9,
    };
    let mut h = Harness::with_config(1, |c| c.subnode_numa = 1);
    assert_eq!(h.ctl.cluster.nodes()[0].subnodes.len(), 2);
    for (index, action) in [(0, "drain"), (1, "offline")] {
        let req = ClientRequest::SubnodeAdmin { node: "n0".into(), index, action: action.into(), value: None };
        assert!(matches!(h.call(req, &root), ClientResponse::Nodes { .. }));
    }
    let id = submit(&mut h, opts(1, 100, "phys"));
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(state(&h, id), JobState::Queued);
    let why = h.ctl.policy.pass_reason(id).unwrap().describe();
    assert!(why.contains("drained") && why.contains("offline"), "{why}");
    let req = ClientRequest::SubnodeAdmin { node: "n0".into(), index: 1, action: "resume".into(), value: None };
    assert!(matches!(h.call(req, &root), ClientResponse::Nodes { .. }));
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(state(&h, id), JobState::Running);
}

/// Issue 17 item 11: a queued job's expected start ignored the coming resume of a suspended
/// job. A (8 cores, 1000 s) ran 100 s and was suspended by the scheduler for B (8 cores, 200 s);
/// C (8 cores) starts only once B has ended and A, resumed then, has run its 900 s left.
#[test]
fn expected_start_counts_the_resume_of_suspended_jobs() {
    let mut h = Harness::new(1);
    let a = h.batch(opts(8, 1000, "phys"), &ann());
    h.now += 100.0;
    let by_pass = crate::suspend::SuspendBy::Policy("preempted by job 9".into());
    assert!(h.ctl.suspend_job(a, h.now, by_pass).unwrap().is_ok());
    // B starts on A's cores as a preemptor does (in the pass that suspends A).
    let b = submit(&mut h, opts(8, 200, "phys"));
    let request = h.ctl.jobs[&b].pending().request;
    let berth_core::sched::Placement::Now(alloc) = berth_core::sched::place(&h.ctl.sched_view(), &request) else {
        panic!("B fits A's cores")
    };
    h.ctl.start(b, alloc, h.now);
    h.ctl.carry_out_effects(h.now).unwrap();
    let c = submit(&mut h, opts(8, 50, "phys"));
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(state(&h, a), JobState::Suspended);
    assert_eq!(state(&h, b), JobState::Running);
    assert_eq!(h.ctl.policy.expected_start(c).as_ref(), Some(&(h.now + 200.0 + 900.0)));
}

/// Queue targeting (seed 000): queue `fat` runs on subnodes with property `fat` and keeps the
/// other queues off them; its jobs go nowhere else, the batch queue's nowhere there.
#[test]
fn a_queue_pinned_to_subnodes_runs_there_and_keeps_others_off() {
    use berth_core::sched::queue::QueueSpec;
    use berth_protocol::user::UserIdentity;
    let root = crate::model::request::Peer {
        user: UserIdentity { uid: 0, gid: 0, groups: vec![0], name: "root".into() },
        conn: 9,
    };
    let mut h = Harness::with_config(1, |c| {
        c.subnode_numa = 1;
        c.queues = vec![
            QueueSpec { name: "batch".into(), ..Default::default() },
            QueueSpec {
                name: "fat".into(),
                target_properties: vec!["fat".into()],
                reserved: true,
                ..Default::default()
            },
        ];
    });
    let req = ClientRequest::SubnodeAdmin {
        node: "n0".into(),
        index: 1,
        action: "properties".into(),
        value: Some("fat".into()),
    };
    assert!(matches!(h.call(req, &root), ClientResponse::Nodes { .. }));
    let fat = |cores| SubmitOptions { queue: Some("fat".into()), ..opts(cores, 100, "phys") };
    let f = submit(&mut h, fat(2));
    let b = submit(&mut h, opts(4, 100, "phys"));
    let b2 = submit(&mut h, opts(2, 100, "phys"));
    h.ctl.schedule(h.now).unwrap();
    let cpus = |h: &Harness, id| h.ctl.jobs[&id].allocation[0].cpus.to_list();
    assert_eq!((state(&h, f), cpus(&h, f)), (JobState::Running, "4-5".to_string()), "on the fat subnode");
    assert_eq!((state(&h, b), cpus(&h, b)), (JobState::Running, "0-3".to_string()));
    assert_eq!(state(&h, b2), JobState::Queued, "2 cores are free, but only on the fat subnode");
    let why = h.ctl.policy.pass_reason(b2).unwrap().describe();
    assert!(why.contains("kept for another queue's jobs (fat)"), "{why}");
    // A fat job bigger than its subnode can never run; a batch job asking for fat is refused.
    let e = submit_err(&mut h, fat(6));
    assert_eq!(e.code, berth_protocol::client::ErrorCode::Infeasible, "{e:?}");
    let asks = SubmitOptions { properties: Some(vec!["fat".into()]), ..opts(1, 100, "phys") };
    let e = submit_err(&mut h, asks);
    assert!(e.message.contains("kept for queue fat"), "{e:?}");
}

/// Conservative backfill keeps its reservations from one pass to the next while nothing
/// changes (here: a job submitted behind them), and plans afresh once a job ends early.
#[test]
fn conservative_passes_keep_their_reservations_until_something_changes() {
    let mut h = Harness::new(2);
    h.ctl.cfg.scheduler.policy = berth_core::sched::backfill::BackfillPolicy::Conservative;
    let running = h.batch(opts(16, 1000, "phys"), &ann());
    let first = submit(&mut h, opts(16, 500, "phys"));
    let second = submit(&mut h, opts(8, 500, "phys"));
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(state(&h, running), JobState::Running);
    let expected = |h: &Harness, id| h.ctl.policy.expected_start(id);
    assert_eq!(expected(&h, first), Some(h.now + 1000.0));
    assert_eq!(expected(&h, second), Some(h.now + 1500.0));
    let third = submit(&mut h, opts(8, 100, "phys"));
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(h.ctl.policy.last_pass().kept_reservations, 2, "both reservations kept");
    assert_eq!(expected(&h, first), Some(h.now + 1000.0));
    assert_eq!(expected(&h, second), Some(h.now + 1500.0));
    assert_eq!(expected(&h, third), Some(h.now + 1500.0), "beside the second, on the other node");
    // The running job ends 900 s early: every job is planned again, and the first starts.
    h.now += 100.0;
    h.agent(0, berth_protocol::agent::AgentMessage::JobEnded { id: running, outcome: Default::default() });
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(h.ctl.policy.last_pass().kept_reservations, 0);
    assert_eq!(state(&h, first), JobState::Running);
}

/// A job asking for more GPUs than any node has is refused at submission, saying so; the
/// same request without GPUs is taken.
#[test]
fn a_gpu_job_no_node_can_hold_is_refused_at_submission() {
    let mut h = Harness::new(1);
    let e = submit_err(&mut h, SubmitOptions { gpus_per_node: Some(2), ..opts(1, 100, "phys") });
    assert_eq!(e.code, berth_protocol::client::ErrorCode::Infeasible, "{e:?}");
    assert!(e.message.contains("GPUs: node n0 has 0, 2 wanted"), "{e:?}");
    let e = submit_err(&mut h, SubmitOptions { gpus: Some(3), nodes: Some(2), ..opts(2, 100, "phys") });
    assert!(e.message.contains("spread evenly"), "{e:?}");
    let id = submit(&mut h, opts(1, 100, "phys"));
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(h.ctl.jobs[&id].state, JobState::Running);
    assert!(h.ctl.jobs[&id].allocation[0].gpus.is_empty());
}

/// GPU jobs on a node of 2 GPUs (one per package): each gets a GPU and cores beside it, a
/// third waits with a reason naming GPUs while a job without GPUs still starts.
#[test]
fn gpu_jobs_get_gpus_with_their_cores_and_wait_for_busy_gpus() {
    let mut t = topo();
    t.add_emulated_gpus(1).unwrap();
    let mut h = Harness::with_topology(1, t);
    let gpu_job = || SubmitOptions { gpus: Some(1), ..opts(2, 100, "phys") };
    let (a, b, c) = (submit(&mut h, gpu_job()), submit(&mut h, gpu_job()), submit(&mut h, gpu_job()));
    let plain = submit(&mut h, opts(2, 100, "phys"));
    h.ctl.schedule(h.now).unwrap();
    let topo = h.ctl.cluster.nodes()[0].topology.clone();
    let mut given = vec![];
    for id in [a, b] {
        let part = &h.ctl.jobs[&id].allocation[0];
        assert_eq!((h.ctl.jobs[&id].state, part.gpus.len()), (JobState::Running, 1));
        assert!(part.cpus.is_subset_of(&topo.gpus[part.gpus[0] as usize].cpus), "{part:?}");
        given.push(part.gpus[0]);
    }
    given.sort();
    assert_eq!(given, [0, 1], "each GPU to one job");
    assert_eq!(state(&h, plain), JobState::Running);
    assert!(h.ctl.jobs[&plain].allocation[0].gpus.is_empty());
    assert_eq!(state(&h, c), JobState::Queued);
    let why = h.ctl.policy.pass_reason(c).unwrap().describe();
    assert!(why.contains("GPUs"), "{why}");
    assert_eq!(h.ctl.cluster.nodes()[0].free_gpu_count, 0);
    let info = h.ctl.node_info(0, false);
    assert_eq!((info.gpus_allocated, info.gpus.len()), (2, 2), "`berth nodes`: GPUs used/total");
}

/// Preemption beside an advance reservation starts the preemptor where the round placed it,
/// never in the window: n0 is reserved from +1 h, and jobs 1 and 2 run there until +30 min
/// (they end before it opens); jobs 3 and 4 fill n1 for 2 h. A large job of 2 h suspends 3
/// and 4 and starts on n1: suspending 1 and 2 would give it n0's cores only until the window
/// opens (the round keeps the window claimed under them). The jobs on n0 run on.
#[test]
fn a_preemptor_starts_where_the_round_placed_it_beside_an_advance_reservation() {
    let mut h = preempting(2, 100_000.0);
    let short: Vec<JobId> = (0..2).map(|_| h.batch(opts(4, 1800, "a"), &ann())).collect();
    let long: Vec<JobId> = (0..2).map(|_| h.batch(opts(4, 7200, "a"), &ann())).collect();
    let on = |h: &Harness, id: JobId| h.ctl.jobs[&id].allocation[0].node.clone();
    assert_eq!((on(&h, short[0]), on(&h, short[1]), on(&h, long[0])), ("n0".into(), "n0".into(), "n1".into()));
    let body = berth_protocol::client::AdvanceCreate {
        name: Some("maint".into()),
        start: Some(h.now + 3600.0),
        duration_secs: Some(7200),
        nodes: vec!["n0".into()],
        users: vec!["bob".into()],
        ..Default::default()
    };
    let root = crate::model::request::Peer {
        user: berth_protocol::user::UserIdentity { uid: 0, gid: 0, groups: vec![0], name: "root".into() },
        conn: 3,
    };
    let created = h.call(ClientRequest::AdvanceCreate(Box::new(body)), &root);
    assert!(matches!(created, ClientResponse::Advance { .. }), "{created:?}");
    h.now += 60.0;
    let large = submit(&mut h, opts(16, 7200, "b"));
    let large8 = submit(&mut h, opts(8, 7200, "b"));
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(state(&h, large), JobState::Queued, "16 cores would run into the window");
    assert_eq!(state(&h, large8), JobState::Running, "{:?}", h.ctl.policy.pass_reason(large8));
    assert_eq!(on(&h, large8), "n1");
    for id in &long {
        assert_eq!(state(&h, *id), JobState::Suspended);
    }
    for id in &short {
        assert_eq!(state(&h, *id), JobState::Running, "job {id} is left alone");
    }
}

fn counts(items: &[(&str, u32)]) -> berth_core::gres::Counts {
    items.iter().map(|(n, c)| (n.to_string(), *c)).collect()
}

/// Issue 20: `[licenses] matlab = 4` and `[gres] n1 = { nvme = 800 }`. Two jobs each wanting
/// 3 licenses run one after the other (the second's reason names the license, also after a
/// restart); a gres job lands on n1 only; requests that can never be met are refused at
/// submission; `berth nodes` and the licenses view count what is held.
#[test]
fn licenses_and_gres_are_counted_and_impossible_requests_refused() {
    let mut h = Harness::with_config(2, |c| {
        c.licenses = counts(&[("matlab", 4)]);
        c.gres.insert("n1".into(), counts(&[("nvme", 800)]));
    });
    let lic = |n| SubmitOptions { licenses: Some(counts(&[("matlab", n)])), ..opts(1, 100, "phys") };
    let (a, b) = (submit(&mut h, lic(3)), submit(&mut h, lic(3)));
    let g = submit(&mut h, SubmitOptions { gres: Some(counts(&[("nvme", 500)])), ..opts(1, 100, "phys") });
    h.ctl.schedule(h.now).unwrap();
    assert_eq!((state(&h, a), state(&h, b), state(&h, g)), (JobState::Running, JobState::Queued, JobState::Running));
    let why = h.ctl.policy.pass_reason(b).unwrap().describe();
    assert!(why.contains("license matlab: 3 wanted, 1 of 4 free"), "{why}");
    assert_eq!(h.ctl.jobs[&a].allocation[0].licenses, counts(&[("matlab", 3)]));
    assert_eq!(h.ctl.jobs[&g].allocation[0].node, "n1");
    assert_eq!(h.ctl.jobs[&g].allocation[0].gres, counts(&[("nvme", 500)]));
    let info = h.ctl.node_info(1, false);
    assert_eq!(info.gres, vec![berth_protocol::node::CountInfo { name: "nvme".into(), total: 800, used: 500 }]);
    assert!(h.ctl.node_info(0, false).gres.is_empty());
    assert_eq!(h.ctl.license_info()[0].used, 3);

    // Never: refused at submission, naming what is wrong.
    for (o, want) in [
        (lic(5), "license matlab: 5 wanted, the cluster has 4"),
        (SubmitOptions { licenses: Some(counts(&[("ansys", 1)])), ..opts(1, 100, "phys") }, "license ansys"),
        (
            SubmitOptions { gres: Some(counts(&[("fpga", 1)])), ..opts(1, 100, "phys") },
            "no node has generic resource fpga",
        ),
        (SubmitOptions { gres: Some(counts(&[("nvme", 900)])), ..opts(1, 100, "phys") }, "the most a node has is 800"),
    ] {
        let e = submit_err(&mut h, o);
        assert!(e.message.contains(want), "{want}: {e:?}");
    }

    // A restart loads what running jobs hold: b still waits.
    let mut h = h.restart();
    assert_eq!(h.ctl.license_info()[0].used, 3);
    assert_eq!(h.ctl.cluster.nodes()[1].free_gres("nvme"), 300);
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(state(&h, b), JobState::Queued);
    // a ends: b starts with the licenses.
    let node = h.ctl.jobs[&a].allocation[0].node_id.0 as usize;
    h.agent(node, berth_protocol::agent::AgentMessage::JobEnded { id: a, outcome: Default::default() });
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(state(&h, b), JobState::Running);
    assert_eq!(h.ctl.license_info()[0].used, 3);
}

/// A clock whose monotonic reading moves 1 ms each time it is read (its other readings are a
/// fake one's): a pass's time budget runs out after a known number of readings.
struct TickingClock {
    fake: crate::clock::FakeClock,
    reads: std::sync::atomic::AtomicU64,
}

impl crate::clock::Clock for TickingClock {
    fn unix(&self) -> f64 {
        crate::clock::Clock::unix(&self.fake)
    }

    fn instant(&self) -> std::time::Instant {
        crate::clock::Clock::instant(&self.fake)
    }

    fn monotonic_us(&self) -> u64 {
        self.reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed) * 1000
    }
}

/// The pass's time budget is read on the controller's injected clock: with a clock that moves
/// 1 ms a reading and a budget of 2 ms, the conservative pass reserves for the first waiting
/// job (in time) and runs out at the second, which gets no expected start (as past
/// `max_reservations`); with a budget to spare, it gets one.
#[test]
fn a_conservative_pass_out_of_its_time_budget_on_the_injected_clock_reserves_no_more() {
    let pass = |budget_ms: u64| {
        let mut h = Harness::new(2);
        h.ctl.cfg.scheduler.policy = berth_core::sched::backfill::BackfillPolicy::Conservative;
        h.ctl.cfg.scheduler.reservation_budget_ms = budget_ms;
        let running = h.batch(opts(16, 1000, "phys"), &ann());
        let first = submit(&mut h, opts(16, 500, "phys"));
        let second = submit(&mut h, opts(8, 500, "phys"));
        let clock = TickingClock { fake: crate::clock::FakeClock::new(h.now), reads: 0.into() };
        h.ctl.clock = std::sync::Arc::new(clock);
        h.ctl.schedule(h.now).unwrap();
        assert_eq!(state(&h, running), JobState::Running);
        let expected = |id| h.ctl.policy.expected_start(id);
        (expected(first).map(|t| t - h.now), expected(second).map(|t| t - h.now), state(&h, second))
    };
    // Read at the deadline's start (0), for the first job (1 ms: in time), for the second (2 ms).
    assert_eq!(pass(2), (Some(1000.0), None, JobState::Queued));
    assert_eq!(pass(10_000), (Some(1000.0), Some(1500.0), JobState::Queued));
}

/// Typed generic resources (`"nvme:fast" = 4` in `[gres]`, `--gres nvme:fast:3`): a typed
/// request takes its type only, a type-less one any type; both are checked at submission.
#[test]
fn typed_gres_go_by_type_and_untyped_requests_take_any() {
    let mut h = Harness::with_config(2, |c| {
        c.gres.insert("n0".into(), counts(&[("nvme:fast", 4)]));
        c.gres.insert("n1".into(), counts(&[("nvme:slow", 8)]));
    });
    let g = |key: &str, n| SubmitOptions { gres: Some(counts(&[(key, n)])), ..opts(1, 100, "phys") };
    let fast = submit(&mut h, g("nvme:fast", 3));
    let any = submit(&mut h, g("nvme", 6));
    let fast2 = submit(&mut h, g("nvme:fast", 2));
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(h.ctl.jobs[&fast].allocation[0].node, "n0");
    assert_eq!(h.ctl.jobs[&fast].allocation[0].gres, counts(&[("nvme:fast", 3)]));
    assert_eq!(h.ctl.jobs[&any].allocation[0].node, "n1", "n0 has 4 in all");
    assert_eq!(h.ctl.jobs[&any].allocation[0].gres, counts(&[("nvme:slow", 6)]), "held by the node's key");
    assert_eq!(state(&h, fast2), JobState::Queued);
    let why = h.ctl.policy.pass_reason(fast2).unwrap().describe();
    assert!(why.contains("nvme:fast"), "{why}");
    let info = h.ctl.node_info(1, false);
    assert_eq!(info.gres, vec![berth_protocol::node::CountInfo { name: "nvme:slow".into(), total: 8, used: 6 }]);
    for (o, want) in [
        (g("nvme:slow", 9), "the most a node has is 8"),
        (g("nvme", 9), "the most a node has is 8"),
        (g("nvme:medium", 1), "no node has generic resource nvme:medium"),
    ] {
        let e = submit_err(&mut h, o);
        assert!(e.message.contains(want), "{want}: {e:?}");
    }
}
