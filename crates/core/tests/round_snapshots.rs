//! Whole-round snapshot tests: one scheduling round (`sched::round`) on a small scene built from
//! plain values, and ALL its decisions (charges, resumes, starts, preemptions, waiting jobs with
//! their reasons and expected starts, priorities) written out as text and compared with the
//! snapshot committed under `tests/snapshots/`. A policy change shows up as a diff of those
//! files: read it, and accept it only when every changed decision is right (see
//! docs/scheduling.md, "Round snapshots").
//!
//! The rendering ([`render`]) is stable: effects (resumes, starts, preemptions) in the order the
//! round gives them, which is the order they are carried out in; waiting jobs and priorities
//! by job id; numbers without float noise.

use berth_core::job::{Allocation, NodeAllocation, NumaShare, Shape};
use berth_core::node::NodeCapacity;
use berth_core::placement::{JobRequest, MemRequest, PlacementPolicy};
use berth_core::sched::backfill::{AdvanceReservation, BackfillPolicy, PassLimits, QueuedJob, RunningJob};
use berth_core::sched::fairshare::{FairShare, FairShareConfig};
use berth_core::sched::preempt::{PreemptConfig, Preemptible, Resume, SuspendedJob};
use berth_core::sched::priority::{PriorityInput, PriorityWeights};
use berth_core::sched::queue::QueueSpec;
use berth_core::sched::reason::{PendingReason, ReservationWait};
use berth_core::sched::round::{
    round, round_keeping, JobPriority, PreemptJob, PreemptRound, PriorityRound, ResumeRule, RoundDecisions, RoundInput,
    SuspendedInput, UsageJob, UsageRound, UserKey, UserLimits,
};
use berth_core::sched::ClusterState;
use berth_core::topology::Topology;
use berth_core::{CpuSet, JobId, NodeId};
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::Arc;

const GIB: u64 = 1 << 30;

// ---------------------------------------------------------------------------------------------
// The scene: a round's input from plain values.
// ---------------------------------------------------------------------------------------------

/// A queued job and what the round's optional parts know of it.
#[derive(Clone)]
struct Job {
    queued: QueuedJob,
    submit: f64,
    account: String,
    fair_share_factor: f64,
    /// (queue name, uid), for per-user limits.
    user: Option<UserKey>,
    /// Its queue's preemption class (0: may not preempt anyone).
    class: u32,
}

impl Job {
    fn new(id: u64, shape: Shape, walltime: f64) -> Self {
        Job {
            queued: QueuedJob { id: JobId(id), request: JobRequest::simple(shape, 0), walltime, held: false },
            submit: 0.0,
            account: "default".into(),
            fair_share_factor: 1.0,
            user: None,
            class: 0,
        }
    }
    /// `cores` cores anywhere.
    fn cores(id: u64, cores: u32, walltime: f64) -> Self {
        Job::new(id, Shape::Total { cores, chunk: 1 }, walltime)
    }
    /// `nodes` nodes of `cores` cores each.
    fn nodes(id: u64, nodes: u32, cores: u32, walltime: f64) -> Self {
        Job::new(id, Shape::PerNode { nodes, cores_per_node: cores }, walltime)
    }
    fn submitted(mut self, at: f64) -> Self {
        self.submit = at;
        self
    }
    fn account(mut self, account: &str) -> Self {
        self.account = account.into();
        self
    }
    fn user(mut self, queue: &str, uid: u32) -> Self {
        self.user = Some((queue.into(), uid));
        self
    }
    fn class(mut self, class: u32) -> Self {
        self.class = class;
        self
    }
    fn held(mut self) -> Self {
        self.queued.held = true;
        self
    }
    fn mem_per_node(mut self, bytes: u64) -> Self {
        self.queued.request.mem = MemRequest::PerNode(bytes);
        self
    }
}

/// Everything a round decides from, owned; [`Scene::decide`] lends it to the round.
struct Scene {
    cluster: ClusterState,
    running: Vec<RunningJob<Allocation>>,
    jobs: Vec<Job>,
    policy: BackfillPolicy,
    weights: Option<PriorityWeights>,
    queues: BTreeMap<String, QueueSpec>,
    users_running: HashMap<UserKey, u64>,
    /// Fair-share usage so far, charged until `since`; the running jobs' accounts and rates.
    usage: Option<(FairShare, f64, Vec<UsageJob>)>,
    barred: HashMap<JobId, PendingReason>,
    suspended: Vec<SuspendedInput>,
    relocate: bool,
    /// Resume part by part (the controller's rule), every node connected.
    parts: bool,
    preempt: Option<PreemptConfig>,
    victims: Vec<Preemptible>,
    advance: Vec<AdvanceReservation<Allocation>>,
}

impl Scene {
    /// `count` identical nodes n0, n1, ... of `topology`.
    fn new(count: u32, topology: Topology) -> Self {
        let topo = Arc::new(topology);
        let nodes = (0..count).map(|i| NodeCapacity::new(NodeId(i), format!("n{i}"), topo.clone())).collect();
        Scene {
            cluster: ClusterState::new(nodes, PlacementPolicy::default()),
            running: vec![],
            jobs: vec![],
            policy: BackfillPolicy::Easy,
            weights: None,
            queues: BTreeMap::new(),
            users_running: HashMap::new(),
            usage: None,
            barred: HashMap::new(),
            suspended: vec![],
            relocate: true,
            parts: false,
            preempt: None,
            victims: vec![],
            advance: vec![],
        }
    }

    /// `count` nodes of one package (one NUMA node) of `cores` cores, one PU each, no memory.
    fn flat(count: u32, cores: u32) -> Self {
        Scene::new(count, Topology::uniform(1, 1, cores, 1, 0))
    }

    /// Job `id` running on PUs `cpus` (a kernel list, e.g. "0-3") of each node given until
    /// `end`, claimed on the machine. With preemption on, it may be suspended (score 0).
    fn run(&mut self, id: u64, parts: &[(u32, &str)], end: f64) -> &mut Self {
        let alloc = self.alloc(parts, &[]);
        self.run_alloc(id, alloc, end)
    }

    /// The same on one node, holding `numa` (NUMA node, bytes) of memory.
    fn run_mem(&mut self, id: u64, node: u32, cpus: &str, numa: &[(u32, u64)], end: f64) -> &mut Self {
        let alloc = self.alloc(&[(node, cpus)], numa);
        self.run_alloc(id, alloc, end)
    }

    fn run_alloc(&mut self, id: u64, alloc: Allocation, end: f64) -> &mut Self {
        self.cluster.claim(&alloc);
        self.victims.push(Preemptible {
            id: JobId(id),
            alloc: alloc.clone(),
            score: 0.0,
            suspended_secs: 0.0,
            start: 0.0,
        });
        self.running.push(RunningJob { id: JobId(id), alloc, end });
        self
    }

    /// Job `id` suspended on `parts` (its PUs are free for others; it holds no memory here),
    /// resuming whole, `left` seconds of walltime to run.
    fn suspended(&mut self, id: u64, parts: &[(u32, &str)], left: f64, now: f64) -> &mut Self {
        let alloc = self.alloc(parts, &[]);
        self.suspended.push(SuspendedInput::whole(SuspendedJob { id: JobId(id), alloc }, now + left, None));
        self
    }

    fn queue(&mut self, job: Job) -> &mut Self {
        self.jobs.push(job);
        self
    }

    /// Advance reservation `name` on `parts` from `start` to `end` for `members`.
    fn advance(&mut self, name: &str, parts: &[(u32, &str)], start: f64, end: f64, members: &[u64]) -> &mut Self {
        let alloc = self.alloc(parts, &[]);
        let members = members.iter().map(|&m| JobId(m)).collect();
        self.advance.push(AdvanceReservation { id: name.into(), alloc, start, end, members });
        self
    }

    /// An allocation of PUs `cpus` on each node given (memory on NUMA nodes of the first).
    fn alloc(&self, parts: &[(u32, &str)], numa: &[(u32, u64)]) -> Allocation {
        parts
            .iter()
            .enumerate()
            .map(|(i, &(node, cpus))| {
                let n = &self.cluster.nodes()[node as usize];
                let cpus = CpuSet::parse_list(cpus).expect("a test's cpu list");
                let numa_memory: Vec<NumaShare> = match i {
                    0 => numa.iter().map(|&(numa, bytes)| NumaShare { numa, bytes }).collect(),
                    _ => vec![],
                };
                NodeAllocation {
                    node_id: n.id,
                    node: n.name.clone(),
                    cores: cpus.len() as u32,
                    mems: n.topology.mems_for(&cpus),
                    memory_bytes: numa_memory.iter().map(|s| s.bytes).sum(),
                    numa_memory,
                    cpus,
                    exclusive_numa: CpuSet::new(),
                    subnodes: vec![],
                    binding: vec![],
                    ranks: vec![],
                    gpus: vec![],
                    gres: Default::default(),
                    licenses: Default::default(),
                }
            })
            .collect()
    }

    /// The round at `now`: `round`, or with advance reservations the controller's
    /// `round_keeping` (afresh: no plan kept from an earlier round).
    fn decide(&self, now: f64) -> RoundDecisions<Allocation> {
        let queue: Vec<QueuedJob> = self.jobs.iter().map(|j| j.queued.clone()).collect();
        let machine_cpus = self.cluster.nodes().iter().map(|n| n.topology.pu_count() as u64).sum();
        let prio: Vec<JobPriority> = self
            .jobs
            .iter()
            .map(|j| JobPriority {
                input: PriorityInput {
                    submit_time: j.submit,
                    cpus: j.queued.request.total_cpus(),
                    queue_factor: 0.0,
                    fair_share_factor: j.fair_share_factor,
                },
                admin: None,
            })
            .collect();
        let per_user: Vec<Option<(&QueueSpec, UserKey)>> = self
            .jobs
            .iter()
            .map(|j| j.user.as_ref().and_then(|u| self.queues.get(&u.0).map(|spec| (spec, u.clone()))))
            .collect();
        let accounts: Vec<String> = self.jobs.iter().map(|j| j.account.clone()).collect();
        let preempt_jobs: Vec<PreemptJob> = self
            .jobs
            .iter()
            .map(|j| PreemptJob { class: j.class, may_preempt: true, suspendable: true, suspended_secs: 0.0 })
            .collect();
        let input = RoundInput {
            machine: &self.cluster,
            running: &self.running,
            queue: &queue,
            priority: self.weights.as_ref().map(|weights| PriorityRound { weights, machine_cpus, jobs: &prio }),
            user_limits: (!self.queues.is_empty())
                .then_some(UserLimits { jobs: &per_user, running: &self.users_running }),
            usage: self.usage.as_ref().map(|(share, since, running)| UsageRound {
                share,
                since: *since,
                running,
                accounts: &accounts,
            }),
            barred: (!self.barred.is_empty()).then_some(&self.barred),
            suspended: &self.suspended,
            resume: match self.parts {
                true => ResumeRule::Parts { connected: &|_| true },
                false => ResumeRule::Whole { relocate: self.relocate },
            },
            preempt: self.preempt.as_ref().map(|config| PreemptRound {
                config,
                jobs: &preempt_jobs,
                victims: &self.victims,
                by_id: true,
            }),
            limits: PassLimits { policy: self.policy, max_reservations: 100, deadline: None },
            reasons: true,
            idle_unless: None,
        };
        match self.advance.is_empty() {
            true => round(&input, now),
            false => round_keeping(&input, &self.advance, &mut None, now),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The rendering: every decision, one line each.
// ---------------------------------------------------------------------------------------------

/// A number without float noise: integers as such, others to 3 decimals.
fn num(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{}", x as i64)
    } else {
        let s = format!("{x:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

fn bytes(b: u64) -> String {
    match b % GIB {
        0 => format!("{}G", b / GIB),
        _ => format!("{b}B"),
    }
}

/// `n0[cpus 0-3 numa 0 mem 0:2G]` per node, with ranks, binding and GPUs when it has them.
fn alloc_text(alloc: &Allocation) -> String {
    let parts: Vec<String> = alloc
        .iter()
        .map(|na| {
            let mut s = format!("{}[cpus {} numa {}", na.node, na.cpus, na.mems);
            if !na.numa_memory.is_empty() {
                let mem: Vec<String> =
                    na.numa_memory.iter().map(|m| format!("{}:{}", m.numa, bytes(m.bytes))).collect();
                let _ = write!(s, " mem {}", mem.join(","));
            }
            if !na.binding.is_empty() {
                let b: Vec<String> = na.binding.iter().map(|(sock, core)| format!("{sock}.{core}")).collect();
                let _ = write!(s, " bind {}", b.join(","));
            }
            if !na.gpus.is_empty() {
                let _ = write!(s, " gpus {:?}", na.gpus);
            }
            s.push(']');
            s
        })
        .collect();
    parts.join(" ")
}

/// The whole of a round's decisions as text (see the module's documentation).
fn render(d: &RoundDecisions<Allocation>) -> String {
    let mut out = String::new();
    let mut line = |s: String| {
        out.push_str(&s);
        out.push('\n');
    };
    line(format!(
        "pass: {}, planned {}, backfilled {}",
        if d.passed { "ran" } else { "skipped" },
        d.planned,
        d.backfilled
    ));
    for (account, cpu_secs) in &d.charges {
        line(format!("charge {account}: {} cpu-s", num(*cpu_secs)));
    }
    for (id, how) in &d.resumes {
        match how {
            Resume::InPlace => line(format!("resume {id} in place")),
            Resume::Relocated(a) => line(format!("resume {id} moved to {}", alloc_text(a))),
        }
    }
    for (id, why) in &d.still_suspended {
        line(format!("stay suspended {id}: {why}"));
    }
    for s in &d.starts {
        let how = if s.backfilled { " (backfilled)" } else { "" };
        line(format!("start {} on {}{how}", s.id, alloc_text(&s.alloc)));
    }
    for p in &d.preemptions {
        let victims: Vec<String> = p.victims.iter().map(|v| v.to_string()).collect();
        line(format!(
            "preempt: suspend {}, start {} on {} (was waiting: {})",
            victims.join(","),
            p.id,
            alloc_text(&p.alloc),
            p.waited.reason.code()
        ));
    }
    let mut waiting: Vec<_> = d.waiting.iter().collect();
    waiting.sort_by_key(|w| w.id);
    for w in waiting {
        let at = w.expected_start.map(|t| format!(" expected {}", num(t))).unwrap_or_default();
        line(format!("wait {} [{}]{at}: {}", w.id, w.reason.code(), w.reason));
    }
    let mut priorities: Vec<_> = d.priorities.iter().collect();
    priorities.sort_by_key(|(id, _)| *id);
    for (id, p) in priorities {
        line(format!(
            "priority {id}: {} (factors: age {}, size {}, queue {}, fair-share {})",
            num(p.total),
            num(p.age),
            num(p.size),
            num(p.queue),
            num(p.fair_share)
        ));
    }
    out
}

/// Compare with the committed snapshot `tests/snapshots/round_snapshots__<name>.snap`.
macro_rules! check {
    ($name:expr, $decisions:expr) => {
        insta::with_settings!({ prepend_module_to_snapshot => true, omit_expression => true }, {
            insta::assert_snapshot!($name, render(&$decisions));
        })
    };
}

// ---------------------------------------------------------------------------------------------
// The scenarios.
// ---------------------------------------------------------------------------------------------

/// One node of 8 cores, job 100 on cores 0-3 until t=100. Job 1 (8 cores, 50 s) is first and
/// must wait for job 100; job 2 (2 cores, 50 s) ends by t=100; job 3 (2 cores, 500 s) does not.
fn backfill_scene(policy: BackfillPolicy) -> Scene {
    let mut s = Scene::flat(1, 8);
    s.policy = policy;
    s.run(100, &[(0, "0-3")], 100.0);
    s.queue(Job::cores(1, 8, 50.0)).queue(Job::cores(2, 2, 50.0)).queue(Job::cores(3, 2, 500.0));
    s
}

/// EASY: job 1 holds a reservation at t=100; job 2 is backfilled (it ends before), job 3
/// would delay job 1 and waits without an expected start (EASY gives one to the head alone).
#[test]
fn easy_backfill_behind_a_head_reservation() {
    check!("easy", backfill_scene(BackfillPolicy::Easy).decide(0.0));
}

/// Conservative: the same starts, and every waiting job has an expected start: job 3 after
/// job 1 ends (t=150).
#[test]
fn conservative_backfill_gives_every_job_an_expected_start() {
    check!("conservative", backfill_scene(BackfillPolicy::Conservative).decide(0.0));
}

/// FCFS: nothing passes job 1, though job 2 would fit.
#[test]
fn fcfs_starts_nothing_past_the_first_waiting_job() {
    check!("fcfs", backfill_scene(BackfillPolicy::Fcfs).decide(0.0));
}

/// Priority with fair share charged by the round. One node of 4 cores, all held until t=500 by
/// job 100 of account a (4 billed CPUs since t=50, charged until t=0). At t=100 the round
/// charges a 200 CPU-seconds; a's fair-share factor drops, so job 3 of account b (submitted
/// later) goes before job 2 of account a, and gets the expected start.
#[test]
fn priority_with_fair_share_charges() {
    let mut s = Scene::flat(1, 4);
    s.run(100, &[(0, "0-3")], 500.0);
    s.queue(Job::cores(2, 4, 50.0).submitted(10.0).account("a"));
    s.queue(Job::cores(3, 4, 50.0).submitted(20.0).account("b"));
    s.weights = Some(PriorityWeights {
        age: 100.0,
        size: 0.0,
        queue: 0.0,
        fair_share: 1000.0,
        max_age_secs: 1000.0,
        favor_large: true,
    });
    let usage = vec![UsageJob { account: "a".into(), rate: 4.0, start: 50.0 }];
    s.usage = Some((FairShare::new(FairShareConfig::default()), 0.0, usage));
    check!("fair_share", s.decide(100.0));
}

/// Per-user core limits: queue "small" lets a user run 4 cores at once; uid 7 runs 2 there.
/// One node of 16 cores, all free. Job 1 (uid 7, 2 cores) starts (2+2 = 4); job 2 (uid 7,
/// 2 more) would make 6 and waits (QueueLimit), counting job 1 as started; job 3 (uid 8)
/// starts; job 4 (uid 7, in no limited queue) starts.
#[test]
fn per_user_core_limit() {
    let mut s = Scene::flat(1, 16);
    s.queues
        .insert("small".into(), QueueSpec { name: "small".into(), max_cores_per_user: Some(4), ..Default::default() });
    s.users_running.insert(("small".into(), 7), 2);
    s.queue(Job::cores(1, 2, 60.0).user("small", 7));
    s.queue(Job::cores(2, 2, 60.0).user("small", 7));
    s.queue(Job::cores(3, 2, 60.0).user("small", 8));
    s.queue(Job::cores(4, 2, 60.0).user("big", 7));
    check!("user_limit", s.decide(0.0));
}

/// Held jobs and jobs that never fit. Two nodes of 4 cores, n0 busy until t=100. Job 1 is held;
/// job 2 wants a node of 8 cores (no node has that many: NoSuitableNodes); job 3 wants 3
/// nodes (there are 2); job 4 (a node of 4 cores) starts on n1. The pass does not count it as
/// backfilled (no job before it waits for resources or priority), but its start is marked
/// backfilled (jobs before it, not held, still wait): the two rules differ, kept as they are.
#[test]
fn held_and_never_fitting_jobs() {
    let mut s = Scene::flat(2, 4);
    s.run(100, &[(0, "0-3")], 100.0);
    s.queue(Job::cores(1, 2, 10.0).held());
    s.queue(Job::nodes(2, 1, 8, 10.0));
    s.queue(Job::nodes(3, 3, 1, 10.0));
    s.queue(Job::nodes(4, 1, 4, 10.0));
    check!("held_never", s.decide(0.0));
}

/// Preemption by suspension. Two nodes of 4 cores, both full: job 100 on n0 until t=1000, job
/// 101 on n1 until t=50. Job 9 (class 1: score 1000, more than the running jobs' 0) wants a
/// node: it suspends job 100 (equal costs: the lower id first; the victims' ends do not
/// count) and starts in its place. Job 10 (class 0) cannot preempt and waits, without an
/// expected start: the pass (EASY) gave one to job 9 alone, before job 9 preempted.
#[test]
fn preemption_by_suspension() {
    let mut s = Scene::flat(2, 4);
    s.run(100, &[(0, "0-3")], 1000.0).run(101, &[(1, "0-3")], 50.0);
    s.queue(Job::nodes(9, 1, 4, 60.0).class(1)).queue(Job::nodes(10, 1, 4, 60.0));
    s.preempt = Some(PreemptConfig { enabled: true, min_run_secs_before_suspend: 0.0, ..Default::default() });
    check!("preempt", s.decide(0.0));
}

/// Resumes, before anything starts. One node of 8 cores; job 100 runs on 0-3 until t=200.
/// Job 7, suspended on 4-5, resumes in place (its PUs are free); job 8, suspended on 0-1 (now
/// job 100's), resumes moved to free cores of the same node; job 9 (4 cores) then finds only
/// 2 free and waits for job 100 (t=200). Without relocation job 8 stays suspended (its PUs are
/// job 100's; the simulator's rule gives no reason) and job 9, 2 cores short, waits for job 7
/// to end (t=100). Under the controller's rule (part by part) job 8 moves as under relocation,
/// and job 6, suspended on 0-3 as well, finds no room left and says why it stays suspended.
#[test]
fn resume_of_suspended_jobs() {
    let mut s = Scene::flat(1, 8);
    s.run(100, &[(0, "0-3")], 200.0);
    s.suspended(7, &[(0, "4-5")], 100.0, 0.0).suspended(8, &[(0, "0-1")], 300.0, 0.0);
    s.queue(Job::cores(9, 4, 60.0));
    check!("resume_relocate", s.decide(0.0));
    s.relocate = false;
    check!("resume_in_place_only", s.decide(0.0));
    s.parts = true;
    s.suspended(6, &[(0, "0-3")], 50.0, 0.0);
    check!("resume_parts", s.decide(0.0));
}

/// Advance reservations (the controller's round). Two nodes of 4 cores, all free at t=0;
/// window r1 on n1 from t=100 to t=1000 for job 5. Job 5 (a member) waits for its window;
/// job 6 asks for reservation r2, which starts later (barred, Reservation); job 7 (a node, 500
/// s) would run into r1 on n1, so it starts on n0; job 8 (a node, 50 s) ends before r1 opens
/// and starts on n1; job 9 (a node, 500 s) has neither and waits, expected when job 7 ends
/// (t=500). Jobs 7 and 8 are marked backfilled (job 5 before them waits), which the pass's
/// count (0) does not count: see `held_and_never_fitting_jobs`.
#[test]
fn advance_reservations() {
    let mut s = Scene::flat(2, 4);
    s.advance("r1", &[(1, "0-3")], 100.0, 1000.0, &[5]);
    s.queue(Job::nodes(5, 1, 4, 200.0));
    s.queue(Job::nodes(6, 1, 1, 200.0));
    s.queue(Job::nodes(7, 1, 4, 500.0));
    s.queue(Job::nodes(8, 1, 4, 50.0));
    s.queue(Job::nodes(9, 1, 4, 500.0));
    s.barred.insert(
        JobId(6),
        PendingReason::Reservation(ReservationWait::Starts { name: "r2".into(), at: "2026-11-27T06:00".into() }),
    );
    check!("advance", s.decide(0.0));
}

/// Expected starts of a queue deeper than the machine, conservative: four nodes of 2 cores,
/// each busy until a different time; every job gets the earliest time its nodes are free.
#[test]
fn expected_starts_of_a_deep_queue() {
    let mut s = Scene::flat(4, 2);
    s.policy = BackfillPolicy::Conservative;
    s.run(100, &[(0, "0-1")], 10.0).run(101, &[(1, "0-1")], 20.0).run(102, &[(2, "0-1")], 30.0);
    s.run(103, &[(3, "0-1")], 40.0);
    s.queue(Job::nodes(1, 2, 2, 100.0)); // two nodes: n0 and n1 at t=20
    s.queue(Job::nodes(2, 1, 2, 15.0)); // n2 at 30 (n0 is free from 10 to 20 only)
    s.queue(Job::nodes(3, 4, 2, 10.0)); // all four once job 1 ends: t=120
    s.queue(Job::cores(4, 2, 5.0)); // n0 at 10, in the gap before job 1 (10 to 15)
    check!("expected_starts", s.decide(0.0));
}

/// NUMA placement on a small synthetic node: 2 packages of one NUMA node each, 4 cores of 2
/// PUs each (PUs 0-7 on NUMA 0, 8-15 on NUMA 1), 8 GiB per NUMA node. Job 100 holds 2 cores of
/// NUMA 0 (PUs 0-3) and 6 GiB there: NUMA 0 has 2 cores and 2 GiB free, NUMA 1 all. Job 1
/// (2 cores, 1 GiB) is packed on NUMA 0's two free cores, which leaves NUMA 1 whole for job 2
/// (4 cores, 4 GiB), which fits nowhere else without straddling.
#[test]
fn numa_placement_on_a_small_node() {
    let mut s = Scene::new(1, Topology::uniform(2, 1, 4, 2, 8 * GIB));
    s.run_mem(100, 0, "0-3", &[(0, 6 * GIB)], 100.0);
    s.queue(Job::cores(1, 2, 60.0).mem_per_node(GIB));
    s.queue(Job::cores(2, 4, 60.0).mem_per_node(4 * GIB));
    check!("numa", s.decide(0.0));
}
