//! A step (`berth run`) as the controller records it.

use berth_core::{CpuSet, JobId};

/// A step (`berth run`) as persisted: the invocation log, and the cores it holds while live.
#[derive(Debug, Clone, PartialEq)]
pub struct StepRow {
    pub job: JobId,
    pub step: u32,
    pub uid: u32,
    pub user: String,
    pub start_time: f64,
    pub end_time: Option<f64>,
    pub host: String,
    pub pid: u32,
    pub cwd: String,
    pub argv: Vec<String>,
    pub size: u32,
    /// Names of the nodes with ranks, in rank order.
    pub nodes: Vec<String>,
    pub exit_code: Option<i32>,
    pub failure: Option<String>,
    pub interactive: bool,
    /// PUs the step holds per node (index in the job's allocation); empty when it overcommits.
    pub claims: Vec<(usize, CpuSet)>,
}
