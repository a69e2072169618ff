use super::*;
use crate::directives::parse_script_with;

fn opts(script: &str) -> SubmitOptions {
    let f = parse_foreign(script).unwrap();
    assert!(f.unsupported.is_empty(), "{:?}", f.unsupported);
    f.options
}

#[test]
fn slurm_directives_map_onto_berths_options() {
    let o = opts(
        "#!/bin/bash\n#SBATCH -N 2 --ntasks=6 -t 1:00\n#SBATCH --job-name=sim -c 2 --mem=4000\n#SBATCH -p long -A physics -o out-%j.txt\n#SBATCH --error err.txt --mem-per-cpu 1G --no-requeue\n#SBATCH -C bigmem&fast\nsrun ./a.out\n#SBATCH -N 9\n",
    );
    assert_eq!((o.nodes, o.tasks_per_node, o.cpus_per_task), (Some(2), Some(3), Some(2)));
    assert_eq!(o.walltime, Some(60), "Slurm's 1:00 is one minute");
    assert_eq!(o.name.as_deref(), Some("sim"));
    assert_eq!(o.mem, Some(4000 << 20), "a bare --mem is megabytes");
    assert_eq!(o.mem_per_cpu, Some(1 << 30));
    assert_eq!((o.queue.as_deref(), o.account.as_deref()), (Some("long"), Some("physics")));
    assert_eq!((o.output.as_deref(), o.error.as_deref()), (Some("out-%j.txt"), Some("err.txt")));
    assert_eq!(o.requeue, Some(false));
    assert_eq!(o.properties, Some(vec!["bigmem".to_string(), "fast".to_string()]));
}

#[test]
fn slurm_times_tasks_and_node_ranges() {
    let t = |v: &str| opts(&format!("#!/bin/sh\n#SBATCH --time={v}\n")).walltime;
    assert_eq!(t("30"), Some(1800));
    // Slurm's limits are minutes: a time with seconds is rounded up, as Slurm does.
    assert_eq!(t("10:30"), Some(660));
    assert_eq!(t("0:06"), Some(60));
    assert_eq!(t("45:00"), Some(2700));
    assert_eq!(t("2:00:00"), Some(7200));
    assert_eq!(t("1-0"), Some(86_400));
    assert_eq!(t("1-2:30"), Some(86_400 + 2 * 3600 + 1800));
    assert_eq!(t("1-00:00:05"), Some(86_460));
    assert_eq!(t("1:00:01"), Some(3660));
    // -n alone is the job's cores (times -c); with a node range the minimum is taken.
    let o = opts("#!/bin/sh\n#SBATCH -n 4 -c 2\n");
    assert_eq!((o.cores, o.nodes), (Some(8), None));
    let o = opts("#!/bin/sh\n#SBATCH -n 5\n#SBATCH --nodes=2-4\n");
    assert_eq!((o.nodes, o.tasks_per_node), (Some(2), Some(3)), "5 tasks over 2 nodes: 3 per node");
    let five = crate::directives::JobTasks { total: 5, per_node: None };
    assert_eq!(o.tasks, Some(five), "and the job's 5 tasks kept (3 + 2, as Slurm lays them out)");
    assert_eq!(opts("#!/bin/sh\n#SBATCH -N 2 -n 6\n").tasks, None, "even: the tasks follow from the cores");
    let o = opts("#!/bin/sh\n#SBATCH --ntasks-per-node=4 -n 8\n");
    assert_eq!((o.nodes, o.tasks_per_node), (Some(2), Some(4)));
}

#[test]
fn pbs_directives_map_onto_berths_options() {
    let o = opts("#!/bin/sh\n#PBS -l nodes=2:ppn=3\n#PBS -l walltime=01:30:00,mem=8gb\n#PBS -N sim -q batch -A phys\n#PBS -o out.txt -e err.txt\necho\n");
    assert_eq!((o.nodes, o.tasks_per_node), (Some(2), Some(3)));
    assert_eq!(o.walltime, Some(5400));
    assert_eq!(o.mem, Some(4 << 30), "-l mem is the job's total: 4 GiB on each of 2 nodes");
    assert_eq!(
        (o.name.as_deref(), o.queue.as_deref(), o.account.as_deref()),
        (Some("sim"), Some("batch"), Some("phys"))
    );
    assert_eq!((o.output.as_deref(), o.error.as_deref()), (Some("out.txt"), Some("err.txt")));
    let o = opts("#!/bin/sh\n#PBS -l select=3:ncpus=8:mpiprocs=4:mem=16gb\n#PBS -l place=scatter\n");
    assert_eq!((o.nodes, o.tasks_per_node, o.cpus_per_task, o.mem), (Some(3), Some(4), Some(2), Some(16 << 30)));
    let o = opts("#!/bin/sh\n#PBS -l ncpus=4 -r n\n#PBS -l mem=512mb\n");
    assert_eq!((o.cores, o.requeue, o.mem), (Some(4), Some(false), Some(512 << 20)));
    let f = parse_foreign("#!/bin/sh\n#PBS -V -h -l place=pack\n").unwrap();
    assert_eq!(f.unsupported.len(), 1, "-V is supported (the whole environment): {:?}", f.unsupported);
    assert_eq!(f.options.hold, Some(true), "-h submits held");
}

#[test]
fn dependencies_begin_and_hold() {
    use crate::directives::{Begin, DepKind};
    let o = opts("#!/bin/sh\n#SBATCH -d afterok:4:5\n#SBATCH --begin=now+1hour\n#SBATCH -H\n");
    assert_eq!(o.dependency.as_ref().map(ToString::to_string).as_deref(), Some("afterok:4:5"));
    assert_eq!((o.begin, o.hold), (Some(Begin::In(3600)), Some(true)));
    let o = opts("#!/bin/sh\n#SBATCH --dependency=afterany:3?singleton --hold\n#SBATCH -b 16:00\n");
    let d = o.dependency.unwrap();
    assert!(d.any && d.terms[1].kind == DepKind::Singleton);
    assert_eq!((o.begin, o.hold), (Some(Begin::Clock { hour: 16, minute: 0, second: 0 }), Some(true)));
    assert_eq!(opts("#!/bin/sh\n#SBATCH -dafterok:9\n").dependency.unwrap().to_string(), "afterok:9");
    let o = opts("#!/bin/sh\n#PBS -W depend=afterok:12.head:13.head,afternotok:14\n#PBS -h\n");
    assert_eq!(o.dependency.unwrap().to_string(), "afterok:12:13,afternotok:14");
    assert_eq!(o.hold, Some(true));
    // Kinds berth does not have are unsupported (errors, or warnings when asked) ...
    let f = parse_foreign("#!/bin/sh\n#SBATCH -d expand:3\n#PBS -W depend=beforeok:3\n#PBS -W group_list=x\n").unwrap();
    let lines: Vec<usize> = f.unsupported.iter().map(|(l, _)| *l).collect();
    assert_eq!(lines, vec![2, 3, 4], "{:?}", f.unsupported);
    assert!(f.unsupported[0].1.contains("expand"), "{:?}", f.unsupported);
    // `aftercorr` (arrays) is read.
    let o = opts("#!/bin/sh\n#SBATCH -d aftercorr:3\n");
    assert_eq!(o.dependency.map(|d| d.to_string()).as_deref(), Some("aftercorr:3"));
    // ... malformed values are errors naming the line.
    for (script, needle) in [
        ("#!/bin/sh\n#SBATCH -d afterok:x\n", "not a job id"),
        ("#!/bin/sh\n#SBATCH --dependency=afterok:1,afterok:2?afterok:3\n", "mixes"),
        ("#!/bin/sh\n#SBATCH --begin=soonish\n", "not a time"),
        ("#!/bin/sh\n#SBATCH --begin=now+500days\n", "a year"),
        ("#!/bin/sh\n#PBS -W depend=afterok\n", "names no job"),
    ] {
        let e = parse_foreign(script).unwrap_err();
        let (line, message) = (e.line, e.to_string());
        assert_eq!(line, 2, "{script:?}");
        assert!(message.contains(needle), "{script:?}: {message}");
    }
    // #BERTH spells them as berth submit's flags.
    let o =
        crate::directives::parse_script("#!/bin/sh\n#BERTH --dependency afterok:2 --begin now+60 --hold\n").unwrap();
    assert_eq!(
        (o.dependency.unwrap().to_string(), o.begin, o.hold),
        ("afterok:2".into(), Some(Begin::In(60)), Some(true))
    );
    assert!(crate::directives::parse_script("#!/bin/sh\n#BERTH --dependency afterok\n").is_err());
}

#[test]
fn nothing_is_silently_ignored() {
    let f = parse_foreign(
        "#!/bin/sh\n#SBATCH --uid=5 --gid=5\n#SBATCH --licenses=a|b\n#PBS -k eod\n#SBATCH -o out-%5j.txt\n",
    )
    .unwrap();
    let lines: Vec<usize> = f.unsupported.iter().map(|(l, _)| *l).collect();
    assert_eq!(lines, vec![2, 2, 3, 4, 5], "{:?}", f.unsupported);
    assert!(f.unsupported[0].1.contains("--uid=5"), "{:?}", f.unsupported);
    assert!(f.unsupported[2].1.contains("--licenses=a|b: not supported"), "{:?}", f.unsupported);
    assert!(f.unsupported[4].1.contains("%5"), "{:?}", f.unsupported);
    // An error by default, naming the line and the directive; warnings when asked.
    let script = "#!/bin/sh\n#SBATCH -n 2\n#SBATCH --licenses=lic@db\n";
    let e = parse_script_with(script, false).unwrap_err().to_string();
    assert!(e.starts_with("line 3:") && e.contains("--licenses=lic@db") && e.contains("--ignore-unsupported"), "{e}");
    let (o, warnings) = parse_script_with(script, true).unwrap();
    assert_eq!(o.cores, Some(2));
    assert_eq!(warnings.len(), 1);
    assert!(warnings[0].starts_with("line 3: #SBATCH --licenses"), "{warnings:?}");
}

#[test]
fn berth_directives_win_over_foreign_ones_and_flags_over_both() {
    let script = "#!/bin/sh\n#SBATCH -J slurm-name -t 10\n#BERTH --name berth-name\n";
    let (o, _) = parse_script_with(script, false).unwrap();
    assert_eq!((o.name.as_deref(), o.walltime), (Some("berth-name"), Some(600)));
    let mut flags = SubmitOptions::default();
    flags.set("walltime", "30").unwrap();
    assert_eq!(o.overlay(flags).walltime, Some(30));
}

#[test]
fn malformed_values_are_errors_with_the_line() {
    for (script, needle) in [
        ("#!/bin/sh\n#SBATCH -N zero\n", "-N needs a node count"),
        ("#!/bin/sh\n\n#SBATCH --time=soon\n", "not a Slurm time"),
        ("#!/bin/sh\n#SBATCH --mem=lots\n", "--mem needs a size"),
        ("#!/bin/sh\n#SBATCH --ntasks\n", "--ntasks needs a value"),
        ("#!/bin/sh\n#PBS -l select=2:ncpus=3:mpiprocs=2\n", "not a multiple"),
        ("#!/bin/sh\n#PBS -l walltime=1:2:3:4\n", "walltime needs"),
        ("#!/bin/sh\n#PBS -l nodes\n", "expected name=value"),
    ] {
        let e = parse_foreign(script).unwrap_err();
        let (line, message) = (e.line, e.to_string());
        assert_eq!(line, script.lines().position(|l| l.starts_with("#SBATCH") || l.starts_with("#PBS")).unwrap() + 1);
        assert!(message.contains(needle), "{script:?}: {message}");
    }
}

proptest::proptest! {
    #[test]
    fn never_panics(s in ".{0,200}") {
        let _ = parse_foreign(&format!("#!/bin/sh\n#SBATCH {s}\n"));
        let _ = parse_foreign(&format!("#!/bin/sh\n#PBS {s}\n"));
        let _ = parse_foreign(&format!("#!/bin/sh\n#PBS -l {s}\n"));
    }
}

#[test]
fn arrays_in_every_dialect() {
    let spec = |script: &str| opts(script).array.map(|a| a.to_string());
    assert_eq!(spec("#!/bin/sh\n#SBATCH --array=1-4%2\n").as_deref(), Some("1-4%2"));
    assert_eq!(spec("#!/bin/sh\n#SBATCH -a 1,3,5-7\n").as_deref(), Some("1,3,5-7"));
    assert_eq!(spec("#!/bin/sh\n#SBATCH -a0-15:4\n").as_deref(), Some("0-15:4"));
    assert_eq!(spec("#!/bin/sh\n#SBATCH --array 0-99%10\n").as_deref(), Some("0-99%10"));
    assert_eq!(spec("#!/bin/sh\n#PBS -J 1-10:2\n").as_deref(), Some("1-10:2"));
    assert_eq!(spec("#!/bin/sh\n#PBS -J 0-7%3\n").as_deref(), Some("0-7%3"));
    let (o, _) = parse_script_with("#!/bin/sh\n#SBATCH -a 1-9\n#BERTH --array 2-3\n", false).unwrap();
    assert_eq!(o.array.unwrap().to_string(), "2-3", "#BERTH wins");
    // %A and %a are array patterns now.
    let o = opts("#!/bin/sh\n#SBATCH --array=1-2 -o %A_%a.out -e err-%a\n");
    assert_eq!((o.output.as_deref(), o.error.as_deref()), (Some("%A_%a.out"), Some("err-%a")));
    for (script, needle) in [
        ("#!/bin/sh\n#SBATCH --array=5-1\n", "ends before it starts"),
        ("#!/bin/sh\n#SBATCH -a 1-4%0\n", "running limit"),
        ("#!/bin/sh\n#SBATCH --array=x\n", "not a whole number"),
        ("#!/bin/sh\n#PBS -J 5\n", "give a range"),
        ("#!/bin/sh\n#PBS -J 1-1\n", "at least two"),
    ] {
        let e = parse_foreign(script).unwrap_err();
        let (line, message) = (e.line, e.to_string());
        assert_eq!(line, 2, "{script:?}");
        assert!(message.contains(needle), "{script:?}: {message}");
    }
    let e = crate::directives::parse_script("#!/bin/sh\n#BERTH --array 1-4:0\n").unwrap_err().to_string();
    assert!(e.contains("step"), "{e}");
}

#[test]
fn corpus_fixes_no_kill_unknown_switches_ompthreads_excl_and_pbs_gpus() {
    // -k/--no-kill is berth's --no-kill.
    assert_eq!(opts("#!/bin/sh\n#SBATCH -k -n 2\n").no_kill, Some(true));
    assert_eq!(opts("#!/bin/sh\n#SBATCH --no-kill=off\n").no_kill, Some(false));
    // An unknown option with no value after it is unsupported, not malformed.
    let f = parse_foreign("#!/bin/sh\n#SBATCH --get-user-env\n#SBATCH --get-user-env -n 2\n").unwrap();
    assert_eq!(f.unsupported.len(), 2, "{:?}", f.unsupported);
    assert!(f.unsupported[0].1.contains("--get-user-env: not supported"), "{:?}", f.unsupported);
    assert_eq!(f.options.cores, Some(2));
    // ... but a known one still needs its value.
    assert!(parse_foreign("#!/bin/sh\n#SBATCH --time\n").is_err());
    // PBS: ompthreads is read, place=...:excl is exclusive.
    let o = opts("#!/bin/sh\n#PBS -l select=2:ncpus=128:mpiprocs=4:ompthreads=32\n#PBS -l place=scatter:excl\n");
    assert_eq!((o.nodes, o.tasks_per_node, o.cpus_per_task, o.exclusive), (Some(2), Some(4), Some(32), Some(true)));
    assert!(parse_foreign("#!/bin/sh\n#PBS -l select=1:ncpus=4:ompthreads=0\n").is_err());
    // PBS GPU requests: per chunk (so per node), Torque's per node, PBS Pro's job-wide.
    let o = opts("#!/bin/sh\n#PBS -l select=2:ncpus=4:ngpus=2:gpu_type=A100\n");
    assert_eq!((o.nodes, o.gpus_per_node, o.gpu_type.as_deref()), (Some(2), Some(2), Some("a100")));
    assert_eq!(opts("#!/bin/sh\n#PBS -l nodes=1:ppn=4:gpus=2\n").gpus_per_node, Some(2));
    assert_eq!(opts("#!/bin/sh\n#PBS -l ngpus=3\n").gpus, Some(3));
    for bad in ["#PBS -l select=1:ngpus=0", "#PBS -l select=1:ngpus=257", "#PBS -l ngpus=x"] {
        assert!(parse_foreign(&format!("#!/bin/sh\n{bad}\n")).is_err(), "{bad}");
    }
    let f = parse_foreign("#!/bin/sh\n#PBS -l select=1:ncpus=4:naccelerators=1\n").unwrap();
    assert!(f.unsupported[0].1.contains("naccelerators is not supported"), "{:?}", f.unsupported);
}

/// PBS custom resources (docs/gres.md): a count in a chunk is a generic resource of each
/// chunk's node, a count job-wide a license; PBS's own resources and values that are not
/// counts stay unsupported, by name.
#[test]
fn pbs_custom_resources_are_gres_in_chunks_and_licenses_job_wide() {
    let counts =
        |items: &[(&str, u32)]| -> crate::gres::Counts { items.iter().map(|(n, c)| (n.to_string(), *c)).collect() };
    let o = opts("#!/bin/sh\n#PBS -l select=2:ncpus=2:nvme=10:fpga=1\n#PBS -l matlab=2,ansys=1\n#PBS -l matlab=3\n");
    assert_eq!(o.nodes, Some(2));
    assert_eq!(o.gres, Some(counts(&[("fpga", 1), ("nvme", 10)])));
    assert_eq!(o.licenses, Some(counts(&[("ansys", 1), ("matlab", 3)])), "the last matlab= wins");
    for (script, what) in [
        ("#PBS -l nice=5", "resource nice is not supported"),
        ("#PBS -l software=matlab", "resource software is not supported"),
        ("#PBS -l select=1:ncpus=2:vmem=4", "chunk resource vmem is not supported"),
        ("#PBS -l select=1:ncpus=2:nvme=10gb", "chunk resource nvme is not supported"),
        ("#PBS -l 9lives=1", "resource 9lives is not supported"),
    ] {
        let f = parse_foreign(&format!("#!/bin/sh\n{script}\n")).unwrap();
        assert!(f.unsupported.first().is_some_and(|u| u.1.contains(what)), "{script}: {:?}", f.unsupported);
        assert!(f.options.gres.is_none() && f.options.licenses.is_none(), "{script}");
    }
    for bad in ["#PBS -l matlab=0", "#PBS -l select=1:nvme=1000000001"] {
        assert!(parse_foreign(&format!("#!/bin/sh\n{bad}\n")).is_err(), "{bad}");
    }
}

#[test]
fn slurm_gpu_requests() {
    let opts = |s: &str| parse_foreign(s).unwrap().options;
    let o = opts("#!/bin/sh\n#SBATCH --gres=gpu:V100:2\n");
    assert_eq!((o.gpus_per_node, o.gpu_type.as_deref(), o.gpus), (Some(2), Some("v100"), None));
    assert_eq!(opts("#!/bin/sh\n#SBATCH --gres=gpu\n").gpus_per_node, Some(1));
    assert_eq!(opts("#!/bin/sh\n#SBATCH --gres=gpu:3\n").gpus_per_node, Some(3));
    let o = opts("#!/bin/sh\n#SBATCH --gres=gpu:a100\n");
    assert_eq!((o.gpus_per_node, o.gpu_type.as_deref()), (Some(1), Some("a100")));
    let o = opts("#!/bin/sh\n#SBATCH -G 4\n");
    assert_eq!((o.gpus, o.gpus_per_node), (Some(4), None));
    let o = opts("#!/bin/sh\n#SBATCH --gpus=a100:8\n");
    assert_eq!((o.gpus, o.gpu_type.as_deref()), (Some(8), Some("a100")));
    assert_eq!(opts("#!/bin/sh\n#SBATCH --gpus-per-node=2\n").gpus_per_node, Some(2));
    // Bounded, and malformed counts are errors.
    for bad in ["--gres=gpu:0", "--gres=gpu:a:b:c", "--gpus-per-node=257", "--gpus=0", "-G x", "--gres=gpu:a b:1"] {
        assert!(parse_foreign(&format!("#!/bin/sh\n#SBATCH {bad}\n")).is_err(), "{bad}");
    }
    // Other generic resources are counts of the nodes' [gres] (docs/gres.md); the GPU part
    // goes to the GPUs.
    let f = parse_foreign("#!/bin/sh\n#SBATCH --gres=gpu:v100:1,nvme:10,fpga\n").unwrap();
    assert!(f.unsupported.is_empty(), "{:?}", f.unsupported);
    assert_eq!(f.options.gpus_per_node, Some(1));
    let want: crate::gres::Counts = [("fpga".to_string(), 1), ("nvme".to_string(), 10)].into_iter().collect();
    assert_eq!(f.options.gres, Some(want));
    // Typed ones by their type (`nvme:fast`), `nvme:fast` alone is one of that type.
    let f = parse_foreign("#!/bin/sh\n#SBATCH --gres=nvme:fast:10,fpga:big\n").unwrap();
    assert!(f.unsupported.is_empty(), "{:?}", f.unsupported);
    let want: crate::gres::Counts = [("fpga:big".to_string(), 1), ("nvme:fast".to_string(), 10)].into_iter().collect();
    assert_eq!(f.options.gres, Some(want));
    for bad in
        ["--gres=nvme:0", "--gres=9x:1", "--gres=nvme:9x:1", "--gres=nvme:a:b:1", "-L matlab:0", "--licenses=a,a"]
    {
        assert!(parse_foreign(&format!("#!/bin/sh\n#SBATCH {bad}\n")).is_err(), "{bad}");
    }
    // Licenses: -L and --licenses, NAME[:COUNT] items; alternatives and remote ones refused.
    let f = parse_foreign("#!/bin/sh\n#SBATCH -L matlab:2,ansys\n").unwrap();
    let want: crate::gres::Counts = [("ansys".to_string(), 1), ("matlab".to_string(), 2)].into_iter().collect();
    assert_eq!(f.options.licenses, Some(want.clone()));
    assert_eq!(parse_foreign("#!/bin/sh\n#SBATCH --licenses=matlab:2,ansys\n").unwrap().options.licenses, Some(want));
    let f = parse_foreign("#!/bin/sh\n#SBATCH -L a|b\n").unwrap();
    assert!(f.unsupported[0].1.contains("no | alternatives"), "{:?}", f.unsupported);
    // berth's own spelling in #BERTH lines.
    let o = crate::directives::parse_script("#!/bin/sh\n#BERTH --gres nvme:5\n#BERTH --licenses matlab:1\n").unwrap();
    assert_eq!((o.gres.unwrap()["nvme"], o.licenses.unwrap()["matlab"]), (5, 1));
    let f = parse_foreign("#!/bin/sh\n#SBATCH --gpus-per-socket=1 --gpus=a100:1,v100:1\n").unwrap();
    assert_eq!(f.unsupported.len(), 1, "{:?}", f.unsupported);
    assert!(f.unsupported[0].1.contains("several types"), "{:?}", f.unsupported);
    // Several GPU types in one --gres (Slurm's multiple gres): not read, said so (the last
    // item silently won before); the other items are still read.
    let f = parse_foreign("#!/bin/sh\n#SBATCH --gres=gpu:a100:1,nvme:5,gpu:v100:2\n").unwrap();
    assert_eq!(f.unsupported.len(), 1, "{:?}", f.unsupported);
    assert!(
        f.unsupported[0].1.contains("several types") && f.unsupported[0].1.contains("gpu:v100:2"),
        "{:?}",
        f.unsupported
    );
    assert_eq!((f.options.gpus_per_node, f.options.gpu_type.as_deref()), (None, None));
    assert_eq!(f.options.gres.as_ref().map(|g| g["nvme"]), Some(5));
    // berth's --gres refuses them with a typed error that says what to do.
    for v in ["gpu:a100:1,gpu:v100:2", "gpu:1,gpu:2"] {
        let mut o = crate::directives::SubmitOptions::default();
        let err = o.set("gres", v).unwrap_err();
        assert!(matches!(err, crate::directives::OptionError::GpuTypes { .. }), "{v}: {err:?}");
        let text = err.to_string();
        assert!(text.contains("one type") && text.contains("a job per type"), "{text}");
        assert_eq!(o.gpus_per_node, None, "{v}: nothing set");
    }
    let mut o = crate::directives::SubmitOptions::default();
    o.set("gres", "gpu:a100:2,nvme:1").unwrap();
    assert_eq!((o.gpus_per_node, o.gpu_type.as_deref()), (Some(2), Some("a100")));
    // Per socket (Slurm's --gpus-per-socket with --sockets-per-node) is read.
    let f = parse_foreign("#!/bin/sh\n#SBATCH --gpus-per-socket=a100:2 --sockets-per-node=2\n").unwrap();
    assert!(f.unsupported.is_empty(), "{:?}", f.unsupported);
    let o = &f.options;
    assert_eq!((o.gpus_per_socket, o.sockets_per_node, o.gpu_type.as_deref()), (Some(2), Some(2), Some("a100")));
    assert_eq!(o.request().gpus_per_socket().unwrap(), Some((2, 2)));
    assert!(parse_foreign("#!/bin/sh\n#SBATCH --sockets-per-node=0\n").is_err());
    assert!(parse_foreign("#!/bin/sh\n#SBATCH --gpus-per-socket=300\n").is_err());
    // Per-task GPUs and their binding, the CPUs and memory per GPU are read.
    let f = parse_foreign(
        "#!/bin/sh\n#SBATCH -n 4 --gpus-per-task=a100:1 --gpu-bind=verbose,closest\n#SBATCH --cpus-per-gpu=8 --mem-per-gpu=16G\n",
    )
    .unwrap();
    assert!(f.unsupported.is_empty(), "{:?}", f.unsupported);
    let o = &f.options;
    assert_eq!(
        (o.gpus_per_task, o.gpu_type.as_deref(), o.gpu_bind.as_deref()),
        (Some(1), Some("a100"), Some("closest"))
    );
    assert_eq!((o.cpus_per_gpu, o.mem_per_gpu), (Some(8), Some(16 << 30)));
    let f =
        parse_foreign("#!/bin/sh\n#SBATCH --gpu-bind=single:1\n#SBATCH --gpu-bind=verbose,mask_gpu:0x3*2\n").unwrap();
    assert!(f.unsupported.is_empty(), "{:?}", f.unsupported);
    assert_eq!(f.options.gpu_bind.as_deref(), Some("mask_gpu:0x3,0x3"), "the last one");
    let f = parse_foreign("#!/bin/sh\n#SBATCH --gpu-bind=sockets\n").unwrap();
    assert!(f.unsupported[0].1.contains("--gpu-bind takes closest, none, map_gpu"), "{:?}", f.unsupported);
}

#[test]
fn outputs_follow_the_dialect_of_the_script() {
    use crate::directives::Join;
    let patterns = |script: &str| output_patterns(&parse_script_with(script, false).unwrap().0);
    let pair = |a: &str, b: &str| (a.to_string(), b.to_string());
    // berth's own: two files.
    assert_eq!(patterns("#!/bin/sh\ntrue\n"), pair("berth-%j.out", "berth-%j.err"));
    assert_eq!(patterns("#!/bin/sh\n#BERTH --output o.txt\n"), pair("o.txt", "berth-%j.err"));
    assert_eq!(patterns("#!/bin/sh\n#PBS -l ncpus=2\n"), pair("berth-%j.out", "berth-%j.err"));
    // Slurm's: stderr with stdout unless -e; slurm-%j.out (slurm-%A_%a.out for an array).
    assert_eq!(patterns("#!/bin/sh\n#SBATCH -n 2\n"), pair("slurm-%j.out", "slurm-%j.out"));
    assert_eq!(patterns("#!/bin/sh\n#SBATCH -a 1-3\n"), pair("slurm-%A_%a.out", "slurm-%A_%a.out"));
    assert_eq!(patterns("#!/bin/sh\n#SBATCH -o x-%N.out\n"), pair("x-%N.out", "x-%N.out"));
    assert_eq!(patterns("#!/bin/sh\n#SBATCH -e e.txt\n"), pair("slurm-%j.out", "e.txt"));
    assert_eq!(patterns("#!/bin/sh\n#SBATCH -o o.txt -e e.txt\n"), pair("o.txt", "e.txt"));
    assert_eq!(patterns("#!/bin/sh\n#SBATCH -n 1\n#BERTH --output b.txt\n"), pair("b.txt", "b.txt"));
    // The command line (sbatch -o c.txt over #SBATCH -o a.txt): both to c.txt, as Slurm.
    let (script, _) = parse_script_with("#!/bin/sh\n#SBATCH -o a.txt\n", false).unwrap();
    assert_eq!(script.join, Some(Join::Slurm));
    let flags = SubmitOptions { output: Some("c.txt".into()), ..Default::default() };
    assert_eq!(output_patterns(&script.overlay(flags)), pair("c.txt", "c.txt"));
    // PBS's -j: oe joins stderr into the output file (whatever -e says), eo the other way, n not.
    assert_eq!(patterns("#!/bin/sh\n#PBS -j oe\n#PBS -o o -e e\n"), pair("o", "o"));
    assert_eq!(patterns("#!/bin/sh\n#PBS -j oe\n"), pair("berth-%j.out", "berth-%j.out"));
    assert_eq!(patterns("#!/bin/sh\n#PBS -j eo -o o -e e\n"), pair("e", "e"));
    assert_eq!(patterns("#!/bin/sh\n#PBS -j n -o o\n"), pair("o", "berth-%j.err"));
    // An explicit #PBS -j is kept over a Slurm script's rule; a bad -j is an error on its line.
    assert_eq!(patterns("#!/bin/sh\n#SBATCH -o o\n#PBS -j n\n"), pair("o", "berth-%j.err"));
    let e = parse_foreign("#!/bin/sh\n#PBS -j oo\n").unwrap_err();
    let (line, message) = (e.line, e.to_string());
    assert_eq!(line, 2);
    assert!(message.contains("oe, eo or n"), "{message}");
}

#[test]
fn pbs_shell_must_be_the_scripts_own() {
    // parsl's PBSProProvider: `#!/bin/bash` and `#PBS -S /bin/bash`.
    let f = parse_foreign("#!/bin/bash\n#PBS -S /bin/bash\n#PBS -N p\n").unwrap();
    assert!(f.unsupported.is_empty(), "{:?}", f.unsupported);
    assert_eq!(f.options.name.as_deref(), Some("p"));
    let f = parse_foreign("#!/bin/sh\n#PBS -S /bin/csh\n").unwrap();
    assert_eq!(f.unsupported.len(), 1, "{:?}", f.unsupported);
    assert!(f.unsupported[0].1.contains("#!/bin/csh"), "{:?}", f.unsupported);
}

/// Every refusal's whole message, as the typed errors print it: these are what users read
/// (`berth submit`, the system tests), unchanged from when they were formatted in place.
#[test]
fn refusals_read_exactly_as_before() {
    for (script, expected) in [
        ("#!/bin/sh\n#SBATCH x\n", "#SBATCH: expected an option, found \"x\""),
        ("#!/bin/sh\n#SBATCH --ntasks\n", "#SBATCH: --ntasks needs a value"),
        ("#!/bin/sh\n#SBATCH -J \" \"\n", "#SBATCH: -J needs a value"),
        ("#!/bin/sh\n#SBATCH -n 0\n", "#SBATCH: -n needs a positive number, got \"0\""),
        ("#!/bin/sh\n#SBATCH -N zero\n", "#SBATCH: -N needs a node count or min-max, got \"zero\""),
        ("#!/bin/sh\n#SBATCH --mem=lots\n", "#SBATCH: --mem needs a size such as 4000 (MB) or 4G, got \"lots\""),
        (
            "#!/bin/sh\n#SBATCH --mem-per-cpu=0\n",
            "#SBATCH: --mem-per-cpu needs a size such as 2000 (MB) or 2G, got \"0\"",
        ),
        (
            "#!/bin/sh\n#SBATCH --mem-per-gpu=x\n",
            "#SBATCH: --mem-per-gpu needs a size such as 16000 (MB) or 16G, got \"x\"",
        ),
        (
            "#!/bin/sh\n#SBATCH -t soon\n",
            "#SBATCH: -t: \"soon\" is not a Slurm time (minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS)",
        ),
        ("#!/bin/sh\n#SBATCH -k=yes\n", "#SBATCH: -k takes no value (or =off), got \"yes\""),
        ("#!/bin/sh\n#SBATCH --open-mode=x\n", "#SBATCH: --open-mode takes append or truncate, got \"x\""),
        ("#!/bin/sh\n#SBATCH --gres=gpu:a:b:c\n", "#SBATCH: --gres: \"gpu:a:b:c\" is not gpu[:type][:count]"),
        ("#!/bin/sh\n#SBATCH --gpus=0\n", "#SBATCH: --gpus needs a GPU count from 1 to 65536, got \"0\""),
        ("#!/bin/sh\n#SBATCH -n 4294967295 -c 2\n", "#SBATCH: -n is too large"),
        ("#!/bin/sh\n#SBATCH \"-J x\n", "unterminated double quote"),
        ("#!/bin/sh\n#PBS -S ,\n", "#PBS: -S needs the path of a shell"),
        ("#!/bin/sh\n#PBS -j x\n", "#PBS: -j takes oe, eo or n, got \"x\""),
        ("#!/bin/sh\n#PBS -r x\n", "#PBS: -r takes y or n, got \"x\""),
        ("#!/bin/sh\n#PBS -l nodes\n", "#PBS: -l nodes: expected name=value"),
        ("#!/bin/sh\n#PBS -l select=2:ncpus\n", "#PBS: -l select=2:ncpus: expected name=value, got \"ncpus\""),
        ("#!/bin/sh\n#PBS -l select=1:mem=x\n", "#PBS: -l select=1:mem=x: bad size \"x\""),
        ("#!/bin/sh\n#PBS -l mem=0\n", "#PBS: -l mem: bad size \"0\""),
        (
            "#!/bin/sh\n#PBS -l select=2:ncpus=3:mpiprocs=2\n",
            "#PBS: -l select=2:ncpus=3:mpiprocs=2: ncpus=3 is not a multiple of mpiprocs=2",
        ),
        ("#!/bin/sh\n#PBS -l ncpus=x\n", "#PBS: -l ncpus needs a positive number, got \"x\""),
        ("#!/bin/sh\n#PBS -l walltime=1:2:3:4\n", "#PBS: -l walltime needs [[HH:]MM:]SS, got \"1:2:3:4\""),
        ("#!/bin/sh\n#PBS -W depend=afterok\n", "#PBS: -W depend: "),
        ("#!/bin/sh\n#SBATCH --begin=soonish\n", "#SBATCH: --begin: "),
        ("#!/bin/sh\n#SBATCH --array=x\n", "#SBATCH: --array: "),
    ] {
        let e = parse_foreign(script).unwrap_err();
        let message = e.to_string();
        if expected.ends_with(": ") {
            // The rest is the dependency, time or array parser's own message.
            assert!(message.starts_with(expected) && message.len() > expected.len(), "{script:?}: {message}");
        } else {
            assert_eq!(message, expected, "{script:?}");
        }
        assert_eq!(e.line, 2, "{script:?}");
    }
    // Messages of berth's own parsers name the directive's flag.
    let e = parse_foreign("#!/bin/sh\n#PBS -M \"\"\n").unwrap_err().to_string();
    assert!(e.starts_with("#PBS: -M ") && !e.contains("--mail-user"), "{e}");
    let e = parse_foreign("#!/bin/sh\n#SBATCH --comment \"\"\n").unwrap_err().to_string();
    assert_eq!(e, "#SBATCH: --comment needs a value");
    // Unsupported output patterns are warnings, with the pattern's message.
    let f = parse_foreign("#!/bin/sh\n#SBATCH -o out-%q\n").unwrap();
    assert_eq!(
        f.unsupported,
        vec![(2, "#SBATCH -o=out-%q: the pattern %q is not supported (%j or %J job id, %x job name, %u user, %A array id, %a array index, %% a percent sign are)".to_string())]
    );
}
