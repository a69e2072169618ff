//! An allocation released by its holder, decided without a store.

use super::*;

#[test]
fn a_released_allocation_is_logged_then_cancelled_or_ended_by_its_exit_code() {
    let event = |detail: &str| Effect::job_event("alloc", JobId(5), None, detail);
    assert_eq!(released(JobId(5), JobState::Queued, 0), Some((event("released before it was granted"), None)));
    assert_eq!(released(JobId(5), JobState::Held, 3), Some((event("released before it was granted"), None)));
    assert_eq!(
        released(JobId(5), JobState::Running, 0),
        Some((event("released: its command exited 0"), Some(JobState::Completed)))
    );
    assert_eq!(
        released(JobId(5), JobState::Running, 2),
        Some((event("released: its command exited 2"), Some(JobState::Failed)))
    );
    // Ended already (or suspended): nothing to log, nothing to do.
    assert_eq!(released(JobId(5), JobState::Completed, 0), None);
    assert_eq!(released(JobId(5), JobState::Suspended, 0), None);
}
