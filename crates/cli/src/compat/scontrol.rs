//! Slurm's `scontrol`: `show job|node|partition`, `hold`, `release`, `suspend`, `resume`,
//! `update JobId=N Key=Value...` and `requeue`. Its `Key=Value` records are what tools parse
//! (`scontrol show job N`, `-o` one line each).

use super::format::{self as f, both, long, Arg, Opt};
use super::slurm::{node_state, slurm_error, SLURM_VERSION};
use crate::client::request;
use anyhow::{bail, Result};
use berth_protocol::client::{ClientRequest, ClientResponse, ErrorCode, JobChange, JobInfo, QueueInfo};
use berth_protocol::node::NodeInfo;
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

const USAGE: &str = "Usage: scontrol [-o] [-Q] show job [ID] | show node [NAME] | show partition [NAME] | hold IDS | release IDS | suspend IDS | resume IDS | requeue IDS | update JobId=ID [TimeLimit=T] [NumNodes=N] [NumCPUs=N] [NumTasks=N] [Partition=P] [JobName=NAME] [Dependency=D] [Priority=N]\n";

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
    let reason = f::slurm_reason(j);
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
            // Slurm's form, `gpu:TYPE:COUNT(S:SOCKETS)`; only on nodes with GPUs.
            gres(n).map(|g| vec![("Gres", g)]).unwrap_or_default(),
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

/// A node's GPUs as Slurm's `Gres=`: `gpu:TYPE:COUNT(S:SOCKETS)` per type, sockets (package
/// indexes) when every GPU of the type has one, then its generic resources (`nvme:800`);
/// `None` for a node without either.
fn gres(n: &NodeInfo) -> Option<String> {
    let mut types: std::collections::BTreeMap<String, (usize, Option<berth_core::CpuSet>)> = Default::default();
    for g in &n.gpus {
        let entry = types.entry(g.type_name()).or_insert((0, Some(Default::default())));
        entry.0 += 1;
        match (g.package, &mut entry.1) {
            (Some(p), Some(set)) => set.insert(p as u32),
            _ => entry.1 = None,
        }
    }
    let mut parts: Vec<String> = types
        .into_iter()
        .map(|(ty, (count, sockets))| match sockets {
            Some(s) if !s.is_empty() => format!("gpu:{ty}:{count}(S:{})", s.to_list()),
            _ => format!("gpu:{ty}:{count}"),
        })
        .collect();
    // Generic resources of `[gres]`: `name:count`, as Slurm's `Gres=nvme:800`.
    parts.extend(n.gres.iter().map(|g| format!("{}:{}", g.name, g.total)));
    (!parts.is_empty()).then(|| parts.join(","))
}

/// `scontrol show licenses`: one license's record, as Slurm's.
pub fn license_record(l: &berth_protocol::node::CountInfo, oneliner: bool) -> String {
    record(
        &[
            vec![("LicenseName", l.name.clone())],
            vec![
                ("Total", l.total.to_string()),
                ("Used", l.used.to_string()),
                ("Free", l.total.saturating_sub(l.used).to_string()),
                ("Reserved", "0".into()),
                ("Remote", "no".into()),
            ],
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
        "update" => update(dir, &words[1..], quiet).await,
        "hold" | "release" | "suspend" | "resume" | "uhold" | "requeue" => {
            // `N`, `A_i` (that task alone, even the first), `N[]`.
            let given: Vec<String> = words
                .iter()
                .skip(1)
                .flat_map(|w| w.split(','))
                .map(|w| w.trim_start_matches("jobid=").to_string())
                .collect();
            let parse = |w: &str| {
                f::parse_job_id(w).ok_or_else(|| {
                    anyhow::anyhow!("Invalid job id specified for job {}", crate::output::terminal_safe(w))
                })
            };
            let (ids, only) = match crate::arrays::resolve_tasks(dir, &given, parse).await {
                Ok(x) => x,
                Err(e) => {
                    eprintln!("{e:#}");
                    return Ok(1);
                }
            };
            if ids.is_empty() {
                eprintln!("scontrol: error: {verb}: give job ids");
                return Ok(1);
            }
            let req = match verb.as_str() {
                "hold" | "uhold" => ClientRequest::Hold { ids, only },
                "release" => ClientRequest::Release { ids, only },
                "suspend" => ClientRequest::Suspend { ids },
                "requeue" => ClientRequest::Requeue { ids, only },
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
                "scontrol: error: {} is not supported by berth (show job|node|partition, hold, release, suspend, resume, update job, requeue are; docs/compat.md)",
                crate::output::terminal_safe(other)
            );
            Ok(1)
        }
    }
}

/// A `TimeLimit=` value: a time, or `+T`/`-T` to add to or take from the job's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeLimit {
    Set(u64),
    Add(u64),
    Sub(u64),
}

/// What `scontrol update JobId=ID Key=Value...` asks for.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct UpdatePlan {
    /// As given (`N`, `A_i`), comma-separated in `JobId=`.
    pub ids: Vec<String>,
    pub time: Option<TimeLimit>,
    pub change: JobChange,
}

/// A Slurm time (`-t`'s formats: minutes, MM:SS, HH:MM:SS, D-HH[:MM[:SS]]), read by the
/// `#SBATCH -t` directive's parser.
fn slurm_time(v: &str) -> Result<u64, String> {
    if v.is_empty() || v.chars().any(|c| c.is_whitespace() || c == '#') {
        return Err(format!("Invalid TimeLimit {v:?}"));
    }
    let parsed = berth_core::directives::parse_foreign(&format!("#!/bin/sh\n#SBATCH -t {v}\n"));
    match parsed {
        Ok(f) if f.unsupported.is_empty() => f.options.walltime.ok_or_else(|| format!("Invalid TimeLimit {v:?}")),
        Ok(_) => Err(format!("TimeLimit={v}: an unlimited time is not supported by berth; give a limit")),
        Err(e) => Err(format!("Invalid TimeLimit {v:?}: {}", e.to_string().trim_start_matches("#SBATCH: "))),
    }
}

/// Read `scontrol update`'s words (after `update`): `Key=Value` pairs, keys in any case.
pub fn update_plan(words: &[String]) -> Result<UpdatePlan, String> {
    let mut plan = UpdatePlan::default();
    let count = |k: &str, v: &str| -> Result<u32, String> {
        v.trim().parse::<u32>().ok().filter(|n| *n > 0).ok_or_else(|| format!("Invalid {k} value: {v}"))
    };
    for w in words {
        let Some((key, value)) = w.split_once('=') else {
            return Err(format!("Invalid input: {w}; give Key=Value pairs, such as JobId=12 TimeLimit=30"));
        };
        let c = &mut plan.change;
        match key.to_ascii_lowercase().as_str() {
            "jobid" | "job" => plan.ids.extend(value.split(',').filter(|s| !s.is_empty()).map(String::from)),
            "timelimit" => {
                plan.time = Some(match value.as_bytes().first() {
                    Some(b'+') => TimeLimit::Add(slurm_time(&value[1..])?),
                    Some(b'-') => TimeLimit::Sub(slurm_time(&value[1..])?),
                    _ => TimeLimit::Set(slurm_time(value)?),
                })
            }
            "numnodes" | "reqnodes" => {
                // min[-max]: berth places a job on a node count it is given.
                let (min, max) = value.split_once('-').unwrap_or((value, value));
                let (min, max) = (count(key, min)?, count(key, max)?);
                if min != max {
                    return Err(format!("{key}={value}: a range of node counts is not supported; give one count"));
                }
                c.nodes = Some(min);
            }
            "numcpus" | "mincpusnode" => c.cores = Some(count(key, value)?),
            "numtasks" | "reqtasks" => c.tasks = Some(count(key, value)?),
            "partition" => c.queue = Some(value.to_string()),
            "name" | "jobname" => c.name = Some(value.to_string()),
            "dependency" => {
                // Checked here as sbatch's -d is; empty removes it.
                if !value.trim().is_empty() {
                    berth_core::directives::Dependency::parse_slurm(value)
                        .map_err(|e| format!("Invalid dependency {value}: {e}"))?;
                }
                c.dependency = Some(value.to_string());
            }
            "priority" => {
                c.priority = Some(value.trim().parse::<u32>().map_err(|_| format!("Invalid Priority value: {value}"))?)
            }
            // NAME[:COUNT],...; empty removes them.
            "licenses" | "gres" => {
                let what = if key.eq_ignore_ascii_case("gres") { "--gres" } else { "--licenses" };
                let counts = match value.trim() {
                    "" => Default::default(),
                    v => berth_core::gres::parse_list(what, v).map_err(|e| format!("Invalid {key} value: {e}"))?,
                };
                if counts.contains_key("gpu") {
                    return Err(format!("Update of GPUs is not supported: {w}"));
                }
                if what == "--gres" {
                    c.gres = Some(counts);
                } else {
                    c.licenses = Some(counts);
                }
            }
            _ => return Err(format!("Update of this parameter is not supported: {w}")),
        }
    }
    if plan.ids.is_empty() {
        return Err("No job identification provided: give JobId=ID".into());
    }
    if plan.change.is_empty() && plan.time.is_none() {
        return Err("No changes specified".into());
    }
    Ok(plan)
}

/// `scontrol update JobId=ID Key=Value...`: nothing printed when it is done, as Slurm's.
async fn update(dir: &Path, words: &[String], quiet: bool) -> Result<i32> {
    let say = |m: &str| {
        if !quiet {
            eprintln!("{}", crate::output::terminal_safe(m));
        }
    };
    let plan = match update_plan(words) {
        Ok(p) => p,
        Err(e) => {
            say(&format!("scontrol: error: {e}"));
            return Ok(1);
        }
    };
    let parse = |w: &str| f::parse_job_id(w).ok_or_else(|| anyhow::anyhow!("Invalid job id specified: {w}"));
    let (ids, only) = match crate::arrays::resolve_tasks(dir, &plan.ids, parse).await {
        Ok(x) => x,
        Err(e) => {
            say(&format!("slurm_update error: {e:#}"));
            return Ok(1);
        }
    };
    let mut code = 0;
    for id in ids {
        let mut change = plan.change.clone();
        if let Some(t) = plan.time {
            // `+T`/`-T` are relative to the job's own limit.
            let current = match t {
                TimeLimit::Set(_) => None,
                _ => match request(dir, ClientRequest::ShowJob { id }).await {
                    Ok(ClientResponse::Job { job }) => job.walltime_seconds,
                    _ => None,
                },
            };
            change.walltime = match (t, current) {
                (TimeLimit::Set(secs), _) => Some(secs),
                (TimeLimit::Add(d), Some(cur)) => Some(cur.saturating_add(d)),
                (TimeLimit::Sub(d), Some(cur)) => Some(cur.saturating_sub(d).max(1)),
                (_, None) => {
                    say(&format!("slurm_update error: job {id} has no time limit to add to or take from"));
                    code = 1;
                    continue;
                }
            };
        }
        if let Err(e) = crate::changes::send(dir, id, only.contains(&id), change).await {
            let why = match e.downcast_ref::<berth_protocol::client::ApiError>() {
                Some(api) if api.code == ErrorCode::UnknownJob => "Invalid job id specified".to_string(),
                Some(api) => api.message.clone(),
                None => format!("{e:#}"),
            };
            say(&format!("slurm_update error: {why}"));
            code = 1;
        }
    }
    Ok(code)
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
            let ClientResponse::Nodes { nodes, .. } =
                request(dir, ClientRequest::ListNodes { topology: false }).await?
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
        "lic" | "license" | "licenses" => {
            let ClientResponse::Nodes { licenses, .. } =
                request(dir, ClientRequest::ListNodes { topology: false }).await?
            else {
                bail!("unexpected answer")
            };
            let shown: Vec<_> = licenses.iter().filter(|l| which.is_none_or(|w| l.name == w)).collect();
            if shown.is_empty() {
                match which {
                    Some(w) => eprintln!("License {} not found", crate::output::terminal_safe(w)),
                    None => println!("No licenses configured in the system"),
                }
                return Ok(if which.is_some() { 1 } else { 0 });
            }
            for l in shown {
                out.push_str(&license_record(l, oneliner));
            }
        }
        other => {
            eprintln!(
                "scontrol: error: show {} is not supported by berth (job, node, partition, licenses are)",
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

    /// Issue 20: `Gres=` in Slurm's form on a node with GPUs, no such line without.
    #[test]
    fn show_node_gres_only_with_gpus() {
        let node = |gpus: u32| -> NodeInfo {
            let mut topo = berth_core::topology::Topology::uniform(2, 2, 1, 1, 1 << 30);
            topo.add_emulated_gpus(gpus).unwrap();
            serde_json::from_value(serde_json::json!({
                "id": 0, "name": "gpu1", "state": "up", "address": "a", "sockets": 2, "cores": 4, "pus": 4,
                "topology": "SCCSCC", "free": "SCCSCC", "cpus_allocated": 0, "memory_bytes": 4u64 << 30,
                "memory_allocated_bytes": 0, "real_cpus": "0", "jobs": [], "last_heard_seconds_ago": null,
                "numa": [], "gpus": topo.gpus
            }))
            .unwrap()
        };
        let r = node_record(&node(2), &["batch".into()], false);
        assert!(r.lines().any(|l| l == "   Gres=gpu:emulated:8(S:0-1)"), "{r}");
        let mut mixed = node(1);
        mixed.gpus[3].emulated = false;
        mixed.gpus[3].model = Some("Tesla K40m".into());
        mixed.gpus[3].package = None;
        assert_eq!(gres(&mixed).as_deref(), Some("gpu:emulated:3(S:0-1),gpu:k40m:1"));
        assert!(!node_record(&node(0), &[], false).contains("Gres"));
    }

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

    fn words(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn update_reads_slurm_keys_and_times() {
        let p = update_plan(&words(&[
            "JobId=12",
            "TimeLimit=1:30:00",
            "NumNodes=2",
            "NumCPUs=8",
            "Partition=long",
            "JobName=sim",
            "Dependency=afterok:5",
            "Priority=100",
        ]))
        .unwrap();
        assert_eq!(p.ids, vec!["12"]);
        assert_eq!(p.time, Some(TimeLimit::Set(5400)));
        let c = &p.change;
        assert_eq!(
            (c.nodes, c.cores, c.queue.as_deref(), c.name.as_deref()),
            (Some(2), Some(8), Some("long"), Some("sim"))
        );
        assert_eq!((c.dependency.as_deref(), c.priority), (Some("afterok:5"), Some(100)));
        // Every Slurm time format, relative ones, keys in any case.
        let time = |v: &str| update_plan(&words(&["jobid=3", &format!("timelimit={v}")])).map(|p| p.time.unwrap());
        assert_eq!(time("30"), Ok(TimeLimit::Set(1800)), "minutes");
        assert_eq!(time("10:00"), Ok(TimeLimit::Set(600)), "MM:SS");
        assert_eq!(time("2-12"), Ok(TimeLimit::Set(2 * 86_400 + 12 * 3600)), "D-HH");
        assert_eq!(time("1-0:30"), Ok(TimeLimit::Set(86_400 + 1800)), "D-HH:MM");
        assert_eq!(time("+30"), Ok(TimeLimit::Add(1800)));
        assert_eq!(time("-1:00"), Ok(TimeLimit::Sub(60)));
        assert!(time("soon").unwrap_err().contains("Invalid TimeLimit"));
        assert!(time("UNLIMITED").unwrap_err().contains("unlimited"));
        let p = update_plan(&words(&["JobId=4_2,7", "NumTasks=6", "Name=x", "Dependency="])).unwrap();
        assert_eq!(p.ids, vec!["4_2", "7"]);
        assert_eq!((p.change.tasks, p.change.dependency.as_deref()), (Some(6), Some("")));
        let err = |w: &[&str]| update_plan(&words(w)).unwrap_err();
        assert!(err(&["TimeLimit=10"]).contains("JobId"));
        assert!(err(&["JobId=3"]).contains("No changes"));
        assert!(err(&["JobId=3", "QOS=high"]).contains("not supported: QOS=high"));
        assert!(err(&["JobId=3", "NumNodes=2-4"]).contains("range"));
        assert!(err(&["JobId=3", "NumCPUs=0"]).contains("Invalid"));
        assert!(err(&["JobId=3", "Dependency=afterok:x"]).contains("Invalid dependency"));
        assert!(err(&["JobId=3", "oops"]).contains("Key=Value"));
        // Licenses and generic resources: counted lists; empty removes them; GPUs are not changed.
        let p = update_plan(&words(&["JobId=3", "Licenses=matlab:2,ansys", "Gres="])).unwrap();
        let lic = p.change.licenses.unwrap();
        assert_eq!((lic.get("matlab"), lic.get("ansys")), (Some(&2), Some(&1)));
        assert_eq!(p.change.gres, Some(Default::default()));
        assert!(err(&["JobId=3", "Gres=gpu:2"]).contains("GPUs"));
        assert!(err(&["JobId=3", "Licenses=matlab:0"]).contains("Invalid Licenses"));
    }
}
