//! What dependencies need of jobs that are no longer in memory: their state, and whether they
//! ever started (`crate::depend`).

use super::{Store, StoreError};
use berth_core::job::JobState;
use berth_core::JobId;
use rusqlite::OptionalExtension;

impl Store {
    /// A job's state and whether it ever started; None if no job has this id.
    pub fn job_state(&self, id: JobId) -> Result<Option<(JobState, bool)>, StoreError> {
        let mut st =
            self.conn.prepare_cached("SELECT state, start_time FROM jobs WHERE id = ?1").map_err(|e| self.err(e))?;
        let row = st
            .query_row([id.0 as i64], |r| Ok((r.get::<_, String>(0)?, r.get::<_, Option<f64>>(1)?)))
            .optional()
            .map_err(|e| self.err(e))?;
        Ok(row.and_then(|(state, start)| Some((JobState::parse(&state)?, start.is_some()))))
    }
}

/// Requeued jobs waiting for their previous run to end (`crate::model::job::OldRun`): one row
/// each while the wait lasts, so a restarted controller keeps the job off its old nodes until
/// they reported the end. Node ids are the `nodes` table's, stable across restarts. A table of
/// its own, created if missing, so older databases open unchanged.
impl Store {
    pub fn init_old_runs(&self) -> Result<(), StoreError> {
        self.conn
            .execute_batch(
                "CREATE TABLE IF NOT EXISTS old_runs (
                    job_id INTEGER PRIMARY KEY, nodes TEXT NOT NULL, since REAL NOT NULL);",
            )
            .map_err(|e| self.err(e))
    }

    /// Record (or replace) the wait of job `id` for its previous run on `nodes`.
    pub fn save_old_run(&self, id: JobId, nodes: &[usize], since: f64) -> Result<(), StoreError> {
        let mut st = self
            .conn
            .prepare_cached("INSERT OR REPLACE INTO old_runs (job_id, nodes, since) VALUES (?1, ?2, ?3)")
            .map_err(|e| self.err(e))?;
        st.execute(rusqlite::params![id.0 as i64, super::json(&nodes), since]).map_err(|e| self.err(e))?;
        Ok(())
    }

    pub fn forget_old_run(&self, id: JobId) -> Result<(), StoreError> {
        let mut st = self.conn.prepare_cached("DELETE FROM old_runs WHERE job_id = ?1").map_err(|e| self.err(e))?;
        st.execute([id.0 as i64]).map_err(|e| self.err(e))?;
        Ok(())
    }

    /// Every recorded wait; a row whose node list cannot be read is dropped with a warning
    /// (the job then waits for nothing, as after `OLD_RUN_PATIENCE_SECS`).
    pub fn load_old_runs(&self) -> Result<Vec<(JobId, Vec<usize>, f64)>, StoreError> {
        let mut st = self.conn.prepare("SELECT job_id, nodes, since FROM old_runs").map_err(|e| self.err(e))?;
        let rows = st
            .query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?, r.get::<_, f64>(2)?)))
            .map_err(|e| self.err(e))?;
        let mut out = Vec::new();
        for row in rows {
            let (id, nodes, since) = row.map_err(|e| self.err(e))?;
            match serde_json::from_str::<Vec<usize>>(&nodes) {
                Ok(nodes) => out.push((JobId(id as u64), nodes, since)),
                Err(e) => tracing::warn!(job = id, "unreadable wait for a requeued job's previous run ({e}); dropped"),
            }
        }
        Ok(out)
    }
}
