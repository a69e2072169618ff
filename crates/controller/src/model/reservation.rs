//! A reservation of the reservations API (for external schedulers) as the controller keeps
//! it. What is done with them is `crate::reservations`'s.

use berth_core::JobId;
use berth_protocol::reservation::{Holder, ReservationState};
use std::collections::BTreeMap;

/// A reservation as the controller keeps it (live ones in memory, all in the store).
#[derive(Debug, Clone, PartialEq)]
pub struct Reservation {
    pub id: u64,
    pub job: JobId,
    pub uid: u32,
    pub user: String,
    pub state: ReservationState,
    pub created: f64,
    /// Released at this time unless confirmed.
    pub confirm_by: f64,
    /// The end of its walltime.
    pub ends: f64,
    pub walltime: u64,
    pub holder: Option<Holder>,
    /// For a pid holder: the process's start time (clock ticks after boot), so that a new
    /// process reusing the pid is not taken for the holder.
    pub holder_since: Option<u64>,
    /// For a session holder: released unless renewed by then.
    pub renew_by: Option<f64>,
    pub explicit: bool,
    pub released_at: Option<f64>,
    pub release_reason: Option<String>,
}

/// The live reservations, by id, and the id the next one gets.
#[derive(Debug, Default)]
pub struct Reservations {
    live: BTreeMap<u64, Reservation>,
    next_id: u64,
    /// When holders were last checked.
    last_check: f64,
}

impl Reservations {
    /// The live reservations `live` (from the store), the next one to get id `next_id`;
    /// holders not checked yet.
    pub fn new(live: impl IntoIterator<Item = Reservation>, next_id: u64) -> Self {
        Reservations { live: live.into_iter().map(|r| (r.id, r)).collect(), next_id, last_check: 0.0 }
    }

    /// The id the next reservation gets (taken by [`Reservations::id_taken`] once it is made).
    pub fn next_id(&self) -> u64 {
        self.next_id
    }

    /// The next id was given to a reservation.
    pub fn id_taken(&mut self) {
        self.next_id += 1;
    }

    /// Live reservation `id`.
    pub fn get(&self, id: u64) -> Option<&Reservation> {
        self.live.get(&id)
    }

    /// The live reservations, in id order.
    pub fn values(&self) -> impl Iterator<Item = &Reservation> {
        self.live.values()
    }

    /// No reservation is live.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// The live reservation whose job is `job`.
    pub fn of_job(&self, job: JobId) -> Option<&Reservation> {
        self.live.values().find(|r| r.job == job)
    }

    /// Reservation `r` is live as it is now (made, renewed or confirmed).
    pub fn keep(&mut self, r: Reservation) {
        self.live.insert(r.id, r);
    }

    /// Reservation `id` is live no more: it, if it was.
    pub fn remove(&mut self, id: u64) -> Option<Reservation> {
        self.live.remove(&id)
    }

    /// Whether holders are to be checked at `now`: some reservation is live, and `interval`
    /// seconds have passed since the last check (or `now_too`); if so, this is the last check.
    pub fn holders_due(&mut self, now: f64, interval: f64, now_too: bool) -> bool {
        if self.live.is_empty() {
            return false;
        }
        if !now_too && now < self.last_check + interval {
            return false;
        }
        self.last_check = now;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resv(id: u64, job: u64) -> Reservation {
        Reservation {
            id,
            job: JobId(job),
            uid: 1000,
            user: "ann".into(),
            state: ReservationState::Unconfirmed,
            created: 1000.0,
            confirm_by: 1060.0,
            ends: 4600.0,
            walltime: 3600,
            holder: None,
            holder_since: None,
            renew_by: None,
            explicit: false,
            released_at: None,
            release_reason: None,
        }
    }

    #[test]
    fn the_book_keeps_live_reservations_by_id_and_gives_ids_once_taken() {
        let mut book = Reservations::new([resv(3, 30), resv(1, 10)], 4);
        assert_eq!(book.values().map(|r| r.id).collect::<Vec<_>>(), vec![1, 3]);
        assert_eq!(book.of_job(JobId(30)).map(|r| r.id), Some(3));
        assert_eq!(book.of_job(JobId(20)), None);
        // The next id stays until a reservation is made with it.
        assert_eq!(book.next_id(), 4);
        assert_eq!(book.next_id(), 4);
        book.keep(resv(4, 40));
        book.id_taken();
        assert_eq!(book.next_id(), 5);
        let mut renewed = resv(4, 40);
        renewed.ends = 9000.0;
        book.keep(renewed);
        assert_eq!(book.get(4).map(|r| r.ends), Some(9000.0));
        assert_eq!(book.remove(1).map(|r| r.job), Some(JobId(10)));
        assert_eq!(book.remove(1), None);
        book.remove(3);
        book.remove(4);
        assert!(book.is_empty());
    }

    #[test]
    fn holders_are_checked_every_interval_while_a_reservation_is_live() {
        let mut book = Reservations::default();
        assert!(!book.holders_due(100.0, 5.0, true), "nothing live: nothing to check");
        book.keep(resv(1, 10));
        assert!(book.holders_due(100.0, 5.0, false), "never checked yet");
        assert!(!book.holders_due(104.0, 5.0, false));
        assert!(book.holders_due(104.0, 5.0, true), "asked for now");
        assert!(!book.holders_due(108.0, 5.0, false), "the forced check counts");
        assert!(book.holders_due(109.0, 5.0, false));
    }
}
