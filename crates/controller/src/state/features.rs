//! The loads from the store of the features' books whose types live in `crate::model`
//! (`AdvanceBook`, `Reservations`: private fields, named methods). The features' operations
//! (`impl Controller` in `advance`, `reservations`) change them.

use crate::model::advance::AdvanceBook;
use crate::model::reservation::Reservations;
use crate::store::{Store, StoreError};

impl AdvanceBook {
    /// The live advance reservations from the store.
    pub fn load(store: &Store) -> Result<Self, StoreError> {
        store.init_advance()?;
        Ok(AdvanceBook::new(store.load_advance()?))
    }
}

impl Reservations {
    /// The live reservations from the store (after a restart their jobs are checked at the
    /// first tick: one that did not survive is released).
    pub fn load(store: &Store) -> Result<Self, StoreError> {
        store.init_reservations()?;
        Ok(Reservations::new(store.live_reservations()?, store.max_reservation_id()? + 1))
    }
}
