//! Node order (issue 17 item 5): blocks and listings follow names (natural order) or the
//! admin's `[interconnect] order`, never the order agents registered in.

use crate::testkit::{ann, registration, Harness};
use berth_protocol::client::{ClientRequest, ClientResponse};
use tokio::sync::mpsc;

/// Register agents named `names`, in that order, on a fresh harness with `edit`ed config.
/// The agents' receiving ends come back too, to keep their channels open.
type Agents = Vec<mpsc::UnboundedReceiver<berth_protocol::agent::ControllerMessage>>;

fn registered(names: &[&str], edit: impl FnOnce(&mut crate::config::ControllerConfig)) -> (Harness, Agents) {
    let mut h = Harness::with_config(0, edit);
    let mut agents = vec![];
    for (i, name) in names.iter().enumerate() {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut reg = registration(i, &format!("inst{i}"), vec![]);
        reg.name = name.to_string();
        reg.hostname = name.to_string();
        h.ctl.handle_register(reg, i as u64 + 1, tx.clone(), h.now).unwrap();
        h.txs.push(tx);
        agents.push(rx);
    }
    h.sent();
    (h, agents)
}

fn listed(h: &mut Harness) -> Vec<String> {
    match h.call(ClientRequest::ListNodes { topology: false }, &ann()) {
        ClientResponse::Nodes { nodes, .. } => nodes.into_iter().map(|n| n.name).collect(),
        other => panic!("{other:?}"),
    }
}

fn block(h: &Harness, name: &str) -> Vec<u32> {
    h.ctl.cluster.nodes().iter().find(|n| n.name == name).expect("node").location.clone()
}

#[test]
fn nodes_are_listed_and_blocked_by_name_whatever_the_registration_order() {
    // 8-PU nodes, blocks of 16 PUs: two nodes per block.
    let names = ["node10", "node2", "node1", "node3"];
    let (mut h, _agents) = registered(&names, |c| c.interconnect.blocks = vec![16]);
    assert_eq!(listed(&mut h), ["node1", "node2", "node3", "node10"]);
    assert_eq!((block(&h, "node1"), block(&h, "node2")), (vec![0], vec![0]));
    assert_eq!((block(&h, "node3"), block(&h, "node10")), (vec![1], vec![1]));
    // The same after a restart (nodes loaded from the store).
    let mut h = h.restart();
    assert_eq!(listed(&mut h), ["node1", "node2", "node3", "node10"]);
    assert_eq!(block(&h, "node10"), vec![1]);
}

#[test]
fn an_explicit_order_comes_first() {
    let names = ["node10", "node2", "node1", "node3"];
    let (mut h, _agents) = registered(&names, |c| {
        c.interconnect.blocks = vec![16];
        c.interconnect.order = vec!["node[3-10]".into()];
    });
    assert_eq!(listed(&mut h), ["node3", "node10", "node1", "node2"]);
    assert_eq!((block(&h, "node3"), block(&h, "node10")), (vec![0], vec![0]));
    assert_eq!((block(&h, "node1"), block(&h, "node2")), (vec![1], vec![1]));
}

/// The job's nodes by name, in its allocation's order.
fn job_nodes(h: &Harness, id: berth_core::JobId) -> Vec<String> {
    h.ctl.jobs[&id].allocation.iter().map(|a| a.node.clone()).collect()
}

/// Placement, too, goes by the cluster's order: agents registering in reverse order neither
/// change where a job goes first, nor its node list, nor its head node (rank 0's, the batch
/// script's), nor the node list the agents are sent (BERTH_NODES, SLURM_JOB_NODELIST,
/// PBS_NODEFILE).
#[test]
fn jobs_are_placed_and_listed_by_name_whatever_the_registration_order() {
    use berth_core::directives::SubmitOptions;
    use berth_protocol::agent::ControllerMessage;
    let names = ["node10", "node3", "node2", "node1"];
    for edit in [false, true] {
        let (mut h, _agents) = registered(&names, |c| {
            if edit {
                c.interconnect.order = vec!["node[3-10]".into()];
            }
        });
        let want: Vec<&str> = if edit { vec!["node3", "node10", "node1"] } else { vec!["node1", "node2", "node3"] };
        let opts = |nodes, cores| SubmitOptions {
            nodes: Some(nodes),
            cores: Some(cores),
            walltime: Some(600),
            ..Default::default()
        };
        let one = h.batch(opts(1, 1), &ann());
        assert_eq!(job_nodes(&h, one), [want[0]], "first fit by name (admin order: {edit})");
        h.sent();
        let three = h.batch(opts(3, 3), &ann());
        assert_eq!(job_nodes(&h, three), want, "node list (admin order: {edit})");
        let launches: Vec<_> = h
            .sent()
            .into_iter()
            .filter_map(|(i, m)| match m {
                ControllerMessage::Launch(spec) if spec.id == three => Some((names[i], spec)),
                _ => None,
            })
            .collect();
        assert_eq!(launches.len(), 3);
        for (node, spec) in &launches {
            assert_eq!(spec.head, *node == want[0], "the head node is the first by name: {node}");
            let listed: Vec<&str> = spec.nodes.iter().map(|(n, _)| n.as_str()).collect();
            assert_eq!(listed, want, "the nodes sent to {node}");
        }
    }
}

/// Issue 17 item 11: the FREE string showed system CPUs as free; ordinary jobs cannot get them.
#[test]
fn the_free_string_counts_system_cpus_as_not_free() {
    let mut h = Harness::with_config(1, |c| c.system_cpus = "0,4".into());
    let ClientResponse::Nodes { nodes, .. } = h.call(ClientRequest::ListNodes { topology: false }, &ann()) else {
        panic!()
    };
    assert_eq!(nodes[0].topology, "SCCCCSCCCC");
    assert_eq!(nodes[0].free, "S.CCCS.CCC");
    assert_eq!(nodes[0].cpus_allocated, 0);
}

/// Issue 19, "Environment": launches carry what the Slurm and PBS variables need, unless
/// `[compat] environment = false`.
#[test]
fn launches_carry_the_compat_environment_unless_it_is_off() {
    use berth_core::directives::SubmitOptions;
    let opts = || SubmitOptions {
        nodes: Some(2),
        tasks_per_node: Some(2),
        cpus_per_task: Some(2),
        walltime: Some(600),
        ..Default::default()
    };
    let mut h = Harness::new(2);
    let id = h.batch(opts(), &ann());
    let compat = h.ctl.launch_spec(&h.ctl.jobs[&id], 1).compat.expect("on by default");
    assert_eq!((compat.cpus_per_task, compat.tasks_per_node, compat.queue.as_str()), (Some(2), Some(2), "batch"));
    let mut off = Harness::with_config(2, |c| c.compat.environment = false);
    let id = off.batch(opts(), &ann());
    assert_eq!(off.ctl.launch_spec(&off.ctl.jobs[&id], 0).compat, None);
}

/// Issue 19: a job's outputs follow its dialect, and both streams named by one pattern stay
/// one file after every expansion (`%j` at submission, `%N %n %t` at start), so the agent
/// opens it once (`same_output`).
#[test]
fn outputs_follow_the_dialect_and_one_pattern_stays_one_file() {
    let mut h = Harness::new(1);
    let mut submit = |script: &str| -> (String, String) {
        let sub = berth_protocol::client::SubmitRequest {
            script: script.into(),
            script_name: "job.sh".into(),
            options: berth_core::directives::SubmitOptions {
                walltime: Some(60),
                mem_per_cpu: Some(1 << 20),
                ..Default::default()
            },
            env: vec![],
            cwd: "/tmp".into(),
            hold: false,
            ignore_unsupported: false,
        };
        let ClientResponse::Submitted { id } = h.call(ClientRequest::Submit(Box::new(sub)), &ann()) else {
            panic!("not submitted: {script}")
        };
        h.ctl.schedule(h.now).unwrap();
        let job = &h.ctl.jobs[&id];
        assert!(!job.allocation.is_empty(), "{script} did not start");
        let spec = h.ctl.launch_spec(job, 0);
        let (out, err) = (spec.stdout.replace(&id.to_string(), "ID"), spec.stderr.replace(&id.to_string(), "ID"));
        let node = job.allocation[0].node.clone();
        h.agent(0, berth_protocol::agent::AgentMessage::JobEnded { id, outcome: Default::default() });
        (out.replace(&node, "NODE"), err.replace(&node, "NODE"))
    };
    let pair = |a: &str, b: &str| (a.to_string(), b.to_string());
    assert_eq!(submit("#!/bin/sh\ntrue\n"), pair("/tmp/berth-ID.out", "/tmp/berth-ID.err"), "berth's own");
    assert_eq!(submit("#!/bin/sh\n#SBATCH -n 1\ntrue\n"), pair("/tmp/slurm-ID.out", "/tmp/slurm-ID.out"));
    assert_eq!(
        submit("#!/bin/sh\n#SBATCH -o o-%N-%n-%t-%j.txt\ntrue\n"),
        pair("/tmp/o-NODE-0-0-ID.txt", "/tmp/o-NODE-0-0-ID.txt"),
        "one pattern with start-time parts: one file"
    );
    assert_eq!(submit("#!/bin/sh\n#SBATCH -e e.txt\ntrue\n"), pair("/tmp/slurm-ID.out", "/tmp/e.txt"));
    assert_eq!(submit("#!/bin/sh\n#PBS -j oe\n#PBS -o /o/x.log\ntrue\n"), pair("/o/x.log", "/o/x.log"));
}

/// `NodeExtra`'s rules on plain values (no store, no controller).
mod node_extra {
    use crate::state::NodeExtra;
    use berth_core::node::NodeState;
    use std::time::{Duration, Instant};

    fn node(state: NodeState, at: Instant) -> NodeExtra {
        NodeExtra::new(state, "10.0.0.1:7200".into(), "0-7".into(), "i1".into(), at)
    }

    #[test]
    fn a_node_takes_work_only_up_with_its_agent_connected() {
        let at = Instant::now();
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let mut up = node(NodeState::Up, at);
        assert!(!up.connected() && !up.usable() && up.agent().is_none());
        up.connect(3, tx.clone(), at);
        assert!(up.connected() && up.usable() && up.agent().is_some());
        let mut cleaning = node(NodeState::Cleaning, at);
        cleaning.connect(4, tx, at);
        assert!(cleaning.connected() && !cleaning.usable());
        up.disconnect();
        assert!(!up.connected() && !up.usable() && up.connection_id().is_none());
    }

    #[test]
    fn a_node_whose_agent_never_registered_has_no_instance() {
        let at = Instant::now();
        assert!(node(NodeState::Down, at).ever_registered());
        let never = NodeExtra::new(NodeState::Down, String::new(), String::new(), String::new(), at);
        assert!(!never.ever_registered());
    }

    #[test]
    fn only_the_live_connection_is_the_agent_s_and_connecting_is_hearing_from_it() {
        let at = Instant::now();
        let later = at + Duration::from_secs(5);
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let mut ex = node(NodeState::Up, at);
        assert!(!ex.is_connection(1));
        ex.connect(1, tx.clone(), later);
        assert_eq!((ex.connection_id(), ex.last_heard()), (Some(1), later));
        ex.connect(2, tx, at);
        assert!(ex.is_connection(2) && !ex.is_connection(1), "replaced");
        ex.heard(later);
        assert_eq!(ex.last_heard(), later);
    }

    #[test]
    fn an_admin_s_reason_stays_until_the_node_is_let_up() {
        let mut ex = node(NodeState::Up, Instant::now());
        assert_eq!(ex.admin_down(), None);
        ex.set_admin_down(Some("bad disk".into()));
        assert_eq!(ex.admin_down(), Some("bad disk"));
        ex.set_admin_down(None);
        assert_eq!(ex.admin_down(), None);
    }
}
