//! Running one batch job on this node: spool, cgroup, process, limits, accounting, cleanup.

pub mod adopt;
pub mod cpusets;
pub mod shim;
pub mod suspend;

use crate::binding::HostBinding;
use crate::cgroup::{JobCgroup, JobLimits, Retired};
use crate::job::cpusets::JobCpusets;
use crate::job::shim::Status;
use crate::ports::suspension::Suspension;
use crate::ports::{JobContext, JobHandle};
use crate::records::LocalJobRecord;
use berth_core::binding::BindingMode;
use berth_core::job::JobOutcome;
use berth_core::JobId;
use berth_protocol::agent::{AgentMessage, LaunchSpec};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// How long kill_all may take before the job is reported with processes left.
const KILL_DEADLINE: Duration = Duration::from_secs(10);

/// Why a job could not be set up on this node: its end reason is `launch_failed: ` and this.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error(transparent)]
    Binding(#[from] crate::binding::BindingError),
    #[error(transparent)]
    Cpusets(#[from] cpusets::CpusetError),
    #[error("cannot create the job's cgroup: {0}")]
    Cgroup(crate::cgroup::CgroupError),
    /// A file or directory of the job's spool: what failed, in which spool directory.
    #[error("{what} {}: {error}", .spool.display())]
    Spool { what: &'static str, spool: PathBuf, error: std::io::Error },
    #[error("cannot open the cgroup to join it: {0}")]
    JoinCgroup(crate::cgroup::CgroupError),
    #[error(transparent)]
    Mask(#[from] crate::spawn::BeyondMask),
    #[error("the agent's path {} is not UTF-8", .0.display())]
    PathNotUtf8(PathBuf),
    #[error("the agent's path {0:?} is not UTF-8")]
    EnvPathNotUtf8(std::ffi::OsString),
    /// The script's process did not start: as whom, why, and what to check.
    #[error("cannot start the batch script as {user} (uid {uid}): {}; {hint}", .error.message)]
    Script { user: String, uid: u32, error: crate::step::rank::SpawnError, hint: String },
}

pub fn cgroup_name(id: berth_core::JobId) -> String {
    format!("job_{id}")
}

/// Run the job to its end and measure it. `kill` delivers cancel requests (the reason).
pub async fn run_job(
    mut spec: LaunchSpec,
    ctx: Arc<JobContext>,
    mut kill: mpsc::UnboundedReceiver<String>,
    events: mpsc::UnboundedSender<AgentMessage>,
) -> JobOutcome {
    let started = Instant::now();
    // A step riding on the order starts once the job is set up (crate::step::launch).
    let mut step = spec.step.take();
    let spool = ctx.spool_root.join(spec.id.to_string());
    let cg_name = cgroup_name(spec.id);
    let failed = |reason: LaunchError| JobOutcome {
        reason: Some(format!("launch_failed: {reason}")),
        wall_ms: started.elapsed().as_millis() as u64,
        ..Default::default()
    };

    let limits = JobLimits {
        cpus: ctx.cpumap.cpus(&spec.allocation.cpus).to_list(),
        mems: ctx.cpumap.mems(&spec.allocation.mems).to_list(),
        memory_limit_bytes: Some(spec.allocation.memory_bytes),
        pids_max: spec.pids_max,
        deny_devices: if ctx.cgroups.contains_devices() {
            crate::gpu_devices::deny_rules(&ctx.topology.gpus, &spec.allocation.gpus)
        } else {
            vec![]
        },
    };
    // Checked before anything is made: both come from the controller.
    let binding = HostBinding::resolve(&ctx.topology, &ctx.cpumap, &spec.allocation.binding, &spec.allocation.cpus)
        .map_err(LaunchError::from);
    let ranks = cpusets::rank_limits(&spec, &ctx.cpumap, &limits).map_err(LaunchError::from);
    let (binding, ranks) = match (binding, ranks) {
        (Ok(b), Ok(r)) => (b, r),
        (Err(e), _) | (_, Err(e)) => return failed(e),
    };
    // The cgroups first: the spool's files are the host's filesystem journal, which the
    // controller may be syncing its commit through at this moment when on the same host.
    berth_protocol::probe::mark("agent job launch");
    let cg: Arc<dyn JobCgroup> = match ctx.cgroups.create(&cg_name, &limits) {
        Ok(cg) => Arc::from(cg),
        Err(e) => return failed(LaunchError::Cgroup(e)),
    };
    berth_protocol::probe::mark("agent cgroups made");
    if let Err(e) = prepare_spool(&spool, &spec) {
        let _ = std::fs::remove_dir_all(&spool);
        if let Err(e2) = cg.remove() {
            tracing::warn!(job = %spec.id, error = %e2, "cannot remove the cgroup of a job that could not start");
        }
        return failed(e);
    }
    berth_protocol::probe::mark("agent spool made");
    let mount = ctx.cgroups.cpuset_mount();
    let (uid, gid) = (spec.user.uid, spec.user.gid);
    let runs_script = spec.head && !spec.script.is_empty();
    let started_job = cpusets::prepare(&*cg, &ranks, uid, gid).map_err(LaunchError::from).and_then(|sets| {
        let held = &spec.allocation.gpus;
        let gpus = berth_core::gpu::gpu_env(&ctx.topology.gpus, held, held, ctx.cgroups.contains_devices());
        let child = if runs_script { Some(start(&ctx, &spec, &spool, &*cg, &sets, &binding, &gpus)?) } else { None };
        Ok((child, sets))
    });
    let outcome = match started_job {
        Err(e) => failed(e),
        Ok((child, sets)) => {
            let pid = child.as_ref().and_then(|c| c.id()).unwrap_or(0);
            let job = Arc::new(JobHandle {
                spec: spec.clone(),
                cgroup: cg.clone(),
                spool: spool.clone(),
                cpuset_dir: sets.dir.clone(),
                steps: Default::default(),
                tasks: Default::default(),
                suspension: Arc::new(Suspension::new(spec.allocation.clone())),
            });
            // Registered before the record is written (fsync): the script's first `berth task`
            // may reach the agent within microseconds of its start.
            ctx.registry.insert(job.clone());
            berth_protocol::probe::mark("agent job registered");
            if let Some(grant) = step.take() {
                crate::step::launch::start_from_order(ctx.clone(), *grant);
            }
            if let Some(records) = ctx.records.clone() {
                // A step waiting for this job (an interactive `berth run`) starts its ranks
                // first; the record is for a restarted agent, and is written just after.
                tokio::task::yield_now().await;
                let rec = LocalJobRecord {
                    spec: spec.clone(),
                    shim_pid: child.as_ref().map(|_| pid as i32),
                    // Read before the child can be reaped: it is ours until we wait for it.
                    shim_start_time: child.as_ref().and_then(|_| crate::records::proc_start_time(pid as i32)),
                    started_unix_ms: crate::records::now_unix_ms().saturating_sub(started.elapsed().as_millis() as u64),
                    cgroup: cg_name.clone(),
                    cpuset_dir: sets.dir.clone(),
                    spool: spool.clone(),
                };
                let saved = ctx.priority.bookkeeping(move || records.save_job(&rec)).await;
                if let Ok(Err(e)) | Err(e) = saved.map_err(std::io::Error::other) {
                    tracing::warn!(job = %spec.id, "cannot record the job ({e}): a restarted agent would not re-adopt it");
                }
            }
            let _ = events.send(AgentMessage::JobStarted {
                id: spec.id,
                pid,
                cgroups: sets.reports(&*cg, &mount, &limits, &ranks),
            });
            let script = child.map(|child| Script::Child { child, spool: spool.clone(), shim: ctx.shim.is_some() });
            let walltime = spec.walltime_seconds.map(Duration::from_secs);
            follow(&ctx, job, script, &mut kill, started, walltime).await
        }
    };
    let outcome = cleanup(&ctx, &spec, cg, &spool, outcome).await;
    berth_protocol::probe::mark("agent cleaned up");
    let for_next = ctx.clone();
    tokio::spawn(ctx.priority.bookkeeping(move || {
        make_spares(&for_next);
        berth_protocol::probe::mark("agent spares made");
    }));
    outcome
}

/// Follow a job set up here (launched, or re-adopted after an agent restart) to its end:
/// registered for steps, tasks and signals meanwhile. `walltime` is what is left of it.
pub(crate) async fn follow(
    ctx: &JobContext,
    job: Arc<JobHandle>,
    script: Option<Script>,
    kill: &mut mpsc::UnboundedReceiver<String>,
    started: Instant,
    walltime: Option<Duration>,
) -> JobOutcome {
    let id = job.spec.id;
    ctx.registry.insert(job.clone());
    let (spec, cg, suspension) = (&job.spec, job.cgroup.clone(), job.suspension.clone());
    let early = early_signal(spec, script.as_ref(), &cg, &suspension, walltime);
    let outcome = match script {
        Some(mut script) => supervise(spec, &mut script, cg, kill, &suspension, started, walltime).await,
        None => hold(spec, cg, kill, &suspension, started, walltime).await,
    };
    if let Some(task) = early {
        task.abort();
    }
    ctx.registry.remove(id);
    outcome
}

/// `--signal=[B:]SIG@SECS`: a task that sends SIG when SECS of the walltime (`walltime`: what
/// is left of it; time suspended does not count) remain: to every process of the job on this
/// node, or with `B:` to the batch shell only (on the node that runs it). None when the job
/// has no such signal or no walltime.
fn early_signal(
    spec: &LaunchSpec,
    script: Option<&Script>,
    cg: &Arc<dyn JobCgroup>,
    suspension: &Arc<Suspension>,
    walltime: Option<Duration>,
) -> Option<tokio::task::JoinHandle<()>> {
    let (sig, walltime) = (spec.early_signal.clone()?, walltime?);
    // The batch shell: the script itself, or the shim's child.
    let batch = match script {
        Some(Script::Child { child, shim, .. }) => child.id().map(|pid| (pid as i32, *shim)),
        _ => None,
    };
    if sig.batch_only && batch.is_none() {
        return None;
    }
    let (cg, suspension, id) = (cg.clone(), suspension.clone(), spec.id);
    Some(tokio::spawn(async move {
        suspension.walltime(walltime.saturating_sub(Duration::from_secs(sig.secs.into()))).await;
        tracing::info!(job = %id, signal = sig.signal, batch_only = sig.batch_only, "--signal: {} s of walltime left", sig.secs);
        match batch.filter(|_| sig.batch_only) {
            Some((pid, shim)) => {
                let pids: Vec<i32> = if shim {
                    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
                        .unwrap_or_default()
                        .split_whitespace()
                        .filter_map(|p| p.parse().ok())
                        .collect()
                } else {
                    vec![pid]
                };
                for p in pids.into_iter().filter(|p| *p > 1) {
                    // SAFETY: kill(2) on a pid of the job's own batch shell.
                    unsafe { libc::kill(p, sig.signal) };
                }
            }
            None => {
                let _ = tokio::task::spawn_blocking(move || cg.signal_all(sig.signal)).await;
            }
        }
    }))
}

/// Nothing of the job survives it: kill what is left, read the accounting, remove the cgroup
/// and the spool directory.
pub(crate) async fn cleanup(
    ctx: &JobContext,
    spec: &LaunchSpec,
    cg: Arc<dyn JobCgroup>,
    spool: &Path,
    outcome: JobOutcome,
) -> JobOutcome {
    let (id, spool, pids_max) = (spec.id, spool.to_path_buf(), spec.pids_max);
    ctx.priority
        .bookkeeping(move || cleanup_blocking(id, &*cg, &spool, pids_max, outcome))
        .await
        .unwrap_or_else(|e| JobOutcome { reason: Some(format!("cleanup failed: {e}")), ..Default::default() })
}

/// [`cleanup`], blocking.
pub(crate) fn cleanup_blocking(
    id: JobId,
    cg: &dyn JobCgroup,
    spool: &Path,
    pids_max: Option<u64>,
    outcome: JobOutcome,
) -> JobOutcome {
    cleanup_retiring(id, cg, spool, pids_max, outcome).0
}

/// [`cleanup_blocking`], and what became of the job's cgroup (`JobCgroup::retire`; None when
/// it was not emptied or not read, and so removed, or that failed).
pub(crate) fn cleanup_retiring(
    id: JobId,
    cg: &dyn JobCgroup,
    spool: &Path,
    pids_max: Option<u64>,
    outcome: JobOutcome,
) -> (JobOutcome, Option<Retired>) {
    let killed = cg.kill_all(KILL_DEADLINE);
    let usage = cg.usage();
    // Emptied and read: it may become the next job's cgroup (JobCgroup::retire).
    let (removed, retired) = match (&killed, &usage) {
        (Ok(()), Ok(u)) => match cg.retire(u) {
            Ok(r) => (Ok(()), Some(r)),
            Err(e) => (Err(e), None),
        },
        _ => (cg.remove(), None),
    };
    if let Some(r) = retired.filter(|r| *r != Retired::Spare) {
        tracing::debug!(job = %id, "job cgroup not kept as the spare: {r:?}");
    }
    if let Err(e) = killed.and(removed) {
        tracing::error!(job = %id, "cleanup of the job's cgroup failed: {e}");
    }
    if let Err(e) = std::fs::remove_dir_all(spool) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(job = %id, "cannot remove {}: {e}", spool.display());
        }
    }
    let mut outcome = outcome;
    if let Ok(u) = usage {
        outcome.user_cpu_us = u.user_cpu_usec;
        outcome.system_cpu_us = u.system_cpu_usec;
        outcome.peak_memory_bytes = u.peak_memory_bytes;
        if u.oom_kills > 0 && outcome.reason.is_none() {
            outcome.reason = Some("oom".into());
        }
        // A job that failed after a fork was refused at its limit failed for that reason.
        let failed = outcome.exit_code != Some(0) || outcome.signal.is_some();
        if u.pids_limit_hits > 0 && outcome.reason.is_none() && failed {
            outcome.reason = Some(format!(
                "pids_limit: the job reached its limit of {} processes on this node ({} forks refused); ask for more cores or start fewer processes",
                pids_max.map(|n| n.to_string()).unwrap_or_else(|| "?".into()),
                u.pids_limit_hits
            ));
        }
    }
    (outcome, retired)
}

/// The spare spool directory (with its `tmp`) under the spool root, made ahead like the spare
/// cgroup ([`make_spares`]) and renamed to the next job's: two directories fewer to make on a
/// launch's path. Job spools are named by their ids; this name is none.
const SPARE_SPOOL: &str = ".spare";

/// The agent is stopping: make no more spares, and remove the spare spool directory (the
/// spare cgroup goes with the cgroup root).
pub(crate) fn stop_spares(ctx: &JobContext) {
    ctx.registry.with(|jobs| jobs.stopping = true);
    let _ = std::fs::remove_dir_all(ctx.spool_root.join(SPARE_SPOOL));
}

/// Make what the next job here takes ready-made: its cgroup ([`CgroupBackend::make_spare`])
/// and its spool directory. Best effort: a launch without them makes its own.
pub(crate) fn make_spares(ctx: &JobContext) {
    if ctx.registry.with(|jobs| jobs.stopping) {
        return;
    }
    if let Err(e) = ctx.cgroups.make_spare() {
        tracing::debug!(error = %e, "no spare cgroup made");
    }
    let spare = ctx.spool_root.join(SPARE_SPOOL);
    for dir in [spare.clone(), spare.join("tmp")] {
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                tracing::debug!(error = %e, dir = %dir.display(), "no spare spool directory made");
                return;
            }
            _ => {}
        }
    }
}

/// The job's private directory (script, nodefile) and its TMPDIR, owned by the user.
fn prepare_spool(spool: &Path, spec: &LaunchSpec) -> Result<(), LaunchError> {
    let uid = spec.user.uid;
    let gid = spec.user.gid;
    let io = |what: &'static str, error: std::io::Error| LaunchError::Spool { what, spool: spool.to_path_buf(), error };
    if spool.exists() {
        std::fs::remove_dir_all(spool).map_err(|e| io("cannot clear stale", e))?;
    }
    let tmp = spool.join("tmp");
    let spare = spool.parent().map(|root| root.join(SPARE_SPOOL));
    if spare.is_none_or(|spare| std::fs::rename(spare, spool).is_err()) {
        std::fs::DirBuilder::new().mode(0o700).create(spool).map_err(|e| io("cannot create", e))?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(&tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(io("cannot create tmp in", e)),
        _ => {}
    }
    let nodefile: String =
        spec.nodes.iter().flat_map(|(n, cores)| std::iter::repeat_n(format!("{n}\n"), *cores as usize)).collect();
    std::fs::write(spool.join("nodefile"), nodefile).map_err(|e| io("cannot write nodefile in", e))?;
    let mut owned = vec![spool.to_path_buf(), tmp, spool.join("nodefile")];
    // PBS's node file (one line per task) where berth's (one per core) does not serve.
    if let Some(compat) = spec.compat.as_ref().filter(|_| spec.head && !spec.script.is_empty()) {
        if crate::compat_env::pbs_nodefile_name(spec, compat) == Some(crate::compat_env::PBS_NODEFILE) {
            let path = spool.join(crate::compat_env::PBS_NODEFILE);
            std::fs::write(&path, crate::compat_env::pbs_nodefile_text(spec, compat))
                .map_err(|e| io("cannot write the PBS node file in", e))?;
            owned.push(path);
        }
        // Torque's GPU file, for a job holding GPUs: the user's own, readable by no one else
        // (made with its mode, as the rankfile; chowned below).
        if let Some(text) = crate::compat_env::pbs_gpufile_text(spec) {
            let path = spool.join(crate::compat_env::PBS_GPUFILE);
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .map_err(|e| io("cannot create the PBS GPU file in", e))?;
            f.write_all(text.as_bytes()).map_err(|e| io("cannot write the PBS GPU file in", e))?;
            owned.push(path);
        }
    }
    // An interactive allocation or a reservation has no script: no file for it (every file
    // made here is on the path of an interactive `berth run`).
    if !spec.script.is_empty() {
        let script = spool.join("script");
        // Made with its mode (no chmod on a launch's path), unless the agent's umask takes
        // some of the owner's bits away.
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o700)
            .open(&script)
            .map_err(|e| io("cannot create script in", e))?;
        f.write_all(spec.script.as_bytes()).map_err(|e| io("cannot write script in", e))?;
        if umask_masks_owner() {
            f.set_permissions(std::fs::Permissions::from_mode(0o700)).map_err(|e| io("chmod script in", e))?;
        }
        drop(f);
        owned.push(script);
    }
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

/// Whether the agent's umask (read once, from /proc/self/status: umask(2) cannot read it
/// without changing it for every thread) clears some of the owner's permission bits, which a
/// file made with mode 0700 then lacks. Unknown counts as yes.
fn umask_masks_owner() -> bool {
    // Process-wide by nature: a process has one umask, the same for any agent in it.
    static MASKS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *MASKS.get_or_init(|| {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let umask = status.lines().find_map(|l| l.strip_prefix("Umask:")).map(str::trim);
        umask.and_then(|u| u32::from_str_radix(u, 8).ok()).is_none_or(|u| u & 0o700 != 0)
    })
}

/// The rankfile to write, only in binding mode `pe`.
fn rankfile(spec: &LaunchSpec) -> Option<&str> {
    match spec.binding_mode {
        Some(BindingMode::Pe) => spec.rankfile.as_deref(),
        _ => None,
    }
}

/// Start the batch script (through the agent's shim, if it has one) in the job's cgroups.
fn start(
    ctx: &JobContext,
    spec: &LaunchSpec,
    spool: &Path,
    cg: &dyn JobCgroup,
    sets: &JobCpusets,
    binding: &HostBinding,
    gpus: &[(&str, String)],
) -> Result<crate::step::rank::Process, LaunchError> {
    // Kept open until the spawn returned: the child joins the cgroups through them.
    let join = cg.join_files().map_err(LaunchError::JoinCgroup)?;
    let join_fds: Vec<std::os::fd::RawFd> = join.iter().map(std::os::fd::AsRawFd::as_raw_fd).collect();
    let workdir = spec.workdir.as_deref().unwrap_or(&spec.cwd);
    let affinity = if spec.binding_mode == Some(BindingMode::Set) && !binding.is_empty() {
        // The cpuset already confines the job; the affinity makes the binding explicit.
        Some(crate::spawn::cpu_mask(&binding.host_cpus())?)
    } else {
        None
    };
    let text = |p: &Path| p.to_str().map(str::to_string).ok_or_else(|| LaunchError::PathNotUtf8(p.to_path_buf()));
    let (status_file, script) = (text(&spool.join(crate::job::shim::STATUS_FILE))?, text(&spool.join("script"))?);
    let shim = ctx.shim.as_deref();
    let argv: Vec<String> = match shim {
        // The shim starts the script and keeps its exit status (see shim.rs).
        Some(exe) => vec![text(exe)?, crate::job::shim::SHIM_ARG.to_string(), status_file, script],
        None => vec![script],
    };
    let env = script_env(ctx, spec, spool, sets, binding, gpus)?;
    let output = crate::step::rank::ScriptOutput {
        stdout: &spec.stdout,
        stderr: &spec.stderr,
        append: spec.open_append,
        dumpable: shim.is_some_and(|exe| exe.starts_with("/proc/self/fd")),
    };
    let launch = || crate::step::rank::RankLaunch {
        argv: &argv,
        env: env.clone(),
        cwd: workdir,
        user: &spec.user,
        join_fds: join_fds.clone(),
        affinity,
        pmi_fd: None,
        stdin: false,
        umask: Some(spec.umask.unwrap_or(0o022)),
        nice: ctx.priority.job_nice(),
    };
    // ETXTBSY: another thread forked while the script file was open for writing, and that child
    // holds the descriptor until its own exec. It clears within milliseconds; retry briefly.
    let mut attempt = 0;
    let spawned = loop {
        match crate::step::rank::spawn_script(launch(), &output) {
            Err(e) if e.errno == libc::ETXTBSY && attempt < 50 => {
                attempt += 1;
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            other => break other,
        }
    };
    drop(join);
    if let Some(pid) = spawned.as_ref().ok().and_then(|child| child.id()) {
        cg.joined(pid as i32);
    }
    spawned.map_err(|error| LaunchError::Script {
        user: spec.user.name.clone(),
        uid: spec.user.uid,
        error,
        hint: launch_hint(spec),
    })
}

/// The batch script's environment: exactly the submitter's (less what must not come from
/// them), then berth's variables (the agent's socket and `berth-rsh` among them), the GPUs'
/// and the Slurm/PBS ones.
fn script_env(
    ctx: &JobContext,
    spec: &LaunchSpec,
    spool: &Path,
    sets: &JobCpusets,
    binding: &HostBinding,
    gpus: &[(&str, String)],
) -> Result<Vec<(String, String)>, LaunchError> {
    let path = |p: PathBuf| p.into_os_string().into_string().map_err(LaunchError::EnvPathNotUtf8);
    let inherited = |k: &str| spec.compat.is_none() || !crate::compat_env::not_from_submitter(k);
    let mut env: Vec<(String, String)> =
        spec.env.iter().filter(|(k, _)| inherited(k)).map(|(k, v)| (k.clone(), v.clone())).collect();
    let nodes: Vec<&str> = spec.nodes.iter().map(|(n, _)| n.as_str()).collect();
    let mut set = |k: &str, v: String| env.push((k.to_string(), v));
    set("BERTH_JOB_ID", spec.id.to_string());
    set("BERTH_JOB_NAME", spec.name.clone());
    set("BERTH_NODES", nodes.join(","));
    set("BERTH_NUM_NODES", nodes.len().to_string());
    set("BERTH_NODEFILE", path(spool.join("nodefile"))?);
    set("BERTH_CPUS", spec.allocation.cpus.to_list());
    set("BERTH_CORES", spec.allocation.cores.to_string());
    set("BERTH_SUBMIT_DIR", spec.cwd.clone());
    set("TMPDIR", path(spool.join("tmp"))?);
    set("BERTH_CPUSET", path(sets.dir.clone())?);
    set("BERTH_AGENT_SOCKET", path(ctx.agent_socket.clone())?);
    // The job's GPUs (none: nothing set): CUDA_VISIBLE_DEVICES and its peers, BERTH_GPUS.
    for (k, v) in gpus {
        set(k, v.clone());
    }
    if !sets.ranks.is_empty() {
        set("BERTH_RANK_CPUSETS", sets.ranks_env());
    }
    if !binding.is_empty() {
        set("BERTH_BINDING", binding.omp_places());
        set("BERTH_BINDING_CORES", binding.cores_env());
    }
    if rankfile(spec).is_some() {
        set("BERTH_RANKFILE", path(spool.join("rankfile"))?);
    }
    // mpirun/mpiexec start their daemons through the agents (crate::launcher), unless the
    // submitter chose otherwise.
    if let Some(rsh) = &ctx.rsh {
        for (k, v) in crate::launcher::job_vars(rsh, &spool.join("nodefile")) {
            if !spec.env.iter().any(|(n, _)| n == k) {
                set(k, v);
            }
        }
    }
    if let Some(compat) = &spec.compat {
        let cpus = spec.allocation.cpus.len();
        let vars = crate::compat_env::job_vars(spec, compat, crate::compat_env::node_index(spec), cpus);
        for (k, v) in vars {
            set(k, v);
        }
        if let Some(name) = crate::compat_env::pbs_nodefile_name(spec, compat) {
            set("PBS_NODEFILE", path(spool.join(name))?);
        }
        if spec.head && crate::compat_env::pbs_gpufile_text(spec).is_some() {
            set("PBS_GPUFILE", path(spool.join(crate::compat_env::PBS_GPUFILE))?);
        }
    }
    Ok(last_wins(env))
}

/// One entry per name, the last one set (a submitter's `BERTH_JOB_ID` from inside another
/// job is replaced, not shadowing: getenv would return the first of two), in first-set order.
fn last_wins(env: Vec<(String, String)>) -> Vec<(String, String)> {
    let mut at: std::collections::HashMap<String, usize> = std::collections::HashMap::with_capacity(env.len());
    let mut out: Vec<(String, String)> = Vec::with_capacity(env.len());
    for (k, v) in env {
        match at.get(&k) {
            Some(&i) => out[i].1 = v,
            None => {
                at.insert(k.clone(), out.len());
                out.push((k, v));
            }
        }
    }
    out
}

/// What to check when the batch script could not start: the path that is missing if one is
/// (the submit directory, or an output file's directory), else all of them.
pub(crate) fn launch_hint(spec: &LaunchSpec) -> String {
    use berth_core::limits::escape_control;
    let workdir = spec.workdir.as_deref().unwrap_or(&spec.cwd);
    let cwd = Path::new(workdir);
    if !cwd.is_dir() {
        return format!("the working directory {} does not exist on this node", escape_control(workdir));
    }
    for (what, file) in [("output", &spec.stdout), ("error", &spec.stderr)] {
        let path = cwd.join(file);
        if let Some(parent) = path.parent().filter(|p| !p.is_dir()) {
            return format!(
                "the directory {} of the {what} file {} does not exist on this node; create it or submit with another --{what}",
                escape_control(&parent.display().to_string()),
                escape_control(&path.display().to_string())
            );
        }
    }
    format!(
        "check that {} and the output paths {} and {} are accessible to that user",
        escape_control(workdir),
        escape_control(&spec.stdout),
        escape_control(&spec.stderr)
    )
}

/// The batch script's process as the agent follows it.
pub(crate) enum Script {
    /// Started by this agent: the shim (`shim`), or the script itself.
    Child { child: crate::step::rank::Process, spool: PathBuf, shim: bool },
    /// A shim started by an earlier agent: its end is seen through a pidfd, its status read
    /// from the spool directory.
    Adopted { pidfd: tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>, spool: PathBuf },
    /// It ended while the agent was down.
    Gone { spool: PathBuf },
}

/// How the script ended.
pub(crate) enum Ended {
    Status(Status),
    /// Its shim left no status (it ended while the agent was down without writing one, or
    /// was killed).
    Unknown,
    Lost(String),
}

impl Script {
    /// Wait for the end; may be called again after it returned.
    async fn wait(&mut self) -> Ended {
        match self {
            Script::Child { child, spool, shim } => match child.wait().await {
                Ok(st) => {
                    if *shim {
                        if let Some(s @ Status::LaunchError(_)) = Status::read(spool) {
                            return Ended::Status(s);
                        }
                    }
                    match (st.code(), st.signal()) {
                        (Some(c), _) => Ended::Status(Status::Code(c)),
                        (None, Some(s)) => Ended::Status(Status::Signal(s)),
                        (None, None) => Ended::Unknown,
                    }
                }
                Err(e) => Ended::Lost(e.to_string()),
            },
            Script::Adopted { pidfd, spool } => match pidfd.readable().await {
                // Readable once the process has ended; the readiness is kept for later calls.
                Ok(guard) => {
                    drop(guard);
                    Status::read(spool).map(Ended::Status).unwrap_or(Ended::Unknown)
                }
                Err(e) => Ended::Lost(format!("pidfd: {e}")),
            },
            Script::Gone { spool } => Status::read(spool).map(Ended::Status).unwrap_or(Ended::Unknown),
        }
    }
}

/// Wait for the script to end, enforcing what is left of the walltime (`walltime`) and
/// honouring kill requests.
async fn supervise(
    spec: &LaunchSpec,
    script: &mut Script,
    cg: Arc<dyn JobCgroup>,
    kill: &mut mpsc::UnboundedReceiver<String>,
    suspension: &Suspension,
    started: Instant,
    walltime: Option<Duration>,
) -> JobOutcome {
    let reason: Option<String> = tokio::select! {
        // A kill asked for as the script ended (a fence kills at once) is why it ended.
        ended = script.wait() => return finished(spec, ended, kill.try_recv().ok(), started),
        r = end_request(walltime, kill, suspension) => Some(r),
    };
    suspension.end(spec.id, &cg).await;
    // SIGTERM to every process of the job, a grace period, then SIGKILL to whatever is left.
    let cg2 = cg.clone();
    let _ = tokio::task::spawn_blocking(move || cg2.signal_all(libc::SIGTERM)).await;
    let term_sent = Instant::now();
    let grace = Duration::from_millis(spec.kill_grace_ms);
    let ended = match tokio::time::timeout(grace, script.wait()).await {
        Ok(ended) => {
            // The script is gone; the rest of the job gets what is left of the grace period.
            while term_sent.elapsed() < grace && !cg.is_empty().unwrap_or(true) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            ended
        }
        Err(_) => {
            let cg2 = cg.clone();
            let _ = tokio::task::spawn_blocking(move || cg2.kill_all(KILL_DEADLINE)).await;
            script.wait().await
        }
    };
    finished(spec, ended, reason, started)
}

/// Why the job must end: what was left of its walltime (`walltime`) passed (time suspended
/// not counted), or a kill request (its reason) arrived.
async fn end_request(
    walltime: Option<Duration>,
    kill: &mut mpsc::UnboundedReceiver<String>,
    suspension: &Suspension,
) -> String {
    let deadline = async {
        match walltime {
            Some(w) => suspension.walltime(w).await,
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
    walltime: Option<Duration>,
) -> JobOutcome {
    let reason = end_request(walltime, kill, suspension).await;
    berth_protocol::probe::mark("agent end requested");
    suspension.end(spec.id, &cg).await;
    let cg2 = cg.clone();
    let _ = tokio::task::spawn_blocking(move || cg2.signal_all(libc::SIGTERM)).await;
    let grace = Instant::now().checked_add(Duration::from_millis(spec.kill_grace_ms)).unwrap_or_else(Instant::now);
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

/// The reason of a job whose status is unknown.
pub const UNKNOWN_STATUS: &str = "ended while the agent was down; exit status unknown";

fn finished(spec: &LaunchSpec, ended: Ended, reason: Option<String>, started: Instant) -> JobOutcome {
    outcome_of(spec, ended, reason, started.elapsed().as_millis() as u64)
}

/// The outcome of a script that ended so (`reason`: why berth ended it, if it did).
pub(crate) fn outcome_of(spec: &LaunchSpec, ended: Ended, reason: Option<String>, wall_ms: u64) -> JobOutcome {
    let mut out = JobOutcome { reason, wall_ms, ..Default::default() };
    match ended {
        Ended::Status(Status::Code(c)) => out.exit_code = Some(c),
        Ended::Status(Status::Signal(s)) => out.signal = Some(s),
        Ended::Status(Status::LaunchError(errno)) => {
            let e = std::io::Error::from_raw_os_error(errno);
            out.reason = Some(out.reason.unwrap_or_else(|| {
                format!(
                    "launch_failed: cannot start the batch script as {} (uid {}): {e}; {}",
                    spec.user.name,
                    spec.user.uid,
                    launch_hint(spec)
                )
            }));
        }
        Ended::Unknown => out.reason = Some(out.reason.unwrap_or_else(|| UNKNOWN_STATUS.into())),
        Ended::Lost(e) => out.reason = Some(out.reason.unwrap_or_else(|| format!("lost track of the script: {e}"))),
    }
    out
}

/// Job supervision on the in-memory cgroup backend (crate::cgroup::fake): no root, no cgroup
/// file system. The real backends run the same path in cgroup/real_tests and the system tests.
#[cfg(test)]
mod supervision_tests {
    use super::*;
    use crate::cgroup::fake::{FakeBackend, FakeOp};
    use crate::cgroup::{CgroupBackend, CgroupUsage};
    use crate::cpumap::CpuMap;
    use berth_core::topology::Topology;
    use berth_core::CpuSet;

    struct Harness {
        dir: tempfile::TempDir,
        fake: FakeBackend,
        ctx: Arc<JobContext>,
    }

    fn harness() -> Harness {
        harness_with(None)
    }

    /// A harness whose agent has `rsh` as its `berth-rsh` link.
    fn harness_with(rsh: Option<PathBuf>) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let fake = FakeBackend::new(&dir.path().join("cgroup"));
        fake.prepare_root().unwrap();
        let topology = Topology::uniform(1, 1, 2, 1, 1 << 30);
        let cpumap =
            CpuMap::round_robin(&topology, CpuSet::parse_list("0-1").unwrap(), CpuSet::parse_list("0").unwrap());
        let spool_root = dir.path().join("spool");
        std::fs::create_dir(&spool_root).unwrap();
        let ctx = Arc::new(JobContext {
            cgroups: Arc::new(fake.clone()),
            cpumap,
            topology,
            spool_root,
            registry: Default::default(),
            agent_socket: dir.path().join("agent.sock"),
            shim: None,
            rsh,
            records: None,
            reports: None,
            priority: Default::default(),
            conns: Default::default(),
            auth: None,
        });
        Harness { dir, fake, ctx }
    }

    /// Job `id` running `body` as a shell script, as the user running the test.
    fn spec(h: &Harness, id: u64, body: &str, walltime: Option<u64>) -> LaunchSpec {
        // SAFETY: plain getters.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let out = h.dir.path().join(format!("{id}.out"));
        serde_json::from_value(serde_json::json!({
            "id": id, "name": "t", "user": {"uid": uid, "gid": gid, "groups": [gid], "name": "tester"},
            "env": [["PATH", "/usr/bin:/bin"]], "cwd": h.dir.path(), "script": format!("#!/bin/sh\n{body}\n"),
            "stdout": out, "stderr": out,
            "allocation": {"node_id": 0, "node": "n", "cpus": "0-1", "cores": 2, "mems": "0",
                           "memory_bytes": 64u64 << 20},
            "nodes": [["n", 2]], "walltime_seconds": walltime, "kill_grace_ms": 300
        }))
        .unwrap()
    }

    struct Running {
        id: JobId,
        kill: mpsc::UnboundedSender<String>,
        events: mpsc::UnboundedReceiver<AgentMessage>,
        task: tokio::task::JoinHandle<JobOutcome>,
    }

    fn launch(h: &Harness, spec: LaunchSpec) -> Running {
        let (kill, kill_rx) = mpsc::unbounded_channel();
        let (ev_tx, events) = mpsc::unbounded_channel();
        let id = spec.id;
        let task = tokio::spawn(run_job(spec, h.ctx.clone(), kill_rx, ev_tx));
        Running { id, kill, events, task }
    }

    /// The pid reported in JobStarted.
    async fn started(r: &mut Running) -> u32 {
        match tokio::time::timeout(Duration::from_secs(10), r.events.recv()).await {
            Ok(Some(AgentMessage::JobStarted { id, pid, cgroups })) => {
                assert_eq!(id, r.id);
                assert_eq!(cgroups[0].cpus, "0-1", "the cpuset as the backend holds it: {cgroups:?}");
                pid
            }
            other => panic!("no JobStarted for job {}: {other:?}", r.id),
        }
    }

    async fn outcome(r: Running) -> JobOutcome {
        tokio::time::timeout(Duration::from_secs(30), r.task).await.expect("the job did not end").unwrap()
    }

    fn name(id: u64) -> String {
        cgroup_name(JobId(id))
    }

    /// Nothing of job `id` is left: no cgroup, no spool directory, not registered.
    fn assert_gone(h: &Harness, id: u64) {
        assert!(h.fake.existing().is_empty(), "cgroups left: {:?}", h.fake.existing());
        assert!(!h.dir.path().join("cgroup").join(name(id)).exists());
        assert!(!h.ctx.spool_root.join(id.to_string()).exists(), "the spool directory is left");
        assert!(h.ctx.registry.get(JobId(id)).is_none(), "the job is still registered");
    }

    /// The position of `op` in the backend's log (panics when absent).
    fn at(log: &[FakeOp], op: &FakeOp) -> usize {
        log.iter().position(|o| o == op).unwrap_or_else(|| panic!("{op:?} not in {log:?}"))
    }

    fn is_stopped(pid: i32) -> bool {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next()) == Some("T")
    }

    fn alive(pid: i32) -> bool {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        !stat.is_empty() && stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next()) != Some("Z")
    }

    /// The job's `sleep` processes once they run `sleep` (a shell's child between its vfork and
    /// its exec holds its parent in an uninterruptible wait, which no SIGSTOP stops).
    async fn sleeps(h: &Harness, id: u64, n: usize) -> Vec<i32> {
        let cg = h.fake.open(&name(id)).unwrap().expect("the job's cgroup");
        let comm = |p: &i32| std::fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default();
        for _ in 0..500 {
            let pids: Vec<i32> = cg.pids().unwrap().into_iter().filter(|p| comm(p) == "sleep\n").collect();
            if pids.len() >= n {
                return pids;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("job {id} never had {n} sleep processes: {:?}", cg.pids());
    }

    #[tokio::test]
    async fn a_job_runs_is_accounted_and_leaves_nothing() {
        let h = harness();
        let usage =
            CgroupUsage { user_cpu_usec: 1234, system_cpu_usec: 56, peak_memory_bytes: 7 << 20, ..Default::default() };
        h.fake.set_usage(usage);
        let mut r = launch(&h, spec(&h, 11, "echo hello from $BERTH_JOB_ID; true", None));
        let pid = started(&mut r).await;
        let out = outcome(r).await;
        assert_eq!((out.exit_code, out.signal, out.reason.as_deref()), (Some(0), None, None), "{out:?}");
        assert_eq!((out.user_cpu_us, out.system_cpu_us, out.peak_memory_bytes), (1234, 56, 7 << 20));
        let text = std::fs::read_to_string(h.dir.path().join("11.out")).unwrap();
        assert_eq!(text, "hello from 11\n");
        assert_gone(&h, 11);
        let log = h.fake.log();
        let n = name(11);
        assert_eq!(log[0], FakeOp::Create(n.clone()));
        // SAFETY: plain getters.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let chown = at(&log, &FakeOp::Chown(n.clone(), uid, gid));
        let joined = at(&log, &FakeOp::Joined(n.clone(), pid as i32));
        // Cleanup: kill what is left, read the accounting, then remove.
        let (kill, usage, remove) =
            (at(&log, &FakeOp::KillAll(n.clone())), at(&log, &FakeOp::Usage(n.clone())), at(&log, &FakeOp::Remove(n)));
        assert!(chown < joined && joined < kill && kill < usage && usage < remove, "{log:?}");
        assert_eq!(h.fake.limits(&name(11)), None);
    }

    #[tokio::test]
    async fn each_agent_points_its_own_jobs_at_its_own_berth_rsh() {
        // Two agents in one process: each job sees its agent's link, or none.
        let (a, b) = (harness_with(Some(PathBuf::from("/a/spool/berth-rsh"))), harness());
        let show = r#"echo "${OMPI_MCA_plm_rsh_agent:-none} ${HYDRA_LAUNCHER_EXEC:-none} ${OMPI_MCA_plm:-none}""#;
        let (mut ra, mut rb) = (launch(&a, spec(&a, 21, show, None)), launch(&b, spec(&b, 22, show, None)));
        started(&mut ra).await;
        started(&mut rb).await;
        for out in [outcome(ra).await, outcome(rb).await] {
            assert_eq!((out.exit_code, out.reason.as_deref()), (Some(0), None), "{out:?}");
        }
        let text = |h: &Harness, id: u64| std::fs::read_to_string(h.dir.path().join(format!("{id}.out"))).unwrap();
        assert_eq!(text(&a, 21), "/a/spool/berth-rsh /a/spool/berth-rsh rsh\n");
        assert_eq!(text(&b, 22), "none none none\n");
        assert_gone(&a, 21);
        assert_gone(&b, 22);
    }

    #[tokio::test]
    async fn a_failing_script_reports_its_exit_code_and_a_signal_its_signal() {
        let h = harness();
        let mut r = launch(&h, spec(&h, 12, "false", None));
        started(&mut r).await;
        let out = outcome(r).await;
        assert_eq!((out.exit_code, out.signal, out.reason), (Some(1), None, None));
        let mut r = launch(&h, spec(&h, 13, "kill -USR1 $$", None));
        started(&mut r).await;
        let out = outcome(r).await;
        assert_eq!((out.exit_code, out.signal, out.reason), (None, Some(libc::SIGUSR1), None));
        assert_gone(&h, 13);
    }

    #[tokio::test]
    async fn the_walltime_ends_the_job_with_sigterm() {
        let h = harness();
        let mut r = launch(&h, spec(&h, 14, "sleep 30", Some(1)));
        started(&mut r).await;
        let sleep = sleeps(&h, 14, 1).await;
        let out = outcome(r).await;
        assert_eq!(out.reason.as_deref(), Some("walltime"), "{out:?}");
        assert_eq!(out.signal, Some(libc::SIGTERM), "{out:?}");
        assert!((1000..10_000).contains(&out.wall_ms), "{out:?}");
        assert!(sleep.iter().all(|p| !alive(*p)), "the script's sleep survived");
        let log = h.fake.log();
        assert!(at(&log, &FakeOp::Signal(name(14), libc::SIGTERM)) < at(&log, &FakeOp::Remove(name(14))));
        assert_gone(&h, 14);
    }

    #[tokio::test]
    async fn a_cancel_sends_sigterm_then_kills_what_ignores_it_after_the_grace() {
        let h = harness();
        let mut r = launch(&h, spec(&h, 15, "trap '' TERM; sleep 30; echo not reached", None));
        started(&mut r).await;
        let sleep = sleeps(&h, 15, 1).await;
        let sent = Instant::now();
        r.kill.send("cancelled by tester".into()).unwrap();
        let out = outcome(r).await;
        assert_eq!(out.reason.as_deref(), Some("cancelled by tester"), "{out:?}");
        assert_eq!(out.signal, Some(libc::SIGKILL), "the script ignored SIGTERM: {out:?}");
        assert!(sent.elapsed() >= Duration::from_millis(300), "killed before the grace period");
        assert!(sleep.iter().all(|p| !alive(*p)), "the script's sleep survived");
        let log = h.fake.log();
        let n = name(15);
        let kills: Vec<usize> =
            log.iter().enumerate().filter(|(_, o)| **o == FakeOp::KillAll(n.clone())).map(|(i, _)| i).collect();
        assert!(at(&log, &FakeOp::Signal(n.clone(), libc::SIGTERM)) < kills[0], "{log:?}");
        assert!(kills.len() >= 2, "killed after the grace and again by the cleanup: {log:?}");
        assert!(!std::fs::read_to_string(h.dir.path().join("15.out")).unwrap().contains("not reached"));
        assert_gone(&h, 15);
    }

    #[tokio::test]
    async fn suspend_freezes_resume_thaws_and_an_ending_job_is_thawed_first() {
        let h = harness();
        let mut r = launch(&h, spec(&h, 16, "sleep 30", None));
        let script = started(&mut r).await;
        let sleep = sleeps(&h, 16, 1).await[0];
        let job = h.ctx.registry.get(JobId(16)).expect("registered while it runs");
        crate::job::suspend::suspend(&job).await.unwrap();
        assert!(job.suspension.is_suspended());
        assert!(is_stopped(sleep) && is_stopped(script as i32), "frozen processes are stopped");
        crate::job::suspend::suspend(&job).await.unwrap();
        crate::job::suspend::resume(&h.ctx, &job, None).await.unwrap();
        assert!(!job.suspension.is_suspended());
        assert!(!is_stopped(sleep), "thawed");
        crate::job::suspend::suspend(&job).await.unwrap();
        // Cancelled while suspended: thawed so that it acts on the SIGTERM.
        r.kill.send("cancelled".into()).unwrap();
        let out = outcome(r).await;
        assert_eq!((out.reason.as_deref(), out.signal), (Some("cancelled"), Some(libc::SIGTERM)), "{out:?}");
        assert!(crate::job::suspend::suspend(&job).await.is_err(), "an ended job is not frozen again");
        let n = name(16);
        let log = h.fake.log();
        let ops: Vec<&FakeOp> =
            log.iter().filter(|o| matches!(o, FakeOp::Freeze(_) | FakeOp::Thaw(_) | FakeOp::Signal(..))).collect();
        assert_eq!(
            ops,
            [
                &FakeOp::Freeze(n.clone()),
                &FakeOp::Thaw(n.clone()),
                &FakeOp::Freeze(n.clone()),
                &FakeOp::Thaw(n.clone()),
                &FakeOp::Signal(n, libc::SIGTERM)
            ],
            "a repeated suspend freezes once"
        );
        assert_gone(&h, 16);
    }

    #[tokio::test]
    async fn a_cgroup_that_cannot_be_made_fails_the_launch_and_nothing_is_left() {
        let h = harness();
        h.fake.fail_next_create("no space left for tests");
        let Running { mut events, task, .. } = launch(&h, spec(&h, 17, "true", None));
        let out = tokio::time::timeout(Duration::from_secs(10), task).await.expect("the launch did not end").unwrap();
        let reason = out.reason.unwrap_or_default();
        assert!(reason.starts_with("launch_failed: cannot create the job's cgroup"), "{reason}");
        assert!(reason.contains("no space left for tests"), "{reason}");
        assert!(events.try_recv().is_err(), "no JobStarted for a job that did not start");
        assert!(h.fake.log().is_empty(), "nothing made: {:?}", h.fake.log());
        assert_gone(&h, 17);
    }

    #[tokio::test]
    async fn oom_kills_and_refused_forks_are_the_reason_of_a_failure() {
        let h = harness();
        h.fake.set_usage(CgroupUsage { oom_kills: 1, ..Default::default() });
        let mut r = launch(&h, spec(&h, 18, "exit 137", None));
        started(&mut r).await;
        assert_eq!(outcome(r).await.reason.as_deref(), Some("oom"));
        h.fake.set_usage(CgroupUsage { pids_limit_hits: 3, ..Default::default() });
        let mut ok = spec(&h, 19, "true", None);
        ok.pids_max = Some(8);
        let mut r = launch(&h, ok);
        started(&mut r).await;
        assert_eq!(outcome(r).await.reason, None, "a job that succeeded despite refused forks");
        let mut failed = spec(&h, 20, "exit 1", None);
        failed.pids_max = Some(8);
        let mut r = launch(&h, failed);
        started(&mut r).await;
        let reason = outcome(r).await.reason.unwrap_or_default();
        assert!(reason.starts_with("pids_limit: the job reached its limit of 8 processes"), "{reason}");
        assert!(reason.contains("3 forks refused"), "{reason}");
        assert_gone(&h, 20);
    }
}
