use super::*;
use crate::job::{RankSet, Shape};
use crate::sched::testkit::{hold, ClusterBuilder, G};
use crate::CpuSet;
use proptest::prelude::*;

fn cfg() -> PreemptConfig {
    PreemptConfig { enabled: true, min_score: 100.0, min_run_secs_before_suspend: 0.0, ..Default::default() }
}

fn whole_node(cores: u32) -> JobRequest {
    JobRequest::simple(Shape::PerNode { nodes: 1, cores_per_node: cores }, 0)
}

/// A running job of `score` holding `cpus` of node `node`, started at 0.
fn job(cluster: &mut ClusterState, id: u64, node: usize, cpus: &str, score: f64) -> Preemptible {
    let r = hold(cluster, id, &[(node, cpus)], 1e9);
    Preemptible { id: r.id, alloc: r.alloc, score, suspended_secs: 0.0, start: 0.0 }
}

fn ids(v: &[JobId]) -> Vec<u64> {
    let mut v: Vec<u64> = v.iter().map(|id| id.0).collect();
    v.sort_unstable();
    v
}

#[test]
fn scores_count_class_and_large_size() {
    let c = PreemptConfig { large_cpus: 8, ..cfg() };
    assert_eq!(score(&whole_node(8), 0, &c), 0.0);
    assert_eq!(score(&whole_node(16), 0, &c), 16.0);
    assert_eq!(score(&whole_node(16), 2, &c), 2016.0);
}

/// n0 holds jobs of scores 1 and 5, n1 two jobs of score 2: suspending n1's pair costs less.
#[test]
fn suspends_the_cheapest_set_on_as_few_nodes_as_possible() {
    let mut c = ClusterBuilder::new().nodes(2, 1, 4, 0).build();
    let running = vec![
        job(&mut c, 1, 0, "0-1", 1.0),
        job(&mut c, 2, 0, "2-3", 5.0),
        job(&mut c, 3, 1, "0-1", 2.0),
        job(&mut c, 4, 1, "2-3", 2.0),
    ];
    let req = whole_node(4);
    let p = plan_preemption(&c, &running, &Preemptor { request: &req, score: 500.0, walltime: 60.0 }, &cfg(), 10.0)
        .unwrap();
    assert_eq!(ids(&p.victims), [3, 4]);
    assert_eq!(crate::sched::testkit::alloc_text(&p.alloc), "n1:0-3");
    // Half a node: one victim is enough, the cheapest.
    let v = choose_victims(
        &c,
        &running,
        &Preemptor { request: &whole_node(2), score: 500.0, walltime: 60.0 },
        &cfg(),
        10.0,
    );
    assert_eq!(ids(&v.unwrap()), [1]);
}

#[test]
fn only_when_needed_allowed_and_worth_it() {
    let mut c = ClusterBuilder::new().nodes(1, 1, 4, 0).build();
    let running = vec![job(&mut c, 1, 0, "0-1", 1.0)];
    let small = whole_node(2);
    let big = whole_node(4);
    let go = |req: &JobRequest, score: f64, cfg: &PreemptConfig, now: f64| {
        choose_victims(&c, &running, &Preemptor { request: req, score, walltime: 60.0 }, cfg, now)
    };
    // Fits without suspending anyone.
    assert_eq!(go(&small, 500.0, &cfg(), 10.0), None);
    assert_eq!(go(&big, 500.0, &cfg(), 10.0).map(|v| ids(&v)), Some(vec![1]));
    // Below the cutoff, not above its victim, preemption off, victim too young.
    assert_eq!(go(&big, 99.0, &cfg(), 10.0), None);
    assert_eq!(go(&big, 1.0, &PreemptConfig { min_score: 0.0, ..cfg() }, 10.0), None);
    assert_eq!(go(&big, 500.0, &PreemptConfig { enabled: false, ..cfg() }, 10.0), None);
    assert_eq!(go(&big, 500.0, &PreemptConfig { min_run_secs_before_suspend: 60.0, ..cfg() }, 10.0), None);
    // Never fits: nothing to gain.
    assert_eq!(go(&whole_node(8), 500.0, &cfg(), 10.0), None);
}

#[test]
fn suspended_jobs_keep_their_memory() {
    let mut c = ClusterBuilder::new().nodes(1, 1, 4, 8 * G).build();
    let mut victim = job(&mut c, 1, 0, "0-3", 1.0);
    // Give it 6 of the node's 8 GiB.
    c.release(&victim.alloc);
    victim.alloc[0].memory_bytes = 6 * G;
    c.claim(&victim.alloc);
    let running = vec![victim];
    let mut needs = whole_node(4);
    needs.mem = crate::placement::MemRequest::PerNode(4 * G);
    let p = Preemptor { request: &needs, score: 500.0, walltime: 60.0 };
    assert_eq!(choose_victims(&c, &running, &p, &cfg(), 10.0), None);
    needs.mem = crate::placement::MemRequest::PerNode(2 * G);
    let p = Preemptor { request: &needs, score: 500.0, walltime: 60.0 };
    assert_eq!(choose_victims(&c, &running, &p, &cfg(), 10.0).map(|v| ids(&v)), Some(vec![1]));
}

#[test]
fn resume_in_place_or_on_other_cores_near_the_memory() {
    // 2 packages x 4 cores, one NUMA node each.
    let mut c = ClusterBuilder::new().nodes(1, 2, 4, 8 * G).build();
    let a = hold(&mut c, 1, &[(0, "0-1")], 1e9);
    let mut b = hold(&mut c, 2, &[(0, "4-5")], 1e9).alloc;
    // Suspend both: their PUs are lent out.
    c.release(&cpus_only(&a.alloc));
    c.release(&cpus_only(&b));
    b[0].ranks = vec![RankSet { cpus: CpuSet::parse_list("4").unwrap(), mems: CpuSet::new() }];
    // Another job takes cores 4-5: b can only come back on 6-7 (same NUMA node).
    let other = hold(&mut c, 3, &[(0, "4-5")], 1e9);
    let suspended =
        [SuspendedJob { id: JobId(1), alloc: a.alloc.clone() }, SuspendedJob { id: JobId(2), alloc: b.clone() }];
    assert_eq!(resume_candidates(&c, &suspended, false), vec![(JobId(1), Resume::InPlace)]);
    let both = resume_candidates(&c, &suspended, true);
    assert_eq!(both[0], (JobId(1), Resume::InPlace));
    let Resume::Relocated(moved) = &both[1].1 else { panic!("{both:?}") };
    assert_eq!((moved[0].cpus.to_list(), moved[0].ranks[0].cpus.to_list()), ("6-7".into(), "6".into()));
    assert_eq!(moved[0].mems, b[0].mems);
    // Cores 6-7 also taken: nowhere near its memory to go.
    hold(&mut c, 4, &[(0, "6-7")], 1e9);
    assert_eq!(resume_candidates(&c, &suspended[1..], true), vec![]);
    let _ = other;
}

proptest! {
    /// Round after round a high-score job of random walltime preempts what it can on a small
    /// machine; victims stay suspended for its walltime, then resume. Nobody's total suspension
    /// ever passes the bound, and victims always score lower than their preemptor.
    #[test]
    fn total_suspension_stays_bounded(
        walltimes in proptest::collection::vec(1u32..2000, 1..40),
        sizes in proptest::collection::vec(1u32..5, 1..8),
        bound in 600.0f64..5000.0,
    ) {
        let cfg = PreemptConfig { max_suspended_secs: bound, ..cfg() };
        let mut c = ClusterBuilder::new().nodes(2, 1, 4, 0).build();
        let mut running: Vec<Preemptible> = vec![];
        for (i, &size) in sizes.iter().enumerate() {
            if let Placement::Now(alloc) = place(&c, &whole_node(size)) {
                c.claim(&alloc);
                running.push(Preemptible { id: JobId(i as u64), alloc, score: 1.0 + i as f64, suspended_secs: 0.0, start: 0.0 });
            }
        }
        let mut now = 1000.0;
        for &w in &walltimes {
            let req = whole_node(4);
            let candidate = Preemptor { request: &req, score: 100.0, walltime: w as f64 };
            if let Some(p) = plan_preemption(&c, &running, &candidate, &cfg, now) {
                let victims: Vec<&mut Preemptible> = running.iter_mut().filter(|r| p.victims.contains(&r.id)).collect();
                for v in victims {
                    prop_assert!(v.score < candidate.score);
                    c.release(&cpus_only(&v.alloc));
                    v.suspended_secs += w as f64;
                }
                c.claim(&p.alloc);
                // The preemptor ends; its victims resume in place.
                c.release(&p.alloc);
                let suspended: Vec<SuspendedJob> = running.iter().filter(|r| p.victims.contains(&r.id))
                    .map(|r| SuspendedJob { id: r.id, alloc: r.alloc.clone() }).collect();
                let resumed = resume_candidates(&c, &suspended, false);
                prop_assert_eq!(resumed.len(), suspended.len());
                for s in &suspended {
                    c.claim(&cpus_only(&s.alloc));
                }
            }
            now += w as f64;
            for r in &running {
                prop_assert!(r.suspended_secs <= bound, "job {} suspended {} s, bound {bound}", r.id, r.suspended_secs);
            }
        }
    }
}

/// Seed 000 scores victims with the spread of the job that preempts them (issue 17 item 7).
/// One node of 2 packages x 4 cores, four 2-core jobs of equal score, two in each package: a
/// 4-core preemptor suspends the two of one package and runs there, not one job of each
/// package with its cores split across both.
#[test]
fn victims_chosen_where_the_preemptor_lands_least_spread() {
    for order in [[1, 2, 3, 4], [1, 3, 2, 4], [4, 1, 3, 2]] {
        let mut c = ClusterBuilder::new().nodes(1, 2, 4, 8 * G).build();
        let cpus = |id: u64| ["0-1", "2-3", "4-5", "6-7"][id as usize - 1];
        let running: Vec<Preemptible> = order.iter().map(|&id| job(&mut c, id, 0, cpus(id), 1.0)).collect();
        let req = whole_node(4);
        let p = plan_preemption(&c, &running, &Preemptor { request: &req, score: 500.0, walltime: 60.0 }, &cfg(), 10.0)
            .unwrap();
        let text = crate::sched::testkit::alloc_text(&p.alloc);
        assert!(
            (ids(&p.victims) == [1, 2] && text == "n0:0-3") || (ids(&p.victims) == [3, 4] && text == "n0:4-7"),
            "order {order:?}: victims {:?}, preemptor on {text}",
            ids(&p.victims)
        );
    }
}
