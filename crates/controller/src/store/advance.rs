//! Advance reservations (see `crate::advance`): one row each while it lives; deleted when it
//! ends or an admin deletes it (the `events` table keeps the history). A table of its own,
//! created if missing, so databases written before advance reservations existed open unchanged.

use super::{json, Store, StoreError};
use crate::model::advance::Advance;
use rusqlite::params;

impl Store {
    /// Create the table if this database has none yet.
    pub fn init_advance(&self) -> Result<(), StoreError> {
        self.conn
            .execute_batch(
                "CREATE TABLE IF NOT EXISTS advance_reservations (
                    name TEXT PRIMARY KEY, start REAL NOT NULL, end_time REAL NOT NULL, users TEXT NOT NULL,
                    accounts TEXT NOT NULL, allocation TEXT NOT NULL, created REAL NOT NULL,
                    created_by TEXT NOT NULL);",
            )
            .map_err(|e| self.err(e))
    }

    /// Write a new advance reservation (in the current transaction).
    pub fn save_advance(&self, r: &Advance) -> Result<(), StoreError> {
        let mut st = self
            .conn
            .prepare_cached(
                "INSERT OR REPLACE INTO advance_reservations
                  (name, start, end_time, users, accounts, allocation, created, created_by)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )
            .map_err(|e| self.err(e))?;
        st.execute(params![
            r.name,
            r.start,
            r.end,
            json(&r.users),
            json(&r.accounts),
            json(&r.allocation),
            r.created,
            r.created_by
        ])
        .map_err(|e| self.err(e))?;
        Ok(())
    }

    pub fn delete_advance(&self, name: &str) -> Result<(), StoreError> {
        self.conn.execute("DELETE FROM advance_reservations WHERE name = ?1", [name]).map_err(|e| self.err(e))?;
        Ok(())
    }

    /// Every advance reservation, by name.
    pub fn load_advance(&self) -> Result<Vec<Advance>, StoreError> {
        let mut st = self
            .conn
            .prepare(
                "SELECT name, start, end_time, users, accounts, allocation, created, created_by
                 FROM advance_reservations ORDER BY name",
            )
            .map_err(|e| self.err(e))?;
        type Raw = (String, f64, f64, String, String, String, f64, String);
        let rows = st
            .query_map([], |r| -> rusqlite::Result<Raw> {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?, r.get(7)?))
            })
            .map_err(|e| self.err(e))?;
        let mut out = Vec::new();
        for row in rows {
            let (name, start, end, users, accounts, allocation, created, created_by) = row.map_err(|e| self.err(e))?;
            let corrupt = |what: &str, e: serde_json::Error| StoreError::Corrupt {
                path: self.path.clone(),
                detail: format!("advance reservation {name}: {what}: {e}"),
            };
            out.push(Advance {
                users: serde_json::from_str(&users).map_err(|e| corrupt("users", e))?,
                accounts: serde_json::from_str(&accounts).map_err(|e| corrupt("accounts", e))?,
                allocation: serde_json::from_str(&allocation).map_err(|e| corrupt("allocation", e))?,
                name,
                start,
                end,
                created,
                created_by,
            });
        }
        Ok(out)
    }
}
