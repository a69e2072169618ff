use super::*;
use crate::testkit::*;
use berth_core::directives::SubmitOptions;
use berth_core::job::JobOutcome;
use berth_protocol::agent::AgentMessage;
use berth_protocol::client::{ClientRequest, ClientResponse};
use berth_protocol::user::UserIdentity;

const MIB: u64 = 1 << 20;

fn root() -> Peer {
    Peer { user: UserIdentity { uid: 0, gid: 0, groups: vec![0], name: "root".into() }, conn: 9 }
}

fn job(cores: u32, mem_mib: u64) -> SubmitOptions {
    SubmitOptions { cores: Some(cores), mem: Some(mem_mib * MIB), walltime: Some(600), ..Default::default() }
}

fn done(r: ClientResponse) -> IdResult {
    match r {
        ClientResponse::Done { mut results } if results.len() == 1 => results.pop().unwrap(),
        other => panic!("not one result: {other:?}"),
    }
}

fn suspend(h: &mut Harness, id: JobId) -> IdResult {
    done(h.call(ClientRequest::Suspend { ids: vec![id] }, &root()))
}

fn resume(h: &mut Harness, id: JobId) -> IdResult {
    done(h.call(ClientRequest::Resume { ids: vec![id] }, &root()))
}

fn cpus(h: &Harness, id: JobId) -> String {
    h.ctl.jobs[&id].allocation[0].cpus.to_list()
}

fn free_pus(h: &Harness) -> String {
    h.ctl.cluster.nodes()[0].free_pus.to_list()
}

/// Memory claimed on node 0, per NUMA node, MiB.
fn numa_used(h: &Harness) -> Vec<u64> {
    let n = &h.ctl.cluster.nodes()[0];
    n.topology.numa_nodes.iter().zip(&n.numa_free).map(|(t, f)| (t.memory_bytes - f) / MIB).collect()
}

fn ended(id: JobId) -> AgentMessage {
    AgentMessage::JobEnded { id, outcome: JobOutcome { exit_code: Some(0), ..Default::default() } }
}

#[test]
fn suspend_frees_the_cores_but_keeps_the_memory() {
    let mut h = Harness::new(1);
    let a = h.batch(job(4, 512), &ann());
    assert_eq!((cpus(&h, a), numa_used(&h)), ("0-3".into(), vec![512, 0]));
    h.sent();
    let r = suspend(&mut h, a);
    assert!(r.ok, "{r:?}");
    let j = &h.ctl.jobs[&a];
    assert_eq!(j.state, JobState::Suspended);
    assert_eq!(j.suspension.since, Some(h.now));
    assert!(j.suspension.by_admin);
    assert!(j.reason.as_deref().unwrap_or("").contains("suspended by admin root"), "{:?}", j.reason);
    assert_eq!(h.sent(), vec![(0, ControllerMessage::Suspend { id: a })]);
    assert_eq!(free_pus(&h), "0-7", "the suspended job's PUs are free");
    assert_eq!(numa_used(&h), vec![512, 0], "its memory stays claimed on its NUMA node");
    // A job needing the whole node starts on the suspended job's cores.
    let b = h.batch(job(8, 256), &ann());
    assert_eq!(cpus(&h, b), "0-7");
    assert_eq!(numa_used(&h).iter().sum::<u64>(), 512 + 256, "both jobs' memory is counted");
    let info = h.ctl.job_info(&h.ctl.jobs[&a]);
    assert_eq!((info.state, info.suspended_seconds.is_some()), (JobState::Suspended, true));
    // Suspending again is fine; a queued job cannot be suspended.
    assert!(suspend(&mut h, a).ok);
    let c = {
        let sub = berth_protocol::client::SubmitRequest {
            script: "#!/bin/sh\ntrue\n".into(),
            script_name: "c.sh".into(),
            options: job(8, 64),
            env: vec![],
            cwd: "/tmp".into(),
            hold: false,
            ignore_unsupported: false,
        };
        match h.call(ClientRequest::Submit(Box::new(sub)), &ann()) {
            ClientResponse::Submitted { id } => id,
            other => panic!("{other:?}"),
        }
    };
    let r = suspend(&mut h, c);
    assert_eq!(r.error.map(|e| e.code), Some(ErrorCode::InvalidState));
}

#[test]
fn resume_in_place_when_its_cores_are_free() {
    let mut h = Harness::new(1);
    let a = h.batch(job(4, 512), &ann());
    suspend(&mut h, a);
    h.sent();
    h.now += 30.0;
    assert!(resume(&mut h, a).ok);
    assert_eq!(h.sent(), vec![(0, ControllerMessage::Resume { id: a, allocation: None })]);
    let j = &h.ctl.jobs[&a];
    assert_eq!((j.state, j.reason.clone(), cpus(&h, a)), (JobState::Running, None, "0-3".to_string()));
    assert_eq!((j.suspension.total_secs, j.suspension.since, j.suspension.count), (30.0, None, 1));
    assert_eq!(free_pus(&h), "4-7");
    assert_eq!(numa_used(&h), vec![512, 0]);
    assert_eq!(h.ctl.job_info(j).suspended_seconds, Some(30.0));
    // The walltime is pushed back by the time suspended.
    assert_eq!(j.expected_end(1e9), j.start_time.unwrap() + 600.0 + 30.0);
    h.agent(0, AgentMessage::Resumed { id: a, error: None, cgroups: vec![] });
    assert!(h.ctl.jobs[&a].suspension.resuming.is_none());
    // Resuming a running job is refused.
    assert_eq!(resume(&mut h, a).error.map(|e| e.code), Some(ErrorCode::InvalidState));
}

#[test]
fn resume_moves_to_other_cores_when_its_own_are_taken() {
    let mut h = Harness::new(1);
    let a = h.batch(job(4, 512), &ann());
    suspend(&mut h, a);
    let b = h.batch(job(2, 64), &bob());
    assert_eq!(cpus(&h, b), "0-1", "the new job took part of the suspended job's cores");
    h.sent();
    assert!(resume(&mut h, a).ok);
    let sent = h.sent();
    let [(0, ControllerMessage::Resume { id, allocation: Some(to) })] = &sent[..] else {
        panic!("not one resume with an allocation: {sent:?}")
    };
    assert_eq!(*id, a);
    // Its own free cores 2-3 first, then cores of the other NUMA node: half its memory follows
    // the 2 cores there.
    assert_eq!((to.cpus.to_list(), to.cores, to.mems.to_list()), ("2-5".into(), 4, "0-1".into()));
    assert_eq!(cpus(&h, a), "2-5", "the job's allocation is rewritten");
    assert_eq!(free_pus(&h), "6-7");
    assert_eq!(numa_used(&h), vec![256 + 64, 256]);
    // Written: a restart sees the moved allocation.
    let stored = h.ctl.store.get_job(a).unwrap().unwrap();
    assert_eq!((stored.state, stored.allocation[0].cpus.to_list()), (JobState::Running, "2-5".into()));
    // The agent reports the cgroup as the kernel holds it now.
    let report = berth_protocol::agent::CgroupReport {
        path: "berth/n0/job_1".into(),
        cpus: "2-5".into(),
        mems: "0".into(),
        rank: None,
    };
    h.agent(0, AgentMessage::Resumed { id: a, error: None, cgroups: vec![report] });
    let info = h.ctl.job_info(&h.ctl.jobs[&a]);
    assert_eq!(info.cgroups.iter().map(|c| c.cpus.as_str()).collect::<Vec<_>>(), ["2-5"]);
}

#[test]
fn resume_waits_with_a_reason_and_happens_by_itself_later() {
    let mut h = Harness::new(1);
    let a = h.batch(job(4, 512), &ann());
    suspend(&mut h, a);
    let b = h.batch(job(6, 64), &bob());
    h.sent();
    let r = resume(&mut h, a);
    let e = r.error.expect("not resumed now");
    assert_eq!(e.code, ErrorCode::Unavailable);
    assert!(e.message.contains("waiting for 4 cores on n0 to resume (2 free)"), "{}", e.message);
    assert!(h.sent().is_empty());
    let j = &h.ctl.jobs[&a];
    assert_eq!(j.state, JobState::Suspended);
    assert_eq!(j.reason.as_deref(), Some("suspended: waiting for 4 cores on n0 to resume (2 free)"));
    assert!(!j.suspension.by_admin, "berth resume lifted the admin's suspension");
    assert!(h.ctl.resume_waiting(h.now).unwrap().is_empty());
    // B ends: the pass's first step resumes A on its own cores.
    h.agent(0, ended(b));
    h.sent();
    assert_eq!(h.ctl.resume_waiting(h.now).unwrap(), vec![a]);
    assert_eq!(h.ctl.jobs[&a].state, JobState::Running);
    assert_eq!(h.sent(), vec![(0, ControllerMessage::Resume { id: a, allocation: None })]);
}

/// What `berth show` gives of job `id`'s reason: its words and its code.
fn shown_reason(h: &mut Harness, id: JobId) -> (Option<String>, Option<String>) {
    let ClientResponse::Job { job } = h.call(ClientRequest::ShowJob { id }, &ann()) else { panic!("no job {id}") };
    (job.reason, job.reason_code)
}

fn words_and_code(words: &str, code: Option<&str>) -> (Option<String>, Option<String>) {
    (Some(words.to_string()), code.map(str::to_string))
}

/// A suspended job's reason is typed: shown with its words and its code, also after a restart
/// (what suspended it read back from the words its row keeps; what it waits for known again
/// at the next resume).
#[test]
fn a_suspended_jobs_reason_has_a_code_also_after_a_restart() {
    let mut h = Harness::new(1);
    let a = h.batch(job(4, 512), &ann());
    let r = suspend(&mut h, a);
    assert!(r.ok, "{r:?}");
    let by_admin = "suspended by admin root: `berth resume` resumes it";
    assert_eq!(shown_reason(&mut h, a), words_and_code(by_admin, Some("SuspendedByAdmin")));
    // A job takes 6 of the 8 cores, A's among them: A cannot resume.
    h.batch(job(6, 64), &bob());
    let e = resume(&mut h, a).error.expect("not resumed now");
    assert!(e.message.contains("waiting for 4 cores on n0 to resume (2 free)"), "{}", e.message);
    let waiting = "suspended: waiting for 4 cores on n0 to resume (2 free)";
    assert_eq!(shown_reason(&mut h, a), words_and_code(waiting, Some("Resources")));
    // B takes the last 2 cores and is preempted.
    let b = h.batch(job(2, 64), &ann());
    h.now += 1.0;
    assert!(h.ctl.suspend_job(b, h.now, SuspendBy::Policy("preempted by job 9".into())).unwrap().is_ok());
    let preempted = words_and_code("suspended: preempted by job 9", Some("Preempted"));
    assert_eq!(shown_reason(&mut h, b), preempted);

    let mut h = h.restart();
    assert_eq!(shown_reason(&mut h, b), preempted, "its cause read back");
    assert_eq!(shown_reason(&mut h, a), words_and_code(waiting, None), "a wait alone: no code until a resume is tried");
    // A waits (2 cores free: B's), B resumes on its own cores.
    assert_eq!(h.ctl.resume_waiting(h.now).unwrap(), vec![b]);
    assert_eq!(shown_reason(&mut h, a), words_and_code(waiting, Some("Resources")));
    assert_eq!(shown_reason(&mut h, b), (None, None));
}

#[test]
fn pass_suspensions_resume_by_themselves_admin_ones_do_not() {
    let mut h = Harness::new(1);
    let a = h.batch(job(2, 64), &ann());
    let b = h.batch(job(2, 64), &ann());
    h.now += 1.0;
    let by_pass = SuspendBy::Policy("preempted by job 9".into());
    assert!(h.ctl.suspend_job(a, h.now, by_pass).unwrap().is_ok());
    assert!(h.ctl.suspend_job(b, h.now, SuspendBy::Admin("root".into())).unwrap().is_ok());
    assert_eq!(h.ctl.jobs[&a].reason.as_deref(), Some("suspended: preempted by job 9"));
    h.now += 5.0;
    assert_eq!(h.ctl.resume_waiting(h.now).unwrap(), vec![a]);
    assert_eq!(h.ctl.jobs[&b].state, JobState::Suspended);
    assert_eq!(h.ctl.suspended_seconds(a, h.now), 5.0);
    assert_eq!(h.ctl.suspended_seconds(b, h.now + 10.0), 15.0);
}

#[test]
fn only_admins_suspend_and_resume() {
    let mut h = Harness::new(1);
    let a = h.batch(job(2, 64), &ann());
    for req in [ClientRequest::Suspend { ids: vec![a] }, ClientRequest::Resume { ids: vec![a] }] {
        match h.call(req, &ann()) {
            ClientResponse::Error(e) => {
                assert_eq!(e.code, ErrorCode::NotPermitted);
                assert!(e.message.contains("only admins"), "{}", e.message);
            }
            other => panic!("not refused: {other:?}"),
        }
    }
    assert_eq!(h.ctl.jobs[&a].state, JobState::Running);
    let missing = done(h.call(ClientRequest::Suspend { ids: vec![JobId(99)] }, &root()));
    assert_eq!(missing.error.map(|e| e.code), Some(ErrorCode::UnknownJob));
}

#[test]
fn a_suspended_job_is_signalled_cancelled_and_frees_only_its_memory() {
    let mut h = Harness::new(1);
    let a = h.batch(job(4, 512), &ann());
    suspend(&mut h, a);
    let b = h.batch(job(8, 64), &bob());
    h.sent();
    // Signals reach it (they act when it resumes).
    let r = done(h.call(ClientRequest::Signal { job: a, step: None, signal: 10 }, &ann()));
    assert!(r.ok, "{r:?}");
    assert_eq!(h.sent(), vec![(0, ControllerMessage::Signal { id: a, step: None, signal: 10 })]);
    // Its owner cancels it: the agent thaws and kills it, and reports its end.
    assert!(done(h.call(ClientRequest::Cancel { ids: vec![a], only: vec![] }, &ann())).ok);
    assert_eq!(h.sent(), vec![(0, ControllerMessage::Kill { id: a, reason: "cancelled".into() })]);
    assert!(h.ctl.resume_waiting(h.now).unwrap().is_empty(), "an ending job is not resumed");
    h.now += 12.0;
    h.agent(
        0,
        AgentMessage::JobEnded {
            id: a,
            outcome: JobOutcome { reason: Some("cancelled".into()), ..Default::default() },
        },
    );
    assert!(!h.ctl.jobs.contains_key(&a));
    assert_eq!(free_pus(&h), "", "B's PUs stay taken");
    assert_eq!(numa_used(&h).iter().sum::<u64>(), 64, "only B's memory is left");
    let done_a = h.ctl.store.get_job(a).unwrap().unwrap();
    assert_eq!(done_a.state, JobState::Cancelled);
    assert_eq!(done_a.info(h.now).suspended_seconds, Some(12.0), "suspended until its end");
    h.agent(0, ended(b));
    assert_eq!((free_pus(&h), numa_used(&h)), ("0-7".into(), vec![0, 0]));
}

#[test]
fn restart_keeps_the_suspension_and_its_totals() {
    let mut h = Harness::new(1);
    let a = h.batch(job(4, 512), &ann());
    let start = h.ctl.jobs[&a].start_time.unwrap();
    suspend(&mut h, a);
    let mut h = h.restart();
    let j = &h.ctl.jobs[&a];
    assert_eq!(j.state, JobState::Suspended);
    assert_eq!((j.suspension.since, j.suspension.by_admin, j.suspension.count), (Some(h.now), true, 1));
    assert_eq!(free_pus(&h), "0-7", "a reloaded suspended job holds no PUs");
    assert_eq!(numa_used(&h), vec![512, 0], "but its memory");
    h.now += 40.0;
    assert!(resume(&mut h, a).ok);
    h.now += 5.0;
    suspend(&mut h, a);
    h.now += 15.0;
    assert!(resume(&mut h, a).ok);
    let h = h.restart();
    let j = &h.ctl.jobs[&a];
    assert_eq!((j.state, j.suspension.total_secs, j.suspension.count), (JobState::Running, 55.0, 2));
    assert_eq!(j.expected_end(1e9), start + 600.0 + 55.0);
    assert_eq!(free_pus(&h), "4-7");
}

#[test]
fn a_failed_resume_suspends_the_job_again() {
    let mut h = Harness::new(2);
    let a = h.batch(SubmitOptions { nodes: Some(2), cores: Some(4), ..job(4, 64) }, &ann());
    assert_eq!(h.ctl.jobs[&a].allocation.len(), 2);
    suspend(&mut h, a);
    let b = h.batch(SubmitOptions { nodes: Some(1), ..job(2, 64) }, &bob());
    let b_node = h.ctl.jobs[&b].allocation[0].node_id.0 as usize;
    h.sent();
    h.now += 10.0;
    assert!(resume(&mut h, a).ok);
    let sent = h.sent();
    let moved: Vec<usize> = sent
        .iter()
        .filter(|(_, m)| matches!(m, ControllerMessage::Resume { allocation: Some(_), .. }))
        .map(|(n, _)| *n)
        .collect();
    assert_eq!(moved, vec![b_node], "only the part whose cores were taken moves: {sent:?}");
    let moved_cpus = h.ctl.jobs[&a].allocation.iter().find(|p| p.node_id.0 as usize == b_node).unwrap().cpus.clone();
    h.now += 1.0;
    h.agent(
        b_node,
        AgentMessage::Resumed { id: a, error: Some("cannot move: kernel said no".into()), cgroups: vec![] },
    );
    let j = &h.ctl.jobs[&a];
    assert_eq!(j.state, JobState::Suspended);
    assert!(j.reason.as_deref().unwrap_or("").contains("kernel said no"), "{:?}", j.reason);
    assert_eq!(j.suspension.since, Some(h.now - 11.0), "the suspension goes on from its start");
    assert_eq!(j.suspension.total_secs, 0.0);
    let resent: Vec<usize> =
        h.sent().into_iter().filter(|(_, m)| *m == ControllerMessage::Suspend { id: a }).map(|(n, _)| n).collect();
    assert_eq!(resent, vec![0, 1], "frozen again everywhere");
    assert_eq!(h.ctl.cluster.nodes()[b_node].free_pus.len(), 6, "its PUs are given back");
    // The next resume sends the moved node its part as recorded.
    assert!(resume(&mut h, a).ok);
    let again = h.sent();
    let to_b = again.iter().find(|(n, _)| *n == b_node).map(|(_, m)| m.clone());
    let Some(ControllerMessage::Resume { allocation: Some(to), .. }) = to_b else { panic!("{again:?}") };
    assert_eq!(to.cpus, moved_cpus);
}

#[test]
fn a_reconnected_agent_is_told_again_and_a_disconnected_one_blocks_suspension() {
    let mut h = Harness::new(1);
    let a = h.batch(job(2, 64), &ann());
    let tx = h.ctl.extra[0].agent().cloned().unwrap();
    h.ctl.extra[0].disconnect();
    let r = suspend(&mut h, a);
    assert_eq!(
        r.error.map(|e| e.code),
        Some(ErrorCode::Unavailable),
        "a job is not suspended where it cannot be frozen"
    );
    assert_eq!(h.ctl.jobs[&a].state, JobState::Running);
    let heard = h.ctl.extra[0].last_heard();
    h.ctl.extra[0].connect(1, tx.clone(), heard);
    assert!(suspend(&mut h, a).ok);
    h.sent();
    // The same agent process registers again (the connection dropped): the suspend may have
    // been lost with it, so it is sent again.
    h.ctl.handle_register(registration(0, "inst0", vec![a]), 1, tx, h.now).unwrap();
    let sent = h.sent();
    assert!(sent.contains(&(0, ControllerMessage::Suspend { id: a })), "{sent:?}");
    assert!(!sent.iter().any(|(_, m)| matches!(m, ControllerMessage::Kill { .. })), "not killed: {sent:?}");
    assert_eq!(h.ctl.jobs[&a].state, JobState::Suspended);
}

/// Resumed on the other NUMA node's CPUs, by an admin or by the pass itself, a job's memory
/// nodes follow its CPUs (the agent migrates the pages) and so do the per-NUMA books; a job
/// that started meanwhile keeps its own memory where it is.
#[test]
fn resume_on_other_numa_node_moves_the_memory_and_the_books() {
    for by_admin in [true, false] {
        let mut h = Harness::new(1);
        let a = h.batch(job(4, 512), &ann());
        assert_eq!((cpus(&h, a), h.ctl.jobs[&a].allocation[0].mems.to_list()), ("0-3".into(), "0".into()));
        let x = h.batch(job(4, 64), &bob());
        h.now += 1.0;
        assert!(h.ctl.suspend_job(a, h.now, SuspendBy::Admin("root".into())).unwrap().is_ok());
        let b = h.batch(job(4, 64), &bob());
        assert_eq!(cpus(&h, b), "0-3", "the new job took the suspended job's cores");
        if !by_admin {
            // As if the pass had suspended it for B (preemption): the pass resumes it.
            h.ctl.jobs.get_mut(&a).unwrap().suspension.by_admin = false;
        }
        h.agent(0, ended(x));
        assert_eq!(numa_used(&h), vec![512 + 64, 0]);
        h.sent();
        if by_admin {
            assert!(resume(&mut h, a).ok);
        } else {
            assert_eq!(h.ctl.resume_waiting(h.now).unwrap(), vec![a]);
        }
        let sent = h.sent();
        let [(0, ControllerMessage::Resume { allocation: Some(to), .. })] = &sent[..] else {
            panic!("not one resume with an allocation: {sent:?}")
        };
        assert_eq!((to.cpus.to_list(), to.mems.to_list()), ("4-7".into(), "1".into()), "memory nodes follow");
        assert_eq!(to.numa_memory, vec![berth_core::job::NumaShare { numa: 1, bytes: 512 * MIB }]);
        assert_eq!(h.ctl.jobs[&a].allocation[0], *to, "the record is what the agent was sent");
        assert_eq!(numa_used(&h), vec![64, 512], "the books moved with it");
        let q = berth_protocol::client::EventQuery { job: Some(a), kinds: vec!["resume".into()], ..Default::default() };
        let event = h.ctl.store.events(&q).unwrap().pop();
        assert!(event.as_ref().is_some_and(|e| e.detail.contains("memory nodes 0 -> 1")), "{event:?}");
        // When it ends, exactly its memory comes back.
        h.agent(0, ended(a));
        assert_eq!(numa_used(&h), vec![64, 0]);
    }
}
