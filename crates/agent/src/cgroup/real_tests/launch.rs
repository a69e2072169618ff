//! Real launches through `run_job` on v1: rank sub-cpusets, the job's environment, the
//! `set` mode's affinity, the `pe` mode's rankfile and the JobStarted report.

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use berth_core::topology::Topology;
use berth_core::CpuSet;
use berth_protocol::agent::{AgentMessage, CgroupReport, LaunchSpec};

use super::*;
use crate::cpumap::CpuMap;
use crate::job::run_job;
use crate::ports::JobContext;

/// A job of `id` on a node of `pus` single-PU cores (socket 0), one rank per core, bound to
/// the last core, run as nobody; its script prints its environment and affinity to `out`.
fn spec(id: u64, pus: u32, mode: &str, out: &Path) -> LaunchSpec {
    let script = [
        "#!/bin/sh",
        "env | grep '^BERTH_' | sort",
        "grep Cpus_allowed_list /proc/self/status",
        "grep ':cpuset:' /proc/self/cgroup",
        "[ -n \"$BERTH_RANKFILE\" ] && cat \"$BERTH_RANKFILE\" && stat -c 'mode %a uid %u' \"$BERTH_RANKFILE\"",
        "exit 0\n",
    ]
    .join("\n");
    let last = pus - 1;
    let ranks: Vec<serde_json::Value> =
        (0..pus).map(|p| serde_json::json!({"cpus": p.to_string(), "mems": "0"})).collect();
    serde_json::from_value(serde_json::json!({
        "id": id, "name": "t", "user": {"uid": 65534, "gid": 65534, "groups": [], "name": "nobody"},
        "env": [], "cwd": "/", "script": script, "stdout": out, "stderr": out,
        "allocation": {"node_id": 0, "node": "n", "cpus": format!("0-{last}"), "cores": pus, "mems": "0",
                       "memory_bytes": 64u64 << 20, "binding": [[0, last]], "ranks": ranks},
        "nodes": [["n", pus]], "walltime_seconds": 60, "kill_grace_ms": 100,
        "binding_mode": mode, "rankfile": "rank 0=n slot=0:0\n"
    }))
    .unwrap()
}

#[test]
fn v1_launch_with_ranks_binding_and_rankfile() {
    let Some(r) = v1_root("v1_launch_with_ranks_binding_and_rankfile", unique("berth-test/cg")) else {
        return;
    };
    let (cpus, mems) = r.backend.root_cpus_mems().unwrap();
    let (real, real_mems) = (CpuSet::parse_list(&cpus).unwrap(), CpuSet::parse_list(&mems).unwrap());
    let host: Vec<u32> = real.iter().take(2).collect();
    let pus = host.len() as u32;
    let topo = Topology::uniform(1, 1, pus, 1, 1 << 30);
    let cpumap = CpuMap::round_robin(&topo, real.clone(), real_mems.clone());
    let tmp = tempfile::tempdir().unwrap();
    // The user must reach its spool directory and write its output here.
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let spool_root = tmp.path().join("spool");
    std::fs::create_dir(&spool_root).unwrap();
    std::fs::set_permissions(&spool_root, std::fs::Permissions::from_mode(0o711)).unwrap();
    let backend: Arc<dyn CgroupBackend> = Arc::new(r.backend.clone());
    let ctx = Arc::new(JobContext {
        cgroups: backend,
        cpumap,
        topology: topo,
        spool_root,
        registry: Default::default(),
        agent_socket: tmp.path().join("agent.sock"),
        shim: None,
        rsh: None,
        records: None,
        reports: None,
        priority: Default::default(),
        conns: Default::default(),
        auth: None,
    });
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mem0 = real_mems.iter().next().unwrap().to_string();
    let last_cpu = host[host.len() - 1].to_string();

    for (id, mode) in [(901, "set"), (902, "pe")] {
        let out = tmp.path().join(format!("{mode}.out"));
        let (_kill_tx, kill_rx) = tokio::sync::mpsc::unbounded_channel();
        let (ev_tx, mut ev_rx) = tokio::sync::mpsc::unbounded_channel();
        let outcome = rt.block_on(run_job(spec(id, pus, mode, &out), ctx.clone(), kill_rx, ev_tx));
        let text = std::fs::read_to_string(&out).unwrap_or_default();
        assert_eq!(outcome.exit_code, Some(0), "{outcome:?}\n{text}");

        let job_rel = format!("{}/job_{id}", r.rel);
        let job_dir = r.paths().cpuset.join(format!("job_{id}"));
        let Ok(AgentMessage::JobStarted { cgroups, .. }) = ev_rx.try_recv() else {
            panic!("no JobStarted for {id}");
        };
        let mut want = vec![CgroupReport {
            path: job_rel.clone(),
            cpus: CpuSet::from_iter_u32(host.iter().copied()).to_list(),
            mems: mem0.clone(),
            rank: None,
        }];
        for (i, c) in host.iter().enumerate() {
            let (path, cpus) = (format!("{job_rel}/rank{i}"), c.to_string());
            want.push(CgroupReport { path, cpus, mems: mem0.clone(), rank: Some(i as u32) });
        }
        assert_eq!(cgroups, want);

        let ranks: Vec<String> = (0..pus).map(|i| format!("{}/rank{i}", job_dir.display())).collect();
        let has = |line: String| assert!(text.lines().any(|l| l == line), "no {line:?} in:\n{text}");
        has(format!("BERTH_CPUSET={}", job_dir.display()));
        has(format!("BERTH_RANK_CPUSETS={}", ranks.join(" ")));
        has(format!("BERTH_BINDING={{{last_cpu}}}"));
        has(format!("BERTH_BINDING_CORES=0,{}", pus - 1));
        // The script itself stays in the job's cpuset; ranks are for a launcher to fill.
        assert!(text.lines().any(|l| l.contains(":cpuset:") && l.ends_with(&format!("/{job_rel}"))), "{text}");
        if mode == "set" {
            has(format!("Cpus_allowed_list:\t{last_cpu}"));
            assert!(!text.contains("BERTH_RANKFILE"), "{text}");
        } else {
            has(format!("Cpus_allowed_list:\t{}", CpuSet::from_iter_u32(host.iter().copied()).to_list()));
            has(format!("BERTH_RANKFILE={}/{id}/rankfile", ctx.spool_root.display()));
            has("rank 0=n slot=0:0".into());
            has("mode 600 uid 65534".into());
        }
        for d in r.dirs(Some(&format!("job_{id}"))) {
            assert!(!d.exists(), "{} left behind", d.display());
        }
        assert!(!ctx.spool_root.join(id.to_string()).exists());
    }
    r.finish();
}

/// Issue 16 item 1: a panic in the supervision of one job ends that job `failed` with the
/// reason, kills its processes (a setsid'd background child too) and removes its cgroup and
/// spool, instead of leaving it running unsupervised.
#[test]
fn v1_a_panic_in_a_jobs_supervision_ends_it_and_kills_what_it_ran() {
    let Some(r) = v1_root("v1_a_panic_in_a_jobs_supervision_ends_it", unique("berth-test/cg")) else {
        return;
    };
    let (cpus, mems) = r.backend.root_cpus_mems().unwrap();
    let (real, real_mems) = (CpuSet::parse_list(&cpus).unwrap(), CpuSet::parse_list(&mems).unwrap());
    let topo = Topology::uniform(1, 1, 1, 1, 1 << 30);
    let cpumap = CpuMap::round_robin(&topo, real, real_mems);
    let tmp = tempfile::tempdir().unwrap();
    let spool_root = tmp.path().join("spool");
    std::fs::create_dir_all(spool_root.join("903")).unwrap();
    let backend: Arc<dyn CgroupBackend> = Arc::new(r.backend.clone());
    let ctx = Arc::new(JobContext {
        cgroups: backend.clone(),
        cpumap,
        topology: topo,
        spool_root: spool_root.clone(),
        registry: Default::default(),
        agent_socket: tmp.path().join("agent.sock"),
        shim: None,
        rsh: None,
        records: None,
        reports: None,
        priority: Default::default(),
        conns: Default::default(),
        auth: None,
    });
    let limits = crate::cgroup::JobLimits {
        cpus: cpus.clone(),
        mems: mems.clone(),
        memory_limit_bytes: Some(64 << 20),
        pids_max: None,
        deny_devices: vec![],
    };
    let job = backend.create("job_903", &limits).unwrap();
    let mut child = spawn_in(&*job, "setsid sleep 300 & exec sleep 300");
    let pids = wait_pids(&*job, 2);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let outcome = rt.block_on(crate::daemon::contained(berth_core::JobId(903), &ctx, async move {
        let _job = job;
        panic!("injected: time arithmetic overflowed");
    }));
    let _ = child.wait();
    assert_eq!(outcome.final_state(), berth_core::job::JobState::Failed, "{outcome:?}");
    let reason = outcome.reason.clone().unwrap_or_default();
    assert!(reason.starts_with("agent_error:") && reason.contains("injected"), "{reason}");
    for pid in pids {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists()
                || read(&PathBuf::from(format!("/proc/{pid}/stat"))).contains(") Z"),
            "pid {pid} survived"
        );
    }
    for d in r.dirs(Some("job_903")) {
        assert!(!d.exists(), "{} left behind", d.display());
    }
    assert!(!spool_root.join("903").exists(), "spool left behind");
    r.finish();
}
