//! `berth demo`: a local cluster running real jobs in real cgroups, end to end.

use anyhow::{bail, Result};
use berth_cli::client::request;
use berth_cli::output;
use berth_cli::submission::build_submission;
use berth_core::job::JobState;
use berth_core::JobId;
use berth_protocol::client::{ClientRequest, ClientResponse, JobInfo};
use std::path::Path;
use std::time::{Duration, Instant};

const JOBS: [(&str, &str, JobState); 7] = [
    (
        "bound.sh",
        "#!/bin/sh\n#BERTH --name bound --binding linear:2 --binding-mode env --walltime 60\necho \"Grid Engine linear:2 -> cores (socket,core) $BERTH_BINDING_CORES, OMP_PLACES=$BERTH_BINDING\"\nsleep 2\n",
        JobState::Completed,
    ),
    (
        "ranks.sh",
        "#!/bin/sh\n#BERTH --name ranks --cores 4 --cpus-per-task 2 --rank-cpusets --walltime 60\necho \"job cpuset $BERTH_CPUSET: $(cat $BERTH_CPUSET/cpuset.cpus)\"\nfor d in $BERTH_RANK_CPUSETS; do echo \"  rank sub-cpuset $(basename $d): cpus $(cat $d/cpuset.cpus) mems $(cat $d/cpuset.mems), owned by $(stat -c %U $d)\"; done\nsleep 2\n",
        JobState::Completed,
    ),
    (
        "serial.sh",
        "#!/bin/sh\n#BERTH --name serial --walltime 60\necho \"hello from job $BERTH_JOB_ID on $BERTH_NODES as $(id -un)\"\necho \"cpus allowed: $(grep Cpus_allowed_list /proc/self/status | cut -f2)\"\n",
        JobState::Completed,
    ),
    (
        "multicore.sh",
        "#!/bin/sh\n#BERTH --name multicore --cores 4 --mem 512M --walltime 60\necho \"job $BERTH_JOB_ID: cores $BERTH_CORES, PUs $BERTH_CPUS on $BERTH_NODES, TMPDIR=$TMPDIR\"\necho \"real cpuset: $(cat /proc/self/cpuset) -> $(grep Cpus_allowed_list /proc/self/status | cut -f2)\"\nfor i in 1 2 3 4; do timeout 2 sh -c 'while :; do :; done' & done\nwait\necho done\n",
        JobState::Completed,
    ),
    (
        "two-nodes.sh",
        "#!/bin/sh\n#BERTH --name two-nodes --nodes 2 --tasks-per-node 2 --walltime 60\necho \"nodes: $BERTH_NODES\"\nsort \"$BERTH_NODEFILE\" | uniq -c\n",
        JobState::Completed,
    ),
    (
        "memhog.sh",
        "#!/bin/sh\n#BERTH --name memhog --mem 64M --walltime 60\necho \"allocating 400 MB in a 64 MB job...\"\nhead -c 400m /dev/zero | tail > /dev/null\necho \"survived?\"\n",
        JobState::Failed,
    ),
    (
        "overtime.sh",
        "#!/bin/sh\n#BERTH --name overtime --walltime 3\necho \"sleeping past my 3 s walltime, with a background child and a daemon\"\nsleep 300 &\nsetsid sh -c 'sleep 300' &\nsleep 300\n",
        JobState::Timeout,
    ),
];

pub async fn run(json: bool, keep: bool) -> Result<i32> {
    let dir = std::env::current_dir()?.join(".berth-demo");
    let say = |s: &str| {
        if !json {
            println!("{s}");
        }
    };
    say(&format!(
        "== berth demo: a controller and 3 agents emulating \"package:2 numa:2 core:2 pu:2\" nodes, in {}",
        dir.display()
    ));
    crate::cluster::up(&dir, json, Some(3), Some("package:2 numa:2 core:2 pu:2".into()), false).await?;
    let result = run_jobs(&dir, json).await;
    if keep {
        say(&format!("== cluster left running: export BERTH_DIR={}; `berth down` stops it", dir.display()));
    } else {
        say("== taking the cluster down");
        crate::cluster::down(&dir, json).await?;
    }
    result
}

/// A real MPICH program (crates/agent/tests/mpi/allreduce.c), built by the job itself.
const ALLREDUCE_C: &str = include_str!("../../../../agent/tests/mpi/allreduce.c");

/// The parallel job: `berth run` of an MPI program across two nodes, a script once per
/// rank, and a failing rank under --no-kill.
fn mpi_job(berth: &Path) -> String {
    format!(
        "#!/bin/sh\n#BERTH --name mpi --nodes 2 --tasks-per-node 2 --walltime 120\nB={b}\nmpicc -o allreduce allreduce.c || exit 1\necho '$ berth run --label ./allreduce'\n$B run --label ./allreduce\necho '$ berth run --label sh -c ...'\n$B run --label sh -c 'echo rank $BERTH_RANK of $BERTH_SIZE, node $BERTH_NODEID, local rank $BERTH_LOCAL_RANK, bound to host CPU $BERTH_RANK_CPUS'\necho '$ berth run --no-kill (rank 1 fails, the others are told)'\n$B run --no-kill --label sh -c 'if [ $BERTH_RANK = 1 ]; then exit 4; fi; sleep 1; echo \"still here; failed: $(cat $BERTH_FAILED_RANKS)\"' || echo \"run returned $?\"\n$B acct --steps --limit 3\n",
        b = berth.display()
    )
}

async fn run_jobs(dir: &Path, json: bool) -> Result<i32> {
    let jobdir = dir.join("jobs");
    std::fs::create_dir_all(&jobdir)?;
    std::env::set_current_dir(&jobdir)?;
    std::fs::write(jobdir.join("allreduce.c"), ALLREDUCE_C)?;
    let berth = berth_cli::sibling_binary("berth")?;
    let mpi = mpi_job(&berth);
    let mut all_jobs: Vec<(&str, &str, JobState)> = JOBS.to_vec();
    all_jobs.push(("mpi.sh", &mpi, JobState::Completed));
    let mut ids: Vec<(JobId, &str, JobState)> = vec![];
    for (file, text, expect) in all_jobs {
        let path = jobdir.join(file);
        std::fs::write(&path, text)?;
        let sub = build_submission(&path, &Default::default(), false)?;
        let ClientResponse::Submitted { id } = request(dir, ClientRequest::Submit(Box::new(sub))).await? else {
            bail!("unexpected answer")
        };
        if !json {
            println!("submitted {file:<14} -> job {id}");
        }
        ids.push((id, file, expect));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    if !json {
        println!("\n$ berth jobs");
        if let ClientResponse::Jobs { jobs } =
            request(dir, ClientRequest::ListJobs { states: vec![], all: false }).await?
        {
            print!("{}", output::jobs_table(&jobs));
        }
        println!("\n$ berth nodes");
        if let ClientResponse::Nodes { nodes, .. } = request(dir, ClientRequest::ListNodes { topology: false }).await? {
            print!("{}", output::nodes_table(&nodes));
        }
        println!("\n$ berth nodes --topology");
        if let ClientResponse::Nodes { nodes, .. } = request(dir, ClientRequest::ListNodes { topology: true }).await? {
            for n in &nodes {
                print!("{}", berth_cli::topo_view::draw_node(n, 100));
            }
        }
    }
    // Wait for all to finish (the over-walltime one takes 3 s + grace).
    let t0 = Instant::now();
    let finished: Vec<JobInfo> = loop {
        let mut all = vec![];
        for (id, _, _) in &ids {
            if let ClientResponse::Job { job } = request(dir, ClientRequest::ShowJob { id: *id }).await? {
                all.push(*job);
            }
        }
        if all.iter().all(|j| j.state.is_finished()) {
            break all;
        }
        if t0.elapsed() > Duration::from_secs(90) {
            bail!("jobs did not finish within 90 s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let mut ok = true;
    let mut verdicts = vec![];
    for ((_, file, expect), job) in ids.iter().zip(&finished) {
        let good = job.state == *expect;
        ok &= good;
        verdicts.push(serde_json::json!({"job": job.id, "script": file, "state": job.state, "expected": expect, "ok": good, "reason": job.reason}));
    }
    if json {
        println!("{}", serde_json::json!({"jobs": finished, "verdicts": verdicts, "ok": ok}));
    } else {
        println!("\n$ berth acct");
        if let ClientResponse::Acct { jobs } = request(
            dir,
            ClientRequest::Acct {
                limit: Some(20),
                steps: false,
                since: None,
                until: None,
                users: vec![],
                active: false,
                with_steps: false,
            },
        )
        .await?
        {
            print!("{}", output::acct_table(&jobs));
        }
        for job in &finished {
            let out = std::fs::read_to_string(&job.stdout).unwrap_or_default();
            println!(
                "\n--- job {} ({}) {}: {}",
                job.id,
                job.name,
                job.state.as_str(),
                job.reason.as_deref().unwrap_or("")
            );
            print!("{out}");
        }
        println!("\n$ berth nodes   (everything free again)");
        if let ClientResponse::Nodes { nodes, .. } = request(dir, ClientRequest::ListNodes { topology: false }).await? {
            print!("{}", output::nodes_table(&nodes));
        }
        println!();
        for v in &verdicts {
            println!(
                "{} job {} {:<14} ended {} (expected {})",
                if v["ok"].as_bool() == Some(true) { "PASS" } else { "FAIL" },
                v["job"],
                v["script"].as_str().unwrap_or(""),
                v["state"].as_str().unwrap_or(""),
                v["expected"].as_str().unwrap_or("")
            );
        }
    }
    Ok(if ok { 0 } else { 1 })
}
