//! Allocations (`berth alloc`, Slurm's `salloc`; docs/protocol/01-client.md, "Allocations").
//!
//! An allocation is a job with no batch script (`SubmitOptions::alloc`): validated, stored
//! and queued as a batch job is, so priority, backfill, queue limits and fair share apply to
//! it. Once placed, its nodes only hold its cgroup for the steps `berth run` starts in it (as
//! for an interactive allocation: `JobRecord::is_interactive`), and the controller ends it
//! (`end_interactive`):
//! - when its holder releases it (`AllocEnd`: the command `berth alloc` ran exited);
//! - when the holder's connection closes (the client was killed, or lost the controller);
//! - by `berth cancel`, or at its walltime (`check_interactive`).
//!
//! A `--no-shell` allocation is held by its connection only while it waits (closing it then
//! cancels the request); once granted it is kept until its walltime or `berth cancel`.
//! Holders are known in memory only: after a controller restart every held allocation
//! (pending or running) and every waiting `--no-shell` one has lost its client, and ends.

use crate::model::effect::Effect;
use crate::model::request::{error, Peer};
use crate::state::Controller;
use crate::store::StoreError;
use berth_core::directives::AllocKind;
use berth_core::job::JobState;
use berth_core::JobId;
use berth_protocol::client::{AllocRequest, ClientResponse, ErrorCode, IdResult};

/// Why an allocation ended when its holder's connection closed.
pub const ALLOC_DISCONNECTED: &str = "berth alloc disconnected";

/// Why an allocation ended when its holder was gone after a controller restart.
pub const ALLOC_CLIENT_GONE: &str = "its berth alloc client is gone (controller restarted)";

impl Controller {
    /// `Alloc`: validate as a batch submission, store (durable before the id is returned: the
    /// reply waits for the commit), and remember the holding connection.
    pub(crate) fn alloc_request(
        &mut self,
        req: AllocRequest,
        peer: &Peer,
        now: f64,
    ) -> Result<ClientResponse, StoreError> {
        if !req.submit.script.is_empty() {
            return Ok(error(ErrorCode::BadRequest, "an allocation has no batch script: send its options only"));
        }
        // Validated as a batch job whose script only names its shell: the options are all.
        let mut submit = req.submit;
        submit.script = "#!/bin/sh\n".into();
        let mut job = match self.validate_submission(submit, peer, now) {
            Ok(job) => job,
            Err(e) => return Ok(ClientResponse::Error(e)),
        };
        if job.options.array.is_some() {
            return Ok(error(
                ErrorCode::BadRequest,
                "an allocation cannot be a job array (--array); submit a batch array with `berth submit --array`",
            ));
        }
        job.script = std::sync::Arc::from("");
        job.options.alloc = Some(if req.no_shell { AllocKind::NoShell } else { AllocKind::Held });
        // Its command runs where `berth alloc` runs, with the user's terminal.
        job.stdout = "/dev/null".into();
        job.stderr = "/dev/null".into();
        let id = self.accept(job);
        self.alloc_holders.hold(id, peer.conn);
        Ok(ClientResponse::Submitted { id })
    }

    /// `AllocEnd`: the holder's command exited; the allocation ends with its exit code (a
    /// request still waiting is cancelled). Ending one that has ended already is no error.
    pub(crate) fn alloc_end(
        &mut self,
        id: JobId,
        exit_code: i32,
        peer: &Peer,
        now: f64,
    ) -> Result<ClientResponse, StoreError> {
        let done = ClientResponse::Done { results: vec![IdResult { id, ok: true, error: None }] };
        let Some(job) = self.jobs.get(&id) else {
            return Ok(match self.ended_job(id)? {
                Some(j) if j.options.alloc.is_some() && (j.user.uid == peer.user.uid || self.is_admin(peer)) => done,
                Some(_) => error(ErrorCode::InvalidState, format!("job {id} is not an active allocation of yours")),
                None => error(ErrorCode::UnknownJob, format!("job {id} does not exist; `berth jobs --all` lists jobs")),
            });
        };
        if job.options.alloc.is_none() {
            return Ok(error(
                ErrorCode::InvalidState,
                format!("job {id} is not an allocation (`berth alloc`); end it with `berth cancel {id}`"),
            ));
        }
        let job_state = job.state;
        if let Some(refused) = self.not_the_owner(peer, "release", id, now)? {
            return Ok(refused);
        }
        self.alloc_holders.release(id);
        let Some((event, ends)) = released(id, job_state, exit_code) else { return Ok(done) };
        self.queue([event]);
        match ends {
            // Still waiting: cancelled.
            None => {
                if let Err(e) = self.cancel_one(id, now)? {
                    return Ok(ClientResponse::Error(e));
                }
            }
            Some(state) => self.end_interactive(id, state, Some(exit_code), None, now)?,
        }
        Ok(done)
    }

    /// `AllocHold`: the holder of allocation `id` lost its connection (a controller restart)
    /// and holds it again over this one.
    pub(crate) fn alloc_hold(&mut self, id: JobId, peer: &Peer) -> Result<ClientResponse, StoreError> {
        let Some(job) = self.jobs.get(&id) else {
            return Ok(match self.ended_job(id)? {
                Some(_) => error(ErrorCode::InvalidState, format!("job {id} has ended; it cannot be held again")),
                None => error(ErrorCode::UnknownJob, format!("job {id} does not exist; `berth jobs --all` lists jobs")),
            });
        };
        let holdable = job.options.alloc == Some(AllocKind::Held)
            || (job.options.alloc == Some(AllocKind::NoShell) && job.state.is_pending());
        if !holdable || !(job.state.is_pending() || job.state == JobState::Running) {
            return Ok(error(
                ErrorCode::InvalidState,
                format!("job {id} is not an allocation waiting for or held by a `berth alloc`"),
            ));
        }
        if let Some(refused) = self.not_the_owner(peer, "hold", id, self.clock.unix())? {
            return Ok(refused);
        }
        match self.alloc_holders.holder(id) {
            Some(conn) if conn != peer.conn => Ok(error(
                ErrorCode::InvalidState,
                format!("job {id} is held by another `berth alloc`; it ends when that one exits"),
            )),
            _ => {
                self.alloc_holders.hold(id, peer.conn);
                Ok(ClientResponse::Done { results: vec![IdResult { id, ok: true, error: None }] })
            }
        }
    }

    /// The refusal (logged as denied) when `peer` may not `action` allocation `id` (a job in
    /// memory): it is neither the owner's nor the peer an admin.
    fn not_the_owner(
        &mut self,
        peer: &Peer,
        action: &str,
        id: JobId,
        now: f64,
    ) -> Result<Option<ClientResponse>, StoreError> {
        let Some(job) = self.jobs.get(&id) else { return Ok(None) };
        if job.user.uid == peer.user.uid || self.is_admin(peer) {
            return Ok(None);
        }
        let owner = job.user.name.clone();
        self.denied(peer, action, Some(id), &owner, now)?;
        Ok(Some(error(
            ErrorCode::NotPermitted,
            format!("job {id} belongs to {owner}; you may only {action} your own allocations"),
        )))
    }

    /// A client connection closed: the allocations it held end (a waiting request is
    /// cancelled; a granted `--no-shell` allocation stays).
    pub(crate) fn allocs_gone(&mut self, conn: u64, now: f64) -> Result<(), StoreError> {
        for id in self.alloc_holders.held_by(conn) {
            self.alloc_holders.release(id);
            self.end_orphan(id, ALLOC_DISCONNECTED, now)?;
        }
        Ok(())
    }

    /// Allocations whose holder is not connected (after a controller restart) end, once their
    /// holders had `ALLOC_RECLAIM_SECS` to come back (`alloc_hold`); holders of jobs that have
    /// ended are forgotten. Run on every tick (`check_interactive`).
    pub(crate) fn check_allocs(&mut self, now: f64) -> Result<(), StoreError> {
        let jobs = &self.jobs;
        self.alloc_holders
            .keep_only(|id| jobs.get(&id).is_some_and(|j| j.state.is_pending() || j.state.has_allocation()));
        if self.alloc_holders.reclaiming(now) {
            return Ok(());
        }
        let orphans: Vec<JobId> = self
            .jobs
            .values()
            .filter(|j| j.options.alloc.is_some() && self.alloc_holders.holder(j.id).is_none())
            .filter(|j| {
                j.state.is_pending() || (j.options.alloc == Some(AllocKind::Held) && j.state == JobState::Running)
            })
            .map(|j| j.id)
            .collect();
        for id in orphans {
            self.end_orphan(id, ALLOC_CLIENT_GONE, now)?;
        }
        Ok(())
    }

    /// End allocation `id`, whose client is gone: cancelled if it waits, failed if it runs and
    /// was held (a granted `--no-shell` allocation is kept).
    fn end_orphan(&mut self, id: JobId, why: &str, now: f64) -> Result<(), StoreError> {
        let Some(job) = self.jobs.get(&id) else { return Ok(()) };
        if job.state.is_pending() {
            tracing::info!(job = %id, "allocation request cancelled: {why}");
            self.queue([Effect::job_event("alloc", id, None, format!("cancelled while waiting: {why}"))]);
            // Cancelling a pending job of the controller's own choosing cannot be refused.
            let _ = self.cancel_one(id, now)?;
        } else if job.state == JobState::Running && job.options.alloc == Some(AllocKind::Held) {
            tracing::info!(job = %id, "allocation ended: {why}");
            self.end_interactive(id, JobState::Failed, None, Some(why), now)?;
        }
        Ok(())
    }
}

/// Allocation `id`, in `state`, released by its holder, whose command exited `exit_code`: the
/// event `alloc` saying so, and what follows: cancelled while it waits (`None`), ended in the
/// state returned when it runs (completed on 0, failed else). Nothing for one that has ended
/// already. Needs no store.
pub(crate) fn released(id: JobId, state: JobState, exit_code: i32) -> Option<(Effect, Option<JobState>)> {
    if state.is_pending() {
        return Some((Effect::job_event("alloc", id, None, "released before it was granted"), None));
    }
    if state != JobState::Running {
        return None;
    }
    let ends = if exit_code == 0 { JobState::Completed } else { JobState::Failed };
    Some((Effect::job_event("alloc", id, None, format!("released: its command exited {exit_code}")), Some(ends)))
}

#[cfg(test)]
mod effect_tests;
#[cfg(test)]
mod tests;
