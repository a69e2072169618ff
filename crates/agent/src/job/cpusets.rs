//! The job's cpusets on this node: per-rank sub-cpusets inside the job's cpuset, handing
//! them to the job's user (who may then make its own sub-cpusets and move its processes
//! between them, as in seeds/000), and reporting what the kernel holds.

use crate::cgroup::{JobCgroup, JobLimits};
use crate::cpumap::CpuMap;
use berth_protocol::agent::{CgroupReport, LaunchSpec};
use std::path::{Path, PathBuf};

/// The job's cpuset cgroups, ready for the job's environment and the JobStarted report.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobCpusets {
    /// The job's cpuset directory (`BERTH_CPUSET`).
    pub dir: PathBuf,
    /// Rank sub-cpuset directories in rank order (`BERTH_RANK_CPUSETS`).
    pub ranks: Vec<PathBuf>,
}

impl JobCpusets {
    /// What the kernel holds for the job's cpuset and each rank's (`job` and `ranks` as given
    /// to [`prepare`]): read for the JobStarted report, after the job has started.
    pub fn reports(
        &self,
        cg: &dyn JobCgroup,
        mount: &Path,
        job: &JobLimits,
        ranks: &[(String, String)],
    ) -> Vec<CgroupReport> {
        let mut reports = vec![report(cg, mount, &self.dir, None, &job.cpus, &job.mems)];
        for (i, ((cpus, mems), d)) in ranks.iter().zip(&self.ranks).enumerate() {
            reports.push(report(cg, mount, d, Some(i), cpus, mems));
        }
        reports
    }

    /// `BERTH_RANK_CPUSETS`: space-separated absolute directories.
    pub fn ranks_env(&self) -> String {
        self.ranks.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(" ")
    }
}

/// Name of rank `i`'s sub-cpuset inside the job's cpuset.
pub fn rank_name(i: usize) -> String {
    format!("rank{i}")
}

/// Why a job's per-rank sub-cpusets cannot be made (part of the job's launch failure).
#[derive(Debug, thiserror::Error)]
pub enum CpusetError {
    #[error("rank {rank}'s CPUs [{cpus}] are not a non-empty part of the job's CPUs {job_cpus}")]
    RankCpus { rank: usize, cpus: String, job_cpus: String },
    #[error("rank {rank}'s memory nodes {mems} are not all among the job's {job_mems}")]
    RankMems { rank: usize, mems: String, job_mems: String },
    #[error("rank {rank}'s CPUs {cpus} map to no host CPU")]
    NoHostCpus { rank: usize, cpus: String },
    #[error("cannot create the sub-cpuset of rank {rank}: {error}")]
    MakeRank { rank: usize, error: crate::cgroup::CgroupError },
    #[error("cannot give the job's cpuset to uid {uid}: {error}")]
    Chown { uid: u32, error: crate::cgroup::CgroupError },
}

/// Host CPU and memory-node lists of each rank's sub-cpuset. The ranks come from the
/// controller: each must be non-empty and inside the job's allocation (the kernel would
/// refuse a v1 child outside its parent; v2 would silently narrow it).
pub fn rank_limits(spec: &LaunchSpec, map: &CpuMap, job: &JobLimits) -> Result<Vec<(String, String)>, CpusetError> {
    let alloc = &spec.allocation;
    let mut out = Vec::with_capacity(alloc.ranks.len());
    for (i, rank) in alloc.ranks.iter().enumerate() {
        if rank.cpus.is_empty() || !rank.cpus.is_subset_of(&alloc.cpus) {
            return Err(CpusetError::RankCpus { rank: i, cpus: rank.cpus.to_list(), job_cpus: alloc.cpus.to_list() });
        }
        if !rank.mems.is_subset_of(&alloc.mems) {
            return Err(CpusetError::RankMems { rank: i, mems: rank.mems.to_list(), job_mems: alloc.mems.to_list() });
        }
        let cpus = map.cpus(&rank.cpus).to_list();
        if cpus.is_empty() {
            return Err(CpusetError::NoHostCpus { rank: i, cpus: rank.cpus.to_list() });
        }
        // No memory nodes named: the job's own (CpuMap::mems would give every host node).
        let mems = if rank.mems.is_empty() { job.mems.clone() } else { map.mems(&rank.mems).to_list() };
        out.push((cpus, mems));
    }
    Ok(out)
}

/// Make the rank sub-cpusets and give the job's cpuset to `uid`:`gid` ([`JobCpusets::reports`]
/// reads back what the kernel holds, off the launch's path). On error the job cgroup may hold
/// some ranks; removing the job removes them.
pub fn prepare(cg: &dyn JobCgroup, ranks: &[(String, String)], uid: u32, gid: u32) -> Result<JobCpusets, CpusetError> {
    let mut dirs = Vec::with_capacity(ranks.len());
    for (i, (cpus, mems)) in ranks.iter().enumerate() {
        let dir = cg.make_child(&rank_name(i), cpus, mems).map_err(|error| CpusetError::MakeRank { rank: i, error })?;
        dirs.push(dir);
    }
    cg.chown_cpuset(uid, gid).map_err(|error| CpusetError::Chown { uid, error })?;
    Ok(JobCpusets { dir: cg.cpuset_dir(), ranks: dirs })
}

/// What the kernel holds for one cgroup; what was asked for if it cannot tell.
pub(crate) fn report(
    cg: &dyn JobCgroup,
    mount: &Path,
    dir: &Path,
    rank: Option<usize>,
    cpus: &str,
    mems: &str,
) -> CgroupReport {
    let name = rank.map(rank_name);
    let (cpus, mems) = match cg.read_cpuset(name.as_deref()) {
        Ok(Some(pair)) => pair,
        Ok(None) => {
            tracing::warn!(cgroup = %dir.display(), "no cpuset controller here; reporting the requested CPUs");
            (cpus.to_string(), mems.to_string())
        }
        Err(e) => {
            tracing::warn!(cgroup = %dir.display(), "cannot read back the cpuset ({e}); reporting the requested CPUs");
            (cpus.to_string(), mems.to_string())
        }
    };
    let path = dir.strip_prefix(mount).unwrap_or(dir).display().to_string();
    CgroupReport { path, cpus, mems, rank: rank.map(|r| r as u32) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::v2::V2Job;
    use berth_core::job::RankSet;
    use berth_core::topology::Topology;
    use berth_core::CpuSet;

    fn set(list: &str) -> CpuSet {
        CpuSet::parse_list(list).unwrap()
    }

    fn spec(cpus: &str, mems: &str, ranks: &[(&str, &str)]) -> LaunchSpec {
        let mut s: LaunchSpec = serde_json::from_value(serde_json::json!({
            "id": 1, "name": "t", "user": {"uid": 0, "gid": 0, "groups": [], "name": "root"},
            "env": [], "cwd": "/", "script": "", "stdout": "/dev/null", "stderr": "/dev/null",
            "allocation": {"node_id": 0, "node": "n", "cpus": cpus, "cores": 1, "mems": mems, "memory_bytes": 0},
            "nodes": [], "walltime_seconds": null, "kill_grace_ms": 0
        }))
        .unwrap();
        s.allocation.ranks = ranks.iter().map(|(c, m)| RankSet { cpus: set(c), mems: set(m) }).collect();
        s
    }

    #[test]
    fn rank_limits_map_and_check() {
        // Emulated 2 NUMA x 2 cores x 2 PUs onto host CPUs 0-3 and one memory node.
        let topo = Topology::uniform(1, 2, 2, 2, 1 << 30);
        let map = CpuMap::round_robin(&topo, set("0-3"), set("0"));
        let job = JobLimits {
            cpus: "0-3".into(),
            mems: "0".into(),
            memory_limit_bytes: None,
            pids_max: None,
            deny_devices: vec![],
        };
        let s = spec("0-7", "0-1", &[("0-3", "0"), ("4-7", "1"), ("6", "")]);
        let want = [("0-3", "0"), ("0-3", "0"), ("2", "0")].map(|(c, m)| (c.to_string(), m.to_string()));
        assert_eq!(rank_limits(&s, &map, &job).unwrap(), want);
        let e = rank_limits(&spec("0-3", "0", &[("2-4", "0")]), &map, &job).unwrap_err().to_string();
        assert!(e.contains("rank 0's CPUs [2-4]"), "{e}");
        let e = rank_limits(&spec("0-3", "0", &[("0", "0"), ("", "0")]), &map, &job).unwrap_err().to_string();
        assert!(e.contains("rank 1's CPUs []"), "{e}");
        let e = rank_limits(&spec("0-3", "0", &[("0", "1")]), &map, &job).unwrap_err().to_string();
        assert!(e.contains("memory nodes 1"), "{e}");
    }

    #[test]
    fn prepare_reports_what_the_files_hold() {
        let tmp = tempfile::tempdir().unwrap();
        let mount = tmp.path();
        let root = mount.join("berth/n1");
        let dir = root.join("job_1");
        std::fs::create_dir_all(&dir).unwrap();
        for (f, v) in
            [("cgroup.subtree_control", ""), ("cpuset.cpus.effective", "0-3\n"), ("cpuset.mems.effective", "0\n")]
        {
            std::fs::write(dir.join(f), v).unwrap();
        }
        let job = V2Job::at(dir.clone(), root);
        // The real mkdir makes no interface files in a fixture: without cpuset files,
        // make_child fails and leaves nothing behind.
        let ranks = vec![("0-1".to_string(), "0".to_string())];
        let limits = JobLimits {
            cpus: "0-3".into(),
            mems: "0".into(),
            memory_limit_bytes: None,
            pids_max: None,
            deny_devices: vec![],
        };
        let (uid, gid) = (nix::unistd::getuid().as_raw(), nix::unistd::getgid().as_raw());
        let e = prepare(&job, &ranks, uid, gid).unwrap_err().to_string();
        assert!(e.starts_with("cannot create the sub-cpuset of rank 0"), "{e}");
        assert!(!dir.join("rank0").exists());
        let cs = prepare(&job, &[], uid, gid).unwrap();
        assert_eq!(cs.dir, dir);
        let want = CgroupReport { path: "berth/n1/job_1".into(), cpus: "0-3".into(), mems: "0".into(), rank: None };
        assert_eq!(cs.reports(&job, mount, &limits, &[]), [want]);
        // No cpuset files at all (controller absent): the request is reported.
        std::fs::remove_file(dir.join("cpuset.cpus.effective")).unwrap();
        let asked = JobLimits { cpus: "1".into(), ..limits };
        let cs = prepare(&job, &[], uid, gid).unwrap();
        let reports = cs.reports(&job, mount, &asked, &[]);
        assert_eq!((reports[0].cpus.as_str(), reports[0].mems.as_str()), ("1", "0"));
        assert_eq!(cs.ranks_env(), "");
    }
}
