//! System test: Slurm and PBS batch scripts submitted unchanged to a live cluster (issue 19,
//! directives; docs/compat.md). Their `#SBATCH`/`#PBS` lines shape the job; a directive berth
//! does not support refuses the submission naming its line, or, with `--ignore-unsupported`,
//! is a warning.

mod common;

use common::*;
use serde_json::Value;
use std::time::Duration;

/// Cores per node of a job, by node name.
fn cores_per_node(job: &Value) -> Vec<u64> {
    let mut v: Vec<u64> = job["allocation"].as_array().unwrap().iter().map(|a| a["cores"].as_u64().unwrap()).collect();
    v.sort();
    v
}

#[test]
fn slurm_and_pbs_scripts_run_as_written() {
    let c = Cluster::up(3, "package:1 core:4 pu:1");
    let slurm = c.submit(
        "slurm.sh",
        "#!/bin/sh\n#SBATCH -N 2 --ntasks=6 -t 1:00\n#SBATCH -J from-slurm --mem=64\nsort \"$BERTH_NODEFILE\" | uniq -c | wc -l\n",
        &[],
    );
    let pbs = c.submit(
        "pbs.sh",
        "#!/bin/sh\n#PBS -l nodes=2:ppn=3\n#PBS -l walltime=00:02:00,mem=128mb\n#PBS -N from-pbs\nsort \"$BERTH_NODEFILE\" | uniq -c | wc -l\n",
        &[],
    );
    for (id, name, walltime) in [(slurm, "from-slurm", 60), (pbs, "from-pbs", 120)] {
        let j = c.wait_finished(id, Duration::from_secs(60));
        assert_eq!(j["state"], "completed", "{j:#}");
        assert_eq!(j["name"], name);
        assert_eq!(j["walltime_seconds"], walltime, "{j:#}");
        assert_eq!(cores_per_node(&j), vec![3, 3], "{j:#}");
        let mem: Vec<u64> =
            j["allocation"].as_array().unwrap().iter().map(|a| a["memory_bytes"].as_u64().unwrap()).collect();
        assert_eq!(mem, vec![64 << 20, 64 << 20], "--mem=64 is 64 MB per node; -l mem=128mb over 2 nodes: {j:#}");
        let out = std::fs::read_to_string(j["stdout"].as_str().unwrap()).unwrap();
        assert_eq!(out.trim(), "2", "the node file names two nodes");
    }
    // Unsupported: refused with the line, or a warning when asked.
    let script = c.root().join("mail.sh");
    std::fs::write(&script, "#!/bin/sh\n#SBATCH -n 1\n#SBATCH --licenses=lic@db\ntrue\n").unwrap();
    let path = script.display().to_string();
    let o = c.berth(&["submit", &path]);
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(!o.status.success(), "accepted: {err}");
    assert!(
        err.contains("line 3") && err.contains("--licenses=lic@db") && err.contains("--ignore-unsupported"),
        "{err}"
    );
    let o = c.berth(&["submit", "--ignore-unsupported", &path]);
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(o.status.success(), "{err}");
    assert!(err.contains("warning") && err.contains("line 3: #SBATCH --licenses=lic@db"), "{err}");
}
