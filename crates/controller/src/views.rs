//! What users see of jobs and nodes.

use crate::model::job::JobRecord;
use crate::state::Controller;
use berth_core::job::{JobState, NodeAllocation};
use berth_core::{CpuSet, JobId};
use berth_protocol::client::{CgroupInfo, JobInfo, NodeInfo, NumaInfo, PuHolder, SubnodeInfo};

impl Controller {
    pub fn job_info(&self, job: &JobRecord) -> JobInfo {
        let mut info = job.info(self.clock.unix());
        info.cgroups = self
            .cgroups
            .get(&job.id)
            .map(|v| {
                v.iter()
                    .map(|(node, c)| CgroupInfo {
                        node: node.clone(),
                        path: c.path.clone(),
                        cpus: c.cpus.clone(),
                        mems: c.mems.clone(),
                        rank: c.rank,
                    })
                    .collect()
            })
            .unwrap_or_default();
        if job.state.is_pending() {
            info.reason = match (self.depend_reason(job), self.policy.advance_reasons.get(&job.id)) {
                (Some(r), _) | (None, Some(r)) => Some(r.clone()),
                (None, None) => self.pending_reasons.get(&job.id).map(|r| r.describe()),
            };
            info.priority = self.policy.priorities.get(&job.id).cloned();
            info.expected_start = self.policy.expected_start.get(&job.id).copied();
        } else if job.state == JobState::Running {
            info.reason = job.kill_sent.as_ref().map(|r| format!("ending: {r}"));
        }
        info
    }

    /// Where the GPUs of `alloc` sit on their nodes (`berth show`), from the nodes' topologies
    /// as the controller has them (a part on a node it no longer knows by that name: none).
    pub fn gpu_places(&self, alloc: &[NodeAllocation]) -> Vec<berth_core::gpu::GpuPlace> {
        alloc
            .iter()
            .filter(|a| !a.gpus.is_empty())
            .filter_map(|a| self.cluster.nodes.get(a.node_id.0 as usize).filter(|n| n.name == a.node).map(|n| (a, n)))
            .flat_map(|(a, n)| berth_core::gpu::places(&n.topology, &a.node, &a.gpus, &a.cpus))
            .collect()
    }

    pub fn node_info(&self, i: usize, with_topology: bool) -> NodeInfo {
        let cap = &self.cluster.nodes[i];
        let ex = &self.extra[i];
        let topo = &cap.topology;
        let busy = cap.busy_pus();
        let jobs = self.jobs_on_node(i);
        let parts: Vec<(JobId, &NodeAllocation)> = jobs
            .iter()
            .flat_map(|id| self.jobs[id].allocation.iter().filter(|a| a.node_id.0 as usize == i).map(|a| (*id, a)))
            .collect();
        let exclusive_job = |os: u32| parts.iter().find(|(_, a)| a.exclusive_numa.contains(os)).map(|(id, _)| *id);
        let (sockets, cores, pus) = topo.ge_counts();
        NodeInfo {
            id: i as u32,
            name: cap.name.clone(),
            state: if ex.state == berth_core::node::NodeState::Up && ex.conn.is_none() {
                "up (not connected)".into()
            } else {
                ex.state.as_str().into()
            },
            address: ex.address.clone(),
            sockets,
            cores,
            pus,
            topology: topo.ge_string(&Default::default()),
            // What ordinary jobs can get: system CPUs are not free for them (issue 17 item 11).
            free: topo.ge_string(&{
                let mut taken = busy.clone();
                taken.union_with(&cap.system_pus);
                taken
            }),
            cpus_allocated: busy.len(),
            memory_bytes: topo.memory_bytes(),
            memory_allocated_bytes: cap
                .numa_free
                .iter()
                .zip(&topo.numa_nodes)
                .map(|(f, n)| n.memory_bytes.saturating_sub(*f))
                .sum(),
            numa: topo
                .numa_nodes
                .iter()
                .zip(&cap.numa_free)
                .map(|(n, free)| NumaInfo {
                    os_index: n.os_index,
                    memory_bytes: n.memory_bytes,
                    allocated_bytes: n.memory_bytes.saturating_sub(*free),
                    cpus: n.cpus.to_list(),
                    exclusive_job: exclusive_job(n.os_index),
                    special: n.special,
                    memory_source: n.memory_source,
                })
                .collect(),
            real_cpus: ex.real_cpus.clone(),
            system_cpus: cap.system_pus.to_list(),
            subnodes: cap
                .subnodes
                .iter()
                .enumerate()
                .map(|(k, s)| SubnodeInfo {
                    index: k as u32,
                    numa: s.numa.iter().map(|&n| topo.numa_nodes[n].os_index).collect::<CpuSet>().to_list(),
                    state: s.state.as_str().into(),
                    properties: s.properties.clone(),
                })
                .collect(),
            layout: with_topology.then(|| (**topo).clone()),
            gpus: topo.gpus.clone(),
            gpus_allocated: (topo.gpus.len() as u32).saturating_sub(cap.free_gpu_count_of(None)),
            gpu_jobs: if with_topology {
                parts
                    .iter()
                    .filter(|(_, a)| !a.gpus.is_empty())
                    .map(|(id, a)| berth_protocol::client::GpuHolder { job: *id, gpus: a.gpus.clone() })
                    .collect()
            } else {
                vec![]
            },
            pu_jobs: if with_topology {
                // Suspended jobs lend their PUs: only running jobs hold them.
                parts
                    .iter()
                    .filter(|(id, _)| self.jobs[id].state == JobState::Running)
                    .map(|(id, a)| PuHolder { job: *id, cpus: a.cpus.to_list() })
                    .collect()
            } else {
                vec![]
            },
            jobs,
            last_heard_seconds_ago: if ex.instance.is_empty() {
                None
            } else {
                Some(self.clock.instant().saturating_duration_since(ex.last_heard).as_secs_f64())
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::testkit::*;
    use berth_core::directives::SubmitOptions;
    use berth_core::topology::MemorySource;
    use berth_protocol::client::{ClientRequest, ClientResponse, ErrorCode, SubmitRequest};
    use tokio::sync::mpsc;

    fn submit(mem: Option<u64>) -> ClientRequest {
        ClientRequest::Submit(Box::new(SubmitRequest {
            script: "#!/bin/sh\ntrue\n".into(),
            script_name: "job.sh".into(),
            options: SubmitOptions { cores: Some(1), mem, ..Default::default() },
            env: vec![],
            cwd: "/tmp".into(),
            hold: false,
            ignore_unsupported: false,
        }))
    }

    /// Issue 17 item 1: a node registering NUMA nodes without memory (an agent no source gave
    /// any) accepts no job: infeasible at submit, saying why, whatever memory the job asks;
    /// `berth nodes` shows where each NUMA node's memory came from.
    #[test]
    fn node_without_memory_makes_jobs_infeasible_and_sources_are_shown() {
        let mut h = Harness::new(0);
        let (tx, _rx) = mpsc::unbounded_channel();
        let mut reg = registration(0, "inst0", vec![]);
        for n in &mut reg.topology.numa_nodes {
            (n.memory_bytes, n.memory_source) = (0, MemorySource::Unknown);
        }
        h.ctl.handle_register(reg, 1, tx, h.now).unwrap();
        for mem in [None, Some(1 << 30)] {
            match h.call(submit(mem), &ann()) {
                ClientResponse::Error(e) => {
                    assert_eq!(e.code, ErrorCode::Infeasible, "{}", e.message);
                    assert!(e.message.contains("node n0 has no usable memory"), "{}", e.message);
                }
                other => panic!("accepted on a node without memory ({mem:?}): {other:?}"),
            }
        }
        assert_eq!(h.ctl.node_info(0, false).numa[0].memory_source, MemorySource::Unknown);

        // The same node with memory the agent took from the OS: accepted, and shown so.
        let (tx, _rx2) = mpsc::unbounded_channel();
        let mut reg = registration(0, "inst1", vec![]);
        reg.topology.numa_nodes[1].memory_source = MemorySource::Os;
        h.ctl.handle_register(reg, 2, tx, h.now).unwrap();
        assert!(matches!(h.call(submit(Some(1 << 20)), &ann()), ClientResponse::Submitted { .. }));
        let sources: Vec<MemorySource> = h.ctl.node_info(0, false).numa.iter().map(|n| n.memory_source).collect();
        assert_eq!(sources, [MemorySource::Hwloc, MemorySource::Os]);
    }
}
