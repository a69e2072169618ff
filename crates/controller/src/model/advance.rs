//! An advance reservation (`berth resv`) as the controller keeps it. What is done with them
//! (creation, checks, the pass's input) is `crate::advance`'s.

use berth_core::job::Allocation;
use std::collections::BTreeMap;

/// An advance reservation as the controller keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct Advance {
    pub name: String,
    /// Unix times: the window is `[start, end)`.
    pub start: f64,
    pub end: f64,
    pub users: Vec<String>,
    pub accounts: Vec<String>,
    pub allocation: Allocation,
    pub created: f64,
    pub created_by: String,
}

impl Advance {
    /// Whether a job of `user` charged to `account` may use it.
    pub fn admits(&self, user: &str, account: &str) -> bool {
        self.users.iter().any(|u| u == user) || self.accounts.iter().any(|a| a == account)
    }

    pub(crate) fn who(&self) -> String {
        let mut parts = vec![];
        if !self.users.is_empty() {
            parts.push(format!("users {}", self.users.join(", ")));
        }
        if !self.accounts.is_empty() {
            parts.push(format!("accounts {}", self.accounts.join(", ")));
        }
        parts.join(" and ")
    }
}

/// The live advance reservations, by name, and how far their windows have been acted on.
#[derive(Debug, Default)]
pub struct AdvanceBook {
    live: BTreeMap<String, Advance>,
    /// Windows that opened or ended up to this time have been acted on.
    checked_until: f64,
}

impl AdvanceBook {
    /// The live reservations `live` (from the store); no window acted on yet.
    pub fn new(live: impl IntoIterator<Item = Advance>) -> Self {
        AdvanceBook { live: live.into_iter().map(|r| (r.name.clone(), r)).collect(), checked_until: 0.0 }
    }

    /// Live reservation `name`.
    pub fn get(&self, name: &str) -> Option<&Advance> {
        self.live.get(name)
    }

    /// Whether reservation `name` is live.
    pub fn contains(&self, name: &str) -> bool {
        self.live.contains_key(name)
    }

    /// The live reservations, in name order.
    pub fn values(&self) -> impl Iterator<Item = &Advance> {
        self.live.values()
    }

    /// No reservation is live.
    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// Reservation `r` is live as it is now.
    pub fn keep(&mut self, r: Advance) {
        self.live.insert(r.name.clone(), r);
    }

    /// Reservation `name` is live no more: it, if it was.
    pub fn remove(&mut self, name: &str) -> Option<Advance> {
        self.live.remove(name)
    }

    /// The windows are acted on up to `now`: the time they had been acted on until before.
    pub fn checked_to(&mut self, now: f64) -> f64 {
        std::mem::replace(&mut self.checked_until, now)
    }

    /// Windows that opened or ended up to this time have been acted on.
    #[cfg(test)]
    pub fn checked_until(&self) -> f64 {
        self.checked_until
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resv(name: &str, start: f64, end: f64) -> Advance {
        Advance {
            name: name.into(),
            start,
            end,
            users: vec!["ann".into()],
            accounts: vec![],
            allocation: vec![],
            created: 900.0,
            created_by: "root".into(),
        }
    }

    #[test]
    fn the_book_keeps_live_reservations_by_name() {
        let mut book = AdvanceBook::new([resv("b", 1.0, 2.0), resv("a", 3.0, 4.0)]);
        assert_eq!(book.values().map(|r| r.name.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        assert!(book.contains("a") && !book.contains("c"));
        // Kept again (changed): the one under its name is replaced.
        book.keep(resv("a", 3.0, 5.0));
        assert_eq!(book.get("a").map(|r| r.end), Some(5.0));
        assert_eq!(book.remove("a").map(|r| r.name), Some("a".into()));
        assert_eq!(book.remove("a"), None);
        book.remove("b");
        assert!(book.is_empty());
    }

    #[test]
    fn windows_are_acted_on_from_where_the_last_check_left_them() {
        let mut book = AdvanceBook::default();
        assert_eq!(book.checked_until(), 0.0);
        assert_eq!(book.checked_to(100.0), 0.0);
        assert_eq!(book.checked_to(160.0), 100.0);
        assert_eq!(book.checked_until(), 160.0);
    }
}
