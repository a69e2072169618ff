use super::*;
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
