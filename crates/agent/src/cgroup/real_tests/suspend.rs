//! Real v1 suspension through `run_job`: a frozen job makes no progress, its walltime clock
//! stops, it resumes on other CPUs, and it can be killed while frozen.

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use berth_core::job::{JobOutcome, NodeAllocation};
use berth_core::topology::Topology;
use berth_core::{CpuSet, JobId};
use berth_protocol::agent::{AgentMessage, LaunchSpec};
use tokio::sync::mpsc;

use super::*;
use crate::cpumap::CpuMap;
use crate::job::run_job;
use crate::job::suspend;
use crate::ports::{JobContext, JobHandle};

/// A test cluster node: a v1 subtree, a spool, and a node of one PU per real CPU (at most 2).
struct Node {
    r: Root,
    tmp: tempfile::TempDir,
    ctx: Arc<JobContext>,
    /// The real CPUs, PU i on `host[i]`.
    host: Vec<u32>,
}

fn node(test: &str) -> Option<Node> {
    let r = v1_root(test, unique("berth-test/cg"))?;
    let (cpus, mems) = r.backend.root_cpus_mems().unwrap();
    let (real, real_mems) = (CpuSet::parse_list(&cpus).unwrap(), CpuSet::parse_list(&mems).unwrap());
    let host: Vec<u32> = real.iter().take(2).collect();
    let topo = Topology::uniform(1, 1, host.len() as u32, 1, 1 << 30);
    let cpumap = CpuMap::round_robin(&topo, CpuSet::from_iter_u32(host.iter().copied()), real_mems);
    let tmp = tempfile::tempdir().unwrap();
    // The job's user (nobody) must reach its spool directory and write its files here.
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
    Some(Node { r, tmp, ctx, host })
}

impl Node {
    /// A job on PU `pu` running `script` as nobody, with `walltime` seconds.
    fn spec(&self, id: u64, pu: u32, walltime: u64, script: &str, ranks: bool) -> LaunchSpec {
        let out = self.tmp.path().join(format!("{id}.out"));
        let ranks: Vec<serde_json::Value> =
            if ranks { vec![serde_json::json!({"cpus": pu.to_string(), "mems": "0"})] } else { vec![] };
        serde_json::from_value(serde_json::json!({
            "id": id, "name": "t", "user": {"uid": 65534, "gid": 65534, "groups": [], "name": "nobody"},
            "env": [["OUT", self.counter(id).display().to_string()]], "cwd": "/",
            "script": format!("#!/bin/sh\n{script}\n"), "stdout": out, "stderr": out,
            "allocation": {"node_id": 0, "node": "n", "cpus": pu.to_string(), "cores": 1, "mems": "0",
                           "memory_bytes": 64u64 << 20, "ranks": ranks},
            "nodes": [["n", 1]], "walltime_seconds": walltime, "kill_grace_ms": 200
        }))
        .unwrap()
    }

    /// The file the counting jobs append to.
    fn counter(&self, id: u64) -> PathBuf {
        self.tmp.path().join(format!("{id}.count"))
    }

    fn freezer_state(&self, id: u64) -> String {
        read(&self.r.paths().freezer.join(format!("job_{id}/freezer.state")))
    }

    fn cpuset_cpus(&self, id: u64) -> String {
        read(&self.r.paths().cpuset.join(format!("job_{id}/cpuset.cpus")))
    }

    /// Nothing of job `id` is left: no cgroup in any hierarchy, no spool directory.
    fn assert_gone(&self, id: u64) {
        for d in self.r.dirs(Some(&format!("job_{id}"))) {
            assert!(!d.exists(), "{} left behind", d.display());
        }
        assert!(!self.ctx.spool_root.join(id.to_string()).exists());
    }
}

const COUNT: &str = "while :; do echo x >> \"$OUT\"; sleep 0.05; done";

fn size(p: &Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}

/// Start job `spec` and return its handle once it runs, the kill sender and the outcome.
async fn start(
    n: &Node,
    spec: LaunchSpec,
) -> (Arc<JobHandle>, mpsc::UnboundedSender<String>, tokio::task::JoinHandle<JobOutcome>) {
    let id = spec.id;
    let (kill_tx, kill_rx) = mpsc::unbounded_channel();
    let (ev_tx, _ev_rx) = mpsc::unbounded_channel::<AgentMessage>();
    let run = tokio::spawn(run_job(spec, n.ctx.clone(), kill_rx, ev_tx));
    let job = n.ctx.registry.wait_for(id, Duration::from_secs(10)).await;
    let Some(job) = job else { panic!("job {id} did not start: {:?}", run.await) };
    (job, kill_tx, run)
}

/// Wait until the file grows past `from` (the job makes progress), up to 5 s.
async fn grows(p: &Path, from: u64) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if size(p) > from {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

#[test]
fn v1_suspend_freezes_and_resume_moves_to_other_cpus() {
    let Some(n) = node("v1_suspend_freezes_and_resume_moves_to_other_cpus") else {
        return;
    };
    rt().block_on(async {
        let id = 931;
        let (job, kill, run) = start(&n, n.spec(id, 0, 60, COUNT, false)).await;
        let counter = n.counter(id);
        assert!(grows(&counter, 0).await, "the job never counted");
        assert_eq!(n.freezer_state(id), "THAWED");
        assert_eq!(n.cpuset_cpus(id), n.host[0].to_string());

        suspend::suspend(&job).await.unwrap();
        assert_eq!(n.freezer_state(id), "FROZEN");
        assert!(job.suspension.is_suspended());
        suspend::suspend(&job).await.unwrap(); // idempotent
        let frozen_at = size(&counter);
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(size(&counter), frozen_at, "a frozen job made progress");
        for pid in job.cgroup.pids().unwrap() {
            // v1 frozen tasks sleep uninterruptibly in the refrigerator.
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            let state = status.lines().find(|l| l.starts_with("State:")).unwrap_or("");
            assert!(state.contains("D (disk sleep)"), "pid {pid} is not frozen: {state}");
        }

        // Resume on the last PU (the other real CPU when there are two).
        let last = n.host.len() as u32 - 1;
        let mut to: NodeAllocation = job.spec.allocation.clone();
        to.cpus = CpuSet::from_iter_u32([last]);
        let reports = suspend::resume(&n.ctx, &job, Some(&to)).await.unwrap();
        assert_eq!(n.cpuset_cpus(id), n.host[last as usize].to_string());
        assert_eq!(reports.len(), 1);
        assert_eq!(reports[0].cpus, n.host[last as usize].to_string());
        assert!(reports[0].path.ends_with(&format!("job_{id}")), "{:?}", reports[0]);
        let memory_migrate = n.r.paths().cpuset.join(format!("job_{id}/cpuset.memory_migrate"));
        if memory_migrate.exists() {
            assert_eq!(read(&memory_migrate), "1");
        }
        assert_eq!(n.freezer_state(id), "THAWED");
        assert!(!job.suspension.is_suspended());
        assert!(job.suspension.paused() >= Duration::from_millis(600));
        assert!(grows(&counter, frozen_at).await, "the resumed job does not count");
        for pid in job.cgroup.pids().unwrap() {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            let cpus = status.lines().find(|l| l.starts_with("Cpus_allowed_list:")).unwrap_or("");
            if !cpus.is_empty() {
                assert_eq!(cpus.split_whitespace().nth(1), Some(n.host[last as usize].to_string().as_str()));
            }
        }

        kill.send("cancelled".into()).unwrap();
        let outcome = run.await.unwrap();
        assert_eq!(outcome.reason.as_deref(), Some("cancelled"), "{outcome:?}");
    });
    n.assert_gone(931);
    n.r.finish();
}

#[test]
fn v1_walltime_does_not_count_suspended_time() {
    let Some(n) = node("v1_walltime_does_not_count_suspended_time") else {
        return;
    };
    rt().block_on(async {
        let id = 932;
        let began = Instant::now();
        let (job, _kill, run) = start(&n, n.spec(id, 0, 3, COUNT, false)).await;
        // Suspend once it runs (it counts), not after a fixed time.
        assert!(grows(&n.counter(id), 0).await, "the job never counted");
        assert!(!run.is_finished(), "ended before it was suspended");
        suspend::suspend(&job).await.unwrap();
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(!run.is_finished(), "ended while suspended");
        suspend::resume(&n.ctx, &job, None).await.unwrap();
        let paused = job.suspension.paused();
        assert!(paused >= Duration::from_secs(2), "suspended for only {paused:?}");
        let outcome = run.await.unwrap();
        let took = began.elapsed();
        assert_eq!(outcome.reason.as_deref(), Some("walltime"), "{outcome:?}");
        // 3 s of walltime + the time suspended (at least 2 s), + setup and the 200 ms grace:
        // strictly no less, since the walltime clock runs only while the job does. The upper
        // bound only catches a walltime that never ends, not a slow loaded machine.
        println!("ended after {took:?}, {paused:?} of it suspended");
        assert!(
            took >= Duration::from_secs(3) + paused,
            "ended after {took:?} with {paused:?} suspended: the suspended time was counted"
        );
        assert!(took < Duration::from_secs(20), "ended after {took:?}");
    });
    n.assert_gone(932);
    n.r.finish();
}

#[test]
fn v1_suspended_job_can_be_killed() {
    let Some(n) = node("v1_suspended_job_can_be_killed") else {
        return;
    };
    rt().block_on(async {
        let id = 933;
        // The script ignores SIGTERM: the kill must still end it (SIGKILL after the grace).
        let script = format!("trap '' TERM; {COUNT}");
        let (job, kill, run) = start(&n, n.spec(id, 0, 60, &script, false)).await;
        assert!(grows(&n.counter(id), 0).await);
        suspend::suspend(&job).await.unwrap();
        assert_eq!(n.freezer_state(id), "FROZEN");
        let pids = job.cgroup.pids().unwrap();
        assert!(!pids.is_empty());
        let t = Instant::now();
        kill.send("cancelled".into()).unwrap();
        let outcome = tokio::time::timeout(Duration::from_secs(15), run).await.expect("kill hung").unwrap();
        assert_eq!(outcome.reason.as_deref(), Some("cancelled"), "{outcome:?}");
        assert!(t.elapsed() < Duration::from_secs(5), "took {:?}", t.elapsed());
        for pid in pids {
            assert!(!Path::new(&format!("/proc/{pid}")).exists(), "pid {pid} survived");
        }
        // A later resume finds nothing to do: the job is gone from this node.
        assert!(n.ctx.registry.get(JobId(id)).is_none());
    });
    n.assert_gone(933);
    n.r.finish();
}

#[test]
fn v1_resume_refuses_to_move_rank_cpusets() {
    let Some(n) = node("v1_resume_refuses_to_move_rank_cpusets") else {
        return;
    };
    rt().block_on(async {
        let id = 934;
        let (job, kill, run) = start(&n, n.spec(id, 0, 60, COUNT, true)).await;
        suspend::suspend(&job).await.unwrap();
        let mut to = job.spec.allocation.clone();
        to.ranks.clear();
        to.cpus = CpuSet::from_iter_u32([n.host.len() as u32 - 1]);
        let err = suspend::resume(&n.ctx, &job, Some(&to)).await.unwrap_err().to_string();
        assert!(err.contains("sub-cpusets") && err.contains("rank0"), "{err}");
        assert_eq!(n.freezer_state(id), "FROZEN", "a refused move leaves the job frozen");
        assert_eq!(n.cpuset_cpus(id), n.host[0].to_string());
        // In place it resumes.
        suspend::resume(&n.ctx, &job, None).await.unwrap();
        assert_eq!(n.freezer_state(id), "THAWED");
        kill.send("cancelled".into()).unwrap();
        run.await.unwrap();
    });
    n.assert_gone(934);
    n.r.finish();
}
