//! `--exclusive` (Slurm's, berth's own): the job gets whole nodes, so no other job shares
//! them. berth has no node-level exclusive flag in placement; a job holding every core (PU
//! with `--threads`) of its nodes is what keeps others off them. So at submission the job is
//! rewritten to its node count times the cores of a node: `--nodes K --cores K×C`, K being
//! the nodes its request needed (its `--nodes`, else as many C-core nodes as its cores
//! fill), C the cores a node has for jobs (outside system CPUs unless `--system-cpus`).
//! Nodes must all have the same C; on a cluster of mixed sizes `--exclusive` is refused
//! naming the sizes. `--tasks-per-node` and `--cores` are replaced, but the job keeps the
//! tasks it asked for, as Slurm's does (`-N 1 -n 16` on 128-core nodes: 16 tasks on a whole
//! node): they are recorded in `SubmitOptions::tasks`, which gives `SLURM_NTASKS` (and the
//! other task counts of the job's environment), `berth run`'s default inside the job and
//! `berth show`'s `exclusive:` line. `--cpus-per-task` must divide C.

use crate::state::Controller;
use berth_core::directives::{JobTasks, SubmitOptions};
use berth_core::job::Shape;
use berth_core::placement::JobRequest;

impl Controller {
    /// Rewrite an `--exclusive` job as whole nodes (see the module); Err: why it cannot be.
    pub(crate) fn map_exclusive(&self, options: &mut SubmitOptions) -> Result<(), String> {
        // Only this sets it: a submission's is kept only as an uneven task count of its shape.
        let recorded = options.tasks.take();
        let uneven = recorded.filter(|t| uneven_tasks(options, t).is_some());
        if options.exclusive != Some(true) {
            options.tasks = uneven;
            return Ok(());
        }
        let threads = options.threads.unwrap_or(false);
        let system = options.system_cpus.unwrap_or(false);
        let mut sizes: Vec<u32> = self
            .cluster
            .nodes()
            .iter()
            .map(|n| {
                let p = n.pristine();
                if threads {
                    p.free_pu_count
                } else if system {
                    p.free_core_count_with_system
                } else {
                    p.free_core_count
                }
            })
            .collect();
        sizes.sort_unstable();
        sizes.dedup();
        let per_node = match sizes.as_slice() {
            [] => return Err("--exclusive needs the nodes' size, and no node has registered yet; try again".into()),
            [c] => *c,
            many => {
                let list: Vec<String> = many.iter().map(u32::to_string).collect();
                return Err(format!(
                    "--exclusive takes whole nodes, and this cluster's nodes differ in size ({} {}); ask for whole nodes with --nodes N --tasks-per-node C instead",
                    list.join(", "),
                    if threads { "PUs" } else { "cores" }
                ));
            }
        };
        if per_node == 0 {
            return Err("--exclusive: the nodes have no cores for jobs".into());
        }
        let request = JobRequest::from_options(options).map_err(|e| e.to_string())?;
        let nodes = match request.shape {
            Shape::PerNode { nodes, cores_per_node } if cores_per_node <= per_node => nodes,
            Shape::PerNode { cores_per_node, .. } => {
                return Err(format!(
                    "--exclusive: {cores_per_node} cores per node asked for, more than a node's {per_node}"
                ))
            }
            Shape::Total { cores, .. } => cores.div_ceil(per_node),
        };
        let cpt = options.cpus_per_task.unwrap_or(1);
        if per_node % cpt != 0 {
            return Err(format!(
                "--exclusive: --cpus-per-task {cpt} does not divide a node's {per_node} cores; the job's tasks would not fill its nodes"
            ));
        }
        let cores = nodes.checked_mul(per_node).ok_or("--exclusive: too many cores")?;
        // The tasks asked for (`shape` checked that --cpus-per-task divides them), unless the
        // options are still this job's rewritten whole nodes (`berth update` of a setting
        // other than its size): then those recorded at submission.
        let rewritten =
            options.tasks_per_node.is_none() && options.nodes == Some(nodes) && options.cores == Some(cores);
        let tasks = match (request.shape, recorded) {
            (_, Some(t)) if rewritten && t.total <= cores => t,
            // `--exclusive -N 2 -n 5`: 3 + 2 on the whole nodes.
            (Shape::PerNode { cores_per_node, .. }, Some(t)) if uneven.is_some() => {
                JobTasks { total: t.total, per_node: Some(cores_per_node / cpt) }
            }
            (Shape::PerNode { nodes, cores_per_node }, _) => {
                let k = cores_per_node / cpt;
                JobTasks { total: nodes.checked_mul(k).ok_or("--exclusive: too many tasks")?, per_node: Some(k) }
            }
            (Shape::Total { cores, .. }, _) => JobTasks { total: cores / cpt, per_node: None },
        };
        options.nodes = Some(nodes);
        options.cores = Some(cores);
        options.tasks_per_node = None;
        options.tasks = Some(tasks);
        Ok(())
    }
}

/// The tasks a node holds when `tasks` is an uneven count the job's shape allows (see
/// `JobTasks::fill_nodes_unevenly`).
fn uneven_tasks(options: &SubmitOptions, tasks: &JobTasks) -> Option<u32> {
    let request = JobRequest::from_options(options).ok()?;
    let Shape::PerNode { nodes, cores_per_node } = request.shape else { return None };
    let per_node = cores_per_node / options.cpus_per_task.unwrap_or(1).max(1);
    tasks.fill_nodes_unevenly(nodes, per_node).then_some(per_node)
}

#[cfg(test)]
mod tests {
    use crate::testkit::*;
    use berth_core::directives::SubmitOptions;
    use berth_core::job::JobState;
    use berth_protocol::client::{ClientRequest, ClientResponse, SubmitRequest};

    fn submit(h: &mut Harness, options: SubmitOptions) -> ClientResponse {
        h.call(
            ClientRequest::Submit(Box::new(SubmitRequest {
                script: "#!/bin/sh\ntrue\n".into(),
                script_name: "job.sh".into(),
                options,
                env: vec![],
                cwd: "/tmp".into(),
                hold: false,
                ignore_unsupported: false,
            })),
            &ann(),
        )
    }

    fn opts() -> SubmitOptions {
        SubmitOptions { cores: Some(1), walltime: Some(600), mem_per_cpu: Some(1 << 20), ..Default::default() }
    }

    #[test]
    fn an_exclusive_job_holds_whole_nodes_and_shares_none() {
        let mut h = Harness::new(2);
        // One core of node 0 taken: an exclusive 1-core job goes to the other node, whole.
        let small = h.batch(opts(), &ann());
        let ClientResponse::Submitted { id } = submit(&mut h, SubmitOptions { exclusive: Some(true), ..opts() }) else {
            panic!("refused")
        };
        h.ctl.schedule(h.now).unwrap();
        let job = &h.ctl.jobs[&id];
        assert_eq!(job.state, JobState::Running);
        assert_eq!((job.options.nodes, job.options.cores), (Some(1), Some(8)), "a node of 8 cores");
        assert_eq!(job.allocation.len(), 1);
        assert_eq!(job.allocation[0].cores, 8);
        assert_ne!(job.allocation[0].node_id, h.ctl.jobs[&small].allocation[0].node_id);
        // Nothing else fits beside it: a third 1-core job goes to the first node.
        let other = h.batch(opts(), &ann());
        assert_ne!(h.ctl.jobs[&other].allocation[0].node_id, job_node(&h, id));
        // Two nodes, exclusive, with tasks per node: whole nodes too (waits for them).
        let two =
            SubmitOptions { exclusive: Some(true), nodes: Some(2), tasks_per_node: Some(2), cores: None, ..opts() };
        let ClientResponse::Submitted { id: two } = submit(&mut h, two) else { panic!("refused") };
        assert_eq!((h.ctl.jobs[&two].options.nodes, h.ctl.jobs[&two].options.cores), (Some(2), Some(16)));
        // Bad: cpus-per-task not dividing a node.
        let bad = SubmitOptions { exclusive: Some(true), cpus_per_task: Some(3), cores: Some(3), ..opts() };
        let ClientResponse::Error(e) = submit(&mut h, bad) else { panic!("accepted") };
        assert!(e.message.contains("--cpus-per-task 3"), "{}", e.message);
    }

    #[test]
    fn an_exclusive_job_keeps_the_tasks_it_asked_for() {
        use berth_core::directives::JobTasks;
        use berth_core::step::StepRequest;
        let mut h = Harness::new(2);
        // `--exclusive -N 1 -n 3` on nodes of 8 cores: the whole node, 3 tasks on it (Slurm's
        // SLURM_NTASKS=3, not 8).
        let o = SubmitOptions { exclusive: Some(true), nodes: Some(1), tasks_per_node: Some(3), cores: None, ..opts() };
        let ClientResponse::Submitted { id } = submit(&mut h, o) else { panic!("refused") };
        h.ctl.schedule(h.now).unwrap();
        let job = &h.ctl.jobs[&id];
        assert_eq!(job.state, JobState::Running);
        assert_eq!((job.options.nodes, job.options.cores, job.allocation[0].cores), (Some(1), Some(8), 8));
        let three = JobTasks { total: 3, per_node: Some(3) };
        assert_eq!(job.options.tasks, Some(three));
        // What the agent sets SLURM_NTASKS and SLURM_NTASKS_PER_NODE from; what berth show says.
        let compat = h.ctl.launch_spec(job, 0).compat.expect("[compat] environment is on by default");
        assert_eq!((compat.tasks, compat.tasks_per_node), (Some(three), Some(3)));
        assert_eq!(job.info(h.now).tasks, Some(three));
        // `berth update` of another setting keeps them; of its tasks, takes the new count.
        let mut again = job.options.clone();
        h.ctl.map_exclusive(&mut again).unwrap();
        assert_eq!((again.tasks, again.cores), (Some(three), Some(8)));
        again.tasks_per_node = Some(8);
        again.cores = None;
        h.ctl.map_exclusive(&mut again).unwrap();
        assert_eq!(again.tasks, Some(JobTasks { total: 8, per_node: Some(8) }));
        // `berth run` without a task count inside it: its 3 tasks, not 8.
        let step = |request: StepRequest| ClientRequest::StepCreate(Box::new(step_create(Some(id), request)));
        let ClientResponse::StepGranted { grant, .. } = h.call(step(StepRequest::default()), &ann()) else {
            panic!("no step")
        };
        assert_eq!(grant.size, 3, "the job's tasks by default");
        // Asked for, the step may use the whole node.
        let ClientResponse::StepGranted { grant, .. } =
            h.call(step(StepRequest { ntasks: Some(5), ..Default::default() }), &ann())
        else {
            panic!("no step")
        };
        assert_eq!(grant.size, 5);
        // `-n 5` without a node count: 5 tasks over the nodes they need (one, whole).
        let o = SubmitOptions { exclusive: Some(true), cores: Some(5), ..opts() };
        let ClientResponse::Submitted { id: five } = submit(&mut h, o) else { panic!("refused") };
        let j = &h.ctl.jobs[&five];
        assert_eq!((j.options.nodes, j.options.cores), (Some(1), Some(8)));
        assert_eq!(j.options.tasks, Some(JobTasks { total: 5, per_node: None }));
        // A submission cannot set the record itself.
        let forged = SubmitOptions { tasks: Some(JobTasks { total: 99, per_node: None }), ..opts() };
        let ClientResponse::Submitted { id: plain } = submit(&mut h, forged) else { panic!("refused") };
        assert_eq!(h.ctl.jobs[&plain].options.tasks, None);
    }

    fn submit_script(h: &mut Harness, script: &str) -> berth_core::JobId {
        let sub = SubmitRequest {
            script: script.into(),
            script_name: "job.sh".into(),
            options: SubmitOptions { walltime: Some(600), mem_per_cpu: Some(1 << 20), ..Default::default() },
            env: vec![],
            cwd: "/tmp".into(),
            hold: false,
            ignore_unsupported: false,
        };
        match h.call(ClientRequest::Submit(Box::new(sub)), &ann()) {
            ClientResponse::Submitted { id } => id,
            other => panic!("refused: {other:?}"),
        }
    }

    #[test]
    fn slurm_uneven_tasks_are_kept_and_laid_out_3_then_2() {
        use berth_core::directives::JobTasks;
        let mut h = Harness::new(2);
        // `-N 2 -n 5`: 3 CPUs on each node (shapes are even), 5 tasks, as Slurm's SLURM_NTASKS.
        let id = submit_script(&mut h, "#!/bin/sh\n#SBATCH -N 2 -n 5\ntrue\n");
        h.ctl.schedule(h.now).unwrap();
        let job = &h.ctl.jobs[&id];
        assert_eq!(job.state, JobState::Running);
        assert_eq!((job.options.nodes, job.options.tasks_per_node), (Some(2), Some(3)));
        assert_eq!(job.options.tasks, Some(JobTasks { total: 5, per_node: None }));
        let compat = h.ctl.launch_spec(job, 0).compat.expect("[compat] environment is on by default");
        // No SLURM_NTASKS_PER_NODE: the job did not give one (as Slurm).
        assert_eq!((compat.tasks, compat.tasks_per_node), (Some(JobTasks { total: 5, per_node: None }), None));
        // Exclusive: whole nodes of 8, still 5 tasks, 3 on the first node and 2 on the second.
        let ex = submit_script(&mut h, "#!/bin/sh\n#SBATCH -N 2 -n 5 --exclusive\ntrue\n");
        let job = &h.ctl.jobs[&ex];
        assert_eq!((job.options.nodes, job.options.cores), (Some(2), Some(16)));
        assert_eq!(job.options.tasks, Some(JobTasks { total: 5, per_node: Some(3) }));
        // An even count needs no record; a count the shape cannot hold is not kept.
        let even = submit_script(&mut h, "#!/bin/sh\n#SBATCH -N 2 -n 6\ntrue\n");
        assert_eq!(h.ctl.jobs[&even].options.tasks, None);
        let sub = SubmitRequest {
            script: "#!/bin/sh\ntrue\n".into(),
            script_name: "job.sh".into(),
            options: SubmitOptions {
                nodes: Some(2),
                tasks_per_node: Some(3),
                tasks: Some(JobTasks { total: 3, per_node: None }),
                walltime: Some(600),
                ..Default::default()
            },
            env: vec![],
            cwd: "/tmp".into(),
            hold: false,
            ignore_unsupported: false,
        };
        let ClientResponse::Submitted { id: odd } = h.call(ClientRequest::Submit(Box::new(sub)), &ann()) else {
            panic!("refused")
        };
        assert_eq!(h.ctl.jobs[&odd].options.tasks, None, "3 tasks would leave a node empty");
    }

    fn job_node(h: &Harness, id: berth_core::JobId) -> berth_core::NodeId {
        h.ctl.jobs[&id].allocation[0].node_id
    }
}
