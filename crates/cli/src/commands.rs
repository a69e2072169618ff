//! The user commands: build a request, print the answer.

use crate::client::{cluster_dir, request};
use crate::output;
use crate::submission::{build_source_submission, Source};
use crate::{Command, SubmitFlags};
use anyhow::{anyhow, bail, Result};
use berth_core::job::JobState;
use berth_core::JobId;
use berth_protocol::client::{ClientRequest, ClientResponse, IdResult};
use std::path::{Path, PathBuf};

pub async fn dispatch(dir: Option<PathBuf>, json: bool, command: Command) -> Result<i32> {
    let dir = cluster_dir(dir);
    match command {
        Command::Submit { scripts, wrap, flags, hold, wait } => {
            let sources = match wrap {
                Some(cmd) => vec![Source::Wrap(cmd)],
                None => scripts.into_iter().map(Source::from_arg).collect(),
            };
            submit(&dir, json, sources, &flags, hold, wait).await
        }
        Command::Jobs { all, state, user, me, name, queue, array, no_fold } => {
            let states = parse_states(&state)?;
            let mut filter = JobFilter { users: user, names: name, queues: queue, arrays: Vec::new() };
            filter.arrays = array
                .iter()
                .filter(|a| !a.trim().is_empty())
                .map(|a| {
                    crate::compat::format::parse_job_id(a)
                        .filter(|_| !a.contains('_'))
                        .ok_or_else(|| anyhow!("--array {a:?}: give an array's id, e.g. --array 12"))
                })
                .collect::<Result<Vec<_>>>()?;
            if me {
                filter.users.push(crate::compat::slurm::own_user_name());
            }
            let ClientResponse::Jobs { mut jobs } = request(&dir, ClientRequest::ListJobs { states, all }).await?
            else {
                bail!("unexpected answer")
            };
            filter.apply(&mut jobs);
            // JSON keeps one object per task; the table folds an array's pending tasks.
            print(json, &jobs, || output::jobs_table_folded(&jobs, !no_fold))
        }
        Command::Wait { ids, timeout } => wait(&dir, json, &ids, timeout).await,
        Command::Show { id } => {
            let id = task_ids(&dir, std::slice::from_ref(&id))
                .await?
                .first()
                .copied()
                .ok_or_else(|| anyhow!("no job id"))?;
            let ClientResponse::Job { job } = request(&dir, ClientRequest::ShowJob { id }).await? else {
                bail!("unexpected answer")
            };
            print(json, &job, || output::job_detail(&job))
        }
        Command::Alloc(args) => crate::alloc::alloc_command(&dir, json, args).await,
        Command::Cancel { ids } => {
            let (ids, only) = crate::arrays::resolve_tasks(&dir, &ids, parse_id).await?;
            per_id(&dir, json, "cancelled", ClientRequest::Cancel { ids, only }).await
        }
        Command::Hold { ids } => {
            let (ids, only) = crate::arrays::resolve_tasks(&dir, &ids, parse_id).await?;
            per_id(&dir, json, "held", ClientRequest::Hold { ids, only }).await
        }
        Command::Release { ids } => {
            let (ids, only) = crate::arrays::resolve_tasks(&dir, &ids, parse_id).await?;
            per_id(&dir, json, "released", ClientRequest::Release { ids, only }).await
        }
        Command::Update(args) => {
            let (ids, only) = crate::arrays::resolve_tasks(&dir, std::slice::from_ref(&args.id), parse_id).await?;
            let id = ids.first().copied().ok_or_else(|| anyhow!("no job id"))?;
            crate::changes::update(&dir, json, (id, only.contains(&id)), &args).await
        }
        Command::Requeue { ids } => {
            let (ids, only) = crate::arrays::resolve_tasks(&dir, &ids, parse_id).await?;
            per_id(&dir, json, "requeued", ClientRequest::Requeue { ids, only }).await
        }
        Command::Suspend { ids } => {
            per_id(&dir, json, "suspended", ClientRequest::Suspend { ids: parse_ids(&ids)? }).await
        }
        Command::Resume { ids } => per_id(&dir, json, "resumed", ClientRequest::Resume { ids: parse_ids(&ids)? }).await,
        Command::Licenses => {
            let ClientResponse::Nodes { licenses, .. } =
                request(&dir, ClientRequest::ListNodes { topology: false }).await?
            else {
                bail!("unexpected answer")
            };
            print(json, &licenses, || output::licenses_table(&licenses))
        }
        Command::Nodes { topology, width } => {
            let ClientResponse::Nodes { nodes, .. } = request(&dir, ClientRequest::ListNodes { topology }).await?
            else {
                bail!("unexpected answer")
            };
            print(json, &nodes, || {
                if topology {
                    nodes.iter().map(|n| crate::topo_view::draw_node(n, width)).collect::<Vec<_>>().join("\n")
                } else {
                    output::nodes_table(&nodes)
                }
            })
        }
        Command::Node { action, name, value } => {
            if action == "system-cpus" && value.is_none() {
                bail!("give the system CPUs as a kernel list, e.g. `berth node system-cpus {name} 0` (\"\" for none)");
            }
            let req = ClientRequest::NodeAdmin { name, action, value };
            let ClientResponse::Nodes { nodes, .. } = request(&dir, req).await? else { bail!("unexpected answer") };
            print(json, &nodes, || output::nodes_table(&nodes))
        }
        Command::Subnode { action, target, value } => {
            let (node, index) = target
                .rsplit_once(':')
                .and_then(|(n, i)| Some((n.to_string(), i.parse::<u32>().ok()?)))
                .ok_or_else(|| anyhow!("{target:?} is not NODE:INDEX, e.g. n1:0"))?;
            let req = ClientRequest::SubnodeAdmin { node, index, action, value };
            let ClientResponse::Nodes { nodes, .. } = request(&dir, req).await? else { bail!("unexpected answer") };
            print(json, &nodes, || output::nodes_table(&nodes))
        }
        Command::Acct { limit, steps, filter } => crate::compat::sacct::native(&dir, json, limit, steps, filter).await,
        Command::Queues => {
            let ClientResponse::Queues { queues } = request(&dir, ClientRequest::Queues).await? else {
                bail!("unexpected answer")
            };
            print(json, &queues, || output::queues_table(&queues))
        }
        Command::Share => {
            let ClientResponse::Share { half_life_secs, accounts } = request(&dir, ClientRequest::Share).await? else {
                bail!("unexpected answer")
            };
            print(json, &accounts, || output::share_table(half_life_secs, &accounts))
        }
        Command::Events(args) => crate::events::run(&dir, json, args).await,
        Command::Status => crate::status::run(&dir, json).await,
        Command::Faults { command } => crate::faults::run(&dir, json, command).await,
        Command::Reservations { all } => crate::reservations::list(&dir, json, all).await,
        Command::Resv { command } => crate::advance::run(&dir, json, command).await,
        Command::Run(args) => crate::run::run(&dir, json, args).await,
        Command::Signal { target, signal } => {
            let (job, step) = match target.split_once('.') {
                Some((j, s)) => (
                    parse_id(j)?,
                    Some(s.parse::<u32>().map_err(|_| anyhow!("bad step in {target:?}; use JOB.STEP, e.g. 7.1"))?),
                ),
                None => (parse_id(&target)?, None),
            };
            let sig = berth_protocol::step::parse_signal(&signal)
                .ok_or_else(|| anyhow!("unknown signal {signal:?}; use a name like USR1 or TERM, or a number"))?;
            per_id(&dir, json, "signalled", ClientRequest::Signal { job, step, signal: sig }).await
        }
        Command::Task { command } => crate::task::run(json, command).await,
        Command::Sim(args) => crate::sim::run(json, args),
        Command::Keygen { file } => keygen(&file, json),
        Command::Compat { command } => crate::compat::install::run(json, command),
        Command::Server(_) | Command::Agent(_) | Command::Up(_) | Command::Down(_) | Command::Demo(_) => {
            crate::exec_berthd()
        }
    }
}

/// `berth keygen FILE`: a new cluster key (mode 0600); refuses to replace one.
pub fn keygen(file: &Path, json: bool) -> Result<i32> {
    berth_protocol::auth::ClusterKey::generate(file)?;
    if json {
        println!("{}", serde_json::json!({"key_file": file.display().to_string()}));
    } else {
        println!(
            "cluster key written to {} (mode 0600); give the same file to `berth server --key-file` and every `berth agent --key-file`",
            file.display()
        );
    }
    Ok(0)
}

fn print<T: serde::Serialize>(json: bool, value: &T, human: impl FnOnce() -> String) -> Result<i32> {
    if json {
        println!("{}", serde_json::to_string_pretty(value)?);
    } else {
        print!("{}", output::terminal_safe(&human()));
    }
    Ok(0)
}

fn parse_id(s: &str) -> Result<JobId> {
    s.parse::<JobId>().map_err(|e| anyhow!(e))
}

/// Ids where a task of an array may be named `A_i` (`crate::arrays`).
async fn task_ids(dir: &Path, ids: &[String]) -> Result<Vec<JobId>> {
    crate::arrays::resolve(dir, ids, parse_id).await
}

fn parse_ids(ids: &[String]) -> Result<Vec<JobId>> {
    ids.iter().map(|s| parse_id(s)).collect()
}

async fn per_id(dir: &Path, json: bool, verb: &str, req: ClientRequest) -> Result<i32> {
    // At most MAX_IDS_PER_REQUEST ids per request, so that every answer fits a frame.
    let batches: Vec<ClientRequest> = {
        // Each batch with those of its ids that name one task.
        let split = |ids: &[JobId], only: &[JobId], make: fn(Vec<JobId>, Vec<JobId>) -> ClientRequest| {
            ids.chunks(berth_protocol::client::MAX_IDS_PER_REQUEST)
                .map(|b| make(b.to_vec(), only.iter().copied().filter(|i| b.contains(i)).collect()))
                .collect()
        };
        match &req {
            ClientRequest::Cancel { ids, only } => split(ids, only, |ids, only| ClientRequest::Cancel { ids, only }),
            ClientRequest::Hold { ids, only } => split(ids, only, |ids, only| ClientRequest::Hold { ids, only }),
            ClientRequest::Release { ids, only } => split(ids, only, |ids, only| ClientRequest::Release { ids, only }),
            ClientRequest::Requeue { ids, only } => split(ids, only, |ids, only| ClientRequest::Requeue { ids, only }),
            ClientRequest::Suspend { ids } => split(ids, &[], |ids, _| ClientRequest::Suspend { ids }),
            ClientRequest::Resume { ids } => split(ids, &[], |ids, _| ClientRequest::Resume { ids }),
            _ => vec![req],
        }
    };
    let mut results = Vec::new();
    for batch in batches {
        let ClientResponse::Done { results: r } = request(dir, batch).await? else { bail!("unexpected answer") };
        results.extend(r);
    }
    let failed = results.iter().filter(|r| !r.ok).count();
    if json {
        println!("{}", serde_json::to_string_pretty(&results)?);
    } else {
        for IdResult { id, ok, error } in &results {
            match (ok, error) {
                (true, _) => println!("job {id} {verb}"),
                (false, Some(e)) => {
                    eprintln!("berth: {}", crate::output::terminal_safe(&id_error(*id, &e.to_string())))
                }
                (false, None) => eprintln!("berth: job {id}: failed"),
            }
        }
    }
    Ok(if failed > 0 { 1 } else { 0 })
}

/// `berth jobs --state`: berth's state names (any case), `pending` (queued and held) and
/// `finished` (every end state); empty items (`a,,b`) are skipped.
fn parse_states(given: &[String]) -> Result<Vec<JobState>> {
    let mut states = Vec::new();
    for s in given.iter().map(|s| s.trim().to_ascii_lowercase()).filter(|s| !s.is_empty()) {
        let more: Vec<JobState> = match s.as_str() {
            "pending" => vec![JobState::Queued, JobState::Held],
            "finished" | "ended" => JobState::ALL.into_iter().filter(|s| s.is_finished()).collect(),
            _ => vec![JobState::parse(&s).ok_or_else(|| {
                anyhow!(
                    "unknown state {s:?}; states are {}, pending (queued and held) and finished",
                    JobState::ALL.map(|s| s.as_str()).join(", ")
                )
            })?],
        };
        for st in more {
            if !states.contains(&st) {
                states.push(st);
            }
        }
    }
    Ok(states)
}

/// `berth jobs --user/--me/--name/--queue/--array`: a job is kept if it passes every filter
/// given (each a list, any of which passes; an empty list passes all).
#[derive(Debug, Default)]
struct JobFilter {
    users: Vec<String>,
    names: Vec<String>,
    queues: Vec<String>,
    /// Arrays' ids: only their tasks.
    arrays: Vec<JobId>,
}

impl JobFilter {
    fn keeps(&self, j: &berth_protocol::client::JobInfo) -> bool {
        let any = |list: &[String], v: &String| list.is_empty() || list.contains(v);
        any(&self.users, &j.user)
            && any(&self.names, &j.name)
            && any(&self.queues, &j.queue)
            && (self.arrays.is_empty() || j.array_job.is_some_and(|a| self.arrays.contains(&a)))
    }

    fn apply(&self, jobs: &mut Vec<berth_protocol::client::JobInfo>) {
        jobs.retain(|j| self.keeps(j));
    }
}

/// `berth wait ID...`: `N` (an array's id: every task of it), `N.server`, `N[]`, or `A_i`
/// (that task); prints how each ended and exits with their status (`compat::wait`).
async fn wait(dir: &Path, json: bool, given: &[String], timeout: Option<u64>) -> Result<i32> {
    use crate::compat::wait::{self, ExitRule, Target};
    let mut targets: Vec<Target> = Vec::with_capacity(given.len());
    for s in given {
        let t = if crate::arrays::split_task(s).is_some() {
            let id = task_ids(dir, std::slice::from_ref(s)).await?[0];
            Target { id, whole_array: false, shown: s.trim().to_string() }
        } else {
            let id = crate::compat::format::parse_job_id(s).ok_or_else(|| {
                anyhow!("{s:?} is not a job id; give N (an array's id: all its tasks) or A_i (one task)")
            })?;
            Target { id, whole_array: true, shown: id.to_string() }
        };
        if !targets.iter().any(|o| o.id == t.id && o.whole_array == t.whole_array) {
            targets.push(t);
        }
    }
    let report = wait::wait(dir, &targets, ExitRule::Shell, timeout.map(std::time::Duration::from_secs)).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        let text: String = report.jobs.iter().map(wait::human).collect();
        print!("{}", output::terminal_safe(&text));
        if report.timed_out {
            let left = report.jobs.iter().filter(|o| !o.ended).count();
            eprintln!("berth: gave up after {} s: {left} of {} not ended", timeout.unwrap_or(0), report.jobs.len());
        }
    }
    Ok(report.exit)
}

/// A controller's error about job `id`, said once: its messages mostly name the job already
/// ("job 5 is running; ..."), so the id is added only where they do not (issue 17 item 11:
/// "job 5: job 5 is running").
fn id_error(id: JobId, e: &str) -> String {
    let named = e
        .strip_prefix(&format!("job {id}"))
        .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', ':', ';', ',']));
    if named {
        e.to_string()
    } else {
        format!("job {id}: {e}")
    }
}

async fn submit(
    dir: &Path,
    json: bool,
    scripts: Vec<Source>,
    flags: &SubmitFlags,
    hold: bool,
    wait: bool,
) -> Result<i32> {
    use crate::compat::wait::{wait_for, ExitRule};
    if scripts.iter().filter(|s| **s == Source::Stdin).count() > 1 {
        bail!("`-` (standard input) may be given once");
    }
    if let [script] = &scripts[..] {
        let sub = build_source_submission(script, flags, hold)?;
        let ClientResponse::Submitted { id } = request(dir, ClientRequest::Submit(Box::new(sub))).await? else {
            bail!("unexpected answer")
        };
        if json {
            println!("{}", serde_json::json!({ "id": id }));
        } else {
            println!("{id}");
        }
        if wait {
            flush_stdout();
            return wait_for(dir, &[id], ExitRule::Shell).await;
        }
        return Ok(0);
    }
    let jobs = scripts.iter().map(|s| build_source_submission(s, flags, hold)).collect::<Result<Vec<_>>>()?;
    let ClientResponse::SubmittedBatch { ids } = request(dir, ClientRequest::SubmitBatch { jobs }).await? else {
        bail!("unexpected answer")
    };
    if json {
        println!("{}", serde_json::json!({ "ids": ids }));
    } else {
        ids.iter().for_each(|id| println!("{id}"));
    }
    if wait {
        flush_stdout();
        return wait_for(dir, &ids, ExitRule::Shell).await;
    }
    Ok(0)
}

/// The ids printed before a wait reach a reader (a pipe) at once.
fn flush_stdout() {
    use std::io::Write;
    let _ = std::io::stdout().flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 19: `berth jobs --user/--me/--name/--queue/--array` (every filter given must pass).
    #[test]
    fn jobs_filter_by_user_name_queue_and_array() {
        let job = |user: &str, name: &str, queue: &str, array: Option<u64>| -> berth_protocol::client::JobInfo {
            let mut j: berth_protocol::client::JobInfo = serde_json::from_value(serde_json::json!({
                "id": 7, "name": name, "user": user, "uid": 1000, "gid": 1000, "state": "queued",
                "queue": queue, "request": {"nodes": null, "cores": 1, "tasks_per_node": null,
                "cpus_per_task": null, "mem_per_node": null, "mem_per_cpu": null, "threads": false},
                "walltime_seconds": 60, "submit_time": 0.0, "start_time": null, "end_time": null,
                "allocation": [], "exit_code": null, "signal": null, "reason": null,
                "cwd": "/tmp", "stdout": "/tmp/o", "stderr": "/tmp/e", "accounting": null
            }))
            .unwrap();
            (j.array_job, j.array_index) = (array.map(JobId), array.map(|_| 0));
            j
        };
        let all =
            vec![job("ann", "a", "batch", None), job("bob", "a", "fat", Some(12)), job("ann", "b", "fat", Some(20))];
        let kept = |users: &[&str], names: &[&str], queues: &[&str], arrays: &[u64]| {
            let mut jobs = all.clone();
            let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
            let filter = JobFilter {
                users: s(users),
                names: s(names),
                queues: s(queues),
                arrays: arrays.iter().map(|a| JobId(*a)).collect(),
            };
            filter.apply(&mut jobs);
            jobs.iter().map(|j| format!("{}/{}", j.user, j.name)).collect::<Vec<_>>()
        };
        assert_eq!(kept(&[], &[], &[], &[]), vec!["ann/a", "bob/a", "ann/b"]);
        assert_eq!(kept(&["ann"], &[], &[], &[]), vec!["ann/a", "ann/b"]);
        assert_eq!(kept(&["ann", "bob"], &["a"], &[], &[]), vec!["ann/a", "bob/a"]);
        assert!(kept(&["eve"], &[], &[], &[]).is_empty());
        assert_eq!(kept(&[], &[], &["fat"], &[]), vec!["bob/a", "ann/b"]);
        assert_eq!(kept(&["ann"], &[], &["fat"], &[]), vec!["ann/b"]);
        assert_eq!(kept(&[], &[], &[], &[12]), vec!["bob/a"]);
        assert_eq!(kept(&[], &[], &[], &[12, 20]), vec!["bob/a", "ann/b"]);
        assert!(kept(&[], &[], &[], &[7]).is_empty(), "a job that is no array's task");
    }

    #[test]
    fn job_states_are_read_in_lists_and_groups() {
        use JobState::*;
        let s = |v: &[&str]| parse_states(&v.iter().map(|x| x.to_string()).collect::<Vec<_>>());
        assert_eq!(s(&["running"]).unwrap(), vec![Running]);
        assert_eq!(s(&["Queued", "", "held", "queued"]).unwrap(), vec![Queued, Held]);
        assert_eq!(s(&["pending", "running"]).unwrap(), vec![Queued, Held, Running]);
        assert_eq!(s(&["finished"]).unwrap(), vec![Completed, Failed, Cancelled, Timeout, NodeFail]);
        let e = s(&["done"]).unwrap_err().to_string();
        assert!(e.contains("unknown state \"done\"") && e.contains("node_fail"), "{e}");
    }

    #[test]
    fn errors_name_the_job_once() {
        let id = JobId(5);
        assert_eq!(
            id_error(id, "job 5 is running; only queued jobs can be held"),
            "job 5 is running; only queued jobs can be held"
        );
        assert_eq!(id_error(id, "job 5: gone"), "job 5: gone");
        assert_eq!(id_error(id, "no such job"), "job 5: no such job");
        assert_eq!(id_error(id, "job 51 is running"), "job 5: job 51 is running");
    }
}
