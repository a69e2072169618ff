//! Fair-share usage per account: decayed CPU-seconds as of a time, saved with each pass that
//! charged something, so a restart neither forgets nor double-charges usage.

use super::{Store, StoreError};
use berth_core::sched::fairshare::{FairShare, FairShareConfig};
use rusqlite::params;

impl Store {
    pub fn save_fair_share(&self, fs: &FairShare) -> Result<(), StoreError> {
        self.conn.execute("DELETE FROM fair_share", []).map_err(|e| self.err(e))?;
        let mut st = self
            .conn
            .prepare_cached("INSERT INTO fair_share (account, usage, as_of) VALUES (?1, ?2, ?3)")
            .map_err(|e| self.err(e))?;
        for (account, usage) in &fs.usage {
            st.execute(params![account, usage, fs.as_of]).map_err(|e| self.err(e))?;
        }
        Ok(())
    }

    /// The saved usage under `config` (as of the time it was saved; 0 when none was).
    pub fn load_fair_share(&self, config: FairShareConfig) -> Result<FairShare, StoreError> {
        let mut fs = FairShare::new(config);
        let mut st = self.conn.prepare("SELECT account, usage, as_of FROM fair_share").map_err(|e| self.err(e))?;
        let rows = st
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, f64>(1)?, r.get::<_, f64>(2)?)))
            .map_err(|e| self.err(e))?;
        for row in rows {
            let (account, usage, as_of) = row.map_err(|e| self.err(e))?;
            if usage.is_finite() && usage >= 0.0 {
                fs.usage.insert(account, usage);
            }
            fs.as_of = fs.as_of.max(as_of);
        }
        Ok(fs)
    }
}
