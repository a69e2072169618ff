//! A step (`berth run`) as the controller records it, and the steps not ended, in memory.

use berth_core::{CpuSet, JobId};
use std::collections::HashMap;

/// A step (`berth run`) as persisted: the invocation log, and the cores it holds while live.
#[derive(Debug, Clone, PartialEq)]
pub struct StepRow {
    pub job: JobId,
    pub step: u32,
    pub uid: u32,
    pub user: String,
    pub start_time: f64,
    pub end_time: Option<f64>,
    pub host: String,
    pub pid: u32,
    pub cwd: String,
    pub argv: Vec<String>,
    pub size: u32,
    /// Names of the nodes with ranks, in rank order.
    pub nodes: Vec<String>,
    pub exit_code: Option<i32>,
    pub failure: Option<String>,
    pub interactive: bool,
    /// PUs the step holds per node (index in the job's allocation); empty when it overcommits.
    pub claims: Vec<(usize, CpuSet)>,
}

/// A step that has not ended, as the controller keeps it to place the next ones.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveStep {
    pub step: u32,
    pub uid: u32,
    /// Who it runs as, by name (its row's `user`): shown when someone else's end is refused.
    pub user: String,
    /// PUs it holds per node (index in the job's allocation); empty when it overcommits.
    pub claims: Vec<(usize, CpuSet)>,
    /// Names of the nodes with its ranks.
    pub nodes: Vec<String>,
    /// The client connection it was granted on (None after a controller restart).
    pub conn: Option<u64>,
    /// It made its (interactive) job, which ends with it.
    pub interactive: bool,
    /// When it was granted (Unix seconds): its grant may start it until the grant expires.
    pub granted_at: f64,
}

/// The steps (`berth run`) that have not ended, per running job: at load, the open rows of
/// running jobs; then those granted, until each ends or its job does.
#[derive(Debug, Default)]
pub struct LiveSteps {
    /// Never an empty list: a job's entry goes with its last step.
    by_job: HashMap<JobId, Vec<LiveStep>>,
}

impl LiveSteps {
    /// Step `live` of `job` was granted (or found open at load).
    pub fn add(&mut self, job: JobId, live: LiveStep) {
        self.by_job.entry(job).or_default().push(live);
    }

    /// Step `step` of `job` if it has not ended.
    pub fn get(&self, job: JobId, step: u32) -> Option<&LiveStep> {
        self.of(job).iter().find(|s| s.step == step)
    }

    /// The live steps of `job`, in the order they were granted.
    pub fn of(&self, job: JobId) -> &[LiveStep] {
        self.by_job.get(&job).map_or(&[], Vec::as_slice)
    }

    /// Whether some live step of `job` holds PUs (steps that overcommit hold none).
    pub fn hold_pus(&self, job: JobId) -> bool {
        self.of(job).iter().any(|s| !s.claims.is_empty())
    }

    /// Every live step, with its job (in no particular order).
    pub fn iter(&self) -> impl Iterator<Item = (JobId, &LiveStep)> {
        self.by_job.iter().flat_map(|(id, v)| v.iter().map(move |s| (*id, s)))
    }

    /// Step `step` of `job` ended: no longer live.
    pub fn close(&mut self, job: JobId, step: u32) {
        if let Some(v) = self.by_job.get_mut(&job) {
            v.retain(|s| s.step != step);
            if v.is_empty() {
                self.by_job.remove(&job);
            }
        }
    }

    /// `job` ended (or was requeued): its steps end with it.
    pub fn end_all_of(&mut self, job: JobId) {
        self.by_job.remove(&job);
    }

    /// After a reload from the store (`Controller::reload`): each step keeps the client
    /// connection it had in `before` (what lives only in memory).
    pub fn keep_connections(&mut self, before: &LiveSteps) {
        for (id, live) in self.by_job.iter_mut() {
            for s in live.iter_mut() {
                s.conn = before.get(*id, s.step).and_then(|x| x.conn);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live(step: u32, conn: Option<u64>, claims: bool) -> LiveStep {
        LiveStep {
            step,
            uid: 1000,
            user: "ann".into(),
            claims: if claims { vec![(0, CpuSet::parse_list("0-1").unwrap())] } else { vec![] },
            nodes: vec!["n0".into()],
            conn,
            interactive: false,
            granted_at: 0.0,
        }
    }

    #[test]
    fn steps_are_live_from_their_grant_to_their_end_or_their_job_s() {
        let mut steps = LiveSteps::default();
        steps.add(JobId(7), live(1, Some(1), false));
        steps.add(JobId(7), live(2, Some(1), true));
        steps.add(JobId(8), live(1, None, false));
        assert_eq!(steps.of(JobId(7)).iter().map(|s| s.step).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(steps.get(JobId(7), 2).map(|s| s.step), Some(2));
        assert_eq!(steps.get(JobId(7), 3), None);
        assert!(steps.hold_pus(JobId(7)) && !steps.hold_pus(JobId(8)) && !steps.hold_pus(JobId(9)));
        let mut all: Vec<(JobId, u32)> = steps.iter().map(|(id, s)| (id, s.step)).collect();
        all.sort();
        assert_eq!(all, vec![(JobId(7), 1), (JobId(7), 2), (JobId(8), 1)]);
        // The step holding PUs ends: they are the job's again.
        steps.close(JobId(7), 2);
        assert!(!steps.hold_pus(JobId(7)));
        steps.close(JobId(7), 1);
        assert!(steps.of(JobId(7)).is_empty());
        assert!(!steps.by_job.contains_key(&JobId(7)), "no empty entry is left");
        // Closing one not live changes nothing; a job's end ends all of its steps.
        steps.close(JobId(8), 5);
        assert_eq!(steps.of(JobId(8)).len(), 1);
        steps.end_all_of(JobId(8));
        assert_eq!(steps.iter().count(), 0);
    }

    #[test]
    fn a_reload_keeps_each_step_s_connection() {
        let mut before = LiveSteps::default();
        before.add(JobId(7), live(1, Some(4), false));
        before.add(JobId(7), live(2, None, false));
        let mut loaded = LiveSteps::default();
        for step in [1, 2, 3] {
            loaded.add(JobId(7), live(step, None, false));
        }
        loaded.add(JobId(8), live(1, Some(9), false));
        loaded.keep_connections(&before);
        let conns: Vec<Option<u64>> = loaded.of(JobId(7)).iter().map(|s| s.conn).collect();
        assert_eq!(conns, vec![Some(4), None, None]);
        // A step the state before did not have has no connection.
        assert_eq!(loaded.get(JobId(8), 1).unwrap().conn, None);
    }
}
