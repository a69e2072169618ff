//! `berth-bench backfill`: how long one full scheduling pass (`berth_core::sched::backfill::plan`)
//! takes over a large queue on a large, mostly full emulated cluster (berth-core alone, on this
//! thread, with the controller's machine: `ClusterState`).
//!
//! N nodes of 2 packages x 1 NUMA x 64 cores (128 cores, 2 x 128 GiB), filled to `--fill` of
//! their cores by running jobs built directly (no placement): 30% of the nodes in whole-node
//! jobs of 2-32 nodes, the others shared by one-node jobs of 1-64 cores, each node keeping a
//! random number of free cores; 1 GiB per core; remaining walltimes 1 min - 24 h, 1% overdue.
//! J pending jobs (priority order = generation order) drawn from menus of the round numbers
//! users ask for: 55% one node of 1-32 cores, 30% 2-32 nodes x 8-128 cores, 15% 64-4096 cores
//! anywhere; 0.5-2 GiB per core; walltime 10 min - 24 h; 1% held.
//!
//! Options: `--nodes N` (10000), `--jobs J` (100000), `--policy fcfs|easy|conservative` (easy),
//! `--reservations R` (max reservations per pass: 1 for easy, 100 for conservative),
//! `--budget-ms B` (the pass's time budget for reservations, as the controller's
//! `reservation_budget_ms`; none by default),
//! `--fill F` (0.95), `--repeats K` (5 passes on the same input; median reported), `--seed S`
//! (1), `--json` (one JSON line on stdout, the text on stderr). Each pass's line ends with a
//! digest of its decisions (`decisions` in JSON), to show that two builds decide alike.

use anyhow::{bail, Context, Result};
use berth_core::job::{Allocation, NodeAllocation, Shape};
use berth_core::node::NodeCapacity;
use berth_core::placement::{JobRequest, MemRequest, PlacementPolicy};
use berth_core::sched::backfill::{
    plan, plan_keeping, BackfillPolicy, Deadline, KeptPlan, PassInput, PassLimits, QueuedJob, RunningJob,
};
use berth_core::sched::{ClusterState, PendingReason};
use berth_core::topology::Topology;
use berth_core::{CpuSet, JobId, NodeId};
use std::sync::Arc;
use std::time::Instant;

const GIB: u64 = 1 << 30;
const CORES: u32 = 128;
/// Seconds between the two passes measured.
const NEXT_PASS: f64 = 300.0;

/// xorshift64*: deterministic.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
    fn pick<T: Copy>(&mut self, menu: &[T]) -> T {
        menu[self.next() as usize % menu.len()]
    }
}

struct Opts {
    nodes: usize,
    jobs: usize,
    policy: BackfillPolicy,
    reservations: Option<usize>,
    budget_ms: Option<u64>,
    fill: f64,
    repeats: usize,
    seed: u64,
    json: bool,
}

fn parse_opts(args: &[String]) -> Result<Opts> {
    let mut o = Opts {
        nodes: 10_000,
        jobs: 100_000,
        policy: BackfillPolicy::Easy,
        reservations: None,
        budget_ms: None,
        fill: 0.95,
        repeats: 5,
        seed: 1,
        json: false,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().with_context(|| format!("{a} wants a value"));
        match a.as_str() {
            "--nodes" => o.nodes = val()?.parse().context("--nodes")?,
            "--jobs" => o.jobs = val()?.parse().context("--jobs")?,
            "--policy" => {
                o.policy = match val()?.as_str() {
                    "fcfs" => BackfillPolicy::Fcfs,
                    "easy" => BackfillPolicy::Easy,
                    "conservative" => BackfillPolicy::Conservative,
                    p => bail!("--policy {p}: expected fcfs, easy or conservative"),
                }
            }
            "--reservations" => o.reservations = Some(val()?.parse().context("--reservations")?),
            "--budget-ms" => o.budget_ms = Some(val()?.parse().context("--budget-ms")?),
            "--fill" => o.fill = val()?.parse().context("--fill")?,
            "--repeats" => o.repeats = val()?.parse().context("--repeats")?,
            "--seed" => o.seed = val()?.parse().context("--seed")?,
            "--json" => o.json = true,
            _ => bail!(
                "usage: berth-bench backfill [--nodes N] [--jobs J] [--policy fcfs|easy|conservative] \
                 [--reservations R] [--budget-ms B] [--fill F] [--repeats K] [--seed S] [--json]"
            ),
        }
    }
    if o.nodes == 0 || o.repeats == 0 || !(0.0..=1.0).contains(&o.fill) {
        bail!("--nodes and --repeats must be positive and --fill in [0, 1]");
    }
    Ok(o)
}

/// `cores` consecutive cores from `first` on node `n`, with 1 GiB each.
fn part(n: &NodeCapacity, first: u32, cores: u32) -> NodeAllocation {
    let cpus = CpuSet::from_iter_u32(first..first + cores);
    NodeAllocation {
        gres: Default::default(),
        licenses: Default::default(),
        node_id: n.id,
        node: n.name.clone(),
        mems: n.topology.mems_for(&cpus),
        cpus,
        cores,
        memory_bytes: cores as u64 * GIB,
        numa_memory: vec![],
        exclusive_numa: CpuSet::new(),
        subnodes: vec![],
        binding: vec![],
        ranks: vec![],
        gpus: vec![],
    }
}

/// The cluster with its running jobs claimed.
fn cluster(o: &Opts, rng: &mut Rng) -> (ClusterState, Vec<RunningJob<Allocation>>) {
    let topo = Arc::new(Topology::uniform(2, 1, CORES / 2, 1, 128 * GIB));
    let nodes: Vec<NodeCapacity> =
        (0..o.nodes).map(|i| NodeCapacity::new(NodeId(i as u32), format!("n{i:05}"), topo.clone())).collect();
    let mut c = ClusterState::new(nodes, PlacementPolicy::default());
    let mut running = vec![];
    let mut allocs: Vec<Allocation> = vec![];
    // Free cores per shared node average (1 - fill) of the machine over the 70% shared nodes.
    let spare_max = ((1.0 - o.fill) * CORES as f64 / 0.7 * 2.0).round() as u64;
    let mut i = 0;
    while i < c.nodes().len() {
        // Jobs of 17 nodes on average starting at 2.5% of the node steps: 30% of the nodes.
        if rng.range(0, 999) < 25 {
            let k = (rng.range(2, 32) as usize).min(c.nodes().len() - i);
            allocs.push((i..i + k).map(|j| part(&c.nodes()[j], 0, CORES)).collect());
            i += k;
            continue;
        }
        let mut used = 0;
        let keep_free = rng.range(0, spare_max.min(CORES as u64)) as u32;
        while used + keep_free < CORES {
            let size = rng.pick(&[1u32, 2, 4, 8, 16, 32, 64]).min(CORES - keep_free - used);
            allocs.push(vec![part(&c.nodes()[i], used, size)]);
            used += size;
        }
        i += 1;
    }
    for (k, alloc) in allocs.into_iter().enumerate() {
        c.claim(&alloc);
        // Remaining walltime 1 min - 24 h; 1% overdue (past their expected end, still running).
        let end = if rng.range(0, 99) == 0 { -(rng.range(1, 600) as f64) } else { rng.range(60, 86_400) as f64 };
        running.push(RunningJob { id: JobId(1_000_000_000 + k as u64), alloc, end });
    }
    (c, running)
}

fn queue(o: &Opts, rng: &mut Rng) -> Vec<QueuedJob> {
    let walltimes = [600.0, 1800.0, 3600.0, 7200.0, 14_400.0, 43_200.0, 86_400.0];
    (0..o.jobs)
        .map(|k| {
            let shape = match rng.range(0, 99) {
                0..=54 => Shape::Total { cores: rng.pick(&[1, 1, 1, 2, 4, 8, 16, 24, 32]), chunk: 1 },
                55..=84 => Shape::PerNode {
                    nodes: rng.pick(&[2, 2, 4, 4, 8, 16, 32]),
                    cores_per_node: rng.pick(&[8, 16, 32, 64, 128]),
                },
                _ => Shape::Total { cores: rng.pick(&[64, 128, 256, 512, 1024, 2048, 4096]), chunk: 1 },
            };
            let mut request = JobRequest::simple(shape, 0);
            request.mem = MemRequest::PerCpu(rng.pick(&[GIB / 2, GIB, GIB, 2 * GIB]));
            QueuedJob { id: JobId(k as u64 + 1), request, walltime: rng.pick(&walltimes), held: rng.range(0, 99) == 0 }
        })
        .collect()
}

/// Time `repeats` passes on the same input; print and return the last pass's output.
/// How a measured pass plans: afresh, or as the controller does, from the plan the last pass
/// kept (`Some(None)`: none yet; the pass keeps its own, returned).
type Keeping<'a> = Option<&'a Option<KeptPlan<ClusterState>>>;

fn measure(
    o: &Opts,
    limits: &PassLimits,
    input: &PassInput<ClusterState>,
    name: &str,
    keeping: Keeping,
    say: &dyn Fn(String),
) -> Result<(berth_core::sched::backfill::PassOutput<Allocation>, Option<KeptPlan<ClusterState>>)> {
    let (running, queue) = (input.running, input.queue);
    let (mut times, mut on_cpu) = (vec![], vec![]);
    let (mut last, mut left) = (None, None);
    for _ in 0..o.repeats {
        // Each repeat starts from the same kept plan (copied outside the time measured: the
        // controller keeps its own between passes).
        let mut kept = keeping.cloned().flatten();
        let waited = run_delay();
        let t = Instant::now();
        // A fresh budget for each pass, as the controller gives.
        let deadline =
            o.budget_ms.map(|ms| Deadline::after(std::sync::Arc::new(monotonic_micros), ms.saturating_mul(1000)));
        let limits = PassLimits { deadline, ..limits.clone() };
        let out = match keeping {
            Some(_) => plan_keeping(input, &limits, &mut kept).0,
            None => plan(input, &limits),
        };
        let wall = t.elapsed().as_secs_f64();
        times.push(wall);
        on_cpu.push(wall - (run_delay() - waited));
        last = Some(out);
        left = kept;
    }
    let out = last.context("no pass ran")?;
    times.sort_by(f64::total_cmp);
    on_cpu.sort_by(f64::total_cmp);
    let (median, min, max) = (times[times.len() / 2], times[0], times[times.len() - 1]);
    let median_on_cpu = on_cpu[on_cpu.len() / 2];
    let started_cores: u64 = out.starts.iter().flat_map(|(_, a)| a).map(|na| na.cores as u64).sum();
    let count = |f: &dyn Fn(&PendingReason) -> bool| out.waiting.iter().filter(|w| f(&w.reason)).count();
    let resources = count(&|r| matches!(r, PendingReason::Resources(_)));
    let priority = count(&|r| matches!(r, PendingReason::Priority));
    let expected = out.waiting.iter().filter(|w| w.expected_start.is_some()).count();
    let decisions = digest(&out);
    if let Some(k) = &left {
        say(format!("{name}: kept {} of the last pass's reservations, made {}", k.reused(), k.reservations()));
    }
    say(format!(
        "{name}: {} running, {} queued: median {:.1} ms (on CPU {:.1} ms), min {:.1} ms, max {:.1} ms over {} \
         passes; {} started \
         ({started_cores} cores, {} backfilled), waiting: {resources} resources, {priority} priority, {expected} \
         with an expected start; decisions {decisions:016x}",
        running.len(),
        queue.len(),
        median * 1e3,
        median_on_cpu * 1e3,
        min * 1e3,
        max * 1e3,
        o.repeats,
        out.starts.len(),
        out.backfilled.len()
    ));
    if o.json {
        println!(
            "{}",
            serde_json::json!({"bench": "backfill", "pass": name, "policy": format!("{:?}", o.policy).to_lowercase(),
                "nodes": o.nodes, "jobs": queue.len(), "running": running.len(),
                "max_reservations": limits.max_reservations, "budget_ms": o.budget_ms, "seed": o.seed, "median_seconds": median, "median_on_cpu_seconds": median_on_cpu,
                "min_seconds": min, "max_seconds": max, "repeats": o.repeats, "started": out.starts.len(),
                "backfilled": out.backfilled.len(), "waiting_resources": resources, "waiting_priority": priority,
                "expected_starts": expected, "decisions": format!("{decisions:016x}")})
        );
    }
    Ok((out, left))
}

/// A digest of every decision of a pass (starts with their allocations, waiting jobs with
/// their reasons and expected starts): equal digests, same decisions (FNV-1a over their text).
fn digest(out: &berth_core::sched::backfill::PassOutput<Allocation>) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |s: String| {
        for b in s.bytes() {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
    };
    for (id, alloc) in &out.starts {
        // Fields added since the digests in BENCHMARKS.md were first recorded, and empty on
        // this GPU-less machine, are left out so that digests compare across versions.
        let text = format!("start {id} {alloc:?}\n")
            .replace(", gpus: []", "")
            .replace(", gres: {}", "")
            .replace(", licenses: {}", "");
        eat(text);
    }
    for w in &out.waiting {
        eat(format!("wait {} {} {:?}\n", w.id, reason_text(&w.reason), w.expected_start.map(f64::to_bits)));
    }
    h
}

/// A reason as the digests in BENCHMARKS.md first recorded it: its kind and words as `{:?}`
/// showed them when reasons were strings (`Resources("cores: ...")`), so that digests compare
/// across versions (the kinds reasons have had since are shown the same way).
fn reason_text(r: &PendingReason) -> String {
    match r {
        PendingReason::Resources(what) => format!("Resources({:?})", what.to_string()),
        PendingReason::Priority => "Priority".into(),
        PendingReason::Held => "Held".into(),
        PendingReason::NoSuitableNodes(why) => format!("NoSuitableNodes({:?})", why.to_string()),
        PendingReason::QueueLimit(which) => format!("QueueLimit({:?})", which.to_string()),
        other => format!("{}({:?})", other.code(), other.to_string()),
    }
}

/// Microseconds on a monotonic clock, for the pass's time budget.
fn monotonic_micros() -> u64 {
    static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    ORIGIN.get_or_init(Instant::now).elapsed().as_micros() as u64
}

/// This thread's total wait on the run queue, seconds (/proc/thread-self/schedstat; 0 if
/// unknown): subtracted from wall time, it gives the time on CPU on a loaded machine.
fn run_delay() -> f64 {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
    s.split_whitespace().nth(1).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0) / 1e9
}

pub fn run(args: &[String]) -> Result<()> {
    let o = parse_opts(args)?;
    let say = |s: String| if o.json { eprintln!("{s}") } else { println!("{s}") };
    let mut rng = Rng(o.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let t0 = Instant::now();
    let (c, running) = cluster(&o, &mut rng);
    let queue = queue(&o, &mut rng);
    let total: u64 = c.nodes().len() as u64 * CORES as u64;
    let free: u64 = c.nodes().iter().map(|n| n.free_core_count as u64).sum();
    let reservations = o.reservations.unwrap_or(if o.policy == BackfillPolicy::Conservative { 100 } else { 1 });
    let limits = PassLimits { policy: o.policy, max_reservations: reservations, deadline: None };
    say(format!(
        "{} nodes x {CORES} cores, {} running jobs, {:.1}% of cores allocated, {} pending jobs; {:?}, \
         max_reservations {reservations}; built in {:.1} s",
        o.nodes,
        running.len(),
        100.0 * (total - free) as f64 / total as f64,
        queue.len(),
        o.policy,
        t0.elapsed().as_secs_f64()
    ));
    let input = PassInput { machine: &c, running: &running, queue: &queue, now: 0.0 };
    // Conservative passes keep their plan for the next, as the controller's do.
    let keeps = o.policy == BackfillPolicy::Conservative;
    let (first, kept) = measure(&o, &limits, &input, "first pass", keeps.then_some(&None), &say)?;
    // Steady state: the first pass's starts run; NEXT_PASS seconds later the jobs expected to end
    // by then (and the overdue ones) have ended, and the rest of the queue is planned again.
    let (mut c2, mut running2) = (c.clone(), vec![]);
    let walltime: std::collections::HashMap<JobId, f64> = queue.iter().map(|j| (j.id, j.walltime)).collect();
    for (_, alloc) in &first.starts {
        c2.claim(alloc);
    }
    let started = first.starts.iter().map(|(id, a)| RunningJob { id: *id, alloc: a.clone(), end: walltime[id] });
    for r in running.iter().cloned().chain(started) {
        if r.end <= NEXT_PASS {
            c2.release(&r.alloc);
        } else {
            running2.push(r);
        }
    }
    let started: std::collections::HashSet<JobId> = first.starts.iter().map(|(id, _)| *id).collect();
    let queue2: Vec<QueuedJob> = queue.iter().filter(|j| !started.contains(&j.id)).cloned().collect();
    let input = PassInput { machine: &c2, running: &running2, queue: &queue2, now: NEXT_PASS };
    if keeps {
        measure(&o, &limits, &input, "next pass (kept plan)", Some(&kept), &say)?;
        measure(&o, &limits, &input, "next pass (planned afresh)", None, &say)?;
    } else {
        measure(&o, &limits, &input, "next pass", None, &say)?;
    }
    Ok(())
}
