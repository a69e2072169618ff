use super::*;
use crate::compat::slurm::tests::{job, running};

fn args(s: &[&str]) -> Vec<String> {
    s.iter().map(|x| x.to_string()).collect()
}

#[test]
fn qsub_options_mean_what_their_directives_mean() {
    let p =
        qsub_plan(&args(&["-l", "select=2:ncpus=4:mpiprocs=2:mem=1gb", "-l", "walltime=01:00:00", "job.sh"])).unwrap();
    assert_eq!(p.options.nodes, Some(2));
    assert_eq!(p.options.tasks_per_node, Some(2));
    assert_eq!(p.options.cpus_per_task, Some(2));
    assert_eq!(p.options.mem, Some(1 << 30));
    assert_eq!(p.options.walltime, Some(3600));
    assert_eq!(p.script.as_deref(), Some("job.sh"));
    let p = qsub_plan(&args(&["-l", "nodes=3:ppn=2,mem=600mb", "-r", "n"])).unwrap();
    assert_eq!((p.options.nodes, p.options.tasks_per_node), (Some(3), Some(2)));
    assert_eq!(p.options.mem, Some(200 << 20), "-l mem is the job's total");
    assert_eq!(p.options.requeue, Some(false));
    assert_eq!(p.script, None, "standard input");
}

#[test]
fn qsub_own_options() {
    let p = qsub_plan(&args(&[
        "-N",
        "pbsjob",
        "-q",
        "debug",
        "-A",
        "proj",
        "-o",
        "out.txt",
        "-e",
        "err.txt",
        "-j",
        "oe",
        "-h",
        "-z",
        "-V",
        "-v",
        "A=1,B=2",
        "-m",
        "n",
        "--",
        "/bin/echo",
        "hi there",
    ]))
    .unwrap();
    assert_eq!(p.flags.name.as_deref(), Some("pbsjob"));
    assert_eq!(p.flags.queue.as_deref(), Some("debug"));
    assert_eq!(p.flags.account.as_deref(), Some("proj"));
    assert_eq!(p.flags.output.as_deref(), Some("out.txt"));
    assert_eq!(p.flags.error.as_deref(), Some("err.txt"));
    assert_eq!(p.join, Some('o'));
    assert!(p.hold && p.quiet);
    assert_eq!(p.vars, vec![("A".into(), "1".into()), ("B".into(), "2".into())]);
    assert_eq!(p.command, args(&["/bin/echo", "hi there"]));
    assert_eq!(shell_quote("it's"), "'it'\\''s'");
}

#[test]
fn qsub_refuses_by_name_what_it_cannot_do() {
    assert_eq!(qsub_plan(&args(&["-Y", "x.sh"])).unwrap_err(), "invalid option -- 'Y'");
    let e = qsub_plan(&args(&["-W", "depend=beforeok:5", "x.sh"])).unwrap_err();
    assert!(e.contains("-W depend=beforeok:5") && e.contains("not supported"), "{e}");
    let e = qsub_plan(&args(&["-W", "depend=afterok:x", "x.sh"])).unwrap_err();
    assert!(e.contains("not a job id"), "{e}");
    let e = qsub_plan(&args(&["-W", "umask=022", "x.sh"])).unwrap_err();
    assert!(e.contains("-W umask=022") && e.contains("not supported"), "{e}");
    // GPUs are read (issue 20); other accelerator resources are refused by name.
    let p = qsub_plan(&args(&["-l", "select=1:ngpus=2", "x.sh"])).unwrap();
    assert_eq!(p.options.gpus_per_node, Some(2));
    let e = qsub_plan(&args(&["-l", "select=1:naccelerators=1", "x.sh"])).unwrap_err();
    assert!(e.contains("naccelerators"), "{e}");
    // Site resources: a chunk's are generic resources, job-wide ones licenses (docs/gres.md).
    let p = qsub_plan(&args(&["-l", "select=1:ncpus=2:nvme=10", "-l", "matlab=2", "x.sh"])).unwrap();
    assert_eq!(p.options.gres.as_ref().map(|g| g["nvme"]), Some(10));
    assert_eq!(p.options.licenses.as_ref().map(|l| l["matlab"]), Some(2));
    let e = qsub_plan(&args(&["-o", "host:/tmp/o", "x.sh"])).unwrap_err();
    assert!(e.contains("host:path"), "{e}");
    assert!(qsub_plan(&args(&["-j", "x", "x.sh"])).is_err());
    assert!(qsub_plan(&args(&["a.sh", "b.sh"])).is_err());
    let p = qsub_plan(&args(&["--ignore-unsupported", "-a", "1200", "-I", "x.sh"])).unwrap();
    assert_eq!(p.warnings.len(), 2);
    // Arrays: -J as `#PBS -J`.
    let p = qsub_plan(&args(&["-J", "1-10:2", "x.sh"])).unwrap();
    assert_eq!(p.options.array.map(|a| a.to_string()).as_deref(), Some("1-10:2"));
    assert!(qsub_plan(&args(&["-J", "5", "x.sh"])).unwrap_err().contains("give a range"));
}

#[test]
fn qsub_shell_is_the_first_path_and_must_be_absolute() {
    let p = qsub_plan(&args(&["-S", "/bin/bash@login1,/bin/sh", "x.sh"])).unwrap();
    assert_eq!(p.shell.as_deref(), Some("/bin/bash"));
    assert!(qsub_plan(&args(&["-S", "bash", "x.sh"])).unwrap_err().contains("absolute path"));
    assert!(qsub_plan(&args(&["-S", "/bin/ba sh", "x.sh"])).is_err());
}

#[test]
fn qstat_table_is_pbs() {
    let mut held = job(12, "a_rather_long_job_name", "someone_long_name", "held");
    held.queue = "workqueue".into();
    let t = qstat_table(&[running(11, &["n1"], 0.0), held], "srv");
    let lines: Vec<&str> = t.lines().collect();
    assert_eq!(lines[0], "Job id            Name             User              Time Use S Queue");
    assert_eq!(lines[1], "----------------  ---------------- ----------------  -------- - -----");
    assert_eq!(lines[2], "11.srv            sim              ann               00:00:00 R batch");
    assert_eq!(lines[3], "12.srv            a_rather_long_j* someone_long_na*         0 H work*");
    for l in &lines[2..] {
        assert_eq!(l.split_whitespace().count(), 6, "{l}");
    }
    let alt = qstat_alt_table(&[running(11, &["n1", "n2"], 0.0)], "srv", 65.0 * 60.0);
    let last = alt.lines().last().unwrap();
    assert_eq!(
        last.split_whitespace().collect::<Vec<_>>(),
        vec!["11.srv", "ann", "batch", "sim", "--", "2", "4", "--", "01:00", "R", "01:05"]
    );
    let full = qstat_full(&running(11, &["n1"], 0.0), "srv", 10.0);
    assert!(full.starts_with("Job Id: 11.srv\n"), "{full}");
    for line in [
        "    Job_Name = sim",
        "    job_state = R",
        "    queue = batch",
        "    exec_host = n1/0*2",
        "    Resource_List.walltime = 01:00:00",
    ] {
        assert!(full.lines().any(|l| l == line), "{line:?} in\n{full}");
    }
}

#[test]
fn qstat_full_as_json() {
    // `qstat -f -F json` (parsl's PBSProProvider reads it): PBS Pro's layout.
    let mut two = running(12, &["n1"], 0.0);
    two.name = "second".into();
    let full = qstat_full(&running(11, &["n1"], 0.0), "srv", 10.0) + &qstat_full(&two, "srv", 10.0);
    let v: serde_json::Value = serde_json::from_str(&qstat_json(&full, "srv", 10.0)).unwrap();
    assert_eq!(v["pbs_server"], "srv");
    assert_eq!(v["timestamp"], 10);
    let job = &v["Jobs"]["11.srv"];
    assert_eq!(job["Job_Name"], "sim");
    assert_eq!(job["job_state"], "R");
    assert_eq!(job["Resource_List"]["walltime"], "01:00:00");
    assert_eq!(job["Resource_List"]["nodect"], 1);
    assert!(job["Variable_List"]["PBS_O_WORKDIR"].is_string(), "{job:#}");
    assert_eq!(v["Jobs"]["12.srv"]["Job_Name"], "second");
}

#[test]
fn qstat_full_as_dsv() {
    // `qstat -f -F dsv`: one line a job, `Job Id: ID|attribute=value|...`.
    let mut two = running(12, &["n1"], 0.0);
    two.name = "a|b".into();
    let full = qstat_full(&running(11, &["n1"], 0.0), "srv", 10.0) + &qstat_full(&two, "srv", 10.0);
    let dsv = qstat_dsv(&full, "|");
    let lines: Vec<&str> = dsv.lines().collect();
    assert_eq!(lines.len(), 2, "{dsv}");
    assert!(lines[0].starts_with("Job Id: 11.srv|Job_Name=sim|"), "{dsv}");
    assert!(lines[0].split('|').any(|f| f == "job_state=R"), "{dsv}");
    assert!(lines[0].split('|').any(|f| f == "Resource_List.walltime=01:00:00"), "{dsv}");
    assert!(lines[1].contains("|Job_Name=a\\|b|"), "the delimiter in a value is escaped: {dsv}");
    let other = qstat_dsv(&full, ";;");
    assert!(other.starts_with("Job Id: 11.srv;;Job_Name=sim;;"), "{other}");
}

#[test]
fn pbs_states() {
    assert_eq!(pbs_state(&job(1, "x", "a", "queued")), 'Q');
    assert_eq!(pbs_state(&job(1, "x", "a", "held")), 'H');
    assert_eq!(pbs_state(&job(1, "x", "a", "suspended")), 'S');
    assert_eq!(pbs_state(&job(1, "x", "a", "completed")), 'F');
    let mut ending = running(1, &["n"], 0.0);
    ending.reason = Some("ending: cancelled".into());
    assert_eq!(pbs_state(&ending), 'E');
    assert_eq!(pbs_id(JobId(7), "head"), "7.head");
}

#[test]
fn pbsnodes_attributes() {
    let node = |state: &str, alloc: usize| -> berth_protocol::node::NodeInfo {
        serde_json::from_value(serde_json::json!({
            "id": 0, "name": "node1", "state": state, "address": "a", "sockets": 1, "cores": 4, "pus": 4,
            "topology": "SCCCC", "free": "S", "cpus_allocated": alloc, "memory_bytes": 4u64 << 30,
            "memory_allocated_bytes": 1u64 << 30, "real_cpus": "0", "jobs": [7], "last_heard_seconds_ago": null, "numa": []
        }))
        .unwrap()
    };
    assert_eq!(pbs_node_state(&node("up", 0)), "free");
    assert_eq!(pbs_node_state(&node("up", 4)), "job-busy");
    assert_eq!(pbs_node_state(&node("drained", 0)), "offline");
    assert_eq!(pbs_node_state(&node("down", 0)), "down");
    assert_eq!(pbs_node_state(&node("up (not connected)", 0)), "down");
    let t = pbsnodes_full(&[node("up", 2)], "srv");
    let lines: Vec<&str> = t.lines().collect();
    assert_eq!(lines[0], "node1");
    for l in [
        "     state = free",
        "     jobs = 7.srv",
        "     resources_available.ncpus = 4",
        "     resources_assigned.ncpus = 2",
        "     resources_available.mem = 4194304kb",
    ] {
        assert!(lines.contains(&l), "{l:?} in\n{t}");
    }
}

#[test]
fn qsub_block() {
    assert!(qsub_plan(&args(&["-W", "block=true", "x.sh"])).unwrap().block);
    assert!(qsub_plan(&args(&["-Wblock=True", "x.sh"])).unwrap().block);
    assert!(!qsub_plan(&args(&["-W", "block=false", "x.sh"])).unwrap().block);
    assert!(!qsub_plan(&args(&["x.sh"])).unwrap().block);
    assert!(qsub_plan(&args(&["-W", "block=maybe", "x.sh"])).unwrap_err().contains("block=true"));
}

#[test]
fn qsub_dependencies_and_hold() {
    let p = qsub_plan(&args(&["-W", "depend=afterok:12.head:13", "-h", "x.sh"])).unwrap();
    assert_eq!(p.options.dependency.as_ref().map(ToString::to_string).as_deref(), Some("afterok:12:13"));
    assert!(p.hold);
    let p = qsub_plan(&args(&["-W", "depend=afternotok:4,afterany:5", "x.sh"])).unwrap();
    assert_eq!(p.options.dependency.unwrap().to_string(), "afternotok:4,afterany:5");
}

#[test]
fn qstat_states_of_waiting_jobs() {
    let mut j = job(3, "w", "ann", "queued");
    assert_eq!(pbs_state(&j), 'Q');
    j.reason = Some("Dependency: waits for job 2, running (afterok:2)".into());
    assert_eq!(pbs_state(&j), 'H');
    j.reason = Some("DependencyNeverSatisfied: job 2 ended failed (afterok:2)".into());
    assert_eq!(pbs_state(&j), 'H');
    j.reason = Some("BeginTime: starts no earlier than 2027-01-01T00:00:00".into());
    assert_eq!(pbs_state(&j), 'W');
}

/// The controller's reason code decides a waiting job's letter, whatever the words say; a code
/// berth does not know falls back to the words.
#[test]
fn qstat_states_by_reason_code() {
    let mut j = job(3, "w", "ann", "queued");
    j.reason = Some("waits for something".into());
    for (code, letter) in [
        ("Dependency", 'H'),
        ("DependencyNeverSatisfied", 'H'),
        ("BeginTime", 'W'),
        ("Resources", 'Q'),
        ("Priority", 'Q'),
    ] {
        j.reason_code = Some(code.into());
        assert_eq!(pbs_state(&j), letter, "{code}");
    }
    j.reason = Some("Dependency: waits for job 2, running (afterok:2)".into());
    j.reason_code = Some("Resources".into());
    assert_eq!(pbs_state(&j), 'Q', "the code wins over the words");
    j.reason_code = Some("Bogus".into());
    assert_eq!(pbs_state(&j), 'H', "an unknown code: the words");
    j.reason_code = None;
    assert_eq!(pbs_state(&j), 'H');
}

#[test]
fn array_tasks_are_pbs_subjobs() {
    let mut j: JobInfo = serde_json::from_value(serde_json::json!({
        "id": 12, "name": "a", "user": "ann", "uid": 1, "gid": 1, "state": "queued", "queue": "batch",
        "request": {"nodes": null, "cores": 1, "tasks_per_node": null, "cpus_per_task": null,
        "mem_per_node": null, "mem_per_cpu": null, "threads": false},
        "walltime_seconds": 60, "submit_time": 0.0, "start_time": null, "end_time": null,
        "allocation": [], "exit_code": null, "signal": null, "reason": null,
        "cwd": "/", "stdout": "/o", "stderr": "/e", "accounting": null
    }))
    .unwrap();
    assert_eq!(pbs_job_id(&j, "srv"), "12.srv");
    (j.array_job, j.array_index) = (Some(JobId(10)), Some(3));
    assert_eq!(pbs_job_id(&j, "srv"), "10[3].srv");
    assert!(qstat_table(&[j], "srv").contains("10[3].srv"));
}

#[test]
fn qalter_reads_resources_as_pbs_lines_and_refuses_what_it_cannot_change() {
    let a = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    // Issue 20: custom resources (job-wide: licenses; in a chunk: generic resources) and
    // ngpus change the job's, as `#PBS -l` reads them.
    let p = qalter_plan(&a(&["-l", "matlab=2", "12.server"])).unwrap();
    assert_eq!(p.change.licenses.as_ref().and_then(|l| l.get("matlab")), Some(&2));
    assert_eq!((p.change.gres.as_ref(), p.change.gpus_per_node), (None, None));
    let p = qalter_plan(&a(&["-l", "select=1:ncpus=2:ngpus=2:nvme=100", "12"])).unwrap();
    assert_eq!(p.change.gpus_per_node, Some(2));
    assert_eq!(p.change.gres.as_ref().and_then(|g| g.get("nvme")), Some(&100));
    let p = qalter_plan(&a(&["-l", "walltime=01:30:00", "-N", "renamed", "-q", "long", "12.server"])).unwrap();
    assert_eq!(p.ids, vec![JobId(12)]);
    let c = &p.change;
    assert_eq!((c.walltime, c.name.as_deref(), c.queue.as_deref()), (Some(5400), Some("renamed"), Some("long")));
    let p = qalter_plan(&a(&["-l", "select=2:ncpus=4:mpiprocs=2", "7", "8[]"])).unwrap();
    assert_eq!(p.ids, vec![JobId(7), JobId(8)]);
    assert_eq!((p.change.nodes, p.change.tasks_per_node, p.change.cpus_per_task), (Some(2), Some(2), Some(2)));
    let p = qalter_plan(&a(&["-l", "nodes=3:ppn=4", "-W", "depend=afterok:5.server:6", "9"])).unwrap();
    assert_eq!((p.change.nodes, p.change.tasks_per_node), (Some(3), Some(4)));
    assert_eq!(p.change.dependency.as_deref(), Some("afterok:5:6"), "in Slurm's syntax for the controller");
    let err = |s: &[&str]| qalter_plan(&a(s)).unwrap_err();
    assert!(err(&["-l", "mem=4gb", "3"]).contains("memory"));
    assert!(err(&["-l", "software=x", "3"]).contains("not supported"));
    assert!(err(&["-W", "group_list=x", "3"]).contains("depend"));
    assert!(err(&["-N", "x"]).contains("no job identifier"));
    assert!(err(&["3"]).contains("no attribute"));
    assert!(err(&["-l", "walltime=1:00", "x.y"]).contains("illegally formed"));
    assert!(qalter_plan(&a(&["--version"])).unwrap().info.is_some());
}
