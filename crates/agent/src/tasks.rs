//! The task API (seeds/001 TM): placeholder until the task module lands.

use crate::job::JobContext;
use berth_protocol::step::{TaskReply, TaskRequest};
use std::sync::Arc;

pub async fn handle(_ctx: &Arc<JobContext>, _req: TaskRequest) -> TaskReply {
    TaskReply::Error { message: "the task API is not available yet".into() }
}
