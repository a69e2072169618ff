//! Slurm's `scontrol`: `show job|node|partition`, `hold`, `release`, `suspend`, `resume`.
//! Its `Key=Value` records are what tools parse (`scontrol show job N`, `-o` one line each).

use super::format::{self as f, both, long, Arg, Opt};
use super::slurm::{node_state, slurm_error, SLURM_VERSION};
use crate::client::request;
use anyhow::{bail, Result};
use berth_core::JobId;
use berth_protocol::client::{ClientRequest, ClientResponse, JobInfo, NodeInfo, QueueInfo};
use std::path::Path;

const SCONTROL_OPTS: &[Opt] = &[
    both('o', "oneliner", Arg::No),
    both('d', "details", Arg::No),
    both('a', "all", Arg::No),
    both('Q', "quiet", Arg::No),
    both('v', "verbose", Arg::No),
    both('V', "version", Arg::No),
    both('h', "help", Arg::No),
    long("usage", Arg::No),
];

const USAGE: &str = "Usage: scontrol [-o] [-Q] show job [ID] | show node [NAME] | show partition [NAME] | hold IDS | release IDS | suspend IDS | resume IDS\n";

/// HH:MM:SS, days as `D-HH:MM:SS`, as scontrol prints times.
fn hms(secs: u64) -> String {
    let d = secs / 86_400;
    let rest = f::pbs_hms(secs % 86_400);
    if d > 0 {
        format!("{d}-{rest}")
    } else {
        rest
    }
}

/// A record of `Key=Value` fields: lines of fields (indented after the first), or one line.
fn record(lines: &[Vec<(&str, String)>], oneliner: bool) -> String {
    let lines: Vec<String> = lines
        .iter()
        .map(|l| l.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" "))
        .filter(|l| !l.is_empty())
        .collect();
    if oneliner {
        format!("{}\n", lines.join(" "))
    } else {
        let mut s = String::new();
        for (i, l) in lines.iter().enumerate() {
            s.push_str(if i == 0 { "" } else { "   " });
            s.push_str(l);
            s.push('\n');
        }
        s.push('\n');
        s
    }
}

fn or_null(s: &str) -> String {
    if s.is_empty() {
        "(null)".into()
    } else {
        s.to_string()
    }
}

/// `scontrol show job`: one job's record.
pub fn job_record(j: &JobInfo, now: f64, oneliner: bool) -> String {
    let j = &crate::output::escaped(std::slice::from_ref(j))[0];
    let nodes: Vec<&str> = j.allocation.iter().map(|a| a.node.as_str()).collect();
    let time = |t: Option<f64>| t.map(f::iso_time).unwrap_or_else(|| "Unknown".into());
    let reason = if j.state.is_pending() { f::slurm_reason(j) } else { "None".into() };
    let tasks = j.request.tasks_per_node.map(|t| t * f::job_node_count(j));
    let mem = match (j.request.mem_per_node, j.request.mem_per_cpu) {
        (Some(b), _) => format!("{}M", b >> 20),
        (None, Some(b)) => format!("{}M", b >> 20),
        _ => "0".into(),
    };
    record(
        &[
            match (j.array_job, j.array_index) {
                // As Slurm: a task's array and index beside its own id.
                (Some(a), Some(i)) => vec![
                    ("JobId", j.id.to_string()),
                    ("ArrayJobId", a.to_string()),
                    ("ArrayTaskId", i.to_string()),
                    ("JobName", j.name.clone()),
                ],
                _ => vec![("JobId", j.id.to_string()), ("JobName", j.name.clone())],
            },
            vec![("UserId", format!("{}({})", j.user, j.uid)), ("GroupId", format!("({})", j.gid))],
            vec![
                ("Priority", j.priority.as_ref().map(|p| format!("{:.0}", p.total)).unwrap_or_else(|| "0".into())),
                ("Account", or_null(&j.account)),
                ("QOS", "normal".into()),
            ],
            vec![
                ("JobState", f::slurm_state(j).1.into()),
                ("Reason", reason),
                ("Dependency", j.dependency.clone().unwrap_or_else(|| "(null)".into())),
            ],
            vec![("ExitCode", format!("{}:{}", j.exit_code.unwrap_or(0), j.signal.unwrap_or(0)))],
            vec![
                ("RunTime", hms(f::elapsed(j, now))),
                ("TimeLimit", j.walltime_seconds.map(hms).unwrap_or_else(|| "UNLIMITED".into())),
            ],
            vec![("SubmitTime", f::iso_time(j.submit_time))],
            vec![("StartTime", time(j.start_time.or(j.expected_start))), ("EndTime", time(j.end_time))],
            vec![("Partition", j.queue.clone())],
            vec![("NodeList", if nodes.is_empty() { "(null)".into() } else { f::hostlist(&nodes) })],
            vec![("BatchHost", nodes.first().map(|n| n.to_string()).unwrap_or_else(|| "(null)".into()))],
            vec![
                ("NumNodes", f::job_node_count(j).to_string()),
                ("NumCPUs", crate::output::job_cpus(j)),
                ("NumTasks", tasks.map(|t| t.to_string()).unwrap_or_else(|| "1".into())),
                ("CPUs/Task", j.request.cpus_per_task.unwrap_or(1).to_string()),
            ],
            vec![("MinMemoryNode", mem)],
            vec![("WorkDir", j.work_dir.clone().unwrap_or_else(|| j.cwd.clone()))],
            // As Slurm: only when the job has one.
            j.comment.iter().map(|c| ("Comment", c.clone())).collect(),
            vec![("StdErr", j.stderr.clone())],
            vec![("StdIn", "/dev/null".into())],
            vec![("StdOut", j.stdout.clone())],
        ],
        oneliner,
    )
}

/// `scontrol show node`: one node's record.
pub fn node_record(n: &NodeInfo, partitions: &[String], oneliner: bool) -> String {
    let n = &crate::output::escaped(std::slice::from_ref(n))[0];
    let (_, long) = node_state(n);
    record(
        &[
            vec![("NodeName", n.name.clone()), ("CoresPerSocket", (n.cores / n.sockets.max(1)).to_string())],
            vec![
                ("CPUAlloc", n.cpus_allocated.to_string()),
                ("CPUEfctv", n.pus.to_string()),
                ("CPUTot", n.pus.to_string()),
            ],
            vec![("NodeAddr", n.address.clone()), ("NodeHostName", n.name.clone())],
            vec![
                ("RealMemory", (n.memory_bytes >> 20).to_string()),
                ("AllocMem", (n.memory_allocated_bytes >> 20).to_string()),
                ("FreeMem", (n.memory_bytes.saturating_sub(n.memory_allocated_bytes) >> 20).to_string()),
            ],
            vec![("Sockets", n.sockets.to_string()), ("Boards", "1".into())],
            vec![("State", long.to_ascii_uppercase()), ("ThreadsPerCore", (n.pus / n.cores.max(1)).to_string())],
            vec![("Partitions", partitions.join(","))],
        ],
        oneliner,
    )
}

/// `scontrol show partition`: one queue's record.
pub fn partition_record(q: &QueueInfo, nodes: &[String], default: bool, oneliner: bool) -> String {
    let s = &q.spec;
    record(
        &[
            vec![("PartitionName", s.name.clone())],
            vec![("Default", if default { "YES" } else { "NO" }.into())],
            vec![("MaxTime", s.max_walltime_secs.map(hms).unwrap_or_else(|| "UNLIMITED".into()))],
            vec![("DefaultTime", s.default_walltime_secs.map(hms).unwrap_or_else(|| "NONE".into()))],
            vec![("Nodes", if nodes.is_empty() { "(null)".into() } else { f::hostlist(nodes) })],
            vec![("PriorityTier", s.priority.to_string())],
            vec![("State", if s.enabled { "UP" } else { "DRAIN" }.into())],
            vec![("TotalNodes", nodes.len().to_string())],
        ],
        oneliner,
    )
}

pub async fn scontrol(dir: &Path, args: Vec<String>) -> Result<i32> {
    let p = match f::getopt(&args, SCONTROL_OPTS, true) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("scontrol: {}", crate::output::terminal_safe(&e));
            return Ok(1);
        }
    };
    if p.has("--version") {
        println!("slurm {SLURM_VERSION} (berth {})", env!("CARGO_PKG_VERSION"));
        return Ok(0);
    }
    if p.has("--help") || p.has("--usage") || p.operands.is_empty() {
        print!("{USAGE}");
        return Ok(if p.operands.is_empty() && !p.has("--help") && !p.has("--usage") { 1 } else { 0 });
    }
    let oneliner = p.has("--oneliner");
    let quiet = p.has("--quiet");
    let words: Vec<String> = p.operands.iter().map(|w| w.to_string()).collect();
    let verb = words[0].to_ascii_lowercase();
    match verb.as_str() {
        "show" => {
            let what = words.get(1).map(|w| w.to_ascii_lowercase()).unwrap_or_default();
            let which = words.get(2).map(|w| w.trim_start_matches("jobid=").to_string());
            show(dir, &what, which.as_deref(), oneliner).await
        }
        "hold" | "release" | "suspend" | "resume" | "uhold" => {
            let mut ids: Vec<JobId> = Vec::new();
            for w in words.iter().skip(1).flat_map(|w| w.split(',')) {
                let w = w.trim_start_matches("jobid=");
                match f::parse_job_id(w) {
                    Some(id) => ids.push(id),
                    None => {
                        eprintln!("Invalid job id specified for job {}", crate::output::terminal_safe(w));
                        return Ok(1);
                    }
                }
            }
            if ids.is_empty() {
                eprintln!("scontrol: error: {verb}: give job ids");
                return Ok(1);
            }
            let req = match verb.as_str() {
                "hold" | "uhold" => ClientRequest::Hold { ids },
                "release" => ClientRequest::Release { ids },
                "suspend" => ClientRequest::Suspend { ids },
                _ => ClientRequest::Resume { ids },
            };
            let ClientResponse::Done { results } = request(dir, req).await? else { bail!("unexpected answer") };
            let mut code = 0;
            for r in results.iter().filter(|r| !r.ok) {
                code = 1;
                if !quiet {
                    let why = r.error.as_ref().map(slurm_error).unwrap_or_else(|| "failed".into());
                    eprintln!("{why} for job {}", r.id);
                }
            }
            Ok(code)
        }
        other => {
            eprintln!(
                "scontrol: error: {} is not supported by berth (show job|node|partition, hold, release, suspend, resume are; docs/compat.md)",
                crate::output::terminal_safe(other)
            );
            Ok(1)
        }
    }
}

async fn show(dir: &Path, what: &str, which: Option<&str>, oneliner: bool) -> Result<i32> {
    let now = f::now();
    let mut out = String::new();
    match what {
        "job" | "jobs" | "jobid" => match which {
            Some(w) => {
                let Some(id) = f::parse_job_id(w) else {
                    eprintln!("Invalid job id specified");
                    return Ok(1);
                };
                match request(dir, ClientRequest::ShowJob { id }).await {
                    Ok(ClientResponse::Job { job }) => out.push_str(&job_record(&job, now, oneliner)),
                    Ok(_) => bail!("unexpected answer"),
                    Err(_) => {
                        eprintln!("slurm_load_jobs error: Invalid job id specified");
                        return Ok(1);
                    }
                }
            }
            None => {
                let ClientResponse::Jobs { jobs } =
                    request(dir, ClientRequest::ListJobs { states: vec![], all: false }).await?
                else {
                    bail!("unexpected answer")
                };
                if jobs.is_empty() {
                    println!("No jobs in the system");
                }
                for j in &jobs {
                    out.push_str(&job_record(j, now, oneliner));
                }
            }
        },
        "node" | "nodes" | "partition" | "partitions" => {
            let ClientResponse::Nodes { nodes } = request(dir, ClientRequest::ListNodes { topology: false }).await?
            else {
                bail!("unexpected answer")
            };
            let ClientResponse::Queues { queues } = request(dir, ClientRequest::Queues).await? else {
                bail!("unexpected answer")
            };
            let members = |q: &QueueInfo| -> Vec<String> {
                super::slurm::queue_nodes(q, &nodes).iter().map(|n| n.name.clone()).collect()
            };
            if what.starts_with("node") {
                let shown: Vec<&NodeInfo> = nodes.iter().filter(|n| which.is_none_or(|w| n.name == w)).collect();
                if shown.is_empty() {
                    eprintln!("Node {} not found", crate::output::terminal_safe(which.unwrap_or("")));
                    return Ok(1);
                }
                for n in shown {
                    let parts: Vec<String> =
                        queues.iter().filter(|q| members(q).contains(&n.name)).map(|q| q.spec.name.clone()).collect();
                    out.push_str(&node_record(n, &parts, oneliner));
                }
            } else {
                let default = queues.iter().find(|q| q.spec.enabled).or(queues.first()).map(|q| q.spec.name.clone());
                let shown: Vec<&QueueInfo> = queues.iter().filter(|q| which.is_none_or(|w| q.spec.name == w)).collect();
                if shown.is_empty() {
                    eprintln!("Partition {} not found", crate::output::terminal_safe(which.unwrap_or("")));
                    return Ok(1);
                }
                for q in shown {
                    out.push_str(&partition_record(q, &members(q), default.as_ref() == Some(&q.spec.name), oneliner));
                }
            }
        }
        other => {
            eprintln!(
                "scontrol: error: show {} is not supported by berth (job, node, partition are)",
                crate::output::terminal_safe(other)
            );
            return Ok(1);
        }
    }
    print!("{}", crate::output::terminal_safe(&out));
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compat::slurm::tests::{job, running};

    #[test]
    fn show_job_is_key_value_records() {
        let r = job_record(&running(5, &["node1", "node2"], 0.0), 65.0, false);
        let first = r.lines().next().unwrap();
        assert_eq!(first, "JobId=5 JobName=sim");
        assert!(r.lines().skip(1).filter(|l| !l.is_empty()).all(|l| l.starts_with("   ")), "{r}");
        for kv in [
            "JobState=RUNNING",
            "NodeList=node[1-2]",
            "NumNodes=2",
            "RunTime=00:01:05",
            "TimeLimit=01:00:00",
            "Partition=batch",
            "ExitCode=0:0",
        ] {
            assert!(r.split_whitespace().any(|w| w == kv), "{kv} in\n{r}");
        }
        let one = job_record(&job(6, "x y", "ann", "held"), 0.0, true);
        assert_eq!(one.lines().count(), 1, "{one}");
        assert!(one.contains("JobState=PENDING Reason=JobHeldUser"), "{one}");
        assert_eq!(hms(90_061), "1-01:01:01");
    }
}
