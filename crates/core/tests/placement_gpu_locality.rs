//! GPU locality (issue 20): a node with free GPUs but no free cores next to them. `prefer`
//! (the default) gives the job cores elsewhere on the node; `strict` (`[placement]
//! gpu_locality`, a job's `--gpu-locality`, Slurm's `--gres-flags=enforce-binding`) makes it
//! wait, with a reason naming the rule, or refuses it when no GPUs of the node ever have that
//! many cores near them. On the hand-made 8-GPU machine (tests/fixtures/gpu, the agent's model
//! of `gpu8-2p4n-nvlink-quads.xml`): 2 packages x 2 NUMA nodes x 4 cores x 2 PUs, 2 GPUs per
//! NUMA node (GPUs 0,1 next to PUs 0-7, 2,3 to 8-15, 4,5 to 16-23, 6,7 to 24-31).

use berth_core::directives::{parse_script, parse_script_with};
use berth_core::job::{NodeAllocation, Shape};
use berth_core::node::NodeCapacity;
use berth_core::placement::cluster::{feasible, place, Placement};
use berth_core::placement::{GpuLocality, JobRequest, MemRequest, PlacementPolicy};
use berth_core::topology::Topology;
use berth_core::{CpuSet, NodeId};
use std::path::Path;
use std::sync::Arc;

const GIB: u64 = 1 << 30;

fn gpu8() -> NodeCapacity {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gpu/gpu8-2p4n-nvlink-quads.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let topo: Topology = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    topo.validate().unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    NodeCapacity::new(NodeId(0), "g0", Arc::new(topo))
}

fn cpus(text: &str) -> CpuSet {
    CpuSet::parse_list(text).unwrap_or_else(|e| panic!("{text}: {e:?}"))
}

/// A job's part holding `pus` and `gpus`, no memory.
fn held(node: &NodeCapacity, pus: &str, gpus: &[u32]) -> NodeAllocation {
    let cpus = cpus(pus);
    NodeAllocation {
        gres: Default::default(),
        licenses: Default::default(),
        node_id: node.id,
        node: node.name.clone(),
        cores: (cpus.len() / 2) as u32,
        cpus,
        mems: CpuSet::new(),
        memory_bytes: 0,
        numa_memory: vec![],
        exclusive_numa: CpuSet::new(),
        subnodes: vec![],
        binding: vec![],
        ranks: vec![],
        gpus: gpus.to_vec(),
    }
}

fn job(cores: u32, gpus: u32, locality: Option<GpuLocality>) -> JobRequest {
    JobRequest {
        gpus_per_node: gpus,
        gpu_locality: locality,
        gpus_per_socket: 0,
        mem: MemRequest::PerNode(GIB),
        ..JobRequest::simple(Shape::PerNode { nodes: 1, cores_per_node: cores }, 0)
    }
}

fn policy(locality: GpuLocality) -> PlacementPolicy {
    PlacementPolicy { gpu_locality: locality, ..Default::default() }
}

/// GPUs 0 and 1 free, the cores next to them (PUs 0-7) taken by a job without GPUs, GPUs 2-7
/// taken by a job on PUs 8-15: NUMA nodes 2 and 3 have free cores but no free GPU.
fn free_gpus_far_from_free_cores() -> NodeCapacity {
    let mut n = gpu8();
    n.claim(&held(&n, "0-7", &[]));
    n.claim(&held(&n, "8-15", &[2, 3, 4, 5, 6, 7]));
    assert_eq!((n.free_gpu_count, n.free_core_count), (2, 8));
    n
}

#[test]
fn prefer_takes_cores_elsewhere_on_the_node() {
    let n = free_gpus_far_from_free_cores();
    for p in [
        place(std::slice::from_ref(&n), &PlacementPolicy::default(), &job(2, 1, None)),
        place(std::slice::from_ref(&n), &policy(GpuLocality::Strict), &job(2, 1, Some(GpuLocality::Prefer))),
    ] {
        let Placement::Now(a) = p else { panic!("prefer: not placed: {p:?}") };
        assert_eq!(a[0].gpus.len(), 1);
        assert!(a[0].gpus[0] <= 1, "{:?}", a[0].gpus);
        assert!(a[0].cpus.is_subset_of(&cpus("16-31")), "remote cores: {:?}", a[0].cpus);
    }
}

#[test]
fn strict_waits_and_says_why() {
    let n = free_gpus_far_from_free_cores();
    for (what, p) in [
        ("policy", place(std::slice::from_ref(&n), &policy(GpuLocality::Strict), &job(2, 1, None))),
        ("job", place(std::slice::from_ref(&n), &PlacementPolicy::default(), &job(2, 1, Some(GpuLocality::Strict)))),
    ] {
        let Placement::Busy(reason) = p else { panic!("strict ({what}): not busy: {p:?}") };
        let reason = reason.to_string();
        assert!(reason.starts_with("GPU locality strict:"), "{what}: {reason}");
        assert!(reason.contains("node g0 has free GPUs but at most 0 free cores next to them"), "{what}: {reason}");
        assert!(reason.contains("--gpu-locality prefer"), "{what}: {reason}");
    }
    // Once the cores next to GPUs 0,1 are free, the strict job starts there.
    let mut n = n;
    n.release(&held(&n, "0-7", &[]));
    let Placement::Now(a) = place(std::slice::from_ref(&n), &policy(GpuLocality::Strict), &job(2, 1, None)) else {
        panic!("strict: not placed once local cores are free")
    };
    assert!(a[0].cpus.is_subset_of(&cpus("0-7")), "{:?}", a[0].cpus);
}

#[test]
fn strict_with_more_cores_than_any_gpus_have_near_them_never_fits() {
    let n = gpu8();
    // One GPU has 4 cores next to it: 5 can never be local.
    let req = job(5, 1, Some(GpuLocality::Strict));
    let never =
        feasible(std::slice::from_ref(&n), &PlacementPolicy::default(), &req, |_| true).unwrap_err().to_string();
    assert!(never.contains("GPU locality strict"), "{never}");
    assert!(never.contains("at most 4 cores are local to 1 of its GPUs"), "{never}");
    let p = place(std::slice::from_ref(&n), &PlacementPolicy::default(), &req);
    assert!(matches!(p, Placement::Never(_)), "{p:?}");
    // Prefer places the same job (4 local cores and 1 more).
    assert!(matches!(
        place(std::slice::from_ref(&n), &PlacementPolicy::default(), &job(5, 1, None)),
        Placement::Now(_)
    ));
}

#[test]
fn strict_spreads_the_gpus_of_a_link_group_over_numa_nodes_for_their_cores() {
    // 2 GPUs and 8 cores: no NUMA node has 8 cores, two of one link group on two NUMA nodes
    // have (GPUs 0 and 2: PUs 0-15), so strict places it with every core local.
    let n = gpu8();
    let Placement::Now(a) = place(std::slice::from_ref(&n), &policy(GpuLocality::Strict), &job(8, 2, None)) else {
        panic!("not placed")
    };
    let g = &a[0].gpus;
    let topo = &n.topology;
    assert_eq!(g.len(), 2);
    assert_eq!(topo.gpus[g[0] as usize].link_group, topo.gpus[g[1] as usize].link_group, "{g:?}");
    let mut local = CpuSet::new();
    g.iter().for_each(|&i| local.union_with(&topo.gpus[i as usize].cpus));
    assert!(a[0].cpus.is_subset_of(&local), "{:?} not next to {g:?}", a[0].cpus);
    // And 2 GPUs with 20 cores: no two GPUs have 20 cores near them.
    let p = place(std::slice::from_ref(&n), &policy(GpuLocality::Strict), &job(20, 2, None));
    let Placement::Never(m) = p else { panic!("{p:?}") };
    let m = m.to_string();
    assert!(m.contains("at most 8 cores are local to 2 of its GPUs"), "{m}");
}

#[test]
fn a_jobs_locality_comes_from_its_options() {
    let o = parse_script("#!/bin/sh\n#BERTH --gpus 1 --cores 2 --gpu-locality strict\n").unwrap();
    assert_eq!(JobRequest::from_options(&o).unwrap().gpu_locality, Some(GpuLocality::Strict));
    let slurm = |text: &str| parse_script_with(text, false).map(|(o, _)| o);
    let o = slurm("#!/bin/sh\n#SBATCH --gres=gpu:1 --gres-flags=enforce-binding\n").unwrap();
    assert_eq!(o.gpu_locality, Some(GpuLocality::Strict));
    let o = slurm("#!/bin/sh\n#SBATCH --gres=gpu:1 --gres-flags=disable-binding\n").unwrap();
    assert_eq!(o.gpu_locality, Some(GpuLocality::Prefer));
    let e = slurm("#!/bin/sh\n#SBATCH --gres=gpu:1 --gres-flags=one-task-per-sharing\n").unwrap_err();
    assert!(e.to_string().contains("enforce-binding and disable-binding are"), "{e}");
    // Without GPUs the request carries none (it means nothing there).
    let o = parse_script("#!/bin/sh\n#BERTH --cores 2 --gpu-locality strict\n").unwrap();
    assert_eq!(JobRequest::from_options(&o).unwrap().gpu_locality, None);
    let e = parse_script("#!/bin/sh\n#BERTH --gpus 1 --gpu-locality near\n").unwrap_err();
    assert!(e.to_string().contains("give strict"), "{e}");
    // The policy's setting reads from the controller config's [placement].
    let p: PlacementPolicy = serde_json::from_str(r#"{"gpu_locality": "strict"}"#).unwrap();
    assert_eq!(p.gpu_locality, GpuLocality::Strict);
    assert_eq!(PlacementPolicy::default().gpu_locality, GpuLocality::Prefer);
}
