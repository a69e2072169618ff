//! `info`: every node of the job's allocation, this one's CPUs read here and the others'
//! asked of their agents (`remote_info`).

use super::remote::CONNECT_TIMEOUT;
use crate::ports::{JobContext, JobHandle};
use berth_protocol::agent::{AgentQuery, AgentReply};
use berth_protocol::auth::{read_sealed, TreeEnd};
use berth_protocol::step::{AllocationNode, TaskReply, TaskRequest};
use berth_protocol::write_frame;
use std::sync::Arc;
use tokio::net::TcpStream;

/// This node's entry of the allocation.
pub(super) fn own_node(job: &JobHandle) -> AllocationNode {
    let spec = &job.spec;
    let index = spec.nodes.iter().position(|(n, _)| *n == spec.allocation.node).unwrap_or(0);
    AllocationNode {
        index: index as u32,
        name: spec.allocation.node.clone(),
        address: spec.addresses.get(index).cloned().unwrap_or_default(),
        slots: spec.allocation.cores,
        cpus: job.allocation().cpus.to_list(),
    }
}

/// Every node of the allocation; the CPUs of other nodes are asked of their agents.
pub(super) async fn info(ctx: &JobContext, job: &Arc<JobHandle>) -> TaskReply {
    let spec = &job.spec;
    let own = own_node(job);
    let mut asks = Vec::new();
    for (i, (name, cores)) in spec.nodes.iter().enumerate() {
        let address = spec.addresses.get(i).cloned().unwrap_or_default();
        let entry = AllocationNode {
            index: i as u32,
            name: name.clone(),
            address: address.clone(),
            slots: *cores,
            cpus: String::new(),
        };
        if i as u32 == own.index {
            asks.push(tokio::spawn(std::future::ready(own.clone())));
            continue;
        }
        let (id, auth) = (spec.id, ctx.auth.clone());
        asks.push(tokio::spawn(async move {
            let ask = async {
                let mut s = TcpStream::connect(&address).await.ok()?;
                let (q, link) = crate::auth::to_agent(
                    auth.as_deref(),
                    AgentQuery::Task { request: TaskRequest::RemoteInfo { job: id } },
                )
                .ok()?;
                write_frame(&mut s, &q).await.ok()?;
                let (_, mut opener) = link.query_link(TreeEnd::Above);
                match read_sealed::<_, AgentReply>(&mut s, &mut opener).await.ok()?? {
                    AgentReply::Task { reply: TaskReply::Info { nodes, .. } } => nodes.into_iter().next(),
                    _ => None,
                }
            };
            let cpus = tokio::time::timeout(CONNECT_TIMEOUT, ask).await.ok().flatten().map(|n| n.cpus);
            AllocationNode { cpus: cpus.unwrap_or_default(), ..entry }
        }));
    }
    let mut nodes = Vec::with_capacity(asks.len());
    for a in asks {
        if let Ok(n) = a.await {
            nodes.push(n);
        }
    }
    TaskReply::Info { job: spec.id, nodes }
}
