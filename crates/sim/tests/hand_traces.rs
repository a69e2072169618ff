//! Tiny hand-made traces whose outcome is worked out by hand in the comments.

use berth_core::sched::backfill::BackfillPolicy::{self, Conservative, Easy, Fcfs};
use berth_sim::{simulate_text, EstimateSource, MachineSpec, SimConfig, SimError, SimResult};

/// An SWF job line: id, submit, run time, processors, requested time (-1: none), group.
fn job(id: u32, submit: f64, run: f64, procs: i64, requested: f64, group: i64) -> String {
    format!("{id} {submit} -1 {run} {procs} -1 -1 {procs} {requested} -1 1 1 {group} -1 1 -1 -1 -1\n")
}

fn run(trace: &str, policy: BackfillPolicy) -> SimResult {
    simulate_text(trace, &SimConfig { policy, ..SimConfig::default() }).unwrap()
}

fn starts(r: &SimResult) -> Vec<f64> {
    r.jobs.iter().map(|j| j.start).collect()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

/// 2 processors. A (1 proc, 100 s) at 0; B (2 procs, 100 s) at 1; C (1 proc, 50 s) at 2.
/// FCFS: C waits behind B: A 0-100, B 100-200, C 200-250.
/// EASY: C fits beside A and ends (52) before B's reservation (100): C 2-52.
fn two_procs() -> String {
    format!(
        "; MaxProcs: 2\n{}{}{}",
        job(1, 0.0, 100.0, 1, 100.0, 1),
        job(2, 1.0, 100.0, 2, 100.0, 1),
        job(3, 2.0, 50.0, 1, 50.0, 1)
    )
}

#[test]
fn fcfs_on_two_procs() {
    let r = run(&two_procs(), Fcfs);
    assert_eq!(starts(&r), vec![0.0, 100.0, 200.0]);
    let m = &r.report;
    assert_eq!((m.jobs, m.machine_procs, m.backfilled), (3, 2, 0));
    // waits 0, 99, 198; work 100 + 200 + 50 = 350 over 2 procs x 250 s.
    assert!(close(m.mean_wait, 99.0) && close(m.median_wait, 99.0), "{m:?}");
    assert!(close(m.makespan, 250.0) && close(m.utilization, 0.7), "{m:?}");
    // bsld 1, 199/100, 248/50.
    assert!(close(m.mean_bsld, (1.0 + 1.99 + 4.96) / 3.0), "{m:?}");
}

#[test]
fn easy_backfills_the_short_job() {
    let r = run(&two_procs(), Easy);
    assert_eq!(starts(&r), vec![0.0, 100.0, 2.0]);
    let m = &r.report;
    assert_eq!(m.backfilled, 1);
    assert_eq!(r.jobs.iter().map(|j| j.backfilled).collect::<Vec<_>>(), vec![false, false, true]);
    assert!(close(m.mean_wait, 33.0) && close(m.median_wait, 0.0), "{m:?}");
    assert!(close(m.makespan, 200.0) && close(m.utilization, 0.875), "{m:?}");
    assert!(close(m.mean_bsld, (1.0 + 1.99 + 1.0) / 3.0), "{m:?}");
}

#[test]
fn estimates_decide_backfill() {
    // C asks for 150 s: with that estimate it would end after B's reservation, so EASY keeps
    // it waiting; with run-time estimates (50 s) it backfills.
    let trace = format!(
        "; MaxProcs: 2\n{}{}{}",
        job(1, 0.0, 100.0, 1, 100.0, 1),
        job(2, 1.0, 100.0, 2, 100.0, 1),
        job(3, 2.0, 50.0, 1, 150.0, 1)
    );
    let requested = run(&trace, Easy);
    assert_eq!(starts(&requested), vec![0.0, 100.0, 200.0]);
    assert_eq!(requested.jobs[2].estimate, 150.0);
    let config = SimConfig { policy: Easy, estimate: EstimateSource::Runtime, ..SimConfig::default() };
    let runtime = simulate_text(&trace, &config).unwrap();
    assert_eq!(starts(&runtime), vec![0.0, 100.0, 2.0]);
}

/// 4 processors. A (3 procs, 100 s) at 0; B (2 procs, 100 s) at 1; C (4 procs, 100 s) at 2;
/// D (1 proc, 1000 s) at 3.
/// EASY protects only B (reserved at 100, 2 procs spare then): D starts at 3, so C, which
/// needs all 4, waits for D: C 1003-1103.
/// Conservative also reserves C (200-300), which D would overlap: D waits until 300.
fn four_procs() -> String {
    format!(
        "; MaxProcs: 4\n{}{}{}{}",
        job(1, 0.0, 100.0, 3, 100.0, 1),
        job(2, 1.0, 100.0, 2, 100.0, 1),
        job(3, 2.0, 100.0, 4, 100.0, 1),
        job(4, 3.0, 1000.0, 1, 1000.0, 1)
    )
}

#[test]
fn easy_and_conservative_differ() {
    let easy = run(&four_procs(), Easy);
    assert_eq!(starts(&easy), vec![0.0, 100.0, 1003.0, 3.0]);
    let m = &easy.report;
    assert!(close(m.mean_wait, 275.0) && close(m.median_wait, 49.5), "{m:?}");
    assert!(close(m.makespan, 1103.0) && close(m.utilization, 1900.0 / (4.0 * 1103.0)), "{m:?}");
    assert!(close(m.mean_bsld, (1.0 + 1.99 + 11.01 + 1.0) / 4.0), "{m:?}");

    let cons = run(&four_procs(), Conservative);
    assert_eq!(starts(&cons), vec![0.0, 100.0, 200.0, 300.0]);
    let m = &cons.report;
    assert!(close(m.mean_wait, 148.5) && close(m.median_wait, 148.5), "{m:?}");
    assert!(close(m.makespan, 1300.0) && close(m.mean_bsld, (1.0 + 1.99 + 2.98 + 1.297) / 4.0), "{m:?}");
    // Strict order gives the same schedule here.
    assert_eq!(starts(&run(&four_procs(), Fcfs)), vec![0.0, 100.0, 200.0, 300.0]);
}

#[test]
fn skipped_jobs_are_counted() {
    let trace = format!(
        "; MaxProcs: 2\n{}{}{}{}{}",
        job(1, 0.0, 10.0, 1, -1.0, 1),
        job(2, 0.0, 10.0, 3, -1.0, 1),  // larger than the machine
        job(3, 0.0, -1.0, 1, -1.0, 1),  // no run time
        job(4, 0.0, 0.0, 1, -1.0, 1),   // zero run time
        job(5, 0.0, 10.0, -1, -1.0, 1)  // no processors
    );
    let r = run(&trace, Fcfs).report;
    assert_eq!((r.jobs, r.skipped_too_large, r.skipped_no_runtime, r.skipped_no_procs), (1, 1, 2, 1));
}

#[test]
fn machine_size_falls_back_to_max_nodes_then_the_largest_job() {
    let line = job(1, 0.0, 10.0, 3, -1.0, 1);
    assert_eq!(run(&format!("; MaxNodes: 8\n{line}"), Fcfs).report.machine_procs, 8);
    let r = run(&format!("; MaxProcs: 16\n; MaxNodes: 8\n{line}"), Fcfs).report;
    assert_eq!(r.machine_procs, 16);
    let r = run(&line, Fcfs).report;
    assert_eq!(r.machine_procs, 3);
    assert!(r.machine.contains("largest job"), "{}", r.machine);
}

#[test]
fn unsorted_submissions_are_replayed_in_time_order() {
    let trace = format!("; MaxProcs: 1\n{}{}", job(9, 50.0, 10.0, 1, -1.0, 1), job(3, 0.0, 100.0, 1, -1.0, 1));
    let r = run(&trace, Fcfs);
    assert_eq!(r.jobs.iter().map(|j| (j.id, j.start)).collect::<Vec<_>>(), vec![(3, 0.0), (9, 100.0)]);
}

/// 1 processor; group 1 submits X (0) and Y (1), group 2 submits Z (2), 100 s each. In
/// submit order Y runs second; with fair share group 2 has used nothing when X ends, so Z
/// overtakes Y.
#[test]
fn fair_share_lets_the_idle_group_first() {
    let trace = format!(
        "; MaxProcs: 1\n{}{}{}",
        job(1, 0.0, 100.0, 1, -1.0, 1),
        job(2, 1.0, 100.0, 1, -1.0, 1),
        job(3, 2.0, 100.0, 1, -1.0, 2)
    );
    assert_eq!(starts(&run(&trace, Fcfs)), vec![0.0, 100.0, 200.0]);
    let config = SimConfig { policy: Fcfs, fair_share: true, ..SimConfig::default() };
    let r = simulate_text(&trace, &config).unwrap();
    assert_eq!(starts(&r), vec![0.0, 200.0, 100.0]);
    assert!(r.report.fair_share);
}

#[test]
fn topology_machine_runs_the_trace() {
    let config = SimConfig {
        policy: Easy,
        machine: MachineSpec::Topology { nodes: 1, spec: "package:1 numa:1 core:2 pu:1".into() },
        ..SimConfig::default()
    };
    let r = simulate_text(&two_procs(), &config).unwrap();
    assert_eq!(r.report.machine_procs, 2);
    assert_eq!(starts(&r), vec![0.0, 100.0, 2.0]);
    let bad = SimConfig { machine: MachineSpec::Topology { nodes: 1, spec: "cache:2".into() }, ..config };
    assert!(matches!(simulate_text(&two_procs(), &bad), Err(SimError::BadTopology { .. })));
}

#[test]
fn pool_of_multi_core_nodes() {
    let config =
        SimConfig { policy: Fcfs, machine: MachineSpec::Pool { nodes: 1, cores_per_node: 2 }, ..SimConfig::default() };
    let r = simulate_text(&two_procs(), &config).unwrap();
    assert_eq!(starts(&r), vec![0.0, 100.0, 200.0]);
}

#[test]
fn same_input_same_output() {
    for policy in [Fcfs, Easy, Conservative] {
        let (a, b) = (run(&four_procs(), policy), run(&four_procs(), policy));
        assert_eq!(a.jobs, b.jobs);
        assert_eq!(a.timeline, b.timeline);
    }
}

#[test]
fn csv_and_plot() {
    let r = run(&two_procs(), Easy);
    let csv = berth_sim::output::jobs_csv(&r.jobs);
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines[0], "id,submit,start,end,wait,run,procs,estimate,bsld,backfilled,suspended");
    assert_eq!(lines[3], "3,2,2,52,0,50,1,50,1.0000,true,0");
    let svg = berth_sim::output::plot_svg(&r.timeline, &r.report);
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    for text in ["utilization (%)", "queue length (jobs)", "time since the first submission", "<polyline"] {
        assert!(svg.contains(text), "{text} missing");
    }
}

/// The first 200 jobs of the evalys trace (oar-team/evalys tests) on two 8-core nodes under
/// the real placement: every job runs, none before its submission (the simulator also checks
/// that no more cores are in use than exist, in debug builds).
#[test]
fn topology_machine_replays_a_real_trace() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/easy_mediumWL_smallPF.swf");
    let text: String = std::fs::read_to_string(path).unwrap().lines().take(200).map(|l| format!("{l}\n")).collect();
    for policy in [Fcfs, Easy, Conservative] {
        let machine = MachineSpec::Topology { nodes: 2, spec: "package:2 numa:1 core:4 pu:1".into() };
        let r = simulate_text(&text, &SimConfig { policy, machine, ..SimConfig::default() }).unwrap();
        assert_eq!(r.report.jobs, 200);
        assert!(r.report.utilization > 0.0 && r.report.utilization <= 1.0, "{:?}", r.report);
        assert!(r.jobs.iter().all(|j| j.start >= j.submit && j.end == j.start + j.run));
    }
}

/// Skipping the passes that can start nothing changes no decision: same schedule as running
/// `plan` at every event time (the first 300 jobs of the evalys trace on 16 processors, also
/// with preemption by jobs of more than 4, and the RICC excerpt).
#[test]
fn skipped_passes_change_nothing() {
    let evalys = "easy_mediumWL_smallPF.swf";
    let ricc = "accasim-ricc-25.swf";
    let cases = [(evalys, false, false), (evalys, false, true), (ricc, false, false), (ricc, true, false)];
    for (file, fair_share, preempt) in cases {
        let whole = std::fs::read_to_string(format!("{}/tests/data/{file}", env!("CARGO_MANIFEST_DIR"))).unwrap();
        let text: String = whole.lines().take(300).map(|l| format!("{l}\n")).collect();
        for policy in [Fcfs, Easy, Conservative] {
            let preempt = preempt.then(|| berth_sim::preempt_config(4));
            let config = SimConfig { policy, fair_share, preempt, ..SimConfig::default() };
            let skipping = simulate_text(&text, &config).unwrap();
            let every = simulate_text(&text, &SimConfig { every_pass: true, ..config }).unwrap();
            assert_eq!(skipping.jobs, every.jobs, "{file} {policy:?} fair share {fair_share}");
            assert!(skipping.report.passes <= every.report.passes);
        }
    }
}

/// One node of 4 cores; jobs of more than 2 CPUs may suspend smaller ones. A and B (2 cores,
/// 1000 s each) start at 0; C (4 cores, 100 s) comes at 400, when both have run the 300 s
/// before which nobody is suspended: it suspends them, runs 400-500, and they resume at 500
/// with 600 s left each.
#[test]
fn a_large_job_suspends_two_small_ones() {
    let trace = format!(
        "{}{}{}",
        job(1, 0.0, 1000.0, 2, 1000.0, 1),
        job(2, 0.0, 1000.0, 2, 1000.0, 1),
        job(3, 400.0, 100.0, 4, 100.0, 1)
    );
    let machine = MachineSpec::Topology { nodes: 1, spec: "core:4".into() };
    let config =
        SimConfig { policy: Easy, machine, preempt: Some(berth_sim::preempt_config(2)), ..SimConfig::default() };
    let r = simulate_text(&trace, &config).unwrap();
    let got: Vec<(f64, f64, f64)> = r.jobs.iter().map(|j| (j.start, j.end, j.suspended)).collect();
    assert_eq!(got, vec![(0.0, 1100.0, 100.0), (0.0, 1100.0, 100.0), (400.0, 500.0, 0.0)]);
    assert_eq!((r.report.preemptions, r.report.suspensions), (1, 2));
    // Response time counts the suspension: (0 + 100 + 1000) / 1000.
    assert!(close(r.jobs[0].bsld, 1.1));

    let without = simulate_text(&trace, &SimConfig { preempt: None, ..config }).unwrap();
    assert_eq!(starts(&without), vec![0.0, 0.0, 1000.0]);
}

/// The first 200 jobs of the evalys trace with preemption on the default machine (16
/// processors, as single-core nodes under berth's placement): every job ends, and no job is
/// suspended longer than the bound (estimates are never below run times in this trace).
#[test]
fn preemption_keeps_suspensions_bounded() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/easy_mediumWL_smallPF.swf");
    let text: String = std::fs::read_to_string(path).unwrap().lines().take(200).map(|l| format!("{l}\n")).collect();
    let cfg = berth_sim::preempt_config(4);
    let config = SimConfig { policy: Easy, preempt: Some(cfg.clone()), ..SimConfig::default() };
    let r = simulate_text(&text, &config).unwrap();
    assert_eq!(r.report.jobs, 200);
    assert!(r.report.machine.contains("topology-aware"), "{}", r.report.machine);
    assert!(r.jobs.iter().all(|j| j.end.is_finite() && j.end >= j.start + j.run - 1e-6));
    assert!(r.jobs.iter().all(|j| j.suspended <= cfg.max_suspended_secs), "a suspension over the bound");
    assert!(r.report.preemptions > 0, "{:?}", r.report);
}

#[test]
fn preemption_needs_the_topology_machine() {
    let config = SimConfig {
        machine: MachineSpec::Pool { nodes: 2, cores_per_node: 1 },
        preempt: Some(berth_sim::preempt_config(1)),
        ..SimConfig::default()
    };
    assert!(matches!(simulate_text(&two_procs(), &config), Err(SimError::BadOption(_))));
}

/// 1 processor; jobs 7 and 3 submitted at the same second, 7 first in the trace. By default
/// the trace's order holds (7 runs first); `SubmitOrder::Id` runs 3 first.
#[test]
fn same_second_submissions_keep_trace_order_or_go_by_id() {
    let trace = format!("; MaxProcs: 1\n{}{}", job(7, 5.0, 10.0, 1, -1.0, 1), job(3, 5.0, 20.0, 1, -1.0, 1));
    let ids_by_start = |order| {
        let r = simulate_text(&trace, &SimConfig { policy: Fcfs, order, ..SimConfig::default() }).unwrap();
        let mut jobs: Vec<(f64, u64)> = r.jobs.iter().map(|j| (j.start, j.id)).collect();
        jobs.sort_by(|a, b| a.0.total_cmp(&b.0));
        jobs
    };
    assert_eq!(ids_by_start(berth_sim::SubmitOrder::Trace), [(5.0, 7), (15.0, 3)]);
    assert_eq!(ids_by_start(berth_sim::SubmitOrder::Id), [(5.0, 3), (25.0, 7)]);
}

fn gpu_config(policy: BackfillPolicy, nodes: u32, spec: &str, share: f64) -> SimConfig {
    SimConfig {
        policy,
        machine: MachineSpec::Topology { nodes, spec: spec.into() },
        gpus: Some(berth_sim::GpuWorkload { per_numa: 1, share }),
        ..SimConfig::default()
    }
}

/// One node of 2 NUMA nodes x 2 cores, a GPU on each; every job a GPU job (share 1): a 1-proc
/// job asks 1 core and 1 GPU (2 GPUs x 1 core / 4 cores, rounded up). A (100 s) and B (200 s)
/// at 0 take both GPUs; C (50 s) at 1 waits for A's GPU though two cores are free: C 100-150.
/// Without GPUs C starts at once.
#[test]
fn gpu_workload_jobs_wait_for_gpus_not_cores() {
    let trace = format!(
        "; MaxProcs: 4\n{}{}{}",
        job(1, 0.0, 100.0, 1, 100.0, 1),
        job(2, 0.0, 200.0, 1, 200.0, 1),
        job(3, 1.0, 50.0, 1, 50.0, 1)
    );
    for policy in [Fcfs, Easy, Conservative] {
        let r = simulate_text(&trace, &gpu_config(policy, 1, "numa:2 core:2", 1.0)).unwrap();
        assert_eq!(starts(&r), vec![0.0, 0.0, 100.0], "{policy:?}");
        assert!(r.jobs.iter().all(|j| j.gpus == 1), "{:?}", r.jobs);
        let m = &r.report;
        assert_eq!((m.machine_gpus, m.gpu_jobs), (2, 3));
        // 350 GPU-seconds over 2 GPUs x 200 s.
        assert!(close(m.gpu_utilization, 350.0 / 400.0), "{m:?}");
        assert!(m.table().contains("3 GPU jobs"), "{}", m.table());
        let plain = simulate_text(&trace, &SimConfig { gpus: None, ..gpu_config(policy, 1, "numa:2 core:2", 1.0) });
        assert_eq!(starts(&plain.unwrap()), vec![0.0, 0.0, 1.0], "{policy:?}");
    }
    // Only on the topology-aware machine, with sane settings.
    let pool =
        SimConfig { machine: MachineSpec::Pool { nodes: 1, cores_per_node: 4 }, ..gpu_config(Easy, 1, "core:4", 1.0) };
    assert!(matches!(simulate_text(&trace, &pool), Err(SimError::BadOption(_))));
    for (per_numa, share) in [(0, 0.5), (17, 0.5), (1, 1.5), (1, -0.1)] {
        let mut c = gpu_config(Easy, 1, "numa:2 core:2", share);
        c.gpus = Some(berth_sim::GpuWorkload { per_numa, share });
        assert!(matches!(simulate_text(&trace, &c), Err(SimError::BadOption(_))), "{per_numa} {share}");
    }
}

/// The first 300 jobs of the evalys trace on 4 nodes of 2 packages x 4 cores with a GPU per
/// package, 40% of the jobs GPU jobs: the same jobs are GPU jobs under every policy, every job
/// runs, no more GPUs (or cores) are held at once than the machine has, and the EASY summary
/// is the golden one (the simulation is deterministic: a change of placement or scheduling
/// that moves it must be looked at).
#[test]
fn gpu_workload_on_a_real_trace() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/easy_mediumWL_smallPF.swf");
    let text: String = std::fs::read_to_string(path).unwrap().lines().take(300).map(|l| format!("{l}\n")).collect();
    let mut gpu_ids: Option<Vec<u64>> = None;
    for policy in [Fcfs, Easy, Conservative] {
        let r = simulate_text(&text, &gpu_config(policy, 4, "package:2 numa:1 core:4 pu:1", 0.4)).unwrap();
        let m = &r.report;
        assert_eq!((m.machine_gpus, m.machine_procs), (8, 32));
        assert!(m.gpu_jobs > 50 && m.gpu_jobs < m.jobs, "{m:?}");
        let ids: Vec<u64> = r.jobs.iter().filter(|j| j.gpus > 0).map(|j| j.id).collect();
        assert_eq!(ids.len(), m.gpu_jobs);
        match &gpu_ids {
            Some(first) => assert_eq!(&ids, first, "{policy:?}: other GPU jobs"),
            None => gpu_ids = Some(ids),
        }
        assert!(r.jobs.iter().all(|j| j.start >= j.submit && j.end == j.start + j.run));
        // Held at once, by a sweep over starts and ends (ends first at a tie).
        let mut events: Vec<(f64, i64, i64)> = vec![];
        for j in &r.jobs {
            events.push((j.start, j.gpus as i64, j.procs as i64));
            events.push((j.end, -(j.gpus as i64), -(j.procs as i64)));
        }
        events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
        let (mut gpus, mut cores) = (0i64, 0i64);
        for (t, g, c) in events {
            gpus += g;
            cores += c;
            assert!(gpus <= 8 && cores <= 32, "{policy:?} at {t}: {gpus} GPUs, {cores} cores held");
        }
        assert!(m.gpu_utilization > 0.0 && m.gpu_utilization <= 1.0, "{m:?}");
        if policy == Easy {
            let got = (m.jobs, m.gpu_jobs, m.makespan, m.mean_wait, m.utilization, m.gpu_utilization);
            let want = GPU_GOLDEN_EASY;
            assert_eq!((got.0, got.1), (want.0, want.1), "{got:?}");
            for (a, b) in [(got.2, want.2), (got.3, want.3), (got.4, want.4), (got.5, want.5)] {
                assert!((a - b).abs() <= 1e-9 * a.abs().max(1.0), "{got:?} vs golden {want:?}");
            }
        }
    }
}

/// (jobs, GPU jobs, makespan, mean wait, utilization, GPU utilization) of
/// `gpu_workload_on_a_real_trace` under EASY.
const GPU_GOLDEN_EASY: (usize, usize, f64, f64, f64, f64) =
    (300, 121, 9581.403686, 9.143217063333339, 0.3080004542353231, 0.24817196184671866);

/// One node of 4 cores, 1 license, every job holding it (share 1): A (100 s), B (100 s), C
/// (50 s) of 1 processor at 0 run one after the other though cores are free: 0, 100, 200.
/// Without licenses all start at 0. Half the jobs licensed: only those wait for each other.
#[test]
fn licensed_jobs_wait_for_licenses_not_cores() {
    let trace = format!(
        "; MaxProcs: 4\n{}{}{}",
        job(1, 0.0, 100.0, 1, 100.0, 1),
        job(2, 0.0, 100.0, 1, 100.0, 1),
        job(3, 0.0, 50.0, 1, 50.0, 1)
    );
    let config = |share: Option<f64>, policy| SimConfig {
        policy,
        machine: MachineSpec::Topology { nodes: 1, spec: "core:4".into() },
        licenses: share.map(|share| berth_sim::LicenseWorkload { count: 1, share }),
        ..SimConfig::default()
    };
    for policy in [Fcfs, Easy, Conservative] {
        let r = simulate_text(&trace, &config(Some(1.0), policy)).unwrap();
        assert_eq!(starts(&r), vec![0.0, 100.0, 200.0], "{policy:?}");
        assert!(r.report.machine.contains("1 licenses"), "{}", r.report.machine);
        let r = simulate_text(&trace, &config(None, policy)).unwrap();
        assert_eq!(starts(&r), vec![0.0, 0.0, 0.0], "{policy:?}");
    }
    // Licenses need the topology machine, and a count of at least 1.
    let pool =
        SimConfig { licenses: Some(berth_sim::LicenseWorkload { count: 1, share: 1.0 }), ..SimConfig::default() };
    assert!(matches!(simulate_text(&trace, &pool), Err(SimError::BadOption(_))));
    let none = SimConfig { licenses: Some(berth_sim::LicenseWorkload { count: 0, share: 1.0 }), ..config(None, Fcfs) };
    assert!(matches!(simulate_text(&trace, &none), Err(SimError::BadOption(_))));
}
