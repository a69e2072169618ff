//! `berth-bench placement`: how long `place` takes to decide for one job on a large emulated
//! cluster (no agents, no controller: berth-core alone, on this thread).
//!
//! N nodes of 2 packages x 4 NUMA x 16 cores x 2 PUs (32 GiB per NUMA node, 256 GiB per node)
//! under a two-level fat tree (leaf switches of 32 nodes, spine groups of 16 leaves) are filled
//! to `--fill` of their cores with a seeded random mix of jobs, then each probe job is placed
//! (not claimed) `--repeats` times; between repeats a small random job is claimed and the
//! previous one released so that the state moves a little. Options: `--nodes N` (10000),
//! `--fill F` (0.7), `--repeats R` (200), `--seed S` (1), `--churn C` (1: after the fill, end
//! and replace C times as many jobs, for a fragmented steady state; 0: a freshly packed
//! cluster), `--json` (JSON lines on stdout, the text on stderr).
//!
//! `--gpus`: GPU nodes instead (issue 20): 2 packages x 4 NUMA x 16 cores x 2 PUs (128 cores,
//! 128 GiB per NUMA node) with 8 GPUs, one local to each NUMA node, the 4 of a package in one
//! link group (as `berth up --gpus-per-numa 1` emulates them); half the nodes' GPUs are named
//! `a100`, half `h100`. The fill then aims at `--fill` of the GPUs held, by a seeded mix of
//! GPU jobs of 1-8 GPUs with 2-16 cores per GPU and some jobs without GPUs (so that some nodes
//! have free GPUs but few free cores next to them), and the probes are GPU jobs.

use anyhow::{bail, Context, Result};
use berth_core::binding::BindingStrategy;
use berth_core::hierarchy::{Hierarchy, SwitchDef};
use berth_core::job::{Allocation, Shape};
use berth_core::node::NodeCapacity;
use berth_core::placement::{JobRequest, MemRequest, PlacementPolicy};
use berth_core::sched::ClusterState;
use berth_core::sched::{place, Placement};
use berth_core::topology::Topology;
use berth_core::NodeId;
use std::sync::Arc;
use std::time::{Duration, Instant};

const GIB: u64 = 1 << 30;
const LEAF: usize = 32;
const SPINE: usize = 16;

/// xorshift64*: deterministic and good enough to pick job shapes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

struct Opts {
    nodes: usize,
    fill: f64,
    repeats: usize,
    seed: u64,
    churn: f64,
    json: bool,
    gpus: bool,
}

fn parse_opts(args: &[String]) -> Result<Opts> {
    let mut o = Opts { nodes: 10_000, fill: 0.7, repeats: 200, seed: 1, churn: 1.0, json: false, gpus: false };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().with_context(|| format!("{a} wants a value"));
        match a.as_str() {
            "--nodes" => o.nodes = val()?.parse().context("--nodes")?,
            "--fill" => o.fill = val()?.parse().context("--fill")?,
            "--repeats" => o.repeats = val()?.parse().context("--repeats")?,
            "--seed" => o.seed = val()?.parse().context("--seed")?,
            "--churn" => o.churn = val()?.parse().context("--churn")?,
            "--json" => o.json = true,
            "--gpus" => o.gpus = true,
            _ => bail!(
                "usage: berth-bench placement [--nodes N] [--fill F] [--repeats R] [--seed S] [--churn C] [--gpus] [--json]"
            ),
        }
    }
    if o.nodes == 0 || o.repeats == 0 || !(0.0..1.0).contains(&o.fill) {
        bail!("--nodes and --repeats must be positive and --fill in [0, 1)");
    }
    if o.nodes > 1_000_000 || o.repeats > 1_000_000 || !(0.0..=100.0).contains(&o.churn) {
        bail!("--nodes and --repeats at most 1,000,000, --churn in [0, 100]");
    }
    Ok(o)
}

/// The GPU node of `--gpus`: 8 emulated GPUs, one per NUMA node, linked per package, named
/// by `model` (whose words are its types).
fn gpu_node(model: &str) -> Result<Topology> {
    let mut t = Topology::uniform(2, 4, 16, 2, 128 * GIB);
    t.add_emulated_gpus(1)?;
    for g in &mut t.gpus {
        (g.model, g.emulated) = (Some(model.to_string()), false);
    }
    Ok(t)
}

/// `n` nodes sharing one topology (with `--gpus`: two, by halves), located in the fat tree.
fn cluster(n: usize, gpus: bool) -> Result<ClusterState> {
    let topos = if gpus {
        [Arc::new(gpu_node("NVIDIA A100-SXM4-80GB")?), Arc::new(gpu_node("NVIDIA H100 80GB HBM3")?)]
    } else {
        let t = Arc::new(Topology::uniform(2, 4, 16, 2, 32 * GIB));
        [t.clone(), t]
    };
    let mut nodes: Vec<NodeCapacity> = (0..n)
        .map(|i| NodeCapacity::new(NodeId(i as u32), format!("n{i:05}"), topos[usize::from(i >= n / 2)].clone()))
        .collect();
    let leaves = n.div_ceil(LEAF);
    let mut defs: Vec<SwitchDef> = (0..leaves)
        .map(|l| SwitchDef {
            name: format!("leaf{l}"),
            nodes: vec![format!("n[{:05}-{:05}]", l * LEAF, ((l + 1) * LEAF).min(n) - 1)],
            switches: vec![],
        })
        .collect();
    defs.extend((0..leaves.div_ceil(SPINE)).map(|s| SwitchDef {
        name: format!("spine{s}"),
        nodes: vec![],
        switches: (s * SPINE..((s + 1) * SPINE).min(leaves)).map(|l| format!("leaf{l}")).collect(),
    }));
    Hierarchy::from_switches(&defs)?.locate_all(&mut nodes);
    Ok(ClusterState::new(nodes, PlacementPolicy::default()))
}

fn per_node(nodes: u64, cores: u64, mem: u64) -> JobRequest {
    JobRequest::simple(Shape::PerNode { nodes: nodes as u32, cores_per_node: cores as u32 }, mem)
}

/// The fill mix: 60% one node of 1-32 cores and 1-16 GiB; 30% 2-8 nodes of 8-64 cores with
/// 0.5-2 GiB per core; 10% 1-4 whole nodes with 64-240 GiB each.
fn fill_job(rng: &mut Rng) -> JobRequest {
    match rng.range(0, 99) {
        0..=59 => per_node(1, rng.range(1, 32), rng.range(1, 16) * GIB),
        60..=89 => {
            let cores = rng.range(8, 64);
            per_node(rng.range(2, 8), cores, cores * rng.range(2, 8) * GIB / 4)
        }
        _ => per_node(rng.range(1, 4), 128, rng.range(64, 240) * GIB),
    }
}

fn gpu_job(nodes: u64, gpus: u64, cores_per_gpu: u64, kind: Option<&str>) -> JobRequest {
    let mut r = per_node(nodes, gpus * cores_per_gpu, gpus * cores_per_gpu * 2 * GIB);
    r.gpus_per_node = gpus as u32;
    r.gpu_type = kind.map(str::to_string);
    r
}

/// The `--gpus` fill mix: 40% one GPU, 25% two, 15% four, 10% eight (one to four whole
/// nodes), each GPU with 2-16 cores (2 GiB a core), 20% of them of a type; 10% jobs without
/// GPUs of 1-32 cores.
fn fill_gpu_job(rng: &mut Rng) -> JobRequest {
    let kind = match rng.range(0, 9) {
        0 => Some("a100"),
        1 => Some("h100"),
        _ => None,
    };
    let per_gpu = rng.range(2, 16);
    match rng.range(0, 99) {
        0..=39 => gpu_job(1, 1, per_gpu, kind),
        40..=64 => gpu_job(1, 2, per_gpu, kind),
        65..=79 => gpu_job(1, 4, per_gpu, kind),
        80..=89 => gpu_job(rng.range(1, 4), 8, per_gpu, kind),
        _ => per_node(1, rng.range(1, 32), rng.range(1, 32) * GIB),
    }
}

/// Cores and memory in use, as fractions: (allocated cores, cores not free: allocated or idle
/// in NUMA nodes held exclusively, allocated memory).
fn usage(c: &ClusterState) -> (f64, f64, f64) {
    let sum = |f: &dyn Fn(&NodeCapacity) -> u64| c.nodes().iter().map(f).sum::<u64>() as f64;
    let cores = sum(&|n| n.topology.core_count() as u64);
    let busy = sum(&|n| ((n.topology.pu_count() - n.free_pus.len()) / n.topology.threads_per_core()) as u64);
    let not_free = sum(&|n| n.topology.core_count() as u64 - n.free_core_count as u64);
    let free_mem = sum(&|n| n.free_memory);
    (busy / cores, not_free / cores, 1.0 - free_mem / sum(&|n| n.topology.memory_bytes()))
}

/// GPUs held, as a fraction of all (0 on a cluster without GPUs).
fn gpus_held(c: &ClusterState) -> f64 {
    let all: usize = c.nodes().iter().map(|n| n.topology.gpus.len()).sum();
    let free: usize = c.nodes().iter().map(|n| n.free_gpu_count as usize).sum();
    if all == 0 {
        0.0
    } else {
        1.0 - free as f64 / all as f64
    }
}

#[derive(Default)]
struct Fill {
    jobs: usize,
    released: usize,
    refused: usize,
    seconds: f64,
}

/// Claim random jobs until `target` of the cores (with `gpus`, of the GPUs) are allocated (or
/// 5,000 in a row do not fit); then `churn` x that many times end a random job and top the
/// cluster up again, so that the free cores end up scattered as in a cluster that has been
/// running for a while.
fn fill(c: &mut ClusterState, rng: &mut Rng, target: f64, churn: f64, gpus: bool) -> Fill {
    let total: u64 =
        c.nodes().iter().map(|n| if gpus { n.topology.gpus.len() } else { n.topology.core_count() } as u64).sum();
    let goal = (total as f64 * target) as u64;
    let cores =
        |a: &Allocation| a.iter().map(|na| if gpus { na.gpus.len() } else { na.cores as usize } as u64).sum::<u64>();
    let next_job = if gpus { fill_gpu_job } else { fill_job };
    let (mut running, mut used, mut f) = (Vec::new(), 0u64, Fill::default());
    let t0 = Instant::now();
    let top_up = |c: &mut ClusterState, rng: &mut Rng, running: &mut Vec<Allocation>, used: &mut u64, f: &mut Fill| {
        let mut in_a_row = 0;
        while *used < goal && in_a_row < 5_000 {
            match place(c, &next_job(rng)) {
                Placement::Now(alloc) => {
                    (*used, f.jobs, in_a_row) = (*used + cores(&alloc), f.jobs + 1, 0);
                    c.claim(&alloc);
                    running.push(alloc);
                }
                _ => (f.refused, in_a_row) = (f.refused + 1, in_a_row + 1),
            }
        }
    };
    top_up(c, rng, &mut running, &mut used, &mut f);
    for _ in 0..(f.jobs as f64 * churn) as usize {
        let Some(alloc) = (!running.is_empty()).then(|| running.swap_remove(rng.next() as usize % running.len()))
        else {
            break;
        };
        c.release(&alloc);
        (used, f.released) = (used - cores(&alloc), f.released + 1);
        top_up(c, rng, &mut running, &mut used, &mut f);
    }
    f.seconds = t0.elapsed().as_secs_f64();
    f
}

/// The `--gpus` probes.
fn gpu_probes() -> Vec<(&'static str, JobRequest)> {
    vec![
        ("1 GPU, 8 cores", gpu_job(1, 1, 8, None)),
        ("1 GPU a100, 16 cores", gpu_job(1, 1, 16, Some("a100"))),
        ("2 GPUs, 16 cores", gpu_job(1, 2, 8, None)),
        ("2 GPUs h100, 32 cores", gpu_job(1, 2, 16, Some("h100"))),
        ("4 GPUs, 32 cores (a link group)", gpu_job(1, 4, 8, None)),
        ("8 GPUs, 64 cores (whole node)", gpu_job(1, 8, 8, None)),
        ("4 nodes x 8 GPUs", gpu_job(4, 8, 4, None)),
        ("16 nodes x 4 GPUs", gpu_job(16, 4, 4, None)),
        ("64 nodes x 2 GPUs a100", gpu_job(64, 2, 4, Some("a100"))),
    ]
}

fn probes() -> Result<Vec<(&'static str, JobRequest)>> {
    let mut per_cpu = per_node(64, 32, 0);
    per_cpu.mem = MemRequest::PerCpu(3 * GIB);
    let mut total = JobRequest::simple(Shape::Total { cores: 256, chunk: 8 }, 0);
    total.mem = MemRequest::PerCpu(GIB);
    let mut bound = per_node(8, 8, 16 * GIB);
    bound.binding = Some("linear:8".parse::<BindingStrategy>().map_err(anyhow::Error::msg)?);
    Ok(vec![
        ("1 node x 4 cores, 4G", per_node(1, 4, 4 * GIB)),
        ("1 node x 32 cores, 32G", per_node(1, 32, 32 * GIB)),
        ("4 nodes x 16 cores, 32G", per_node(4, 16, 32 * GIB)),
        ("16 nodes x 32 cores, 64G", per_node(16, 32, 64 * GIB)),
        ("64 nodes x 16 cores, 32G", per_node(64, 16, 32 * GIB)),
        ("64 nodes x 64 cores, 128G", per_node(64, 64, 128 * GIB)),
        ("256 cores total, chunk 8, 1G/cpu", total),
        ("64 nodes x 32 cores, 3G/cpu", per_cpu),
        ("8 nodes, linear:8, 16G", bound),
    ])
}

#[derive(Default)]
struct Outcome {
    times: Vec<Duration>,
    /// Wall time minus time spent waiting on the run queue (preempted by other processes).
    on_cpu: Vec<Duration>,
    preempted: usize,
    /// Answers: now, busy, never.
    answers: [usize; 3],
    nodes_used: usize,
}

/// Place `req` `repeats` times (timed), moving the state a little between repeats.
fn measure(c: &mut ClusterState, rng: &mut Rng, req: &JobRequest, repeats: usize, gpus: bool) -> Outcome {
    let mut out = Outcome::default();
    let mut nudge: Option<Allocation> = None;
    for _ in 0..repeats {
        if let Some(a) = nudge.take() {
            c.release(&a);
        }
        let nudge_job = if gpus {
            gpu_job(1, 1, rng.range(2, 8), None)
        } else {
            per_node(1, rng.range(1, 8), rng.range(1, 8) * GIB)
        };
        if let Placement::Now(a) = place(c, &nudge_job) {
            c.claim(&a);
            nudge = Some(a);
        }
        let waited = run_delay();
        let t0 = Instant::now();
        let p = place(c, req);
        let wall = t0.elapsed();
        let waited = run_delay().saturating_sub(waited);
        out.preempted += usize::from(!waited.is_zero());
        out.times.push(wall);
        out.on_cpu.push(wall.saturating_sub(waited));
        match std::hint::black_box(p) {
            Placement::Now(a) => (out.answers[0], out.nodes_used) = (out.answers[0] + 1, a.len()),
            Placement::Busy(_) => out.answers[1] += 1,
            Placement::Never(_) => out.answers[2] += 1,
        }
    }
    if let Some(a) = nudge {
        c.release(&a);
    }
    out.times.sort_unstable();
    out.on_cpu.sort_unstable();
    out
}

/// This thread's total wait on the run queue (/proc/thread-self/schedstat), zero if unknown.
fn run_delay() -> Duration {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
    Duration::from_nanos(s.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or(0))
}

/// Nodes the cached counts let through for a per-node probe (what `place` scans and sorts).
fn candidates(c: &ClusterState, req: &JobRequest) -> usize {
    let Shape::PerNode { cores_per_node, .. } = req.shape else { return 0 };
    let cores = req.binding.as_ref().and_then(|b| b.fixed_count()).unwrap_or(cores_per_node);
    let need = req.mem.on_node(cores);
    c.nodes()
        .iter()
        .filter(|n| {
            n.state.accepts_work()
                && n.free_core_count >= cores
                && n.free_memory >= need
                && n.free_gpu_count_of(req.gpu_type.as_deref()) >= req.gpus_per_node
        })
        .count()
}

/// Nearest-rank percentile of sorted durations, in microseconds.
fn pct(sorted: &[Duration], p: f64) -> f64 {
    let rank = ((p / 100.0 * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1].as_secs_f64() * 1e6
}

fn machine() -> (usize, String) {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name").map(|m| m.trim_start_matches([' ', '\t', ':']).to_string()))
        })
        .unwrap_or_else(|| "unknown".into());
    (cpus, model)
}

pub fn run(args: &[String]) -> Result<()> {
    let o = parse_opts(args)?;
    // Human-readable text goes to stderr with --json so that stdout is clean JSON lines.
    let say = |s: String| if o.json { eprintln!("{s}") } else { println!("{s}") };
    let (cpus, model) = machine();
    say(format!("machine: {cpus} CPUs (nproc), {model}; {} repeats per probe", o.repeats));
    let mut c = cluster(o.nodes, o.gpus)?;
    let mut rng = Rng(o.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let f = fill(&mut c, &mut rng, o.fill, o.churn, o.gpus);
    let held = gpus_held(&c) * 100.0;
    let (cores, not_free, mem) = usage(&c);
    let empty = c.nodes().iter().filter(|n| n.free_core_count as usize == n.topology.core_count()).count();
    let full = c.nodes().iter().filter(|n| n.free_core_count == 0).count();
    let (nodes, seed, churn, partly) = (o.nodes, o.seed, o.churn, o.nodes - empty - full);
    let (pc, pn, pm) = (cores * 100.0, not_free * 100.0, mem * 100.0);
    let shape = if o.gpus {
        "8 GPUs (one per NUMA node, linked per package; a100 on half the nodes, h100 on the other), 1 TiB"
    } else {
        "256 GiB"
    };
    say(format!(
        "cluster: {nodes} nodes x 2 packages x 4 NUMA x 16 cores x 2 PUs, {shape}; fat tree: leaves of {LEAF} \
         nodes, spines of {SPINE} leaves; {:?}",
        c.policy
    ));
    say(format!(
        "fill (seed {seed}, churn {churn}): {} jobs claimed, {} ended, {} refused, in {:.1} s; cores allocated \
         {pc:.1}%, not free (allocated or idle in exclusive NUMA nodes) {pn:.1}%; memory allocated {pm:.1}%; \
         nodes empty {empty}, partly used {partly}, without a free core {full}{}",
        f.jobs,
        f.released,
        f.refused,
        f.seconds,
        if o.gpus { format!("; GPUs held {held:.1}%") } else { String::new() }
    ));
    if o.json {
        println!(
            "{}",
            serde_json::json!({"bench": "placement-fill", "nodes": nodes, "seed": seed, "cpus": cpus,
                "cpu_model": model, "churn": churn, "jobs": f.jobs, "ended": f.released, "refused": f.refused,
                "nodes_empty": empty, "nodes_without_free_core": full, "fill_seconds": f.seconds,
                "cores_allocated": cores, "cores_not_free": not_free, "memory_allocated": mem,
                "gpus": o.gpus, "gpus_held": held / 100.0})
        );
    }
    say(format!(
        "{:<33} {:>6} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>6}",
        "probe", "cand", "p50 us", "p99 us", "max us", "preempt", "p99 cpu", "now/busy", "nodes"
    ));
    let probes = if o.gpus { gpu_probes() } else { probes()? };
    for (name, req) in probes {
        let cand = candidates(&c, &req);
        let r = measure(&mut c, &mut rng, &req, o.repeats, o.gpus);
        let (p50, p99, max) = (pct(&r.times, 50.0), pct(&r.times, 99.0), pct(&r.times, 100.0));
        let p99_cpu = pct(&r.on_cpu, 99.0);
        let [now, busy, never] = r.answers;
        let outcome = format!("{now}/{}", busy + never);
        say(format!(
            "{name:<33} {cand:>6} {p50:>8.1} {p99:>8.1} {max:>8.1} {:>8} {p99_cpu:>9.1} {outcome:>9} {:>6}",
            r.preempted, r.nodes_used
        ));
        if o.json {
            println!(
                "{}",
                serde_json::json!({"bench": "placement", "probe": name, "nodes": o.nodes, "repeats": o.repeats,
                    "gpus": o.gpus, "candidates": cand, "p50_us": p50, "p99_us": p99, "max_us": max, "preempted": r.preempted,
                    "p99_on_cpu_us": p99_cpu, "now": now, "busy": busy, "never": never,
                    "nodes_used": r.nodes_used})
            );
        }
    }
    Ok(())
}
