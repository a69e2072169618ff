//! Advance reservations in the controller: creation (placement, refusals, persistence),
//! submission to them, the pass keeping others off them, expiry and deletion.

use super::clock;
use crate::model::request::Peer;
use crate::testkit::*;
use berth_core::directives::SubmitOptions;
use berth_core::job::JobState;
use berth_core::JobId;
use berth_protocol::client::{
    AdvanceCreate, AdvanceInfo, ApiError, ClientRequest, ClientResponse, ErrorCode, SubmitRequest,
};
use berth_protocol::user::UserIdentity;

const HOUR: f64 = 3600.0;

fn root() -> Peer {
    Peer { user: UserIdentity { uid: 0, gid: 0, groups: vec![0], name: "root".into() }, conn: 3 }
}

fn opts(cores: u32, walltime: u64) -> SubmitOptions {
    SubmitOptions { cores: Some(cores), walltime: Some(walltime), mem: Some(1 << 20), ..Default::default() }
}

fn member(cores: u32, walltime: u64, resv: &str) -> SubmitOptions {
    SubmitOptions { reservation: Some(resv.into()), ..opts(cores, walltime) }
}

fn submit(h: &mut Harness, options: SubmitOptions, peer: &Peer) -> Result<JobId, ApiError> {
    let sub = SubmitRequest {
        script: "#!/bin/sh\ntrue\n".into(),
        script_name: "job.sh".into(),
        options,
        env: vec![],
        cwd: "/tmp".into(),
        hold: false,
        ignore_unsupported: false,
    };
    match h.call(ClientRequest::Submit(Box::new(sub)), peer) {
        ClientResponse::Submitted { id } => Ok(id),
        ClientResponse::Error(e) => Err(e),
        other => panic!("unexpected {other:?}"),
    }
}

fn create(h: &mut Harness, body: AdvanceCreate, peer: &Peer) -> Result<AdvanceInfo, ApiError> {
    match h.call(ClientRequest::AdvanceCreate(Box::new(body)), peer) {
        ClientResponse::Advance { mut reservations } => Ok(reservations.remove(0)),
        ClientResponse::Error(e) => Err(e),
        other => panic!("unexpected {other:?}"),
    }
}

fn list(h: &mut Harness) -> Vec<AdvanceInfo> {
    let ClientResponse::Advance { reservations } = h.call(ClientRequest::AdvanceList, &bob()) else { panic!() };
    reservations
}

/// Node n1 reserved for ann from now + 1 h for 2 h.
fn on_n1(h: &Harness) -> AdvanceCreate {
    AdvanceCreate {
        name: Some("maint".into()),
        start: Some(h.now + HOUR),
        duration_secs: Some(7200),
        nodes: vec!["n1".into()],
        users: vec!["ann".into()],
        ..Default::default()
    }
}

fn nodes_of(h: &Harness, id: JobId) -> Vec<String> {
    h.ctl.jobs[&id].allocation.iter().map(|a| a.node.clone()).collect()
}

fn reason(h: &mut Harness, id: JobId) -> String {
    let ClientResponse::Job { job } = h.call(ClientRequest::ShowJob { id }, &ann()) else { panic!() };
    job.reason.unwrap_or_default()
}

#[test]
fn whole_node_reservation_is_placed_persisted_and_listed() {
    let mut h = Harness::new(2);
    let r = {
        let b = on_n1(&h);
        create(&mut h, b, &root())
    }
    .unwrap();
    assert_eq!((r.name.as_str(), r.start, r.end, r.cores), ("maint", h.now + HOUR, h.now + 3.0 * HOUR, 8));
    assert_eq!(r.allocation.len(), 1);
    assert_eq!((r.allocation[0].node.as_str(), r.allocation[0].cpus.to_list()), ("n1", "0-7".to_string()));
    assert_eq!(r.allocation[0].memory_bytes, 2 << 30);
    assert!(!r.active);
    // A restart keeps it, and the pass still keeps others off it.
    let mut h = h.restart();
    let all = list(&mut h);
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].allocation, r.allocation);
    let long = submit(&mut h, opts(8, 7200), &bob()).unwrap();
    let elsewhere = submit(&mut h, opts(8, 7200), &bob()).unwrap();
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(nodes_of(&h, long), ["n0"]);
    assert_eq!(h.ctl.jobs[&elsewhere].state, JobState::Queued, "n1 is reserved from +1 h");
    assert!(reason(&mut h, elsewhere).contains("advance reservation maint"), "{}", reason(&mut h, elsewhere));
}

/// n0 is busy for long; n1 is reserved from +1 h for 2 h: a 2-hour job of someone else must
/// not start on n1 now, a 30-minute one may.
#[test]
fn others_use_the_reserved_node_only_if_they_end_before_the_window() {
    let mut h = Harness::new(2);
    {
        let b = on_n1(&h);
        create(&mut h, b, &root())
    }
    .unwrap();
    let busy = h.batch(opts(8, 36_000), &bob());
    assert_eq!(nodes_of(&h, busy), ["n0"]);
    let two_hours = submit(&mut h, opts(4, 7200), &bob()).unwrap();
    let half_hour = submit(&mut h, opts(4, 1800), &bob()).unwrap();
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(h.ctl.jobs[&two_hours].state, JobState::Queued);
    assert_eq!(h.ctl.jobs[&half_hour].state, JobState::Running);
    assert_eq!(nodes_of(&h, half_hour), ["n1"]);
    // Expected when the window is over (n0's job runs longer).
    assert_eq!(h.ctl.policy.expected_start(two_hours).as_ref(), Some(&(h.now + 3.0 * HOUR)));
    assert!(reason(&mut h, two_hours).contains("maint"), "{}", reason(&mut h, two_hours));
}

/// A member's job waits for the window ("reservation NAME starts at HH:MM"), then starts on
/// the reserved node only, though another is free; others keep off n1 during the window.
#[test]
fn members_wait_for_the_window_then_run_on_its_resources() {
    let mut h = Harness::new(2);
    let r = {
        let b = on_n1(&h);
        create(&mut h, b, &root())
    }
    .unwrap();
    let job = submit(&mut h, member(2, 3600, "maint"), &ann()).unwrap();
    let job2 = submit(&mut h, member(6, 7000, "maint"), &ann()).unwrap();
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(h.ctl.jobs[&job].state, JobState::Queued, "n0 and n1 are free, but the window has not opened");
    let want = format!("reservation maint starts at {}", clock(r.start, h.now));
    assert_eq!(reason(&mut h, job), want);
    assert_eq!(h.ctl.policy.expected_start(job).as_ref(), Some(&r.start));
    let ClientResponse::Jobs { jobs } = h.call(ClientRequest::ListJobs { states: vec![], all: false }, &ann()) else {
        panic!()
    };
    assert_eq!(jobs.iter().find(|j| j.id == job).and_then(|j| j.reason.clone()), Some(want));
    // The window opens: the tick notices, the pass starts both members on n1 only.
    h.now = r.start + 1.0;
    h.ctl.dirty = false;
    h.ctl.check_advance(h.now).unwrap();
    assert!(h.ctl.dirty, "a window that opens calls for a pass");
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(h.ctl.jobs[&job].state, JobState::Running);
    assert_eq!(h.ctl.jobs[&job2].state, JobState::Running);
    assert_eq!(nodes_of(&h, job), ["n1"]);
    assert_eq!(nodes_of(&h, job2), ["n1"]);
    let info = list(&mut h).remove(0);
    assert!(info.active);
    assert_eq!(info.running_jobs, [job, job2]);
    // Someone else's job during the window goes to n0, even a short one.
    let other = submit(&mut h, opts(1, 60), &bob()).unwrap();
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(nodes_of(&h, other), ["n0"]);
    // A member's job that no longer fits the reservation's free part waits for it.
    let third = submit(&mut h, member(2, 60, "maint"), &ann()).unwrap();
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(h.ctl.jobs[&third].state, JobState::Queued);
    assert!(reason(&mut h, third).contains("reservation maint"), "{}", reason(&mut h, third));
}

#[test]
fn submissions_to_a_reservation_are_checked() {
    let mut h = Harness::new(2);
    let mut body = on_n1(&h);
    body.accounts = vec!["phys".into()];
    create(&mut h, body, &root()).unwrap();
    // Not a member.
    let e = submit(&mut h, member(1, 600, "maint"), &bob()).unwrap_err();
    assert_eq!(e.code, ErrorCode::NotPermitted, "{e:?}");
    assert!(e.message.contains("users ann and accounts phys"), "{}", e.message);
    // A member through the account.
    let mut o = member(1, 600, "maint");
    o.account = Some("phys".into());
    submit(&mut h, o, &bob()).unwrap();
    // Unknown reservation.
    let e = submit(&mut h, member(1, 600, "nope"), &ann()).unwrap_err();
    assert_eq!(e.code, ErrorCode::UnknownReservation, "{e:?}");
    // A walltime that cannot end by the reservation's end.
    for w in [3 * 3600, 7200] {
        let e = submit(&mut h, member(1, w, "maint"), &ann()).unwrap_err();
        assert_eq!(e.code, ErrorCode::BadRequest, "{e:?}");
        assert!(e.message.contains("at most 01:59:00"), "{}", e.message);
    }
    submit(&mut h, member(1, 7140, "maint"), &ann()).unwrap();
    // More than the reservation holds.
    let e = submit(&mut h, member(9, 600, "maint"), &ann()).unwrap_err();
    assert_eq!(e.code, ErrorCode::Infeasible, "{e:?}");
    // As a directive.
    let sub = SubmitRequest {
        script: "#!/bin/sh\n#BERTH --reservation maint --cores 1 --walltime 10:00\ntrue\n".into(),
        script_name: "job.sh".into(),
        options: SubmitOptions::default(),
        env: vec![],
        cwd: "/tmp".into(),
        hold: false,
        ignore_unsupported: false,
    };
    let ClientResponse::Submitted { id } = h.call(ClientRequest::Submit(Box::new(sub)), &ann()) else { panic!() };
    assert_eq!(h.ctl.jobs[&id].options.reservation.as_deref(), Some("maint"));
}

#[test]
fn only_admins_create_and_delete() {
    let mut h = Harness::new(2);
    let e = {
        let b = on_n1(&h);
        create(&mut h, b, &ann())
    }
    .unwrap_err();
    assert_eq!(e.code, ErrorCode::NotPermitted, "{e:?}");
    assert!(list(&mut h).is_empty());
    let mut h = Harness::with_config(2, |c| c.admins = vec!["ann".into()]);
    {
        let b = on_n1(&h);
        create(&mut h, b, &ann())
    }
    .unwrap();
    let ClientResponse::Error(e) = h.call(ClientRequest::AdvanceDelete { name: "maint".into() }, &bob()) else {
        panic!()
    };
    assert_eq!(e.code, ErrorCode::NotPermitted);
    assert_eq!(list(&mut h).len(), 1, "everyone may list");
}

#[test]
fn creation_refuses_what_is_not_free_for_the_whole_window() {
    let mut h = Harness::new(2);
    // n0 busy for 10 h, n1 for 30 min.
    let long = h.batch(opts(8, 36_000), &bob());
    let short = h.batch(opts(8, 1800), &bob());
    assert_eq!((nodes_of(&h, long), nodes_of(&h, short)), (vec!["n0".to_string()], vec!["n1".to_string()]));
    // Whole node n1 from now: held by the short job.
    let mut body = on_n1(&h);
    body.start = None;
    let e = create(&mut h, body, &root()).unwrap_err();
    assert_eq!(e.code, ErrorCode::Unavailable, "{e:?}");
    assert!(e.message.contains(&format!("job {short} holds n1")), "{}", e.message);
    // From +1 h it is free (the short job's walltime ends before).
    {
        let b = on_n1(&h);
        create(&mut h, b, &root())
    }
    .unwrap();
    // 4 cores over the same window: n0 is busy, n1 reserved.
    let cores = AdvanceCreate {
        name: Some("c".into()),
        start: Some(h.now + 2.0 * HOUR),
        end: Some(h.now + 4.0 * HOUR),
        cores: Some(4),
        accounts: vec!["phys".into()],
        ..Default::default()
    };
    let e = create(&mut h, cores.clone(), &root()).unwrap_err();
    assert_eq!(e.code, ErrorCode::Unavailable, "{e:?}");
    assert!(e.message.contains("reservation(s) maint"), "{}", e.message);
    // After maint's window, n1 is free: the cores go there.
    let later = AdvanceCreate { start: Some(h.now + 3.0 * HOUR), end: Some(h.now + 5.0 * HOUR), ..cores };
    let r = create(&mut h, later, &root()).unwrap();
    assert_eq!((r.allocation[0].node.as_str(), r.cores), ("n1", 4));
    // Bad requests.
    let bad = |b: AdvanceCreate| AdvanceCreate { name: Some("x".into()), users: vec!["ann".into()], ..b };
    for (body, what) in [
        (bad(AdvanceCreate { duration_secs: Some(60), ..Default::default() }), "what to reserve"),
        (bad(AdvanceCreate { cores: Some(1), ..Default::default() }), "--end or its --duration"),
        (
            bad(AdvanceCreate {
                cores: Some(1),
                start: Some(h.now - 9000.0),
                duration_secs: Some(60),
                ..Default::default()
            }),
            "past",
        ),
        (
            bad(AdvanceCreate {
                cores: Some(1),
                nodes: vec!["n0".into()],
                duration_secs: Some(60),
                ..Default::default()
            }),
            "not both",
        ),
        (AdvanceCreate { cores: Some(1), duration_secs: Some(60), ..Default::default() }, "say who"),
        (
            AdvanceCreate {
                name: Some("c".into()),
                users: vec!["a".into()],
                cores: Some(1),
                duration_secs: Some(60),
                ..Default::default()
            },
            "exists",
        ),
    ] {
        let e = create(&mut h, body, &root()).unwrap_err();
        assert!(e.message.contains(what), "{what}: {}", e.message);
    }
    let e = create(
        &mut h,
        bad(AdvanceCreate { nodes: vec!["n9".into()], duration_secs: Some(60), ..Default::default() }),
        &root(),
    )
    .unwrap_err();
    assert_eq!(e.code, ErrorCode::UnknownNode);
}

/// Past its end a reservation is removed (an event); its queued jobs are told it is gone.
#[test]
fn reservations_expire_and_deletion_leaves_running_jobs_alone() {
    let mut h = Harness::new(2);
    let r = {
        let b = on_n1(&h);
        create(&mut h, b, &root())
    }
    .unwrap();
    h.now = r.start;
    let running = submit(&mut h, member(2, 3600, "maint"), &ann()).unwrap();
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(h.ctl.jobs[&running].state, JobState::Running);
    // Submitted after the first one took n1's last room for it? No: 6 cores are left; this
    // one waits because it asks for more than is left.
    let queued = submit(&mut h, member(8, 3600, "maint"), &ann()).unwrap();
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(h.ctl.jobs[&queued].state, JobState::Queued);
    let ClientResponse::AdvanceDeleted { reservation } =
        h.call(ClientRequest::AdvanceDelete { name: "maint".into() }, &root())
    else {
        panic!()
    };
    assert_eq!((reservation.running_jobs.clone(), reservation.queued_jobs.clone()), (vec![running], vec![queued]));
    assert!(list(&mut h).is_empty());
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(h.ctl.jobs[&running].state, JobState::Running, "deleting leaves running jobs running");
    assert_eq!(h.ctl.jobs[&queued].state, JobState::Queued);
    assert!(reason(&mut h, queued).contains("no longer exists"), "{}", reason(&mut h, queued));
    // Expiry: a reservation whose window is over is removed at the next check, and survives
    // no restart.
    let mut h = h.restart();
    let body = AdvanceCreate { name: Some("short".into()), start: None, duration_secs: Some(600), ..on_n1(&h) };
    let e = create(&mut h, body.clone(), &root()).unwrap_err();
    assert!(e.message.contains(&format!("job {running} holds n1")), "{}", e.message);
    let body = AdvanceCreate { nodes: vec!["n0".into()], ..body };
    create(&mut h, body, &root()).unwrap();
    assert_eq!(list(&mut h).len(), 1);
    h.now += 601.0;
    h.ctl.check_advance(h.now).unwrap();
    assert!(h.ctl.policy.advance().is_empty());
    let h = h.restart();
    assert!(h.ctl.policy.advance().is_empty());
}

/// A suspended job outside a reservation does not resume onto cores reserved from now (its
/// own taken meanwhile, it would otherwise be moved onto the window's).
#[test]
fn a_suspended_non_member_keeps_off_a_window_when_it_resumes() {
    let mut h = Harness::new(1);
    let a = h.batch(opts(4, 36_000), &bob());
    let suspend = |h: &mut Harness, id: JobId| h.call(ClientRequest::Suspend { ids: vec![id] }, &root());
    let resume = |h: &mut Harness, id: JobId| h.call(ClientRequest::Resume { ids: vec![id] }, &root());
    let cpus = |h: &Harness, id: JobId| h.ctl.jobs[&id].allocation[0].cpus.to_list();
    assert_eq!(cpus(&h, a), "0-3");
    assert!(matches!(suspend(&mut h, a), ClientResponse::Done { ref results } if results[0].ok));
    // B takes A's cores; the other four are reserved for ann from now.
    let b = h.batch(opts(4, 36_000), &bob());
    assert_eq!(cpus(&h, b), "0-3");
    let four = AdvanceCreate {
        name: Some("now".into()),
        start: Some(h.now),
        duration_secs: Some(7200),
        cores: Some(4),
        nodes_count: Some(1),
        users: vec!["ann".into()],
        ..Default::default()
    };
    let resv = create(&mut h, four, &root()).unwrap();
    let r = resume(&mut h, a);
    let ClientResponse::Done { results } = r else { panic!("{r:?}") };
    assert!(!results[0].ok, "A (bob's, 10 h left) must not be moved into ann's window {resv:?}: {results:?}");
    assert_eq!(h.ctl.jobs[&a].state, JobState::Suspended);
    assert!(h.ctl.jobs[&a].reason.as_deref().unwrap_or("").contains("waiting"), "{:?}", h.ctl.jobs[&a].reason);
}

/// A node of 2 NUMA nodes x 4 cores with an emulated GPU on each.
fn gpu_node() -> berth_core::topology::Topology {
    let mut t = berth_core::topology::Topology::uniform(1, 2, 4, 1, 1 << 30);
    t.add_emulated_gpus(1).expect("emulated GPUs");
    t
}

fn gpu_opts(cores: u32, gpus: u32, walltime: u64) -> SubmitOptions {
    SubmitOptions { gpus: Some(gpus), ..opts(cores, walltime) }
}

/// Reservations hold GPUs: whole nodes all of theirs, `--cores --gpus` the GPUs placed with
/// the cores. Others' GPU jobs keep off the reserved GPUs though cores are free beside them;
/// members get the reserved GPUs, and no more than those.
#[test]
fn reservations_hold_gpus() {
    let mut h = Harness::with_topology(2, gpu_node());
    let body = on_n1(&h);
    let whole = create(&mut h, body, &root()).unwrap();
    assert_eq!(whole.gpus, 2);
    assert_eq!(whole.allocation[0].gpus, [0, 1]);
    let gpus = AdvanceCreate {
        name: Some("g".into()),
        start: Some(h.now),
        duration_secs: Some(7200),
        cores: Some(2),
        gpus: Some(1),
        users: vec!["ann".into()],
        ..Default::default()
    };
    let r = create(&mut h, gpus, &root()).unwrap();
    assert_eq!((r.cores, r.gpus, r.allocation[0].node.as_str()), (2, 1, "n0"), "{r:?}");
    let held = r.allocation[0].gpus[0];
    // Bob's 2-hour GPU jobs: one takes n0's other GPU; the next waits (n0's last GPU is ann's,
    // n1 is reserved from +1 h) though 6 cores of n0 are free.
    let first = h.batch(gpu_opts(1, 1, 7200), &bob());
    assert_eq!(h.ctl.jobs[&first].state, JobState::Running);
    assert_ne!(h.ctl.jobs[&first].allocation[0].gpus, [held]);
    let second = submit(&mut h, gpu_opts(1, 1, 7200), &bob()).unwrap();
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(h.ctl.jobs[&second].state, JobState::Queued);
    // Ann's member job gets the reserved GPU; a second one waits for it.
    let mine = submit(&mut h, SubmitOptions { reservation: Some("g".into()), ..gpu_opts(1, 1, 3600) }, &ann()).unwrap();
    let more = submit(&mut h, SubmitOptions { reservation: Some("g".into()), ..gpu_opts(1, 1, 3600) }, &ann()).unwrap();
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(h.ctl.jobs[&mine].state, JobState::Running);
    assert_eq!(h.ctl.jobs[&mine].allocation[0].gpus, [held]);
    assert_eq!(h.ctl.jobs[&more].state, JobState::Queued, "the reservation holds one GPU");
    // --gpus goes with --cores only.
    let body = AdvanceCreate { name: Some("x".into()), gpus: Some(1), ..on_n1(&h) };
    let e = create(&mut h, body, &root()).unwrap_err();
    assert!(e.message.contains("--gpus go with --cores"), "{}", e.message);
    // More GPUs than a node has: never.
    let big = AdvanceCreate {
        name: Some("big".into()),
        start: Some(h.now + 10.0 * HOUR),
        duration_secs: Some(600),
        cores: Some(1),
        gpus: Some(3),
        users: vec!["ann".into()],
        ..Default::default()
    };
    let e = create(&mut h, big, &root()).unwrap_err();
    assert!(e.message.contains("GPU"), "{}", e.message);
}

fn counts(items: &[(&str, u32)]) -> berth_core::gres::Counts {
    items.iter().map(|(n, c)| (n.to_string(), *c)).collect()
}

/// A reservation of cores with nvme:500 per node and 3 of the 4 matlab licenses: its members
/// use those and no more; other jobs keep off them during the window; what cannot be reserved
/// is refused saying why.
#[test]
fn reservations_hold_gres_and_licenses() {
    let mut h = Harness::with_config(2, |c| {
        c.licenses = counts(&[("matlab", 4)]);
        c.gres.insert("n[0-1]".into(), counts(&[("nvme", 800)]));
    });
    let body = AdvanceCreate {
        name: Some("lic".into()),
        start: Some(h.now),
        duration_secs: Some(7200),
        cores: Some(2),
        gres: counts(&[("nvme", 500)]),
        licenses: counts(&[("matlab", 3)]),
        users: vec!["ann".into()],
        ..Default::default()
    };
    let r = create(&mut h, body, &root()).unwrap();
    assert_eq!((r.gres.clone(), r.licenses.clone()), (counts(&[("nvme", 500)]), counts(&[("matlab", 3)])), "{r:?}");
    assert_eq!(r.allocation[0].gres, counts(&[("nvme", 500)]));
    let resv_node = r.allocation[0].node.clone();
    let with = |o: SubmitOptions, g: &[(&str, u32)], l: &[(&str, u32)]| SubmitOptions {
        gres: (!g.is_empty()).then(|| counts(g)),
        licenses: (!l.is_empty()).then(|| counts(l)),
        ..o
    };
    // Bob: 2 matlab would take reserved ones (only 1 is not held): waits, the reservation named.
    let two = submit(&mut h, with(opts(1, 3600), &[], &[("matlab", 2)]), &bob()).unwrap();
    let one = submit(&mut h, with(opts(1, 3600), &[], &[("matlab", 1)]), &bob()).unwrap();
    // 400 nvme on the reservation's node would take reserved ones; the other node has 800.
    let nvme = submit(&mut h, with(opts(1, 3600), &[("nvme", 400)], &[]), &bob()).unwrap();
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(h.ctl.jobs[&two].state, JobState::Queued);
    let why = reason(&mut h, two);
    assert!(why.contains("advance reservation lic"), "{why}");
    assert_eq!(h.ctl.jobs[&one].state, JobState::Running);
    assert_eq!(h.ctl.jobs[&nvme].state, JobState::Running);
    assert_ne!(nodes_of(&h, nvme), vec![resv_node.clone()], "nvme:400 is not free beside the reservation's 500");
    // Ann's members: more licenses than the reservation holds is refused; within it they run.
    let e = submit(&mut h, with(member(1, 3600, "lic"), &[], &[("matlab", 4)]), &ann()).unwrap_err();
    assert_eq!(e.code, ErrorCode::Infeasible);
    assert!(e.message.contains("holds 3 of license matlab"), "{}", e.message);
    let e = submit(&mut h, with(member(1, 3600, "lic"), &[("nvme", 600)], &[]), &ann()).unwrap_err();
    assert!(e.message.contains("holds at most nvme:500"), "{}", e.message);
    let mine = submit(&mut h, with(member(1, 3600, "lic"), &[("nvme", 500)], &[("matlab", 2)]), &ann()).unwrap();
    let more = submit(&mut h, with(member(1, 3600, "lic"), &[], &[("matlab", 2)]), &ann()).unwrap();
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(h.ctl.jobs[&mine].state, JobState::Running);
    assert_eq!(nodes_of(&h, mine), vec![resv_node]);
    assert_eq!(h.ctl.jobs[&more].state, JobState::Queued, "1 of the reservation's 3 is left");
    let why = reason(&mut h, more);
    assert!(why.contains("reservation lic") && why.contains("license matlab"), "{why}");
    // The member's 2 are the reservation's: all 4 are held, not 5, and bob's job 2 still waits.
    assert_eq!(h.ctl.license_info()[0].used, 3);
    assert_eq!(h.ctl.jobs[&two].state, JobState::Queued);

    // A second reservation over the window: the licenses are held by the first and bob.
    let soon = h.now + 600.0;
    let again = |name: &str, l: &[(&str, u32)]| AdvanceCreate {
        name: Some(name.into()),
        start: Some(soon),
        duration_secs: Some(600),
        cores: Some(1),
        licenses: counts(l),
        users: vec!["ann".into()],
        ..Default::default()
    };
    let e = create(&mut h, again("l2", &[("matlab", 1)]), &root()).unwrap_err();
    assert_eq!(e.code, ErrorCode::Unavailable);
    assert!(e.message.contains("license matlab"), "{}", e.message);
    for (l, want) in [(&[("matlab", 5)][..], "the cluster has 4"), (&[("ansys", 1)][..], "license ansys")] {
        let e = create(&mut h, again("l3", l), &root()).unwrap_err();
        assert_eq!(e.code, ErrorCode::Infeasible, "{e:?}");
        assert!(e.message.contains(want), "{want}: {}", e.message);
    }
    // Whole nodes hold all their generic resources; --gres goes with --cores.
    let whole = AdvanceCreate {
        name: Some("w".into()),
        start: Some(h.now + 3.0 * HOUR),
        duration_secs: Some(600),
        nodes: vec!["n1".into()],
        users: vec!["ann".into()],
        ..Default::default()
    };
    let e = create(&mut h, AdvanceCreate { gres: counts(&[("nvme", 1)]), ..whole.clone() }, &root()).unwrap_err();
    assert!(e.message.contains("--gres and --gpus go with --cores"), "{}", e.message);
    let w = create(&mut h, AdvanceCreate { licenses: counts(&[("matlab", 4)]), ..whole }, &root()).unwrap();
    assert_eq!((w.gres.clone(), w.licenses.clone()), (counts(&[("nvme", 800)]), counts(&[("matlab", 4)])));
    // Kept across a restart.
    let h = h.restart();
    let kept = h.ctl.policy.advance().get("w").unwrap();
    assert_eq!(kept.allocation[0].licenses, counts(&[("matlab", 4)]));
}

/// Issue 20: an advance reservation of licenses alone (`berth resv create -L matlab:3` without
/// nodes or cores): it holds no node, its members run on any node with its licenses (no more
/// than it holds), others get only the license it does not hold; only admins make one, the
/// licenses must be free for its window, and it survives a restart.
#[test]
fn reservations_of_licenses_alone() {
    let mut h = Harness::with_config(2, |c| c.licenses = counts(&[("matlab", 4)]));
    let now = h.now;
    let body = |name: &str, n: u32| AdvanceCreate {
        name: Some(name.into()),
        start: Some(now),
        duration_secs: Some(7200),
        licenses: counts(&[("matlab", n)]),
        users: vec!["ann".into()],
        ..Default::default()
    };
    let e = create(&mut h, body("lic", 3), &ann()).unwrap_err();
    assert_eq!(e.code, ErrorCode::NotPermitted, "{e:?}");
    let e = create(&mut h, AdvanceCreate { gpus: Some(1), ..body("lic", 3) }, &root()).unwrap_err();
    assert!(e.message.contains("go with --cores"), "{}", e.message);
    let e = create(&mut h, AdvanceCreate { licenses: counts(&[]), ..body("lic", 3) }, &root()).unwrap_err();
    assert!(e.message.contains("licenses alone"), "{}", e.message);
    let r = create(&mut h, body("lic", 3), &root()).unwrap();
    assert_eq!((r.cores, r.licenses.clone()), (0, counts(&[("matlab", 3)])), "{r:?}");
    assert!(r.allocation.iter().all(|a| a.cpus.is_empty() && a.node.is_empty()), "{r:?}");
    // Only one is left for another window over it.
    let e = create(&mut h, body("l2", 2), &root()).unwrap_err();
    assert_eq!(e.code, ErrorCode::Unavailable, "{e:?}");
    assert!(e.message.contains("license matlab"), "{}", e.message);
    let with = |o: SubmitOptions, n: u32| SubmitOptions { licenses: Some(counts(&[("matlab", n)])), ..o };
    let e = submit(&mut h, with(member(1, 3600, "lic"), 4), &ann()).unwrap_err();
    assert!(e.message.contains("holds 3 of license matlab"), "{}", e.message);
    // Members: 2 nodes' cores (the reservation holds none) and its licenses.
    let wide = SubmitOptions { nodes: Some(2), tasks_per_node: Some(2), ..with(member(1, 3600, "lic"), 2) };
    let wide = submit(&mut h, SubmitOptions { cores: None, ..wide }, &ann()).unwrap();
    let more = submit(&mut h, with(member(1, 3600, "lic"), 2), &ann()).unwrap();
    let two = submit(&mut h, with(opts(1, 3600), 2), &bob()).unwrap();
    let one = submit(&mut h, with(opts(1, 3600), 1), &bob()).unwrap();
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(h.ctl.jobs[&wide].state, JobState::Running);
    assert_eq!(nodes_of(&h, wide).len(), 2);
    assert_eq!(h.ctl.jobs[&more].state, JobState::Queued, "1 of the reservation's 3 is left");
    let why = reason(&mut h, more);
    assert!(why.contains("reservation lic") && why.contains("license matlab"), "{why}");
    assert_eq!(h.ctl.jobs[&one].state, JobState::Running);
    assert_eq!(h.ctl.jobs[&two].state, JobState::Queued);
    assert!(reason(&mut h, two).contains("advance reservation lic"), "{}", reason(&mut h, two));
    assert_eq!(h.ctl.license_info()[0].used, 3);
    let mut h = h.restart();
    assert_eq!(list(&mut h)[0].licenses, counts(&[("matlab", 3)]));
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(h.ctl.jobs[&two].state, JobState::Queued);
}
