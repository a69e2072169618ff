//! GPUs placed with cores (issue 20): never given twice, cores local to the job's GPUs when the
//! node has room there, a multi-GPU job inside one link group when one holds it; the reasons a
//! GPU job waits or can never run.

use crate::job::{Allocation, NodeAllocation, Shape};
use crate::node::NodeCapacity;
use crate::placement::cluster::{place, Placement};
use crate::placement::{JobRequest, PlacementPolicy};
use crate::topology::Topology;
use crate::{CpuSet, NodeId};
use proptest::prelude::*;
use std::sync::Arc;

const GIB: u64 = 1 << 30;

/// 2 packages x 2 NUMA nodes x 4 cores, 2 emulated GPUs per NUMA node (local to its PUs), the
/// 4 GPUs of a package in one link group.
fn gpu_node() -> NodeCapacity {
    let mut t = Topology::uniform(2, 2, 4, 1, 4 * GIB);
    t.add_emulated_gpus(2).expect("emulated GPUs");
    NodeCapacity::new(NodeId(0), "g0", Arc::new(t))
}

fn job(cores: u32, gpus: u32) -> JobRequest {
    JobRequest { gpus_per_node: gpus, ..JobRequest::simple(Shape::PerNode { nodes: 1, cores_per_node: cores }, 0) }
}

fn placed(nodes: &[NodeCapacity], req: &JobRequest) -> Placement {
    place(nodes, &PlacementPolicy::default(), req)
}

fn now(p: Placement) -> NodeAllocation {
    match p {
        Placement::Now(mut a) => a.remove(0),
        other => panic!("not placed: {other:?}"),
    }
}

/// The PUs local to `gpus` on `node`.
fn local(node: &NodeCapacity, gpus: &[u32]) -> CpuSet {
    let mut s = CpuSet::new();
    for &g in gpus {
        s.union_with(&node.topology.gpus[g as usize].cpus);
    }
    s
}

fn group(node: &NodeCapacity, g: u32) -> Option<u32> {
    node.topology.gpus[g as usize].link_group
}

#[test]
fn a_nodes_gpus_of_a_type_are_found_by_its_words() {
    let mut t = Topology::uniform(2, 1, 2, 1, 4 * GIB);
    t.add_emulated_gpus(2).expect("emulated GPUs");
    t.gpus[1].model = Some("NVIDIA A100-SXM4-80GB".into());
    t.gpus[1].emulated = false;
    t.gpus[2].model = Some("NVIDIA H100 80GB HBM3".into());
    t.gpus[2].emulated = false;
    let mut n = NodeCapacity::new(NodeId(0), "g0", Arc::new(t));
    n.gpu_free[1] = true;
    n.refresh();
    let of = |n: &NodeCapacity, k: &str| n.free_gpus_of(Some(k)).collect::<Vec<_>>();
    assert_eq!(of(&n, "a100"), [1]);
    assert_eq!(of(&n, "80GB"), [1, 2]);
    assert_eq!(of(&n, "emulated"), [0, 3]);
    assert_eq!(of(&n, "other"), [0, 1, 2, 3], "the vendor of no known vendor");
    assert_eq!(of(&n, "v100"), Vec::<u32>::new());
    // Held GPUs drop out; the counts agree with the GPUs' own answers.
    n.gpu_free[2] = false;
    n.refresh();
    for k in ["a100", "80gb", "emulated", "other", "hbm3", "nvidia"] {
        let by_gpu: Vec<u32> =
            n.topology.gpus.iter().filter(|g| n.gpu_free[g.index as usize] && g.is_type(k)).map(|g| g.index).collect();
        assert_eq!(of(&n, k), by_gpu, "{k}");
        assert_eq!(n.free_gpu_count_of(Some(k)) as usize, by_gpu.len(), "{k}");
    }
}

#[test]
fn gpus_and_cores_are_chosen_together() {
    let mut n = gpu_node();
    // One GPU with 2 cores: both cores local to it.
    let a = now(placed(std::slice::from_ref(&n), &job(2, 1)));
    assert_eq!(a.gpus.len(), 1);
    assert!(a.cpus.is_subset_of(&local(&n, &a.gpus)), "{a:?}");
    n.claim(&a);
    assert_eq!(n.free_gpu_count, 7);
    // Four GPUs: one link group (one package), cores local to them.
    let b = now(placed(std::slice::from_ref(&n), &job(4, 4)));
    assert_eq!(b.gpus.len(), 4);
    assert!(b.gpus.iter().all(|&g| group(&n, g) == group(&n, b.gpus[0])), "{:?}", b.gpus);
    assert!(b.cpus.is_subset_of(&local(&n, &b.gpus)), "{b:?}");
    assert!(b.gpus.iter().all(|g| !a.gpus.contains(g)));
    n.claim(&b);
    // Releasing gives the GPUs back.
    n.release(&a);
    n.release(&b);
    assert_eq!(n.free_gpu_count, 8);
    assert!(n.gpu_free.iter().all(|f| *f));
}

#[test]
fn two_gpus_keep_to_one_numa_node_of_a_link_group() {
    let n = gpu_node();
    let a = now(placed(std::slice::from_ref(&n), &job(4, 2)));
    let numa: Vec<Option<u32>> = a.gpus.iter().map(|&g| n.topology.gpus[g as usize].numa).collect();
    assert_eq!(numa[0], numa[1], "{:?}", a.gpus);
    assert!(a.cpus.is_subset_of(&local(&n, &a.gpus)));
}

#[test]
fn remote_cores_when_the_gpus_neighbours_are_busy() {
    let mut n = gpu_node();
    // Every core of NUMA node 0 taken by a CPU-only job, and the GPUs of all other NUMA
    // nodes by GPU jobs with no cores there... so only NUMA node 0's GPUs are free.
    let cpu_job = now(placed(std::slice::from_ref(&n), &job(4, 0)));
    assert!(cpu_job.gpus.is_empty());
    n.claim(&cpu_job);
    let busy_numa = n.topology.numa_nodes.iter().position(|m| cpu_job.cpus.is_subset_of(&m.cpus)).unwrap() as u32;
    let others: Vec<u32> = n.topology.gpus.iter().filter(|g| g.numa != Some(busy_numa)).map(|g| g.index).collect();
    let hold = NodeAllocation { gpus: others, ..cpu_job.clone() };
    let hold = NodeAllocation { cpus: CpuSet::new(), memory_bytes: 0, numa_memory: vec![], ..hold };
    n.claim(&hold);
    assert_eq!(n.free_gpu_count, 2);
    let a = now(placed(std::slice::from_ref(&n), &job(2, 1)));
    assert_eq!(n.topology.gpus[a.gpus[0] as usize].numa, Some(busy_numa));
    assert!(!a.cpus.is_subset_of(&local(&n, &a.gpus)), "its neighbours are busy: cores elsewhere");
    assert_eq!(a.cores, 2);
}

#[test]
fn too_many_gpus_never_fit_and_busy_gpus_wait() {
    let mut n = gpu_node();
    match placed(std::slice::from_ref(&n), &job(1, 9)) {
        Placement::Never(why) => {
            let why = why.to_string();
            assert!(why.contains("GPUs: node g0 has 8, 9 wanted"), "{why}")
        }
        other => panic!("{other:?}"),
    }
    let typed = JobRequest { gpu_type: Some("a100".into()), ..job(1, 1) };
    match placed(std::slice::from_ref(&n), &typed) {
        Placement::Never(why) => {
            let why = why.to_string();
            assert!(why.contains("GPUs of type a100") && why.contains("emulated"), "{why}")
        }
        other => panic!("{other:?}"),
    }
    let emulated = JobRequest { gpu_type: Some("Emulated".into()), ..job(1, 1) };
    assert!(matches!(placed(std::slice::from_ref(&n), &emulated), Placement::Now(_)));
    let all = now(placed(std::slice::from_ref(&n), &job(2, 8)));
    n.claim(&all);
    match placed(std::slice::from_ref(&n), &job(1, 1)) {
        Placement::Busy(why) => {
            let why = why.to_string();
            assert!(why.contains("GPUs"), "{why}")
        }
        other => panic!("{other:?}"),
    }
    // A node without GPUs never takes a GPU job; jobs without GPUs do not see GPUs.
    let plain = NodeCapacity::new(NodeId(1), "c0", Arc::new(Topology::uniform(1, 1, 4, 1, GIB)));
    assert!(matches!(placed(std::slice::from_ref(&plain), &job(1, 1)), Placement::Never(_)));
    assert!(now(placed(std::slice::from_ref(&plain), &job(1, 0))).gpus.is_empty());
}

#[test]
fn a_suspended_job_keeps_its_gpus() {
    let mut n = gpu_node();
    let a = now(placed(std::slice::from_ref(&n), &job(2, 2)));
    n.claim(&a);
    n.release_pus(&a);
    assert_eq!(n.free_gpu_count, 6, "PUs given back, GPUs kept");
    let cpus_only = crate::sched::preempt::cpus_only(&vec![a.clone()]);
    assert!(cpus_only[0].gpus.is_empty());
    n.claim_pus(&a);
    n.release(&a);
    assert_eq!(n.free_gpu_count, 8);
}

#[test]
fn allocations_without_gpus_serialize_as_before() {
    let n = gpu_node();
    let a = now(placed(std::slice::from_ref(&n), &job(1, 0)));
    assert!(!serde_json::to_string(&a).unwrap().contains("gpus"));
    let b = now(placed(std::slice::from_ref(&n), &job(1, 1)));
    let json = serde_json::to_string(&b).unwrap();
    assert!(json.contains("\"gpus\":["), "{json}");
    assert_eq!(serde_json::from_str::<NodeAllocation>(&json).unwrap(), b);
}

/// Whether some NUMA node has `g` free GPUs (of one link group when `g > 1`) and `c` free
/// cores: then the job must get cores local to its GPUs.
fn room_near_gpus(n: &NodeCapacity, c: u32, g: u32) -> bool {
    n.topology.numa_nodes.iter().enumerate().any(|(i, m)| {
        let free_gpus: Vec<&crate::gpu::Gpu> =
            n.topology.gpus.iter().filter(|x| x.numa == Some(m.os_index) && n.gpu_free[x.index as usize]).collect();
        let free_cores = n
            .topology
            .cores
            .iter()
            .filter(|core| core.numa == Some(i) && core.pus.iter().all(|&p| n.free_pus.contains(p)))
            .count() as u32;
        free_gpus.len() as u32 >= g && free_cores >= c
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Random starts and ends of GPU jobs on one node.
    #[test]
    fn gpus_are_never_given_twice_and_stay_near(ops in prop::collection::vec((0u8..4, 1u32..6, 1u32..5), 1..40)) {
        let mut n = gpu_node();
        let mut held: Vec<Allocation> = vec![];
        for (kind, cores, gpus) in ops {
            if kind == 0 && !held.is_empty() {
                let a = held.remove(cores as usize % held.len());
                n.release(&a[0]);
            } else {
                let req = job(cores, gpus);
                let near = room_near_gpus(&n, cores, gpus);
                let linked_room = gpus > 1 && n.topology.gpus.iter().any(|g| {
                    n.topology.gpus.iter().filter(|h| h.link_group.is_some() && h.link_group == g.link_group && n.gpu_free[h.index as usize]).count() as u32 >= gpus
                });
                if let Placement::Now(a) = placed(std::slice::from_ref(&n), &req) {
                    let na = &a[0];
                    prop_assert_eq!(na.gpus.len() as u32, gpus);
                    prop_assert!(na.gpus.iter().all(|&g| n.gpu_free[g as usize]), "a GPU given twice: {:?}", na.gpus);
                    if near {
                        prop_assert!(na.cpus.is_subset_of(&local(&n, &na.gpus)), "cores {} not near GPUs {:?}", na.cpus.to_list(), na.gpus);
                    }
                    if linked_room {
                        prop_assert!(na.gpus.iter().all(|&g| group(&n, g) == group(&n, na.gpus[0])), "split GPUs {:?}", na.gpus);
                    }
                    n.claim(na);
                    held.push(a);
                } else {
                    prop_assert!(!near, "room near GPUs but not placed");
                }
            }
            // The books: every GPU held by exactly one live job, the rest free.
            let mut owner = vec![0u32; n.topology.gpus.len()];
            for a in &held {
                for &g in &a[0].gpus {
                    owner[g as usize] += 1;
                }
            }
            prop_assert!(owner.iter().all(|&k| k <= 1), "{:?}", owner);
            for (g, &k) in owner.iter().enumerate() {
                prop_assert_eq!(n.gpu_free[g], k == 0);
            }
            prop_assert_eq!(n.free_gpu_count as usize, owner.iter().filter(|&&k| k == 0).count());
        }
    }
}

/// `--gpus-per-socket N --sockets-per-node S`: `S x N` GPUs a node.
fn per_socket(cores: u32, n: u32, sockets: u32) -> JobRequest {
    JobRequest { gpus_per_socket: n, ..job(cores, n * sockets) }
}

/// The package of each of `gpus`, counted: (package, GPUs there), by package.
fn by_package(node: &NodeCapacity, gpus: &[u32]) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = vec![];
    for &g in gpus {
        let p = node.topology.gpus[g as usize].package.expect("emulated GPUs have a package");
        match out.iter_mut().find(|(q, _)| *q == p) {
            Some((_, c)) => *c += 1,
            None => out.push((p, 1)),
        }
    }
    out.sort_unstable();
    out
}

/// Slurm's `--gpus-per-socket`: N GPUs on each of S sockets, never more on one, cores next to
/// them; a socket count the node cannot give is never, GPUs taken are busy.
#[test]
fn gpus_per_socket_take_n_on_each_of_s_sockets() {
    let mut n = gpu_node();
    // One GPU on each of the two sockets, the job's 2 cores next to them.
    let a = now(placed(std::slice::from_ref(&n), &per_socket(2, 1, 2)));
    assert_eq!(by_package(&n, &a.gpus), [(0, 1), (1, 1)], "{:?}", a.gpus);
    assert!(a.cpus.is_subset_of(&local(&n, &a.gpus)), "{a:?}");
    // Two on one socket: of one NUMA node (its cores local to both).
    let b = now(placed(std::slice::from_ref(&n), &per_socket(2, 2, 1)));
    assert_eq!(by_package(&n, &b.gpus).len(), 1, "{:?}", b.gpus);
    let numa: Vec<Option<u32>> = b.gpus.iter().map(|&g| n.topology.gpus[g as usize].numa).collect();
    assert_eq!(numa[0], numa[1], "{:?}", b.gpus);
    // Where a plain 2-GPU job may take GPUs anywhere, 2 per socket on 2 sockets is 4.
    let c = now(placed(std::slice::from_ref(&n), &per_socket(4, 2, 2)));
    assert_eq!(by_package(&n, &c.gpus), [(0, 2), (1, 2)]);
    // Never: no socket has 5 GPUs; the node has 2 sockets, not 3.
    for (req, words) in [(per_socket(1, 5, 1), "0 socket(s) with 5"), (per_socket(1, 1, 3), "has 2 socket(s) with 1")] {
        match placed(std::slice::from_ref(&n), &req) {
            Placement::Never(why) => {
                let why = why.to_string();
                assert!(why.contains("per socket") && why.contains(words), "{why}")
            }
            other => panic!("{other:?}"),
        }
    }
    // Busy: 3 of socket 0's GPUs and 3 of socket 1's held; 2 on one socket waits, 1 on each
    // of the two fits, on the free ones.
    let held: Vec<u32> = vec![0, 1, 2, 4, 5, 6];
    let hold =
        NodeAllocation { gpus: held.clone(), cpus: CpuSet::new(), memory_bytes: 0, numa_memory: vec![], ..a.clone() };
    n.claim(&hold);
    match placed(std::slice::from_ref(&n), &per_socket(1, 2, 1)) {
        Placement::Busy(why) => {
            let why = why.to_string();
            assert!(why.contains("per socket") && why.contains("0 socket(s)"), "{why}")
        }
        other => panic!("{other:?}"),
    }
    let d = now(placed(std::slice::from_ref(&n), &per_socket(1, 1, 2)));
    assert_eq!(d.gpus, [3, 7]);
    // A type no GPU has: never.
    let typed = JobRequest { gpu_type: Some("a100".into()), ..per_socket(1, 1, 1) };
    assert!(matches!(placed(std::slice::from_ref(&n), &typed), Placement::Never(_)));
}

/// From options: `--gpus-per-socket 2 --sockets-per-node 2` is 4 GPUs a node, 2 a socket.
#[test]
fn gpus_per_socket_from_options() {
    let o = crate::directives::SubmitOptions {
        gpus_per_socket: Some(2),
        sockets_per_node: Some(2),
        cores: Some(4),
        ..Default::default()
    };
    let r = JobRequest::from_options(&o).unwrap();
    assert_eq!((r.gpus_per_node, r.gpus_per_socket), (4, 2));
    let no_sockets = crate::directives::SubmitOptions { sockets_per_node: None, ..o.clone() };
    assert!(JobRequest::from_options(&no_sockets).unwrap_err().to_string().contains("--sockets-per-node"));
    let plain = crate::directives::SubmitOptions { gpus: Some(2), ..Default::default() };
    assert_eq!(JobRequest::from_options(&plain).unwrap().gpus_per_socket, 0);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
    /// Any per-socket job placed on a partly held node gets exactly N GPUs on each of S
    /// distinct sockets, all of them free before.
    #[test]
    fn gpus_per_socket_are_n_on_each_of_s_sockets(held in proptest::collection::vec(any::<bool>(), 8), n in 1u32..=4, s in 1u32..=2, cores in 1u32..=4) {
        let mut node = gpu_node();
        let taken: Vec<u32> = (0..8).filter(|&g| held[g as usize]).collect();
        let base = now(placed(std::slice::from_ref(&node), &job(1, 0)));
        node.claim(&NodeAllocation { gpus: taken.clone(), cpus: CpuSet::new(), memory_bytes: 0, numa_memory: vec![], ..base });
        if let Placement::Now(a) = placed(std::slice::from_ref(&node), &per_socket(cores, n, s)) {
            let per = by_package(&node, &a[0].gpus);
            prop_assert_eq!(per.len(), s as usize, "{:?}", a[0].gpus);
            prop_assert!(per.iter().all(|&(_, c)| c == n as usize), "{:?}", per);
            prop_assert!(a[0].gpus.iter().all(|g| !taken.contains(g)));
        } else {
            // Not placed: then fewer than S sockets have N free.
            let free_on = |p: usize| (0..8u32).filter(|g| !taken.contains(g) && node.topology.gpus[*g as usize].package == Some(p)).count();
            prop_assert!((0..2).filter(|&p| free_on(p) >= n as usize).count() < s as usize);
        }
    }
}
