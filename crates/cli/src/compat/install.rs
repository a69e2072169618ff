//! `berth compat install DIR`: links named `sbatch`, `squeue`, ... to this client in DIR, so
//! that putting DIR on PATH makes berth answer to Slurm's and PBS's command names.

use anyhow::{anyhow, bail, Context, Result};
use clap::Subcommand;
use serde::Serialize;
use std::path::{Path, PathBuf};

#[derive(Subcommand, Debug)]
pub enum CompatCommand {
    /// Make links named sbatch, squeue, scancel, sinfo, scontrol, sacct, srun, salloc, qsub, qstat,
    /// qdel, qhold, qrls, qalter, qrerun, pbsnodes and aprun to this berth in DIR (created if
    /// missing). Run again, it changes nothing; a link to another program is replaced only
    /// with --force, and a file that is not a link never.
    Install {
        dir: PathBuf,
        /// Replace links of these names that point elsewhere.
        #[arg(long)]
        force: bool,
    },
    /// The command names berth answers to.
    Names,
}

#[derive(Serialize, Debug, PartialEq, Eq)]
pub struct Link {
    pub name: String,
    pub path: String,
    pub target: String,
    /// "created", "kept" (already there) or "replaced".
    pub action: &'static str,
}

pub fn run(json: bool, command: CompatCommand) -> Result<i32> {
    match command {
        CompatCommand::Names => {
            if json {
                println!("{}", serde_json::json!({ "names": super::NAMES }));
            } else {
                super::NAMES.iter().for_each(|n| println!("{n}"));
            }
            Ok(0)
        }
        CompatCommand::Install { dir, force } => {
            let exe = std::env::current_exe().context("cannot find this berth executable")?;
            let exe = exe.canonicalize().unwrap_or(exe);
            let links = install(&dir, &exe, force)?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(
                        &serde_json::json!({ "dir": dir.display().to_string(), "links": links })
                    )?
                );
            } else {
                for l in &links {
                    println!("{} -> {} ({})", l.path, l.target, l.action);
                }
            }
            Ok(0)
        }
    }
}

/// Link every name in `dir` to `target`.
pub fn install(dir: &Path, target: &Path, force: bool) -> Result<Vec<Link>> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    // Checked first, so that nothing is changed when one name is taken.
    for name in super::NAMES {
        let path = dir.join(name);
        if let Ok(meta) = std::fs::symlink_metadata(&path) {
            if !meta.file_type().is_symlink() {
                bail!(
                    "{} exists and is not a link (another {name}?); remove it or choose another directory",
                    path.display()
                );
            }
            let points = std::fs::read_link(&path)?;
            if !same(&points, target, dir) && !force {
                bail!(
                    "{} links to {}, not to this berth; give --force to replace it",
                    path.display(),
                    points.display()
                );
            }
        }
    }
    let mut out = Vec::new();
    for name in super::NAMES {
        let path = dir.join(name);
        let action = match std::fs::read_link(&path) {
            Ok(points) if same(&points, target, dir) => "kept",
            Ok(_) => {
                // Replaced atomically: a link beside it renamed over it.
                let tmp = dir.join(format!(".{name}.berth-{}", std::process::id()));
                let _ = std::fs::remove_file(&tmp);
                std::os::unix::fs::symlink(target, &tmp)
                    .with_context(|| format!("cannot make a link in {}", dir.display()))?;
                std::fs::rename(&tmp, &path).map_err(|e| anyhow!("cannot replace {}: {e}", path.display()))?;
                "replaced"
            }
            Err(_) => {
                std::os::unix::fs::symlink(target, &path)
                    .with_context(|| format!("cannot make the link {}", path.display()))?;
                "created"
            }
        };
        out.push(Link {
            name: name.to_string(),
            path: path.display().to_string(),
            target: target.display().to_string(),
            action,
        });
    }
    Ok(out)
}

/// Whether a link's text `points` (relative to `dir`) names `target`.
fn same(points: &Path, target: &Path, dir: &Path) -> bool {
    let resolved = dir.join(points);
    points == target || resolved.canonicalize().ok().as_deref() == target.canonicalize().ok().as_deref()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn install_is_idempotent_and_never_clobbers() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("berth");
        std::fs::write(&target, "").unwrap();
        let dir = tmp.path().join("bin");
        let first = install(&dir, &target, false).unwrap();
        assert_eq!(first.len(), super::super::NAMES.len());
        assert!(first.iter().all(|l| l.action == "created"));
        assert_eq!(std::fs::read_link(dir.join("sbatch")).unwrap(), target);
        let again = install(&dir, &target, false).unwrap();
        assert!(again.iter().all(|l| l.action == "kept"), "{again:?}");
        // A link elsewhere: refused, then replaced with --force.
        std::fs::remove_file(dir.join("qsub")).unwrap();
        std::os::unix::fs::symlink("/bin/true", dir.join("qsub")).unwrap();
        let e = install(&dir, &target, false).unwrap_err().to_string();
        assert!(e.contains("--force"), "{e}");
        let forced = install(&dir, &target, true).unwrap();
        assert_eq!(forced.iter().find(|l| l.name == "qsub").unwrap().action, "replaced");
        assert_eq!(std::fs::read_link(dir.join("qsub")).unwrap(), target);
        // A real file is never replaced.
        std::fs::remove_file(dir.join("qdel")).unwrap();
        std::fs::write(dir.join("qdel"), "#!/bin/sh\n").unwrap();
        assert!(install(&dir, &target, true).unwrap_err().to_string().contains("not a link"));
    }
}
