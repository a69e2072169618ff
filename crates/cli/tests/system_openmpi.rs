//! System tests of Open MPI programs (Debian's Open MPI 4.1, built with `mpicc.openmpi`)
//! launched directly by `berth run` through the agents' PMIx server: one agent, then two
//! (the modex crosses the control tree), a 1 MiB-per-rank allgather, sub-communicators
//! (MPI_Comm_split by parity, with MPI_UNDEFINED, and by node), MPI_Abort's code, and MPICH
//! beside them.

mod common;

use common::*;
use std::process::Output;
use std::time::{Duration, Instant};

/// 4 cores per agent: PUs map round-robin onto the host's 2 CPUs.
const TOPO: &str = "package:2 core:2 pu:1";

fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

/// Open MPI's TCP transport between nodes: the test's agents all run on this host, whose
/// other interfaces (containers' bridges, other tests' veths) come and go.
const OMPI_ENV: [(&str, &str); 1] = [("OMPI_MCA_btl_tcp_if_include", "lo")];

fn openmpi_suite(c: &Cluster, ranks: &str, per_node: &str, nodes: usize, mpi: &[&str], env: &[(&str, &str)]) {
    let dir = openmpi_programs();
    let prog = |n: &str| dir.join(n).display().to_string();
    let n: usize = ranks.parse().unwrap();
    let base = |p: &str| -> Vec<String> {
        let mut a: Vec<String> = mpi.iter().map(|s| s.to_string()).collect();
        a.extend(["-n", ranks, "--ntasks-per-node", per_node, "--label"].map(String::from));
        a.push(prog(p));
        a
    };
    let args = base("hello");
    let out = c.run_step(env, &args.iter().map(String::as_str).collect::<Vec<_>>());
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "hello: {stdout}{stderr}\n{}", c.logs());
    assert_eq!(stdout.matches("hello from rank").count(), n, "{stdout}");
    for r in 0..n {
        assert!(stdout.contains(&format!("hello from rank {r} of {n}")), "rank {r} missing: {stdout}");
    }
    let steps = c.json(&["acct", "--steps", "--limit", "1"]);
    assert_eq!(steps[0]["nodes"].as_array().unwrap().len(), nodes, "{steps}");
    let args = base("allreduce");
    let out = c.run_step(env, &args.iter().map(String::as_str).collect::<Vec<_>>());
    let (stdout, stderr) = text(&out);
    let want = n * (n - 1) / 2;
    assert!(out.status.success(), "allreduce: {stdout}{stderr}");
    assert_eq!(stdout.matches(&format!("allreduce sum={want} expected={want}")).count(), n, "{stdout}");
    let args = base("ring");
    let out = c.run_step(env, &args.iter().map(String::as_str).collect::<Vec<_>>());
    let (stdout, stderr) = text(&out);
    assert!(out.status.success() && stdout.contains("ring ok"), "ring: {stdout}{stderr}");
    // 1 MiB from every rank to every rank, each byte checked by each rank.
    let args = base("allgather");
    let out = c.run_step(env, &args.iter().map(String::as_str).collect::<Vec<_>>());
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "allgather: {stdout}{stderr}");
    assert_allgather_ok(&stdout, n, 1);
    let args = base("comm_split");
    let out = c.run_step(env, &args.iter().map(String::as_str).collect::<Vec<_>>());
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "comm_split: {stdout}{stderr}");
    assert_comm_split_ok(&stdout, n, per_node.parse().unwrap());
    let t0 = Instant::now();
    let args = base("abort");
    let out = c.run_step(env, &args.iter().map(String::as_str).collect::<Vec<_>>());
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(7), "abort: {stdout}{stderr}");
    assert!(stderr.contains("rank 1 on") && stderr.contains("MPI_Abort (code 7)"), "{stderr}");
    assert!(!stdout.contains("was not killed"), "{stdout}");
    assert!(t0.elapsed() < Duration::from_secs(20), "abort took {:?}", t0.elapsed());
    assert_no_process(&prog("abort"));
}

/// What every rank of `comm_split.c` (crates/agent/tests/mpi) prints when its sub-communicators
/// are right: by parity (sub-ranks in reverse world order, the allreduce of the world ranks of
/// its parity), without rank 0 (MPI_UNDEFINED), and by node: `per_node` ranks, each rank among
/// its node's and every one of them naming the same ones, the nodes' ranks all `n` ranks.
fn assert_comm_split_ok(stdout: &str, n: usize, per_node: usize) {
    assert!(!stdout.contains("comm_split bad"), "{stdout}");
    let mut nodes = std::collections::BTreeMap::new();
    for r in 0..n {
        let color = r % 2;
        let parity: Vec<usize> = (color..n).step_by(2).collect();
        let sub_rank = parity.iter().filter(|&&m| m > r).count();
        let sum: usize = parity.iter().sum();
        let rest = if r == 0 { "-1".to_string() } else { (n * (n - 1) / 2).to_string() };
        let want = format!(
            "comm_split ok rank={r} color={color} sub_rank={sub_rank} sub_size={} sum={sum} rest={rest} \
             node_size={per_node} node=",
            parity.len()
        );
        let line = stdout.lines().find(|l| l.contains(&want)).unwrap_or_else(|| panic!("no `{want}`: {stdout}"));
        let members: Vec<usize> =
            line.rsplit("node=").next().unwrap().trim().split(',').map(|m| m.parse().unwrap()).collect();
        assert!(members.len() == per_node && members.contains(&r), "rank {r}: {line}");
        nodes.insert(r, members);
    }
    for (r, members) in &nodes {
        for m in members {
            assert_eq!(&nodes[m], members, "ranks {r} and {m} disagree on their node: {stdout}");
        }
    }
    let groups: std::collections::BTreeSet<&Vec<usize>> = nodes.values().collect();
    assert_eq!(groups.len(), n / per_node, "{stdout}");
}

/// The namespace test makes and removes veths and bridges: Open MPI lists the interfaces in
/// MPI_Init, so the MPI tests of this file never run beside it.
static NETWORK_CHURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn open_mpi_runs_through_pmix_on_one_agent_then_across_two_and_mpi_abort_ends_the_step() {
    let _quiet_network = NETWORK_CHURN.lock().unwrap_or_else(|e| e.into_inner());
    let c = Cluster::up(2, TOPO);
    // The default (`auto`) offers PMIx beside PMI-1/PMI-2.
    openmpi_suite(&c, "2", "2", 1, &[], &OMPI_ENV);
    openmpi_suite(&c, "4", "2", 2, &["--mpi", "pmix"], &OMPI_ENV);
    let steps = c.json(&["acct", "--steps"]);
    let abort = steps.as_array().unwrap().iter().find(|s| s["exit_code"] == 7).expect("abort step");
    assert!(abort["failure"].as_str().unwrap().contains("MPI_Abort"), "{abort}");
    // MPICH keeps working beside it, under the same default.
    let hello = mpi_programs().join("hello").display().to_string();
    let out = c.run_step(&[], &["-n", "4", "--ntasks-per-node", "2", &hello]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "MPICH hello: {stdout}{stderr}");
    assert_eq!(stdout.matches("hello from rank").count(), 4, "{stdout}");
    let allgather = mpi_programs().join("allgather").display().to_string();
    let out = c.run_step(&[], &["-n", "4", "--ntasks-per-node", "2", &allgather]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "MPICH allgather: {stdout}{stderr}");
    assert_allgather_ok(&stdout, 4, 1);
    let comm_split = mpi_programs().join("comm_split").display().to_string();
    let out = c.run_step(&[], &["-n", "4", "--ntasks-per-node", "2", &comm_split]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "MPICH comm_split: {stdout}{stderr}");
    assert_comm_split_ok(&stdout, 4, 2);
    assert_no_job_cgroups(&c);
}

/// What `--mpi` offers the ranks: `PMI_FD` (PMI-1/PMI-2), a PMIx namespace, both (auto, the
/// default) or neither; `#BERTH --mpi` sets a job's default, `run --mpi` overrides it, srun's
/// `--mpi=pmix` is taken.
#[test]
fn mpi_kind_chooses_what_the_ranks_are_offered() {
    let c = Cluster::up(1, TOPO);
    let probe = ["sh", "-c", "echo fd=${PMI_FD:-no} ns=${PMIX_NAMESPACE:-no}"];
    let seen = |mpi: &[&str]| -> String {
        let mut args: Vec<&str> = mpi.to_vec();
        args.extend_from_slice(&probe);
        let out = c.run_step(&[], &args);
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "--mpi {mpi:?}: {stdout}{stderr}");
        stdout.trim().to_string()
    };
    let both = seen(&[]);
    assert!(both.starts_with("fd=") && !both.starts_with("fd=no") && both.contains(" ns=berth."), "{both}");
    let auto = seen(&["--mpi", "auto"]);
    assert!(!auto.starts_with("fd=no") && auto.contains(" ns=berth."), "{auto}");
    let pmix = seen(&["--mpi", "pmix"]);
    assert!(pmix.starts_with("fd=no ns=berth."), "{pmix}");
    let pmi2 = seen(&["--mpi", "pmi2"]);
    assert!(!pmi2.starts_with("fd=no") && pmi2.ends_with(" ns=no"), "{pmi2}");
    assert_eq!(seen(&["--mpi", "none"]), "fd=no ns=no");
    let bad = c.run_step(&[], &["--mpi", "openmpi", "true"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(text(&bad).1.contains("--mpi takes auto, pmix, pmi2, pmi1 or none"), "{}", text(&bad).1);
    // A job's default, overridden by run's own --mpi.
    let script = format!(
        "#!/bin/sh\n#BERTH --mpi pmi1\n{BIN} run sh -c 'echo job fd=${{PMI_FD:-no}} ns=${{PMIX_NAMESPACE:-no}}'\n\
         {BIN} run --mpi pmix sh -c 'echo run fd=${{PMI_FD:-no}} ns=${{PMIX_NAMESPACE:-no}}'\n"
    );
    let id = c.submit("mpi.sh", &script, &[]);
    let job = c.wait_finished(id, Duration::from_secs(60));
    assert_eq!(job["state"], "completed", "{job:#}\n{}", c.logs());
    let out = std::fs::read_to_string(c.root().join(format!("berth-{id}.out"))).unwrap();
    assert!(out.contains("job fd=") && !out.contains("job fd=no") && out.contains(" ns=no"), "{out}");
    assert!(out.contains("run fd=no ns=berth."), "{out}");
    assert_no_job_cgroups(&c);
}

/// Agents in their own network namespaces (`berth up --netns`): the modex crosses the control
/// tree between namespaces and Open MPI's TCP transport uses the agents' own addresses.
#[test]
fn open_mpi_runs_across_agents_in_network_namespaces() {
    require_root();
    let _quiet_network = NETWORK_CHURN.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::Builder::new().prefix("berth-netns-").tempdir().unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let c = Cluster::up_with(tmp, 2, TOPO, &["--netns"]);
    let nodes = c.json(&["nodes"]);
    let addrs: Vec<&str> = nodes.as_array().unwrap().iter().map(|n| n["address"].as_str().unwrap()).collect();
    assert!(addrs.iter().all(|a| a.starts_with("10.213.")), "agents have their own addresses: {addrs:?}");
    openmpi_suite(&c, "4", "2", 2, &[], &[("OMPI_MCA_btl_tcp_if_include", "10.213.0.0/16")]);
    assert_no_job_cgroups(&c);
}

/// Direct modex: ranks that read another node's rank's data without any fence that brought it
/// (the agent's server asks that rank's agent through the control tree). A plain PMIx client
/// (crates/agent/tests/mpi/pmixdmodex.c) on 3 agents, 2 ranks each (from the second node to
/// the third a request goes up to the first and down again), reads every other rank's value;
/// a rank the step does not have is refused at once (PMIX_ERR_NOT_FOUND, "NOT-FOUND"), never a hang. Then
/// Open MPI with neither a data-collecting fence nor one at all (`pmix_base_collect_data` 0,
/// `pmix_base_async_modex` 1: every peer's address comes by direct modex): the ring and the
/// allreduce across 2 agents. Without direct modex both fail (Open MPI's TCP transport finds
/// no address for the remote ranks).
#[test]
fn pmix_get_of_a_remote_ranks_data_without_a_fence_is_served_by_direct_modex() {
    let _quiet_network = NETWORK_CHURN.lock().unwrap_or_else(|e| e.into_inner());
    let c = Cluster::up(3, TOPO);
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../agent/tests/mpi/pmixdmodex.c");
    let prog = c.root().join("pmixdmodex");
    let built = std::process::Command::new("cc")
        .arg("-o")
        .arg(&prog)
        .arg(&src)
        .args(["-I/usr/lib/x86_64-linux-gnu/pmix2/include", "-lpmix"])
        .status()
        .expect("cannot run cc: install build-essential and libpmix-dev (scripts/setup.sh)");
    assert!(built.success(), "cc pmixdmodex.c -lpmix failed: install libpmix-dev (scripts/setup.sh)");
    let p = prog.display().to_string();
    let out = c.run_step(&[], &["--mpi", "pmix", "-n", "6", "--ntasks-per-node", "2", &p]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "pmixdmodex: {stdout}{stderr}\n{}", c.logs());
    for r in 0..6 {
        assert!(stdout.contains(&format!("dmodex rank={r} read=5 of 5")), "rank {r}: {stdout}{stderr}");
    }
    let steps = c.json(&["acct", "--steps", "--limit", "1"]);
    assert_eq!(steps[0]["nodes"].as_array().unwrap().len(), 3, "{steps}");
    let unknown = stdout.lines().find(|l| l.starts_with("unknown rank: ")).expect(&stdout);
    assert!(unknown.starts_with("unknown rank: NOT-FOUND after "), "{unknown}");
    let ms: u64 = unknown.rsplit(' ').nth(1).and_then(|n| n.parse().ok()).expect(unknown);
    assert!(ms < 5000, "the unknown rank took {ms} ms: {unknown}");
    // Open MPI, all remote data on demand.
    let env = [OMPI_ENV[0], ("OMPI_MCA_pmix_base_async_modex", "1"), ("OMPI_MCA_pmix_base_collect_data", "0")];
    let dir = openmpi_programs();
    let ring = dir.join("ring").display().to_string();
    let out = c.run_step(&env, &["-n", "4", "-N", "2", &ring]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success() && stdout.contains("ring ok"), "ring: {stdout}{stderr}\n{}", c.logs());
    let allreduce = dir.join("allreduce").display().to_string();
    let out = c.run_step(&env, &["-n", "4", "-N", "2", &allreduce]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "allreduce: {stdout}{stderr}");
    assert_eq!(stdout.matches("allreduce sum=6 expected=6").count(), 4, "{stdout}");
    let steps = c.json(&["acct", "--steps", "--limit", "1"]);
    assert_eq!(steps[0]["nodes"].as_array().unwrap().len(), 2, "{steps}");
    assert_no_job_cgroups(&c);
}

/// `MPI_Comm_spawn` under direct launch (`spawn.c`: 2 children, each sends its rank back to
/// the parent's rank 0, then parent and children merge their intercommunicator and sum their
/// ranks over it): the agent's PMIx server sends the spawn up the control tree to `berth run`,
/// which starts the children as a step of the same job (its cgroups, accounted: `acct
/// --steps` shows it) and answers with their namespace once they run; the port exchange
/// (`PMIx_Publish`/`Lookup`) and `PMIx_Connect` go through `berth run` too. Nothing is left.
#[test]
fn mpi_comm_spawn_starts_children_in_the_job_that_talk_to_their_parent() {
    let _quiet_network = NETWORK_CHURN.lock().unwrap_or_else(|e| e.into_inner());
    let c = Cluster::up(2, TOPO);
    let spawn = openmpi_programs().join("spawn").display().to_string();
    let t0 = Instant::now();
    let out = c.run_step(&OMPI_ENV, &["-n", "1", &spawn]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "spawn -n 1: {stdout}{stderr}\n{}", c.logs());
    assert!(t0.elapsed() < Duration::from_secs(30), "MPI_Comm_spawn took {:?}", t0.elapsed());
    // Parent rank 0 (merged rank 0) and children 1, 2: 3 ranks, 0 + 1 + 2.
    assert!(stdout.contains("spawn ok children=2 merged=3 sum=3"), "{stdout}{stderr}");
    assert!(stdout.contains("child 0 of 2 got 100") && stdout.contains("child 1 of 2 got 200"), "{stdout}");
    assert_eq!(stdout.matches(" of 3 sum=3").count(), 2, "both children merged: {stdout}");
    let steps = c.json(&["acct", "--steps", "--limit", "10"]);
    let all = steps.as_array().cloned().unwrap_or_default();
    let child =
        all.iter().find(|s| s["job"] == 1 && s["step"] == 2).unwrap_or_else(|| panic!("no spawned step: {steps}"));
    let parent = all.iter().find(|s| s["job"] == 1 && s["step"] == 1).unwrap_or_else(|| panic!("no step 1: {steps}"));
    assert_eq!(child["argv"], serde_json::json!([spawn, "child"]), "{child}");
    assert_eq!((child["size"].clone(), child["exit_code"].clone()), (2.into(), 0.into()), "{child}");
    assert!(child["end_time"].as_f64() <= parent["end_time"].as_f64(), "the children outlived their parent: {steps}");
    // 2 parent ranks on 2 agents: the children's step spans the job's 2 nodes too, and the
    // connect gathers both steps' nodes.
    let t0 = Instant::now();
    let out = c.run_step(&OMPI_ENV, &["-n", "2", "-N", "2", &spawn]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "spawn -n 2: {stdout}{stderr}\n{}", c.logs());
    assert!(t0.elapsed() < Duration::from_secs(30), "MPI_Comm_spawn took {:?}", t0.elapsed());
    assert!(stdout.contains("spawn ok children=2 merged=4 sum=6"), "{stdout}{stderr}");
    assert_eq!(stdout.matches(" of 4 sum=6").count(), 2, "both children merged: {stdout}");
    let steps = c.json(&["acct", "--steps", "--limit", "10"]);
    let all = steps.as_array().cloned().unwrap_or_default();
    let child =
        all.iter().find(|s| s["job"] == 2 && s["step"] == 2).unwrap_or_else(|| panic!("no spawned step: {steps}"));
    let parent = all.iter().find(|s| s["job"] == 2 && s["step"] == 1).unwrap_or_else(|| panic!("no step 1: {steps}"));
    let within = |n: &serde_json::Value| parent["nodes"].as_array().is_some_and(|p| p.contains(n));
    assert!(
        child["nodes"].as_array().is_some_and(|ns| ns.iter().all(within)),
        "children outside the job's nodes: {steps}"
    );
    assert_eq!(child["exit_code"], 0, "{child}");
    // A parent on one node of a 2-node job, its children on both: the node of a child alone
    // does not know the parent's namespace (berth registers a namespace only where its step
    // has ranks), Open MPI's child aborts in MPI_Init ("unable to reach each other"), and
    // berth ends the parent too (it would wait for its children for ever): within seconds.
    let script = format!("#!/bin/sh\nexport OMPI_MCA_btl_tcp_if_include=lo\n{BIN} run -n 1 {spawn}\necho rc=$?\n");
    let t0 = Instant::now();
    let id = c.submit("spawn1.sh", &script, &["--nodes", "2", "--tasks-per-node", "1", "--walltime", "5:00"]);
    let job = c.wait_finished(id, Duration::from_secs(90));
    let read = |f: &str| std::fs::read_to_string(c.root().join(f)).unwrap_or_default();
    let (out, err) = (read(&format!("berth-{id}.out")), read(&format!("berth-{id}.err")));
    assert_eq!(job["state"], "completed", "{job}\n{out}\n{err}");
    assert!(
        t0.elapsed() < Duration::from_secs(45),
        "the spawning step was left waiting: {:?}\n{out}\n{err}",
        t0.elapsed()
    );
    assert!(
        err.contains(&format!("spawned step {id}.2 failed")) && err.contains("ending the step that spawned it"),
        "{out}\n{err}"
    );
    assert!(out.contains("rc=") && !out.contains("rc=0"), "{out}\n{err}");
    assert_no_process(&spawn);
    assert_no_job_cgroups(&c);
}

/// A CPU list ("0-1,4") as a set; None when it is not one.
fn cpu_set(list: &str) -> Option<std::collections::BTreeSet<u32>> {
    let mut set = std::collections::BTreeSet::new();
    for part in list.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => set.extend(a.parse::<u32>().ok()?..=b.parse::<u32>().ok()?),
            None => {
                set.insert(part.parse::<u32>().ok()?);
            }
        }
    }
    Some(set)
}

/// One line of `pmixbind.c`: its `key=value` words.
fn words(line: &str) -> std::collections::HashMap<&str, &str> {
    line.split_whitespace().filter_map(|w| w.split_once('=')).collect()
}

/// The CPUs of field `kind` (two letters: SK, CR, HT, ...) of a locality string
/// ("SK0:L30:L20:L10:CR0:HT0:NM0").
fn locality_field(locality: &str, kind: &str) -> std::collections::BTreeSet<u32> {
    let field = locality.split(':').find_map(|f| f.strip_prefix(kind));
    let field = field.unwrap_or_else(|| panic!("no {kind} in locality {locality:?}"));
    cpu_set(field).unwrap_or_else(|| panic!("{kind} of {locality:?} is not a CPU list"))
}

/// CPU binding through PMIx, as Slurm's and PRRTE's servers give it: each bound rank's
/// PMIX_CPUSET (libpmix's "hwloc:LIST") is the affinity it really has, its
/// PMIX_LOCALITY_STRING names the same PUs, and a local peer's locality string is the one that
/// peer reads of itself; Open MPI 4.1 computes its peers' locality from them (two ranks of a
/// node on one package but distinct cores: an OMPI_COMM_TYPE_SOCKET split holds both, a
/// core split one; unbound, without the strings, both splits hold one rank). Unbound ranks
/// (`--binding none`) get neither key.
#[test]
fn pmix_gives_bound_ranks_their_cpuset_and_locality_and_open_mpi_uses_them() {
    let _quiet_network = NETWORK_CHURN.lock().unwrap_or_else(|e| e.into_inner());
    let c = Cluster::up(2, TOPO);
    let p = build_pmix_program(&c, "cc", "pmixbind");
    let layout = ["-n", "4", "--ntasks-per-node", "2"];
    let run = |extra: &[&str]| -> Vec<String> {
        let mut args = vec!["--mpi", "pmix"];
        args.extend_from_slice(&layout);
        args.extend_from_slice(extra);
        args.push(&p);
        let out = c.run_step(&[], &args);
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "pmixbind {extra:?}: {stdout}{stderr}\n{}", c.logs());
        let lines: Vec<String> = stdout.lines().filter(|l| l.starts_with("pmixbind ")).map(String::from).collect();
        assert_eq!(lines.len(), 4, "{stdout}");
        lines
    };
    let bound = run(&["--binding", "linear"]);
    let by_rank: std::collections::HashMap<&str, std::collections::HashMap<&str, &str>> =
        bound.iter().map(|l| words(l)).map(|w| (w["rank"], w)).collect();
    assert_eq!(by_rank.len(), 4, "{bound:?}");
    for w in by_rank.values() {
        let affinity = cpu_set(w["affinity"]).unwrap_or_else(|| panic!("affinity: {w:?}"));
        assert_eq!(affinity.len(), 1, "one core of one PU per rank: {w:?}");
        let cpuset = w["cpuset"].strip_prefix("hwloc:").unwrap_or_else(|| panic!("PMIX_CPUSET: {w:?}"));
        assert_eq!(cpu_set(cpuset), Some(affinity.clone()), "PMIX_CPUSET is the rank's affinity: {w:?}");
        assert_eq!(locality_field(w["locality"], "HT"), affinity, "{w:?}");
        // Its local peer (the other rank of its node) reads the locality that peer reads of itself.
        let peer = by_rank.get(w["peer"]).unwrap_or_else(|| panic!("peer of {w:?}"));
        assert_eq!(w["peer_locality"], peer["locality"], "{w:?} / {peer:?}");
        let rel = u32::from_str_radix(w["relative"].trim_start_matches("0x"), 16)
            .unwrap_or_else(|_| panic!("relative locality: {w:?}"));
        // The node's PMIX_LOCAL_CPUSETS: its ranks' CPU lists in rank order (PMIX_LOCAL_PEERS's).
        let rank = |x: &std::collections::HashMap<&str, &str>| x["rank"].parse::<u32>().unwrap();
        let (lo, hi) = if rank(w) < rank(peer) { (w, peer) } else { (peer, w) };
        assert_eq!(w["lcpus"], format!("{}:{}", lo["affinity"], hi["affinity"]), "{w:?}");
        for (kind, bit) in [("SK", 0x20), ("CR", 0x2), ("HT", 0x1)] {
            let shared = !locality_field(w["locality"], kind).is_disjoint(&locality_field(peer["locality"], kind));
            assert_eq!(rel & bit != 0, shared, "{kind} in {rel:#x}: {w:?} / {peer:?}");
        }
    }
    for l in run(&["--binding", "none"]) {
        let w = words(&l);
        assert_eq!((w["cpuset"], w["locality"], w["relative"]), ("none", "none", "none"), "{l}");
        assert_eq!(w["lcpus"], "UNBOUND:UNBOUND", "{l}");
    }
    // Open MPI's own view: by node, package and core, as the locality strings say.
    let loc = openmpi_programs().join("locality").display().to_string();
    let mut args = vec!["--mpi", "pmix"];
    args.extend_from_slice(&layout);
    args.extend_from_slice(&["--binding", "linear", &loc]);
    let out = c.run_step(&OMPI_ENV, &args);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "locality: {stdout}{stderr}");
    for w in stdout.lines().filter(|l| l.starts_with("locality ")).map(words) {
        let me = &by_rank[w["rank"]];
        let peer = &by_rank[me["peer"]];
        let with_peer = |kind: &str| {
            1 + usize::from(!locality_field(me["locality"], kind).is_disjoint(&locality_field(peer["locality"], kind)))
        };
        let want = format!("node=2 socket={} core={}", with_peer("SK"), with_peer("CR"));
        let got = format!("node={} socket={} core={}", w["node"], w["socket"], w["core"]);
        assert_eq!(got, want, "rank {}: {stdout}", w["rank"]);
    }
    assert_eq!(stdout.matches("locality rank=").count(), 4, "{stdout}");
    // Unbound ranks, no locality strings: Open MPI knows only that its peer shares the node.
    let mut args = vec!["--mpi", "pmix"];
    args.extend_from_slice(&layout);
    args.extend_from_slice(&["--binding", "none", &loc]);
    let out = c.run_step(&OMPI_ENV, &args);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "locality, unbound: {stdout}{stderr}");
    for r in 0..4 {
        assert!(stdout.contains(&format!("locality rank={r} node=2 socket=1 core=1")), "{stdout}");
    }
    assert_no_job_cgroups(&c);
}

/// `--no-kill` under Open MPI: a lost rank is announced to the survivors as the PMIx event
/// PMIX_ERR_PROC_ABORTED, on every node, to the handlers registered for it (an Open MPI
/// program that registers one through libpmix sees it, naming the lost rank); Open MPI's own
/// default handler, which would abort the job, is not given it: without a handler the
/// survivors finalize as well.
#[test]
fn no_kill_survivors_get_a_pmix_event_for_a_lost_rank_and_open_mpi_is_not_aborted() {
    let _quiet_network = NETWORK_CHURN.lock().unwrap_or_else(|e| e.into_inner());
    let c = Cluster::up(2, TOPO);
    let p = build_pmix_program(&c, "mpicc.openmpi", "pmixevent");
    for mode in ["handler", "none"] {
        let args = ["--no-kill", "--mpi", "pmix", "-n", "4", "--ntasks-per-node", "2", &p, mode];
        let out = c.run_step(&OMPI_ENV, &args);
        let (stdout, stderr) = text(&out);
        // The step's status is its failed rank's (SIGKILL); the others ran to their end.
        assert_eq!(out.status.code(), Some(137), "{mode}: {stdout}{stderr}");
        assert!(stderr.contains("rank 3 on node2 killed by signal 9"), "{mode}: {stderr}");
        // The survivors' MPI_Finalize returned: they exited 0.
        assert!(stderr.contains("1 of 4 ranks failed"), "{mode}: {stderr}");
        let events = if mode == "handler" { 1 } else { 0 };
        for r in 0..3 {
            assert!(
                stdout.contains(&format!("rank {r}: survived, {events} events")),
                "{mode}, rank {r}: {stdout}{stderr}"
            );
            let seen = stdout.contains(&format!("rank {r}: event PROC-ABORTED for rank 3"));
            assert_eq!(seen, mode == "handler", "{mode}, rank {r}: {stdout}");
        }
        assert!(!stdout.contains("not registered") && !stdout.contains("rank 3: survived"), "{mode}: {stdout}");
    }
    assert_no_process(&p);
    assert_no_job_cgroups(&c);
}

fn node_state(c: &Cluster, node: &str) -> String {
    let nodes = c.json(&["nodes"]);
    let n = nodes.as_array().unwrap().iter().find(|n| n["name"] == node).cloned().unwrap_or_default();
    n["state"].as_str().unwrap_or("").to_string()
}

/// `--no-kill` under Open MPI, a node lost as a whole (its agent killed, -9, while the ranks
/// wait): the survivors on the two other nodes get the PMIx event PMIX_EVENT_NODE_DOWN naming
/// the node (host name, node id, the ranks it ran), then PMIX_ERR_PROC_ABORTED for each of
/// its ranks, in the handler they registered; they finalize and exit 0, and `run` reports the
/// two lost ranks only.
#[test]
fn no_kill_survivors_get_a_pmix_node_down_event_when_a_node_is_lost() {
    let _quiet_network = NETWORK_CHURN.lock().unwrap_or_else(|e| e.into_inner());
    let c = Cluster::up(3, TOPO);
    let p = build_pmix_program(&c, "mpicc.openmpi", "pmixevent");
    let script = format!(
        "#!/bin/sh\n#BERTH --nodes 3 --cores 6 --no-kill --walltime 300\nexport OMPI_MCA_btl_tcp_if_include=lo\n\
         {BIN} run --no-kill --mpi pmix -n 6 --ntasks-per-node 2 {p} node 2\necho \"run exited $?\"\n"
    );
    let id = c.submit("nodedown.sh", &script, &[]);
    let job = c.wait_state(id, &["running"], Duration::from_secs(30));
    let nodes: Vec<String> =
        job["allocation"].as_array().unwrap().iter().map(|a| a["node"].as_str().unwrap().to_string()).collect();
    assert_eq!(nodes.len(), 3, "{job:#}");
    let out_file = c.root().join(format!("berth-{id}.out"));
    let t0 = Instant::now();
    while std::fs::read_to_string(&out_file).unwrap_or_default().matches(": ready").count() < 6 {
        assert!(t0.elapsed() < Duration::from_secs(60), "the ranks never got ready\n{}", c.logs());
        std::thread::sleep(Duration::from_millis(100));
    }
    // The third node (ranks 4 and 5; not the one running the script) is lost.
    let lost = nodes[2].clone();
    // SAFETY: kill(2) on an agent this test started.
    assert_eq!(unsafe { libc::kill(c.pid_of(&lost), libc::SIGKILL) }, 0);
    let job = c.wait_finished(id, Duration::from_secs(90));
    let out = std::fs::read_to_string(&out_file).unwrap();
    let err = std::fs::read_to_string(c.root().join(format!("berth-{id}.err"))).unwrap_or_default();
    assert_eq!(job["state"], "completed", "{job:#}\n{out}{err}\n{}", c.logs());
    for r in 0..4 {
        assert!(out.contains(&format!("rank {r}: node down {lost} (node 2, ranks 4,5)")), "rank {r}: {out}{err}");
        for l in [4, 5] {
            assert!(out.contains(&format!("rank {r}: event PROC-ABORTED for rank {l}")), "rank {r}, {l}: {out}{err}");
        }
        assert!(out.contains(&format!("rank {r}: survived, 2 events, 1 nodes down")), "rank {r}: {out}{err}");
    }
    // The survivors exited 0: only the lost node's two ranks are failures.
    assert!(err.contains(&format!("lost nodes {lost}")), "{err}");
    assert!(err.contains("2 of 6 ranks failed"), "{err}");
    assert!(out.contains("run exited 1"), "{out}");
    // The lost agent comes back and cleans up what it ran.
    let up = c.berth(&["up"]);
    assert!(up.status.success(), "{}{}", String::from_utf8_lossy(&up.stdout), String::from_utf8_lossy(&up.stderr));
    let t0 = Instant::now();
    while node_state(&c, &lost) != "up" {
        assert!(t0.elapsed() < Duration::from_secs(60), "{lost} never came back\n{}", c.logs());
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_no_process(&p);
    assert_no_job_cgroups(&c);
}
