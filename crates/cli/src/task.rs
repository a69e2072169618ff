//! `berth task`: the task API (seeds/001, PBS TM) from inside a job. Talks to the local agent
//! on `$BERTH_AGENT_SOCKET`, for the job `$BERTH_JOB_ID`; both are set in every process of a
//! job (batch script, ranks of `berth run`, tasks). See docs/protocol/04-task-api.md, "Task API".

use anyhow::{anyhow, bail, Context, Result};
use berth_core::JobId;
use berth_protocol::agent::{AgentQuery, AgentReply};
use berth_protocol::step::{parse_signal, signal_name, AllocationNode, TaskInfo, TaskReply, TaskRequest};
use berth_protocol::{read_frame, write_frame};
use clap::Subcommand;

#[derive(Subcommand, Debug)]
pub enum TaskCommand {
    /// The job's nodes: index, name, slots (cores), CPUs, agent address.
    Info,
    /// Start COMMAND on node INDEX of the allocation (asynchronously; prints the task ids).
    /// The command is looked up in PATH there; output is appended to
    /// `berth-task-<job>.<task>.out` / `.err` in the current directory unless --output/--error.
    Spawn {
        /// Node index in the allocation (0 = the first node; see `berth task info`).
        #[arg(long)]
        node: u32,
        /// Copies to start.
        #[arg(long, default_value_t = 1)]
        count: u32,
        /// File the tasks' stdout is appended to (%j job, %t task id, %n node index).
        #[arg(long)]
        output: Option<String>,
        /// File the tasks' stderr is appended to (same patterns; may be the --output file).
        #[arg(long)]
        error: Option<String>,
        /// The command and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, value_name = "COMMAND")]
        command: Vec<String>,
    },
    /// Every task spawned through this node's agent in this job.
    List,
    /// Wait for tasks to end (all when no id is given). Exit status 1 if any failed, 2 if
    /// the timeout passed with some still running.
    Wait {
        ids: Vec<u64>,
        /// Seconds to wait at most.
        #[arg(long)]
        timeout: Option<f64>,
    },
    /// Send a signal to tasks' process groups (all running tasks when no id is given).
    Kill {
        ids: Vec<u64>,
        /// Name (TERM, KILL, USR1) or number.
        #[arg(long, short = 's', default_value = "TERM")]
        signal: String,
    },
}

fn job_and_socket() -> Result<(JobId, String)> {
    let socket = std::env::var("BERTH_AGENT_SOCKET")
        .ok()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| anyhow!("berth task works only inside a job (BERTH_AGENT_SOCKET is not set)"))?;
    let job = std::env::var("BERTH_JOB_ID")
        .map_err(|_| anyhow!("berth task works only inside a job (BERTH_JOB_ID is not set)"))?
        .parse::<JobId>()
        .map_err(|e| anyhow!("BERTH_JOB_ID: {e}"))?;
    Ok((job, socket))
}

async fn call(socket: &str, request: TaskRequest) -> Result<TaskReply> {
    let mut s = tokio::net::UnixStream::connect(socket)
        .await
        .with_context(|| format!("cannot reach this node's agent at {socket}"))?;
    write_frame(&mut s, &AgentQuery::Task { request }).await?;
    match read_frame::<_, AgentReply>(&mut s).await? {
        Some(AgentReply::Task { reply: TaskReply::Error { message } }) => bail!("{message}"),
        Some(AgentReply::Task { reply }) => Ok(reply),
        Some(AgentReply::Error { message }) => bail!("{message}"),
        Some(other) => bail!("unexpected answer from the agent: {other:?}"),
        None => bail!("the agent closed the connection"),
    }
}

pub async fn run(json: bool, command: TaskCommand) -> Result<i32> {
    let (job, socket) = job_and_socket()?;
    match command {
        TaskCommand::Info => {
            let TaskReply::Info { job, nodes } = call(&socket, TaskRequest::Info { job }).await? else {
                bail!("unexpected answer")
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&serde_json::json!({"job": job, "nodes": nodes}))?);
            } else {
                print!("{}", crate::output::terminal_safe(&info_table(&nodes)));
            }
            Ok(0)
        }
        TaskCommand::Spawn { node, count, output, error, command } => {
            let env = std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)));
            let cwd = std::env::current_dir().context("cannot determine the current directory")?;
            let req = TaskRequest::Spawn {
                job,
                node,
                argv: command,
                env: env.collect(),
                cwd: cwd.to_string_lossy().into_owned(),
                count,
                output,
                error,
            };
            let TaskReply::Spawned { tasks } = call(&socket, req).await? else { bail!("unexpected answer") };
            let failed = tasks.iter().filter(|t| t.state == "failed").count();
            if json {
                println!("{}", serde_json::to_string_pretty(&tasks)?);
            } else {
                for t in &tasks {
                    match t.state.as_str() {
                        "failed" => eprintln!(
                            "berth: task {} on node {} ({}) failed to start: {}",
                            t.id,
                            t.node_index,
                            t.node,
                            t.reason.as_deref().unwrap_or("?")
                        ),
                        _ => println!("{}", t.id),
                    }
                }
            }
            Ok(if failed > 0 { 1 } else { 0 })
        }
        TaskCommand::List => {
            let TaskReply::Tasks { tasks } = call(&socket, TaskRequest::List { job }).await? else {
                bail!("unexpected answer")
            };
            print_tasks(json, &tasks)?;
            Ok(0)
        }
        TaskCommand::Wait { ids, timeout } => {
            let timeout_ms = match timeout {
                Some(t) if t.is_finite() && t >= 0.0 => Some((t * 1000.0) as u64),
                Some(t) => bail!("--timeout {t}: expected seconds, 0 or more"),
                None => None,
            };
            let TaskReply::Tasks { tasks } = call(&socket, TaskRequest::Wait { job, tasks: ids, timeout_ms }).await?
            else {
                bail!("unexpected answer")
            };
            print_tasks(json, &tasks)?;
            Ok(wait_status(&tasks))
        }
        TaskCommand::Kill { ids, signal } => {
            let sig = parse_signal(&signal)
                .ok_or_else(|| anyhow!("unknown signal {signal:?}; use a name like TERM or KILL, or a number"))?;
            let TaskReply::Tasks { tasks } = call(&socket, TaskRequest::Kill { job, tasks: ids, signal: sig }).await?
            else {
                bail!("unexpected answer")
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&tasks)?);
            } else {
                for t in &tasks {
                    if t.ended() {
                        println!("task {} had already ended", t.id);
                    } else {
                        println!("task {} signalled ({})", t.id, signal_name(sig));
                    }
                }
            }
            Ok(0)
        }
    }
}

/// 0 when every task exited 0, 1 when one failed, 2 when one still runs (timeout).
fn wait_status(tasks: &[TaskInfo]) -> i32 {
    if tasks.iter().any(|t| t.unsuccessful()) {
        1
    } else if tasks.iter().any(|t| !t.ended()) {
        2
    } else {
        0
    }
}

fn print_tasks(json: bool, tasks: &[TaskInfo]) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(tasks)?);
    } else {
        print!("{}", crate::output::terminal_safe(&tasks_table(tasks)));
    }
    Ok(())
}

fn info_table(nodes: &[AllocationNode]) -> String {
    let mut out = format!("{:>5}  {:<16} {:>5}  {:<16} {}\n", "INDEX", "NODE", "SLOTS", "CPUS", "ADDRESS");
    for n in nodes {
        let cpus = if n.cpus.is_empty() { "?" } else { &n.cpus };
        out.push_str(&format!("{:>5}  {:<16} {:>5}  {:<16} {}\n", n.index, n.name, n.slots, cpus, n.address));
    }
    out
}

fn end_of(t: &TaskInfo) -> String {
    match (t.state.as_str(), t.exit_code, t.signal) {
        ("failed", _, _) => t.reason.clone().unwrap_or_else(|| "failed".into()),
        (_, _, Some(s)) => format!("signal {s} ({})", signal_name(s)),
        (_, Some(c), None) => c.to_string(),
        _ => "-".into(),
    }
}

fn wall_of(ms: Option<u64>) -> String {
    match ms {
        Some(ms) => format!("{:.1}s", ms as f64 / 1000.0),
        None => "-".into(),
    }
}

fn tasks_table(tasks: &[TaskInfo]) -> String {
    let tasks = &crate::output::escaped(tasks)[..];
    let mut out = format!(
        "{:>4}  {:>4}  {:<12} {:>8}  {:<8} {:>8}  {:<24} {}\n",
        "ID", "NODE", "HOST", "PID", "STATE", "WALL", "EXIT", "COMMAND"
    );
    for t in tasks {
        let pid = t.pid.map(|p| p.to_string()).unwrap_or_else(|| "-".into());
        out.push_str(&format!(
            "{:>4}  {:>4}  {:<12} {:>8}  {:<8} {:>8}  {:<24} {}\n",
            t.id,
            t.node_index,
            t.node,
            pid,
            t.state,
            wall_of(t.wall_ms),
            end_of(t),
            t.argv.join(" ")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(state: &str, exit: Option<i32>, signal: Option<i32>) -> TaskInfo {
        TaskInfo {
            id: 1,
            node: "node1".into(),
            node_index: 0,
            argv: vec!["sleep".into(), "1".into()],
            pid: Some(42),
            state: state.into(),
            exit_code: exit,
            signal,
            reason: None,
            wall_ms: Some(1500),
            stdout: None,
            stderr: None,
        }
    }

    #[test]
    fn wait_status_reports_failures_then_timeouts() {
        assert_eq!(wait_status(&[task("exited", Some(0), None)]), 0);
        assert_eq!(wait_status(&[task("exited", Some(0), None), task("running", None, None)]), 2);
        assert_eq!(wait_status(&[task("exited", Some(3), None), task("running", None, None)]), 1);
        assert_eq!(wait_status(&[task("exited", None, Some(9))]), 1);
        assert_eq!(wait_status(&[task("failed", None, None)]), 1);
        assert_eq!(wait_status(&[]), 0);
    }

    #[test]
    fn tables_show_state_and_ending() {
        let t = tasks_table(&[task("exited", None, Some(9)), task("running", None, None)]);
        assert!(t.contains("signal 9 (KILL)") && t.contains("sleep 1") && t.contains("1.5s"), "{t}");
        let n = info_table(&[AllocationNode {
            index: 0,
            name: "node1".into(),
            address: "127.0.0.1:1".into(),
            slots: 2,
            cpus: String::new(),
        }]);
        assert!(n.contains("node1") && n.contains(" ? "), "{n}");
    }
}
