use super::*;
use crate::gpu::GpuBind;
use crate::NodeId;

/// A job holding `cpus` (PU list) of a node named `name`.
fn node(name: &str, cpus: &str) -> NodeAllocation {
    NodeAllocation {
        gres: Default::default(),
        licenses: Default::default(),
        node_id: NodeId(0),
        node: name.into(),
        cpus: CpuSet::parse_list(cpus).unwrap(),
        cores: 0,
        mems: CpuSet::parse_list("0").unwrap(),
        memory_bytes: 0,
        numa_memory: vec![],
        exclusive_numa: CpuSet::new(),
        subnodes: vec![],
        binding: vec![],
        ranks: vec![],
        gpus: vec![],
    }
}

fn show(plan: &StepPlan) -> String {
    plan.nodes
        .iter()
        .map(|n| {
            let ranks: Vec<String> = n.ranks.iter().map(|r| format!("{}:{}", r.rank, r.cpus.to_list())).collect();
            format!("{}[{}]", n.node, ranks.join(" "))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn plan(allocs: &[NodeAllocation], topo: &Topology, in_use: &[&str], req: StepRequest) -> Result<StepPlan, StepError> {
    let topos: Vec<&Topology> = allocs.iter().map(|_| topo).collect();
    let in_use: Vec<CpuSet> = in_use.iter().map(|s| CpuSet::parse_list(s).unwrap()).collect();
    plan_step(allocs, &topos, &in_use, &req)
}

fn two_by_four() -> Topology {
    // 2 packages x 4 cores x 1 PU: PUs 0-3 on package 0, 4-7 on package 1.
    Topology::uniform(2, 1, 4, 1, 1 << 30)
}

#[test]
fn default_is_one_rank_per_allocated_core_in_block_order() {
    let t = two_by_four();
    let a = [node("n1", "0-3"), node("n2", "0-1")];
    let p = plan(&a, &t, &["", ""], StepRequest::default()).unwrap();
    assert_eq!(p.size, 6);
    assert_eq!(show(&p), "n1[0:0 1:1 2:2 3:3] n2[4:0 5:1]");
}

#[test]
fn cpus_per_task_and_tasks_per_node() {
    let t = two_by_four();
    let a = [node("n1", "0-7"), node("n2", "0-7")];
    let req = StepRequest { tasks_per_node: Some(2), cpus_per_task: Some(2), ..Default::default() };
    let p = plan(&a, &t, &["", ""], req).unwrap();
    assert_eq!(show(&p), "n1[0:0-1 1:2-3] n2[2:0-1 3:2-3]");
}

#[test]
fn striding_alternates_packages() {
    let t = two_by_four();
    let a = [node("n1", "0-7")];
    let req = StepRequest { ntasks: Some(4), binding: RankBinding::Striding, ..Default::default() };
    let p = plan(&a, &t, &[""], req).unwrap();
    assert_eq!(show(&p), "n1[0:0 1:4 2:1 3:5]");
}

#[test]
fn concurrent_steps_get_disjoint_cores_and_overclaim_is_refused() {
    let t = two_by_four();
    let a = [node("n1", "0-3")];
    let p = plan(&a, &t, &["0-1"], StepRequest { ntasks: Some(2), ..Default::default() }).unwrap();
    assert_eq!(show(&p), "n1[0:2 1:3]");
    let e = plan(&a, &t, &["0-1"], StepRequest { ntasks: Some(3), ..Default::default() }).unwrap_err();
    assert!(matches!(e, StepError::OverClaim { asked: 3, free: 2, total: 4, .. }), "{e:?}");
    assert!(e.to_string().contains("--overcommit"));
    let e = plan(&a, &t, &["0-3"], StepRequest::default()).unwrap_err();
    assert_eq!(e, StepError::NoFreeCores { total: 4 });
}

#[test]
fn overcommit_shares_the_jobs_cpus_never_others() {
    let t = two_by_four();
    let a = [node("n1", "0-1"), node("n2", "4-5")];
    let req = StepRequest { ntasks: Some(6), overcommit: true, ..Default::default() };
    let p = plan(&a, &t, &["", ""], req).unwrap();
    assert_eq!(p.size, 6);
    assert_eq!(show(&p), "n1[0:0 1:1 2:0] n2[3:4 4:5 5:4]");
    for n in &p.nodes {
        assert!(n.cpus.is_subset_of(&a[n.alloc_index].cpus));
    }
}

#[test]
fn hyperthreads_stay_with_their_core() {
    // 1 package x 2 cores x 2 PUs.
    let t = Topology::uniform(1, 1, 2, 2, 1 << 30);
    let a = [node("n1", "0-3")];
    let p = plan(&a, &t, &[""], StepRequest::default()).unwrap();
    assert_eq!(p.size, 2);
    assert_eq!(p.nodes[0].ranks[0].cpus.len(), 2);
    assert!(!p.nodes[0].ranks[0].cpus.intersects(&p.nodes[0].ranks[1].cpus));
}

#[test]
fn bad_requests_are_errors() {
    let t = two_by_four();
    let a = [node("n1", "0-3")];
    assert!(plan(&a, &t, &[""], StepRequest { ntasks: Some(0), ..Default::default() }).is_err());
    let req = StepRequest { tasks_per_node: Some(5), ..Default::default() };
    assert!(matches!(plan(&a, &t, &[""], req).unwrap_err(), StepError::NodeTooSmall { .. }));
    let req = StepRequest { ntasks: Some(3), tasks_per_node: Some(1), ..Default::default() };
    assert!(plan(&a, &t, &[""], req).unwrap_err().to_string().contains("needs 3 nodes"));
}

#[test]
fn nodes_means_nodes_as_in_srun() {
    let t = two_by_four();
    let a = [node("n1", "0-7"), node("n2", "0-7"), node("n3", "0-7")];
    // README's `berth run -n 8 -N 2`: 8 ranks over exactly 2 nodes, 4 each.
    let req = StepRequest { ntasks: Some(8), nodes: Some(2), ..Default::default() };
    let p = plan(&a, &t, &["", "", ""], req).unwrap();
    assert_eq!(show(&p), "n1[0:0 1:1 2:2 3:3] n2[4:0 5:1 6:2 7:3]");
    // Uneven: the first nodes take the extra ranks.
    let req = StepRequest { ntasks: Some(5), nodes: Some(3), ..Default::default() };
    let p = plan(&a, &t, &["", "", ""], req).unwrap();
    assert_eq!(p.nodes.iter().map(|n| n.ranks.len()).collect::<Vec<_>>(), vec![2, 2, 1]);
    // Without -n: every free core of the chosen nodes; with --ntasks-per-node: that many each.
    let p = plan(&a, &t, &["", "", ""], StepRequest { nodes: Some(1), ..Default::default() }).unwrap();
    assert_eq!(show(&p), "n1[0:0 1:1 2:2 3:3 4:4 5:5 6:6 7:7]");
    let req = StepRequest { nodes: Some(2), tasks_per_node: Some(3), ..Default::default() };
    assert_eq!(plan(&a, &t, &["", "", ""], req).unwrap().size, 6);
    // Nodes whose cores other runs hold are passed over.
    let req = StepRequest { ntasks: Some(2), nodes: Some(2), ..Default::default() };
    let p = plan(&a, &t, &["0-7", "", ""], req).unwrap();
    assert_eq!(show(&p), "n2[0:0] n3[1:0]");
    // Errors name what to change.
    let err = |req: StepRequest, in_use: &[&str]| plan(&a, &t, in_use, req).unwrap_err().to_string();
    let e = err(StepRequest { nodes: Some(4), ..Default::default() }, &["", "", ""]);
    assert!(e.contains("-N 4 asks for 4 nodes but the job has 3"), "{e}");
    let e = err(StepRequest { ntasks: Some(1), nodes: Some(2), ..Default::default() }, &["", "", ""]);
    assert!(e.contains("-n 1 ranks cannot use -N 2 nodes"), "{e}");
    let e = err(StepRequest { ntasks: Some(20), nodes: Some(2), ..Default::default() }, &["", "", ""]);
    assert!(e.contains("puts 10 rank(s) on n1, needing 10 cores, but it has 8 free"), "{e}");
    let e = err(StepRequest { ntasks: Some(3), nodes: Some(3), ..Default::default() }, &["0-7", "", ""]);
    assert!(e.contains("only 2 of the job's 3 nodes have 1 free core(s)"), "{e}");
    assert!(err(StepRequest { nodes: Some(0), ..Default::default() }, &["", "", ""]).contains("at least 1"));
    // Overcommit: ranks share the job's CPUs on the first nodes.
    let req = StepRequest { ntasks: Some(20), nodes: Some(2), overcommit: true, ..Default::default() };
    assert_eq!(plan(&a, &t, &["", "", ""], req).unwrap().size, 20);
}

/// 2 packages x 2 NUMA nodes x 2 cores (1 PU each), one emulated GPU per NUMA node: GPU g is
/// local to PUs 2g and 2g+1; GPUs 0-1 on package 0, 2-3 on package 1.
fn gpu_node() -> Topology {
    let mut t = Topology::uniform(2, 2, 2, 1, 1 << 30);
    t.add_emulated_gpus(1).unwrap();
    t
}

fn with_gpus(mut a: NodeAllocation, gpus: &[u32]) -> NodeAllocation {
    a.gpus = gpus.to_vec();
    a
}

fn gpu_plan(a: &NodeAllocation, t: &Topology, req: StepRequest, g: &StepGpus) -> Result<StepPlan, StepError> {
    plan_step_gpus(std::slice::from_ref(a), &[t], &[CpuSet::new()], &req, Some(g))
}

fn closest(per_task: u32) -> StepGpus {
    StepGpus { per_task, bind: GpuBind::Closest }
}

/// The GPUs the agent gives each rank of a planned node (`closest`, as its `gpus_of_ranks`).
fn agent_gpus(t: &Topology, a: &NodeAllocation, p: &StepPlan, g: &StepGpus) -> Vec<Vec<u32>> {
    let cpus: Vec<CpuSet> = p.nodes[0].ranks.iter().map(|r| r.cpus.clone()).collect();
    crate::gpu::rank_gpus(&t.gpus, &a.gpus, &cpus, g.per_task, &g.bind).unwrap()
}

#[test]
fn a_rank_per_gpu_gets_cores_next_to_its_gpu() {
    let t = gpu_node();
    let a = with_gpus(node("g", "0-7"), &[0, 1, 2, 3]);
    let req = StepRequest { ntasks: Some(4), ..Default::default() };
    // Without GPUs in the plan, ranks fill cores in order: 2 ranks per GPU's NUMA node.
    assert_eq!(show(&plan(std::slice::from_ref(&a), &t, &[""], req.clone()).unwrap()), "g[0:0 1:1 2:2 3:3]");
    let g = closest(1);
    let p = gpu_plan(&a, &t, req, &g).unwrap();
    assert_eq!(show(&p), "g[0:0 1:2 2:4 3:6]", "each rank on its GPU's NUMA node");
    assert_eq!(agent_gpus(&t, &a, &p, &g), [vec![0], vec![1], vec![2], vec![3]]);
    // Two cores a rank: both local.
    let req = StepRequest { ntasks: Some(4), cpus_per_task: Some(2), ..Default::default() };
    assert_eq!(show(&gpu_plan(&a, &t, req, &g).unwrap()), "g[0:0-1 1:2-3 2:4-5 3:6-7]");
    // Two GPUs a rank: a package's pair, cores on the package.
    let req = StepRequest { ntasks: Some(2), cpus_per_task: Some(2), ..Default::default() };
    let g2 = closest(2);
    let p = gpu_plan(&a, &t, req, &g2).unwrap();
    assert_eq!(show(&p), "g[0:0-1 1:4-5]");
    assert_eq!(agent_gpus(&t, &a, &p, &g2), [vec![0, 1], vec![2, 3]]);
}

#[test]
fn ranks_sharing_gpus_sit_next_to_the_one_they_share() {
    let t = gpu_node();
    // The job holds GPUs 0 and 2 (one per package) and every core: 4 ranks, 2 a GPU.
    let a = with_gpus(node("g", "0-7"), &[0, 2]);
    let g = closest(1);
    let p = gpu_plan(&a, &t, StepRequest { ntasks: Some(4), ..Default::default() }, &g).unwrap();
    assert_eq!(show(&p), "g[0:0 1:1 2:4 3:5]");
    assert_eq!(agent_gpus(&t, &a, &p, &g), [vec![0], vec![0], vec![2], vec![2]]);
    // 3 ranks over 2 GPUs: blocks of 2 and 1, each local.
    let p = gpu_plan(&a, &t, StepRequest { ntasks: Some(3), ..Default::default() }, &g).unwrap();
    assert_eq!(show(&p), "g[0:0 1:1 2:4]");
    assert_eq!(agent_gpus(&t, &a, &p, &g), [vec![0], vec![0], vec![2]]);
}

#[test]
fn ranks_without_local_cores_left_take_their_package_then_any() {
    let t = gpu_node();
    // GPUs 0 and 1, but the job's cores are PUs 0 (GPU 0's), 3 (GPU 1's) and 4 (package 1).
    let a = with_gpus(node("g", "0,3,4"), &[0, 1]);
    let g = closest(1);
    let p = gpu_plan(&a, &t, StepRequest { ntasks: Some(3), ..Default::default() }, &g).unwrap();
    // Targets: 3 ranks over 2 GPUs: GPU 0, GPU 0, GPU 1. Rank 1 finds no core left next to
    // GPU 0, takes its package's (PU 3 is GPU 1's NUMA node, package 0) before package 1's.
    assert_eq!(show(&p), "g[0:0 1:3 2:4]");
    // Nothing is given twice, every core is the job's.
    let all: Vec<u32> = p.nodes[0].ranks.iter().flat_map(|r| r.cpus.iter()).collect();
    assert_eq!(all.len(), 3);
}

#[test]
fn map_and_mask_place_ranks_next_to_the_named_gpus() {
    let t = gpu_node();
    let a = with_gpus(node("g", "0-7"), &[0, 1, 2, 3]);
    let req = StepRequest { ntasks: Some(2), ..Default::default() };
    let map = StepGpus { per_task: 1, bind: GpuBind::parse("map_gpu:3,0").unwrap() };
    let p = gpu_plan(&a, &t, req.clone(), &map).unwrap();
    assert_eq!(show(&p), "g[0:6 1:0]");
    assert_eq!(agent_gpus(&t, &a, &p, &map), [vec![3], vec![0]]);
    let mask = StepGpus { per_task: 1, bind: GpuBind::parse("mask_gpu:0xc,0x3").unwrap() };
    assert_eq!(show(&gpu_plan(&a, &t, req.clone(), &mask).unwrap()), "g[0:4 1:0]");
    // A GPU the job does not hold on the node: refused when the step is planned.
    let b = with_gpus(node("g", "0-7"), &[0, 1]);
    let err = gpu_plan(&b, &t, req.clone(), &map).unwrap_err().to_string();
    assert!(err.contains("node g") && err.contains("GPU 3") && err.contains("0,1"), "{err}");
    // `none`: laid out as without GPUs.
    let none = StepGpus { per_task: 1, bind: GpuBind::None };
    assert_eq!(show(&gpu_plan(&a, &t, req, &none).unwrap()), "g[0:0 1:1]");
}

#[test]
fn step_gpus_come_from_the_environment_then_the_request() {
    let env = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    };
    let req = StepRequest::default();
    assert_eq!(StepGpus::of_step(&req, &env(&[("HOME", "/h")])).unwrap(), None);
    let with = StepRequest { gpus_per_task: Some(2), ..Default::default() };
    assert_eq!(StepGpus::of_step(&with, &[]).unwrap(), Some(closest(2)));
    assert_eq!(StepGpus::of_step(&with, &env(&[("BERTH_GPUS_PER_TASK", "3")])).unwrap(), Some(closest(3)));
    let bind = StepGpus::of_step(&req, &env(&[("BERTH_GPU_BIND", "single:2")])).unwrap();
    assert_eq!(bind, Some(StepGpus { per_task: 1, bind: GpuBind::Single(2) }));
    assert!(StepGpus::of_step(&req, &env(&[("BERTH_GPUS_PER_TASK", "0")])).is_err());
    let err = StepGpus::of_step(&req, &env(&[("BERTH_GPU_BIND", "sockets")])).unwrap_err().to_string();
    assert!(err.contains("--gpu-bind"), "{err}");
}

/// Seeded random jobs on emulated GPU nodes (1-2 packages, 1-2 NUMA nodes each, 1-4 cores
/// a NUMA node, 1-2 GPUs on each): each step's ranks hold disjoint cores of the job, and when
/// the job's free cores next to each NUMA node's GPUs suffice for the ranks meant for them,
/// every rank's GPUs (as the agent deals them, `closest`, one a rank) are local to all its
/// cores.
#[test]
fn prop_ranks_get_cores_local_to_their_gpus_whenever_the_job_has_them() {
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let mut local_cases = 0;
    for case in 0..2000 {
        let (pk, nm, cores, per) = (1 + next(2), 1 + next(2), 1 + next(4), 1 + next(2));
        let mut t = Topology::uniform(pk as u32, nm as u32, cores as u32, 1, 1 << 30);
        t.add_emulated_gpus(per as u32).unwrap();
        let pus = t.pu_count() as u64;
        let cpus: CpuSet = (0..pus as u32).filter(|_| next(4) != 0).collect();
        let held: Vec<u32> = (0..t.gpus.len() as u32).filter(|_| next(3) != 0).collect();
        if cpus.is_empty() || held.is_empty() {
            continue;
        }
        let mut a = with_gpus(node("g", "0"), &held);
        a.cpus = cpus.clone();
        let ntasks = 1 + next(cpus.len() as u64) as u32;
        let g = closest(1);
        let req = StepRequest { ntasks: Some(ntasks), ..Default::default() };
        let p = gpu_plan(&a, &t, req, &g).unwrap_or_else(|e| panic!("case {case}: {e}"));
        let ranks = &p.nodes[0].ranks;
        assert_eq!(ranks.len() as u32, ntasks, "case {case}");
        let mut seen = CpuSet::new();
        for r in ranks {
            assert!(!r.cpus.is_empty() && r.cpus.iter().all(|c| cpus.contains(c)), "case {case}: {r:?}");
            assert!(!r.cpus.intersects(&seen), "case {case}: a core given twice: {}", show(&p));
            seen.union_with(&r.cpus);
        }
        // The ranks meant for each NUMA node's GPUs, against the job's cores there.
        let targets = g.targets(&t.gpus, &held, ntasks as usize).unwrap().unwrap();
        let room = t.numa_nodes.iter().all(|n| {
            let wanted = targets.iter().filter(|tg| t.gpus[tg[0] as usize].numa == Some(n.os_index)).count();
            wanted <= n.cpus.iter().filter(|&c| cpus.contains(c)).count()
        });
        let given = agent_gpus(&t, &a, &p, &g);
        for mine in &given {
            assert_eq!(mine.len(), 1, "case {case}");
            assert!(held.contains(&mine[0]), "case {case}");
        }
        if room {
            local_cases += 1;
            for (r, mine) in ranks.iter().zip(&given) {
                let gpu = &t.gpus[mine[0] as usize];
                assert!(
                    r.cpus.iter().all(|c| gpu.cpus.contains(c)),
                    "case {case}: rank {} on {} given GPU {} local to {} ({})",
                    r.rank,
                    r.cpus.to_list(),
                    gpu.index,
                    gpu.cpus.to_list(),
                    show(&p)
                );
            }
        }
    }
    assert!(local_cases > 200, "too few cases with room to check locality: {local_cases}");
}
