//! The controller's durable state: an SQLite database (WAL, synchronous commits).
//!
//! The actor opens one transaction per batch of requests and commits it before any reply
//! leaves, so every acknowledged job is on disk.

use crate::job::JobRecord;
use berth_core::job::JobState;
use berth_core::JobId;
use rusqlite::{params, Connection, OptionalExtension, Row};
use std::path::{Path, PathBuf};

const SCHEMA_VERSION: i64 = 1;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("state database {path}: {source}")]
    Sqlite { path: PathBuf, source: rusqlite::Error },
    #[error("state database {path} is corrupt ({detail}); restore it from a backup, or move it away to start with an empty state")]
    Corrupt { path: PathBuf, detail: String },
    #[error("state database {path} has schema version {found}, this berth understands {SCHEMA_VERSION}; run the berth version that wrote it")]
    Schema { path: PathBuf, found: i64 },
    #[error("cannot create state directory {path}: {source}")]
    Dir { path: PathBuf, source: std::io::Error },
    #[error("state database {path}: stored record for job {id} is unreadable: {detail}")]
    Record { path: PathBuf, id: i64, detail: String },
}

pub struct Store {
    conn: Connection,
    path: PathBuf,
}

/// A node as persisted.
#[derive(Debug, Clone)]
pub struct NodeRow {
    pub id: u32,
    pub name: String,
    pub state: String,
    pub address: String,
    pub topology: String,
    pub real_cpus: String,
    pub instance: String,
}

impl Store {
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        std::fs::create_dir_all(dir).map_err(|source| StoreError::Dir { path: dir.to_path_buf(), source })?;
        let path = dir.join("state.db");
        let existed = path.exists();
        let sql = |source| StoreError::Sqlite { path: path.clone(), source };
        let conn = Connection::open(&path).map_err(sql)?;
        let mut store = Store { conn, path };
        if existed {
            store.check_integrity()?;
        }
        store.init()?;
        Ok(store)
    }

    fn err(&self, source: rusqlite::Error) -> StoreError {
        StoreError::Sqlite { path: self.path.clone(), source }
    }

    fn check_integrity(&self) -> Result<(), StoreError> {
        let corrupt = |detail: String| StoreError::Corrupt { path: self.path.clone(), detail };
        let result: String =
            self.conn.query_row("PRAGMA quick_check", [], |r| r.get(0)).map_err(|e| corrupt(e.to_string()))?;
        if result != "ok" {
            return Err(corrupt(result));
        }
        Ok(())
    }

    fn init(&mut self) -> Result<(), StoreError> {
        // WAL with synchronous=FULL: a commit is on disk when it returns, even on power loss.
        self.conn
            .execute_batch(
                "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON;
                 CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
                 CREATE TABLE IF NOT EXISTS jobs (
                    id INTEGER PRIMARY KEY, name TEXT NOT NULL, uid INTEGER NOT NULL, gid INTEGER NOT NULL,
                    user TEXT NOT NULL, groups TEXT NOT NULL, state TEXT NOT NULL, queue TEXT NOT NULL,
                    request TEXT NOT NULL, walltime INTEGER, submit_time REAL NOT NULL,
                    start_time REAL, end_time REAL, allocation TEXT NOT NULL DEFAULT '[]',
                    exit_code INTEGER, signal INTEGER, reason TEXT, cwd TEXT NOT NULL,
                    stdout TEXT NOT NULL, stderr TEXT NOT NULL, script TEXT NOT NULL, env TEXT NOT NULL);
                 CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs(state);
                 CREATE TABLE IF NOT EXISTS accounting (
                    job_id INTEGER PRIMARY KEY REFERENCES jobs(id), uid INTEGER NOT NULL, user TEXT NOT NULL,
                    nodes TEXT NOT NULL, cores INTEGER NOT NULL, start_time REAL, end_time REAL NOT NULL,
                    wall_ms INTEGER NOT NULL, user_cpu_us INTEGER NOT NULL, system_cpu_us INTEGER NOT NULL,
                    peak_memory_bytes INTEGER NOT NULL, state TEXT NOT NULL, exit_code INTEGER, signal INTEGER);
                 CREATE TABLE IF NOT EXISTS nodes (
                    id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, state TEXT NOT NULL,
                    address TEXT NOT NULL, topology TEXT NOT NULL, real_cpus TEXT NOT NULL, instance TEXT NOT NULL);
                 CREATE TABLE IF NOT EXISTS events (
                    id INTEGER PRIMARY KEY AUTOINCREMENT, time REAL NOT NULL, kind TEXT NOT NULL,
                    job_id INTEGER, node TEXT, detail TEXT);",
            )
            .map_err(|e| self.err(e))?;
        let version: Option<String> = self
            .conn
            .query_row("SELECT value FROM meta WHERE key='schema_version'", [], |r| r.get(0))
            .optional()
            .map_err(|e| self.err(e))?;
        match version {
            None => {
                self.conn
                    .execute("INSERT INTO meta(key, value) VALUES ('schema_version', ?1)", [SCHEMA_VERSION.to_string()])
                    .map_err(|e| self.err(e))?;
            }
            Some(v) => {
                let found = v.parse::<i64>().unwrap_or(-1);
                if found != SCHEMA_VERSION {
                    return Err(StoreError::Schema { path: self.path.clone(), found });
                }
            }
        }
        Ok(())
    }

    pub fn begin(&self) -> Result<(), StoreError> {
        self.conn.execute_batch("BEGIN IMMEDIATE").map_err(|e| self.err(e))
    }

    pub fn commit(&self) -> Result<(), StoreError> {
        self.conn.execute_batch("COMMIT").map_err(|e| self.err(e))
    }

    pub fn rollback(&self) {
        let _ = self.conn.execute_batch("ROLLBACK");
    }

    /// A value of the key-value `meta` table (admin settings such as a node's system CPUs).
    pub fn get_meta(&self, key: &str) -> Result<Option<String>, StoreError> {
        self.conn
            .query_row("SELECT value FROM meta WHERE key=?1", [key], |r| r.get(0))
            .optional()
            .map_err(|e| self.err(e))
    }

    pub fn set_meta(&self, key: &str, value: &str) -> Result<(), StoreError> {
        self.conn
            .execute(
                "INSERT INTO meta(key, value) VALUES (?1, ?2) ON CONFLICT(key) DO UPDATE SET value=?2",
                [key, value],
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    pub fn max_job_id(&self) -> Result<u64, StoreError> {
        let max: Option<i64> =
            self.conn.query_row("SELECT MAX(id) FROM jobs", [], |r| r.get(0)).map_err(|e| self.err(e))?;
        Ok(max.unwrap_or(0).max(0) as u64)
    }

    pub fn insert_job(&self, j: &JobRecord) -> Result<(), StoreError> {
        let mut st = self
            .conn
            .prepare_cached(
                "INSERT INTO jobs (id, name, uid, gid, user, groups, state, queue, request, walltime, submit_time,
                  start_time, end_time, allocation, exit_code, signal, reason, cwd, stdout, stderr, script, env)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22)",
            )
            .map_err(|e| self.err(e))?;
        st.execute(params![
            j.id.0 as i64,
            j.name,
            j.user.uid,
            j.user.gid,
            j.user.name,
            json(&j.user.groups),
            j.state.as_str(),
            j.queue,
            json(&j.options),
            j.walltime.map(|w| w as i64),
            j.submit_time,
            j.start_time,
            j.end_time,
            json(&j.allocation),
            j.exit_code,
            j.signal,
            j.reason,
            j.cwd,
            j.stdout,
            j.stderr,
            j.script,
            json(&j.env),
        ])
        .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// Write the fields that change over a job's life.
    pub fn update_job(&self, j: &JobRecord) -> Result<(), StoreError> {
        let mut st = self
            .conn
            .prepare_cached(
                "UPDATE jobs SET state=?2, start_time=?3, end_time=?4, allocation=?5, exit_code=?6, signal=?7, reason=?8
                 WHERE id=?1",
            )
            .map_err(|e| self.err(e))?;
        st.execute(params![
            j.id.0 as i64,
            j.state.as_str(),
            j.start_time,
            j.end_time,
            json(&j.allocation),
            j.exit_code,
            j.signal,
            j.reason,
        ])
        .map_err(|e| self.err(e))?;
        Ok(())
    }

    pub fn insert_accounting(&self, j: &JobRecord) -> Result<(), StoreError> {
        let Some(acct) = &j.usage else { return Ok(()) };
        let nodes: Vec<&str> = j.allocation.iter().map(|a| a.node.as_str()).collect();
        let cores: u32 = j.allocation.iter().map(|a| a.cores).sum();
        let mut st = self
            .conn
            .prepare_cached(
                "INSERT OR REPLACE INTO accounting (job_id, uid, user, nodes, cores, start_time, end_time, wall_ms,
                  user_cpu_us, system_cpu_us, peak_memory_bytes, state, exit_code, signal)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
            )
            .map_err(|e| self.err(e))?;
        st.execute(params![
            j.id.0 as i64,
            j.user.uid,
            j.user.name,
            nodes.join(","),
            cores,
            j.start_time,
            j.end_time.unwrap_or(0.0),
            acct.wall_ms as i64,
            acct.user_cpu_us as i64,
            acct.system_cpu_us as i64,
            acct.peak_memory_bytes as i64,
            j.state.as_str(),
            j.exit_code,
            j.signal,
        ])
        .map_err(|e| self.err(e))?;
        Ok(())
    }

    pub fn event(
        &self,
        time: f64,
        kind: &str,
        job: Option<JobId>,
        node: Option<&str>,
        detail: &str,
    ) -> Result<(), StoreError> {
        let mut st = self
            .conn
            .prepare_cached("INSERT INTO events (time, kind, job_id, node, detail) VALUES (?1, ?2, ?3, ?4, ?5)")
            .map_err(|e| self.err(e))?;
        st.execute(params![time, kind, job.map(|j| j.0 as i64), node, detail]).map_err(|e| self.err(e))?;
        Ok(())
    }

    pub fn upsert_node(&self, n: &NodeRow) -> Result<(), StoreError> {
        let mut st = self
            .conn
            .prepare_cached(
                "INSERT INTO nodes (id, name, state, address, topology, real_cpus, instance) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                 ON CONFLICT(id) DO UPDATE SET state=?3, address=?4, topology=?5, real_cpus=?6, instance=?7",
            )
            .map_err(|e| self.err(e))?;
        st.execute(params![n.id, n.name, n.state, n.address, n.topology, n.real_cpus, n.instance])
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    pub fn load_nodes(&self) -> Result<Vec<NodeRow>, StoreError> {
        let mut st = self
            .conn
            .prepare("SELECT id, name, state, address, topology, real_cpus, instance FROM nodes ORDER BY id")
            .map_err(|e| self.err(e))?;
        let rows = st
            .query_map([], |r| {
                Ok(NodeRow {
                    id: r.get(0)?,
                    name: r.get(1)?,
                    state: r.get(2)?,
                    address: r.get(3)?,
                    topology: r.get(4)?,
                    real_cpus: r.get(5)?,
                    instance: r.get(6)?,
                })
            })
            .map_err(|e| self.err(e))?;
        rows.collect::<Result<Vec<_>, _>>().map_err(|e| self.err(e))
    }

    const JOB_COLUMNS: &'static str = "j.id, j.name, j.uid, j.gid, j.user, j.groups, j.state, j.queue, j.request, j.walltime,
        j.submit_time, j.start_time, j.end_time, j.allocation, j.exit_code, j.signal, j.reason, j.cwd, j.stdout, j.stderr,
        j.script, j.env, a.wall_ms, a.user_cpu_us, a.system_cpu_us, a.peak_memory_bytes";

    fn query_jobs(&self, filter: &str, args: &[&dyn rusqlite::ToSql]) -> Result<Vec<JobRecord>, StoreError> {
        let sql =
            format!("SELECT {} FROM jobs j LEFT JOIN accounting a ON a.job_id = j.id {filter}", Self::JOB_COLUMNS);
        let mut st = self.conn.prepare_cached(&sql).map_err(|e| self.err(e))?;
        let raw = st.query_map(args, RawJob::from_row).map_err(|e| self.err(e))?;
        let mut out = Vec::new();
        for r in raw {
            let r = r.map_err(|e| self.err(e))?;
            let id = r.id;
            out.push(r.into_record().map_err(|detail| StoreError::Record { path: self.path.clone(), id, detail })?);
        }
        Ok(out)
    }

    /// Jobs that are queued, held or running: what the controller keeps in memory.
    pub fn load_active_jobs(&self) -> Result<Vec<JobRecord>, StoreError> {
        self.query_jobs("WHERE j.state IN ('queued','held','running') ORDER BY j.id", &[])
    }

    pub fn get_job(&self, id: JobId) -> Result<Option<JobRecord>, StoreError> {
        Ok(self.query_jobs("WHERE j.id = ?1", &[&(id.0 as i64)])?.pop())
    }

    /// Finished jobs, most recent first.
    pub fn finished_jobs(&self, limit: u32) -> Result<Vec<JobRecord>, StoreError> {
        self.query_jobs(
            "WHERE j.state NOT IN ('queued','held','running') ORDER BY j.id DESC LIMIT ?1",
            &[&(limit as i64)],
        )
    }

    pub fn count_jobs(&self) -> Result<usize, StoreError> {
        let n: i64 = self.conn.query_row("SELECT COUNT(*) FROM jobs", [], |r| r.get(0)).map_err(|e| self.err(e))?;
        Ok(n as usize)
    }
}

fn json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| "null".into())
}

/// A row as read, before its JSON columns are decoded.
struct RawJob {
    id: i64,
    name: String,
    uid: u32,
    gid: u32,
    user: String,
    groups: String,
    state: String,
    queue: String,
    request: String,
    walltime: Option<i64>,
    submit_time: f64,
    start_time: Option<f64>,
    end_time: Option<f64>,
    allocation: String,
    exit_code: Option<i32>,
    signal: Option<i32>,
    reason: Option<String>,
    cwd: String,
    stdout: String,
    stderr: String,
    script: String,
    env: String,
    usage: Option<(i64, i64, i64, i64)>,
}

impl RawJob {
    fn from_row(r: &Row) -> rusqlite::Result<Self> {
        let wall: Option<i64> = r.get(22)?;
        Ok(RawJob {
            id: r.get(0)?,
            name: r.get(1)?,
            uid: r.get(2)?,
            gid: r.get(3)?,
            user: r.get(4)?,
            groups: r.get(5)?,
            state: r.get(6)?,
            queue: r.get(7)?,
            request: r.get(8)?,
            walltime: r.get(9)?,
            submit_time: r.get(10)?,
            start_time: r.get(11)?,
            end_time: r.get(12)?,
            allocation: r.get(13)?,
            exit_code: r.get(14)?,
            signal: r.get(15)?,
            reason: r.get(16)?,
            cwd: r.get(17)?,
            stdout: r.get(18)?,
            stderr: r.get(19)?,
            script: r.get(20)?,
            env: r.get(21)?,
            usage: match wall {
                Some(w) => Some((w, r.get(23)?, r.get(24)?, r.get(25)?)),
                None => None,
            },
        })
    }

    fn into_record(self) -> Result<JobRecord, String> {
        let de = |what: &str, s: &str| format!("{what} column: {s}");
        let state = JobState::parse(&self.state).ok_or_else(|| de("state", &self.state))?;
        let options = serde_json::from_str(&self.request).map_err(|e| de("request", &e.to_string()))?;
        let allocation = serde_json::from_str(&self.allocation).map_err(|e| de("allocation", &e.to_string()))?;
        let groups = serde_json::from_str(&self.groups).map_err(|e| de("groups", &e.to_string()))?;
        let env = serde_json::from_str(&self.env).map_err(|e| de("env", &e.to_string()))?;
        let record = JobRecord {
            id: JobId(self.id as u64),
            name: self.name,
            user: berth_protocol::agent::UserIdentity { uid: self.uid, gid: self.gid, groups, name: self.user },
            state,
            queue: self.queue,
            options,
            walltime: self.walltime.map(|w| w as u64),
            submit_time: self.submit_time,
            start_time: self.start_time,
            end_time: self.end_time,
            allocation,
            exit_code: self.exit_code,
            signal: self.signal,
            reason: self.reason,
            cwd: self.cwd,
            stdout: self.stdout,
            stderr: self.stderr,
            script: self.script,
            env,
            usage: self.usage.map(|(w, u, s, m)| crate::job::Usage {
                wall_ms: w as u64,
                user_cpu_us: u as u64,
                system_cpu_us: s as u64,
                peak_memory_bytes: m as u64,
            }),
            kill_sent: None,
        };
        record.validate()?;
        Ok(record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::Usage;
    use berth_core::directives::SubmitOptions;
    use berth_protocol::agent::UserIdentity;

    fn job(id: u64) -> JobRecord {
        JobRecord {
            id: JobId(id),
            name: "j".into(),
            user: UserIdentity { uid: 1000, gid: 100, groups: vec![100, 27], name: "ann".into() },
            state: JobState::Queued,
            queue: "batch".into(),
            options: SubmitOptions { cores: Some(2), mem: Some(1 << 20), ..Default::default() },
            walltime: Some(60),
            submit_time: 1.5,
            start_time: None,
            end_time: None,
            allocation: vec![],
            exit_code: None,
            signal: None,
            reason: None,
            cwd: "/home/ann".into(),
            stdout: "/home/ann/o".into(),
            stderr: "/home/ann/e".into(),
            script: "#!/bin/sh\ntrue\n".into(),
            env: vec![("PATH".into(), "/bin".into())],
            usage: None,
            kill_sent: None,
        }
    }

    #[test]
    fn jobs_survive_reopen_and_finish_with_accounting() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            store.begin().unwrap();
            store.insert_job(&job(1)).unwrap();
            store.insert_job(&job(2)).unwrap();
            store.commit().unwrap();
            // An uncommitted job is not there after a crash.
            store.begin().unwrap();
            store.insert_job(&job(3)).unwrap();
        }
        let store = Store::open(dir.path()).unwrap();
        let active = store.load_active_jobs().unwrap();
        assert_eq!(active.iter().map(|j| j.id.0).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(active[0].user.groups, vec![100, 27]);
        assert_eq!(store.max_job_id().unwrap(), 2);
        let mut j = active[0].clone();
        j.state = JobState::Completed;
        j.exit_code = Some(0);
        j.end_time = Some(9.0);
        j.usage = Some(Usage { wall_ms: 10, user_cpu_us: 20, system_cpu_us: 30, peak_memory_bytes: 40 });
        store.begin().unwrap();
        store.update_job(&j).unwrap();
        store.insert_accounting(&j).unwrap();
        store.commit().unwrap();
        let done = store.finished_jobs(10).unwrap();
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].usage, j.usage);
        assert_eq!(store.get_job(JobId(1)).unwrap().unwrap().state, JobState::Completed);
        assert!(store.get_job(JobId(7)).unwrap().is_none());
    }

    #[test]
    fn corrupt_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("state.db"), b"not a database at all, just text that is long enough").unwrap();
        let err = Store::open(dir.path()).err().expect("must refuse");
        assert!(err.to_string().contains("corrupt") || err.to_string().contains("not a database"), "{err}");
    }
}
