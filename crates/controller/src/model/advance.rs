//! An advance reservation (`berth resv`) as the controller keeps it. What is done with them
//! (creation, checks, the pass's input) is `crate::advance`'s.

use berth_core::job::Allocation;

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
