//! Suspensions per job: the seconds of those that ended, the current one's start, whether an
//! admin made it, how many there were. A table of its own (created if missing), so databases
//! written before suspension existed open unchanged; jobs are read joined with it.

use super::{Store, StoreError};
use crate::model::suspension::Suspension;
use berth_core::JobId;
use rusqlite::params;

impl Store {
    pub fn save_suspension(&self, job: JobId, s: &Suspension) -> Result<(), StoreError> {
        let mut st = self
            .conn
            .prepare_cached(
                "INSERT INTO suspensions (job_id, total_secs, since, by_admin, count) VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT(job_id) DO UPDATE SET total_secs=?2, since=?3, by_admin=?4, count=?5",
            )
            .map_err(|e| self.err(e))?;
        st.execute(params![job.0 as i64, s.total_secs, s.since, s.by_admin, s.count]).map_err(|e| self.err(e))?;
        Ok(())
    }
}

/// The suspension columns of a job row (LEFT JOIN: all NULL for a job never suspended).
pub(super) fn from_columns(
    total_secs: Option<f64>,
    since: Option<f64>,
    by_admin: Option<bool>,
    count: Option<u32>,
) -> Suspension {
    Suspension {
        total_secs: total_secs.unwrap_or(0.0),
        since,
        by_admin: by_admin.unwrap_or(false),
        count: count.unwrap_or(0),
        ..Default::default()
    }
}
