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
