//! Golden GPU placements (issue 20) on the hand-made GPU machines: the agent's model of
//! `crates/agent/tests/data/hwloc/gpu4-2p-nvlink-pairs.xml` and `gpu8-2p4n-nvlink-quads.xml`
//! (tests/fixtures/gpu/*.json, checked against the XML by the agent's `gpu_fixtures_match_xml`).
//!
//! A fixed script of GPU and CPU-only jobs is placed one after another on one node, each
//! success claimed, some ended; every step is one line of tests/golden_gpu/<machine>.txt.
//! Besides the comparison, each step is checked: no GPU given twice, a multi-GPU job inside
//! one link group when one had room, cores local to the GPUs when their NUMA node had room.
//! `BERTH_BLESS=1` rewrites the golden files; review the diff before committing it.

use berth_core::job::{NodeAllocation, Shape};
use berth_core::node::NodeCapacity;
use berth_core::placement::cluster::{place, Placement};
use berth_core::placement::{JobRequest, MemRequest, PlacementPolicy};
use berth_core::topology::Topology;
use berth_core::{CpuSet, NodeId};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const BLESS: &str = "BERTH_BLESS=1 cargo test -p berth-core --test placement_gpu_golden";
const GIB: u64 = 1 << 30;

fn tests_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests")
}

fn machine(stem: &str) -> Topology {
    let path = tests_dir().join(format!("fixtures/gpu/{stem}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let topo: Topology = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    topo.validate().unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    topo
}

#[allow(clippy::large_enum_variant)] // a test script, a few steps
enum Step {
    Run(&'static str, JobRequest),
    /// End the job started at this step (0-based index of the script).
    End(usize),
}

fn gpus(cores: u32, gpus: u32) -> JobRequest {
    JobRequest {
        gpus_per_node: gpus,
        ..JobRequest {
            mem: MemRequest::PerNode(GIB),
            ..JobRequest::simple(Shape::PerNode { nodes: 1, cores_per_node: cores }, 0)
        }
    }
}

fn script(t: &Topology) -> Vec<Step> {
    let all = t.gpus.len() as u32;
    let numa_cores = t.core_count() as u32 / t.numa_nodes.len() as u32;
    vec![
        Step::Run("1 GPU, 2 cores", gpus(2, 1)),
        Step::Run("2 GPUs, 4 cores: one link group", gpus(4, 2)),
        Step::Run("1 GPU, 1 core", gpus(1, 1)),
        Step::Run("CPU only, 2 cores", gpus(2, 0)),
        Step::Run("all GPUs: busy", gpus(1, all)),
        Step::Run("more GPUs than the node has: never", gpus(1, all + 1)),
        Step::Run("type a100-sxm4-80gb", JobRequest { gpu_type: Some("a100-sxm4-80gb".into()), ..gpus(1, 1) }),
        Step::End(1),
        Step::Run("2 GPUs again after the end", gpus(2, 2)),
        Step::Run("cores of a whole NUMA node beside 1 GPU", gpus(numa_cores, 1)),
        Step::End(0),
        Step::End(2),
        Step::Run("what is left of the GPUs, 1 core", gpus(1, 1)),
    ]
}

fn label(r: &JobRequest) -> String {
    let Shape::PerNode { cores_per_node, .. } = r.shape else { unreachable!("one node") };
    let mut s = format!("{cores_per_node} cores {} gpus", r.gpus_per_node);
    if let Some(t) = &r.gpu_type {
        write!(s, " type {t}").unwrap();
    }
    s
}

fn local(t: &Topology, gpus: &[u32]) -> CpuSet {
    let mut s = CpuSet::new();
    for &g in gpus {
        s.union_with(&t.gpus[g as usize].cpus);
    }
    s
}

/// The checks every step must pass, whatever the golden says.
fn check(n: &NodeCapacity, req: &JobRequest, a: &NodeAllocation) {
    let t = &n.topology;
    assert_eq!(a.gpus.len() as u32, req.gpus_per_node);
    assert!(a.gpus.iter().all(|&g| n.gpu_free[g as usize]), "a GPU given twice: {:?}", a.gpus);
    let want = req.gpus_per_node as usize;
    let linked_room = want > 1
        && t.gpus.iter().any(|g| {
            g.link_group.is_some()
                && t.gpus.iter().filter(|h| h.link_group == g.link_group && n.gpu_free[h.index as usize]).count()
                    >= want
        });
    if linked_room {
        let g0 = t.gpus[a.gpus[0] as usize].link_group;
        assert!(a.gpus.iter().all(|&g| t.gpus[g as usize].link_group == g0), "split GPUs {:?}", a.gpus);
    }
    if want > 0 {
        let near = local(t, &a.gpus);
        let free_near =
            t.cores.iter().filter(|c| c.pus.iter().all(|&p| near.contains(p) && n.free_pus.contains(p))).count();
        if free_near >= a.cores as usize {
            assert!(a.cpus.is_subset_of(&near), "cores {} not near GPUs {:?}", a.cpus, a.gpus);
        }
    }
}

fn run(stem: &str) -> String {
    let topo = Arc::new(machine(stem));
    let mut node = NodeCapacity::new(NodeId(0), stem, topo.clone());
    let policy = PlacementPolicy::default();
    let mut out = format!("# {stem}: {} GPUs\n", topo.gpus.len());
    let mut held: Vec<Option<NodeAllocation>> = vec![];
    for (i, step) in script(&topo).into_iter().enumerate() {
        match step {
            Step::Run(what, req) => {
                let line = match place(std::slice::from_ref(&node), &policy, &req) {
                    Placement::Now(mut a) => {
                        let a = a.remove(0);
                        check(&node, &req, &a);
                        node.claim(&a);
                        let gpus: Vec<String> = a.gpus.iter().map(u32::to_string).collect();
                        let line = format!("gpus [{}] cpus {} mems {}", gpus.join(","), a.cpus, a.mems);
                        held.push(Some(a));
                        line
                    }
                    Placement::Busy(why) => {
                        held.push(None);
                        format!("busy: {why}")
                    }
                    Placement::Never(why) => {
                        held.push(None);
                        format!("never: {why}")
                    }
                };
                writeln!(out, "{i:2} {what} ({}): {line}", label(&req)).unwrap();
            }
            Step::End(k) => {
                held.push(None);
                match held[k].take() {
                    Some(a) => {
                        node.release(&a);
                        writeln!(out, "{i:2} end step {k}").unwrap();
                    }
                    None => writeln!(out, "{i:2} end step {k}: it did not run").unwrap(),
                }
            }
        }
    }
    writeln!(out, "free GPUs at the end: {}", node.free_gpu_count).unwrap();
    out
}

#[test]
fn gpu_placements_match_the_goldens() {
    let bless = std::env::var("BERTH_BLESS").is_ok_and(|v| v == "1");
    let dir = tests_dir().join("golden_gpu");
    let mut problems = vec![];
    for stem in ["gpu4-2p-nvlink-pairs", "gpu8-2p4n-nvlink-quads"] {
        let got = run(stem);
        let path = dir.join(format!("{stem}.txt"));
        if bless {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, &got).unwrap();
            continue;
        }
        match std::fs::read_to_string(&path) {
            Ok(want) if want == got => {}
            Ok(want) => problems.push(format!("{}:\n--- want\n{want}--- got\n{got}", path.display())),
            Err(e) => problems.push(format!("{}: {e}", path.display())),
        }
    }
    assert!(problems.is_empty(), "{}\nif the change is intended, run `{BLESS}`", problems.join("\n"));
}
