//! MPI libraries' own launchers inside a job (`mpirun`, `mpiexec`): they start their remote
//! daemons (Open MPI's orted, MPICH hydra's hydra_pmi_proxy) with ssh. Every job's environment
//! points them at `berth-rsh` instead (`berth task rsh`, the task API's `exec`), so those
//! daemons, and the ranks they fork, are tasks of the job: started by the node's agent in the
//! job's cgroup there, accounted, signalled and killed with the job, never ssh.
//!
//! `berth-rsh` is one word (hydra's `-launcher-exec` takes a program, no arguments): each
//! agent links it, in its spool directory (which users may traverse), to the `berth` client
//! beside its own binary.

use std::path::{Path, PathBuf};

/// The link's name (the client runs as `berth task rsh` under it).
pub use berth_protocol::step::RSH_NAME;

/// Make `SPOOL/berth-rsh`, a link to the `berth` client beside `agent_exe`, at the agent's
/// start; the link, kept in the agent's `JobContext::rsh` for its jobs' environments. Without
/// a client there (or when the link cannot be made), `None`: jobs get no launcher variables
/// (logged).
pub fn install(spool_root: &Path, agent_exe: &Path) -> Option<PathBuf> {
    let client = agent_exe.with_file_name("berth");
    if !client.is_file() {
        tracing::warn!(
            client = %client.display(),
            "no berth client beside the agent: mpirun/mpiexec inside jobs will not start their daemons through berth"
        );
        return None;
    }
    let link = spool_root.join(RSH_NAME);
    let _ = std::fs::remove_file(&link);
    match std::os::unix::fs::symlink(&client, &link) {
        Ok(()) => Some(link),
        Err(e) => {
            tracing::warn!("cannot link {} to {}: {e}", link.display(), client.display());
            None
        }
    }
}

/// The variables that make Open MPI's `mpirun` and MPICH's `mpiexec` (hydra) start their
/// daemons through `rsh` on the job's nodes (`nodefile`: one line per core, which both read as
/// a host file). Open MPI would otherwise see the Slurm variables berth sets and try `srun`
/// (plm slurm) and Slurm's allocation (ras slurm); hydra would use its Slurm launcher.
pub fn job_vars(rsh: &Path, nodefile: &Path) -> Vec<(&'static str, String)> {
    let (rsh, nodefile) = (rsh.display().to_string(), nodefile.display().to_string());
    vec![
        ("OMPI_MCA_plm", "rsh".into()),
        ("OMPI_MCA_plm_rsh_agent", rsh.clone()),
        ("OMPI_MCA_ras", "^slurm".into()),
        ("OMPI_MCA_orte_default_hostfile", nodefile.clone()),
        ("HYDRA_LAUNCHER", "ssh".into()),
        ("HYDRA_LAUNCHER_EXEC", rsh),
        ("HYDRA_HOST_FILE", nodefile),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_launchers_are_pointed_at_berth_rsh_and_the_nodefile() {
        let vars = job_vars(Path::new("/s/berth-rsh"), Path::new("/s/7/nodefile"));
        let get = |k: &str| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("OMPI_MCA_plm_rsh_agent"), Some("/s/berth-rsh"));
        assert_eq!(get("HYDRA_LAUNCHER_EXEC"), Some("/s/berth-rsh"));
        assert_eq!(get("OMPI_MCA_plm"), Some("rsh"));
        assert_eq!(get("OMPI_MCA_orte_default_hostfile"), Some("/s/7/nodefile"));
        assert_eq!(get("HYDRA_HOST_FILE"), Some("/s/7/nodefile"));
    }

    #[test]
    fn the_link_names_the_client_beside_the_agent() {
        let tmp = tempfile::tempdir().unwrap();
        let bin = tmp.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        std::fs::write(bin.join("berth"), "").unwrap();
        let link = install(tmp.path(), &bin.join("berthd")).expect("installed");
        assert_eq!(link, tmp.path().join(RSH_NAME));
        assert_eq!(std::fs::read_link(&link).unwrap(), bin.join("berth"));
        // No client beside the agent: no link, and so no launcher variables for its jobs.
        assert_eq!(install(tmp.path(), &tmp.path().join("berthd")), None);
    }
}
