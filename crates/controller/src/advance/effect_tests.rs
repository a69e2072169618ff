//! Advance reservations decided without a store: created, deleted and ended over a book of
//! plain values; the tests read the book and the effects returned (no SQLite, no controller).

use super::*;
use crate::testkit::{ann, running_job};

fn resv(name: &str, start: f64, end: f64) -> Advance {
    Advance {
        name: name.into(),
        start,
        end,
        users: vec!["ann".into()],
        accounts: vec![],
        allocation: running_job(0, &ann(), &[(0, "0-3")]).allocation,
        created: 900.0,
        created_by: "root".into(),
    }
}

fn event(kind: &str, detail: String) -> Effect {
    Effect::Event { kind: kind.into(), job: None, node: None, detail }
}

#[test]
fn a_created_reservation_is_kept_written_logged_then_scheduled() {
    let mut book = AdvanceBook::default();
    let r = resv("maint", 2000.0, 5600.0);
    let effects = created(&mut book, r.clone(), "root", 1000.0);
    assert_eq!(book.get("maint"), Some(&r));
    let detail =
        format!("maint: {} to {} on n0:0-3 for users ann (by root)", clock(2000.0, 1000.0), clock(5600.0, 1000.0));
    assert_eq!(effects, vec![Effect::SaveAdvance(Box::new(r)), event("advance_create", detail), Effect::Reschedule]);
}

#[test]
fn a_deleted_reservation_is_forgotten_removed_logged_with_its_jobs_then_scheduled() {
    let mut book = AdvanceBook::default();
    book.keep(resv("maint", 2000.0, 5600.0));
    book.keep(resv("other", 2000.0, 5600.0));
    let info = AdvanceInfo {
        name: "maint".into(),
        start: 2000.0,
        end: 5600.0,
        users: vec!["ann".into()],
        accounts: vec![],
        allocation: vec![],
        cores: 4,
        gpus: 0,
        gres: Default::default(),
        licenses: Default::default(),
        created: 900.0,
        created_by: "root".into(),
        active: false,
        running_jobs: vec![JobId(3)],
        queued_jobs: vec![JobId(4), JobId(5)],
    };
    let effects = deleted(&mut book, &info, "root");
    assert_eq!(book.values().map(|r| r.name.as_str()).collect::<Vec<_>>(), vec!["other"]);
    let detail = "maint: deleted by root; running jobs [3] keep running, queued jobs [4,5] will not start";
    assert_eq!(
        effects,
        vec![
            Effect::DeleteAdvance { name: "maint".into() },
            event("advance_delete", detail.into()),
            Effect::Reschedule
        ]
    );
}

#[test]
fn windows_opening_reschedule_and_windows_over_end_with_their_queued_jobs_named() {
    let mut book = AdvanceBook::default();
    book.checked_to(1000.0);
    book.keep(resv("early", 500.0, 1500.0));
    book.keep(resv("opens", 1200.0, 9000.0));
    book.keep(resv("later", 5000.0, 9000.0));
    let mut jobs = BTreeMap::new();
    for (id, state) in [(1, JobState::Queued), (2, JobState::Running), (3, JobState::Held)] {
        let mut j = running_job(id, &ann(), &[(0, "0")]);
        j.state = state;
        j.options.reservation = Some("early".into());
        jobs.insert(j.id, j);
    }
    // Nothing opened or ended since: nothing to do.
    assert!(windows_checked(&mut book, &jobs, 1100.0).is_empty());
    assert_eq!(book.checked_until(), 1100.0);
    // "opens" opened: a pass. "early" is over at 1500: removed, its queued jobs named.
    let effects = windows_checked(&mut book, &jobs, 1500.0);
    let detail = format!(
        "early: window {} to {} is over; queued jobs [1,3] will not start",
        clock(500.0, 1500.0),
        clock(1500.0, 1500.0)
    );
    assert_eq!(
        effects,
        vec![
            Effect::Reschedule,
            Effect::DeleteAdvance { name: "early".into() },
            event("advance_end", detail),
            Effect::Reschedule,
        ]
    );
    assert_eq!(book.values().map(|r| r.name.as_str()).collect::<Vec<_>>(), vec!["later", "opens"]);
    assert!(windows_checked(&mut book, &jobs, 1600.0).is_empty(), "each window is acted on once");
}
