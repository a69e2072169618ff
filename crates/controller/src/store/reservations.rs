//! Reservations of the reservations API (see `crate::reservations`): one row each, kept after
//! release so that `GET /v1/reservations/{id}` still answers. The resources are the job's
//! (`jobs` table); a row only says who holds them and until when.

use super::{Store, StoreError};
use crate::model::reservation::Reservation;
use berth_core::JobId;
use berth_protocol::reservation::{Holder, ReservationState};
use rusqlite::{params, OptionalExtension, Row};

const COLUMNS: &str = "id, job_id, uid, user, state, created, confirm_by, ends, walltime, holder, holder_since,
     renew_by, explicit, released_at, release_reason";

impl Store {
    /// Create the table if this database has none yet (an older berth's database gains it).
    pub fn init_reservations(&self) -> Result<(), StoreError> {
        self.conn
            .execute_batch(
                "CREATE TABLE IF NOT EXISTS reservations (
                    id INTEGER PRIMARY KEY, job_id INTEGER NOT NULL, uid INTEGER NOT NULL, user TEXT NOT NULL,
                    state TEXT NOT NULL, created REAL NOT NULL, confirm_by REAL NOT NULL, ends REAL NOT NULL,
                    walltime INTEGER NOT NULL, holder TEXT, holder_since INTEGER, renew_by REAL,
                    explicit INTEGER NOT NULL, released_at REAL, release_reason TEXT);
                 CREATE INDEX IF NOT EXISTS reservations_live ON reservations(state) WHERE state != 'released';",
            )
            .map_err(|e| self.err(e))
    }

    /// Insert or replace a reservation's row (in the current transaction).
    pub fn save_reservation(&self, r: &Reservation) -> Result<(), StoreError> {
        let mut st = self
            .conn
            .prepare_cached(&format!(
                "INSERT OR REPLACE INTO reservations ({COLUMNS})
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)"
            ))
            .map_err(|e| self.err(e))?;
        st.execute(params![
            r.id as i64,
            r.job.0 as i64,
            r.uid,
            r.user,
            r.state.as_str(),
            r.created,
            r.confirm_by,
            r.ends,
            r.walltime as i64,
            r.holder.as_ref().map(|h| serde_json::to_string(h).unwrap_or_default()),
            r.holder_since.map(|s| s as i64),
            r.renew_by,
            r.explicit,
            r.released_at,
            r.release_reason,
        ])
        .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// Reservations not released, oldest first.
    pub fn live_reservations(&self) -> Result<Vec<Reservation>, StoreError> {
        self.query_reservations("WHERE state != 'released' ORDER BY id", &[])
    }

    /// Every reservation, oldest first, at most `limit` of the most recent.
    pub fn all_reservations(&self, limit: u32) -> Result<Vec<Reservation>, StoreError> {
        let mut v = self.query_reservations("ORDER BY id DESC LIMIT ?1", &[&(limit as i64)])?;
        v.reverse();
        Ok(v)
    }

    pub fn get_reservation(&self, id: u64) -> Result<Option<Reservation>, StoreError> {
        Ok(self.query_reservations("WHERE id = ?1", &[&(id as i64)])?.pop())
    }

    pub fn max_reservation_id(&self) -> Result<u64, StoreError> {
        let max: Option<i64> = self
            .conn
            .query_row("SELECT MAX(id) FROM reservations", [], |r| r.get(0))
            .optional()
            .map_err(|e| self.err(e))?
            .flatten();
        Ok(max.unwrap_or(0).max(0) as u64)
    }

    fn query_reservations(&self, tail: &str, args: &[&dyn rusqlite::ToSql]) -> Result<Vec<Reservation>, StoreError> {
        let mut st =
            self.conn.prepare_cached(&format!("SELECT {COLUMNS} FROM reservations {tail}")).map_err(|e| self.err(e))?;
        let rows = st.query_map(args, read_row).map_err(|e| self.err(e))?;
        let mut out = Vec::new();
        for row in rows {
            let (mut r, state, holder) = row.map_err(|e| self.err(e))?;
            r.state = ReservationState::parse(&state).ok_or_else(|| StoreError::Record {
                path: self.path.clone(),
                id: r.job.0 as i64,
                detail: format!("reservation {} has unknown state {state:?}", r.id),
            })?;
            r.holder = match holder {
                Some(h) => Some(serde_json::from_str::<Holder>(&h).map_err(|e| StoreError::Record {
                    path: self.path.clone(),
                    id: r.job.0 as i64,
                    detail: format!("reservation {}'s holder: {e}", r.id),
                })?),
                None => None,
            };
            out.push(r);
        }
        Ok(out)
    }
}

type RawReservation = (Reservation, String, Option<String>);

fn read_row(row: &Row) -> rusqlite::Result<RawReservation> {
    Ok((
        Reservation {
            id: row.get::<_, i64>(0)? as u64,
            job: JobId(row.get::<_, i64>(1)? as u64),
            uid: row.get(2)?,
            user: row.get(3)?,
            state: ReservationState::Released,
            created: row.get(5)?,
            confirm_by: row.get(6)?,
            ends: row.get(7)?,
            walltime: row.get::<_, i64>(8)? as u64,
            holder: None,
            holder_since: row.get::<_, Option<i64>>(10)?.map(|s| s as u64),
            renew_by: row.get(11)?,
            explicit: row.get(12)?,
            released_at: row.get(13)?,
            release_reason: row.get(14)?,
        },
        row.get(4)?,
        row.get(9)?,
    ))
}
