//! What users see of jobs and nodes.

use crate::model::job::JobRecord;
use crate::state::Controller;
use berth_core::job::{JobState, NodeAllocation};
use berth_core::{CpuSet, JobId};
use berth_protocol::client::{CgroupInfo, JobInfo};
use berth_protocol::node::{NodeInfo, NumaInfo, PuHolder, SubnodeInfo};

impl Controller {
    pub fn job_info(&self, job: &JobRecord) -> JobInfo {
        let mut info = job.info(self.clock.unix());
        info.cgroups = self
            .cgroups
            .of(job.id)
            .iter()
            .map(|(node, c)| CgroupInfo {
                node: node.clone(),
                path: c.path.clone(),
                cpus: c.cpus.clone(),
                mems: c.mems.clone(),
                rank: c.rank,
            })
            .collect();
        if job.state.is_pending() {
            // A dependency's reason first, then an advance reservation's, then the pass's; a
            // task of an array tail left out of the last pass shown as the task that stood for it.
            let shown = self.policy.shown(job.id);
            let reason = shown.reason;
            // The edge: the typed reason becomes its words and its code.
            info.reason = reason.map(ToString::to_string);
            info.reason_code = reason.map(|r| r.code().to_string());
            info.priority = shown.priority.cloned();
            info.expected_start = shown.expected_start;
        } else if job.state == JobState::Suspended {
            // Its words are the job's reason (as its row keeps them); the typed one gives the code.
            info.reason_code = job.suspension.reason.as_ref().map(|r| r.code().to_string());
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
            .filter_map(|a| self.cluster.nodes().get(a.node_id.0 as usize).filter(|n| n.name == a.node).map(|n| (a, n)))
            .flat_map(|(a, n)| n.topology.gpu_places(&a.node, &a.gpus, &a.cpus))
            .collect()
    }

    /// The GPU weight billing uses: `[fair_share] gpu_weight`, else the cluster's PUs per GPU
    /// on its GPU nodes (as the fair-share charge bills).
    pub fn gpu_billing_weight(&self) -> f64 {
        self.policy.fair_share().config.gpu_weight_on(self.cluster.nodes())
    }

    /// What a job holding `alloc` is billed a second (Slurm's `billing` TRES), `gpu_weight`
    /// from [`Self::gpu_billing_weight`]; none for a job holding nothing.
    pub fn billing_rate(&self, alloc: &[NodeAllocation], gpu_weight: f64) -> Option<f64> {
        if alloc.is_empty() {
            return None;
        }
        let cpus: u64 = alloc.iter().map(|a| a.cpus.len() as u64).sum();
        let gpus: u64 = alloc.iter().map(|a| a.gpus.len() as u64).sum();
        let config = &self.policy.fair_share().config;
        let held: f64 = alloc.iter().map(|a| config.counts_billing(&a.gres, &a.licenses)).sum();
        Some(config.billing(cpus, gpus, gpu_weight) + held)
    }

    /// [`Self::billing_rate`] set on each of `jobs`, the GPU weight worked out once and only
    /// when a job holds GPUs.
    pub fn set_billing(&self, jobs: &mut [JobInfo]) {
        let mut gpu_weight: Option<f64> = None;
        for j in jobs {
            let weight = if j.allocation.iter().any(|a| !a.gpus.is_empty()) {
                *gpu_weight.get_or_insert_with(|| self.gpu_billing_weight())
            } else {
                0.0
            };
            j.billing = self.billing_rate(&j.allocation, weight);
        }
    }

    /// The cluster's licenses and how many running or suspended jobs hold.
    pub fn license_info(&self) -> Vec<berth_protocol::node::CountInfo> {
        let l = &self.cluster.licenses;
        l.total
            .iter()
            .map(|(name, &total)| berth_protocol::node::CountInfo {
                name: name.clone(),
                total,
                used: l.used.get(name).copied().unwrap_or(0),
            })
            .collect()
    }

    pub fn node_info(&self, i: usize, with_topology: bool) -> NodeInfo {
        let cap = &self.cluster.nodes()[i];
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
            state: if ex.state == berth_core::node::NodeState::Up && !ex.connected() {
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
            gres: cap
                .gres_total
                .iter()
                .map(|(name, &total)| berth_protocol::node::CountInfo {
                    name: name.clone(),
                    total,
                    used: total.saturating_sub(cap.free_gres(name)),
                })
                .collect(),
            gpu_jobs: if with_topology {
                parts
                    .iter()
                    .filter(|(_, a)| !a.gpus.is_empty())
                    .map(|(id, a)| berth_protocol::node::GpuHolder { job: *id, gpus: a.gpus.clone() })
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
            last_heard_seconds_ago: if !ex.ever_registered() {
                None
            } else {
                Some(self.clock.instant().saturating_duration_since(ex.last_heard()).as_secs_f64())
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

    /// Issue 20: `show_job` says where a job's GPUs sit (NUMA node, socket, its cores next to
    /// them), and `show_job` and `acct` what it is billed a second (CPUs at `cpu_weight`, GPUs
    /// at `gpu_weight`, or like the CPUs beside them when that is unset).
    #[test]
    fn show_and_acct_give_gpu_places_and_billing() {
        // One node: 2 packages of 1 NUMA node of 4 cores, a GPU on each NUMA node.
        let mut t = berth_core::topology::Topology::uniform(2, 1, 4, 1, 1 << 30);
        t.add_emulated_gpus(1).expect("emulated GPUs");
        let mut h = Harness::with_topology(1, t);
        let opts =
            |gpus: Option<u32>| SubmitOptions { cores: Some(2), gpus, walltime: Some(600), ..Default::default() };
        let gpu = h.batch(opts(Some(1)), &ann());
        let cpu = h.batch(opts(None), &ann());
        let show = |h: &mut Harness, id| match h.call(ClientRequest::ShowJob { id }, &ann()) {
            ClientResponse::Job { job } => *job,
            other => panic!("{other:?}"),
        };
        let j = show(&mut h, gpu);
        assert_eq!(j.state, berth_core::job::JobState::Running, "{j:?}");
        let held = &j.allocation[0].gpus;
        assert_eq!(held.len(), 1);
        assert_eq!(j.gpu_places.len(), 1, "{j:?}");
        let p = &j.gpu_places[0];
        assert_eq!(
            (p.node.as_str(), p.index, p.type_name.as_str()),
            (j.allocation[0].node.as_str(), held[0], "emulated")
        );
        // GPU g sits on NUMA node g, package g; the job's 2 cores are next to it.
        assert_eq!((p.numa, p.socket, p.job_cpus_local), (Some(held[0]), Some(held[0]), 2));
        // 4 PUs per GPU on the GPU node: 2 CPUs + 1 GPU x 4.
        assert_eq!(j.billing, Some(6.0));
        let c = show(&mut h, cpu);
        assert!(c.gpu_places.is_empty());
        assert_eq!(c.billing, Some(2.0));
        h.ctl.policy.fair_share_mut().config.gpu_weight = Some(24.0);
        h.ctl.policy.fair_share_mut().config.cpu_weight = 0.5;
        let acct = ClientRequest::Acct {
            limit: None,
            steps: false,
            since: None,
            until: None,
            users: vec![],
            active: true,
            with_steps: false,
        };
        let jobs = match h.call(acct, &ann()) {
            ClientResponse::Acct { jobs } => jobs,
            other => panic!("{other:?}"),
        };
        let billing: Vec<(u64, Option<f64>)> = jobs.iter().map(|j| (j.id.0, j.billing)).collect();
        assert_eq!(billing, [(gpu.0, Some(1.0 + 24.0)), (cpu.0, Some(1.0))]);
        // A queued job holds nothing: no billing.
        let big = h.submit_as(SubmitOptions { cores: Some(8), ..opts(None) }, false, &ann());
        h.ctl.schedule(h.now).unwrap();
        let b = show(&mut h, big);
        assert_eq!((b.state, b.billing), (berth_core::job::JobState::Queued, None));
    }
}
