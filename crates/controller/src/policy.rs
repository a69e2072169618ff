//! Queue policy in the controller: fair-share usage, priority order, one backfill pass.
//!
//! The decisions are berth-core's (`sched::backfill::plan_with_advance_keeping`, `priority`,
//! `FairShare`); this module only gathers their inputs from the controller's state (advance
//! reservations and their members from `advance`), keeps what users are shown (priority,
//! expected start) and persists fair-share usage.

use crate::job::JobRecord;
use crate::state::Controller;
use crate::store::StoreError;
use berth_core::job::JobState;
use berth_core::sched::backfill::{self, Deadline, PassInput, PassLimits, QueuedJob, RunningJob};
use berth_core::sched::fairshare::FairShare;
use berth_core::sched::preempt;
use berth_core::sched::priority::{priority, Priority, PriorityInput};
use berth_core::JobId;
use std::collections::HashMap;

/// What the last pass decided and measured, for `berth jobs` and `berth share`.
#[derive(Debug, Default)]
pub struct PolicyState {
    pub fair_share: FairShare,
    /// Running jobs are charged up to this time.
    pub charged_until: f64,
    pub priorities: HashMap<JobId, Priority>,
    pub expected_start: HashMap<JobId, f64>,
    pub last_pass: PassStats,
    /// Advance reservations (see `advance`).
    pub advance: crate::advance::AdvanceBook,
    /// Reasons shown instead of the pass's for jobs of advance reservations (waiting for the
    /// window, or for a reservation they can no longer use).
    pub advance_reasons: HashMap<JobId, String>,
    /// Jobs waiting for their dependency or begin time (see `depend`).
    pub depend: crate::depend::DependState,
    /// The last conservative pass's plan, reused by the next where nothing changed.
    pub kept_plan: Option<backfill::KeptPlan<berth_core::sched::ClusterState>>,
}

#[derive(Debug, Default, Clone, Copy)]
pub struct PassStats {
    pub pending: usize,
    pub started: usize,
    pub backfilled: usize,
    pub micros: u64,
    /// Reservations kept from the pass before (conservative backfill).
    pub kept_reservations: usize,
}

/// The account a job's usage is charged to.
pub fn account_of(job: &JobRecord) -> String {
    job.options.account.clone().unwrap_or_else(|| default_account(job.user.gid))
}

/// A user's primary group name (its number when the group has no name here).
/// A user of this name exists (the passwd database, NSS included).
pub fn user_exists(name: &str) -> bool {
    let Ok(c) = std::ffi::CString::new(name) else { return false };
    let mut buf = vec![0u8; 16 * 1024];
    // SAFETY: getpwnam_r writes into `pwd` and `buf`, both ours and large enough or ERANGE.
    unsafe {
        let mut pwd: libc::passwd = std::mem::zeroed();
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        let rc = libc::getpwnam_r(c.as_ptr(), &mut pwd, buf.as_mut_ptr() as *mut libc::c_char, buf.len(), &mut found);
        rc == 0 && !found.is_null()
    }
}

/// A group of this name exists (the group database, NSS included).
pub fn group_exists(name: &str) -> bool {
    let Ok(c) = std::ffi::CString::new(name) else { return false };
    let mut buf = vec![0u8; 16 * 1024];
    // SAFETY: getgrnam_r writes into `grp` and `buf`, both ours and large enough or ERANGE.
    unsafe {
        let mut grp: libc::group = std::mem::zeroed();
        let mut found: *mut libc::group = std::ptr::null_mut();
        let rc = libc::getgrnam_r(c.as_ptr(), &mut grp, buf.as_mut_ptr() as *mut libc::c_char, buf.len(), &mut found);
        rc == 0 && !found.is_null()
    }
}

pub fn default_account(gid: u32) -> String {
    let mut buf = vec![0u8; 16 * 1024];
    // SAFETY: getgrgid_r writes into `grp` and `buf`, both ours and large enough or ERANGE.
    unsafe {
        let mut grp: libc::group = std::mem::zeroed();
        let mut found: *mut libc::group = std::ptr::null_mut();
        let rc = libc::getgrgid_r(gid, &mut grp, buf.as_mut_ptr() as *mut libc::c_char, buf.len(), &mut found);
        if rc == 0 && !found.is_null() && !grp.gr_name.is_null() {
            if let Ok(name) = std::ffi::CStr::from_ptr(grp.gr_name).to_str() {
                return name.to_string();
            }
        }
    }
    gid.to_string()
}

impl Controller {
    /// Charge running jobs' CPU time since the last charge to their accounts, decayed to `now`.
    pub fn charge_usage(&mut self, now: f64) -> Result<(), StoreError> {
        let since = self.policy.charged_until;
        if now <= since {
            return Ok(());
        }
        let mut charges: Vec<(String, f64)> = Vec::new();
        for job in self.jobs.values().filter(|j| j.state == JobState::Running) {
            let from = job.start_time.unwrap_or(now).max(since);
            let cpus: u64 = job.allocation.iter().map(|a| a.cpus.len() as u64).sum();
            if now > from && cpus > 0 {
                charges.push((account_of(job), cpus as f64 * (now - from)));
            }
        }
        self.policy.fair_share.decay_to(now);
        for (account, cpu_seconds) in &charges {
            self.policy.fair_share.charge(account, *cpu_seconds, now);
        }
        self.policy.charged_until = now;
        if !charges.is_empty() {
            self.store.save_fair_share(&self.policy.fair_share)?;
        }
        Ok(())
    }

    /// One scheduling pass: priority order, then the configured backfill; starts are persisted
    /// in the current transaction and launched after it commits.
    pub fn schedule(&mut self, now: f64) -> Result<(), StoreError> {
        self.check_advance(now)?;
        self.dirty = false;
        self.charge_usage(now)?;
        // Suspended jobs resume as soon as their cores (or others on their nodes) are free,
        // before anything new starts.
        self.resume_waiting(now)?;
        let began = std::time::Instant::now();
        let machine_cpus: u64 = self.cluster.nodes.iter().map(|n| n.topology.all_pus().len() as u64).sum();
        let unlimited = self.cfg.scheduler.unlimited_walltime_secs as f64;
        let mut queue: Vec<(Priority, f64, QueuedJob, (String, u32))> = Vec::new();
        self.policy.priorities.clear();
        // Jobs whose dependency or begin time does not let them start yet wait outside the pass.
        let not_yet = self.ineligible(now)?;
        for job in self.jobs.values().filter(|j| j.state.is_pending() && !not_yet.contains(&j.id)) {
            let pending = job.pending_in(&self.cfg.queues);
            let input = PriorityInput {
                submit_time: job.submit_time,
                cpus: pending.request.total_cpus(),
                queue_factor: self.queue_factor(&job.queue),
                fair_share_factor: self.policy.fair_share.factor(&account_of(job)),
            };
            let mut p = priority(&self.cfg.priority, &input, now, machine_cpus.max(1));
            if let Some(admin) = job.options.priority {
                // An admin's priority (`berth update --priority`) replaces the computed one.
                p.total = f64::from(admin);
            }
            self.policy.priorities.insert(job.id, p.clone());
            let walltime = job.walltime.map(|w| w as f64).unwrap_or(unlimited);
            queue.push((
                p,
                job.submit_time,
                QueuedJob { id: job.id, request: pending.request, walltime, held: pending.held },
                (job.queue.clone(), job.user.uid),
            ));
        }
        // Jobs asking for an advance reservation they cannot use wait, outside the pass.
        let (advance, shut_out) = self.advance_pass_input();
        queue.retain(|q| !shut_out.contains_key(&q.2.id));
        self.policy.advance_reasons.clear();
        if queue.is_empty() {
            self.pending_reasons.clear();
            self.policy.expected_start.clear();
            self.shut_out(shut_out);
            return Ok(());
        }
        // Highest priority first; equal priorities in submission order.
        queue.sort_by(|a, b| b.0.total.total_cmp(&a.0.total).then(a.1.total_cmp(&b.1)).then(a.2.id.cmp(&b.2.id)));
        // Per-user limits of queues: a job that would take its user over waits (counting the
        // jobs ahead of it as if they start, so one pass cannot overshoot).
        let mut held_by_limit = Vec::new();
        let mut user_cores: HashMap<(String, u32), u64> = HashMap::new();
        for j in self.jobs.values().filter(|j| j.state == JobState::Running) {
            let cores: u64 = j.allocation.iter().map(|a| a.cores as u64).sum();
            *user_cores.entry((j.queue.clone(), j.user.uid)).or_default() += cores;
        }
        let queue: Vec<QueuedJob> = queue
            .into_iter()
            .filter_map(|(_, _, q, key)| {
                // A queue dropped from the config keeps its jobs running, without limits.
                let Some(spec) = self.cfg.queues.iter().find(|s| s.name == key.0) else { return Some(q) };
                if spec.max_cores_per_user.is_none() || q.held {
                    return Some(q);
                }
                let used = user_cores.entry(key).or_default();
                let cores = q.request.total_cpus();
                match berth_core::sched::queue::user_limit_reason(spec, *used, cores) {
                    Some(reason) => {
                        held_by_limit.push((q.id, reason));
                        None
                    }
                    None => {
                        *used += cores;
                        Some(q)
                    }
                }
            })
            .collect();
        let resumes = self.resumes_after(unlimited);
        let running: Vec<RunningJob<_>> = self
            .jobs
            .values()
            .filter(|j| j.state == JobState::Running)
            .map(|j| {
                let end = j.expected_end(unlimited);
                RunningJob { id: j.id, alloc: j.allocation.clone(), end: resumes.get(&j.id).map_or(end, |&r| end + r) }
            })
            .collect();
        let view = self.sched_view();
        let budget_ms = self.cfg.scheduler.reservation_budget_ms;
        let deadline =
            (budget_ms > 0).then(|| Deadline { at: monotonic_micros() + budget_ms * 1000, clock: monotonic_micros });
        let limits = PassLimits {
            policy: self.cfg.scheduler.policy,
            max_reservations: self.cfg.scheduler.max_reservations,
            deadline,
        };
        let input = PassInput { machine: &view, running: &running, queue: &queue, now };
        let (out, _) = backfill::plan_with_advance_keeping(&input, &advance, &limits, &mut self.policy.kept_plan);
        self.pending_reasons.clear();
        self.policy.expected_start.clear();
        self.pending_reasons.extend(held_by_limit);
        self.shut_out(shut_out);
        for w in out.waiting {
            if let Some(t) = w.expected_start {
                self.policy.expected_start.insert(w.id, t);
            }
            if matches!(w.reason, berth_core::sched::PendingReason::Resources(_)) {
                if let Some(why) = self.jobs.get(&w.id).and_then(|j| self.advance_wait_reason(j, now)) {
                    self.policy.advance_reasons.insert(w.id, why);
                }
            }
            self.pending_reasons.insert(w.id, w.reason);
        }
        self.policy.last_pass = PassStats {
            pending: queue.len(),
            started: out.starts.len(),
            backfilled: out.backfilled,
            micros: began.elapsed().as_micros() as u64,
            kept_reservations: self.policy.kept_plan.as_ref().map_or(0, |k| k.reused()),
        };
        for (id, alloc) in out.starts {
            self.start(id, alloc, now)?;
        }
        if self.cfg.preempt.enabled {
            self.preempt(&queue, now)?;
        }
        Ok(())
    }

    /// Suspended jobs resume (before anything new starts, `resume_waiting`) as soon as the
    /// running jobs on their CPUs end, and then run what is left of their walltime: for expected
    /// starts, those running jobs' CPUs are busy that much longer (issue 17 item 11: a queued
    /// job's expected start ignored the coming resume). Per running job holding CPUs of jobs
    /// suspended by the scheduler, the longest such remainder (seconds). Admins' suspensions
    /// last until `berth resume`: they are not counted.
    fn resumes_after(&self, unlimited: f64) -> HashMap<JobId, f64> {
        let mut out: HashMap<JobId, f64> = HashMap::new();
        let suspended: Vec<&JobRecord> = self
            .jobs
            .values()
            .filter(|j| j.state == JobState::Suspended && !j.suspension.by_admin && j.kill_sent.is_none())
            .collect();
        if suspended.is_empty() {
            return out;
        }
        for s in suspended {
            // What it had left when it was suspended (its walltime does not count suspensions).
            let left = (s.expected_end(unlimited) - s.suspension.since.unwrap_or(0.0)).max(0.0);
            for r in self.jobs.values().filter(|j| j.state == JobState::Running) {
                let overlaps = r
                    .allocation
                    .iter()
                    .any(|a| s.allocation.iter().any(|b| a.node_id == b.node_id && a.cpus.intersects(&b.cpus)));
                if overlaps {
                    let e = out.entry(r.id).or_default();
                    *e = e.max(left);
                }
            }
        }
        out
    }

    /// Preemption by suspension: the highest-priority waiting jobs whose score is high enough
    /// (large parallel, or a high preemption class) suspend cheaper running jobs and start on
    /// their CPUs. Bounded: at most `PREEMPTORS_PER_PASS` jobs are tried per pass.
    fn preempt(&mut self, queue: &[QueuedJob], now: f64) -> Result<(), StoreError> {
        let cfg = self.cfg.preempt.clone();
        let mut tried = 0;
        for q in queue {
            if tried >= preempt::PREEMPTORS_PER_PASS {
                break;
            }
            let waits_for_resources =
                matches!(self.pending_reasons.get(&q.id), Some(berth_core::sched::PendingReason::Resources(_)));
            let Some(job) = self.jobs.get(&q.id) else { continue };
            // Members of advance reservations wait for their reservation's resources only.
            if q.held || !waits_for_resources || job.state != JobState::Queued || job.options.reservation.is_some() {
                continue;
            }
            let score = preempt::score(&q.request, self.preempt_class(&job.queue), &cfg);
            if score < cfg.min_score {
                continue;
            }
            tried += 1;
            let running: Vec<preempt::Preemptible> = self
                .jobs
                .values()
                .filter(|j| j.state == JobState::Running && !j.is_interactive() && !self.in_advance(j))
                .map(|j| preempt::Preemptible {
                    id: j.id,
                    alloc: j.allocation.clone(),
                    score: preempt::score(&j.pending().request, self.preempt_class(&j.queue), &cfg),
                    suspended_secs: j.suspension.seconds(now),
                    start: j.start_time.unwrap_or(now),
                })
                .collect();
            let candidate = preempt::Preemptor { request: &q.request, score, walltime: q.walltime };
            // Advance reservations it would run into are off limits, as in the pass.
            let (view, reserved) = self.advance_view(now, q.walltime);
            let Some(mut plan) = preempt::plan_preemption(&view, &running, &candidate, &cfg, now) else {
                continue;
            };
            let why = format!("preempted by job {}", q.id);
            let mut all_suspended = true;
            for victim in &plan.victims {
                if let Err(e) = self.suspend_job(*victim, now, crate::suspend::SuspendBy::Policy(why.clone()))? {
                    tracing::warn!(job = %victim, "cannot suspend for job {}: {e}", q.id);
                    all_suspended = false;
                }
            }
            // A victim that could not be frozen keeps its CPUs: the plan no longer holds. Beside
            // advance reservations, it starts where it fits with them claimed.
            let fits = all_suspended
                && match berth_core::sched::place(&self.advance_view(now, q.walltime).0, &q.request) {
                    berth_core::sched::Placement::Now(alloc) => {
                        if reserved {
                            plan.alloc = alloc;
                        }
                        true
                    }
                    _ => false,
                };
            if fits {
                let victims: Vec<String> = plan.victims.iter().map(|v| v.to_string()).collect();
                self.store.event(now, "preempt", Some(q.id), None, &format!("suspended jobs {}", victims.join(",")))?;
                self.pending_reasons.remove(&q.id);
                self.policy.expected_start.remove(&q.id);
                self.start(q.id, plan.alloc, now)?;
            }
        }
        Ok(())
    }

    /// Jobs asking for an advance reservation they cannot use: waiting, with the reason.
    fn shut_out(&mut self, shut_out: HashMap<JobId, String>) {
        for (id, why) in shut_out {
            self.pending_reasons.insert(id, berth_core::sched::PendingReason::NoSuitableNodes(why.clone()));
            self.policy.advance_reasons.insert(id, why);
        }
    }

    /// The preemption class of a queue (0 when unknown).
    pub fn preempt_class(&self, queue: &str) -> u32 {
        self.cfg.queues.iter().find(|q| q.name == queue).map(|q| q.preempt_class).unwrap_or(0)
    }

    /// The queue's priority factor in [0, 1] among the configured queues (0 when unknown,
    /// e.g. a queue removed from the config while it still held jobs).
    pub fn queue_factor(&self, queue: &str) -> f64 {
        match self.cfg.queues.iter().find(|q| q.name == queue) {
            Some(spec) => berth_core::sched::queue::queue_factor(spec, &self.cfg.queues),
            None => 0.0,
        }
    }

    /// `berth queues`: each queue's limits and what it holds now.
    pub fn queue_infos(&self) -> Vec<berth_protocol::client::QueueInfo> {
        self.cfg
            .queues
            .iter()
            .map(|spec| {
                let jobs = || self.jobs.values().filter(|j| j.queue == spec.name);
                let count = |s: JobState| jobs().filter(|j| j.state == s).count();
                berth_protocol::client::QueueInfo {
                    spec: spec.clone(),
                    priority_factor: self.queue_factor(&spec.name),
                    queued: count(JobState::Queued),
                    held: count(JobState::Held),
                    running: count(JobState::Running),
                    running_cores: jobs()
                        .filter(|j| j.state == JobState::Running)
                        .map(|j| j.allocation.iter().map(|a| a.cores as u64).sum::<u64>())
                        .sum(),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;

/// Microseconds on a monotonic clock (since its first reading): the pass's time budget.
fn monotonic_micros() -> u64 {
    static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    ORIGIN.get_or_init(std::time::Instant::now).elapsed().as_micros() as u64
}
