//! History: what the controller reads of jobs that are no longer in memory. A live job
//! (queued, held, running, suspended) is decided about from memory alone (`Controller::jobs`,
//! `Controller::counts`, `Controller::steps`); the store is read only for a job that left
//! memory, that is one that ended (or an id that was never given), through these two named
//! lookups: to answer about an old job (`berth show`, "job N has already ended (completed)"),
//! and where a decision needs a finished job's outcome (a dependency on a job that ended
//! long ago, an array whose tasks all ended, an ended job requeued). Nothing loads all of
//! history into memory: each lookup reads one row (by its primary key).

use crate::model::job::JobRecord;
use crate::state::Controller;
use crate::store::StoreError;
use berth_core::job::JobState;
use berth_core::JobId;

impl Controller {
    /// Job `id` as the store recorded it, when it is not in memory: an ended job (None: no
    /// job ever had this id). Never asked of a live job: its record is in `self.jobs`.
    pub(crate) fn ended_job(&self, id: JobId) -> Result<Option<JobRecord>, StoreError> {
        debug_assert!(!self.jobs.contains_key(&id), "job {id} is live: read it from memory");
        self.store.get_job(id)
    }

    /// How job `id`, not in memory, ended, and whether it ever started (None: no job ever had
    /// this id): a dependency's view of a finished job (`crate::depend`, `crate::array`).
    pub(crate) fn ended_state(&self, id: JobId) -> Result<Option<(JobState, bool)>, StoreError> {
        debug_assert!(!self.jobs.contains_key(&id), "job {id} is live: read it from memory");
        self.store.job_state(id)
    }
}
