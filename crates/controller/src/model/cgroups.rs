//! What the agents report of each running job's cgroups (shown by `berth show`), per node.
//! In memory only: agents report them when a job starts and when it resumes.

use berth_core::JobId;
use berth_protocol::agent::CgroupReport;
use std::collections::HashMap;

/// The cgroups of running jobs, each with the name of its node.
#[derive(Debug, Default)]
pub struct JobCgroups {
    by_job: HashMap<JobId, Vec<(String, CgroupReport)>>,
}

impl JobCgroups {
    /// `job` started on `node`: its cgroups there are those reported (any reported before by
    /// that node replaced).
    pub fn started(&mut self, job: JobId, node: &str, reports: Vec<CgroupReport>) {
        let entry = self.by_job.entry(job).or_default();
        entry.retain(|(n, _)| n != node);
        entry.extend(reports.into_iter().map(|c| (node.to_string(), c)));
    }

    /// `job` resumed on `node`: its own cgroup there is the one reported (a resume may move
    /// it); its ranks' sub-cpusets stay as reported before.
    pub fn resumed(&mut self, job: JobId, node: &str, reports: Vec<CgroupReport>) {
        let entry = self.by_job.entry(job).or_default();
        entry.retain(|(n, c)| !(n == node && c.rank.is_none()));
        entry.extend(reports.into_iter().map(|c| (node.to_string(), c)));
    }

    /// The cgroups of `job`, with their nodes' names, in the order reported.
    pub fn of(&self, job: JobId) -> &[(String, CgroupReport)] {
        self.by_job.get(&job).map_or(&[], Vec::as_slice)
    }

    /// `job` ended (or was requeued): its cgroups are gone.
    pub fn forget(&mut self, job: JobId) {
        self.by_job.remove(&job);
    }

    /// Forget the cgroups of jobs for which `live` is false.
    pub fn keep_only(&mut self, mut live: impl FnMut(JobId) -> bool) {
        self.by_job.retain(|id, _| live(*id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(path: &str, rank: Option<u32>) -> CgroupReport {
        CgroupReport { path: path.into(), cpus: "0-1".into(), mems: "0".into(), rank }
    }

    fn paths(c: &JobCgroups, job: JobId) -> Vec<(String, String)> {
        c.of(job).iter().map(|(n, r)| (n.clone(), r.path.clone())).collect()
    }

    #[test]
    fn a_start_replaces_what_its_node_reported_before() {
        let mut c = JobCgroups::default();
        let job = JobId(7);
        c.started(job, "n0", vec![report("n0/job-7", None), report("n0/job-7/rank0", Some(0))]);
        c.started(job, "n1", vec![report("n1/job-7", None)]);
        c.started(job, "n0", vec![report("n0/job-7b", None)]);
        let want = vec![("n1".into(), "n1/job-7".into()), ("n0".into(), "n0/job-7b".into())];
        assert_eq!(paths(&c, job), want);
        assert!(c.of(JobId(8)).is_empty());
    }

    #[test]
    fn a_resume_replaces_the_job_s_own_cgroup_and_keeps_its_ranks() {
        let mut c = JobCgroups::default();
        let job = JobId(7);
        c.started(job, "n0", vec![report("n0/job-7", None), report("n0/job-7/rank0", Some(0))]);
        c.started(job, "n1", vec![report("n1/job-7", None)]);
        c.resumed(job, "n0", vec![report("n0/job-7-moved", None)]);
        let want: Vec<(String, String)> = vec![
            ("n0".into(), "n0/job-7/rank0".into()),
            ("n1".into(), "n1/job-7".into()),
            ("n0".into(), "n0/job-7-moved".into()),
        ];
        assert_eq!(paths(&c, job), want);
    }

    #[test]
    fn an_ended_job_s_cgroups_are_forgotten() {
        let mut c = JobCgroups::default();
        for id in [1, 2, 3] {
            c.started(JobId(id), "n0", vec![report("x", None)]);
        }
        c.forget(JobId(1));
        c.keep_only(|id| id != JobId(3));
        assert!(c.of(JobId(1)).is_empty() && c.of(JobId(3)).is_empty());
        assert_eq!(c.of(JobId(2)).len(), 1);
    }
}
