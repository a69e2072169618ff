//! System test: real, widely used third-party tools that drive Slurm and PBS through their
//! commands and parse their output, run unchanged against berth (issue 19, "Real tools";
//! docs/compat.md, "Real tools in CI"). The tools are installed from PyPI at test time, at
//! the pinned versions below, into a virtual environment under Cargo's target directory;
//! berth's command links (`berth compat install`) come first on PATH. A tool that cannot be
//! installed fails the test: nothing here is skipped.
//!
//! - submitit (Slurm): `sbatch --parsable` of its own scripts (`--open-mode=append`,
//!   `--signal=USR2@90`, `--wckey`), `srun --output %j_%t_log.out` inside the job, `sacct -o
//!   JobID,State,NodeList --parsable2 -j`, job arrays, `scancel`.
//! - dask-jobqueue (PBS and Slurm): `PBSCluster` (`qsub` of `#PBS -l select=1:ncpus=1:mem=1GB`,
//!   `#PBS -o DIR/`, `qdel`) and `SLURMCluster` (`sbatch` with `-o dask-worker-%J.out`,
//!   `scancel`), each worker job connecting back and computing.
//! - parsl (PBS): `PBSProProvider` blocks (`#PBS -S /bin/bash`, `qsub -q`, `qstat -f -F json`,
//!   `qdel`) running a Python app.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The tools and versions CI runs (docs/compat.md lists the same).
const PACKAGES: &[&str] =
    &["submitit==1.5.4", "dask-jobqueue==0.9.0", "dask==2026.8.0", "distributed==2026.8.0", "parsl==2026.10.26"];

/// The Python helper scripts (tests/tools/).
fn tools_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/tools")
}

/// A virtual environment with the pinned tools, made once under the target directory (kept
/// between runs: pip then only checks the pins). Panics, with pip's output, when it cannot be
/// made: no PyPI, no `python3 -m venv` (scripts/setup.sh installs python3-venv).
fn venv() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("real-tools-venv");
    let python = dir.join("bin/python");
    if !python.exists() {
        let o = Command::new("python3").args(["-m", "venv", "--clear"]).arg(&dir).output().unwrap_or_else(|e| {
            panic!("cannot run python3 to make a virtual environment: {e}; install python3 and python3-venv (bash scripts/setup.sh)")
        });
        assert!(
            o.status.success(),
            "python3 -m venv {} failed (install python3-venv: bash scripts/setup.sh): {}{}",
            dir.display(),
            text(&o.stdout),
            text(&o.stderr)
        );
    }
    let o = Command::new(&python)
        .args(["-m", "pip", "install", "--disable-pip-version-check", "--quiet"])
        .args(PACKAGES)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", python.display()));
    assert!(
        o.status.success(),
        "pip install {PACKAGES:?} failed: this test needs PyPI (the real tools are installed at test time) \
         and does not skip without it: {}{}",
        text(&o.stdout),
        text(&o.stderr)
    );
    dir
}

/// Run `script` (in tests/tools/) with the venv's Python, berth's command links first on
/// PATH, against cluster `c`; its output, or a panic with it (and the cluster's logs) when it
/// fails or takes longer than `limit`.
fn run_tool(c: &Cluster, venv: &Path, bin: &Path, script: &str, args: &[&str], limit: Duration) -> String {
    let path =
        format!("{}:{}:{}", bin.display(), venv.join("bin").display(), std::env::var("PATH").unwrap_or_default());
    let out_file = c.root().join(format!("{script}.log"));
    let log = std::fs::File::create(&out_file).expect("tool log");
    let mut child = Command::new(venv.join("bin/python"))
        .arg(tools_dir().join(script))
        .args(args)
        .env("PATH", path)
        .env("BERTH_DIR", &c.dir)
        .env("PYTHONUNBUFFERED", "1")
        .current_dir(c.root())
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("tool log"))
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("run {script}: {e}"));
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait for the tool") {
            break Some(s);
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let output = std::fs::read_to_string(&out_file).unwrap_or_default();
    match status {
        Some(s) if s.success() => output,
        Some(s) => panic!("{script} {args:?} failed ({s}):\n{output}\ncluster logs:\n{}", c.logs()),
        None => panic!("{script} {args:?} took longer than {limit:?}:\n{output}\ncluster logs:\n{}", c.logs()),
    }
}

/// Every job the tools ran, from `berth acct`: (id, name, state).
fn acct_rows(c: &Cluster, extra: &[&str]) -> Vec<(u64, String, String)> {
    let mut args = vec!["acct", "--starttime", "now-1hours", "--state", "completed,cancelled,failed,running,pending"];
    args.extend_from_slice(extra);
    let v = c.json(&args);
    v.as_array()
        .expect("acct --json is a list")
        .iter()
        .map(|j| {
            (
                j["id"].as_u64().expect("id"),
                j["name"].as_str().unwrap_or("").to_string(),
                j["state"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

#[test]
fn real_tools_drive_berth_unchanged() {
    require_root();
    let venv = venv();
    let c = Cluster::up(2, "package:1 core:4 pu:1");
    let bin = c.root().join("bin");
    let installed = c.json(&["compat", "install", &bin.display().to_string()]);
    assert!(installed["links"].as_array().is_some_and(|l| !l.is_empty()), "{installed:#}");
    let limit = Duration::from_secs(90);

    // submitit (Slurm): a function's result, an array, a cancel; states read through sacct.
    let folder = c.root().join("submitit");
    let out = run_tool(&c, &venv, &bin, "submitit_slurm.py", &[&folder.display().to_string()], limit);
    assert!(out.contains("result 42"), "{out}");
    assert!(out.contains("squares [1, 4, 9]"), "{out}");
    assert!(out.contains("cancelled CANCELLED"), "{out}");
    assert!(out.contains("submitit ok 1.5.4"), "{out}");
    let id: u64 = out
        .lines()
        .find_map(|l| l.strip_prefix("submitted "))
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("no job id in submitit's output:\n{out}"));
    // --open-mode=append: the job's output file was opened for appending, and srun's
    // `%j_%t_log.out` named the same file, which holds what the step wrote.
    let log = std::fs::read_to_string(folder.join(format!("{id}_0_log.out"))).unwrap_or_default();
    assert!(log.contains("Job completed successfully"), "{id}_0_log.out: {log:?}");

    // dask-jobqueue, PBS: qsub of a `select=` worker job writing into a log directory.
    let pbs_logs = c.root().join("dask-pbs");
    let out = run_tool(&c, &venv, &bin, "dask_jobqueue_pbs.py", &["pbs", &pbs_logs.display().to_string()], limit);
    assert!(out.contains("#PBS -l select=1:ncpus=1:mem=1GB"), "{out}");
    assert!(out.contains("result 42") && out.contains("dask-jobqueue ok pbs 0.9.0"), "{out}");
    let names: Vec<String> = std::fs::read_dir(&pbs_logs)
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    assert!(names.iter().any(|n| n.starts_with("dask-worker.o")), "PBS's NAME.oID in the -o directory: {names:?}");

    // dask-jobqueue, Slurm: sbatch with `%J` in the output names.
    let slurm_logs = c.root().join("dask-slurm");
    let out = run_tool(&c, &venv, &bin, "dask_jobqueue_pbs.py", &["slurm", &slurm_logs.display().to_string()], limit);
    assert!(out.contains("result 42") && out.contains("dask-jobqueue ok slurm 0.9.0"), "{out}");
    let names: Vec<String> = std::fs::read_dir(&slurm_logs)
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    assert!(names.iter().any(|n| n.starts_with("dask-worker-") && n.ends_with(".out")), "{names:?}");

    // parsl, PBS Pro: a block job polled with `qstat -f -F json`, an app's result.
    let runs = c.root().join("parsl");
    let out = run_tool(&c, &venv, &bin, "parsl_pbs.py", &[&runs.display().to_string()], limit);
    assert!(out.contains("result 42") && out.contains("parsl ok 2026.10.26"), "{out}");

    // What they ran, in berth's accounting, filtered as sacct filters.
    let rows = acct_rows(&c, &[]);
    let named = |name: &str| rows.iter().filter(|r| r.1 == name).count();
    assert_eq!(named("submitit-answer"), 1, "{rows:?}");
    assert_eq!(named("submitit-array"), 3, "{rows:?}");
    assert_eq!(named("dask-worker"), 2, "{rows:?}");
    assert!(rows.iter().any(|r| r.0 == id && r.2 == "completed"), "{rows:?}");
    let nap = acct_rows(&c, &["--name", "submitit-nap"]);
    assert!(nap.len() == 1 && nap[0].2 == "cancelled", "{nap:?}");
    assert!(acct_rows(&c, &["--user", "nobody-here"]).is_empty());
    assert!(acct_rows(&c, &["--endtime", "2000-01-01"]).is_empty(), "no job started before 2000");
    // PBS's JSON status of a finished worker job, as PBS Pro tools read it.
    let worker = rows.iter().find(|r| r.1 == "dask-worker").map(|r| r.0.to_string()).expect("a worker job");
    let o = Command::new(bin.join("qstat"))
        .args(["-x", "-f", "-F", "json", &worker])
        .env("BERTH_DIR", &c.dir)
        .output()
        .expect("run qstat");
    assert!(o.status.success(), "qstat -F json: {}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("qstat -F json is JSON");
    let jobs = v["Jobs"].as_object().expect("Jobs");
    assert_eq!(jobs.len(), 1, "{v:#}");
    let (key, job) = jobs.iter().next().expect("one job");
    assert!(key.starts_with(&format!("{worker}.")), "{key}");
    assert_eq!((job["Job_Name"].as_str(), job["job_state"].as_str()), (Some("dask-worker"), Some("F")), "{v:#}");
    let table = c.berth(&["acct", "-j", &id.to_string(), "--format", "JobID,JobName%20,State"]);
    assert!(table.status.success(), "{}", text(&table.stderr));
    let table = text(&table.stdout);
    let last = table.lines().last().unwrap_or("");
    assert_eq!(last.split_whitespace().collect::<Vec<_>>(), [id.to_string().as_str(), "submitit-answer", "COMPLETED"]);
}
