//! What a job entering memory carries over from its earlier runs (`crate::model::counts`):
//! its `requeue` events and its highest step id, read once when it enters memory, never to
//! decide about a job already there.

use super::{Store, StoreError};
use crate::model::counts::JobCounts;
use berth_core::JobId;
use std::collections::HashMap;

/// A job's `requeue` events, per job of `JOBS`.
const REQUEUES: &str = "SELECT job_id, COUNT(*) FROM events WHERE kind = 'requeue' AND job_id JOBS GROUP BY job_id";
/// A job's highest step id, per job of `JOBS`.
const LAST_STEPS: &str = "SELECT job_id, MAX(step) FROM steps WHERE job_id JOBS GROUP BY job_id";

/// Whose counts a query reads (what `JOBS` stands for in [`REQUEUES`] and [`LAST_STEPS`]).
#[derive(Clone, Copy)]
enum Whose {
    /// Every job the controller keeps in memory (queued, held, running, suspended).
    Live,
    /// One job, whatever its state.
    Job(JobId),
}

impl Store {
    /// The counts of every job the controller keeps in memory (queued, held, running,
    /// suspended; `Store::load_active_jobs`): at load and reload. Two grouped queries, not
    /// one per job (an array's tasks are many).
    pub fn job_counts(&self) -> Result<JobCounts, StoreError> {
        let mut counts = JobCounts::default();
        let requeues = self.per_job(REQUEUES, Whose::Live)?;
        let mut last_steps: HashMap<JobId, u32> = self.per_job(LAST_STEPS, Whose::Live)?.into_iter().collect();
        for (id, n) in requeues {
            counts.restore(id, n, last_steps.remove(&id).unwrap_or(0));
        }
        for (id, last) in last_steps {
            counts.restore(id, 0, last);
        }
        Ok(counts)
    }

    /// Job `id`'s counts as recorded (its `requeue` events, its highest step id; 0: none):
    /// an ended job that enters memory again (`berth requeue`).
    pub fn job_counts_of(&self, id: JobId) -> Result<(u32, u32), StoreError> {
        // One job: at most one row each, none when it has no event or no step.
        let of = |rows: Vec<(JobId, u32)>| rows.first().map_or(0, |r| r.1);
        Ok((of(self.per_job(REQUEUES, Whose::Job(id))?), of(self.per_job(LAST_STEPS, Whose::Job(id))?)))
    }

    /// The rows of grouped query `query` (`REQUEUES`, `LAST_STEPS`) for `whose`: a job and its
    /// count, clamped to a u32 (a count of none: 0). One job's statement is cached (a requeue
    /// runs it); the live jobs' runs at load and reload only, so it is not.
    fn per_job(&self, query: &str, whose: Whose) -> Result<Vec<(JobId, u32)>, StoreError> {
        const LIVE: &str = "IN (SELECT id FROM jobs WHERE state IN ('queued','held','running','suspended'))";
        let (jobs, id) = match whose {
            Whose::Live => (LIVE, None),
            Whose::Job(id) => ("= ?1", Some(id.0 as i64)),
        };
        let sql = query.replace("JOBS", jobs);
        let (mut fresh, mut cached);
        let st: &mut rusqlite::Statement<'_> = match whose {
            Whose::Live => {
                fresh = self.conn.prepare(&sql).map_err(|e| self.err(e))?;
                &mut fresh
            }
            Whose::Job(_) => {
                cached = self.conn.prepare_cached(&sql).map_err(|e| self.err(e))?;
                &mut cached
            }
        };
        let rows = st
            .query_map(rusqlite::params_from_iter(id), |r| {
                let n = r.get::<_, Option<i64>>(1)?.unwrap_or(0);
                Ok((JobId(r.get::<_, i64>(0)? as u64), n.clamp(0, u32::MAX as i64) as u32))
            })
            .map_err(|e| self.err(e))?;
        rows.map(|row| row.map_err(|e| self.err(e))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::params;

    /// A job row with what the counts read (its id and state), and its requeue events and steps.
    fn record(store: &Store, id: u64, state: &str, requeues: u32, steps: &[u32]) {
        store
            .conn
            .execute(
                "INSERT INTO jobs (id, name, uid, gid, user, groups, state, queue, request, submit_time,
                    cwd, stdout, stderr, script, env)
                 VALUES (?1, 'j', 1000, 100, 'ann', '[100]', ?2, 'batch', '{}', 1.0, '/', '/o', '/e', '', '[]')",
                params![id as i64, state],
            )
            .unwrap();
        for _ in 0..requeues {
            store.event(2.0, "requeue", Some(JobId(id)), None, "requeued").unwrap();
        }
        store.event(2.0, "start", Some(JobId(id)), None, "not a requeue").unwrap();
        for step in steps {
            store
                .conn
                .execute(
                    "INSERT INTO steps (job_id, step, uid, user, start_time, host, pid, cwd, argv, size, nodes,
                        interactive, claims)
                     VALUES (?1, ?2, 1000, 'ann', 3.0, 'h', 1, '/', '[]', 1, '[]', 0, '[]')",
                    params![id as i64, step],
                )
                .unwrap();
        }
    }

    /// The live jobs' counts in one go and one job's alone agree, row for row; an ended job
    /// is only in the second; a job with no row counts 0 (its next step 1).
    #[test]
    fn counts_of_all_live_jobs_and_of_one_agree() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        record(&store, 1, "running", 2, &[1, 2, 5]);
        record(&store, 2, "queued", 1, &[]);
        record(&store, 3, "suspended", 0, &[4]);
        record(&store, 4, "held", 0, &[]);
        record(&store, 5, "completed", 3, &[7]);
        let counts = store.job_counts().unwrap();
        let expected = [(1, (2, 5)), (2, (1, 0)), (3, (0, 4)), (4, (0, 0)), (5, (3, 7)), (6, (0, 0))];
        for (id, (requeues, last)) in expected {
            let id = JobId(id);
            assert_eq!(store.job_counts_of(id).unwrap(), (requeues, last), "job {id:?} alone");
            let live = id.0 <= 4;
            assert_eq!(
                (counts.requeues(id), counts.next_step(id)),
                if live { (requeues, last + 1) } else { (0, 1) },
                "job {id:?} among the live"
            );
        }
    }
}
