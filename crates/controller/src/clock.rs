//! Time as the controller reads it: one clock, injected (`Controller::clock`), so that every
//! decision that depends on time (a node silent past the timeout, the batch's `now`, how long
//! a job was suspended) can be tested without sleeping, with a `FakeClock`.
//!
//! Only the state thread's decisions read it, the time budget of a scheduling pass included
//! (`monotonic_us`, core's `Deadline`). Left on the real clock on purpose: the notification
//! hook's timeout (`notify`), the user-name cache (`users`) and the connection tasks' lease stamps
//! (`lease`, compared with this clock's instants).

#[cfg(test)]
use std::sync::atomic::{AtomicU64, Ordering};
#[cfg(test)]
use std::time::Duration;
use std::time::Instant;

/// Unix time in seconds.
pub fn unix_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// Where the controller's time comes from.
pub trait Clock: Send + Sync {
    /// Unix time in seconds: job and event times, grants, the batch's `now`.
    fn unix(&self) -> f64;
    /// A monotonic reading: how long an agent has been silent, backoffs.
    fn instant(&self) -> Instant;
    /// A monotonic reading in microseconds since an origin of the clock's own: the time budget
    /// of a scheduling pass (core's `sched::backfill::Deadline`).
    fn monotonic_us(&self) -> u64;
}

/// The system's clocks.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn unix(&self) -> f64 {
        unix_now()
    }

    fn instant(&self) -> Instant {
        Instant::now()
    }

    fn monotonic_us(&self) -> u64 {
        static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        ORIGIN.get_or_init(Instant::now).elapsed().as_micros() as u64
    }
}

/// A clock that moves only when told to (`advance`): both readings move together. For tests.
#[cfg(test)]
#[derive(Debug)]
pub struct FakeClock {
    unix_start: f64,
    instant_start: Instant,
    /// Microseconds advanced since the start.
    advanced_us: AtomicU64,
}

#[cfg(test)]
impl FakeClock {
    /// A clock reading `unix` (Unix seconds) until advanced.
    pub fn new(unix: f64) -> FakeClock {
        FakeClock { unix_start: unix, instant_start: Instant::now(), advanced_us: AtomicU64::new(0) }
    }

    /// Move both readings forward by `secs` (negative or not finite: not at all).
    pub fn advance(&self, secs: f64) {
        if secs.is_finite() && secs > 0.0 {
            self.advanced_us.fetch_add((secs * 1e6) as u64, Ordering::Relaxed);
        }
    }

    fn advanced(&self) -> Duration {
        Duration::from_micros(self.advanced_us.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
impl Clock for FakeClock {
    fn unix(&self) -> f64 {
        self.unix_start + self.advanced().as_secs_f64()
    }

    fn instant(&self) -> Instant {
        self.instant_start + self.advanced()
    }

    fn monotonic_us(&self) -> u64 {
        self.advanced_us.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fake_clock_moves_only_when_advanced_and_both_readings_together() {
        let c = FakeClock::new(1000.0);
        let (u, i) = (c.unix(), c.instant());
        assert_eq!(c.unix(), u);
        assert_eq!(c.instant(), i);
        c.advance(90.5);
        assert_eq!(c.unix(), 1090.5);
        assert_eq!(c.instant().duration_since(i), Duration::from_micros(90_500_000));
        assert_eq!(c.monotonic_us(), 90_500_000);
        c.advance(-5.0);
        c.advance(f64::NAN);
        assert_eq!(c.unix(), 1090.5);
        assert_eq!(c.monotonic_us(), 90_500_000);
    }
}
