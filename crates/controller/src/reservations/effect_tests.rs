//! The reservations API decided without a store: kept, confirmed, released, and what is due
//! for release, over plain values; the tests read the book and the effects returned (no
//! SQLite, no controller, no /proc: a process's life is given).

use super::*;
use crate::testkit::{ann, running_job};

fn resv(id: u64, job: u64, holder: Option<Holder>) -> Reservation {
    Reservation {
        id,
        job: JobId(job),
        uid: 1000,
        user: "ann".into(),
        state: if holder.is_some() { ReservationState::Confirmed } else { ReservationState::Unconfirmed },
        created: 1000.0,
        confirm_by: 1060.0,
        ends: 4600.0,
        walltime: 3600,
        holder,
        holder_since: Some(77),
        renew_by: Some(1300.0),
        explicit: false,
        released_at: None,
        release_reason: None,
    }
}

#[test]
fn a_reservation_kept_confirmed_then_released_is_written_and_logged_in_order() {
    let mut book = Reservations::default();
    let mut r = resv(1, 20, None);
    assert_eq!(kept(&mut book, r.clone()), vec![Effect::SaveReservation(Box::new(r.clone()))]);
    assert_eq!(book.get(1), Some(&r));

    let effects = confirmed(&mut book, &mut r, Holder::Pid { pid: 4242 });
    assert_eq!((r.state, r.holder.clone()), (ReservationState::Confirmed, Some(Holder::Pid { pid: 4242 })));
    assert_eq!(book.get(1), Some(&r));
    assert_eq!(
        effects,
        vec![
            Effect::SaveReservation(Box::new(r.clone())),
            Effect::job_event("reservation_confirm", JobId(20), None, "reservation 1: pid 4242"),
        ]
    );

    let (job, effects) = released(&mut book, 1, "released by ann", 1500.0).expect("a live reservation");
    assert_eq!(job, JobId(20));
    assert!(book.is_empty());
    let Effect::SaveReservation(written) = &effects[0] else { panic!("its row first: {effects:?}") };
    assert_eq!(written.state, ReservationState::Released);
    assert_eq!((written.released_at, written.release_reason.as_deref()), (Some(1500.0), Some("released by ann")));
    assert_eq!(effects[1], Effect::job_event("reservation_release", JobId(20), None, "reservation 1: released by ann"));
    assert_eq!(released(&mut book, 1, "again", 1600.0), None, "released once");
}

#[test]
fn reservations_are_due_for_release_when_their_reason_to_exist_is_gone() {
    let cfg = ApiConfig::default();
    let mut jobs = BTreeMap::new();
    for id in 20..=27 {
        let j = running_job(id, &ann(), &[(0, "0")]);
        jobs.insert(j.id, j);
    }
    jobs.get_mut(&JobId(27)).unwrap().kill_sent = Some("walltime".into());
    let holder_job = running_job(30, &ann(), &[(1, "0")]);
    jobs.insert(holder_job.id, holder_job);
    let mut live = BTreeMap::new();
    let mut add = |r: Reservation| {
        live.insert(r.id, r);
    };
    add(resv(1, 19, Some(Holder::Session { session: "s".into() }))); // its job ended
    add(resv(2, 20, None)); // not confirmed in time
    add(resv(3, 21, Some(Holder::Job { job: JobId(30) }))); // holder runs
    add(resv(4, 22, Some(Holder::Job { job: JobId(31) }))); // holder ended
    add(resv(5, 23, Some(Holder::Pid { pid: 100 }))); // alive
    add(resv(6, 24, Some(Holder::Pid { pid: 101 }))); // exited
    add(resv(7, 25, Some(Holder::Session { session: "late".into() }))); // not renewed
    add(Reservation { ends: 1000.0, ..resv(8, 26, Some(Holder::Pid { pid: 100 })) }); // walltime over
    add(resv(9, 27, None)); // being killed: waits for its end
    let ended = HashMap::from([(JobId(19), "cancelled (by ann)".to_string())]);
    let alive = |pid: u32, since: Option<u64>| pid == 100 && since == Some(77);
    let due = due_releases(live.values(), &jobs, &ended, &cfg, 1400.0, alive);
    assert_eq!(
        due,
        vec![
            (1, JobState::Completed, "its job 19 ended: cancelled (by ann)".to_string()),
            (2, JobState::Cancelled, "not confirmed within 60 s".to_string()),
            (4, JobState::Completed, "holder job 31 ended".to_string()),
            (6, JobState::Completed, "holder process 101 exited".to_string()),
            (7, JobState::Completed, format!("session late not renewed within {} s", cfg.session_timeout_secs)),
            (8, JobState::Timeout, "walltime".to_string()),
        ]
    );
    // Before the deadlines, only what ended is due; a job the store does not know is "gone".
    live.insert(10, resv(10, 99, None));
    let due = due_releases(live.values(), &jobs, &ended, &cfg, 1050.0, |_, _| true);
    let ids: Vec<u64> = due.iter().map(|d| d.0).collect();
    assert_eq!(ids, vec![1, 4, 8, 10]);
    assert_eq!(due[3].2, "its job 99 ended: gone");
}
