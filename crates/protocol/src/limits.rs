//! What one peer may hold of a daemon: connections per user and in all, and the descriptor
//! limit they come out of (docs/protocol/00-framing.md, "Limits"). Frame sizes, timeouts and the memory
//! budget of frames still arriving are in [`crate::frame`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Raise the soft limit on open files to the hard one; returns the soft limit now in force.
/// Every connection holds a descriptor: the default soft limit (often 1024) is what one user
/// with a thousand idle connections would otherwise exhaust.
pub fn raise_nofile() -> std::io::Result<u64> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if lim.rlim_cur < lim.rlim_max {
        let want = libc::rlimit { rlim_cur: lim.rlim_max, rlim_max: lim.rlim_max };
        // SAFETY: setrlimit reads the struct we own.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &want) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        lim.rlim_cur = lim.rlim_max;
    }
    Ok(lim.rlim_cur)
}

/// Caps on a socket's connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    /// Most connections one uid may hold at once (root: no per-uid cap).
    pub per_uid: usize,
    /// Most connections of all non-root users together.
    pub total: usize,
    /// Connections root may open past `total`: an administrator can always get in.
    pub root_reserve: usize,
}

/// Why a connection was refused; its text is what the peer is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnRefused {
    PerUid { uid: u32, limit: usize },
    Total { limit: usize },
}

impl std::fmt::Display for ConnRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnRefused::PerUid { uid, limit } => {
                write!(f, "too many connections from uid {uid} (limit {limit}); close some")
            }
            ConnRefused::Total { limit } => {
                write!(f, "too many connections in all (limit {limit}); try again shortly")
            }
        }
    }
}

#[derive(Default)]
struct Counts {
    total: usize,
    per_uid: HashMap<u32, usize>,
}

/// The connections a socket holds, by uid.
pub struct ConnTracker {
    limits: ConnLimits,
    counts: Mutex<Counts>,
}

/// One admitted connection; dropping it frees its place.
pub struct ConnSlot {
    tracker: Arc<ConnTracker>,
    uid: u32,
}

impl ConnTracker {
    pub fn new(limits: ConnLimits) -> Arc<ConnTracker> {
        Arc::new(ConnTracker { limits, counts: Mutex::new(Counts::default()) })
    }

    pub fn limits(&self) -> ConnLimits {
        self.limits
    }

    /// Connections held now, in all and by `uid`.
    pub fn held(&self, uid: u32) -> (usize, usize) {
        let c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        (c.total, c.per_uid.get(&uid).copied().unwrap_or(0))
    }

    /// A place for a new connection of `uid`, or why there is none.
    pub fn admit(self: &Arc<Self>, uid: u32) -> Result<ConnSlot, ConnRefused> {
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let l = self.limits;
        if uid == 0 {
            if c.total >= l.total.saturating_add(l.root_reserve) {
                return Err(ConnRefused::Total { limit: l.total.saturating_add(l.root_reserve) });
            }
        } else {
            if c.per_uid.get(&uid).copied().unwrap_or(0) >= l.per_uid {
                return Err(ConnRefused::PerUid { uid, limit: l.per_uid });
            }
            if c.total >= l.total {
                return Err(ConnRefused::Total { limit: l.total });
            }
        }
        c.total += 1;
        *c.per_uid.entry(uid).or_insert(0) += 1;
        Ok(ConnSlot { tracker: self.clone(), uid })
    }
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        let mut c = self.tracker.counts.lock().unwrap_or_else(|p| p.into_inner());
        c.total = c.total.saturating_sub(1);
        if let Some(n) = c.per_uid.get_mut(&self.uid) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.per_uid.remove(&self.uid);
            }
        }
    }
}

/// At most one log line per key per period: a user opening connections in a loop must not
/// fill the log. `allow` says whether to log now, and how many were held back since the last.
pub struct LogLimiter {
    period: Duration,
    last: Mutex<HashMap<String, (Instant, u64)>>,
}

impl LogLimiter {
    pub fn new(period: Duration) -> LogLimiter {
        LogLimiter { period, last: Mutex::new(HashMap::new()) }
    }

    pub fn allow(&self, key: &str) -> Option<u64> {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if last.len() > 10_000 {
            let period = self.period;
            last.retain(|_, (at, _)| now.duration_since(*at) < period);
        }
        match last.get_mut(key) {
            Some((at, held)) if now.duration_since(*at) < self.period => {
                *held += 1;
                None
            }
            Some((at, held)) => {
                let n = *held;
                *at = now;
                *held = 0;
                Some(n)
            }
            None => {
                last.insert(key.to_string(), (now, 0));
                Some(0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_per_uid_and_in_all_with_a_reserve_for_root() {
        let t = ConnTracker::new(ConnLimits { per_uid: 2, total: 3, root_reserve: 1 });
        let a1 = t.admit(1000).unwrap();
        let _a2 = t.admit(1000).unwrap();
        let e = t.admit(1000).err().unwrap();
        assert_eq!(e.to_string(), "too many connections from uid 1000 (limit 2); close some");
        let _b1 = t.admit(1001).unwrap();
        assert_eq!(t.admit(1002).err(), Some(ConnRefused::Total { limit: 3 }));
        let r = t.admit(0).expect("root has its reserve");
        assert!(t.admit(0).is_err(), "the reserve is bounded too");
        drop(r);
        drop(a1);
        assert_eq!(t.held(1000), (2, 1));
        let _a3 = t.admit(1000).expect("a place freed is a place again");
    }

    #[test]
    fn log_lines_are_rate_limited_per_key() {
        let l = LogLimiter::new(Duration::from_secs(3600));
        assert_eq!(l.allow("uid 5"), Some(0));
        assert_eq!(l.allow("uid 5"), None);
        assert_eq!(l.allow("uid 5"), None);
        assert_eq!(l.allow("uid 6"), Some(0));
        let l = LogLimiter::new(Duration::ZERO);
        assert_eq!(l.allow("k"), Some(0));
        assert_eq!(l.allow("k"), Some(0));
    }

    #[test]
    fn the_descriptor_limit_is_raised_to_the_hard_one() {
        let soft = raise_nofile().unwrap();
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: as in raise_nofile.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        assert_eq!(lim.rlim_cur, lim.rlim_max);
        assert_eq!(soft, lim.rlim_cur);
    }
}
