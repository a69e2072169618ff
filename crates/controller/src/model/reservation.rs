//! A reservation of the reservations API (for external schedulers) as the controller keeps
//! it. What is done with them is `crate::reservations`'s.

use berth_core::JobId;
use berth_protocol::reservation::{Holder, ReservationState};

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
