use super::*;

fn v(s: &str) -> Vec<String> {
    s.split_whitespace().map(String::from).collect()
}

fn srun(s: &str) -> LaunchPlan {
    srun_plan(&v(s)).unwrap_or_else(|e| panic!("srun {s}: {e}"))
}

fn srun_err(s: &str) -> String {
    match srun_plan(&v(s)) {
        Ok(p) => panic!("srun {s} accepted: {p:?}"),
        Err(e) => e,
    }
}

fn aprun(s: &str) -> LaunchPlan {
    aprun_plan(&v(s)).unwrap_or_else(|e| panic!("aprun {s}: {e}"))
}

fn aprun_err(s: &str) -> String {
    match aprun_plan(&v(s)) {
        Ok(p) => panic!("aprun {s} accepted: {p:?}"),
        Err(e) => e,
    }
}

#[test]
fn srun_counts_and_label_are_berth_runs() {
    let p = srun("-n 4 -N 2 -c 2 -l ./a.out -n 9 --label");
    assert_eq!(p.args.ntasks, Some(4));
    assert_eq!(p.args.nodes, Some(2));
    assert_eq!(p.args.cpus_per_task, Some(2));
    assert!(p.args.label);
    assert_eq!(p.args.binding, "linear");
    assert_eq!(p.args.command, v("./a.out -n 9 --label"), "the program's arguments stay its own");
    // getopt's spellings.
    let q = srun("--ntasks=4 --nodes=2 --cpus-per-task=2 --label ./a.out -n 9 --label");
    assert_eq!(p, q);
    let r = srun("-n4 -N2 -c2 -l ./a.out -n 9 --label");
    assert_eq!(p, r);
    // min-max nodes: the minimum; --ntasks-per-node without -N: the nodes it needs.
    assert_eq!(srun("-N 2-4 true").args.nodes, Some(2));
    let p = srun("-n 6 --ntasks-per-node 3 true");
    assert_eq!((p.args.tasks_per_node, p.args.nodes), (Some(3), Some(2)));
    assert!(srun("-O true").args.overcommit);
    assert_eq!(srun("--jobid 12 true").args.job.as_deref(), Some("12"));
    assert_eq!(srun("--jobid=12.batch true").args.job.as_deref(), Some("12"));
    assert!(srun_err("--jobid x true").contains("--jobid"));
    assert!(srun_err("-n 0 true").contains("-n") || srun_err("-n 0 true").contains("ntasks"));
    assert!(srun_err("-n x true").contains("positive number"));
    assert!(srun_err("-n 2").contains("No command"));
}

#[test]
fn srun_kill_options() {
    assert!(!srun("true").args.no_kill);
    assert!(srun("-K0 true").args.no_kill);
    assert!(srun("--kill-on-bad-exit=0 true").args.no_kill);
    assert!(!srun("-K true").args.no_kill);
    assert!(srun("-k true").args.no_kill);
    assert!(srun_err("-K2 true").contains("0 or 1"));
}

#[test]
fn srun_mpi_types() {
    for ok in ["none", "pmi2", "pmi1", "pmi", "pmix", "pmix_v4", "auto"] {
        let p = srun(&format!("--mpi={ok} true"));
        assert_eq!(p.args.command, v("true"));
        assert_eq!(p.args.mpi.as_deref(), Some(ok), "carried to the step");
    }
    assert_eq!(srun("--mpi pmix_v3 true").args.mpi.as_deref(), Some("pmix_v3"));
    let e = srun_err("--mpi=cray_shasta true");
    assert!(e.contains("--mpi=cray_shasta") && e.contains("pmix"), "{e}");
    let list = srun("--mpi=list").info.unwrap();
    assert!(list.contains("pmi2") && list.contains("pmix"), "{list}");
    let p = srun("--mpi=cray_shasta --ignore-unsupported true");
    assert_eq!(p.warnings.len(), 1, "{p:?}");
    assert_eq!(p.args.mpi, None);
}

#[test]
fn srun_cpu_binding() {
    assert_eq!(srun("--cpu-bind=none true").args.binding, "none");
    assert_eq!(srun("--cpu-bind=verbose,cores true").args.binding, "linear");
    assert_eq!(srun("--cpu_bind=threads true").args.binding, "linear");
    assert_eq!(srun("--cpu-bind=quiet true").args.binding, "linear");
    assert!(srun_err("--cpu-bind=map_cpu:0,2 true").contains("map_cpu"));
    assert!(srun_err("--cpu-bind=sockets true").contains("sockets"));
    assert!(srun_err("--cpu-bind=bogus true").contains("bogus"));
    assert_eq!(srun("-m block:cyclic true").args.binding, "striding");
    assert_eq!(srun("-m block true").args.binding, "linear");
    assert_eq!(srun("--cpu-bind=none -m block:cyclic true").args.binding, "none");
    assert!(srun_err("-m cyclic true").contains("cyclic"));
    assert!(srun_err("--distribution=plane=2 true").contains("plane"));
}

#[test]
fn srun_gpus_per_task_and_gpu_bind_are_berth_runs() {
    let p = srun("-n 2 --gpus-per-task=a100:1 --gpu-bind=verbose,closest true");
    assert_eq!((p.args.gpus_per_task, p.args.gpu_bind.as_deref()), (Some(1), Some("closest")));
    assert_eq!(srun("--gpu-bind map_gpu:1,0 true").args.gpu_bind.as_deref(), Some("map:1,0"));
    assert_eq!(srun("--gpu-bind=per_task:2 true").args.gpu_bind.as_deref(), Some("per_task:2"));
    assert!(srun_err("--gpu-bind=single:0 true").contains("--gpu-bind"));
    assert!(srun_err("--gpus-per-task=0 true").contains("positive number"));
}

/// Issue 20: outside a job srun's GPU counts, `--gres` and `-L` are the interactive
/// allocation's (berth run's options of those names); inside one (`--jobid`) they are refused
/// by name, or a warning with `--ignore-unsupported`, never dropped silently.
#[test]
fn srun_gres_gpus_and_licenses_outside_a_job_refused_in_one() {
    if std::env::var("BERTH_JOB_ID").is_err() {
        let p = srun("-G a100:2 --gres=nvme:100 -L matlab:2,ansys --gpus-per-socket=1 --sockets-per-node 2 true");
        let a = &p.args;
        assert_eq!((a.gpus.as_deref(), a.gpu_type.as_deref()), (Some("2"), Some("a100")));
        assert_eq!((a.gres.as_deref(), a.licenses.as_deref()), (Some("nvme:100"), Some("matlab:2,ansys")));
        assert_eq!((a.gpus_per_socket.as_deref(), a.sockets_per_node.as_deref()), (Some("1"), Some("2")));
        assert_eq!(srun("--gpus-per-node=4 true").args.gpus_per_node.as_deref(), Some("4"));
        let ask = crate::run::interactive_ask(a, false, None).unwrap();
        assert_eq!((ask.gpus, ask.gpu_type.as_deref()), (Some(2), Some("a100")));
        assert_eq!(ask.licenses.get("matlab"), Some(&2));
        assert_eq!(ask.licenses.get("ansys"), Some(&1));
        assert_eq!(ask.gres.get("nvme"), Some(&100));
        assert_eq!((ask.gpus_per_socket, ask.sockets_per_node), (Some(1), Some(2)));
        // `--gres gpu:...` items are GPUs per node, as in a batch job.
        let gpu = srun("--gres=gpu:k80:2 true");
        let ask = crate::run::interactive_ask(&gpu.args, false, None).unwrap();
        assert_eq!((ask.gpus_per_node, ask.gpu_type.as_deref(), ask.gres.len()), (Some(2), Some("k80"), 0));
        let bad = srun("-L matlab:0 true");
        let e = crate::run::interactive_ask(&bad.args, false, None).unwrap_err().to_string();
        assert!(e.contains("--licenses") && e.contains("matlab"), "{e}");
    }
    for line in ["--jobid 3 --gres=nvme:1 true", "--jobid 3 -L matlab true", "--jobid 3 -G 1 true"] {
        let e = srun_err(line);
        assert!(e.contains("a step runs on its job's") && e.contains("--ignore-unsupported"), "{line}: {e}");
    }
    let p = srun("--jobid 3 --gres=nvme:1 --ignore-unsupported true");
    assert!(p.warnings.iter().any(|w| w.contains("--gres=nvme:1")), "{p:?}");
    assert_eq!(p.args.gres, None);
    // berth run in a job refuses them too.
    let args = crate::run::RunArgs { licenses: Some("matlab".into()), ..Default::default() };
    let e = crate::run::interactive_ask(&args, true, None).unwrap_err().to_string();
    assert!(e.contains("--licenses: a step runs on its job's"), "{e}");
}

#[test]
fn srun_streams() {
    let p = srun("-i none -o out.txt true");
    assert_eq!(p.stdin, Some(Redirect::Null));
    assert_eq!(p.stdout, Some(Redirect::File("out.txt".into())));
    assert_eq!(p.stderr, None, "stderr follows --output (applied when launching)");
    assert_eq!(srun("--input=0 true").stdin, None);
    assert_eq!(srun("-e err -o none true").stderr, Some(Redirect::File("err".into())));
    assert_eq!(srun("-o 100%%.txt true").stdout, Some(Redirect::File("100%.txt".into())));
    assert!(srun_err("-o out-%t.txt true").contains("patterns"));
    // Patterns with one value for the whole step are expanded (submitit's `%j_%t_log.out`).
    let p = srun("--jobid 7 -n 1 -o /d/%j_%t_log.out -e /d/%j_%4t.err true");
    assert_eq!(p.stdout, Some(Redirect::File("/d/7_0_log.out".into())));
    assert_eq!(p.stderr, Some(Redirect::File("/d/7_0000.err".into())));
    assert!(srun_err("--jobid 7 -n 2 -o %j_%t.out true").contains("one-task step"));
    assert!(srun_err("--jobid 7 -n 1 -o %s.out true").contains("%s"));
    assert!(srun_err("-o 3 true").contains("one task"));
    assert!(srun_err("--input=all true").contains("rank 0"));
}

#[test]
fn srun_time_chdir_export() {
    // Outside a job (the test's environment may be inside one: then -t is a note).
    if std::env::var("BERTH_JOB_ID").is_err() {
        assert_eq!(srun("-t 10 true").args.walltime.as_deref(), Some("600"));
        // Rounded up to the minute, as Slurm keeps its limits.
        assert_eq!(srun("--time=1-00:00:01 true").args.walltime.as_deref(), Some("86460"));
    }
    let p = srun("--jobid 3 -t 5 true");
    assert_eq!(p.args.walltime, None);
    assert!(p.warnings[0].contains("time limit"), "{p:?}");
    assert!(srun_err("-t soon true").contains("Slurm time"));
    assert_eq!(srun("-D /tmp true").chdir.as_deref(), Some("/tmp"));
    let p = srun("--export=ALL,A=1,B=x=y true");
    assert_eq!(p.env, vec![("A".into(), "1".into()), ("B".into(), "x=y".into())]);
    assert!(srun_err("--export=NONE true").contains("ALL"));
}

#[test]
fn srun_refuses_by_name_and_knows_its_options() {
    let e = srun_err("-p debug true");
    assert!(e.contains("--partition=debug") && e.contains("not supported"), "{e}");
    assert!(srun_err("--mem=4G true").contains("--mem=4G"));
    assert!(srun_err("--pty bash").contains("--pty"));
    assert_eq!(srun_err("--bogus true"), "unrecognized option '--bogus'");
    // Accepted as they are: steps never share cores; output is relayed as it comes.
    assert_eq!(srun("--exclusive -u -v -Q true").args.command, v("true"));
    assert!(srun("-Q true").quiet);
    assert!(srun("--help").info.unwrap().contains("berth run"));
    assert!(srun("-V").info.unwrap().starts_with("slurm "));
}

#[test]
fn what_mpich_hydra_passes() {
    // MPICH 4 (hydra) under Slurm's resource manager: one proxy per node, stdin closed. The
    // proxy forks the ranks: it is not bound, or they would share its one core.
    let p = srun("-N 2 -n 2 --input none /usr/bin/hydra_pmi_proxy --control-port h:1 --proxy-id -1");
    assert_eq!((p.args.ntasks, p.args.nodes), (Some(2), Some(2)));
    assert_eq!(p.stdin, Some(Redirect::Null));
    assert_eq!(p.args.binding, "none");
    assert_eq!(p.args.command[0], "/usr/bin/hydra_pmi_proxy");
    assert_eq!(srun("--cpu-bind=cores hydra_pmi_proxy").args.binding, "linear", "an explicit binding stands");
}

#[test]
fn a_node_list_is_the_jobs_first_nodes_or_refused() {
    let job = v("node3 node1 node2");
    let job: Vec<String> = job.into_iter().collect();
    assert_eq!(nodes_for("node3", Some(1), true, &job).unwrap(), v("node3"));
    assert_eq!(nodes_for("node[1,3]", None, true, &job).unwrap(), v("node1 node3"));
    assert_eq!(nodes_for("node1,node3,node3", Some(2), true, &job).unwrap(), v("node1 node3"));
    let e = nodes_for("node2", Some(1), true, &job).unwrap_err();
    assert!(e.contains("cannot choose node2") && e.contains("node3"), "{e}");
    assert!(nodes_for("node[1,3]", Some(3), true, &job).unwrap_err().contains("-N 3"));
    assert!(nodes_for("node1", None, false, &job).unwrap_err().contains("interactive"));
    assert!(nodes_for("node1", None, true, &[]).unwrap_err().contains("BERTH_NODES"));
    assert!(nodes_for("/tmp/hosts", None, true, &job).unwrap_err().contains("file"));
    assert!(nodes_for("node[1", None, true, &job).is_err());
    // Outside a job srun refuses a node list, naming it.
    if std::env::var("BERTH_JOB_ID").is_err() {
        assert!(srun_err("-w node1 true").contains("--nodelist=node1"));
    }
}

#[test]
fn aprun_spellings() {
    // -N is PEs per node (srun's -N counts nodes): -n 4 -N 2 is 2 nodes of 2.
    let p = aprun("-n 4 -N 2 -d 2 -cc depth ./a.out -n 1");
    assert_eq!(p.args.ntasks, Some(4));
    assert_eq!(p.args.tasks_per_node, Some(2));
    assert_eq!(p.args.nodes, Some(2));
    assert_eq!(p.args.cpus_per_task, Some(2));
    assert_eq!(p.args.binding, "linear");
    assert_eq!(p.args.command, v("./a.out -n 1"));
    assert_eq!(aprun("-n4 -N1 true").args.nodes, Some(4));
    assert_eq!(aprun("-n 3 -N 2 true").args.nodes, Some(2));
    assert_eq!(aprun("-n 3 true").args.nodes, None);
    assert_eq!(aprun("-cc none true").args.binding, "none");
    assert_eq!(aprun("-ccnone true").args.binding, "none");
    assert_eq!(aprun("-cc cpu true").args.binding, "linear");
    assert_eq!(aprun("-e OMP_NUM_THREADS=4 -q -b -B true").env, vec![("OMP_NUM_THREADS".into(), "4".into())]);
    assert!(aprun("--help").info.unwrap().contains("PEs per node"));
}

#[test]
fn aprun_colon_form_is_a_colon_line_of_berth_run() {
    // Each executable its own PEs, PEs per node, depth, binding and variables; berth run's
    // colon line lays the parts out one after another (crate::mpmd).
    let p = aprun("-n 2 -e A=1 ./a.out x : -n 4 -N 2 -d 2 -cc none -e B=2 ./b.out -n 1");
    assert_eq!((p.args.ntasks, p.env.clone()), (Some(2), vec![("A".into(), "1".into())]));
    let want = "./a.out x : -n 4 --ntasks-per-node 2 -N 2 -d 2 --binding none --env B=2 ./b.out -n 1";
    assert_eq!(p.args.command, v(want));
    let first = berth_core::step::StepRequest { ntasks: Some(2), ..Default::default() };
    let apps = crate::mpmd::colon_apps(&p.args.command, &first, "/").unwrap().unwrap();
    let b = apps[1].request.clone().unwrap();
    assert_eq!((b.ntasks, b.tasks_per_node, b.nodes, b.cpus_per_task), (Some(4), Some(2), Some(2), Some(2)));
    assert_eq!((apps[1].env.clone(), apps[1].argv.clone()), (vec![("B".into(), "2".into())], v("./b.out -n 1")));
}

#[test]
fn srun_multi_prog_takes_the_file_as_its_first_operand() {
    let p = srun("-n 4 --multi-prog mp.conf");
    assert_eq!((p.args.multi_prog.as_deref(), p.args.command.len()), (Some("mp.conf"), 0));
    assert!(srun_err("-n 4 --multi-prog mp.conf extra").contains("give nothing after it"));
    assert!(srun_err("-n 4 --multi-prog").contains("No command"));
}

#[test]
fn aprun_refuses_by_name() {
    assert!(aprun_err("-cc 0,2,4 true").contains("-cc 0,2,4"));
    assert!(aprun_err("-cc numa_node true").contains("numa_node"));
    assert!(aprun_err("-S 2 true").contains("-S 2"));
    assert!(aprun_err("-j 2 true").contains("-j 2"));
    assert!(aprun_err("-L 12,13 true").contains("-L"));
    assert!(aprun_err("-ss true").contains("-ss"));
    assert_eq!(aprun_err("-x true"), "invalid option -x");
    assert!(aprun_err("-n").contains("requires an argument"));
    assert!(aprun_err("-n 0 true").contains("positive"));
    assert!(aprun_err("-n 2").contains("no executable"));
    assert!(aprun_err("-n 2 a.out : -n 2").contains("executable 2 (after `:`): no executable"));
    assert!(aprun_err("-n 2 a.out : -q b.out").contains("before the first executable"));
    assert!(aprun_err("-n 2 a.out : -S 2 b.out").contains("-S 2"));
    assert!(aprun_err("-e X true").contains("VAR=value"));
    let p = aprun("-S 2 --ignore-unsupported true");
    assert_eq!(p.warnings.len(), 1);
}
