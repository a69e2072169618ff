//! Golden per-rank layouts (issue 20: "each rank gets its closest GPU(s) and a cpuset near
//! them") on the hand-made GPU machines and a real one (tests/fixtures/gpu/*.json, the agent's
//! model of `crates/agent/tests/data/hwloc/gpu4-2p-nvlink-pairs.xml`,
//! `gpu8-2p4n-nvlink-quads.xml` and `data/hwloc/32em64t-2n8c2t-pci-normalio.xml`: hwloc's
//! Supermicro export with a K40m and an AMD Radeon, both on NUMA node 1).
//!
//! Each case is a job's allocation on one node (the whole node, or what placement gives a GPU
//! job) and a step (`berth run -n R [--cpus-per-task C] --gpus-per-task N | --gpu-bind ...`):
//! the step is planned with its GPUs (`plan_step_gpus`), the agent's deal of GPUs
//! (`rank_gpus`) is applied to the ranks' cores, and each rank is one line of
//! tests/golden_gpu/steps-<machine>.txt: its PUs, its GPUs, and whether all its PUs are local
//! to them. Besides the comparison each case is checked: ranks' cores disjoint and the job's,
//! every rank's GPUs the job's, and every rank local to its GPUs when the job holds enough
//! free cores next to each GPU for the ranks meant for it.
//! `BERTH_BLESS=1` rewrites the golden files; review the diff before committing it.

use berth_core::gpu::{rank_gpus, GpuBind};
use berth_core::job::{NodeAllocation, Shape};
use berth_core::node::NodeCapacity;
use berth_core::placement::cluster::{place, Placement};
use berth_core::placement::{JobRequest, MemRequest, PlacementPolicy};
use berth_core::step::{plan_step, plan_step_gpus, StepGpus, StepRequest};
use berth_core::topology::Topology;
use berth_core::{CpuSet, NodeId};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const BLESS: &str = "BERTH_BLESS=1 cargo test -p berth-core --test step_gpu_golden";
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

/// What placement gives a job of `cores` cores and `gpus` GPUs on the empty node.
fn placed(topo: &Arc<Topology>, cores: u32, gpus: u32) -> NodeAllocation {
    let node = NodeCapacity::new(NodeId(0), "n", topo.clone());
    let req = JobRequest {
        gpus_per_node: gpus,
        ..JobRequest {
            mem: MemRequest::PerNode(GIB),
            ..JobRequest::simple(Shape::PerNode { nodes: 1, cores_per_node: cores }, 0)
        }
    };
    match place(std::slice::from_ref(&node), &PlacementPolicy::default(), &req) {
        Placement::Now(mut a) => a.remove(0),
        other => panic!("{cores} cores {gpus} GPUs not placed: {other:?}"),
    }
}

/// The whole node: every PU and GPU.
fn whole(topo: &Arc<Topology>) -> NodeAllocation {
    let mut a = placed(topo, 1, 0);
    a.cpus = topo.all_pus();
    a.cores = topo.core_count() as u32;
    a.gpus = (0..topo.gpus.len() as u32).collect();
    a
}

struct Case {
    what: String,
    alloc: NodeAllocation,
    req: StepRequest,
    gpus: StepGpus,
}

fn cases(topo: &Arc<Topology>) -> Vec<Case> {
    let g = topo.gpus.len() as u32;
    let step = |n: u32, cpt: u32| StepRequest { ntasks: Some(n), cpus_per_task: Some(cpt), ..Default::default() };
    let closest = |n: u32| StepGpus { per_task: n, bind: GpuBind::Closest };
    let bind = |b: &str| StepGpus { per_task: 1, bind: GpuBind::parse(b).unwrap() };
    let reversed: Vec<String> = (0..g).rev().map(|i| i.to_string()).collect();
    let cases = [
        ("whole node, a rank a GPU", whole(topo), step(g, 1), closest(1)),
        ("whole node, a rank a GPU, 2 cores each", whole(topo), step(g, 2), closest(1)),
        ("whole node, 2 ranks a GPU", whole(topo), step(2 * g, 1), closest(1)),
        ("whole node, 3 ranks over the GPUs (uneven)", whole(topo), step(3, 1), closest(1)),
        ("whole node, 2 GPUs a rank", whole(topo), step(g / 2, 1), closest(2)),
        ("whole node, map_gpu reversed", whole(topo), step(g, 1), bind(&format!("map_gpu:{}", reversed.join(",")))),
        ("whole node, single:2", whole(topo), step(2 * g, 1), bind("single:2")),
        ("placed 4 cores 2 GPUs, a rank a GPU", placed(topo, 4, 2), step(2, 1), closest(1)),
        ("placed 8 cores 2 GPUs, 2 ranks a GPU, 2 cores each", placed(topo, 8, 2), step(4, 2), closest(1)),
        ("placed 3 cores 2 GPUs, 3 ranks (uneven)", placed(topo, 3, 2), step(3, 1), closest(1)),
    ];
    cases.into_iter().map(|(what, alloc, req, gpus)| Case { what: what.to_string(), alloc, req, gpus }).collect()
}

fn local(t: &Topology, gpus: &[u32]) -> CpuSet {
    let mut s = CpuSet::new();
    for &g in gpus {
        s.union_with(&t.gpus[g as usize].cpus);
    }
    s
}

fn run(stem: &str) -> String {
    let topo = Arc::new(machine(stem));
    let mut out = format!("# {stem}: {} GPUs, {} cores\n", topo.gpus.len(), topo.core_count());
    for case in cases(&topo) {
        let Case { what, alloc, req, gpus } = case;
        let held: Vec<String> = alloc.gpus.iter().map(u32::to_string).collect();
        writeln!(out, "{what}: job cpus {} gpus [{}], -n {}", alloc.cpus, held.join(","), req.ntasks.unwrap_or(0))
            .unwrap();
        let topos = [&*topo];
        let empty = [CpuSet::new()];
        let plan = plan_step_gpus(std::slice::from_ref(&alloc), &topos, &empty, &req, Some(&gpus))
            .unwrap_or_else(|e| panic!("{stem}: {what}: {e}"));
        let ranks = &plan.nodes[0].ranks;
        let cpus: Vec<CpuSet> = ranks.iter().map(|r| r.cpus.clone()).collect();
        let given = rank_gpus(&topo.gpus, &alloc.gpus, &cpus, gpus.per_task, &gpus.bind).unwrap();
        // Checks whatever the golden says.
        let mut seen = CpuSet::new();
        for (r, mine) in ranks.iter().zip(&given) {
            assert!(r.cpus.is_subset_of(&alloc.cpus), "{stem}: {what}: rank {} off the job", r.rank);
            assert!(!r.cpus.intersects(&seen), "{stem}: {what}: a core given twice");
            seen.union_with(&r.cpus);
            assert!(!mine.is_empty() && mine.iter().all(|g| alloc.gpus.contains(g)), "{stem}: {what}: {mine:?}");
        }
        let targets = gpus.targets(&topo.gpus, &alloc.gpus, ranks.len()).unwrap().unwrap();
        // Room: the job's cores next to each GPU set suffice for the ranks meant for it.
        let cpt = req.cpus_per_task.unwrap_or(1) as usize;
        let mut sets: Vec<CpuSet> = targets.iter().map(|t| local(&topo, t)).collect();
        sets.sort_by_key(|s| s.to_list());
        sets.dedup();
        let room = sets.iter().all(|s| {
            let wanted = targets.iter().filter(|t| local(&topo, t) == *s).count() * cpt;
            let have =
                topo.cores.iter().filter(|c| c.pus.iter().all(|&p| s.contains(p) && alloc.cpus.contains(p))).count();
            wanted <= have
        });
        for (r, mine) in ranks.iter().zip(&given) {
            let near = r.cpus.is_subset_of(&local(&topo, mine));
            if room {
                assert!(near, "{stem}: {what}: rank {} on {} not next to GPUs {mine:?}", r.rank, r.cpus);
            }
            let mine: Vec<String> = mine.iter().map(u32::to_string).collect();
            writeln!(
                out,
                "  rank {}: cpus {} gpus [{}] {}",
                r.rank,
                r.cpus,
                mine.join(","),
                if near { "local" } else { "REMOTE" }
            )
            .unwrap();
        }
        // Beside the plain layout (cores in order), for the reader: how many ranks were far.
        let plain = plan_step(std::slice::from_ref(&alloc), &topos, &empty, &req).unwrap();
        let plain_cpus: Vec<CpuSet> = plain.nodes[0].ranks.iter().map(|r| r.cpus.clone()).collect();
        let plain_given = rank_gpus(&topo.gpus, &alloc.gpus, &plain_cpus, gpus.per_task, &gpus.bind).unwrap();
        let far = plain_cpus.iter().zip(&plain_given).filter(|(c, g)| !c.is_subset_of(&local(&topo, g))).count();
        writeln!(out, "  (in plain core order: {far} of {} ranks not local to their GPUs)", ranks.len()).unwrap();
    }
    out
}

#[test]
fn step_gpu_layouts_match_the_goldens() {
    let bless = std::env::var("BERTH_BLESS").is_ok_and(|v| v == "1");
    let dir = tests_dir().join("golden_gpu");
    let mut problems = vec![];
    for stem in ["gpu4-2p-nvlink-pairs", "gpu8-2p4n-nvlink-quads", "32em64t-2n8c2t-pci-normalio"] {
        let got = run(stem);
        let path = dir.join(format!("steps-{stem}.txt"));
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
