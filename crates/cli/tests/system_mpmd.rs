//! System tests of MPMD steps (several programs in one `berth run`): the colon line
//! (`-n 2 a : -n 3 b`, each part its own count, layout, environment and directory), srun's
//! `--multi-prog` with `%t`/`%o`, aprun's colon form, labels and signals across every part, and
//! MPICH and Open MPI programs (crates/agent/tests/mpi/appnum.c) that read `MPI_APPNUM` and
//! talk across the parts.

mod common;

use common::*;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// 4 cores per agent: PUs map round-robin onto the host's 2 CPUs.
const TOPO: &str = "package:2 core:2 pu:1";

fn ok(c: &Cluster, env: &[(&str, &str)], args: &[&str]) -> String {
    let out = c.run_step(env, args);
    assert!(
        out.status.success(),
        "berth run {args:?}: {:?}\n{}{}\n{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr),
        c.logs()
    );
    text(&out.stdout)
}

/// Output lines sorted (ranks print in any order).
fn sorted(s: &str) -> Vec<String> {
    let mut v: Vec<String> = s.lines().map(str::to_string).collect();
    v.sort();
    v
}

#[test]
fn colon_parts_multi_prog_and_aprun_run_several_programs_in_one_step() {
    let c = Cluster::up(2, TOPO);
    let show = "echo $BERTH_RANK/$BERTH_SIZE app=$BERTH_APPNUM x=${X:-} pwd=$(pwd)";
    std::fs::create_dir_all(c.root().join("sub")).unwrap();
    // Outside a job: one interactive allocation for both parts; part 1 its own variable and
    // directory; ranks numbered across the parts; labels on every part.
    let out = ok(
        &c,
        &[],
        &["-l", "-n", "2", "sh", "-c", show, ":", "-n", "3", "--env", "X=y", "--chdir", "sub", "sh", "-c", show],
    );
    let root = c.root().display().to_string();
    let want: Vec<String> = (0..5)
        .map(|r| match r {
            0 | 1 => format!("{r}: {r}/5 app=0 x= pwd={root}"),
            _ => format!("{r}: {r}/5 app=1 x=y pwd={root}/sub"),
        })
        .collect();
    assert_eq!(sorted(&out), want, "{out}");
    let steps = c.json(&["acct", "--steps", "--limit", "1"]);
    let argv: Vec<&str> = steps[0]["argv"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    assert_eq!(&argv[..3], &["--ranks", "0-1", "sh"], "the invocation log holds every part: {steps}");
    assert!(argv.contains(&":") && argv.contains(&"2-4") && argv.contains(&"X=y"), "{steps}");

    // srun's --multi-prog: ranks per line, * for the rest, %t the rank, %o its offset.
    let conf = c.root().join("mp.conf");
    std::fs::write(&conf, "# even ranks, then the rest\n0,2 echo even %t %o\n* echo 'the rest' %t %o\n").unwrap();
    let out = ok(&c, &[], &["-n", "4", "--multi-prog", conf.to_str().unwrap()]);
    assert_eq!(sorted(&out), ["even 0 0", "even 2 1", "the rest 1 0", "the rest 3 1"], "{out}");
    // Without -n: the ranks the file names; as srun.
    std::fs::write(&conf, "0 sh -c 'echo first $BERTH_APPNUM'\n1-2 sh -c 'echo second $BERTH_APPNUM %o'\n").unwrap();
    let bin = c.root().join("bin");
    let o = Command::new(BIN).args(["compat", "install"]).arg(&bin).env("BERTH_DIR", &c.dir).output().unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = named_ok(&c, "srun", &["--multi-prog", conf.to_str().unwrap()]);
    assert_eq!(sorted(&out), ["first 0", "second 1 0", "second 1 1"], "{out}");
    // aprun's colon form.
    let out = named_ok(
        &c,
        "aprun",
        &[
            "-n",
            "1",
            "sh",
            "-c",
            "echo a $BERTH_RANK",
            ":",
            "-n",
            "2",
            "-e",
            "V=w",
            "sh",
            "-c",
            "echo b $BERTH_RANK $V",
        ],
    );
    assert_eq!(sorted(&out), ["a 0", "b 1 w", "b 2 w"], "{out}");

    // Bad lines are refused before anything runs, saying what to do.
    for (args, want) in [
        (vec!["-n", "1", "true", ":"], "part 2 of the MPMD command has no program"),
        (vec!["-n", "1", "true", ":", "-q", "true"], "unknown option \"-q\""),
        (
            vec!["-n", "1", "true", ":", "-n", "2", "-N", "2", "true"],
            "-N, --ntasks-per-node and --gpus-per-task per part need a job",
        ),
        (vec!["-n", "2", "--multi-prog", conf.to_str().unwrap()], "names rank 2, but the step has 2"),
    ] {
        let o = c.run_step(&[], &args);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", text(&o.stderr));
        assert!(text(&o.stderr).contains(want), "{args:?}: {}", text(&o.stderr));
    }

    // Inside a 2-node job: each part its own node set (-N), laid out after the parts before it.
    let script = format!(
        "#!/bin/sh\n{BIN} run -l -n 1 sh -c 'echo p0 $BERTH_NODEID' : -n 2 -N 2 sh -c 'echo p1 $BERTH_NODEID $BERTH_APPNUM'\n"
    );
    let id = c.submit("mpmd.sh", &script, &["--nodes", "2", "--tasks-per-node", "4"]);
    let job = c.wait_finished(id, Duration::from_secs(60));
    assert_eq!(job["state"], "completed", "{job:#}\n{}", c.logs());
    let out = std::fs::read_to_string(c.root().join(format!("berth-{id}.out"))).unwrap();
    assert_eq!(sorted(&out), ["0: p0 0", "1: p1 0 1", "2: p1 1 1"], "{out}");
    assert_no_job_cgroups(&c);
}

/// A signal `run` gets reaches the ranks of every part.
#[test]
fn signals_reach_every_part() {
    let c = Cluster::up(1, TOPO);
    let marker = format!("mpmd-signal-{}", std::process::id());
    let body = format!(
        "trap 'echo got $BERTH_RANK app $BERTH_APPNUM; exit 0' USR1; echo ready; i=0; while [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done # {marker}"
    );
    let mut child = Command::new(BIN)
        .arg("--dir")
        .arg(&c.dir)
        .args(["run", "-n", "1", "sh", "-c", &body, ":", "-n", "2", "sh", "-c", &body])
        .current_dir(c.root())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut ready = 0;
    while ready < 3 {
        match lines.next() {
            Some(Ok(l)) if l == "ready" => ready += 1,
            Some(Ok(_)) => {}
            _ => {
                let _ = child.kill();
                panic!("the ranks did not all start\n{}", c.logs());
            }
        }
    }
    // SAFETY: signalling our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGUSR1) }, 0);
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("the ranks did not end on SIGUSR1\n{}", c.logs());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let mut got = rest.clone();
    got.sort();
    assert_eq!(got, ["got 0 app 0", "got 1 app 1", "got 2 app 1"], "{rest:?}");
    assert!(child.wait().unwrap().success());
    assert_no_process(&marker);
}

/// The same MPI program as two parts (its argument differs) on 2 agents, 1 + 3 ranks: each
/// rank's MPI_APPNUM is its part's, MPI_Comm_split by it gives the parts' sizes, and the
/// allreduce over MPI_COMM_WORLD crosses the parts and the nodes.
fn appnum_suite(c: &Cluster, dir: &std::path::Path, env: &[(&str, &str)], mpi: &[&str]) {
    let prog = dir.join("appnum").display().to_string();
    let mut args: Vec<&str> = mpi.to_vec();
    args.extend(["-n", "1", &prog, "first", ":", "-n", "3", &prog, "second"]);
    let exports: String = env.iter().map(|(k, v)| format!("export {k}='{v}'\n")).collect();
    let script = |args: &[&str]| {
        let words: Vec<String> = args.iter().map(|a| format!("'{a}'")).collect();
        format!("#!/bin/sh\n{exports}{BIN} run {}\n", words.join(" "))
    };
    // In a 2-node job of 2 cores each: part 0 and part 1's first rank on node 0, the rest on node 1.
    let id = c.submit("appnum.sh", &script(&args), &["--nodes", "2", "--tasks-per-node", "2"]);
    let job = c.wait_finished(id, Duration::from_secs(90));
    let out = std::fs::read_to_string(c.root().join(format!("berth-{id}.out"))).unwrap_or_default();
    let err = std::fs::read_to_string(c.root().join(format!("berth-{id}.err"))).unwrap_or_default();
    assert_eq!(job["state"], "completed", "{job:#}\n{out}{err}\n{}", c.logs());
    let want: Vec<String> = (0..4)
        .map(|r| {
            let (app, part, arg) = if r == 0 { (0, 1, "first") } else { (1, 3, "second") };
            format!("appnum rank={r} size=4 app={app} part={part} arg={arg} sum=6 expected=6 app0=1")
        })
        .collect();
    assert_eq!(sorted(&out), want, "{out}{err}");
    let steps = c.json(&["acct", "--steps", "--limit", "1"]);
    assert_eq!(steps[0]["nodes"].as_array().map(Vec::len), Some(2), "{steps}");
    // --multi-prog: one line per program, %t in the arguments.
    std::fs::write(c.root().join("mp.conf"), format!("0-1 {prog} x%t\n2-3 {prog} y%t\n")).unwrap();
    let mut args: Vec<&str> = mpi.to_vec();
    args.extend(["-n", "4", "--multi-prog", "mp.conf"]);
    let id = c.submit("multi.sh", &script(&args), &["--nodes", "2", "--tasks-per-node", "2"]);
    let job = c.wait_finished(id, Duration::from_secs(90));
    let out = std::fs::read_to_string(c.root().join(format!("berth-{id}.out"))).unwrap_or_default();
    let err = std::fs::read_to_string(c.root().join(format!("berth-{id}.err"))).unwrap_or_default();
    assert_eq!(job["state"], "completed", "{job:#}\n{out}{err}\n{}", c.logs());
    let want: Vec<String> = (0..4)
        .map(|r| {
            let (app, arg) = if r < 2 { (0, format!("x{r}")) } else { (1, format!("y{r}")) };
            format!("appnum rank={r} size=4 app={app} part=2 arg={arg} sum=6 expected=6 app0=2")
        })
        .collect();
    assert_eq!(sorted(&out), want, "{out}{err}");
}

#[test]
fn mpich_programs_read_their_appnum_and_talk_across_the_parts() {
    let c = Cluster::up(2, TOPO);
    appnum_suite(&c, mpi_programs(), &[], &["--mpi", "pmi2"]);
    assert_no_job_cgroups(&c);
}

#[test]
fn open_mpi_programs_read_their_appnum_and_talk_across_the_parts() {
    let c = Cluster::up(2, TOPO);
    // Open MPI's TCP transport between the agents of this one host (see system_openmpi.rs).
    appnum_suite(&c, openmpi_programs(), &[("OMPI_MCA_btl_tcp_if_include", "lo")], &["--mpi", "pmix"]);
    assert_no_job_cgroups(&c);
}

/// PMIx's application data, read by a plain PMIx client (crates/agent/tests/mpi/pmixapp.c,
/// built with libpmix): each rank's PMIX_APPNUM and PMIX_APP_RANK, PMIX_JOB_NUM_APPS, and
/// per application PMIX_APP_SIZE and PMIX_APPLDR.
#[test]
fn pmix_clients_read_their_applications_data() {
    let c = Cluster::up(1, TOPO);
    let p = build_pmix_program(&c, "cc", "pmixapp");
    let out = ok(&c, &[], &["--mpi", "pmix", "-n", "1", &p, ":", "-n", "3", &p]);
    let want: Vec<String> = (0..4)
        .map(|r| match r {
            0 => "pmix rank=0 appnum=0 apps=2 appsize=1 appldr=0 apprank=0".to_string(),
            _ => format!("pmix rank={r} appnum=1 apps=2 appsize=3 appldr=1 apprank={}", r - 1),
        })
        .collect();
    assert_eq!(sorted(&out), want, "{out}");
    let out = ok(&c, &[], &["--mpi", "pmix", "-n", "2", &p]);
    assert_eq!(
        sorted(&out),
        [
            "pmix rank=0 appnum=0 apps=1 appsize=2 appldr=0 apprank=0",
            "pmix rank=1 appnum=0 apps=1 appsize=2 appldr=0 apprank=1"
        ],
        "{out}"
    );
}

/// A part's own `--overcommit`: in a job of 2 cores, a part of 2 ranks after one of 2 ranks
/// runs only when it may share their cores; without it the step is refused, naming the part.
#[test]
fn a_part_overcommits_on_its_own() {
    let c = Cluster::up(1, TOPO);
    let script = format!(
        "#!/bin/sh\n#BERTH --nodes 1 --cores 2\n\
         {BIN} run -n 2 sh -c 'echo a $BERTH_RANK' : -n 2 --overcommit sh -c 'echo b $BERTH_RANK'\n\
         echo over-rc=$?\n\
         {BIN} run -n 2 sh -c 'echo c $BERTH_RANK' : -n 2 sh -c 'echo d $BERTH_RANK'\n\
         echo plain-rc=$?\n"
    );
    let id = c.submit("over.sh", &script, &[]);
    let job = c.wait_finished(id, Duration::from_secs(60));
    let read = |f: &str| std::fs::read_to_string(c.root().join(f)).unwrap_or_default();
    let (out, err) = (read(&format!("berth-{id}.out")), read(&format!("berth-{id}.err")));
    assert_eq!(job["state"], "completed", "{job:#}\n{out}\n{err}\n{}", c.logs());
    let mut ran: Vec<&str> = out.lines().filter(|l| l.starts_with("a ") || l.starts_with("b ")).collect();
    ran.sort();
    assert_eq!(ran, ["a 0", "a 1", "b 2", "b 3"], "{out}\n{err}");
    assert!(out.contains("over-rc=0"), "{out}\n{err}");
    assert!(!out.contains("c 0") && !out.contains("d 2"), "{out}");
    assert!(!out.contains("plain-rc=0"), "{out}\n{err}");
    assert!(err.contains("part 2 of the MPMD command"), "the refusal names the part: {err}");
}
