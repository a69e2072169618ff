//! System test: the launchers under their names (`srun`, `aprun`: `berth run` with their
//! spellings) inside and outside a job, and waiting for a job (`sbatch --wait`,
//! `qsub -W block=true`, `berth submit --wait`) on a live cluster (docs/compat.md, "Command
//! names").

mod common;

use common::*;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// `berth compat install` into the test directory; the directory of the links.
fn install(c: &Cluster) -> PathBuf {
    let bin = c.root().join("bin");
    let v = c.json(&["compat", "install", &bin.display().to_string()]);
    let names: Vec<&str> = v["links"].as_array().expect("links").iter().filter_map(|l| l["name"].as_str()).collect();
    for n in ["srun", "aprun"] {
        assert!(names.contains(&n), "{n} not installed: {v:#}");
        assert!(bin.join(n).is_symlink());
    }
    bin
}

/// Run a link with `args` against the cluster, outside any job.
fn run(c: &Cluster, bin: &std::path::Path, name: &str, args: &[&str]) -> Output {
    Command::new(bin.join(name))
        .args(args)
        .env("BERTH_DIR", &c.dir)
        .env_remove("BERTH_JOB_ID")
        .env_remove("SLURM_JOB_ID")
        .current_dir(c.root())
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {name}: {e}"))
}

fn sorted_lines(s: &str) -> Vec<String> {
    let mut v: Vec<String> = s.lines().map(String::from).collect();
    v.sort();
    v
}

fn host() -> String {
    nix::unistd::gethostname().unwrap().to_string_lossy().into_owned()
}

#[test]
fn srun_and_aprun_outside_and_inside_a_job() {
    let c = Cluster::up(2, "package:1 core:4 pu:1");
    let bin = install(&c);
    let h = host();

    // Outside a job: an interactive allocation, as `berth run`.
    let o = run(&c, &bin, "srun", &["-n", "2", "-l", "hostname"]);
    assert!(o.status.success(), "srun outside a job: {}{}\n{}", text(&o.stdout), text(&o.stderr), c.logs());
    assert_eq!(sorted_lines(&text(&o.stdout)), [format!("0: {h}"), format!("1: {h}")]);
    let o = run(&c, &bin, "aprun", &["-n", "2", "-N", "1", "sh", "-c", "echo pe $BERTH_RANK node $BERTH_NODEID"]);
    assert!(o.status.success(), "aprun outside a job: {}{}\n{}", text(&o.stdout), text(&o.stderr), c.logs());
    assert_eq!(sorted_lines(&text(&o.stdout)), ["pe 0 node 0", "pe 1 node 1"], "-N 1: one PE per node");
    // The worst rank's status; refusals name the option, exit 1.
    let o = run(&c, &bin, "srun", &["-n", "2", "sh", "-c", "exit 7"]);
    assert_eq!(o.status.code(), Some(7), "{}", text(&o.stderr));
    let o = run(&c, &bin, "srun", &["--mpi=cray_shasta", "-n", "1", "true"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).starts_with("srun: error: --mpi=cray_shasta"), "{}", text(&o.stderr));
    let o = run(&c, &bin, "aprun", &["-n", "1", "-cc", "0,1", "true"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).starts_with("aprun: -cc 0,1"), "{}", text(&o.stderr));
    // -o: every rank's output in one file (stderr too, without -e); -i none.
    let o = run(
        &c,
        &bin,
        "srun",
        &["-n", "2", "-i", "none", "-o", "out.txt", "sh", "-c", "echo o$BERTH_RANK; echo e$BERTH_RANK >&2"],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let file = std::fs::read_to_string(c.root().join("out.txt")).expect("out.txt");
    assert_eq!(sorted_lines(&file), ["e0", "e1", "o0", "o1"]);

    // Inside a job: steps of the job, on its allocation.
    let b = bin.display();
    let script = format!(
        "#!/bin/sh\n#SBATCH -N 2 --ntasks-per-node 2 -o berth-%j.out -e berth-%j.err\n\
         {b}/srun -n 2 -l hostname\n\
         {b}/srun -n 2 -N 2 sh -c 'echo srun $SLURM_PROCID on $BERTH_NODEID of job $BERTH_JOB_ID'\n\
         {b}/aprun -n 2 -N 1 sh -c 'echo aprun $BERTH_RANK on $BERTH_NODEID'\n\
         {b}/aprun -n 4 -N 2 -d 1 -cc cpu sh -c 'echo cpus $BERTH_RANK $BERTH_RANK_CPUS'\n\
         {b}/srun -N 1 -n 1 --nodelist=$(echo $BERTH_NODES | cut -d, -f1) --input none sh -c 'echo listed $BERTH_NODEID'\n\
         {b}/srun -N 1 -n 1 --nodelist=$(echo $BERTH_NODES | cut -d, -f2) true; echo second-node=$?\n\
         {b}/srun -n 2 -N 1 sh -c 'touch busy; sleep 3' &\n\
         while [ ! -e busy ]; do sleep 0.1; done\n\
         {b}/srun -N 1 -n 1 -w $(echo $BERTH_NODES | cut -d, -f1) true; echo busy-first=$?\n\
         wait\n"
    );
    let id = c.submit("launch.sh", &script, &[]);
    let j = c.wait_finished(id, Duration::from_secs(60));
    let out = std::fs::read_to_string(c.root().join(format!("berth-{id}.out"))).unwrap_or_default();
    let err = std::fs::read_to_string(c.root().join(format!("berth-{id}.err"))).unwrap_or_default();
    assert_eq!(j["state"], "completed", "{j:#}\n{out}\n{err}\n{}", c.logs());
    let lines: Vec<&str> = out.lines().collect();
    let has = |l: &str| lines.contains(&l);
    assert!(has(&format!("0: {h}")) && has(&format!("1: {h}")), "srun -l in the job: {out}");
    assert!(has(&format!("srun 0 on 0 of job {id}")) && has(&format!("srun 1 on 1 of job {id}")), "{out}");
    assert!(has("aprun 0 on 0") && has("aprun 1 on 1"), "{out}");
    let cpus: Vec<&str> = lines.iter().filter(|l| l.starts_with("cpus ")).copied().collect();
    assert_eq!(cpus.len(), 4, "{out}");
    assert!(has("listed 0"), "the job's first node can be named: {out}");
    assert!(has("second-node=1"), "another node alone cannot: {out}");
    assert!(err.contains("cannot choose"), "the refusal says why: {err}");
    // The first node busy: the step would go to the second, so it is given back unlaunched.
    assert!(has("busy-first=1"), "{out}");
    assert!(err.contains("nothing was started"), "{err}");
    // Every step is in the job's invocation log.
    let steps = c.show(id)["steps"].as_array().map(|s| s.len()).unwrap_or(0);
    assert!(steps >= 5, "steps of job {id}: {steps}");
    // sacct lists them after the job, as `N.S` lines (not with -X); with -j and without.
    let fields = ["-P", "-n", "-o", "JobID,JobName,State,NNodes"];
    let id_text = id.to_string();
    let by_id: Vec<&str> = ["-j", id_text.as_str()].into_iter().chain(fields).collect();
    for args in [by_id.clone(), fields.to_vec()] {
        let o = run(&c, &bin, "sacct", &args);
        let acct = text(&o.stdout);
        let lines: Vec<&str> = acct.lines().filter(|l| l.starts_with(&format!("{id}"))).collect();
        assert!(lines[0].starts_with(&format!("{id}|")) && lines[0].contains("|COMPLETED|2"), "{acct}");
        assert_eq!(lines.len(), 1 + steps, "the job and each step: {acct}");
        // berth numbers steps from 1, as SLURM_STEP_ID inside them says.
        let first = format!("{id}.1|hostname|COMPLETED|");
        assert!(lines[1].starts_with(&first), "srun -n 2 -l hostname: {acct}");
    }
    let x: Vec<&str> = by_id.into_iter().chain(["-X"]).collect();
    assert_eq!(text(&run(&c, &bin, "sacct", &x).stdout).lines().count(), 1);
}

#[test]
fn waiting_for_a_job_gives_its_exit_code() {
    let c = Cluster::up(1, "package:1 core:2 pu:1");
    let bin = install(&c);

    // sbatch --wait: `Submitted batch job N`, then the job's exit code once it has ended.
    let o = run(&c, &bin, "sbatch", &["--wait", "--wrap", "sleep 1; exit 3"]);
    assert_eq!(o.status.code(), Some(3), "{}{}", text(&o.stdout), text(&o.stderr));
    let said = text(&o.stdout);
    let id: u64 = said.trim().strip_prefix("Submitted batch job ").and_then(|s| s.parse().ok()).expect(&said);
    assert_eq!(c.show(id)["state"], "failed");
    let o = run(&c, &bin, "sbatch", &["-W", "--parsable", "--wrap", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let id: u64 = text(&o.stdout).trim().parse().unwrap();
    assert_eq!(c.show(id)["state"], "completed");

    // qsub -W block=true: the id, then the job's exit status.
    let o = run(&c, &bin, "qsub", &["-W", "block=true", "--", "/bin/sh", "-c", "exit 4"]);
    assert_eq!(o.status.code(), Some(4), "{}{}", text(&o.stdout), text(&o.stderr));
    assert!(text(&o.stdout).trim().contains('.'), "N.SERVER: {}", text(&o.stdout));

    // berth submit --wait: the id, then the status (128+N for a signal).
    std::fs::write(c.root().join("five.sh"), "#!/bin/sh\nexit 5\n").unwrap();
    std::fs::write(c.root().join("killed.sh"), "#!/bin/sh\nkill -USR1 $$\n").unwrap();
    let o = c.berth(&["submit", "--wait", "five.sh"]);
    assert_eq!(o.status.code(), Some(5), "{}", text(&o.stderr));
    assert!(text(&o.stdout).trim().parse::<u64>().is_ok(), "{}", text(&o.stdout));
    let o = c.berth(&["submit", "-W", "five.sh", "killed.sh"]);
    assert_eq!(o.status.code(), Some(128 + 10), "the worst: SIGUSR1 {}", text(&o.stderr));
}

/// MPICH's mpiexec (hydra) inside a job, told to leave berth's default (`berth-rsh`, see
/// system_mpirun.rs), sees `SLURM_JOB_ID` and starts its proxies with `srun -N K -n K --input
/// none hydra_pmi_proxy ...`: through the `srun` link they are a step of the job, one per
/// node, and the ranks they fork run.
#[test]
fn mpich_mpiexec_in_a_job_launches_through_srun() {
    let c = Cluster::up(2, "package:1 core:4 pu:1");
    let bin = install(&c);
    let hello = mpi_programs().join("hello");
    let script = format!(
        "#!/bin/sh\n#SBATCH -N 2 --ntasks-per-node 2 -o berth-%j.out -e berth-%j.err\nexport PATH={}:$PATH\nunset HYDRA_LAUNCHER HYDRA_LAUNCHER_EXEC HYDRA_HOST_FILE\nmpiexec -n 4 {}\n",
        bin.display(),
        hello.display()
    );
    let id = c.submit("mpich.sh", &script, &[]);
    let j = c.wait_finished(id, Duration::from_secs(90));
    let out = std::fs::read_to_string(c.root().join(format!("berth-{id}.out"))).unwrap_or_default();
    let err = std::fs::read_to_string(c.root().join(format!("berth-{id}.err"))).unwrap_or_default();
    assert_eq!(j["state"], "completed", "{j:#}\n{out}\n{err}\n{}", c.logs());
    let mut ranks: Vec<&str> = out.lines().filter(|l| l.starts_with("hello from rank")).collect();
    ranks.sort();
    assert_eq!(ranks.len(), 4, "{out}\n{err}");
    for (i, l) in ranks.iter().enumerate() {
        assert!(l.starts_with(&format!("hello from rank {i} of 4")), "{l}");
    }
    // The proxies were one step of the job: one per node.
    let steps = c.show(id)["steps"].clone();
    let step = &steps[0];
    assert!(step["argv"][0].as_str().unwrap_or("").ends_with("hydra_pmi_proxy"), "{steps:#}");
    assert_eq!(step["size"], 2, "{steps:#}");
    assert_eq!(step["nodes"].as_array().map(Vec::len), Some(2), "{steps:#}");
    assert_eq!(step["exit_code"], 0, "{steps:#}");
}
