//! `berth task`: the task API (seeds/001, PBS TM) from inside a job. Talks to the local agent
//! on `$BERTH_AGENT_SOCKET`, for the job `$BERTH_JOB_ID`; both are set in every process of a
//! job (batch script, ranks of `berth run`, tasks). See docs/protocol/04-task-api.md, "Task API".

use anyhow::{anyhow, bail, Context, Result};
use berth_core::JobId;
use berth_protocol::agent::{AgentQuery, AgentReply};
use berth_protocol::step::{parse_signal, signal_name, AllocationNode, Chunk, TaskInfo, TaskReply, TaskRequest};
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
    /// Run COMMAND on node HOST of the job and wait for it, as `ssh HOST COMMAND` does: the
    /// words are joined and run by the user's login shell there, in the current directory,
    /// with this environment; its output comes here, signals this process gets go to it, and
    /// its exit status is this command's (255: it could not start). HOST is a node's name
    /// (`berth task info`), its short name or its agent's address; ssh's options before it
    /// are accepted and ignored, so MPI launchers use it as their ssh (Open MPI's
    /// `plm_rsh_agent`, MPICH hydra's `-launcher-exec`, set in every job's environment).
    /// Also run as `berth-rsh HOST COMMAND`.
    Rsh {
        /// [SSH-OPTIONS] HOST COMMAND...
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, value_name = "HOST COMMAND")]
        args: Vec<String>,
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
        TaskCommand::Rsh { args } => rsh(job, &socket, args).await,
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

/// The name under which the client is `berth task rsh` (one word, for launchers that take a
/// program and no arguments, such as MPICH hydra's `-launcher-exec`): each agent links it to
/// the client in its spool directory.
pub use berth_protocol::step::RSH_NAME;

/// If invoked as [`RSH_NAME`], run as `berth task rsh` and return its exit status.
pub fn main_as_rsh(argv: &[std::ffi::OsString]) -> Option<i32> {
    let name = argv.first().map(std::path::Path::new).and_then(std::path::Path::file_name)?;
    if name != RSH_NAME {
        return None;
    }
    crate::default_sigpipe();
    let args: Option<Vec<String>> = argv[1..].iter().map(|a| a.clone().into_string().ok()).collect();
    let Some(args) = args else {
        eprintln!("berth task rsh: an argument is not valid UTF-8");
        return Some(255);
    };
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("berth task rsh: cannot start the async runtime: {e}");
            return Some(255);
        }
    };
    Some(rt.block_on(async {
        match job_and_socket() {
            Ok((job, socket)) => rsh(job, &socket, args).await.unwrap_or(255),
            Err(e) => {
                eprintln!("berth task rsh: {e}");
                255
            }
        }
    }))
}

/// ssh's options that take a value (`-l USER`, `-p PORT`, `-o OPTION`, ...).
const SSH_VALUE_OPTIONS: &str = "BbcDEeFIiJLlmOoPpQRSWw";

/// `[SSH-OPTIONS] HOST COMMAND...` as ssh reads it: (host, command words). `-o X`, `-oX`,
/// `-p 22`, `-x`, `-q`, `-- HOST`... are skipped; `user@host` is `host`.
pub fn parse_rsh(args: &[String]) -> Result<(String, Vec<String>)> {
    let mut i = 0;
    while let Some(a) = args.get(i) {
        if a == "--" {
            i += 1;
            break;
        }
        let Some(flags) = a.strip_prefix('-').filter(|f| !f.is_empty()) else { break };
        i += 1;
        // Flags run together (-xq); the first taking a value takes the rest or the next word.
        for (at, c) in flags.char_indices() {
            if SSH_VALUE_OPTIONS.contains(c) {
                if at + c.len_utf8() == flags.len() {
                    i += 1;
                }
                break;
            }
        }
    }
    let host =
        args.get(i).ok_or_else(|| anyhow!("berth task rsh: no host given (usage: berth task rsh HOST COMMAND...)"))?;
    let host = host.rsplit_once('@').map_or(host.as_str(), |(_, h)| h).to_string();
    let command = args[i + 1..].to_vec();
    if command.is_empty() {
        bail!("berth task rsh: no command given for {host}: an interactive login is not offered (usage: berth task rsh HOST COMMAND...)");
    }
    Ok((host, command))
}

/// The index of the node `host` names: its name, its short name (up to the first dot,
/// either side), or its agent's address (with or without the port).
pub fn node_of(host: &str, nodes: &[AllocationNode]) -> Option<u32> {
    let short = |n: &str| n.split('.').next().unwrap_or(n).to_string();
    let addr_host = |a: &str| a.rsplit_once(':').map_or(a, |(h, _)| h).trim_matches(['[', ']']).to_string();
    nodes
        .iter()
        .find(|n| n.name == host)
        .or_else(|| nodes.iter().find(|n| short(&n.name) == short(host)))
        .or_else(|| nodes.iter().find(|n| n.address == host))
        .or_else(|| {
            // An address shared by several nodes (agents on one host) names none of them.
            let hits: Vec<&AllocationNode> =
                nodes.iter().filter(|n| !n.address.is_empty() && addr_host(&n.address) == host).collect();
            (hits.len() == 1).then(|| hits[0])
        })
        .map(|n| n.index)
}

/// The user's login shell (what sshd runs a command with), else /bin/sh.
fn login_shell() -> String {
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten()
        .map(|u| u.shell.to_string_lossy().into_owned())
        .filter(|s| s.starts_with('/') && std::path::Path::new(s).is_file())
        .unwrap_or_else(|| "/bin/sh".into())
}

/// The size of one chunk of `berth task rsh`'s stdin, and how many may wait to be sent.
const STDIN_CHUNK: usize = 16 * 1024;
const STDIN_CHUNKS: usize = 4;

/// `berth task rsh`: see [`TaskCommand::Rsh`]. Errors of its own exit 255, as ssh's.
async fn rsh(job: JobId, socket: &str, args: Vec<String>) -> Result<i32> {
    match rsh_inner(job, socket, args).await {
        Ok(code) => Ok(code),
        Err(e) => {
            eprintln!("berth task rsh: {}", crate::output::terminal_safe(&format!("{e:#}")));
            Ok(255)
        }
    }
}

async fn rsh_inner(job: JobId, socket: &str, args: Vec<String>) -> Result<i32> {
    use tokio::io::AsyncWriteExt;
    use tokio::signal::unix::{signal, SignalKind};
    let (host, command) = parse_rsh(&args)?;
    let TaskReply::Info { nodes, .. } = call(socket, TaskRequest::Info { job }).await? else {
        bail!("unexpected answer")
    };
    let node = node_of(&host, &nodes).ok_or_else(|| {
        let names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
        anyhow!("{} is not a node of job {job} (its nodes: {})", host.escape_debug(), names.join(", "))
    })?;
    let env = std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)));
    let cwd = std::env::current_dir().context("cannot determine the current directory")?;
    let req = TaskRequest::Exec {
        job,
        node,
        argv: vec![login_shell(), "-c".into(), command.join(" ")],
        env: env.collect(),
        cwd: cwd.to_string_lossy().into_owned(),
    };
    let s = tokio::net::UnixStream::connect(socket)
        .await
        .with_context(|| format!("cannot reach this node's agent at {socket}"))?;
    let (mut rd, mut wr) = s.into_split();
    write_frame(&mut wr, &AgentQuery::Task { request: req }).await?;
    match read_frame::<_, AgentReply>(&mut rd).await? {
        Some(AgentReply::Task { reply: TaskReply::Spawned { tasks } }) => {
            if let Some(t) = tasks.iter().find(|t| t.state == "failed") {
                bail!("cannot start the command on {host}: {}", t.reason.as_deref().unwrap_or("?"));
            }
        }
        Some(AgentReply::Task { reply: TaskReply::Error { message } }) | Some(AgentReply::Error { message }) => {
            bail!("{message}")
        }
        Some(other) => bail!("unexpected answer from the agent: {other:?}"),
        None => bail!("the agent closed the connection"),
    }
    // Frames are read by their own task: a read cut by select! would lose its bytes.
    let (tx, mut frames) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let msg = read_frame::<_, AgentReply>(&mut rd).await;
            let end = !matches!(msg, Ok(Some(_)));
            if tx.send(msg).is_err() || end {
                return;
            }
        }
    });
    let kinds = [
        SignalKind::interrupt(),
        SignalKind::terminate(),
        SignalKind::hangup(),
        SignalKind::quit(),
        SignalKind::user_defined1(),
        SignalKind::user_defined2(),
    ];
    let (sig_tx, mut sigs) = tokio::sync::mpsc::unbounded_channel();
    for kind in kinds {
        let mut stream = signal(kind).context("cannot catch signals")?;
        let tx = sig_tx.clone();
        tokio::spawn(async move {
            while stream.recv().await.is_some() {
                if tx.send(kind.as_raw_value()).is_err() {
                    return;
                }
            }
        });
    }
    // Our stdin, to the task, as ssh forwards it: read by a thread of its own (a blocking read
    // cannot be cancelled, and must not hold up our exit), at most STDIN_CHUNKS chunks ahead.
    let (stdin_tx, mut stdin_rx) = tokio::sync::mpsc::channel::<Vec<u8>>(STDIN_CHUNKS);
    std::thread::spawn(move || {
        use std::io::Read;
        let mut buf = vec![0u8; STDIN_CHUNK];
        let mut input = std::io::stdin().lock();
        loop {
            match input.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => {
                    if stdin_tx.blocking_send(buf[..n].to_vec()).is_err() {
                        return;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    });
    let mut stdin_open = true;
    let (mut out, mut err) = (tokio::io::stdout(), tokio::io::stderr());
    loop {
        tokio::select! {
            msg = frames.recv() => match msg {
                Some(Ok(Some(AgentReply::Task { reply: TaskReply::Output { stream, data } }))) => {
                    // Output nobody reads any more is dropped, as ssh's would be.
                    let _ = if stream == 2 { err.write_all(data.as_bytes()).await } else { out.write_all(data.as_bytes()).await };
                    let _ = if stream == 2 { err.flush().await } else { out.flush().await };
                }
                Some(Ok(Some(AgentReply::Task { reply: TaskReply::Exited { exit_code, signal, .. } }))) => {
                    return Ok(match (exit_code, signal) {
                        (Some(c), _) => c,
                        (None, Some(s)) => 128 + s,
                        (None, None) => 255,
                    });
                }
                Some(Ok(Some(AgentReply::Task { reply: TaskReply::Error { message } }))) => bail!("{message}"),
                Some(Ok(Some(_))) => {}
                Some(Ok(None)) | None => bail!("the agent closed the connection; the command on {host} was killed"),
                Some(Err(e)) => bail!("{e}"),
            },
            // A write that fails (the command ended and the agent closed its side) is not the
            // command's outcome: the reply already on its way, or the close, says what that is.
            Some(signal) = sigs.recv() => {
                let _ = write_frame(&mut wr, &AgentQuery::Task { request: TaskRequest::Signal { signal } }).await;
            }
            chunk = stdin_rx.recv(), if stdin_open => {
                let request = match chunk {
                    Some(data) => TaskRequest::Stdin { data: Chunk::from_bytes(data) },
                    None => {
                        stdin_open = false;
                        TaskRequest::StdinEof
                    }
                };
                if write_frame(&mut wr, &AgentQuery::Task { request }).await.is_err() {
                    stdin_open = false;
                }
            }
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

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn rsh_reads_its_arguments_as_ssh_does() {
        let p = |s: &str| parse_rsh(&words(s)).map_err(|e| e.to_string());
        assert_eq!(p("node2 orted -mca x y").unwrap(), ("node2".into(), words("orted -mca x y")));
        // hydra's ssh launcher passes -x; Open MPI's plm_rsh_args may hold -o, -p, -l.
        assert_eq!(p("-x node2 hydra_pmi_proxy --control-port h:1").unwrap().0, "node2");
        assert_eq!(
            p("-o StrictHostKeyChecking=no -p 22 -xq u@node3 echo hi").unwrap(),
            ("node3".into(), words("echo hi"))
        );
        assert_eq!(p("-oBatchMode=yes -lroot node1 true").unwrap(), ("node1".into(), words("true")));
        assert_eq!(p("-- -weird-host true").unwrap().0, "-weird-host");
        assert!(p("-x").unwrap_err().contains("no host given"), "{:?}", p("-x"));
        assert!(p("node2").unwrap_err().contains("no command given for node2"), "{:?}", p("node2"));
    }

    #[test]
    fn rsh_finds_nodes_by_name_short_name_or_address() {
        let node = |index: u32, name: &str, address: &str| AllocationNode {
            index,
            name: name.into(),
            address: address.into(),
            slots: 2,
            cpus: String::new(),
        };
        let nodes = [
            node(0, "n1.cluster", "10.0.0.1:7000"),
            node(1, "n2.cluster", "10.0.0.2:7000"),
            node(2, "n3", "10.0.0.2:7001"),
        ];
        assert_eq!(node_of("n2.cluster", &nodes), Some(1));
        assert_eq!(node_of("n1", &nodes), Some(0));
        assert_eq!(node_of("n3.cluster", &nodes), Some(2));
        assert_eq!(node_of("10.0.0.1", &nodes), Some(0));
        assert_eq!(node_of("10.0.0.2:7001", &nodes), Some(2));
        assert_eq!(node_of("10.0.0.2", &nodes), None, "two nodes share that address");
        assert_eq!(node_of("elsewhere", &nodes), None);
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
