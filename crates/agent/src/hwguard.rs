//! hwloc calls that must not take the agent down: shared by the topology's loading
//! ([`crate::hwtopo`]) and the GPUs' discovery ([`crate::gpus`]).

use std::panic::{catch_unwind, AssertUnwindSafe};

/// hwlocality panicked inside an hwloc call: its panic message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct HwlocPanic(String);

/// Run an hwloc builder step. hwlocality (an alpha) panics with `unreachable!` when hwloc
/// fails with an errno it does not expect, which libxml2-backed XML parsing can do on bad
/// input; user input must not crash the agent, so such a panic becomes an error here.
pub(crate) fn guarded<T>(step: impl FnOnce() -> T) -> Result<T, HwlocPanic> {
    catch_unwind(AssertUnwindSafe(step)).map_err(|panic| {
        let message = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("hwlocality panicked");
        HwlocPanic(message.to_string())
    })
}
