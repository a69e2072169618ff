//! Array tails: how many tasks of a run of identical pending array tasks a round needs.
//!
//! A run is pending tasks of one array, consecutive among a pass's pending jobs (in id order)
//! and identical in everything the round sees of them (request, walltime, hold, queue, user
//! and account, submission time, admin priority). Such tasks have the same priority, so the
//! round's order (priority, submission, id) keeps them together, in id order; it decides for
//! each on the state the ones before it left:
//! - once one of them waits, every later one waits too (a wait only adds claims: EASY's head
//!   reservation, a conservative one), so those that start are the run's first ones, at most
//!   `machine CPUs / CPUs each` of them;
//! - a conservative pass reserves for at most `max_reservations` waiting jobs, then tries each
//!   later job now beside every reservation (a job that cannot be planned at all, held or
//!   never fitting, takes none: such runs are left whole under conservative backfill, so that
//!   its kept plan sees every one of them);
//! - a job past that limit, or one waiting behind EASY's head, claims nothing: the next
//!   identical one is decided on the same state, the same way.
//!
//! So after its first `machine CPUs / CPUs each + 2 + max_reservations` tasks
//! ([`tasks_needed`]), the rest of a run would each be decided as the last of those was (a
//! wait, with its reason, priority and expected start) and change nothing for any other job:
//! a caller may leave them out of the round and show them as that task. A pass then costs the
//! same whatever the length of an array's queue. The rule does not hold for tasks of an
//! advance reservation, in a queue with a per-user core limit (every task ahead counts toward
//! it), with preemption on (each waiting job may preempt), or for requests a CPU count does
//! not bound (threads, system CPUs, a binding): all of such a run goes to the round.
//!
//! Who finds the runs (which tasks are identical) is the caller's: the controller's gathering
//! of a pass (`policy/gather.rs`), whose tests compare every pass with one over whole arrays.

use super::backfill::{BackfillPolicy, Fit, Machine};
use super::ClusterState;
use crate::placement::JobRequest;

/// A run's first task, as the rule sees it (every task of the run is the same).
#[derive(Debug, Clone, Copy)]
pub struct RunTask<'a> {
    pub request: &'a JobRequest,
    /// Held: a conservative pass cannot plan it.
    pub held: bool,
    /// It asks for an advance reservation.
    pub in_advance: bool,
    /// Its queue limits the cores one user runs at once.
    pub user_limited: bool,
}

/// What of the pass the rule reads.
#[derive(Debug, Clone, Copy)]
pub struct TailPass<'a> {
    /// The machine the round places on (nodes up, running jobs claimed).
    pub machine: &'a ClusterState,
    /// Every CPU of the cluster: a bound on how many tasks can start at once.
    pub machine_cpus: u64,
    pub policy: BackfillPolicy,
    pub max_reservations: usize,
    /// Preemption is on: any waiting job may preempt.
    pub preempting: bool,
}

/// How many tasks of a run whose first task is `task` the round needs, in id order: the rest
/// would each be decided as the last of them was (see the module's doc). None: every task.
pub fn tasks_needed(task: RunTask, pass: TailPass) -> Option<usize> {
    let req = task.request;
    let cpus = req.total_cpus();
    let bounded = !req.threads && !req.system_cpus && req.binding.is_none() && cpus > 0;
    let conservative = pass.policy == BackfillPolicy::Conservative;
    // A conservative pass plans every job it can: one that cannot be planned (held, or never
    // fitting) takes no reservation, so the run stays whole.
    let unplanned = || task.held || matches!(Machine::place(pass.machine, req), Fit::Never(_));
    // The run goes whole where the rule does not hold.
    let whole = !bounded || task.user_limited || pass.preempting || task.in_advance || (conservative && unplanned());
    (!whole).then(|| (pass.machine_cpus / cpus) as usize + 2 + pass.max_reservations)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::binding::BindingStrategy;
    use crate::sched::testkit::{total, ClusterBuilder, G};

    fn easy(machine: &ClusterState) -> TailPass<'_> {
        TailPass { machine, machine_cpus: 16, policy: BackfillPolicy::Easy, max_reservations: 3, preempting: false }
    }

    fn task(request: &JobRequest) -> RunTask<'_> {
        RunTask { request, held: false, in_advance: false, user_limited: false }
    }

    #[test]
    fn a_bounded_run_keeps_what_can_start_plus_two_plus_the_reservations() {
        let machine = ClusterBuilder::new().nodes(2, 2, 4, 8 * G).build();
        let one = JobRequest::simple(total(1), 0);
        assert_eq!(tasks_needed(task(&one), easy(&machine)), Some(16 + 2 + 3));
        let three = JobRequest::simple(total(3), 0);
        assert_eq!(tasks_needed(task(&three), easy(&machine)), Some(5 + 2 + 3));
        // Larger than the machine: none can start, the reservations and two more remain.
        let big = JobRequest::simple(total(40), 0);
        assert_eq!(tasks_needed(task(&big), easy(&machine)), Some(2 + 3));
        let fcfs = TailPass { policy: BackfillPolicy::Fcfs, max_reservations: 0, ..easy(&machine) };
        assert_eq!(tasks_needed(task(&one), fcfs), Some(18));
    }

    #[test]
    fn requests_a_cpu_count_does_not_bound_go_whole() {
        let machine = ClusterBuilder::new().nodes(2, 2, 4, 8 * G).build();
        let threads = JobRequest { threads: true, ..JobRequest::simple(total(1), 0) };
        let system = JobRequest { system_cpus: true, ..JobRequest::simple(total(1), 0) };
        let bound = JobRequest {
            binding: Some(BindingStrategy::Linear { amount: 1, start: None }),
            ..JobRequest::simple(total(1), 0)
        };
        let nothing = JobRequest::simple(total(0), 0);
        for req in [&threads, &system, &bound, &nothing] {
            assert_eq!(tasks_needed(task(req), easy(&machine)), None, "{req:?}");
        }
    }

    #[test]
    fn limits_preemption_and_advance_reservations_keep_every_task() {
        let machine = ClusterBuilder::new().nodes(2, 2, 4, 8 * G).build();
        let one = JobRequest::simple(total(1), 0);
        assert_eq!(tasks_needed(RunTask { user_limited: true, ..task(&one) }, easy(&machine)), None);
        assert_eq!(tasks_needed(RunTask { in_advance: true, ..task(&one) }, easy(&machine)), None);
        assert_eq!(tasks_needed(task(&one), TailPass { preempting: true, ..easy(&machine) }), None);
    }

    #[test]
    fn conservative_keeps_runs_it_cannot_plan_whole() {
        let machine = ClusterBuilder::new().nodes(2, 2, 4, 8 * G).build();
        let conservative = TailPass { policy: BackfillPolicy::Conservative, ..easy(&machine) };
        let one = JobRequest::simple(total(1), 0);
        assert_eq!(tasks_needed(task(&one), conservative), Some(21));
        assert_eq!(tasks_needed(RunTask { held: true, ..task(&one) }, conservative), None);
        // More cores than the machine has: never fits.
        let big = JobRequest::simple(total(40), 0);
        assert_eq!(tasks_needed(task(&big), conservative), None);
        // Busy is not never: 16 cores fit the empty machine.
        let whole = JobRequest::simple(total(16), 0);
        assert_eq!(tasks_needed(task(&whole), conservative), Some(1 + 2 + 3));
        // Under EASY a held run is cut like any other (a held job claims nothing).
        assert_eq!(tasks_needed(RunTask { held: true, ..task(&one) }, easy(&machine)), Some(21));
    }
}
