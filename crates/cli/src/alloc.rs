//! `berth alloc` (Slurm's `salloc`): an interactive allocation, queued like a batch job.
//!
//! The request is stored and queued by the controller (`ClientRequest::Alloc`; priority,
//! backfill, limits and fair share apply). Once granted, the command (default: `$SHELL`, else
//! `/bin/sh`) runs here, on the submitting host as salloc's does, with the job's variables
//! (`BERTH_JOB_ID`, `SLURM_JOB_ID`, `SLURM_JOB_NODELIST`, ...) so that `berth run` / `srun`
//! in it start steps of the allocation on its nodes. With a terminal, the command gets it: it
//! runs in its own process group, made the terminal's foreground group, so Ctrl-C and job
//! control reach it as under salloc.
//!
//! This process holds the allocation over its connection to the controller: it is released
//! when the command exits (with its exit code), when this process dies, by `berth cancel`, or
//! at the walltime. A controller restart cuts the connection: this process connects again and
//! holds the allocation over the new one (`AllocHold`); the restarted controller waits
//! `ALLOC_RECLAIM_SECS` for it, and so does this process before it gives the allocation up.
//! When the allocation ends, then the command gets SIGHUP, SIGTERM
//! two seconds later, SIGKILL ten seconds after that. Ctrl-C while waiting cancels the
//! request. `--no-shell` waits for the grant, prints the job id and leaves the allocation
//! until its walltime or `berth cancel`.

use crate::client::Client;
use crate::SubmitFlags;
use anyhow::{anyhow, bail, Context, Result};
use berth_core::directives::SubmitOptions;
use berth_core::job::JobState;
use berth_core::JobId;
use berth_protocol::client::{AllocRequest, ClientRequest, ClientResponse, JobInfo, SubmitRequest, ALLOC_RECLAIM_SECS};
use clap::Args;
use std::path::Path;
use std::time::{Duration, Instant};
use tokio::signal::unix::{signal, Signal, SignalKind};

/// `berth alloc`'s command line.
#[derive(Args, Debug, Clone)]
pub struct AllocArgs {
    #[command(flatten)]
    pub flags: SubmitFlags,
    /// Tasks (as salloc's -n): per node with --nodes, else the cores (times --cpus-per-task).
    #[arg(long = "ntasks", short = 'n')]
    pub ntasks: Option<u32>,
    /// Wait for the grant, print the job id and exit 0; the allocation stays until its walltime
    /// or `berth cancel` (`berth run` uses it with BERTH_JOB_ID=ID or --job ID).
    #[arg(long = "no-shell")]
    pub no_shell: bool,
    /// Print no `pending`/`granted` lines.
    #[arg(long, short = 'Q')]
    pub quiet: bool,
    /// The command to run in the allocation (default: $SHELL, else /bin/sh); put `--` before it.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// Who speaks: `berth alloc` or `salloc` (their messages differ).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Voice {
    Berth,
    Salloc,
}

/// An allocation to make and what to do with it.
#[derive(Debug)]
pub struct AllocPlan {
    pub submit: SubmitRequest,
    pub no_shell: bool,
    pub quiet: bool,
    pub json: bool,
    /// Empty: the user's shell.
    pub command: Vec<String>,
    pub voice: Voice,
}

/// Bound on `-n`.
const MAX_TASKS: u32 = 1 << 20;

/// Apply `-n N` as `#SBATCH -n` is: tasks per node when the node count is known, the node
/// count when tasks per node are, else the job's cores (times its CPUs per task).
pub fn apply_ntasks(o: &mut SubmitOptions, n: u32) -> Result<()> {
    if n == 0 || n > MAX_TASKS {
        bail!("-n/--ntasks {n} is out of range: give 1 to {MAX_TASKS}");
    }
    match (o.nodes, o.tasks_per_node) {
        (Some(nodes), None) => o.tasks_per_node = Some(n.div_ceil(nodes.max(1))),
        (None, Some(per)) => o.nodes = Some(n.div_ceil(per.max(1))),
        (Some(_), Some(_)) => {}
        (None, None) => {
            o.cores = Some(
                n.checked_mul(o.cpus_per_task.unwrap_or(1))
                    .filter(|c| *c <= MAX_TASKS)
                    .ok_or_else(|| anyhow!("-n {n} times --cpus-per-task is too large"))?,
            )
        }
    }
    Ok(())
}

/// The submission of an allocation with `flags` (as `berth submit` reads them; no script).
pub fn alloc_submission(flags: &SubmitFlags, command: &[String]) -> Result<SubmitRequest> {
    for (flag, given) in
        [("--output", flags.output.is_some()), ("--error", flags.error.is_some()), ("--array", flags.array.is_some())]
    {
        if given {
            bail!("{flag} does not apply to an allocation: its command runs here, with your terminal; submit a batch job for that");
        }
    }
    let name = command
        .first()
        .cloned()
        .or_else(|| std::env::var("SHELL").ok())
        .and_then(|c| Path::new(&c).file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "sh".into());
    let mut sub = crate::submission::build_text_submission("#!/bin/sh\n".into(), "berth alloc", name, flags, false)?;
    sub.script = String::new();
    Ok(sub)
}

/// `berth alloc ...`.
pub async fn alloc_command(dir: &Path, json: bool, args: AllocArgs) -> Result<i32> {
    let mut submit = alloc_submission(&args.flags, &args.command)?;
    if let Some(n) = args.ntasks {
        apply_ntasks(&mut submit.options, n)?;
    }
    let plan = AllocPlan {
        submit,
        no_shell: args.no_shell,
        quiet: args.quiet,
        json,
        command: args.command,
        voice: Voice::Berth,
    };
    run_alloc(dir, plan).await
}

impl Voice {
    fn say(self, quiet: bool, berth: String, salloc: String) {
        if !quiet {
            match self {
                Voice::Berth => eprintln!("berth alloc: {berth}"),
                Voice::Salloc => eprintln!("salloc: {salloc}"),
            }
        }
    }
}

/// Signals this process takes while it waits and while the command runs.
struct Signals {
    int: Signal,
    term: Signal,
    hup: Signal,
    quit: Signal,
}

impl Signals {
    fn new() -> Result<Signals> {
        let s = |k: i32| signal(SignalKind::from_raw(k)).context("cannot watch signals");
        Ok(Signals { int: s(libc::SIGINT)?, term: s(libc::SIGTERM)?, hup: s(libc::SIGHUP)?, quit: s(libc::SIGQUIT)? })
    }

    /// The next signal, or `None` after `wait`.
    async fn next(&mut self, wait: Duration) -> Option<i32> {
        tokio::select! {
            _ = tokio::time::sleep(wait) => None,
            _ = self.int.recv() => Some(libc::SIGINT),
            _ = self.term.recv() => Some(libc::SIGTERM),
            _ = self.hup.recv() => Some(libc::SIGHUP),
            _ = self.quit.recv() => Some(libc::SIGQUIT),
        }
    }
}

/// The allocation as last seen, across a controller restart (see the module).
struct Holder<'a> {
    dir: &'a Path,
    id: JobId,
    voice: Voice,
    lost_since: Option<Instant>,
}

impl Holder<'_> {
    /// The job now; `Ok(None)` while the controller is away and may come back; `Err` why the
    /// allocation is lost to this process.
    async fn check(&mut self, client: &mut Client) -> Result<Option<JobInfo>, String> {
        let id = self.id;
        if self.lost_since.is_none() {
            match client.call(&ClientRequest::ShowJob { id }).await {
                Ok(ClientResponse::Job { job }) => return Ok(Some(*job)),
                Ok(ClientResponse::Error(e)) => return Err(e.to_string()),
                Ok(_) => return Err("unexpected answer".into()),
                Err(e) => {
                    self.voice.say(
                        false,
                        format!(
                            "lost the controller ({e:#}); holding job {id} again once it is back (up to {} s)",
                            ALLOC_RECLAIM_SECS
                        ),
                        format!("lost the controller; holding job allocation {id} again once it is back"),
                    );
                    self.lost_since = Some(Instant::now());
                }
            }
        }
        let Ok(mut again) = Client::connect_once(self.dir).await else {
            let away = self.lost_since.map_or(0.0, |t| t.elapsed().as_secs_f64());
            return if away > ALLOC_RECLAIM_SECS {
                Err(format!("lost the controller for {away:.0} s"))
            } else {
                Ok(None)
            };
        };
        match again.call(&ClientRequest::AllocHold { id }).await {
            Ok(ClientResponse::Done { .. }) => {}
            Ok(ClientResponse::Error(e)) => return Err(e.to_string()),
            // Back but not answering yet: try again at the next check.
            Ok(_) | Err(_) => return Ok(None),
        }
        self.voice.say(false, format!("holding job {id} again"), format!("job allocation {id} held again"));
        self.lost_since = None;
        *client = again;
        show(client, id).await.map(Some).map_err(|e| format!("{e:#}"))
    }
}

async fn show(client: &mut Client, id: JobId) -> Result<JobInfo> {
    match client.call(&ClientRequest::ShowJob { id }).await? {
        ClientResponse::Job { job } => Ok(*job),
        ClientResponse::Error(e) => Err(anyhow!(e)),
        _ => bail!("unexpected answer"),
    }
}

fn ended(job: &JobInfo) -> String {
    match &job.reason {
        Some(r) => format!("{}: {r}", job.state.as_str()),
        None => job.state.as_str().to_string(),
    }
}

/// Make the allocation, wait for it, then run the command in it (or leave it, `--no-shell`).
pub async fn run_alloc(dir: &Path, plan: AllocPlan) -> Result<i32> {
    let (voice, quiet) = (plan.voice, plan.quiet);
    let cwd = plan.submit.cwd.clone();
    let mut signals = Signals::new()?;
    let mut client = Client::connect(dir).await?;
    let req = ClientRequest::Alloc(Box::new(AllocRequest { submit: plan.submit, no_shell: plan.no_shell }));
    let id = match client.call(&req).await? {
        ClientResponse::Submitted { id } => id,
        ClientResponse::Error(e) => return Err(anyhow!(e)),
        _ => bail!("unexpected answer"),
    };
    // Wait for the grant; a signal cancels the request.
    let mut told = false;
    let mut holder = Holder { dir, id, voice, lost_since: None };
    let job = loop {
        let job = match holder.check(&mut client).await {
            Ok(Some(job)) => job,
            Ok(None) => {
                if let Some(sig) = signals.next(Duration::from_millis(500)).await {
                    voice.say(false, format!("job {id} given up"), format!("Job allocation {id} has been revoked."));
                    return Ok(128 + sig);
                }
                continue;
            }
            Err(why) => bail!("job {id}: {}", crate::output::terminal_safe(&why)),
        };
        match job.state {
            JobState::Running => break job,
            s if s.is_finished() => {
                voice.say(
                    false,
                    format!("job {id} ended before it was granted ({})", ended(&job)),
                    format!("Job allocation {id} has been revoked."),
                );
                return Ok(1);
            }
            _ => {}
        }
        if !told {
            let why = job.reason.clone().unwrap_or_else(|| "waiting for resources".into());
            voice.say(
                quiet,
                format!("pending job {id} ({})", crate::output::terminal_safe(&why)),
                format!("Pending job allocation {id}\nsalloc: job {id} queued and waiting for resources"),
            );
            told = true;
        }
        if let Some(sig) = signals.next(Duration::from_millis(200)).await {
            let _ = client.call(&ClientRequest::AllocEnd { id, exit_code: 128 + sig }).await;
            voice.say(false, format!("job {id} cancelled"), format!("Job allocation {id} has been revoked."));
            return Ok(1);
        }
    };
    voice.say(quiet, format!("granted job {id}"), format!("Granted job allocation {id}"));
    if plan.json {
        println!("{}", serde_json::json!({ "id": id }));
    } else if plan.no_shell && voice == Voice::Berth {
        println!("{id}");
    }
    if plan.no_shell {
        return Ok(0);
    }
    let argv = if plan.command.is_empty() {
        vec![std::env::var("SHELL").ok().filter(|s| !s.is_empty()).unwrap_or_else(|| "/bin/sh".into())]
    } else {
        plan.command
    };
    let code = run_command(&mut client, &mut signals, &job, &mut holder, &cwd, &argv).await;
    let code = match code {
        Ok(c) => c,
        Err(e) => {
            let _ = client.call(&ClientRequest::AllocEnd { id, exit_code: 1 }).await;
            return Err(e);
        }
    };
    voice.say(quiet, format!("releasing job {id}"), format!("Relinquishing job allocation {id}"));
    match client.call(&ClientRequest::AllocEnd { id, exit_code: code }).await {
        Ok(ClientResponse::Error(e)) => eprintln!("berth alloc: releasing job {id}: {e}"),
        Err(e) => eprintln!("berth alloc: releasing job {id}: {e:#}"),
        Ok(_) => {}
    }
    Ok(code)
}

/// The variables the command gets: berth's and Slurm's (as a batch script's, docs/compat.md).
pub fn alloc_env(job: &JobInfo, dir: &Path) -> Vec<(String, String)> {
    let id = job.id.to_string();
    let names: Vec<&str> = job.allocation.iter().map(|a| a.node.as_str()).collect();
    let nodelist = berth_core::hostlist::compress(&names);
    let cpt = job.request.cpus_per_task.unwrap_or(1).max(1);
    let per_node: Vec<u64> = job.allocation.iter().map(|a| u64::from((a.cores / cpt).max(1))).collect();
    let ntasks: u64 = per_node.iter().sum();
    let mut tasks_per_node: Vec<String> = Vec::new();
    let mut runs: Vec<(u64, usize)> = Vec::new();
    for c in &per_node {
        match runs.last_mut() {
            Some((v, n)) if v == c => *n += 1,
            _ => runs.push((*c, 1)),
        }
    }
    for (v, n) in runs {
        tasks_per_node.push(if n == 1 { v.to_string() } else { format!("{v}(x{n})") });
    }
    let cpus_per_node: Vec<String> = job.allocation.iter().map(|a| a.cpus.len().to_string()).collect();
    let nnodes = names.len().to_string();
    let mut vars: Vec<(String, String)> = [
        ("BERTH_DIR", dir.display().to_string()),
        ("BERTH_JOB_ID", id.clone()),
        ("BERTH_JOB_NAME", job.name.clone()),
        ("BERTH_NODES", names.join(",")),
        ("BERTH_NUM_NODES", nnodes.clone()),
        ("BERTH_SUBMIT_DIR", job.cwd.clone()),
        ("SLURM_JOB_ID", id.clone()),
        ("SLURM_JOBID", id.clone()),
        ("SLURM_JOB_NAME", job.name.clone()),
        ("SLURM_JOB_USER", job.user.clone()),
        ("SLURM_JOB_UID", job.uid.to_string()),
        ("SLURM_JOB_PARTITION", job.queue.clone()),
        ("SLURM_JOB_NODELIST", nodelist.clone()),
        ("SLURM_NODELIST", nodelist),
        ("SLURM_JOB_NUM_NODES", nnodes.clone()),
        ("SLURM_NNODES", nnodes),
        ("SLURM_NTASKS", ntasks.to_string()),
        ("SLURM_NPROCS", ntasks.to_string()),
        ("SLURM_TASKS_PER_NODE", tasks_per_node.join(",")),
        ("SLURM_JOB_CPUS_PER_NODE", cpus_per_node.join(",")),
        ("SLURM_SUBMIT_DIR", job.cwd.clone()),
        ("SLURM_SUBMIT_HOST", hostname()),
        ("PBS_JOBID", id),
        ("PBS_JOBNAME", job.name.clone()),
        ("PBS_O_WORKDIR", job.cwd.clone()),
        ("PBS_ENVIRONMENT", "PBS_INTERACTIVE".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    if let Some(c) = job.request.cpus_per_task {
        vars.push(("SLURM_CPUS_PER_TASK".into(), c.to_string()));
    }
    if let Some(t) = job.request.tasks_per_node {
        vars.push(("SLURM_NTASKS_PER_NODE".into(), t.to_string()));
    }
    vars
}

fn hostname() -> String {
    nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_default()
}

/// Standard input is a terminal whose foreground process group is ours: the command gets it.
fn own_terminal() -> bool {
    // SAFETY: plain queries of file descriptor 0.
    unsafe { libc::isatty(0) == 1 && libc::tcgetpgrp(0) == libc::getpgrp() }
}

fn give_terminal(pgrp: libc::pid_t) {
    // SAFETY: SIGTTOU is ignored (set before the command started), so a call from a
    // background group does not stop us; errors leave the terminal as it was.
    unsafe {
        libc::tcsetpgrp(0, pgrp);
    }
}

/// Run the command in the allocation and return its exit status (128+N if killed by signal
/// N). The job is watched meanwhile: if it ends (walltime, cancel, a lost controller) the
/// command is sent SIGHUP, then SIGTERM, then SIGKILL.
#[allow(clippy::too_many_arguments)]
async fn run_command(
    client: &mut Client,
    signals: &mut Signals,
    job: &JobInfo,
    holder: &mut Holder<'_>,
    cwd: &str,
    argv: &[String],
) -> Result<i32> {
    let (dir, voice) = (holder.dir, holder.voice);
    use std::os::unix::process::CommandExt;
    let id = job.id;
    let tty = own_terminal();
    if tty {
        // SAFETY: setting a disposition; the child resets it before exec.
        unsafe { libc::signal(libc::SIGTTOU, libc::SIG_IGN) };
    }
    let mut cmd = std::process::Command::new(&argv[0]);
    cmd.args(&argv[1..]).envs(alloc_env(job, dir)).current_dir(cwd);
    // This process, as the child will see it as its parent (to tell if it died already).
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            // Its own process group: a signal this process forwards reaches it once, even
            // when a terminal's Ctrl-C reached us both.
            libc::setpgid(0, 0);
            if tty {
                // The terminal's foreground group before the command runs (an interactive
                // shell not in the foreground stops itself); SIGTTOU is still ignored here.
                libc::tcsetpgrp(0, libc::getpid());
            }
            // Default dispositions, even those this process inherited ignored (`nohup berth
            // alloc`): the command must be able to die of the SIGHUP below.
            for s in [
                libc::SIGHUP,
                libc::SIGTERM,
                libc::SIGINT,
                libc::SIGQUIT,
                libc::SIGTSTP,
                libc::SIGTTIN,
                libc::SIGTTOU,
                libc::SIGPIPE,
            ] {
                libc::signal(s, libc::SIG_DFL);
            }
            // The command ends with this process even if it is killed outright; if that
            // happened between fork and here, the signal will never come: end now.
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGHUP);
            if libc::getppid() != parent {
                libc::_exit(129);
            }
            Ok(())
        });
    }
    let child = cmd.spawn().with_context(|| format!("cannot run {}", crate::output::terminal_safe(&argv[0])))?;
    let pid = child.id() as libc::pid_t;
    // Signals for the command go to its process group.
    let target = -pid;
    // SAFETY: a plain call; the child may have done it already.
    unsafe { libc::setpgid(pid, pid) };
    if tty {
        give_terminal(pid);
    }
    let mut revoked: Option<Instant> = None;
    let (mut termed, mut killed) = (false, false);
    let mut last_check = Instant::now();
    let status = loop {
        if let Some(sig) = signals.next(Duration::from_millis(100)).await {
            // SAFETY: kill(2) of our own child (group).
            unsafe { libc::kill(target, sig) };
        }
        let mut status = 0;
        // SAFETY: waitpid on our own child.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG | libc::WUNTRACED) };
        if r == pid {
            if libc::WIFSTOPPED(status) {
                let sig = libc::WSTOPSIG(status);
                if tty && (sig == libc::SIGTTIN || sig == libc::SIGTTOU) {
                    // It tried the terminal before it was given it: give it, continue it.
                    give_terminal(pid);
                    // SAFETY: kill(2) of our own child's group.
                    unsafe { libc::kill(-pid, libc::SIGCONT) };
                } else if tty {
                    // Job control: stop with it, as a shell's job would; on `fg`, hand the
                    // terminal back and continue it.
                    // SAFETY: plain calls.
                    unsafe {
                        give_terminal(libc::getpgrp());
                        libc::raise(libc::SIGSTOP);
                        give_terminal(pid);
                        libc::kill(-pid, libc::SIGCONT);
                    }
                }
                continue;
            }
            break status;
        }
        if r < 0 {
            bail!("waiting for the command: {}", std::io::Error::last_os_error());
        }
        if revoked.is_none() && last_check.elapsed() >= Duration::from_secs(1) {
            last_check = Instant::now();
            let why = match holder.check(client).await {
                Ok(Some(j)) if j.state == JobState::Running => None,
                Ok(Some(j)) => Some(ended(&j)),
                Ok(None) => None,
                Err(e) => Some(e),
            };
            if let Some(why) = why {
                voice.say(
                    false,
                    format!(
                        "job {id} has ended ({}); sending SIGHUP to the command",
                        crate::output::terminal_safe(&why)
                    ),
                    format!("Job allocation {id} has been revoked."),
                );
                // SAFETY: kill(2) of our own child (group).
                unsafe { libc::kill(target, libc::SIGHUP) };
                revoked = Some(Instant::now());
            }
        }
        if let Some(at) = revoked {
            if !termed && at.elapsed() >= Duration::from_secs(2) {
                // SAFETY: as above.
                unsafe { libc::kill(target, libc::SIGTERM) };
                termed = true;
            }
            if !killed && at.elapsed() >= Duration::from_secs(12) {
                // SAFETY: as above.
                unsafe { libc::kill(target, libc::SIGKILL) };
                killed = true;
            }
        }
    };
    if tty {
        give_terminal(unsafe { libc::getpgrp() });
    }
    Ok(if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else if libc::WIFSIGNALED(status) {
        128 + libc::WTERMSIG(status)
    } else {
        1
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ntasks_is_read_as_sbatch_reads_it() {
        let mut o = SubmitOptions::default();
        apply_ntasks(&mut o, 4).unwrap();
        assert_eq!(o.cores, Some(4));
        let mut o = SubmitOptions { nodes: Some(2), ..Default::default() };
        apply_ntasks(&mut o, 5).unwrap();
        assert_eq!(o.tasks_per_node, Some(3));
        let mut o = SubmitOptions { cpus_per_task: Some(2), ..Default::default() };
        apply_ntasks(&mut o, 3).unwrap();
        assert_eq!(o.cores, Some(6));
        assert!(apply_ntasks(&mut SubmitOptions::default(), 0).is_err());
        let mut o = SubmitOptions { cpus_per_task: Some(u32::MAX), ..Default::default() };
        assert!(apply_ntasks(&mut o, 2).is_err());
    }

    #[test]
    fn the_command_gets_the_jobs_variables() {
        let job: JobInfo = serde_json::from_value(serde_json::json!({
            "id": 12, "name": "sh", "user": "ann", "uid": 1000, "gid": 1000, "state": "running",
            "queue": "batch", "request": {"nodes": null, "cores": 4, "tasks_per_node": null,
            "cpus_per_task": 2, "mem_per_node": null, "mem_per_cpu": null, "threads": false},
            "walltime_seconds": 60, "submit_time": 0.0, "start_time": 1.0, "end_time": null,
            "allocation": [], "exit_code": null, "signal": null, "reason": null,
            "cwd": "/home/ann", "stdout": "/dev/null", "stderr": "/dev/null", "accounting": null
        }))
        .unwrap();
        let env = alloc_env(&job, Path::new("/c"));
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("BERTH_JOB_ID"), Some("12"));
        assert_eq!(get("SLURM_JOB_ID"), Some("12"));
        assert_eq!(get("BERTH_DIR"), Some("/c"));
        assert_eq!(get("SLURM_CPUS_PER_TASK"), Some("2"));
        assert_eq!(get("SLURM_SUBMIT_DIR"), Some("/home/ann"));
    }
}
