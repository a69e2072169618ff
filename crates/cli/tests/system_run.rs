//! System tests of `berth run` (the parallel launcher) on real local clusters: four agents on
//! this host, and agents in separate network namespaces. Ranks are real processes in real
//! cgroups; MPI programs are real MPICH programs talking PMI to the agents' shepherds.

mod common;

use common::*;
use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// 4 cores per agent: PUs map round-robin onto the host's 2 CPUs.
const TOPO: &str = "package:2 core:2 pu:1";

/// MPICH's UCX lists the host's network devices in MPI_Init and fails ("init_worker No such
/// device") if one disappears meanwhile: the namespace test makes and removes veths and bridges,
/// so the two MPI tests never run at the same time.
static NETWORK_CHURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

/// `berth run ARGS` in the cluster, as root or (with `user`) as the test user.
fn run(c: &Cluster, user: Option<&[&str]>, args: &[&str], stdin: &[u8]) -> Output {
    let mut cmd = match user {
        Some(u) => {
            let mut c = Command::new("runuser");
            c.args(u).arg("--").arg(BIN);
            c
        }
        None => Command::new(BIN),
    };
    cmd.arg("--dir").arg(&c.dir).arg("run").args(args).current_dir(c.root());
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("start berth run");
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin).unwrap();
    drop(input);
    wait_output(child, Duration::from_secs(90))
}

/// `berth run ARGS` in the background (stdin empty), for tests that act on it while it runs.
fn start_run(c: &Cluster, args: &[&str]) -> std::process::Child {
    Command::new(BIN)
        .arg("--dir")
        .arg(&c.dir)
        .arg("run")
        .args(args)
        .current_dir(c.root())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(Stdio::null())
        .spawn()
        .unwrap()
}

fn wait_output(mut child: std::process::Child, limit: Duration) -> Output {
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > limit {
            let _ = child.kill();
            panic!("berth run did not end within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn sorted_lines(s: &str) -> Vec<String> {
    let mut v: Vec<String> = s.lines().map(String::from).collect();
    v.sort();
    v
}

#[test]
fn ranks_are_placed_bound_labelled_and_get_the_users_environment() {
    let c = Cluster::up(4, TOPO);
    // A program found by bare name on the user's own PATH, printing what a rank sees.
    let bin = c.root().join("userbin");
    std::fs::create_dir_all(&bin).unwrap();
    let prog = bin.join("rank-report");
    std::fs::write(
        &prog,
        "#!/bin/sh\necho \"rank=$BERTH_RANK size=$BERTH_SIZE local=$BERTH_LOCAL_RANK node=$BERTH_NODEID mpi=$MPI_RANK/$MPI_SIZE ids=$(id -u):$(id -g):$(id -G | tr ' ' ,) cpus=$(grep Cpus_allowed_list /proc/self/status | cut -f2) ld=$LD_LIBRARY_PATH tmp=$TMPDIR cg=$(grep cpuset /proc/self/cgroup | cut -d: -f3) marker-env-7\"\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!("{}:/usr/local/bin:/usr/bin:/bin", bin.display());
    let user = ["-u", "berthtest", "-g", "berthgrp"];
    let expect_ids = Command::new("runuser")
        .args(user)
        .args(["--", "sh", "-c", "echo $(id -u):$(id -g):$(id -G | tr ' ' ,)"])
        .output()
        .unwrap();
    let expect_ids = String::from_utf8_lossy(&expect_ids.stdout).trim().to_string();
    let env_args = ["env", &format!("PATH={path}"), "LD_LIBRARY_PATH=/opt/berth-test/lib"];
    let mut args: Vec<&str> = env_args.to_vec();
    // The checkout may be out of the test user's reach: its own copy of the binary.
    let own_bin = c.root().join("berth-bin");
    std::fs::copy(BIN, &own_bin).unwrap();
    let own_bin = own_bin.display().to_string();
    args.extend([own_bin.as_str(), "--dir"]);
    let dir = c.dir.display().to_string();
    args.push(&dir);
    args.extend(["run", "-n", "8", "--ntasks-per-node", "2", "--label", "--rank-cpusets", "rank-report"]);
    let out = Command::new("runuser").args(user).arg("--").args(&args).current_dir(c.root()).output().unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "run failed: {stdout}{stderr}\n{}", c.logs());
    let lines = sorted_lines(&stdout);
    assert_eq!(lines.len(), 8, "{stdout}");
    let mut per_node: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for (rank, line) in lines.iter().enumerate() {
        assert!(
            line.starts_with(&format!("{rank}: rank={rank} size=8 local={} node={}", rank % 2, rank / 2)),
            "{line}"
        );
        assert!(line.contains(&format!("mpi={rank}/8")), "{line}");
        assert!(line.contains(&format!("ids={expect_ids} ")), "uid, active gid and groups: {line} vs {expect_ids}");
        assert!(line.contains("ld=/opt/berth-test/lib "), "{line}");
        assert!(
            line.contains(&format!("/s1r{rank} ")) || line.contains(&format!("/s1r{rank} marker")),
            "rank sub-cpuset: {line}"
        );
        let cpus = line.split("cpus=").nth(1).unwrap().split(' ').next().unwrap().to_string();
        assert!(cpus == "0" || cpus == "1", "bound to one host CPU: {line}");
        per_node.entry(format!("{}", rank / 2)).or_default().push(cpus);
    }
    for (node, cpus) in per_node {
        assert_ne!(cpus[0], cpus[1], "the two ranks of node {node} share a CPU");
    }
    // stdin goes to rank 0 only.
    let out = run(&c, None, &["-n", "3", "--label", "cat"], b"alpha\nbeta\n");
    assert!(out.status.success(), "{:?}", text(&out));
    assert_eq!(text(&out).0, "0: alpha\n0: beta\n");
    // A non-MPI script runs once per rank.
    let out = run(&c, None, &["-n", "5", "sh", "-c", "echo once-$BERTH_RANK"], b"");
    assert_eq!(sorted_lines(&text(&out).0), (0..5).map(|r| format!("once-{r}")).collect::<Vec<_>>());
    // The invocation log has every run; the interactive allocations are gone.
    let steps = c.json(&["acct", "--steps"]);
    let steps = steps.as_array().unwrap();
    assert_eq!(steps.len(), 3, "{steps:?}");
    let first = steps.iter().find(|s| s["argv"][0] == "rank-report").expect("rank-report step");
    assert_eq!(first["exit_code"], 0);
    assert_eq!(first["size"], 8);
    assert_eq!(first["user"], "berthtest");
    assert_eq!(first["cwd"], c.root().display().to_string());
    assert!(first["pid"].as_u64().unwrap() > 0 && !first["host"].as_str().unwrap().is_empty());
    let jobs = c.json(&["jobs"]);
    assert_eq!(jobs.as_array().unwrap().len(), 0, "interactive jobs left: {jobs}");
    assert_no_job_cgroups(&c);
}

#[test]
fn an_abnormal_exit_kills_all_unless_no_kill_and_signals_reach_every_rank() {
    let c = Cluster::up(4, TOPO);
    let t0 = Instant::now();
    let out =
        run(&c, None, &["-n", "8", "sh", "-c", "if [ $BERTH_RANK = 5 ]; then exit 3; fi; exec sleep 300.25"], b"");
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(t0.elapsed() < Duration::from_secs(20), "took {:?}", t0.elapsed());
    assert!(stderr.contains("rank 5 on node") && stderr.contains("exited with status 3"), "{stderr}");
    assert!(stderr.contains("killing the other ranks"), "{stderr}");
    assert_no_process("sleep 300.25");

    // --no-kill: the others go on, learn of the failure, and run reports it at the end.
    let out = run(
        &c,
        None,
        &[
            "-n",
            "4",
            "--no-kill",
            "--label",
            "sh",
            "-c",
            "if [ $BERTH_RANK = 1 ]; then kill -9 $$; fi; sleep 1; echo survivor; cat $BERTH_FAILED_RANKS",
        ],
        b"",
    );
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(128 + 9), "{stdout}{stderr}");
    for r in [0, 2, 3] {
        assert!(stdout.contains(&format!("{r}: survivor")), "{stdout}");
        assert!(stdout.contains(&format!("{r}: 1 node")), "rank {r} was not told: {stdout}");
    }
    assert!(stderr.contains("1 of 4 ranks failed") && stderr.contains("killed by signal 9"), "{stderr}");

    // Signals run receives reach every rank.
    let script = "trap 'echo got-usr1 $BERTH_RANK; exit 0' USR1; echo ready; while true; do sleep 0.05; done";
    let mut child = start_run(&c, &["-n", "4", "sh", "-c", script]);
    let mut stdout = child.stdout.take().unwrap();
    let mut seen = String::new();
    let t0 = Instant::now();
    while seen.matches("ready").count() < 4 {
        let mut buf = [0u8; 256];
        let n = std::io::Read::read(&mut stdout, &mut buf).unwrap();
        assert!(n > 0 && t0.elapsed() < Duration::from_secs(30), "ranks did not start: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    // SAFETY: kill(2) on the berth run we started.
    unsafe { libc::kill(child.id() as i32, libc::SIGUSR1) };
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{rest}");
    assert_eq!(rest.matches("got-usr1").count(), 4, "{rest}");

    // `berth signal JOB.STEP` from another terminal does the same.
    let script = "trap 'echo got-term $BERTH_RANK; exit 0' TERM; echo ready; while true; do sleep 0.05; done";
    let child = start_run(&c, &["-n", "2", "sh", "-c", script]);
    let t0 = Instant::now();
    let target = loop {
        let steps = c.json(&["acct", "--steps"]);
        if let Some(s) = steps.as_array().unwrap().iter().find(|s| s["end_time"].is_null()) {
            break format!("{}.{}", s["job"], s["step"]);
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "the step never showed up: {steps}");
        std::thread::sleep(Duration::from_millis(50));
    };
    std::thread::sleep(Duration::from_millis(500));
    let out = c.berth(&["signal", &target, "TERM"]);
    assert!(out.status.success(), "{:?}", text(&out));
    let out = wait_output(child, Duration::from_secs(30));
    assert!(out.status.success(), "{:?}", text(&out));
    assert_eq!(text(&out).0.matches("got-term").count(), 2, "{:?}", text(&out));
    let out = c.berth(&["signal", "999", "TERM"]);
    assert!(!out.status.success() && text(&out).1.contains("999"), "{:?}", text(&out));
    assert_no_job_cgroups(&c);
}

fn mpi_suite(c: &Cluster, ranks: &str, per_node: &str, nodes: usize) {
    let dir = mpi_programs();
    let prog = |n: &str| dir.join(n).display().to_string();
    let out = run(c, None, &["-n", ranks, "--ntasks-per-node", per_node, "--label", &prog("hello")], b"");
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "hello: {stdout}{stderr}\n{}", c.logs());
    let n: usize = ranks.parse().unwrap();
    assert_eq!(stdout.matches("hello from rank").count(), n, "{stdout}");
    let steps = c.json(&["acct", "--steps", "--limit", "1"]);
    assert_eq!(steps[0]["nodes"].as_array().unwrap().len(), nodes, "{steps}");
    let out = run(c, None, &["-n", ranks, "--ntasks-per-node", per_node, &prog("allreduce")], b"");
    let (stdout, stderr) = text(&out);
    let want = n * (n - 1) / 2;
    assert!(out.status.success(), "allreduce: {stdout}{stderr}");
    assert_eq!(stdout.matches(&format!("allreduce sum={want} expected={want}")).count(), n, "{stdout}");
    let out = run(c, None, &["-n", ranks, "--ntasks-per-node", per_node, &prog("ring")], b"");
    let (stdout, stderr) = text(&out);
    assert!(out.status.success() && stdout.contains("ring ok"), "ring: {stdout}{stderr}");
    let t0 = Instant::now();
    let out = run(c, None, &["-n", ranks, "--ntasks-per-node", per_node, &prog("abort")], b"");
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(7), "abort: {stdout}{stderr}");
    assert!(stderr.contains("rank 1 on") && stderr.contains("MPI_Abort (code 7)"), "{stderr}");
    assert!(t0.elapsed() < Duration::from_secs(20), "abort took {:?}", t0.elapsed());
    assert_no_process(&prog("abort"));
}

#[test]
fn mpich_runs_across_two_and_four_agents_and_mpi_abort_ends_the_job() {
    let _quiet_network = NETWORK_CHURN.lock().unwrap_or_else(|e| e.into_inner());
    let c = Cluster::up(4, TOPO);
    mpi_suite(&c, "4", "2", 2);
    mpi_suite(&c, "8", "2", 4);
    let steps = c.json(&["acct", "--steps"]);
    let abort = steps.as_array().unwrap().iter().find(|s| s["exit_code"] == 7).expect("abort step");
    assert!(abort["failure"].as_str().unwrap().contains("MPI_Abort"), "{abort}");
    assert_no_job_cgroups(&c);
}

#[test]
fn inside_a_job_run_claims_from_the_allocation() {
    let c = Cluster::up(4, TOPO);
    let script = format!(
        r#"#!/bin/sh
#BERTH --nodes 2 --tasks-per-node 2 --walltime 120
B={BIN}
$B run sh -c 'echo default size=$BERTH_SIZE node=$BERTH_NODEID'
$B run -n 5 true 2> overclaim.err; echo "overclaim rc=$?"
$B run -n 5 --overcommit sh -c 'echo oc-$BERTH_RANK' > oc.out; echo "overcommit rc=$? lines=$(wc -l < oc.out)"
$B run -n 2 sh -c 'sleep 2; echo first-$BERTH_RANK' &
$B run -n 2 sh -c 'sleep 2; echo second-$BERTH_RANK' &
sleep 1
$B run -n 1 true 2> busy.err; echo "busy rc=$?"
wait
"#
    );
    let id = c.submit("claims.sh", &script, &[]);
    let job = c.wait_finished(id, Duration::from_secs(60));
    assert_eq!(job["state"], "completed", "{job:#}\n{}", c.logs());
    let out = std::fs::read_to_string(c.root().join(format!("berth-{id}.out"))).unwrap();
    assert_eq!(out.matches("default size=4").count(), 4, "{out}");
    assert!(out.contains("node=0") && out.contains("node=1"), "{out}");
    assert!(out.contains("overclaim rc=1"), "{out}");
    let err = std::fs::read_to_string(c.root().join("overclaim.err")).unwrap();
    assert!(err.contains("--overcommit") && err.contains("-n 5"), "{err}");
    assert!(out.contains("overcommit rc=0 lines=5"), "{out}");
    assert_eq!(out.matches("second-").count(), 2, "two runs share the allocation at once: {out}");
    assert_eq!(out.matches("first-").count(), 2, "{out}");
    // While both ran, the 4 cores were all claimed: a third run was refused.
    assert!(out.contains("busy rc=1"), "{out}");
    let busy = std::fs::read_to_string(c.root().join("busy.err")).unwrap();
    assert!(busy.contains("held by other runs"), "{busy}");
    let steps = c.json(&["acct", "--steps"]);
    assert!(steps.as_array().unwrap().iter().all(|s| s["job"] == id), "{steps}");
    assert_no_job_cgroups(&c);
}

#[test]
fn agents_in_network_namespaces_run_mpi_and_a_cut_link_dissolves_its_subtree() {
    require_root();
    let _quiet_network = NETWORK_CHURN.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::Builder::new().prefix("berth-netns-").tempdir().unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let c = Cluster::up_with(tmp, 3, TOPO, &["--netns"]);
    let nodes = c.json(&["nodes"]);
    let addrs: Vec<String> =
        nodes.as_array().unwrap().iter().map(|n| n["address"].as_str().unwrap().to_string()).collect();
    assert!(addrs.iter().all(|a| a.starts_with("10.213.")), "agents have their own addresses: {addrs:?}");
    mpi_suite(&c, "4", "2", 2);
    // Cut the link of a node below the head while a run spans all three nodes: its ranks are
    // lost and killed, run reports it and ends the rest. (The head is wherever the allocation
    // starts; cutting it would be run's own connection, another case.)
    let child = start_run(
        &c,
        &["-n", "6", "--ntasks-per-node", "2", "--fanout", "2", "sh", "-c", "echo up; exec sleep 120.75"],
    );
    // Wait for the allocation itself (a fixed pause flakes on a loaded machine).
    let t0 = std::time::Instant::now();
    let (jobs, alloc) = loop {
        let jobs = c.json(&["jobs"]);
        let running = jobs.as_array().unwrap().iter().find(|j| j["state"] == "running").cloned();
        if let Some(j) = running.filter(|j| j["allocation"].as_array().is_some_and(|a| !a.is_empty())) {
            break (jobs, j["allocation"].as_array().unwrap().clone());
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "the run's allocation never ran: {jobs:#}");
        std::thread::sleep(Duration::from_millis(100));
    };
    // ... and for its 6 ranks.
    loop {
        let out = Command::new("pgrep").args(["-c", "-f", "^sleep 120.75"]).output().unwrap();
        if String::from_utf8_lossy(&out.stdout).trim() == "6" {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "the 6 ranks never all ran");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(alloc.len(), 3, "{jobs:#}");
    let victim = alloc[2]["node"].as_str().unwrap().to_string();
    let cid = c.cluster_id();
    let ns = format!("berth-{cid}-{victim}");
    let dev = format!("bn{cid}{}", victim.trim_start_matches("node"));
    let cut = Command::new("ip").args(["-n", &ns, "link", "set", &dev, "down"]).status().unwrap();
    assert!(cut.success());
    let t0 = Instant::now();
    let out = wait_output(child, Duration::from_secs(60));
    let (stdout, stderr) = text(&out);
    assert!(!out.status.success(), "{stdout}{stderr}");
    assert!(stderr.contains(&format!("lost nodes {victim}")), "{stderr}");
    assert!(t0.elapsed() < Duration::from_secs(30), "detected after {:?}", t0.elapsed());
    // The cut node's own shepherd lost its upstream and killed its ranks too.
    assert_no_process("sleep 120.75");
    let _ = Command::new("ip").args(["-n", &ns, "link", "set", &dev, "up"]).status();
}
