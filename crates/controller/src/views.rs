//! What users see of jobs and nodes.

use crate::job::JobRecord;
use crate::state::Controller;
use berth_core::job::JobState;
use berth_protocol::client::{JobInfo, NodeInfo, NumaInfo};

impl Controller {
    pub fn job_info(&self, job: &JobRecord) -> JobInfo {
        let mut info = job.info();
        if job.state.is_pending() {
            info.reason = self.pending_reasons.get(&job.id).map(|r| r.describe());
        } else if job.state == JobState::Running {
            info.reason = job.kill_sent.as_ref().map(|r| format!("ending: {r}"));
        }
        info
    }

    pub fn node_info(&self, i: usize) -> NodeInfo {
        let cap = &self.cluster.nodes[i];
        let ex = &self.extra[i];
        let topo = &cap.topology;
        let busy = cap.busy_pus();
        let jobs = self.jobs_on_node(i);
        // Memory per NUMA node: a job's memory is charged to its memory nodes evenly.
        let mut numa_alloc = vec![0u64; topo.numa_nodes.len()];
        for id in &jobs {
            for a in self.jobs[id].allocation.iter().filter(|a| a.node_id.0 as usize == i) {
                let idx: Vec<usize> = topo
                    .numa_nodes
                    .iter()
                    .enumerate()
                    .filter(|(_, n)| a.mems.contains(n.os_index))
                    .map(|(k, _)| k)
                    .collect();
                if idx.is_empty() {
                    continue;
                }
                let share = a.memory_bytes / idx.len() as u64;
                idx.iter().for_each(|&k| numa_alloc[k] += share);
            }
        }
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
            free: topo.ge_string(&busy),
            cpus_allocated: busy.len(),
            memory_bytes: topo.memory_bytes(),
            memory_allocated_bytes: topo.memory_bytes().saturating_sub(cap.free_memory),
            numa: topo
                .numa_nodes
                .iter()
                .zip(numa_alloc)
                .map(|(n, alloc)| NumaInfo {
                    os_index: n.os_index,
                    memory_bytes: n.memory_bytes,
                    allocated_bytes: alloc,
                    cpus: n.cpus.to_list(),
                })
                .collect(),
            real_cpus: ex.real_cpus.clone(),
            jobs,
            last_heard_seconds_ago: if ex.instance.is_empty() {
                None
            } else {
                Some(ex.last_heard.elapsed().as_secs_f64())
            },
        }
    }
}
