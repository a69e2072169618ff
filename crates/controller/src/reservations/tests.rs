use super::*;
use crate::testkit::*;
use berth_core::job::JobOutcome;
use berth_core::step::StepRequest;
use berth_protocol::agent::{AgentMessage, ControllerMessage};
use berth_protocol::client::ClientRequest;
use berth_protocol::reservation::{OptionValue, ReserveResources};

fn root() -> Peer {
    Peer { user: UserIdentity { uid: 0, gid: 0, groups: vec![0], name: "root".into() }, conn: 9 }
}

fn num(n: u64) -> Option<OptionValue> {
    Some(OptionValue::Number(n))
}

fn text(s: &str) -> Option<OptionValue> {
    Some(OptionValue::Text(s.into()))
}

fn reserve_body(resources: ReserveResources) -> ReserveRequest {
    ReserveRequest { user: None, resources, walltime: OptionValue::Number(600), node_list: vec![], account: None }
}

/// 2 nodes x 2 tasks of 1 core.
fn two_by_two() -> ReserveRequest {
    reserve_body(ReserveResources { nodes: num(2), tasks_per_node: num(2), ..Default::default() })
}

fn listed(list: &[(&str, Option<&str>)], mem: &str) -> ReserveRequest {
    let mut b = reserve_body(ReserveResources { mem: text(mem), ..Default::default() });
    b.node_list = list
        .iter()
        .map(|(n, c)| NodeRequest {
            node: n.to_string(),
            cpus: c.map(str::to_string),
            gpus: vec![],
            gres: Default::default(),
        })
        .collect();
    b
}

fn ask(h: &mut Harness, req: ReservationRequest, peer: &Peer) -> ReservationReply {
    match h.call(ClientRequest::Reservation { request: Box::new(req) }, peer) {
        ClientResponse::Reservation { reply } => reply,
        other => panic!("not a reservation reply: {other:?}"),
    }
}

fn ok(reply: ReservationReply) -> ReservationInfo {
    match reply {
        ReservationReply::One { reservation, .. } => *reservation,
        other => panic!("not one reservation: {other:?}"),
    }
}

fn failed(reply: ReservationReply) -> ReservationError {
    match reply {
        ReservationReply::Failed(e) => e,
        other => panic!("did not fail: {other:?}"),
    }
}

fn reserve(h: &mut Harness, body: ReserveRequest, peer: &Peer) -> ReservationInfo {
    match ask(h, ReservationRequest::Reserve { body }, peer) {
        ReservationReply::One { reservation, created: true } => *reservation,
        other => panic!("not reserved: {other:?}"),
    }
}

fn confirm(h: &mut Harness, id: u64, body: ConfirmRequest, peer: &Peer) -> ReservationReply {
    ask(h, ReservationRequest::Confirm { id, body }, peer)
}

fn stored(h: &Harness, id: u64) -> Reservation {
    h.ctl.store.get_reservation(id).unwrap().expect("stored")
}

fn check(h: &mut Harness) {
    h.ctl.check_reservations(h.now, true).unwrap();
}

#[test]
fn reserve_places_claims_persists_and_holds_every_node() {
    let mut h = Harness::new(2);
    let before = h.free_cores();
    let r = reserve(&mut h, two_by_two(), &ann());
    assert_eq!((r.id, r.state, r.user.as_str()), (1, ReservationState::Unconfirmed, "ann"));
    assert_eq!(r.confirm_by, Some(h.now + 60.0));
    assert_eq!((r.ends, r.walltime_seconds), (h.now + 600.0, 600));
    assert_eq!(r.nodes.len(), 2);
    for n in &r.nodes {
        assert_eq!((n.cores, n.cpus.split(['-', ',']).count()), (2, 2), "{n:?}");
        assert!(n.memory_bytes > 0 && n.numa_memory.iter().map(|m| m.bytes).sum::<u64>() == n.memory_bytes);
        assert!(n.address.starts_with("127.0.0.1:"));
    }
    assert_eq!(h.free_cores(), before - 4);
    let job = &h.ctl.jobs[&r.job];
    assert_eq!((job.queue.as_str(), job.state, job.user.name.as_str()), ("reservation", JobState::Running, "ann"));
    assert!(job.is_interactive() && job.script.is_empty());
    // Every node holds the job's cgroup; none runs a script.
    let launches: Vec<(usize, bool)> = h
        .sent()
        .into_iter()
        .filter_map(|(n, m)| match m {
            ControllerMessage::Launch(spec) => Some((n, spec.head)),
            _ => None,
        })
        .collect();
    assert_eq!(launches, vec![(0, false), (1, false)]);
    // On disk before the answer (the actor commits the batch, then replies).
    let row = stored(&h, r.id);
    assert_eq!((row.job, row.state), (r.job, ReservationState::Unconfirmed));
    let stored_job = h.ctl.store.get_job(r.job).unwrap().unwrap();
    assert_eq!((stored_job.state, stored_job.allocation.len()), (JobState::Running, 2));
    // Shown in the list and in the inventory.
    let ReservationReply::List { reservations } = ask(&mut h, ReservationRequest::List { all: false }, &bob()) else {
        panic!()
    };
    assert_eq!(reservations.iter().map(|r| r.id).collect::<Vec<_>>(), vec![1]);
    let ReservationReply::Inventory(inv) = ask(&mut h, ReservationRequest::Inventory, &bob()) else { panic!() };
    assert_eq!(inv.nodes.len(), 2);
    let n0 = &inv.nodes[0];
    assert_eq!((n0.info.name.as_str(), n0.free_cores, n0.free_pus), ("n0", 6, 6));
    assert_eq!(n0.holders.len(), 1);
    assert_eq!((n0.holders[0].job, n0.holders[0].reservation), (r.job, Some(1)));
    assert_eq!(n0.numa_free.len(), 2);
    assert!(n0.info.topology.starts_with('S'));
    // The next reservation gets the next id.
    let r2 = reserve(&mut h, reserve_body(ReserveResources { cores: num(1), ..Default::default() }), &ann());
    assert_eq!(r2.id, 2);
}

#[test]
fn busy_is_try_again_with_the_placement_reason_and_leaves_nothing() {
    let mut h = Harness::new(2);
    let big = berth_core::directives::SubmitOptions { nodes: Some(2), tasks_per_node: Some(7), ..Default::default() };
    h.batch(big, &ann());
    let jobs = h.ctl.jobs.len();
    let e = failed(ask(&mut h, ReservationRequest::Reserve { body: two_by_two() }, &ann()));
    assert_eq!(e.code, Code::TryAgain);
    assert_eq!(e.code.status(), 409);
    assert!(e.reason.as_deref().is_some_and(|r| r.contains("node")), "{e:?}");
    assert!(e.message.contains("try again"), "{e:?}");
    assert_eq!(h.ctl.jobs.len(), jobs);
    assert!(h.ctl.reservations.is_empty());
    assert!(h.ctl.store.all_reservations(10).unwrap().is_empty());
}

#[test]
fn never_is_infeasible_with_the_reason() {
    let mut h = Harness::new(2);
    let e = failed(ask(
        &mut h,
        ReservationRequest::Reserve { body: reserve_body(ReserveResources { nodes: num(3), ..Default::default() }) },
        &ann(),
    ));
    assert_eq!((e.code, e.code.status()), (Code::Infeasible, 422));
    assert!(e.reason.is_some(), "{e:?}");
    let e = failed(ask(
        &mut h,
        ReservationRequest::Reserve { body: reserve_body(ReserveResources { mem: text("64G"), ..Default::default() }) },
        &ann(),
    ));
    assert_eq!(e.code, Code::Infeasible, "{e:?}");
    // Bad values are bad requests, over the max walltime infeasible.
    let mut b = two_by_two();
    b.walltime = OptionValue::Text("soon".into());
    assert_eq!(failed(ask(&mut h, ReservationRequest::Reserve { body: b }, &ann())).code, Code::BadRequest);
    let mut b = two_by_two();
    b.resources.cores = num(3);
    assert_eq!(failed(ask(&mut h, ReservationRequest::Reserve { body: b }, &ann())).code, Code::BadRequest);
    let mut b = two_by_two();
    b.walltime = OptionValue::Text("30-00:00:00".into());
    let e = failed(ask(&mut h, ReservationRequest::Reserve { body: b }, &ann()));
    assert_eq!(e.code, Code::Infeasible);
    assert!(e.message.contains("max_walltime_secs"), "{e:?}");
    assert!(h.ctl.jobs.is_empty());
}

#[test]
fn explicit_resource_list_is_honoured_exactly_or_refused() {
    let mut h = Harness::new(2);
    let r = reserve(&mut h, listed(&[("n1", Some("4-7")), ("n0", Some("1"))], "512M"), &ann());
    assert!(r.explicit);
    let n: Vec<(&str, &str, u32, &str, u64)> =
        r.nodes.iter().map(|n| (n.node.as_str(), n.cpus.as_str(), n.cores, n.mems.as_str(), n.memory_bytes)).collect();
    assert_eq!(n, vec![("n1", "4-7", 4, "1", 512 << 20), ("n0", "1", 1, "0", 512 << 20)]);
    assert_eq!(r.nodes[0].numa_memory, vec![NumaMemory { numa: 1, bytes: 512 << 20 }]);
    assert_eq!(h.ctl.cluster.nodes()[1].free_pus.to_list(), "0-3");
    // The same PUs again: busy, naming the holder; nothing else is taken.
    let free = h.free_cores();
    let e = failed(ask(&mut h, ReservationRequest::Reserve { body: listed(&[("n0", Some("0-1"))], "1M") }, &ann()));
    assert_eq!(e.code, Code::TryAgain);
    assert!(e.message.contains(&format!("held by job(s) {}", r.job)), "{e:?}");
    assert_eq!(h.free_cores(), free);
    // Memory: more than free on the local NUMA node now is busy, more than it has is never.
    let e = failed(ask(&mut h, ReservationRequest::Reserve { body: listed(&[("n1", Some("0"))], "2G") }, &ann()));
    assert_eq!(e.code, Code::Infeasible);
    let e = failed(ask(&mut h, ReservationRequest::Reserve { body: listed(&[("n0", Some("0"))], "1000M") }, &ann()));
    assert_eq!(e.code, Code::TryAgain, "{e:?}");
    // Unknown nodes and PUs, duplicates, and mixing with a shape.
    let e = failed(ask(&mut h, ReservationRequest::Reserve { body: listed(&[("n9", None)], "1M") }, &ann()));
    assert_eq!((e.code, e.code.status()), (Code::UnknownNode, 422));
    let e = failed(ask(&mut h, ReservationRequest::Reserve { body: listed(&[("n0", Some("8-9"))], "1M") }, &ann()));
    assert_eq!(e.code, Code::Infeasible);
    assert!(e.message.contains("8-9"), "{e:?}");
    let e = failed(ask(
        &mut h,
        ReservationRequest::Reserve { body: listed(&[("n0", Some("2")), ("n0", Some("3"))], "1M") },
        &ann(),
    ));
    assert_eq!(e.code, Code::BadRequest);
    let e = failed(ask(&mut h, ReservationRequest::Reserve { body: listed(&[("n0", Some("x"))], "1M") }, &ann()));
    assert_eq!(e.code, Code::BadRequest);
    let mut b = listed(&[("n0", Some("2"))], "1M");
    b.resources.nodes = num(1);
    assert_eq!(failed(ask(&mut h, ReservationRequest::Reserve { body: b }, &ann())).code, Code::BadRequest);
    let mut b = listed(&[("n0", Some("2"))], "1M");
    b.resources.mem_per_cpu = text("1M");
    assert_eq!(failed(ask(&mut h, ReservationRequest::Reserve { body: b }, &ann())).code, Code::BadRequest);
    // A whole node by name while part of it is held: busy.
    let e = failed(ask(&mut h, ReservationRequest::Reserve { body: listed(&[("n1", None)], "1M") }, &ann()));
    assert_eq!(e.code, Code::TryAgain);
    // A node down is busy.
    h.ctl.extra[0].disconnect();
    let e = failed(ask(&mut h, ReservationRequest::Reserve { body: listed(&[("n0", Some("5"))], "1M") }, &ann()));
    assert_eq!(e.code, Code::TryAgain);
    assert!(e.message.contains("not connected"), "{e:?}");
}

#[test]
fn a_whole_node_by_name_is_every_pu_but_the_system_cpus() {
    let mut h = Harness::new(2);
    let mut n = h.ctl.cluster.node_at_mut(1);
    n.system_pus = CpuSet::parse_list("0").unwrap();
    n.refresh();
    drop(n);
    let e = failed(ask(&mut h, ReservationRequest::Reserve { body: listed(&[("n1", Some("0-1"))], "1M") }, &ann()));
    assert_eq!(e.code, Code::Infeasible);
    assert!(e.message.contains("system CPUs"), "{e:?}");
    let r = reserve(&mut h, listed(&[("n1", None)], "1M"), &ann());
    assert_eq!((r.nodes[0].cpus.as_str(), r.nodes[0].cores, r.nodes[0].mems.as_str()), ("1-7", 7, "0-1"));
    assert_eq!(h.ctl.jobs[&r.job].options.cores, Some(7));
    h.ctl.jobs[&r.job].validate().unwrap();
    let split: u64 = r.nodes[0].numa_memory.iter().map(|m| m.bytes).sum();
    assert_eq!(split, 1 << 20);
}

#[test]
fn confirm_with_a_job_releases_when_the_job_ends() {
    let mut h = Harness::new(2);
    let holder = h.batch(berth_core::directives::SubmitOptions { cores: Some(1), ..Default::default() }, &ann());
    let r = reserve(&mut h, two_by_two(), &ann());
    let free = h.free_cores();
    // Others may not confirm it; the holder must exist and be live.
    let e = failed(confirm(&mut h, r.id, ConfirmRequest { job: Some(holder), ..Default::default() }, &bob()));
    assert_eq!((e.code, e.code.status()), (Code::NotPermitted, 403));
    let e = failed(confirm(&mut h, r.id, ConfirmRequest { job: Some(JobId(999)), ..Default::default() }, &ann()));
    assert_eq!(e.code, Code::UnknownJob);
    let e = failed(confirm(&mut h, r.id, ConfirmRequest::default(), &ann()));
    assert_eq!(e.code, Code::BadRequest);
    let e = failed(confirm(&mut h, 77, ConfirmRequest { job: Some(holder), ..Default::default() }, &ann()));
    assert_eq!((e.code, e.code.status()), (Code::UnknownReservation, 404));
    let c = ok(confirm(&mut h, r.id, ConfirmRequest { job: Some(holder), ..Default::default() }, &ann()));
    assert_eq!(
        (c.state, c.holder.clone(), c.confirm_by),
        (ReservationState::Confirmed, Some(Holder::Job { job: holder }), None)
    );
    // Confirming again with the same holder is fine, with another is not.
    ok(confirm(&mut h, r.id, ConfirmRequest { job: Some(holder), ..Default::default() }, &ann()));
    let e = failed(confirm(&mut h, r.id, ConfirmRequest { session: Some("x".into()), ..Default::default() }, &ann()));
    assert_eq!((e.code, e.code.status()), (Code::InvalidState, 409));
    assert_eq!(stored(&h, r.id).state, ReservationState::Confirmed);
    // Confirmed, it outlives the confirm timeout.
    h.now += 120.0;
    check(&mut h);
    assert!(h.ctl.reservations.get(r.id).is_some());
    // The holder's batch script ends: the reservation goes, its job ends, its nodes are told.
    h.sent();
    h.agent(0, AgentMessage::JobEnded { id: holder, outcome: JobOutcome { exit_code: Some(0), ..Default::default() } });
    check(&mut h);
    assert!(h.ctl.reservations.is_empty());
    let row = stored(&h, r.id);
    assert_eq!(row.state, ReservationState::Released);
    assert_eq!(row.release_reason.as_deref(), Some(format!("holder job {holder} ended").as_str()));
    assert!(!h.ctl.jobs.contains_key(&r.job));
    assert_eq!(h.ctl.store.get_job(r.job).unwrap().unwrap().state, JobState::Completed);
    assert_eq!(h.free_cores(), free + 4 + 1);
    let kills =
        h.sent().into_iter().filter(|(_, m)| matches!(m, ControllerMessage::Kill { id, .. } if *id == r.job)).count();
    assert_eq!(kills, 2);
    // A finished holder cannot confirm a new reservation.
    let r2 = reserve(&mut h, two_by_two(), &ann());
    let e = failed(confirm(&mut h, r2.id, ConfirmRequest { job: Some(holder), ..Default::default() }, &ann()));
    assert_eq!(e.code, Code::InvalidState);
    let e = failed(confirm(&mut h, r2.id, ConfirmRequest { job: Some(r2.job), ..Default::default() }, &ann()));
    assert_eq!(e.code, Code::BadRequest);
}

#[test]
fn confirm_with_a_pid_releases_when_the_process_is_gone() {
    let mut h = Harness::new(2);
    let mut child = std::process::Command::new("sleep").arg("30").spawn().expect("sleep");
    let pid = child.id();
    let me = root();
    let r = reserve(&mut h, two_by_two(), &me);
    let e = failed(confirm(&mut h, r.id, ConfirmRequest { pid: Some(u32::MAX - 5), ..Default::default() }, &me));
    assert_eq!((e.code, e.code.status()), (Code::UnknownProcess, 422));
    let c = ok(confirm(&mut h, r.id, ConfirmRequest { pid: Some(pid), ..Default::default() }, &me));
    assert_eq!(c.holder, Some(Holder::Pid { pid }));
    assert!(stored(&h, r.id).holder_since.is_some());
    h.now += 500.0; // past the confirm timeout, within the walltime
    check(&mut h);
    assert!(h.ctl.reservations.get(r.id).is_some(), "holder alive");
    // Killed and reaped: gone. (A zombie counts as gone too.)
    child.kill().unwrap();
    child.wait().unwrap();
    h.now += 1.0;
    check(&mut h);
    assert!(h.ctl.reservations.is_empty());
    let row = stored(&h, r.id);
    assert_eq!(row.release_reason.as_deref(), Some(format!("holder process {pid} exited").as_str()));
    assert!(!h.ctl.jobs.contains_key(&r.job));
    // Releasing it again answers it as it is.
    let again = ok(ask(&mut h, ReservationRequest::Release { id: r.id }, &me));
    assert_eq!(again.state, ReservationState::Released);
}

#[test]
fn pid_holders_are_checked_against_reuse() {
    let me = std::process::id();
    let start = proc_info(me).unwrap().start;
    assert!(process_alive(me, Some(start)));
    assert!(!process_alive(me, Some(start + 1)), "another process with the same pid");
    assert!(!process_alive(u32::MAX - 5, None));
    assert!(lookup_user("root").is_some_and(|u| u.uid == 0 && u.groups.contains(&0)));
    assert!(lookup_user("no-such-user-here").is_none());
}

#[test]
fn confirm_with_a_session_lives_while_renewed() {
    let mut h = Harness::new(2);
    let r = reserve(&mut h, two_by_two(), &ann());
    let e = failed(ask(&mut h, ReservationRequest::Renew { id: r.id }, &ann()));
    assert_eq!(e.code, Code::InvalidState);
    let c = ok(confirm(&mut h, r.id, ConfirmRequest { session: Some("pbs.42".into()), ..Default::default() }, &ann()));
    assert_eq!(c.renew_by, Some(h.now + 300.0));
    h.now += 200.0;
    check(&mut h);
    let e = failed(ask(&mut h, ReservationRequest::Renew { id: r.id }, &bob()));
    assert_eq!(e.code, Code::NotPermitted);
    let c = ok(ask(&mut h, ReservationRequest::Renew { id: r.id }, &ann()));
    assert_eq!(c.renew_by, Some(h.now + 300.0));
    h.now += 200.0;
    check(&mut h);
    assert!(h.ctl.reservations.get(r.id).is_some());
    h.now += 101.0;
    check(&mut h);
    assert!(h.ctl.reservations.is_empty());
    assert!(stored(&h, r.id).release_reason.unwrap().contains("not renewed"));
}

#[test]
fn unconfirmed_reservations_expire() {
    let mut h = Harness::new(2);
    let before = h.free_cores();
    let r = reserve(&mut h, two_by_two(), &ann());
    h.now += 59.0;
    h.ctl.check_reservations(h.now, false).unwrap();
    assert!(h.ctl.reservations.get(r.id).is_some());
    h.now += 1.0;
    h.ctl.check_reservations(h.now, false).unwrap();
    assert!(h.ctl.reservations.is_empty());
    let row = stored(&h, r.id);
    assert_eq!((row.state, row.released_at), (ReservationState::Released, Some(h.now)));
    assert_eq!(row.release_reason.as_deref(), Some("not confirmed within 60 s"));
    assert_eq!(h.ctl.store.get_job(r.job).unwrap().unwrap().state, JobState::Cancelled);
    assert_eq!(h.free_cores(), before);
    // Shown after release, with its allocation as it was.
    let shown = ok(ask(&mut h, ReservationRequest::Show { id: r.id }, &bob()));
    assert_eq!((shown.state, shown.nodes.len()), (ReservationState::Released, 2));
    let ReservationReply::List { reservations } = ask(&mut h, ReservationRequest::List { all: true }, &ann()) else {
        panic!()
    };
    assert_eq!(reservations.len(), 1);
    let e =
        failed(confirm(&mut h, r.id, ConfirmRequest { session: Some("late".into()), ..Default::default() }, &ann()));
    assert_eq!(e.code, Code::InvalidState);
}

#[test]
fn walltime_and_cancel_release() {
    let mut h = Harness::new(2);
    let r = reserve(&mut h, two_by_two(), &ann());
    ok(confirm(&mut h, r.id, ConfirmRequest { session: Some("s".into()), ..Default::default() }, &ann()));
    // The controller ends it at its walltime (as an interactive allocation), then releases it.
    h.now += 600.0;
    h.ctl.check_interactive(h.now).unwrap();
    check(&mut h);
    let row = stored(&h, r.id);
    assert_eq!(row.state, ReservationState::Released);
    assert!(row.release_reason.as_deref().unwrap().contains("timeout"), "{row:?}");
    // `berth cancel` on its job releases it too.
    let r = reserve(&mut h, two_by_two(), &ann());
    let ClientResponse::Done { results } = h.call(ClientRequest::Cancel { ids: vec![r.job], only: vec![] }, &ann())
    else {
        panic!()
    };
    assert!(results[0].ok);
    let shown = ok(ask(&mut h, ReservationRequest::Show { id: r.id }, &ann()));
    assert_eq!(shown.state, ReservationState::Released);
    assert!(shown.release_reason.unwrap().contains("cancelled"));
}

#[test]
fn claims_are_steps_and_release_kills_them() {
    let mut h = Harness::new(2);
    let r = reserve(&mut h, two_by_two(), &ann());
    let step = |job| {
        ClientRequest::StepCreate(Box::new(step_create(
            Some(job),
            StepRequest { ntasks: Some(4), ..Default::default() },
        )))
    };
    // Only its owner (or an admin) claims it.
    assert!(matches!(h.call(step(r.job), &bob()), ClientResponse::Error(_)));
    let ClientResponse::StepGranted { grant: g, .. } = h.call(step(r.job), &ann()) else { panic!("not granted") };
    assert_eq!((g.size, g.nodes.len()), (4, 2));
    let shown = ok(ask(&mut h, ReservationRequest::Show { id: r.id }, &ann()));
    assert_eq!(shown.claims.len(), 1);
    assert_eq!((shown.claims[0].step, shown.claims[0].end_time), (g.step, None));
    // Others may not release it; its owner may, and its step is closed as at a job's end.
    let e = failed(ask(&mut h, ReservationRequest::Release { id: r.id }, &bob()));
    assert_eq!(e.code, Code::NotPermitted);
    h.sent();
    let released = ok(ask(&mut h, ReservationRequest::Release { id: r.id }, &ann()));
    assert_eq!(released.state, ReservationState::Released);
    assert_eq!(released.release_reason.as_deref(), Some("released by ann"));
    let kills = h.sent().into_iter().filter(|(_, m)| matches!(m, ControllerMessage::Kill { .. })).count();
    assert_eq!(kills, 2);
    let steps = h.ctl.store.job_steps(r.job).unwrap();
    assert_eq!(steps[0].failure.as_deref(), Some("job ended"));
    assert_eq!(h.ctl.store.get_job(r.job).unwrap().unwrap().state, JobState::Completed);
}

#[test]
fn who_may_reserve_for_whom() {
    let mut h = Harness::new(2);
    let mut b = two_by_two();
    b.user = Some("ann".into());
    let e = failed(ask(&mut h, ReservationRequest::Reserve { body: b.clone() }, &bob()));
    assert_eq!((e.code, e.code.status()), (Code::NotPermitted, 403));
    // Naming yourself is fine.
    let r = reserve(&mut h, b, &ann());
    assert_eq!(r.user, "ann");
    // Admins reserve for anyone who exists here.
    let mut b = two_by_two();
    b.user = Some("no-such-user-here".into());
    let e = failed(ask(&mut h, ReservationRequest::Reserve { body: b }, &root()));
    assert_eq!((e.code, e.code.status()), (Code::UnknownUser, 422));
    let mut b = reserve_body(ReserveResources { cores: num(1), ..Default::default() });
    b.user = Some("root".into());
    let r = reserve(&mut h, b, &root());
    assert_eq!((r.user.as_str(), r.uid), ("root", 0));
}

#[test]
fn restart_keeps_reservations() {
    let mut h = Harness::new(2);
    let r2 = reserve(&mut h, listed(&[("n1", Some("6-7"))], "1M"), &ann());
    let r = reserve(&mut h, two_by_two(), &ann());
    ok(confirm(&mut h, r.id, ConfirmRequest { session: Some("s1".into()), ..Default::default() }, &ann()));
    let free = h.free_cores();
    let mut h = h.restart();
    assert_eq!(h.free_cores(), free);
    assert_eq!(h.ctl.reservations.values().map(|r| r.id).collect::<Vec<_>>(), vec![r2.id, r.id]);
    let row = h.ctl.reservations.get(r.id).unwrap();
    assert_eq!(
        (row.state, row.holder.clone()),
        (ReservationState::Confirmed, Some(Holder::Session { session: "s1".into() }))
    );
    check(&mut h);
    assert_eq!(h.ctl.reservations.values().count(), 2);
    // Ids continue; the unconfirmed one still expires on time.
    let r3 = reserve(&mut h, reserve_body(ReserveResources { cores: num(1), ..Default::default() }), &ann());
    assert_eq!(r3.id, 3);
    h.now += 61.0;
    check(&mut h);
    assert_eq!(h.ctl.reservations.values().map(|r| r.id).collect::<Vec<_>>(), vec![r.id]);
}

/// Issue 20: a reservation asks for GPUs as a job does; it holds them (shown per node), the
/// inventory lists the node's free GPUs and who holds the others, and a GPU job cannot take
/// the reserved ones.
#[test]
fn a_reservation_holds_gpus_and_the_inventory_counts_them() {
    let mut t = berth_core::topology::Topology::uniform(2, 1, 4, 1, 8 << 30);
    t.add_emulated_gpus(1).unwrap();
    let mut h = Harness::with_topology(1, t);
    let body = reserve_body(ReserveResources { cores: num(1), gpus: num(1), ..Default::default() });
    let r = reserve(&mut h, body, &ann());
    assert_eq!(r.nodes.len(), 1);
    assert_eq!(r.nodes[0].gpus.len(), 1, "{r:?}");
    let held = r.nodes[0].gpus[0];
    let ReservationReply::Inventory(inv) = ask(&mut h, ReservationRequest::Inventory, &bob()) else { panic!() };
    let node = &inv.nodes[0];
    assert_eq!(node.free_gpus.len(), 1);
    assert!(!node.free_gpus.contains(&held), "{node:?}");
    assert!(node.holders.iter().any(|x| x.job == r.job && x.gpus == vec![held]), "{:?}", node.holders);
    // The other GPU goes to a job; a third GPU request waits.
    let gpu_job = || berth_core::directives::SubmitOptions { cores: Some(1), gpus: Some(1), ..Default::default() };
    let a = h.batch(gpu_job(), &bob());
    assert_eq!(h.ctl.jobs[&a].allocation[0].gpus.len(), 1);
    assert_ne!(h.ctl.jobs[&a].allocation[0].gpus[0], held);
    let b = h.submit_as(gpu_job(), false, &bob());
    h.ctl.schedule(h.now).unwrap();
    assert!(h.ctl.jobs[&b].state.is_pending(), "no GPU left for it");
    // More GPUs than the node has: infeasible, said at once.
    let body = reserve_body(ReserveResources { gpus_per_node: num(3), ..Default::default() });
    let e = failed(ask(&mut h, ReservationRequest::Reserve { body }, &ann()));
    assert!(e.message.contains("GPU"), "{e:?}");
}

fn counts(items: &[(&str, u32)]) -> berth_core::gres::Counts {
    items.iter().map(|(n, c)| (n.to_string(), *c)).collect()
}

/// The reservation API knows generic resources and licenses: the inventory lists them, a
/// request of either kind holds them (explicit entries name GPUs and generic resources per
/// node), jobs do not get what a reservation holds, and what can never be had is `infeasible`,
/// what is held now "try again".
#[test]
fn reservations_hold_gpus_gres_and_licenses_and_refuse_the_impossible() {
    let mut t = berth_core::topology::Topology::uniform(2, 1, 4, 1, 8 << 30);
    t.add_emulated_gpus(1).unwrap();
    let mut h = Harness::with_config_and_topology(2, t, |c| {
        c.licenses = counts(&[("matlab", 4)]);
        c.gres.insert("n0".into(), counts(&[("nvme", 800)]));
    });
    let ReservationReply::Inventory(inv) = ask(&mut h, ReservationRequest::Inventory, &bob()) else { panic!() };
    assert_eq!((inv.licenses[0].name.as_str(), inv.licenses[0].total), ("matlab", 4), "{:?}", inv.licenses);
    assert_eq!(inv.nodes[0].info.gres[0].total, 800);
    // Placed: nvme on the node that has it, licenses held.
    let body = reserve_body(ReserveResources {
        cores: num(1),
        gres: text("nvme:500"),
        licenses: text("matlab:3"),
        ..Default::default()
    });
    let r = reserve(&mut h, body, &ann());
    assert_eq!((r.nodes[0].node.as_str(), r.nodes[0].gres.clone()), ("n0", counts(&[("nvme", 500)])), "{r:?}");
    assert_eq!(r.licenses, counts(&[("matlab", 3)]));
    let ReservationReply::Inventory(inv) = ask(&mut h, ReservationRequest::Inventory, &bob()) else { panic!() };
    assert_eq!(inv.licenses[0].used, 3);
    // A job wanting 2 licenses waits: 1 is free.
    let lic = berth_core::directives::SubmitOptions {
        cores: Some(1),
        licenses: Some(counts(&[("matlab", 2)])),
        ..Default::default()
    };
    let job = h.submit_as(lic, false, &bob());
    h.ctl.schedule(h.now).unwrap();
    assert!(h.ctl.jobs[&job].state.is_pending(), "the reservation holds 3 of 4");
    // Explicit: GPU 1 and nvme on n0, a license.
    let mut b = listed(&[("n0", Some("1"))], "1G");
    b.node_list[0].gpus = vec![1];
    b.node_list[0].gres = counts(&[("nvme", 300)]);
    b.resources.licenses = text("matlab:1");
    let e = reserve(&mut h, b.clone(), &ann());
    assert_eq!((e.nodes[0].gpus.clone(), e.nodes[0].gres.clone()), (vec![1], counts(&[("nvme", 300)])), "{e:?}");
    assert_eq!(e.licenses, counts(&[("matlab", 1)]));
    // The same GPU again, with another PU: held now (try again), the holder named.
    b.node_list[0].cpus = Some("2".into());
    let again = failed(ask(&mut h, ReservationRequest::Reserve { body: b.clone() }, &ann()));
    assert_eq!(again.code, Code::TryAgain, "{again:?}");
    assert!(again.message.contains("GPU 1 of node n0 is held by job"), "{again:?}");
    // Never: a GPU or a resource the node does not have, a license the cluster does not have.
    let mut no_gpu = listed(&[("n1", Some("0"))], "1G");
    no_gpu.node_list[0].gpus = vec![5];
    let mut no_nvme = listed(&[("n1", Some("0"))], "1G");
    no_nvme.node_list[0].gres = counts(&[("nvme", 1)]);
    let mut no_lic = listed(&[("n1", Some("0"))], "1G");
    no_lic.resources.licenses = text("ansys:1");
    let too_many = reserve_body(ReserveResources { cores: num(1), licenses: text("matlab:5"), ..Default::default() });
    for (body, want) in [
        (no_gpu, "has GPUs 0 to 1, not GPU 5"),
        (no_nvme, "node n1 has nvme:0"),
        (no_lic, "license ansys"),
        (too_many, "the cluster has 4"),
    ] {
        let e = failed(ask(&mut h, ReservationRequest::Reserve { body }, &ann()));
        assert_eq!(e.code, Code::Infeasible, "{want}: {e:?}");
        assert!(e.message.contains(want), "{want}: {e:?}");
    }
    // Other resources are still refused beside a node list.
    let mut mixed = listed(&[("n1", None)], "1G");
    mixed.resources.gres = text("nvme:1");
    let e = failed(ask(&mut h, ReservationRequest::Reserve { body: mixed }, &ann()));
    assert_eq!(e.code, Code::BadRequest, "{e:?}");
}
