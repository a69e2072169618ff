use super::*;
use crate::job::Shape;

fn cores(n: u32) -> JobRequest {
    JobRequest::simple(Shape::Total { cores: n, chunk: 1 }, 0)
}

fn queues() -> Vec<QueueSpec> {
    vec![
        QueueSpec {
            name: "short".into(),
            max_walltime_secs: Some(3600),
            default_walltime_secs: Some(600),
            max_cores_per_job: Some(64),
            max_cores_per_user: Some(128),
            priority: 10,
            preempt_class: 1,
            ..Default::default()
        },
        QueueSpec { name: "long".into(), max_walltime_secs: Some(7 * 86400), priority: -5, ..Default::default() },
        QueueSpec {
            name: "numa".into(),
            allowed_properties: Some(vec!["bigmem".into()]),
            enabled: false,
            ..Default::default()
        },
    ]
}

#[test]
fn defaults_fill_the_walltime_only_when_missing() {
    let q = &queues();
    assert_eq!(q[0].walltime_or_default(None), Some(600));
    assert_eq!(q[0].walltime_or_default(Some(60)), Some(60));
    // No default: the maximum.
    assert_eq!(q[1].walltime_or_default(None), Some(7 * 86400));
    assert_eq!(QueueSpec::default().walltime_or_default(None), None);
}

#[test]
fn refusals_say_what_to_do_and_where_else_to_go() {
    let q = queues();
    let err = check_in(&q, "short", Some(7200), &cores(4)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "queue short allows at most 01:00:00 of walltime, the job asks for 02:00:00; ask for less or use queue long"
    );
    let err = check_in(&q, "short", Some(60), &cores(100)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "queue short allows at most 64 cores per job, the job asks for 100; ask for fewer or use queue long"
    );
    let err = check_in(&q, "short", None, &cores(1)).unwrap_err();
    assert!(err.to_string().contains("the job asks for no limit"), "{err}");
    let err = check_in(&q, "nope", None, &cores(1)).unwrap_err();
    assert_eq!(err.to_string(), "no queue \"nope\"; queues are: short, long, numa");
    assert_eq!(check_in(&q, "short", Some(60), &cores(64)).map(|s| s.name.as_str()), Ok("short"));
}

#[test]
fn disabled_queues_and_properties() {
    let q = queues();
    let mut req = cores(1);
    req.properties = vec!["bigmem".into()];
    let err = q[2].check(None, &req).unwrap_err();
    assert!(matches!(err, QueueError::Disabled { .. }), "{err}");
    let open = QueueSpec { enabled: true, ..q[2].clone() };
    assert!(open.check(None, &req).is_ok());
    req.properties.push("singlecpu".into());
    assert_eq!(
        open.check(None, &req).unwrap_err().to_string(),
        "queue numa allows the properties bigmem, not bigmem,singlecpu"
    );
    let no_subnodes = QueueSpec { allowed_subnodes: Some(false), ..QueueSpec::default() };
    assert!(matches!(no_subnodes.check(None, &req), Err(QueueError::Subnodes { .. })));
    assert!(no_subnodes.check(None, &cores(4)).is_ok());
}

#[test]
fn a_user_waits_at_the_running_cores_limit() {
    let q = queues();
    assert_eq!(user_limit_reason(&q[0], 64, 64), None);
    let reason = user_limit_reason(&q[0], 100, 64).unwrap();
    assert_eq!(
        reason.describe(),
        "queue limit: queue short lets one user run 128 cores at once; yours use 100, this job needs 64"
    );
    assert_eq!(user_limit_reason(&q[1], 1_000_000, 64), None);
    // A job larger than the limit on its own is refused at submission instead.
    assert!(matches!(q[0].check(Some(60), &cores(200)), Err(QueueError::CoresPerJob { .. })));
}

#[test]
fn queue_factor_is_normalized_over_the_queues() {
    let q = queues();
    assert_eq!(queue_factor(&q[0], &q), 1.0);
    assert_eq!(queue_factor(&q[1], &q), 0.0);
    assert!((queue_factor(&q[2], &q) - 1.0 / 3.0).abs() < 1e-12);
    let same = vec![QueueSpec::default(), QueueSpec { name: "other".into(), ..Default::default() }];
    assert_eq!(queue_factor(&same[0], &same), 0.0);
}

#[test]
fn specs_parse_strictly() {
    let spec: QueueSpec = serde_json::from_str(r#"{"name":"gpu","max_walltime_secs":60}"#).unwrap();
    assert_eq!((spec.name.as_str(), spec.max_walltime_secs, spec.enabled), ("gpu", Some(60), true));
    assert!(serde_json::from_str::<QueueSpec>(r#"{"name":"gpu","max_walltime":60}"#).is_err());
}

/// Seed 000 targets queues at subnodes (issue 17 item 6). One node, 2 NUMA nodes of 2 cores,
/// one subnode each; subnode 1 has property `fat`. Queue `fat` targets it: its jobs run only
/// there. Reserved, other queues' jobs keep off it (and may not ask for it); not reserved, they
/// may use it too.
#[test]
fn queues_target_subnodes_and_reserved_ones_keep_others_off() {
    use crate::node::NodeCapacity;
    use crate::placement::cluster::{place, Placement};
    use crate::placement::PlacementPolicy;
    use crate::topology::Topology;
    use std::sync::Arc;
    let mut node = NodeCapacity::new(crate::NodeId(0), "n0", Arc::new(Topology::uniform(1, 2, 2, 1, 1 << 30)));
    node.set_subnode_size(1);
    node.subnodes[1].properties = vec!["fat".into()];
    node.refresh();
    let policy = PlacementPolicy::default();
    let specs = |reserved| {
        vec![
            QueueSpec { name: "batch".into(), ..Default::default() },
            QueueSpec { name: "fat".into(), target_properties: vec!["fat".into()], reserved, ..Default::default() },
        ]
    };
    let two = || JobRequest::simple(Shape::PerNode { nodes: 1, cores_per_node: 2 }, 0);
    let placed = |nodes: &[NodeCapacity], specs: &[QueueSpec], queue: &str| {
        let mut req = two();
        target(specs, queue, &mut req);
        match place(nodes, &policy, &req) {
            Placement::Now(a) => a[0].cpus.to_list(),
            Placement::Busy(why) => format!("busy: {why}"),
            Placement::Never(why) => format!("never: {why}"),
        }
    };
    let nodes = std::slice::from_ref(&node);
    assert_eq!(placed(nodes, &specs(true), "fat"), "2-3", "the fat queue's job on its subnode");
    // Reserved: the plain queue's job only on subnode 0.
    assert_eq!(placed(nodes, &specs(true), "batch"), "0-1");
    let mut busy = node.clone();
    let Placement::Now(first) = place(nodes, &policy, &two()) else { panic!("fits") };
    assert_eq!(first[0].cpus.to_list(), "0-1");
    busy.claim(&first[0]);
    let busy_nodes = std::slice::from_ref(&busy);
    let batch = placed(busy_nodes, &specs(true), "batch");
    assert!(batch.starts_with("busy: ") && batch.contains("kept for another queue's jobs (fat)"), "{batch}");
    assert_eq!(placed(busy_nodes, &specs(false), "batch"), "2-3", "not reserved: others may use it");
    assert_eq!(placed(busy_nodes, &specs(true), "fat"), "2-3");
    // Asking for a reserved property from another queue is refused at submission.
    let mut asks = cores(1);
    asks.properties = vec!["fat".into()];
    let e = check_in(&specs(true), "batch", None, &asks).unwrap_err();
    assert_eq!(
        e.to_string(),
        "subnodes with property fat are kept for queue fat; submit to queue fat or drop --property"
    );
    assert!(check_in(&specs(false), "batch", None, &asks).is_ok());
    assert!(check_in(&specs(true), "fat", None, &asks).is_ok());
}
