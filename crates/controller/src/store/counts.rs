//! What a job entering memory carries over from its earlier runs (`crate::model::counts`):
//! its `requeue` events and its highest step id, read once when it enters memory, never to
//! decide about a job already there.

use super::{Store, StoreError};
use crate::model::counts::JobCounts;
use berth_core::JobId;
use rusqlite::params;

impl Store {
    /// The counts of every job the controller keeps in memory (queued, held, running,
    /// suspended; `Store::load_active_jobs`): at load and reload. Two grouped queries, not
    /// one per job (an array's tasks are many).
    pub fn job_counts(&self) -> Result<JobCounts, StoreError> {
        const LIVE: &str = "SELECT id FROM jobs WHERE state IN ('queued','held','running','suspended')";
        let mut counts = JobCounts::default();
        let mut requeues: Vec<(JobId, u32)> = Vec::new();
        {
            let mut st = self
                .conn
                .prepare(&format!(
                    "SELECT job_id, COUNT(*) FROM events WHERE kind = 'requeue' AND job_id IN ({LIVE}) GROUP BY job_id"
                ))
                .map_err(|e| self.err(e))?;
            let rows = st
                .query_map([], |r| {
                    Ok((JobId(r.get::<_, i64>(0)? as u64), r.get::<_, i64>(1)?.clamp(0, u32::MAX as i64) as u32))
                })
                .map_err(|e| self.err(e))?;
            for row in rows {
                requeues.push(row.map_err(|e| self.err(e))?);
            }
        }
        let mut last_steps: std::collections::HashMap<JobId, u32> = std::collections::HashMap::new();
        {
            let mut st = self
                .conn
                .prepare(&format!("SELECT job_id, MAX(step) FROM steps WHERE job_id IN ({LIVE}) GROUP BY job_id"))
                .map_err(|e| self.err(e))?;
            let rows = st
                .query_map([], |r| {
                    Ok((JobId(r.get::<_, i64>(0)? as u64), r.get::<_, i64>(1)?.clamp(0, u32::MAX as i64) as u32))
                })
                .map_err(|e| self.err(e))?;
            for row in rows {
                let (id, last) = row.map_err(|e| self.err(e))?;
                last_steps.insert(id, last);
            }
        }
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
        let requeues: i64 = self
            .conn
            .prepare_cached("SELECT COUNT(*) FROM events WHERE job_id = ?1 AND kind = 'requeue'")
            .and_then(|mut st| st.query_row(params![id.0 as i64], |r| r.get(0)))
            .map_err(|e| self.err(e))?;
        let last: Option<i64> = self
            .conn
            .prepare_cached("SELECT MAX(step) FROM steps WHERE job_id = ?1")
            .and_then(|mut st| st.query_row(params![id.0 as i64], |r| r.get(0)))
            .map_err(|e| self.err(e))?;
        Ok((requeues.clamp(0, u32::MAX as i64) as u32, last.unwrap_or(0).clamp(0, u32::MAX as i64) as u32))
    }
}
