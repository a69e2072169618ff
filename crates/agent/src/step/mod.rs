//! Steps (`berth run`) on this node: admission, the control tree's shepherd, ranks, PMI.

pub mod launch;
pub mod pmi;
pub mod pmi2;
pub mod pmi_kvs;
pub mod pmix;
pub mod rank;
pub mod ranks;
pub mod shepherd;
