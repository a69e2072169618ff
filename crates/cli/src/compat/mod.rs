//! The client under Slurm's and PBS's command names (issue 19, "Under their own names"):
//! `sbatch`, `squeue`, `scancel`, `sinfo`, `scontrol`, `sacct`, `qsub`, `qstat`, `qdel`,
//! `qhold`, `qrls`, `qalter`, `qrerun`, `pbsnodes`, and the launchers `srun` and `aprun` (`berth run` with their
//! spellings), and `salloc` (`berth alloc`). Invoked as one of them
//! (its argv[0], e.g. a link `berth compat install DIR` made), `berth` reads that command's
//! options, makes the same requests as `berth submit`, `jobs`, `cancel` and `nodes`, and
//! prints what the original prints, so that scripts parsing it keep working
//! (docs/compat.md, "Command names").

pub mod format;
pub mod install;
pub mod launch;
pub mod pbs;
pub mod sacct;
pub mod salloc;
pub mod scontrol;
pub mod slurm;
pub mod wait;

use anyhow::Result;
use std::ffi::OsString;
use std::future::Future;
use std::path::{Path, PathBuf};

/// Every name the client answers to besides `berth`.
pub const NAMES: [&str; 17] = [
    "sbatch", "squeue", "scancel", "sinfo", "scontrol", "sacct", "srun", "salloc", "qsub", "qstat", "qdel", "qhold",
    "qrls", "qalter", "qrerun", "pbsnodes", "aprun",
];

/// If the program was invoked under one of [`NAMES`], run as that command and return its
/// exit status; else `None` (the caller goes on as `berth`).
pub fn main_by_name(argv: Vec<OsString>) -> Option<i32> {
    let name = argv.first().map(Path::new).and_then(Path::file_name)?.to_str()?.to_string();
    if !NAMES.contains(&name.as_str()) {
        return None;
    }
    crate::default_sigpipe();
    let mut args = Vec::with_capacity(argv.len());
    for a in argv.into_iter().skip(1) {
        match a.into_string() {
            Ok(s) => args.push(s),
            Err(a) => {
                eprintln!("{name}: error: argument {a:?} is not valid UTF-8");
                return Some(1);
            }
        }
    }
    let dir = crate::client::cluster_dir(None);
    Some(match name.as_str() {
        "sbatch" => block_on(&name, slurm::sbatch(&dir, args)),
        "squeue" => block_on(&name, slurm::squeue(&dir, args)),
        "scancel" => block_on(&name, slurm::scancel(&dir, args)),
        "sinfo" => block_on(&name, slurm::sinfo(&dir, args)),
        "scontrol" => block_on(&name, scontrol::scontrol(&dir, args)),
        "sacct" => block_on(&name, sacct::sacct(&dir, args)),
        "srun" => block_on(&name, launch::srun(&dir, args)),
        "salloc" => block_on(&name, salloc::salloc(&dir, args)),
        "aprun" => block_on(&name, launch::aprun(&dir, args)),
        "qsub" => block_on(&name, pbs::qsub(&dir, args)),
        "qstat" => block_on(&name, pbs::qstat(&dir, args)),
        "qdel" => block_on(&name, pbs::qdel(&dir, args)),
        "qhold" => block_on(&name, pbs::qhold(&dir, args, true)),
        "qrls" => block_on(&name, pbs::qhold(&dir, args, false)),
        "qalter" => block_on(&name, pbs::qalter(&dir, args)),
        "qrerun" => block_on(&name, pbs::qrerun(&dir, args)),
        "pbsnodes" => block_on(&name, pbs::pbsnodes(&dir, args)),
        _ => return None,
    })
}

/// Run `body` on a one-thread runtime; an error is printed as the original tools print
/// theirs (`sbatch: error: ...` for Slurm's, `qsub: ...` for PBS's) and exits 1.
fn block_on(name: &str, body: impl Future<Output = Result<i32>>) -> i32 {
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{name}: error: cannot start the async runtime: {e}");
            return 1;
        }
    };
    let code = rt.block_on(async {
        match body.await {
            Ok(code) => code,
            Err(e) => {
                let msg = format!("{e:#}");
                let msg = crate::output::terminal_safe(&msg);
                if name.starts_with('q') || name == "pbsnodes" || name == "aprun" {
                    eprintln!("{name}: {msg}");
                } else {
                    eprintln!("{name}: error: {msg}");
                }
                1
            }
        }
    });
    rt.shutdown_background();
    code
}

/// A script given as text (sbatch `--wrap`, a script on standard input): written to a private
/// temporary file for `build_submission`, removed when dropped.
pub struct TempScript {
    pub path: PathBuf,
}

impl TempScript {
    pub fn new(text: &str) -> Result<TempScript> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let dir = std::env::temp_dir();
        for n in 0..100u32 {
            let path = dir.join(format!("berth-script-{}-{n}", std::process::id()));
            match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path) {
                Ok(mut f) => {
                    let t = TempScript { path };
                    f.write_all(text.as_bytes())?;
                    return Ok(t);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(anyhow::anyhow!("cannot write a temporary script in {}: {e}", dir.display())),
            }
        }
        anyhow::bail!("cannot create a temporary script in {}", dir.display())
    }
}

impl Drop for TempScript {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Standard input as a script's text (at most 16 MiB, UTF-8: the bound of a script file).
pub fn read_stdin_script() -> Result<String> {
    crate::submission::read_bounded(std::io::stdin().lock(), "the script on standard input")
}

/// The jobs with these ids, each asked for alone (cheaper than listing every job, finished
/// ones included, for a script polling one job); ids the controller does not know are left
/// out.
pub async fn jobs_by_id(dir: &Path, ids: &[berth_core::JobId]) -> Result<Vec<berth_protocol::client::JobInfo>> {
    jobs_by_id_with(dir, ids, false).await
}

/// [`jobs_by_id`], keeping each job's steps when `steps` (sacct's `N.S` lines).
pub async fn jobs_by_id_with(
    dir: &Path,
    ids: &[berth_core::JobId],
    steps: bool,
) -> Result<Vec<berth_protocol::client::JobInfo>> {
    use berth_protocol::client::{ClientRequest, ClientResponse, ErrorCode};
    let mut out = Vec::with_capacity(ids.len());
    for &id in ids {
        match crate::client::request(dir, ClientRequest::ShowJob { id }).await {
            Ok(ClientResponse::Job { mut job }) => {
                if !steps {
                    job.steps.clear();
                }
                out.push(*job)
            }
            Ok(_) => anyhow::bail!("unexpected answer"),
            Err(e) => match e.downcast_ref::<berth_protocol::client::ApiError>() {
                Some(api) if api.code == ErrorCode::UnknownJob => {}
                _ => return Err(e),
            },
        }
    }
    Ok(out)
}
