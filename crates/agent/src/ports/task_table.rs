//! A job's task table on this node: the tasks started through this agent's task API
//! ([`crate::tasks`]), their states and where their signals go.

use berth_core::JobId;
use berth_protocol::step::TaskInfo;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;
use tokio::sync::{mpsc, Notify};

/// The tasks started through this agent's API for one job.
#[derive(Default)]
pub struct JobTasks {
    table: Mutex<TaskTable>,
    changed: Notify,
}

/// Tasks asked for that this node's agent never started (a task API request's error).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "no task {} in job {job} on this node (tasks are known to the agent they were spawned through)",
    ids.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
)]
pub struct UnknownTasks {
    pub job: JobId,
    /// As asked for, in that order.
    pub ids: Vec<u64>,
}

/// Task ids 1, 2, ... and what is known of each task.
#[derive(Default)]
pub struct TaskTable {
    last: u64,
    tasks: BTreeMap<u64, Entry>,
}

struct Entry {
    info: TaskInfo,
    since: Instant,
    /// Signals for the task, to its driver (local waiter or remote connection).
    signals: Option<mpsc::UnboundedSender<i32>>,
}

impl TaskTable {
    /// The id the next task [`TaskTable::add`]ed gets.
    pub fn next_id(&self) -> u64 {
        self.last + 1
    }

    /// A new task in state "starting"; its id.
    pub fn add(&mut self, node_index: u32, node: &str, argv: &[String], stdout: &str, stderr: &str) -> u64 {
        self.last += 1;
        let id = self.last;
        let info = TaskInfo {
            id,
            node: node.to_string(),
            node_index,
            argv: argv.to_vec(),
            pid: None,
            state: "starting".into(),
            exit_code: None,
            signal: None,
            reason: None,
            wall_ms: None,
            stdout: Some(stdout.to_string()),
            stderr: Some(stderr.to_string()),
        };
        self.tasks.insert(id, Entry { info, since: Instant::now(), signals: None });
        id
    }

    /// A new task whose output goes to whoever started it (`exec`); its id.
    pub fn add_attached(&mut self, node_index: u32, node: &str, argv: &[String]) -> u64 {
        let id = self.add(node_index, node, argv, "", "");
        if let Some(e) = self.tasks.get_mut(&id) {
            e.info.stdout = None;
            e.info.stderr = None;
        }
        id
    }

    pub(crate) fn set_signals(&mut self, id: u64, tx: mpsc::UnboundedSender<i32>) {
        if let Some(e) = self.tasks.get_mut(&id) {
            e.signals = Some(tx);
        }
    }

    pub fn started(&mut self, id: u64, pid: u32) {
        if let Some(e) = self.tasks.get_mut(&id).filter(|e| e.info.state == "starting") {
            e.info.pid = Some(pid);
            e.info.state = "running".into();
        }
    }

    /// Did not start, or was lost with its node's agent.
    pub fn failed(&mut self, id: u64, reason: String) {
        if let Some(e) = self.tasks.get_mut(&id).filter(|e| !e.info.ended()) {
            e.info.state = "failed".into();
            e.info.reason = Some(reason);
            e.info.wall_ms = Some(e.since.elapsed().as_millis() as u64);
            e.signals = None;
        }
    }

    pub fn exited(&mut self, id: u64, exit_code: Option<i32>, signal: Option<i32>, wall_ms: Option<u64>) {
        if let Some(e) = self.tasks.get_mut(&id).filter(|e| !e.info.ended()) {
            e.info.state = "exited".into();
            e.info.exit_code = exit_code;
            e.info.signal = signal;
            e.info.wall_ms = Some(wall_ms.unwrap_or_else(|| e.since.elapsed().as_millis() as u64));
            e.signals = None;
        }
    }

    /// The ids asked for (every task when `ids` is empty), checked to exist.
    pub fn select(&self, job: JobId, ids: &[u64]) -> Result<Vec<u64>, UnknownTasks> {
        if ids.is_empty() {
            return Ok(self.tasks.keys().copied().collect());
        }
        let unknown: Vec<u64> = ids.iter().filter(|i| !self.tasks.contains_key(i)).copied().collect();
        if !unknown.is_empty() {
            return Err(UnknownTasks { job, ids: unknown });
        }
        let mut out = ids.to_vec();
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }

    pub fn infos(&self, ids: &[u64]) -> Vec<TaskInfo> {
        ids.iter()
            .filter_map(|i| self.tasks.get(i))
            .map(|e| {
                let mut info = e.info.clone();
                if !info.ended() {
                    info.wall_ms = Some(e.since.elapsed().as_millis() as u64);
                }
                info
            })
            .collect()
    }

    pub fn all_ended(&self, ids: &[u64]) -> bool {
        ids.iter().all(|i| self.tasks.get(i).is_none_or(|e| e.info.ended()))
    }

    /// Queue `signal` for each task of `ids` that has not ended; how many got it.
    pub fn signal(&self, ids: &[u64], signal: i32) -> usize {
        ids.iter()
            .filter_map(|i| self.tasks.get(i))
            .filter(|e| !e.info.ended())
            .filter(|e| e.signals.as_ref().is_some_and(|tx| tx.send(signal).is_ok()))
            .count()
    }
}

impl JobTasks {
    pub(crate) fn with<T>(&self, f: impl FnOnce(&mut TaskTable) -> T) -> T {
        let mut t = self.table.lock().unwrap_or_else(|p| p.into_inner());
        let out = f(&mut t);
        drop(t);
        self.changed.notify_waiters();
        out
    }

    pub(crate) fn read<T>(&self, f: impl FnOnce(&TaskTable) -> T) -> T {
        let t = self.table.lock().unwrap_or_else(|p| p.into_inner());
        f(&t)
    }

    /// Wait until every task of `ids` ended, or `deadline`.
    pub(crate) async fn wait(&self, ids: &[u64], deadline: Option<tokio::time::Instant>) {
        loop {
            let notified = self.changed.notified();
            if self.read(|t| t.all_ended(ids)) {
                return;
            }
            match deadline {
                Some(d) => {
                    if tokio::time::timeout_at(d, notified).await.is_err() {
                        return;
                    }
                }
                None => notified.await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    fn argv(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn ids_count_up_and_states_move_forward_only() {
        let mut t = TaskTable::default();
        let a = t.add(0, "n1", &argv(&["true"]), "/o", "/e");
        let b = t.add(1, "n2", &argv(&["false"]), "/o", "/e");
        assert_eq!((a, b), (1, 2));
        let infos = t.infos(&[1, 2]);
        assert!(infos.iter().all(|i| i.state == "starting" && i.pid.is_none()));
        t.started(1, 100);
        t.failed(2, "nope: command not found".into());
        t.started(2, 200); // too late: it failed
        let infos = t.infos(&[1, 2]);
        assert_eq!((infos[0].state.as_str(), infos[0].pid), ("running", Some(100)));
        assert_eq!((infos[1].state.as_str(), infos[1].pid), ("failed", None));
        assert!(infos[1].unsuccessful() && infos[1].ended());
        assert!(!t.all_ended(&[1, 2]) && t.all_ended(&[2]));
        t.exited(1, None, Some(9), Some(1500));
        t.exited(1, Some(0), None, None); // ends once
        let i = &t.infos(&[1])[0];
        assert_eq!((i.state.as_str(), i.exit_code, i.signal, i.wall_ms), ("exited", None, Some(9), Some(1500)));
        assert!(i.unsuccessful());
        assert!(t.all_ended(&[]) && t.all_ended(&[1, 2]));
        assert_eq!(t.add(0, "n1", &argv(&["x"]), "/o", "/e"), 3);
    }

    #[test]
    fn select_checks_ids_and_empty_means_all() {
        let mut t = TaskTable::default();
        for _ in 0..3 {
            t.add(0, "n1", &argv(&["x"]), "/o", "/e");
        }
        let job = JobId(7);
        assert_eq!(t.select(job, &[]).unwrap(), [1, 2, 3]);
        assert_eq!(t.select(job, &[3, 1, 3]).unwrap(), [1, 3]);
        let e = t.select(job, &[2, 9, 10]).unwrap_err();
        assert_eq!(e, UnknownTasks { job, ids: vec![9, 10] });
        assert_eq!(
            e.to_string(),
            "no task 9, 10 in job 7 on this node (tasks are known to the agent they were spawned through)"
        );
    }

    #[test]
    fn signals_reach_only_tasks_that_run() {
        let mut t = TaskTable::default();
        let (a, b) = (t.add(0, "n", &argv(&["x"]), "", ""), t.add(0, "n", &argv(&["x"]), "", ""));
        let (tx_a, mut rx_a) = mpsc::unbounded_channel();
        let (tx_b, mut rx_b) = mpsc::unbounded_channel();
        t.set_signals(a, tx_a);
        t.set_signals(b, tx_b);
        t.started(a, 10);
        t.started(b, 11);
        t.exited(b, Some(0), None, None);
        assert_eq!(t.signal(&[a, b], 15), 1);
        assert_eq!(rx_a.try_recv().ok(), Some(15));
        assert!(rx_b.try_recv().is_err());
    }

    #[test]
    fn wait_returns_when_tasks_end_or_at_the_deadline() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let tasks = Arc::new(JobTasks::default());
            let id = tasks.with(|t| t.add(0, "n", &argv(&["x"]), "", ""));
            tasks.with(|t| t.started(id, 1));
            let t0 = Instant::now();
            tasks.wait(&[id], Some(tokio::time::Instant::now() + Duration::from_millis(50))).await;
            assert!(t0.elapsed() >= Duration::from_millis(50));
            let t2 = tasks.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                t2.with(|t| t.exited(id, Some(3), None, None));
            });
            tasks.wait(&[id], None).await;
            assert_eq!(tasks.read(|t| t.infos(&[id]))[0].exit_code, Some(3));
        });
    }
}
