//! `mpirun` (Open MPI 4.1) and `mpiexec` (MPICH's hydra) inside a 2-node berth job: the job's
//! environment points them at `berth-rsh` (`berth task rsh`), so their remote daemons (orted,
//! hydra_pmi_proxy) are tasks of the job started by each node's agent, and every rank runs in
//! the job's cgroup on its node; cancelling the job leaves nothing behind.

mod common;

use common::*;
use std::process::Command;
use std::time::{Duration, Instant};

const TOPO: &str = "package:1 core:2 pu:1";

/// Root runs mpirun only when told it may; the agents all share this host's loopback.
const OMPI_ENV: &str = "export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
                        OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo";

/// The lines of `out` starting with `prefix`.
fn lines<'a>(out: &'a str, prefix: &str) -> Vec<&'a str> {
    out.lines().filter(|l| l.starts_with(prefix)).collect()
}

#[test]
fn mpirun_and_mpiexec_inside_a_job_start_their_daemons_as_tasks_of_the_job() {
    let c = Cluster::up(2, TOPO);
    let (ompi, mpich) = (openmpi_programs().join("hello"), mpi_programs().join("hello"));
    let script = format!(
        "#!/bin/sh\n#BERTH --nodes 2 --tasks-per-node 2\n{OMPI_ENV}\n\
         timeout 60 mpirun.openmpi -n 4 sh -c 'echo \"ompi-cg $OMPI_COMM_WORLD_RANK $(grep cpuset /proc/self/cgroup)\"'\n\
         timeout 60 mpirun.openmpi -n 4 {ompi}\n\
         timeout 60 mpiexec.mpich -n 4 sh -c 'echo \"mpich-cg $PMI_RANK $(grep cpuset /proc/self/cgroup)\"'\n\
         timeout 60 mpiexec.mpich -n 4 {mpich}\n\
         {BIN} task list --json > tasks.json\n\
         second=$(awk '!seen[$0]++' \"$BERTH_NODEFILE\" | sed -n 2p); echo rsh-target $second\n\
         {BIN} task rsh -x -o BatchMode=yes $second 'echo rsh-out $BERTH_NODEID $(grep cpuset /proc/self/cgroup); echo rsh-err >&2; exit 3'\n\
         echo rsh-rc=$?\n\
         {BIN} task rsh elsewhere true\n\
         echo rsh-unknown=$?\n",
        ompi = ompi.display(),
        mpich = mpich.display()
    );
    let id = c.submit("mpirun.sh", &script, &[]);
    let job = c.wait_finished(id, Duration::from_secs(120));
    let out = std::fs::read_to_string(c.root().join(format!("berth-{id}.out"))).unwrap_or_default();
    let err = std::fs::read_to_string(c.root().join(format!("berth-{id}.err"))).unwrap_or_default();
    assert_eq!(job["state"], "completed", "{job:#}\n{out}\n{err}\n{}", c.logs());
    for (what, prefix) in [("Open MPI", "ompi-cg "), ("MPICH", "mpich-cg ")] {
        let ranks = lines(&out, prefix);
        assert_eq!(ranks.len(), 4, "{what}: {out}\n{err}");
        // Block placement over the host file: 2 ranks on each node, each in the job's cgroup there.
        for node in ["node1", "node2"] {
            let cgroup = format!("/{node}/job_{id}");
            let here = ranks.iter().filter(|l| l.trim_end().ends_with(&cgroup)).count();
            assert_eq!(here, 2, "{what}: 2 ranks in {cgroup}: {ranks:#?}");
        }
    }
    // The MPI programs wire up across the nodes (4 ranks, one world).
    let hellos = lines(&out, "hello from rank");
    assert_eq!(hellos.len(), 8, "{out}\n{err}");
    for r in 0..4 {
        let n = hellos.iter().filter(|l| l.starts_with(&format!("hello from rank {r} of 4"))).count();
        assert_eq!(n, 2, "rank {r} once per library: {hellos:#?}");
    }
    // The daemons were tasks of the job, one per node and run, all ended well.
    let tasks: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(c.root().join("tasks.json")).unwrap()).unwrap();
    let tasks = tasks.as_array().expect("task list");
    for daemon in ["orted", "hydra_pmi_proxy"] {
        let mut nodes: Vec<u64> = tasks
            .iter()
            .filter(|t| t["argv"].as_array().unwrap().iter().any(|a| a.as_str().unwrap_or("").contains(daemon)))
            .map(|t| {
                assert_eq!(t["state"], "exited", "{t:#}");
                assert_eq!(t["exit_code"], 0, "{t:#}");
                t["node_index"].as_u64().unwrap()
            })
            .collect();
        nodes.sort();
        // Two runs of each launcher: one daemon per node each time.
        assert_eq!(nodes, [0, 0, 1, 1], "{daemon} started as a task on each node: {tasks:#?}");
    }
    assert!(!err.contains("ssh"), "{err}");
    // `berth task rsh` itself: ssh's options skipped, output and exit status come back, an
    // unknown host is refused with ssh's 255 and the job's nodes.
    // The job's second node (index 1): node2, whichever agent registered first (a job's nodes
    // are listed in the cluster's order, names in natural order: docs/placement.md).
    let second = lines(&out, "rsh-target ").first().map(|l| l["rsh-target ".len()..].to_string()).unwrap_or_default();
    assert_eq!(second, "node2", "{out}");
    assert!(out.contains(&format!("rsh-out 1 3:cpuset:/berth/{}/{second}/job_{id}", c.cluster_id())), "{out}");
    assert!(err.contains("rsh-err") && out.contains("rsh-rc=3"), "{out}\n{err}");
    assert!(out.contains("rsh-unknown=255"), "{out}");
    // The job's nodes in its own order: the cluster's, by name (not registration order).
    let listed = err.contains("(its nodes: node1, node2)");
    assert!(err.contains("elsewhere is not a node of job") && listed, "{err}");
    assert_no_job_cgroups(&c);
}

/// Pids whose command line contains `marker`.
fn pids_with(marker: &str) -> Vec<i32> {
    let out = Command::new("pgrep").args(["-f", marker]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| l.trim().parse().ok()).collect()
}

#[test]
fn cancelling_the_job_ends_mpirun_and_mpiexec_daemons_and_ranks_on_every_node() {
    let c = Cluster::up(2, TOPO);
    let marker = format!("berth-mpirun-cancel-{}", std::process::id());
    // Each rank: a shell named after the marker (its $0) waiting on a sleep.
    let script = format!(
        "#!/bin/sh\n#BERTH --nodes 2 --tasks-per-node 2\n{OMPI_ENV}\n\
         mpirun.openmpi -n 4 sh -c 'sleep 3600; true' {marker}-ompi &\n\
         mpiexec.mpich -n 4 sh -c 'sleep 3600; true' {marker}-mpich &\n\
         wait\n"
    );
    let id = c.submit("spin.sh", &script, &[]);
    let t0 = Instant::now();
    let (mut ompi, mut mpich) = (vec![], vec![]);
    while t0.elapsed() < Duration::from_secs(60) {
        ompi = pids_with(&format!("{marker}-ompi"));
        mpich = pids_with(&format!("{marker}-mpich"));
        // mpirun's and mpiexec's own command lines carry the marker too.
        if ompi.len() > 4 && mpich.len() > 4 {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(ompi.len() > 4 && mpich.len() > 4, "ranks did not all start: {ompi:?} {mpich:?}\n{}", c.logs());
    // Every one of them runs in the job's cgroup, on one node or the other, beside the
    // daemons that started them (tasks of the job).
    let cpusets = cgroup_mount("cpuset").join("berth").join(c.cluster_id());
    let mut in_job: Vec<(i32, String, usize)> = vec![];
    for (n, node) in ["node1", "node2"].iter().enumerate() {
        let procs = std::fs::read_to_string(cpusets.join(node).join(format!("job_{id}")).join("cgroup.procs"))
            .unwrap_or_default();
        for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            in_job.push((pid, comm.trim().to_string(), n));
        }
    }
    for pid in ompi.iter().chain(&mpich) {
        if *pid == 0 || !pid_alive(*pid) {
            continue;
        }
        assert!(in_job.iter().any(|(p, _, _)| p == pid), "process {pid} is outside the job's cgroups: {in_job:?}");
    }
    for daemon in ["orted", "hydra_pmi_proxy"] {
        for n in 0..2 {
            assert!(
                in_job.iter().any(|(_, comm, at)| comm.starts_with(daemon) && *at == n),
                "no {daemon} in the job's cgroup on node {}: {in_job:?}",
                n + 1
            );
        }
    }
    let o = c.berth(&["cancel", &id.to_string()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let job = c.wait_finished(id, Duration::from_secs(60));
    assert_eq!(job["state"], "cancelled", "{job:#}");
    assert_no_process(&marker);
    let t0 = Instant::now();
    while in_job.iter().any(|(p, _, _)| pid_alive(*p)) && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let left: Vec<_> = in_job.iter().filter(|(p, _, _)| pid_alive(*p)).collect();
    assert!(left.is_empty(), "processes of the job survived its cancel: {left:?}");
    assert_no_job_cgroups(&c);
}

/// `berth task rsh` whose caller dies (SIGKILL, as an MPI launcher killed hard): the remote
/// task is hung up on as sshd does, not killed outright: SIGHUP at once, SIGTERM half the
/// grace later (a shell trapping both logs each and ends on the second), and a task that
/// ignores both is killed (SIGKILL) at the end of the grace, not before.
#[test]
fn a_dead_rsh_caller_hangs_up_on_its_remote_task_before_killing_it() {
    let c = Cluster::up(2, TOPO);
    let marker = format!("berth-rsh-hangup-{}", std::process::id());
    let script = format!(
        "#!/bin/sh\n#BERTH --nodes 2 --tasks-per-node 1\n\
         second=$(awk '!seen[$0]++' \"$BERTH_NODEFILE\" | sed -n 2p)\n\
         wait_for() {{ i=0; while ! grep -q \"$1\" \"$2\" 2>/dev/null && [ $i -lt 200 ]; do sleep 0.1; i=$((i+1)); done; }}\n\
         {BIN} task rsh $second 'trap \"echo hup >> hup.log\" HUP; trap \"echo term >> hup.log; exit 0\" TERM; echo ready >> hup.log; while :; do sleep 0.1; done' &\n\
         rsh=$!\n\
         wait_for ready hup.log\n\
         kill -9 $rsh\n\
         wait_for term hup.log\n\
         {BIN} task rsh $second 'trap \"\" HUP TERM; echo ready > stubborn.log; exec sh -c \"sleep 300; true\" {marker}' &\n\
         rsh=$!\n\
         wait_for ready stubborn.log\n\
         kill -9 $rsh; date +%s.%N > killed.at\n\
         i=0; while pgrep -f {marker} > /dev/null && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done\n\
         date +%s.%N > gone.at\n\
         {BIN} task list --json > tasks.json\n"
    );
    let id = c.submit("hangup.sh", &script, &[]);
    let job = c.wait_finished(id, Duration::from_secs(120));
    let read = |f: &str| std::fs::read_to_string(c.root().join(f)).unwrap_or_default();
    let (out, err) = (read(&format!("berth-{id}.out")), read(&format!("berth-{id}.err")));
    assert_eq!(job["state"], "completed", "{job:#}\n{out}\n{err}\n{}", c.logs());
    // The trapping shell: told HUP first, then TERM, and it ended on its own.
    assert_eq!(read("hup.log").lines().collect::<Vec<_>>(), ["ready", "hup", "term"], "{err}");
    // The stubborn one: gone only once the grace (at least 1 s) ran out, by SIGKILL.
    let at = |f: &str| read(f).trim().parse::<f64>().unwrap_or_else(|_| panic!("{f}: {:?}\n{err}", read(f)));
    let took = at("gone.at") - at("killed.at");
    assert!((0.9..50.0).contains(&took), "the ignoring task ended {took:.2} s after its caller died\n{err}");
    assert!(pids_with(&marker).is_empty(), "the task survived");
    let tasks: serde_json::Value = serde_json::from_str(&read("tasks.json")).expect("task list");
    let stubborn = tasks.as_array().unwrap().iter().find(|t| t["argv"].to_string().contains(&marker)).expect("task");
    assert_eq!(stubborn["signal"], 9, "{stubborn:#}");
    let trapping = tasks.as_array().unwrap().iter().find(|t| t["argv"].to_string().contains("hup.log")).expect("task");
    assert_eq!(trapping["exit_code"], 0, "{trapping:#}");
    assert_no_job_cgroups(&c);
}

/// `berth task rsh` forwards its standard input to the remote command, as ssh does: in order
/// and whole (4 MiB of random bytes through a `sha256sum` on the other node, against the
/// same sum here), a line through `cat`, and its end (`cat` on an empty stdin ends).
#[test]
fn rsh_forwards_its_stdin_to_the_remote_command() {
    let c = Cluster::up(2, TOPO);
    let script = format!(
        "#!/bin/sh\n#BERTH --nodes 2 --tasks-per-node 1\n\
         second=$(awk '!seen[$0]++' \"$BERTH_NODEFILE\" | sed -n 2p)\n\
         head -c 4194304 /dev/urandom > input.bin\n\
         sha256sum < input.bin | cut -d' ' -f1 > local.sum\n\
         {BIN} task rsh $second 'echo $BERTH_NODEID >&2; sha256sum | cut -d\" \" -f1' < input.bin > remote.sum\n\
         echo sum-rc=$?\n\
         echo hello | {BIN} task rsh $second cat > hello.out\n\
         {BIN} task rsh $second 'cat; echo done' < /dev/null > empty.out\n"
    );
    let id = c.submit("stdin.sh", &script, &[]);
    let job = c.wait_finished(id, Duration::from_secs(120));
    let read = |f: &str| std::fs::read_to_string(c.root().join(f)).unwrap_or_default();
    let (out, err) = (read(&format!("berth-{id}.out")), read(&format!("berth-{id}.err")));
    assert_eq!(job["state"], "completed", "{job:#}\n{out}\n{err}\n{}", c.logs());
    assert!(out.contains("sum-rc=0"), "{out}\n{err}");
    // The command ran on the other node (its BERTH_NODEID), and read every byte in order.
    assert_eq!(err.trim(), "1", "{err}");
    let local = read("local.sum");
    assert_eq!(local.trim().len(), 64, "{local:?}");
    assert_eq!(read("remote.sum"), local, "{err}");
    assert_eq!(read("hello.out"), "hello\n", "{err}");
    assert_eq!(read("empty.out"), "done\n", "{err}");
    assert_no_job_cgroups(&c);
}
