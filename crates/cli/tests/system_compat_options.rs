//! System test: the options of issue 19 beyond resources, on a live cluster (docs/compat.md):
//! `--chdir`, `--export=NONE,FOO=bar`, `#PBS -v`, `--signal=USR1@3` before a short walltime,
//! `--mail-type=END` through the `[notify]` hook, `--comment` shown by `berth show` and
//! `scontrol show job`-style output, `--exclusive` on a 2-node cluster (keeping its task
//! count), Slurm's joined default output, `%N` in output names.

mod common;

use common::*;
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// Submit `name` (written with `text`) with `flags` and extra environment `env`; the job id.
fn submit_env(c: &Cluster, name: &str, text: &str, flags: &[&str], env: &[(&str, &str)]) -> u64 {
    let path = c.root().join(name);
    std::fs::write(&path, text).unwrap();
    let out: Output = Command::new(BIN)
        .arg("--dir")
        .arg(&c.dir)
        .arg("submit")
        .arg("--json")
        .args(flags)
        .arg(&path)
        .envs(env.iter().copied())
        .current_dir(c.root())
        .output()
        .expect("run berth");
    assert!(out.status.success(), "submit {name}: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    v["id"].as_u64().expect("id")
}

fn read(path: &std::path::Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn wait_for_file(path: &std::path::Path, timeout: Duration) -> String {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if let Ok(s) = std::fs::read_to_string(path) {
            if !s.is_empty() {
                return s;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{} not written within {timeout:?}", path.display());
}

#[test]
fn compat_options_on_a_live_cluster() {
    require_root();
    // The notify hook and its log live outside the cluster's directory, made first.
    let hook_dir = tempfile::tempdir().unwrap();
    let log = hook_dir.path().join("notify.log");
    let hook = hook_dir.path().join("hook.sh");
    std::fs::write(
        &hook,
        format!(
            "#!/bin/sh\necho \"$1 $2 $3 $BERTH_NOTIFY_JOB_NAME $BERTH_NOTIFY_STATE $BERTH_NOTIFY_EXIT_CODE\" >> {}\n",
            log.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
    let c = Cluster::up_configured(
        2,
        "package:1 core:2 pu:1",
        &format!("[notify]\ncommand = \"{}\"\ntimeout_secs = 5\n", hook.display()),
    );
    let root = c.root().to_path_buf();

    // --chdir: the script runs there, relative outputs land there, the submit dir stays.
    std::fs::create_dir_all(root.join("work")).unwrap();
    let chdir = c.submit(
        "chdir.sh",
        "#!/bin/sh\n#SBATCH -D work -o out-%j.txt -t 1\npwd\necho \"$SLURM_SUBMIT_DIR $PBS_O_WORKDIR\"\n",
        &[],
    );
    let j = c.wait_finished(chdir, Duration::from_secs(60));
    assert_eq!(j["state"], "completed", "{j:#}");
    let out = read(&root.join("work").join(format!("out-{chdir}.txt")));
    let root_s = root.display().to_string();
    assert_eq!(out, format!("{root_s}/work\n{root_s} {root_s}\n"));
    assert_eq!(j["work_dir"], format!("{root_s}/work"), "{j:#}");

    // --export=NONE,FOO=bar: nothing of the submitter's environment but FOO.
    let export = submit_env(
        &c,
        "export.sh",
        "#!/bin/sh\necho \"FOO=$FOO BAR=${BAR-unset} JOB=${BERTH_JOB_ID:+set}\"\n",
        &["--export=NONE,FOO=bar", "--walltime", "60"],
        &[("BAR", "from-submitter"), ("FOO", "old")],
    );
    // #PBS -v: variables given, and a name alone takes the submitter's value.
    let pbs_v = submit_env(
        &c,
        "pbsv.sh",
        "#!/bin/sh\n#PBS -v FOO=pbs,BAR\n#PBS -l walltime=60\necho \"FOO=$FOO BAR=$BAR\"\n",
        &[],
        &[("BAR", "from-submitter")],
    );
    for (id, want) in [(export, "FOO=bar BAR=unset JOB=set\n"), (pbs_v, "FOO=pbs BAR=from-submitter\n")] {
        let j = c.wait_finished(id, Duration::from_secs(60));
        assert_eq!(j["state"], "completed", "{j:#}");
        assert_eq!(read(std::path::Path::new(j["stdout"].as_str().unwrap())), want);
    }

    // --signal=USR1@3 with a 6 s walltime: the trap runs about 3 s in, before the walltime.
    // The 6 s are berth's own `--walltime 6`: Slurm's `-t 0:06` is rounded up to a minute.
    let sig_file = root.join("sig.txt");
    let signal = c.submit(
        "signal.sh",
        &format!(
            "#!/bin/sh\n#SBATCH --signal=USR1@3\n#BERTH --walltime 6\ntrap 'echo got-usr1 > {}; exit 0' USR1\ni=0\nwhile [ $i -lt 200 ]; do sleep 0.1; i=$((i+1)); done\n",
            sig_file.display()
        ),
        &[],
    );
    let j = c.wait_finished(signal, Duration::from_secs(60));
    assert_eq!(j["state"], "completed", "the trap ended it before the walltime: {j:#}");
    assert_eq!(read(&sig_file), "got-usr1\n");
    let wall = j["accounting"]["wall_seconds"].as_f64().unwrap_or(0.0);
    assert!((2.0..5.9).contains(&wall), "signalled about 3 s before the end of 6: {wall} s");
    assert_eq!(j["early_signal"], "10@3");

    // --mail-type=END: the hook is called once the job ends; --comment is kept and shown.
    let mail = c.submit(
        "mail.sh",
        "#!/bin/sh\n#SBATCH --mail-type=END --mail-user=ops@example.org -t 1\n#SBATCH --comment \"run 3 of 5\"\ntrue\n",
        &[],
    );
    let j = c.wait_finished(mail, Duration::from_secs(60));
    assert_eq!(j["comment"], "run 3 of 5", "{j:#}");
    let logged = wait_for_file(&log, Duration::from_secs(10));
    assert_eq!(logged, format!("END {mail} ops@example.org mail.sh completed 0\n"));
    let shown = c.berth(&["show", &mail.to_string()]);
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(text.contains("comment: run 3 of 5"), "{text}");
    assert!(text.contains("mail: END to ops@example.org"), "{text}");
    // A comment with an escape sequence is refused, never stored.
    let o = c.berth(&["submit", "--comment", "a\u{1b}[31m", &root.join("mail.sh").display().to_string()]);
    assert!(!o.status.success());

    // --exclusive on 2 nodes of 2 cores: next to a 1-core job, it gets the other node whole.
    let small = c.submit("small.sh", "#!/bin/sh\n#SBATCH -n 1 -t 1 -o small-%N-%n-%t.out\necho small\nsleep 3\n", &[]);
    c.wait_state(small, &["running"], Duration::from_secs(30));
    // Its stderr goes with its stdout to slurm-ID.out (Slurm's default, no -o/-e given).
    let excl = c.submit(
        "excl.sh",
        "#!/bin/sh\n#SBATCH -n 1 --exclusive -t 1\necho $SLURM_CPUS_ON_NODE $SLURM_NTASKS\necho to-stderr >&2\n",
        &[],
    );
    let e = c.wait_finished(excl, Duration::from_secs(60));
    let s = c.show(small);
    assert_eq!(e["state"], "completed", "{e:#}");
    assert_eq!(e["exclusive"], true);
    assert_eq!(e["allocation"].as_array().unwrap().len(), 1);
    assert_eq!(e["allocation"][0]["cores"], 2, "the whole node: {e:#}");
    assert_ne!(e["allocation"][0]["node"], s["allocation"][0]["node"], "never beside another job");
    // The whole node's 2 CPUs, and the 1 task asked for (as Slurm's SLURM_NTASKS).
    assert_eq!(e["stdout"], e["stderr"], "one file: {e:#}");
    assert_eq!(e["tasks"]["total"], 1, "{e:#}");
    assert_eq!(e["stdout"], root.join(format!("slurm-{excl}.out")).display().to_string());
    assert_eq!(read(&root.join(format!("slurm-{excl}.out"))), "2 1\nto-stderr\n");
    // %N (first node), %n and %t (0 for the batch script) in the output name.
    let s = c.wait_finished(small, Duration::from_secs(60));
    let node = s["allocation"][0]["node"].as_str().unwrap().to_string();
    assert_eq!(read(&root.join(format!("small-{node}-0-0.out"))), "small\n");
}
