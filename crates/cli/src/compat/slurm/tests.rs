use super::*;

fn args(s: &[&str]) -> Vec<String> {
    s.iter().map(|x| x.to_string()).collect()
}

pub(crate) fn job(id: u64, name: &str, user: &str, state: &str) -> JobInfo {
    serde_json::from_value(serde_json::json!({
        "id": id, "name": name, "user": user, "uid": 1000, "gid": 1000, "state": state,
        "queue": "batch", "request": {"nodes": null, "cores": 2, "tasks_per_node": null,
        "cpus_per_task": null, "mem_per_node": null, "mem_per_cpu": null, "threads": false},
        "walltime_seconds": 3600, "submit_time": 1000.0, "start_time": null, "end_time": null,
        "allocation": [], "exit_code": null, "signal": null, "reason": null,
        "cwd": "/home/ann", "stdout": "/home/ann/o", "stderr": "/home/ann/e", "accounting": null,
        "account": "physics"
    }))
    .unwrap()
}

pub(crate) fn running(id: u64, nodes: &[&str], start: f64) -> JobInfo {
    let mut j = job(id, "sim", "ann", "running");
    j.start_time = Some(start);
    j.allocation = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            serde_json::from_value(serde_json::json!({
                "node_id": i, "node": n, "cpus": "0-1", "cores": 2, "mems": "0", "memory_bytes": 1 << 20
            }))
            .unwrap()
        })
        .collect();
    j
}

#[test]
fn sbatch_options_mean_what_their_directives_mean() {
    let p = sbatch_plan(&args(&["-N", "2", "--ntasks=6", "-t", "1:00", "--mem=64", "-c2", "job.sh"])).unwrap();
    assert_eq!(p.options.nodes, Some(2));
    assert_eq!(p.options.tasks_per_node, Some(3), "-n 6 over 2 nodes");
    assert_eq!(p.options.cpus_per_task, Some(2));
    assert_eq!(p.options.walltime, Some(60), "a Slurm time M:S");
    assert_eq!(p.options.mem, Some(64 << 20), "a bare --mem is megabytes");
    assert_eq!(p.script.as_deref(), Some("job.sh"));
    let p = sbatch_plan(&args(&["-n", "4", "--time=2-00:00:00"])).unwrap();
    assert_eq!(p.options.cores, Some(4));
    assert_eq!(p.options.walltime, Some(2 * 86_400));
    assert_eq!(p.script, None, "no script: standard input");
}

#[test]
fn sbatch_own_options() {
    let p = sbatch_plan(&args(&[
        "--parsable",
        "-J",
        "my job",
        "-o",
        "out-%j.txt",
        "-e",
        "err-%x.txt",
        "-p",
        "debug",
        "-A",
        "physics",
        "-H",
        "-D",
        "/tmp",
        "--export=ALL,FOO=bar",
        "--wrap",
        "echo hi",
    ]))
    .unwrap();
    assert!(p.parsable && p.hold);
    assert_eq!(p.flags.name.as_deref(), Some("my job"));
    assert_eq!(p.flags.output.as_deref(), Some("out-%j.txt"));
    assert_eq!(p.flags.error.as_deref(), Some("err-%x.txt"));
    assert_eq!(p.flags.queue.as_deref(), Some("debug"));
    assert_eq!(p.flags.account.as_deref(), Some("physics"));
    assert_eq!(p.options.chdir.as_deref(), Some("/tmp"));
    assert_eq!(
        p.options.export,
        Some(berth_core::directives::Export { all: true, vars: vec![("FOO".into(), Some("bar".into()))] })
    );
    assert_eq!(p.wrap.as_deref(), Some("echo hi"));
    assert!(sbatch_plan(&args(&["--version"])).unwrap().info.unwrap().starts_with("slurm "));
}

#[test]
fn sbatch_takes_what_submitit_writes() {
    // submitit's scripts: --open-mode=append, --wckey (accounting only, as Slurm without
    // TrackWCKey), --signal=USR2@90; dask-jobqueue's -o name-%J.out.
    let p =
        sbatch_plan(&args(&["--open-mode=append", "--wckey=submitit", "--signal=USR2@90", "-o", "w-%J.out", "x.sh"]))
            .unwrap();
    assert_eq!(p.options.open_append, Some(true));
    assert!(p.warnings.is_empty(), "{:?}", p.warnings);
    assert_eq!(sbatch_plan(&args(&["--open-mode=truncate", "x.sh"])).unwrap().options.open_append, Some(false));
    assert!(sbatch_plan(&args(&["--open-mode=sideways", "x.sh"])).unwrap_err().contains("append or truncate"));
    assert!(sbatch_plan(&args(&["--wckey=", "x.sh"])).is_err());
}

#[test]
fn sbatch_refuses_by_name_what_it_cannot_do() {
    let e = sbatch_plan(&args(&["--bogus", "x.sh"])).unwrap_err();
    assert_eq!(e, "unrecognized option '--bogus'");
    let e = sbatch_plan(&args(&["--licenses=lic@db", "x.sh"])).unwrap_err();
    assert!(
        e.contains("--licenses=lic@db") && e.contains("not supported") && e.contains("--ignore-unsupported"),
        "{e}"
    );
    let e = sbatch_plan(&args(&["--mail-type=TIME_LIMIT_50", "x.sh"])).unwrap_err();
    assert!(e.contains("TIME_LIMIT_50"), "{e}");
    // GPUs and other generic resources are read (issue 20), typed ones too, licenses too.
    let p = sbatch_plan(&args(&["--gres=gpu:a100:2,nvme:10", "-L", "matlab:2", "x.sh"])).unwrap();
    assert_eq!((p.options.gpus_per_node, p.options.gpu_type.as_deref()), (Some(2), Some("a100")));
    assert_eq!(p.options.gres.as_ref().map(|g| g["nvme"]), Some(10));
    assert_eq!(p.options.licenses.as_ref().map(|l| l["matlab"]), Some(2));
    let p = sbatch_plan(&args(&["--gres=nvme:fast:10", "x.sh"])).unwrap();
    assert_eq!(p.options.gres.as_ref().map(|g| g["nvme:fast"]), Some(10));
    let e = sbatch_plan(&args(&["-o", "out-%5j.txt", "x.sh"])).unwrap_err();
    assert!(e.contains("%j"), "{e}");
    let e = sbatch_plan(&args(&["-t", "soon", "x.sh"])).unwrap_err();
    assert!(e.starts_with("--time"), "{e}");
    let e = sbatch_plan(&args(&["x.sh", "arg1"])).unwrap_err();
    assert!(e.contains("arg1"), "{e}");
    let none = sbatch_plan(&args(&["--export=NONE,FOO=bar", "x.sh"])).unwrap();
    assert_eq!(none.options.export.map(|e| e.all), Some(false));
    assert!(sbatch_plan(&args(&["-J", "a\"b", "-N", "1\"", "x.sh"])).is_err(), "a quote in a directive value");
    // With --ignore-unsupported: warnings, and the rest still applies.
    let p =
        sbatch_plan(&args(&["--ignore-unsupported", "--licenses=lic@db", "--mcs-label=w", "-N", "3", "x.sh"])).unwrap();
    assert_eq!(p.warnings.len(), 2, "{:?}", p.warnings);
    assert!(p.warnings[0].starts_with("--licenses=lic@db"), "{:?}", p.warnings);
    assert_eq!(p.options.nodes, Some(3));
    assert!(p.flags.ignore_unsupported);
}

#[test]
fn squeue_default_table_is_slurms() {
    let q = squeue_query(&[]).unwrap();
    let mut pending = job(3, "a-very-long-name", "annabelle_smith", "queued");
    pending.reason = Some("resources: waiting for cores or memory to free up".into());
    let jobs = vec![running(2, &["node1", "node2", "node3"], 1000.0), pending, job(4, "h", "bob", "held")];
    let t = squeue_table(&q, &jobs, 1065.0);
    let lines: Vec<&str> = t.lines().collect();
    assert_eq!(lines[0], "             JOBID PARTITION     NAME     USER ST       TIME  NODES NODELIST(REASON)");
    assert_eq!(lines[1], "                 2     batch      sim      ann  R       1:05      3 node[1-3]");
    assert_eq!(lines[2], "                 3     batch a-very-l annabell PD       0:00      1 (Resources)");
    assert_eq!(lines[3], "                 4     batch        h      bob PD       0:00      1 (JobHeldUser)");
    // Parsed as scripts parse it: whitespace-separated fields.
    for l in &lines[1..] {
        assert_eq!(l.split_whitespace().count(), 8, "{l}");
    }
}

#[test]
fn squeue_formats_filters_and_states() {
    let q = squeue_query(&args(&["-h", "-o", "%i %t %j %u %P %D %C %l %N %T %a"])).unwrap();
    assert!(!q.header);
    let t = squeue_table(&q, &[running(7, &["n1"], 0.0)], 10.0);
    assert_eq!(t, "7 R sim ann batch 1 2 1:00:00 n1 RUNNING physics\n");
    let q = squeue_query(&args(&["-o", "%.5i|%4t|%10j|"])).unwrap();
    let t = squeue_table(&q, &[job(12, "x", "a", "queued")], 0.0);
    assert_eq!(t, "JOBID|ST  |NAME      |\n   12|PD  |x         |\n");
    assert!(squeue_query(&args(&["-o", "%i %y"])).unwrap_err().contains("%y"));
    assert!(squeue_query(&args(&["-t", "bogus"])).is_err());
    assert!(squeue_query(&args(&["--bogus"])).unwrap_err().contains("--bogus"));

    let q = squeue_query(&args(&["-u", "ann,bob", "-n", "sim", "-t", "R,PD", "-p", "batch"])).unwrap();
    assert!(q.keeps(&running(1, &["n1"], 0.0)));
    assert!(!q.keeps(&job(2, "sim", "eve", "queued")), "user");
    assert!(!q.keeps(&job(3, "other", "ann", "queued")), "name");
    assert!(!q.keeps(&job(4, "sim", "ann", "completed")), "state");
    // By default: no finished jobs; asked by id: any state.
    let q = squeue_query(&[]).unwrap();
    assert!(!q.keeps(&job(5, "x", "a", "completed")) && q.keeps(&job(5, "x", "a", "suspended")));
    let q = squeue_query(&args(&["-j", "5,6"])).unwrap();
    assert!(q.keeps(&job(5, "x", "a", "completed")) && !q.keeps(&job(7, "x", "a", "queued")));
    assert!(q.wants_finished());
    let q = squeue_query(&args(&["-t", "all"])).unwrap();
    assert!(q.keeps(&job(5, "x", "a", "cancelled")));
}

#[test]
fn squeue_state_codes() {
    let code = |state: &str, reason: Option<&str>| {
        let mut j = job(1, "x", "a", state);
        j.reason = reason.map(String::from);
        f::slurm_state(&j).0
    };
    assert_eq!(code("queued", None), "PD");
    assert_eq!(code("held", None), "PD");
    assert_eq!(code("running", None), "R");
    assert_eq!(code("running", Some("ending: cancelled")), "CG");
    assert_eq!(code("suspended", None), "S");
    assert_eq!(code("completed", None), "CD");
    assert_eq!(code("failed", None), "F");
    assert_eq!(code("failed", Some("oom")), "OOM");
    assert_eq!(code("cancelled", None), "CA");
    assert_eq!(code("timeout", None), "TO");
    assert_eq!(code("node_fail", None), "NF");
}

#[test]
fn squeue_escapes_what_users_wrote() {
    let q = squeue_query(&args(&["-h", "-o", "%i %j"])).unwrap();
    let t = squeue_table(&q, &[job(1, "x\n2 forged\u{1b}]0;t\u{7}", "a", "queued")], 0.0);
    assert_eq!(t.lines().count(), 1, "{t:?}");
    assert!(!t.contains('\u{1b}'), "{t:?}");
}

#[test]
fn scancel_reads_ids_and_filters() {
    let q = scancel_query(&args(&["5", "6.server", "-s", "USR1"])).unwrap();
    assert_eq!(q.ids, vec![JobId(5), JobId(6)]);
    assert_eq!(q.signal, Some(libc::SIGUSR1));
    assert!(!q.has_filter());
    let q = scancel_query(&args(&["-u", "ann", "-n", "sim", "-t", "PENDING"])).unwrap();
    assert!(q.has_filter() && q.ids.is_empty());
    assert!(q.filter.keeps(&job(1, "sim", "ann", "queued")));
    assert!(!q.filter.keeps(&running(2, &["n1"], 0.0)));
    assert!(scancel_query(&args(&["abc"])).unwrap_err().contains("abc"));
    let q = scancel_query(&args(&["5_3", "7"])).unwrap();
    assert_eq!((q.ids, q.tasks), (vec![JobId(7)], vec![(JobId(5), 3)]), "A_i: a task, looked up");
    assert!(scancel_query(&args(&["5_x"])).is_err());
    assert!(scancel_query(&args(&["-s", "NOPE", "5"])).is_err());
}

fn node(name: &str, state: &str, alloc: usize) -> NodeInfo {
    serde_json::from_value(serde_json::json!({
        "id": 0, "name": name, "state": state, "address": "a", "sockets": 2, "cores": 4, "pus": 8,
        "topology": "SCTTCTT", "free": "S", "cpus_allocated": alloc, "memory_bytes": 4u64 << 30,
        "memory_allocated_bytes": 0, "real_cpus": "0", "jobs": [], "last_heard_seconds_ago": null, "numa": []
    }))
    .unwrap()
}

fn queue(name: &str, max_wall: Option<u64>, enabled: bool) -> QueueInfo {
    QueueInfo {
        spec: berth_core::sched::queue::QueueSpec {
            name: name.into(),
            max_walltime_secs: max_wall,
            enabled,
            ..Default::default()
        },
        priority_factor: 0.0,
        queued: 0,
        held: 0,
        running: 0,
        running_cores: 0,
    }
}

#[test]
fn sinfo_summarises_partitions_by_node_state() {
    let nodes =
        vec![node("node1", "up", 0), node("node2", "up", 0), node("node3", "up", 8), node("node4", "draining", 2)];
    let queues = vec![queue("batch", None, true), queue("long", Some(7 * 86_400), false)];
    let t = sinfo_table(&sinfo_query(&[]).unwrap(), &queues, &nodes);
    let lines: Vec<&str> = t.lines().collect();
    assert_eq!(lines[0], "PARTITION AVAIL  TIMELIMIT  NODES  STATE NODELIST");
    assert_eq!(lines[1], "batch*       up   infinite      2   idle node[1-2]");
    assert_eq!(lines[2], "batch*       up   infinite      1  alloc node3");
    assert_eq!(lines[3], "batch*       up   infinite      1  drain node4");
    assert_eq!(lines[5], "long      drain 7-00:00:00      1  alloc node3");
    assert_eq!(lines.len(), 1 + 6);

    let t = sinfo_table(&sinfo_query(&args(&["-N", "-h", "-p", "batch"])).unwrap(), &queues, &nodes);
    let rows: Vec<Vec<&str>> = t.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(rows[0], vec!["node1", "1", "batch*", "idle"]);
    assert_eq!(rows[3], vec!["node4", "1", "batch*", "drain"]);
    assert_eq!(rows.len(), 4);

    let t = sinfo_table(&sinfo_query(&args(&["-h", "-o", "%P %F %C"])).unwrap(), &queues[..1], &nodes);
    // Nodes allocated (or mixed)/idle/other/total; CPUs the same, a drained node's free ones "other".
    assert_eq!(t, "batch* 1/2/1/4 10/16/6/32\n");
    assert!(sinfo_query(&args(&["-o", "%Y"])).is_err());
}

#[test]
fn sinfo_node_states() {
    assert_eq!(node_state(&node("n", "up", 0)).0, "idle");
    assert_eq!(node_state(&node("n", "up", 3)).0, "mix");
    assert_eq!(node_state(&node("n", "up", 8)).1, "allocated");
    assert_eq!(node_state(&node("n", "down", 0)).0, "down");
    assert_eq!(node_state(&node("n", "up (not connected)", 0)).0, "idle*");
    assert_eq!(node_state(&node("n", "drained", 0)).0, "drain");
    assert_eq!(node_state(&node("n", "cleaning", 0)).0, "comp");
}

#[test]
fn sbatch_wait() {
    for spelling in [&["--wait", "x.sh"][..], &["-W", "x.sh"], &["-QW", "x.sh"]] {
        let p = sbatch_plan(&args(spelling)).unwrap();
        assert!(p.wait, "{spelling:?}");
        assert_eq!(p.script.as_deref(), Some("x.sh"));
    }
    assert!(!sbatch_plan(&args(&["x.sh"])).unwrap().wait);
}

#[test]
fn sbatch_dependency_begin_and_hold() {
    let p = sbatch_plan(&args(&["-d", "afterok:5:6", "--begin=now+60", "-H", "x.sh"])).unwrap();
    assert_eq!(p.options.dependency.as_ref().map(ToString::to_string).as_deref(), Some("afterok:5:6"));
    assert_eq!(p.options.begin, Some(berth_core::directives::Begin::In(60)));
    assert!(p.hold);
    let p = sbatch_plan(&args(&["--dependency=afterany:3?singleton", "-b", "teatime", "x.sh"])).unwrap();
    assert!(p.options.dependency.unwrap().any);
    assert!(sbatch_plan(&args(&["-d", "afterok:x", "x.sh"])).unwrap_err().contains("not a job id"));
    assert!(sbatch_plan(&args(&["--begin", "whenever", "x.sh"])).unwrap_err().contains("not a time"));
    let e = sbatch_plan(&args(&["-d", "expand:3", "x.sh"])).unwrap_err();
    assert!(e.contains("expand") && e.contains("--ignore-unsupported"), "{e}");
    let p = sbatch_plan(&args(&["-d", "expand:3", "--ignore-unsupported", "x.sh"])).unwrap();
    assert_eq!((p.options.dependency, p.warnings.len()), (None, 1));
}

#[test]
fn squeue_reasons_for_dependencies_and_begin_times() {
    let mut j = job(7, "b", "ann", "queued");
    for (reason, slurm) in [
        ("Dependency: waits for job 5, running (afterok:5)", "Dependency"),
        ("DependencyNeverSatisfied: job 5 ended failed (afterok:5); ...", "DependencyNeverSatisfied"),
        ("BeginTime: starts no earlier than 2027-01-01T00:00:00", "BeginTime"),
    ] {
        j.reason = Some(reason.into());
        assert_eq!(f::slurm_reason(&j), slurm);
    }
    j.dependency = Some("afterok:5".into());
    let record = crate::compat::scontrol::job_record(&j, 2000.0, true);
    assert!(record.contains("Reason=BeginTime Dependency=afterok:5"), "{record}");
}

/// The controller's reason codes are what squeue read from the words before codes were sent:
/// the same column either way, for every kind of reason; a code it does not know is ignored.
#[test]
fn squeue_reason_codes_agree_with_the_words() {
    use berth_core::placement::reason::{Busy, Never};
    use berth_core::sched::reason::*;
    let mut j = job(7, "b", "ann", "queued");
    let reasons = [
        PendingReason::Resources(Wanting::Busy(Busy::Counted { need: 8, free: 2 })),
        PendingReason::Resources(Wanting::HeldForAdvance(vec!["course".into()])),
        PendingReason::Resources(Wanting::AdvanceNotStarted("course".into())),
        PendingReason::Priority,
        PendingReason::Held,
        PendingReason::NoSuitableNodes(Unsuitable::Never(Never::NoNodeUp)),
        PendingReason::NoSuitableNodes(Unsuitable::AdvanceEnded("course".into())),
        PendingReason::QueueLimit(QueueLimit::UserCores { queue: "short".into(), max: 4, used: 4, need: 1 }),
        PendingReason::Reservation(ReservationWait::Gone { name: "course".into() }),
        PendingReason::Reservation(ReservationWait::NotAdmitted {
            name: "course".into(),
            user: "ann".into(),
            who: "users bob".into(),
        }),
        PendingReason::Reservation(ReservationWait::Starts { name: "course".into(), at: "12:00".into() }),
        PendingReason::Dependency("waits for job 5, running (afterok:5)".into()),
        PendingReason::DependencyNeverSatisfied { why: "job 5 ended failed (afterok:5)".into(), job: JobId(7) },
        PendingReason::BeginTime(BeginWait::At("2027-01-01T00:00:00".into())),
        PendingReason::BeginTime(BeginWait::OldRun(vec!["n1".into()])),
        PendingReason::JobArrayTaskLimit { array: 7, limit: 2 },
    ];
    for r in reasons {
        j.reason = Some(r.to_string());
        j.reason_code = None;
        let by_words = f::slurm_reason(&j);
        j.reason_code = Some(r.code().into());
        assert_eq!((by_words.as_str(), f::slurm_reason(&j).as_str()), (r.code(), r.code()), "{r}");
    }
    j.reason = Some("resources: cores".into());
    j.reason_code = Some("Bogus\u{1b}[31m".into());
    assert_eq!(f::slurm_reason(&j), "Resources");
}

/// A suspended job's column says why it does not run (the controller's code, or what suspended
/// it read from the words of an older controller); a running job's is `None`, as Slurm's.
#[test]
fn squeue_reasons_of_suspended_jobs() {
    use berth_core::sched::reason::{ResumeWait, SuspendedReason};
    let mut j = running(7, &["n1"], 0.0);
    j.reason_code = Some("Resources".into());
    assert_eq!(f::slurm_reason(&j), "None", "a running job has no reason");
    j.state = berth_core::job::JobState::Suspended;
    let short = ResumeWait::Short { need: 2, unit: "cores", node: "n1".into(), free: 0 };
    let reasons = [
        (SuspendedReason::ByAdmin { who: "root".into() }, "SuspendedByAdmin", "SuspendedByAdmin"),
        (SuspendedReason::Preempted { why: "preempted by job 12".into(), waits: None }, "Preempted", "Preempted"),
        // Waiting to resume: the wait's code; the words keep only what suspended it.
        (
            SuspendedReason::Preempted { why: "preempted by job 12".into(), waits: Some(short.clone()) },
            "Resources",
            "Preempted",
        ),
        (
            SuspendedReason::Preempted {
                why: "preempted by job 12".into(),
                waits: Some(ResumeWait::NotConnected("n1".into())),
            },
            "NodeDown",
            "Preempted",
        ),
        (
            SuspendedReason::ResumeFailed { node: "n1".into(), error: "no cgroup".into(), waits: None },
            "SystemFailure",
            "SystemFailure",
        ),
        (
            SuspendedReason::FreezingFailed { node: "n1".into(), error: "EBUSY".into() },
            "SystemFailure",
            "SystemFailure",
        ),
        // No cause kept (after a controller restart): only the code says why.
        (SuspendedReason::Waiting(short), "Resources", "None"),
    ];
    for (r, code, by_words) in reasons {
        assert_eq!(r.code(), code, "{r}");
        j.reason = Some(r.to_string());
        j.reason_code = Some(code.into());
        assert_eq!(f::slurm_reason(&j), code, "{r}");
        let line = squeue_table(&squeue_query(&args(&["-h", "-o", "%i %t %r"])).unwrap(), &[j.clone()], 10.0);
        assert_eq!(line, format!("7 S {code}\n"));
        let record = crate::compat::scontrol::job_record(&j, 10.0, true);
        assert!(record.contains(&format!("JobState=SUSPENDED Reason={code} ")), "{record}");
        j.reason_code = None;
        assert_eq!(f::slurm_reason(&j), by_words, "{r} from its words");
    }
    // A pending job's code on a suspended job, or one not known, is not shown.
    j.reason = None;
    for code in ["Priority", "Bogus\u{1b}[31m"] {
        j.reason_code = Some(code.into());
        assert_eq!(f::slurm_reason(&j), "None", "{code}");
    }
}

#[test]
fn arrays_through_sbatch_and_squeue() {
    let p = sbatch_plan(&args(&["-a", "1-4%2", "-o", "%A_%a.out", "x.sh"])).unwrap();
    assert_eq!(p.options.array.map(|a| a.to_string()).as_deref(), Some("1-4%2"));
    assert_eq!(p.flags.output.as_deref(), Some("%A_%a.out"));
    let p = sbatch_plan(&args(&["--array=0-15:4", "x.sh"])).unwrap();
    assert_eq!(p.options.array.map(|a| a.to_string()).as_deref(), Some("0-15:4"));
    let e = sbatch_plan(&args(&["--array=4-1", "x.sh"])).unwrap_err();
    assert!(e.contains("ends before it starts"), "{e}");
    let mut t = job(12, "arr", "ann", "queued");
    (t.array_job, t.array_index) = (Some(JobId(10)), Some(3));
    t.reason = Some("JobArrayTaskLimit: array 10 runs at most 2 tasks at once (%2)".into());
    assert_eq!(squeue_field(&t, 'i', 0.0), "10_3");
    assert_eq!(squeue_field(&t, 'A', 0.0), "10");
    assert_eq!(squeue_field(&t, 'r', 0.0), "JobArrayTaskLimit");
    let plain = job(9, "x", "ann", "queued");
    assert_eq!((squeue_field(&plain, 'i', 0.0), squeue_field(&plain, 'A', 0.0)), ("9".into(), "9".into()));
    // -j A lists its tasks.
    let q = squeue_query(&args(&["-j", "10"])).unwrap();
    assert!(q.keeps(&t) && !q.keeps(&plain));
}
