//! Running one batch job on this node: spool, cgroup, process, limits, accounting, cleanup.

use crate::binding::HostBinding;
use crate::cgroup::{CgroupBackend, JobCgroup, JobLimits};
use crate::cpumap::CpuMap;
use crate::cpusets::{self, JobCpusets};
use crate::registry::JobHandle;
use crate::spawn::ChildSetup;
use crate::suspend::Suspension;
use berth_core::binding::BindingMode;
use berth_core::job::JobOutcome;
use berth_core::topology::Topology;
use berth_protocol::agent::{AgentMessage, LaunchSpec};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// What every job on this agent shares.
pub struct JobContext {
    pub cgroups: Arc<dyn CgroupBackend>,
    pub cpumap: CpuMap,
    /// This node's topology (as registered), for mapping bound cores to PUs.
    pub topology: Topology,
    /// Root of the per-job spool and TMPDIR directories of this agent.
    pub spool_root: PathBuf,
    /// The jobs set up here, for steps, tasks and signals.
    pub registry: crate::registry::Registry,
    /// The agent's local socket for the task API (`BERTH_AGENT_SOCKET`).
    pub agent_socket: PathBuf,
}

/// How long kill_all may take before the job is reported with processes left.
const KILL_DEADLINE: Duration = Duration::from_secs(10);

pub fn cgroup_name(id: berth_core::JobId) -> String {
    format!("job_{id}")
}

/// Run the job to its end and measure it. `kill` delivers cancel requests (the reason).
pub async fn run_job(
    spec: LaunchSpec,
    ctx: Arc<JobContext>,
    mut kill: mpsc::UnboundedReceiver<String>,
    events: mpsc::UnboundedSender<AgentMessage>,
) -> JobOutcome {
    let started = Instant::now();
    let spool = ctx.spool_root.join(spec.id.to_string());
    let cg_name = cgroup_name(spec.id);
    let failed = |reason: String| JobOutcome {
        reason: Some(format!("launch_failed: {reason}")),
        wall_ms: started.elapsed().as_millis() as u64,
        ..Default::default()
    };

    let limits = JobLimits {
        cpus: ctx.cpumap.cpus(&spec.allocation.cpus).to_list(),
        mems: ctx.cpumap.mems(&spec.allocation.mems).to_list(),
        memory_limit_bytes: Some(spec.allocation.memory_bytes),
    };
    // Checked before anything is made: both come from the controller.
    let binding = HostBinding::resolve(&ctx.topology, &ctx.cpumap, &spec.allocation.binding, &spec.allocation.cpus);
    let ranks = cpusets::rank_limits(&spec, &ctx.cpumap, &limits);
    let (binding, ranks) = match (binding, ranks) {
        (Ok(b), Ok(r)) => (b, r),
        (Err(e), _) | (_, Err(e)) => return failed(e),
    };
    if let Err(e) = prepare_spool(&spool, &spec) {
        let _ = std::fs::remove_dir_all(&spool);
        return failed(e);
    }
    let cg: Arc<dyn JobCgroup> = match ctx.cgroups.create(&cg_name, &limits) {
        Ok(cg) => Arc::from(cg),
        Err(e) => {
            let _ = std::fs::remove_dir_all(&spool);
            return failed(format!("cannot create the job's cgroup: {e}"));
        }
    };
    let mount = ctx.cgroups.cpuset_mount();
    let (uid, gid) = (spec.user.uid, spec.user.gid);
    let runs_script = spec.head && !spec.script.is_empty();
    let started_job = cpusets::prepare(&*cg, &mount, &limits, &ranks, uid, gid).and_then(|sets| {
        let socket = &ctx.agent_socket;
        let child = if runs_script { Some(start(&spec, &spool, &*cg, &sets, &binding, socket)?) } else { None };
        Ok((child, sets))
    });
    let outcome = match started_job {
        Err(e) => failed(e),
        Ok((child, sets)) => {
            let pid = child.as_ref().and_then(|c| c.id()).unwrap_or(0);
            let _ = events.send(AgentMessage::JobStarted { id: spec.id, pid, cgroups: sets.reports.clone() });
            let suspension = Arc::new(Suspension::new(spec.allocation.clone()));
            ctx.registry.insert(Arc::new(JobHandle {
                spec: spec.clone(),
                cgroup: cg.clone(),
                spool: spool.clone(),
                cpuset_dir: sets.dir.clone(),
                steps: Default::default(),
                tasks: Default::default(),
                suspension: suspension.clone(),
            }));
            let outcome = match child {
                Some(mut child) => supervise(&spec, &mut child, cg.clone(), &mut kill, &suspension, started).await,
                None => hold(&spec, cg.clone(), &mut kill, &suspension, started).await,
            };
            ctx.registry.remove(spec.id);
            outcome
        }
    };
    // Nothing of the job survives it: kill what is left, read the accounting, remove.
    let cg2 = cg.clone();
    let (usage, cleanup) = tokio::task::spawn_blocking(move || {
        let killed = cg2.kill_all(KILL_DEADLINE);
        let usage = cg2.usage();
        let removed = cg2.remove();
        (usage, killed.and(removed))
    })
    .await
    .unwrap_or_else(|_| (Err(crate::cgroup::CgroupError::Unkillable { pids: vec![] }), Ok(())));
    if let Err(e) = cleanup {
        tracing::error!(job = %spec.id, "cleanup of the job's cgroup failed: {e}");
    }
    if let Err(e) = std::fs::remove_dir_all(&spool) {
        tracing::warn!(job = %spec.id, "cannot remove {}: {e}", spool.display());
    }
    let mut outcome = outcome;
    if let Ok(u) = usage {
        outcome.user_cpu_us = u.user_cpu_usec;
        outcome.system_cpu_us = u.system_cpu_usec;
        outcome.peak_memory_bytes = u.peak_memory_bytes;
        if u.oom_kills > 0 && outcome.reason.is_none() {
            outcome.reason = Some("oom".into());
        }
    }
    outcome
}

/// The job's private directory (script, nodefile) and its TMPDIR, owned by the user.
fn prepare_spool(spool: &Path, spec: &LaunchSpec) -> Result<(), String> {
    let uid = spec.user.uid;
    let gid = spec.user.gid;
    let io = |what: &str, e: std::io::Error| format!("{what} {}: {e}", spool.display());
    if spool.exists() {
        std::fs::remove_dir_all(spool).map_err(|e| io("cannot clear stale", e))?;
    }
    std::fs::DirBuilder::new().mode(0o700).create(spool).map_err(|e| io("cannot create", e))?;
    let tmp = spool.join("tmp");
    std::fs::DirBuilder::new().mode(0o700).create(&tmp).map_err(|e| io("cannot create tmp in", e))?;
    let script = spool.join("script");
    std::fs::write(&script, &spec.script).map_err(|e| io("cannot write script in", e))?;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o700)).map_err(|e| io("chmod script in", e))?;
    let nodefile: String =
        spec.nodes.iter().flat_map(|(n, cores)| std::iter::repeat_n(format!("{n}\n"), *cores as usize)).collect();
    std::fs::write(spool.join("nodefile"), nodefile).map_err(|e| io("cannot write nodefile in", e))?;
    let mut owned = vec![spool.to_path_buf(), tmp, script, spool.join("nodefile")];
    if let Some(text) = rankfile(spec) {
        let path = spool.join("rankfile");
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| io("cannot create rankfile in", e))?;
        f.write_all(text.as_bytes()).map_err(|e| io("cannot write rankfile in", e))?;
        owned.push(path);
    }
    for p in owned {
        std::os::unix::fs::lchown(&p, Some(uid), Some(gid)).map_err(|e| io("cannot chown", e))?;
    }
    Ok(())
}

/// The rankfile to write, only in binding mode `pe`.
fn rankfile(spec: &LaunchSpec) -> Option<&str> {
    match spec.binding_mode {
        Some(BindingMode::Pe) => spec.rankfile.as_deref(),
        _ => None,
    }
}

fn start(
    spec: &LaunchSpec,
    spool: &Path,
    cg: &dyn JobCgroup,
    sets: &JobCpusets,
    binding: &HostBinding,
    agent_socket: &Path,
) -> Result<tokio::process::Child, String> {
    let join = cg.join_files().map_err(|e| format!("cannot open the cgroup to join it: {e}"))?;
    let mut setup = ChildSetup::new(join, &spec.user, &spec.cwd, &spec.stdout, &spec.stderr)?;
    if spec.binding_mode == Some(BindingMode::Set) && !binding.is_empty() {
        // The cpuset already confines the job; the affinity makes the binding explicit.
        setup.affinity = Some(crate::spawn::cpu_mask(&binding.host_cpus())?);
    }
    let mut cmd = tokio::process::Command::new(spool.join("script"));
    cmd.env_clear();
    cmd.envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    let nodes: Vec<&str> = spec.nodes.iter().map(|(n, _)| n.as_str()).collect();
    cmd.env("BERTH_JOB_ID", spec.id.to_string())
        .env("BERTH_JOB_NAME", &spec.name)
        .env("BERTH_NODES", nodes.join(","))
        .env("BERTH_NUM_NODES", nodes.len().to_string())
        .env("BERTH_NODEFILE", spool.join("nodefile"))
        .env("BERTH_CPUS", spec.allocation.cpus.to_list())
        .env("BERTH_CORES", spec.allocation.cores.to_string())
        .env("BERTH_SUBMIT_DIR", &spec.cwd)
        .env("TMPDIR", spool.join("tmp"))
        .env("BERTH_CPUSET", &sets.dir)
        .env("BERTH_AGENT_SOCKET", agent_socket);
    if !sets.ranks.is_empty() {
        cmd.env("BERTH_RANK_CPUSETS", sets.ranks_env());
    }
    if !binding.is_empty() {
        cmd.env("BERTH_BINDING", binding.omp_places()).env("BERTH_BINDING_CORES", binding.cores_env());
    }
    if rankfile(spec).is_some() {
        cmd.env("BERTH_RANKFILE", spool.join("rankfile"));
    }
    cmd.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
    cmd.kill_on_drop(false);
    setup.apply(&mut cmd);
    // ETXTBSY: another thread forked while the script file was open for writing, and that child
    // holds the descriptor until its own exec. It clears within milliseconds; retry briefly.
    let mut attempt = 0;
    let spawned = loop {
        match cmd.spawn() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && attempt < 50 => {
                attempt += 1;
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            other => break other,
        }
    };
    spawned.map_err(|e| {
        format!(
            "cannot start the batch script as {} (uid {}): {e}; check that {} and the output paths are accessible to that user",
            spec.user.name, spec.user.uid, spec.cwd
        )
    })
}

/// Wait for the script to end, enforcing the walltime and honouring kill requests.
async fn supervise(
    spec: &LaunchSpec,
    child: &mut tokio::process::Child,
    cg: Arc<dyn JobCgroup>,
    kill: &mut mpsc::UnboundedReceiver<String>,
    suspension: &Suspension,
    started: Instant,
) -> JobOutcome {
    let reason: Option<String> = tokio::select! {
        status = child.wait() => return finished(status, None, started),
        r = end_request(spec, kill, suspension) => Some(r),
    };
    suspension.end(spec.id, &cg).await;
    // SIGTERM to every process of the job, a grace period, then SIGKILL to whatever is left.
    let cg2 = cg.clone();
    let _ = tokio::task::spawn_blocking(move || cg2.signal_all(libc::SIGTERM)).await;
    let term_sent = Instant::now();
    let grace = Duration::from_millis(spec.kill_grace_ms);
    let status = match tokio::time::timeout(grace, child.wait()).await {
        Ok(status) => {
            // The script is gone; the rest of the job gets what is left of the grace period.
            while term_sent.elapsed() < grace && !cg.is_empty().unwrap_or(true) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            status
        }
        Err(_) => {
            let cg2 = cg.clone();
            let _ = tokio::task::spawn_blocking(move || cg2.kill_all(KILL_DEADLINE)).await;
            child.wait().await
        }
    };
    finished(status, reason, started)
}

/// Why the job must end: its walltime passed (time suspended not counted), or a kill
/// request (its reason) arrived.
async fn end_request(spec: &LaunchSpec, kill: &mut mpsc::UnboundedReceiver<String>, suspension: &Suspension) -> String {
    let deadline = async {
        match spec.walltime_seconds {
            Some(w) => suspension.walltime(Duration::from_secs(w)).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = deadline => "walltime".into(),
        r = kill.recv() => r.unwrap_or_else(|| "cancelled".into()),
    }
}

/// A node without the batch script (other nodes of a job, interactive allocations): hold
/// the cgroup for steps and tasks until the job is killed or its walltime ends; then what
/// runs in it gets SIGTERM, the grace period, and SIGKILL.
async fn hold(
    spec: &LaunchSpec,
    cg: Arc<dyn JobCgroup>,
    kill: &mut mpsc::UnboundedReceiver<String>,
    suspension: &Suspension,
    started: Instant,
) -> JobOutcome {
    let reason = end_request(spec, kill, suspension).await;
    suspension.end(spec.id, &cg).await;
    let cg2 = cg.clone();
    let _ = tokio::task::spawn_blocking(move || cg2.signal_all(libc::SIGTERM)).await;
    let grace = Instant::now() + Duration::from_millis(spec.kill_grace_ms);
    while Instant::now() < grace && !cg.is_empty().unwrap_or(true) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    JobOutcome {
        exit_code: Some(0),
        reason: Some(reason),
        wall_ms: started.elapsed().as_millis() as u64,
        ..Default::default()
    }
}

fn finished(status: std::io::Result<std::process::ExitStatus>, reason: Option<String>, started: Instant) -> JobOutcome {
    let wall_ms = started.elapsed().as_millis() as u64;
    match status {
        Ok(st) => JobOutcome { exit_code: st.code(), signal: st.signal(), reason, wall_ms, ..Default::default() },
        Err(e) => JobOutcome {
            reason: Some(reason.unwrap_or_else(|| format!("lost track of the script: {e}"))),
            wall_ms,
            ..Default::default()
        },
    }
}
