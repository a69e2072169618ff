//! The controller's durable state: an SQLite database (WAL, synchronous commits).
//!
//! The actor opens one transaction per batch of requests and commits it before any reply
//! leaves, so every acknowledged job is on disk. A batch that wrote only to the logs (the
//! invocation log `steps` and the event log `events`: a `berth run` inside a job starting or
//! ending) commits without waiting for the disk: the rows are in the WAL file, so they
//! survive a crash of the controller, though not a power loss of its host; the next durable
//! commit makes them durable too. Anything else written (jobs, nodes, reservations, usage,
//! settings) makes the commit synchronous; an update hook sees every row written, so a new
//! table is durable without anyone having to remember it.
//!
//! The state directory is the controller's alone: 0700, its files 0600, owned by the
//! daemon's user (set when they are made, and put right at every start): job scripts and
//! environments are in it, and a lock another user took on `state.db-shm` would stop every
//! write.
//!
//! A write that fails because the filesystem is full (SQLITE_FULL, or an I/O error with
//! ENOSPC/EDQUOT) or because another process holds the database's lock (SQLITE_BUSY after
//! `BUSY_TIMEOUT`) is [`StoreError::Unwritable`]: the server rolls the batch back and keeps
//! serving (server.rs, `run_actor`) instead of stopping.

use crate::model::array::write_array_rows;
use crate::model::job::{JobRecord, Usage};
use berth_core::directives::array::ArrayTask;
use berth_core::job::JobState;
use berth_core::sched::reason::SuspendedReason;
use berth_core::JobId;
use berth_protocol::step::StepInfo;
use rusqlite::{params, Connection, OptionalExtension, Row};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

mod advance;
mod counts;
mod depend;
mod reservations;
mod suspend;
mod usage;
mod wal;

/// 2: `jobs.script_of`, the row whose script and environment an array task shares (`insert_job`).
const SCHEMA_VERSION: i64 = 2;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("state database {path}: {source}")]
    Sqlite { path: PathBuf, source: rusqlite::Error },
    #[error("state database {path} is corrupt ({detail}); restore it from a backup, or move it away to start with an empty state")]
    Corrupt { path: PathBuf, detail: String },
    #[error("state database {path} has schema version {found}, this berth understands {SCHEMA_VERSION}; run the berth version that wrote it")]
    Schema { path: PathBuf, found: i64 },
    #[error("state database {path}: cannot write it to disk ({source}); check the disk, then restart the controller")]
    Sync { path: PathBuf, source: std::io::Error },
    #[error("state directory {path}: {source}")]
    Dir { path: PathBuf, source: std::io::Error },
    #[error("state database {path}: stored record for job {id} is unreadable: {detail}")]
    Record { path: PathBuf, id: i64, detail: String },
    /// The database cannot be written now, but may be later: nothing is lost, writing is
    /// retried (see the module comment).
    #[error("{}", unwritable_message(*.block, path, detail))]
    Unwritable { block: WriteBlock, path: PathBuf, detail: String },
}

/// Why the state database cannot be written for now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteBlock {
    /// Its filesystem is full (or the user's quota is reached).
    NoSpace,
    /// Another process holds a lock on it.
    Busy,
}

impl WriteBlock {
    pub fn as_str(self) -> &'static str {
        match self {
            WriteBlock::NoSpace => "no_space",
            WriteBlock::Busy => "busy",
        }
    }
}

fn unwritable_message(block: WriteBlock, path: &Path, detail: &str) -> String {
    let dir = path.parent().unwrap_or(path).display();
    match block {
        WriteBlock::NoSpace => format!(
            "no space left on the filesystem of the state database {} ({detail}): free space in {dir} (df {dir})",
            path.display()
        ),
        WriteBlock::Busy => format!(
            "the state database {} is locked by another process ({detail}): find it with `fuser -v {}-shm {}`",
            path.display(),
            path.display(),
            path.display()
        ),
    }
}

impl StoreError {
    /// Whether this failure only means "not now" (see [`StoreError::Unwritable`]).
    pub fn unwritable(&self) -> Option<WriteBlock> {
        match self {
            StoreError::Unwritable { block, .. } => Some(*block),
            _ => None,
        }
    }
}

/// How long a statement waits for another process's lock on the database before it fails
/// with SQLITE_BUSY (the server then retries: `run_actor`).
pub const BUSY_TIMEOUT: Duration = Duration::from_millis(1500);

/// Classify an SQLite error of `conn` on `path`: a full disk or a lock held elsewhere is
/// [`StoreError::Unwritable`], anything else [`StoreError::Sqlite`].
fn classify(conn: Option<&Connection>, path: &Path, source: rusqlite::Error) -> StoreError {
    use rusqlite::ErrorCode as C;
    let block = match &source {
        rusqlite::Error::SqliteFailure(e, _) => match e.code {
            C::DiskFull => Some(WriteBlock::NoSpace),
            C::DatabaseBusy | C::DatabaseLocked => Some(WriteBlock::Busy),
            C::SystemIoFailure | C::CannotOpen => {
                // SAFETY: the handle is valid while `conn` is borrowed; the call only reads
                // the connection's last system error number.
                let errno = conn.map(|c| unsafe { rusqlite::ffi::sqlite3_system_errno(c.handle()) }).unwrap_or(0);
                (errno == libc::ENOSPC || errno == libc::EDQUOT).then_some(WriteBlock::NoSpace)
            }
            _ => None,
        },
        _ => None,
    };
    match block {
        Some(block) => StoreError::Unwritable { block, path: path.to_path_buf(), detail: source.to_string() },
        None => StoreError::Sqlite { path: path.to_path_buf(), source },
    }
}

pub struct Store {
    conn: Connection,
    path: PathBuf,
    /// Set by the update hook when the open transaction wrote a table other than the logs.
    durable_write: Arc<AtomicBool>,
}

/// Tables whose rows may be committed without an fsync (see the module comment).
const LOG_TABLES: [&str; 2] = ["steps", "events"];

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
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        let dir_err = |path: &Path, source| StoreError::Dir { path: path.to_path_buf(), source };
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(|e| dir_err(dir, e))?;
        let path = dir.join("state.db");
        let existed = path.exists();
        // Made 0600 before SQLite opens it: its -wal and -shm files take the database's mode.
        std::fs::OpenOptions::new().create(true).append(true).mode(0o600).open(&path).map_err(|e| dir_err(&path, e))?;
        secure(dir)?;
        let sql = |source| classify(None, &path, source);
        let conn = Connection::open(&path).map_err(sql)?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(|e| classify(Some(&conn), &path, e))?;
        // Every statement the controller runs stays prepared (the default keeps 16, fewer
        // than the store has): parsing SQL was a tenth of each batch's work.
        conn.set_prepared_statement_cache_capacity(128);
        let durable_write = Arc::new(AtomicBool::new(false));
        let flag = durable_write.clone();
        conn.update_hook(Some(move |_: rusqlite::hooks::Action, _: &str, table: &str, _: i64| {
            if !LOG_TABLES.contains(&table) {
                flag.store(true, Ordering::Relaxed);
            }
        }));
        let mut store = Store { conn, path, durable_write };
        if existed {
            store.check_integrity()?;
        }
        store.init()?;
        Ok(store)
    }

    /// Keep the WAL preallocated, so that durable commits overwrite it rather than extend it
    /// (store/wal.rs). The server does it once at start. Best effort: it takes at most a
    /// quarter of the space free on the filesystem, none when that is under 1 MiB, and gives
    /// back what it wrote if the disk fills meanwhile; without it commits only sync slower.
    pub fn preallocate_wal(&self) {
        let free = free_bytes(&self.path);
        let bytes = wal::budget(free);
        if bytes < wal::WAL_PREALLOCATED {
            tracing::warn!(
                free_bytes = free,
                "little space left on the filesystem of {}: WAL preallocated to {bytes} bytes only \
                 (durable commits sync slower)",
                self.path.display()
            );
        }
        if let Err(e) = wal::preallocate(&self.path, bytes) {
            tracing::warn!("cannot preallocate the state database's WAL ({e}); durable commits will sync slower");
        }
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the database can be written again (after [`StoreError::Unwritable`]): a small
    /// durable transaction, waiting at most `wait` for another process's lock.
    pub fn probe_write(&self, now: f64) -> Result<(), StoreError> {
        self.conn.busy_timeout(wait_for_probe()).map_err(|e| self.err(e))?;
        let result = (|| {
            self.begin()?;
            if let Err(e) = self.set_meta("write_probe", &now.to_string()) {
                self.rollback();
                return Err(e);
            }
            self.commit().inspect_err(|_| self.rollback())
        })();
        self.conn.busy_timeout(BUSY_TIMEOUT).map_err(|e| self.err(e))?;
        result
    }

    fn err(&self, source: rusqlite::Error) -> StoreError {
        classify(Some(&self.conn), &self.path, source)
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
        // A page cache of up to 64 MiB (SQLite's default is 2 MiB): a large transaction (a
        // 100,000-task array) is written once, at its commit, not spilled to the WAL page by
        // page as it grows, and job lookups stay in memory.
        self.conn
            .execute_batch(
                "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON; PRAGMA cache_size=-65536;
                 CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
                 CREATE TABLE IF NOT EXISTS jobs (
                    id INTEGER PRIMARY KEY, name TEXT NOT NULL, uid INTEGER NOT NULL, gid INTEGER NOT NULL,
                    user TEXT NOT NULL, groups TEXT NOT NULL, state TEXT NOT NULL, queue TEXT NOT NULL,
                    request TEXT NOT NULL, walltime INTEGER, submit_time REAL NOT NULL,
                    start_time REAL, end_time REAL, allocation TEXT NOT NULL DEFAULT '[]',
                    exit_code INTEGER, signal INTEGER, reason TEXT, cwd TEXT NOT NULL,
                    stdout TEXT NOT NULL, stderr TEXT NOT NULL, script TEXT NOT NULL, env TEXT NOT NULL,
                    script_of INTEGER);
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
                    job_id INTEGER, node TEXT, detail TEXT);
                 CREATE TABLE IF NOT EXISTS steps (
                    job_id INTEGER NOT NULL, step INTEGER NOT NULL, uid INTEGER NOT NULL, user TEXT NOT NULL,
                    start_time REAL NOT NULL, end_time REAL, host TEXT NOT NULL, pid INTEGER NOT NULL,
                    cwd TEXT NOT NULL, argv TEXT NOT NULL, size INTEGER NOT NULL, nodes TEXT NOT NULL,
                    exit_code INTEGER, failure TEXT, interactive INTEGER NOT NULL, claims TEXT NOT NULL,
                    PRIMARY KEY (job_id, step));
                 CREATE INDEX IF NOT EXISTS steps_live ON steps(end_time) WHERE end_time IS NULL;
                 CREATE TABLE IF NOT EXISTS member_usage (
                    job_id INTEGER NOT NULL, node TEXT NOT NULL, user_cpu_us INTEGER NOT NULL,
                    system_cpu_us INTEGER NOT NULL, peak_memory_bytes INTEGER NOT NULL,
                    PRIMARY KEY (job_id, node));
                 CREATE TABLE IF NOT EXISTS fair_share (
                    account TEXT PRIMARY KEY, usage REAL NOT NULL, as_of REAL NOT NULL);
                 CREATE TABLE IF NOT EXISTS suspensions (
                    job_id INTEGER PRIMARY KEY, total_secs REAL NOT NULL, since REAL,
                    by_admin INTEGER NOT NULL, count INTEGER NOT NULL);",
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
                if found == 1 {
                    // Version 1 had no shared scripts: every row holds its own (script_of NULL).
                    self.conn
                        .execute_batch(
                            "BEGIN IMMEDIATE; ALTER TABLE jobs ADD COLUMN script_of INTEGER;
                             UPDATE meta SET value = '2' WHERE key = 'schema_version'; COMMIT;",
                        )
                        .map_err(|e| {
                            let _ = self.conn.execute_batch("ROLLBACK");
                            self.err(e)
                        })?;
                } else if found != SCHEMA_VERSION {
                    return Err(StoreError::Schema { path: self.path.clone(), found });
                }
            }
        }
        Ok(())
    }

    /// Open a transaction that only takes the write lock when it first writes (the server's
    /// batches while the database cannot be written: reads need no write lock).
    pub fn begin_deferred(&self) -> Result<(), StoreError> {
        self.durable_write.store(false, Ordering::Relaxed);
        self.run_cached("BEGIN")
    }

    /// Open a transaction. It runs with synchronous=NORMAL (in WAL mode: the commit writes the
    /// frames but does not fsync them); `commit` fsyncs the WAL itself when the transaction
    /// wrote more than the logs, which is what synchronous=FULL would have done. (SQLite does
    /// not let the level change inside a transaction, when we would know which it needs.)
    pub fn begin(&self) -> Result<(), StoreError> {
        self.durable_write.store(false, Ordering::Relaxed);
        self.run_cached("PRAGMA synchronous=NORMAL")?;
        self.run_cached("BEGIN IMMEDIATE")
    }

    /// Run a statement without parameters or rows, prepared once.
    fn run_cached(&self, sql: &str) -> Result<(), StoreError> {
        let mut st = self.conn.prepare_cached(sql).map_err(|e| self.err(e))?;
        st.raw_execute().map(drop).map_err(|e| self.err(e))
    }

    /// Commit the open transaction: on disk when it returns if it wrote anything but the logs.
    pub fn commit(&self) -> Result<(), StoreError> {
        match self.commit_written()? {
            true => self.sync_committed(),
            false => Ok(()),
        }
    }

    /// Commit the open transaction to the WAL (it survives a crash of this process, not yet a
    /// power loss); true if it wrote more than the logs and must be synced
    /// (`sync_committed`) before anything of it is acknowledged.
    /// On an error the transaction may still be open: the caller rolls it back (`rollback`),
    /// or retries the commit.
    pub fn commit_written(&self) -> Result<bool, StoreError> {
        self.run_cached("COMMIT")?;
        let must_sync = self.durable_write.swap(false, Ordering::Relaxed);
        // Writes outside `begin`/`commit` (start-up) stay synchronous on their own.
        self.run_cached("PRAGMA synchronous=FULL")?;
        Ok(must_sync)
    }

    /// Make the last commit durable (see `commit_written`).
    pub fn sync_committed(&self) -> Result<(), StoreError> {
        self.sync_wal()
    }

    /// fdatasync the WAL (where a commit's frames are), or the database file without one.
    fn sync_wal(&self) -> Result<(), StoreError> {
        let mut wal = self.path.clone().into_os_string();
        wal.push("-wal");
        let wal = PathBuf::from(wal);
        let target = if wal.exists() { wal } else { self.path.clone() };
        std::fs::File::open(&target)
            .and_then(|f| f.sync_data())
            .map_err(|source| StoreError::Sync { path: target, source })
    }

    /// Whether the open transaction has written more than the logs (its commit will fsync).
    pub fn durable_pending(&self) -> bool {
        self.durable_write.load(Ordering::Relaxed)
    }

    /// Roll the open transaction back (none may be open any more: SQLite rolls some failed
    /// ones back itself, e.g. on SQLITE_FULL).
    pub fn rollback(&self) {
        self.durable_write.store(false, Ordering::Relaxed);
        if !self.conn.is_autocommit() {
            let _ = self.conn.execute_batch("ROLLBACK");
        }
        let _ = self.conn.execute_batch("PRAGMA synchronous=FULL");
    }

    /// A value of the key-value `meta` table (admin settings such as a node's system CPUs).
    pub fn get_meta(&self, key: &str) -> Result<Option<String>, StoreError> {
        self.conn
            .query_row("SELECT value FROM meta WHERE key=?1", [key], |r| r.get(0))
            .optional()
            .map_err(|e| self.err(e))
    }

    pub fn delete_meta(&self, key: &str) -> Result<(), StoreError> {
        self.conn.execute("DELETE FROM meta WHERE key = ?1", [key]).map_err(|e| self.err(e))?;
        Ok(())
    }

    /// How many events of `kind` the log holds about `job` (e.g. its requeues).
    pub fn count_events(&self, job: JobId, kind: &str) -> Result<u32, StoreError> {
        self.conn
            .query_row(
                "SELECT COUNT(*) FROM events WHERE job_id = ?1 AND kind = ?2",
                params![job.0 as i64, kind],
                |r| r.get::<_, i64>(0),
            )
            .map(|n| n as u32)
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
        self.insert_job_sharing(j, None)
    }

    /// Insert the rows of an array's tasks (`Effect::InsertArray`): task `k` of `tasks` is job
    /// `first + k`, made from `template`; the first row holds the script and environment, the
    /// others share them (`insert_job_sharing`). A failed row stops the writing there.
    pub fn insert_array(&self, template: &JobRecord, first: JobId, tasks: &[ArrayTask]) -> Result<(), StoreError> {
        write_array_rows(template, first, tasks, |row, script_of| self.insert_job_sharing(row, script_of))
    }

    /// Insert `j`; with `script_of`, a job already written whose script and environment are
    /// the same (an array's first task): this row keeps none of its own and is read with that
    /// one's (`query_jobs`).
    pub fn insert_job_sharing(&self, j: &JobRecord, script_of: Option<JobId>) -> Result<(), StoreError> {
        let mut st = self
            .conn
            .prepare_cached(
                "INSERT INTO jobs (id, name, uid, gid, user, groups, state, queue, request, walltime, submit_time,
                  start_time, end_time, allocation, exit_code, signal, reason, cwd, stdout, stderr, script, env, script_of)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23)",
            )
            .map_err(|e| self.err(e))?;
        let (script, env) = match script_of {
            Some(_) => ("", "[]".to_string()),
            None => (&*j.script, json(&*j.env)),
        };
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
            script,
            env,
            script_of.map(|s| s.0 as i64),
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

    /// Write what `berth update` changes of a job: its name, queue, options (the request)
    /// and walltime.
    pub fn rewrite_job(&self, j: &JobRecord) -> Result<(), StoreError> {
        let mut st = self
            .conn
            .prepare_cached("UPDATE jobs SET name=?2, queue=?3, request=?4, walltime=?5 WHERE id=?1")
            .map_err(|e| self.err(e))?;
        st.execute(params![j.id.0 as i64, j.name, j.queue, json(&j.options), j.walltime.map(|w| w as i64)])
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// Forget what an ended job's run used (its accounting row and its other nodes' usage):
    /// it was requeued to run again (`berth requeue`).
    pub fn forget_run(&self, id: JobId) -> Result<(), StoreError> {
        for sql in ["DELETE FROM accounting WHERE job_id = ?1", "DELETE FROM member_usage WHERE job_id = ?1"] {
            let mut st = self.conn.prepare_cached(sql).map_err(|e| self.err(e))?;
            st.execute([id.0 as i64]).map_err(|e| self.err(e))?;
        }
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
        COALESCE(o.script, j.script), COALESCE(o.env, j.env), a.wall_ms, a.user_cpu_us, a.system_cpu_us,
        a.peak_memory_bytes, s.total_secs, s.since, s.by_admin, s.count, j.script_of";

    fn query_jobs(&self, filter: &str, args: &[&dyn rusqlite::ToSql]) -> Result<Vec<JobRecord>, StoreError> {
        let sql =
            format!("SELECT {} FROM jobs j LEFT JOIN accounting a ON a.job_id = j.id LEFT JOIN suspensions s ON s.job_id = j.id LEFT JOIN jobs o ON o.id = j.script_of {filter}", Self::JOB_COLUMNS);
        let mut st = self.conn.prepare_cached(&sql).map_err(|e| self.err(e))?;
        let raw = st.query_map(args, RawJob::from_row).map_err(|e| self.err(e))?;
        let mut out = Vec::new();
        // The tasks of an array share one script and environment in memory as on disk.
        let mut shared: HashMap<i64, Shared> = HashMap::new();
        for r in raw {
            let r = r.map_err(|e| self.err(e))?;
            let id = r.id;
            let record = r.into_record(&mut shared).map_err(|detail| StoreError::Record {
                path: self.path.clone(),
                id,
                detail,
            })?;
            out.push(record);
        }
        Ok(out)
    }

    /// Jobs that are queued, held, running or suspended: what the controller keeps in memory.
    pub fn load_active_jobs(&self) -> Result<Vec<JobRecord>, StoreError> {
        self.query_jobs("WHERE j.state IN ('queued','held','running','suspended') ORDER BY j.id", &[])
    }

    pub fn get_job(&self, id: JobId) -> Result<Option<JobRecord>, StoreError> {
        Ok(self.query_jobs("WHERE j.id = ?1", &[&(id.0 as i64)])?.pop())
    }

    /// Finished jobs, most recent first.
    pub fn finished_jobs(&self, limit: u32) -> Result<Vec<JobRecord>, StoreError> {
        self.query_jobs(
            "WHERE j.state NOT IN ('queued','held','running','suspended') ORDER BY j.id DESC LIMIT ?1",
            &[&(limit as i64)],
        )
    }

    /// Finished jobs, most recent first, at most `limit`: those not ended before `since`,
    /// started (else submitted) by `until`, of one of `users` (all when empty).
    pub fn finished_jobs_in(
        &self,
        since: Option<f64>,
        until: Option<f64>,
        users: &[String],
        limit: u32,
    ) -> Result<Vec<JobRecord>, StoreError> {
        let mut filter = String::from(
            "WHERE j.state NOT IN ('queued','held','running','suspended')
               AND (?1 IS NULL OR j.end_time IS NULL OR j.end_time >= ?1)
               AND (?2 IS NULL OR COALESCE(j.start_time, j.submit_time) <= ?2)",
        );
        let limit = limit as i64;
        let mut args: Vec<&dyn rusqlite::ToSql> = vec![&since, &until, &limit];
        if !users.is_empty() {
            let marks: Vec<String> = (0..users.len()).map(|i| format!("?{}", i + 4)).collect();
            filter.push_str(&format!(" AND j.user IN ({})", marks.join(",")));
            args.extend(users.iter().map(|u| u as &dyn rusqlite::ToSql));
        }
        filter.push_str(" ORDER BY j.id DESC LIMIT ?3");
        self.query_jobs(&filter, &args)
    }

    pub fn insert_step(&self, s: &StepRow) -> Result<(), StoreError> {
        let mut st = self
            .conn
            .prepare_cached(
                "INSERT INTO steps (job_id, step, uid, user, start_time, end_time, host, pid, cwd, argv, size, nodes,
                  exit_code, failure, interactive, claims)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)",
            )
            .map_err(|e| self.err(e))?;
        st.execute(params![
            s.job.0 as i64,
            s.step,
            s.uid,
            s.user,
            s.start_time,
            s.end_time,
            s.host,
            s.pid,
            s.cwd,
            json(&s.argv),
            s.size,
            json(&s.nodes),
            s.exit_code,
            s.failure,
            s.interactive,
            json(&s.claims),
        ])
        .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// Record how a step ended. A step already closed (its job ended first) keeps its end
    /// time but takes the exit status and failure `run` reports when it has none yet.
    pub fn end_step(
        &self,
        job: JobId,
        step: u32,
        end_time: f64,
        exit_code: Option<i32>,
        failure: Option<&str>,
    ) -> Result<(), StoreError> {
        let mut st = self
            .conn
            .prepare_cached(
                "UPDATE steps SET end_time = COALESCE(end_time, ?3), exit_code = COALESCE(exit_code, ?4),
                  failure = CASE WHEN exit_code IS NULL AND ?4 IS NOT NULL THEN COALESCE(?5, failure) ELSE COALESCE(failure, ?5) END
                 WHERE job_id = ?1 AND step = ?2",
            )
            .map_err(|e| self.err(e))?;
        st.execute(params![job.0 as i64, step, end_time, exit_code, failure]).map_err(|e| self.err(e))?;
        Ok(())
    }

    /// Close every step of `job` still open (its job ended).
    pub fn close_steps(&self, job: JobId, end_time: f64, failure: &str) -> Result<(), StoreError> {
        let mut st = self
            .conn
            .prepare_cached("UPDATE steps SET end_time = ?2, failure = ?3 WHERE job_id = ?1 AND end_time IS NULL")
            .map_err(|e| self.err(e))?;
        st.execute(params![job.0 as i64, end_time, failure]).map_err(|e| self.err(e))?;
        Ok(())
    }

    fn query_steps(&self, filter: &str, args: &[&dyn rusqlite::ToSql]) -> Result<Vec<StepRow>, StoreError> {
        let sql = format!(
            "SELECT job_id, step, uid, user, start_time, end_time, host, pid, cwd, argv, size, nodes, exit_code,
              failure, interactive, claims FROM steps {filter}"
        );
        let mut st = self.conn.prepare_cached(&sql).map_err(|e| self.err(e))?;
        let raw = st
            .query_map(args, |r| {
                Ok((
                    StepRow {
                        job: JobId(r.get::<_, i64>(0)? as u64),
                        step: r.get(1)?,
                        uid: r.get(2)?,
                        user: r.get(3)?,
                        start_time: r.get(4)?,
                        end_time: r.get(5)?,
                        host: r.get(6)?,
                        pid: r.get(7)?,
                        cwd: r.get(8)?,
                        argv: vec![],
                        size: r.get(10)?,
                        nodes: vec![],
                        exit_code: r.get(12)?,
                        failure: r.get(13)?,
                        interactive: r.get(14)?,
                        claims: vec![],
                    },
                    r.get::<_, String>(9)?,
                    r.get::<_, String>(11)?,
                    r.get::<_, String>(15)?,
                ))
            })
            .map_err(|e| self.err(e))?;
        let mut out = Vec::new();
        for r in raw {
            let (mut row, argv, nodes, claims) = r.map_err(|e| self.err(e))?;
            let bad = |what: &str, e: serde_json::Error| StoreError::Record {
                path: self.path.clone(),
                id: row.job.0 as i64,
                detail: format!("step {} {what} column: {e}", row.step),
            };
            row.argv = serde_json::from_str(&argv).map_err(|e| bad("argv", e))?;
            row.nodes = serde_json::from_str(&nodes).map_err(|e| bad("nodes", e))?;
            row.claims = serde_json::from_str(&claims).map_err(|e| bad("claims", e))?;
            out.push(row);
        }
        Ok(out)
    }

    pub fn get_step(&self, job: JobId, step: u32) -> Result<Option<StepRow>, StoreError> {
        Ok(self.query_steps("WHERE job_id = ?1 AND step = ?2", &[&(job.0 as i64), &step])?.pop())
    }

    /// Steps that have not ended, oldest first.
    pub fn live_steps(&self) -> Result<Vec<StepRow>, StoreError> {
        self.query_steps("WHERE end_time IS NULL ORDER BY job_id, step", &[])
    }

    /// The steps of one job, first first.
    pub fn job_steps(&self, job: JobId) -> Result<Vec<StepRow>, StoreError> {
        self.query_steps("WHERE job_id = ?1 ORDER BY step", &[&(job.0 as i64)])
    }

    /// The invocation log, newest first.
    /// The event log, oldest first: after `after_id` (following it), else the most recent
    /// `limit`; filtered by kinds, job and node.
    pub fn events(
        &self,
        q: &berth_protocol::client::EventQuery,
    ) -> Result<Vec<berth_protocol::client::EventInfo>, StoreError> {
        let limit = q.limit.unwrap_or(1000).min(100_000) as i64;
        let kinds = serde_json::to_string(&q.kinds).unwrap_or_else(|_| "[]".into());
        // Newest first within the limit, then put back in order.
        let (order, after) = match q.after_id {
            Some(a) => ("ASC", a as i64),
            None => ("DESC", -1),
        };
        let sql = format!(
            "SELECT id, time, kind, job_id, node, detail FROM events
             WHERE id > ?1 AND (?2 = '[]' OR kind IN (SELECT value FROM json_each(?2)))
               AND (?3 IS NULL OR job_id = ?3) AND (?4 IS NULL OR node = ?4)
             ORDER BY id {order} LIMIT ?5"
        );
        let mut st = self.conn.prepare_cached(&sql).map_err(|e| self.err(e))?;
        let rows = st
            .query_map(params![after, kinds, q.job.map(|j| j.0 as i64), q.node, limit], |r| {
                Ok(berth_protocol::client::EventInfo {
                    id: r.get::<_, i64>(0)? as u64,
                    time: r.get(1)?,
                    kind: r.get(2)?,
                    job: r.get::<_, Option<i64>>(3)?.map(|j| JobId(j as u64)),
                    node: r.get(4)?,
                    detail: r.get::<_, Option<String>>(5)?.unwrap_or_default(),
                })
            })
            .map_err(|e| self.err(e))?;
        let mut out = rows.collect::<Result<Vec<_>, _>>().map_err(|e| self.err(e))?;
        if q.after_id.is_none() {
            out.reverse();
        }
        Ok(out)
    }

    pub fn recent_steps(&self, limit: u32) -> Result<Vec<StepRow>, StoreError> {
        self.query_steps("ORDER BY start_time DESC, job_id DESC, step DESC LIMIT ?1", &[&(limit as i64)])
    }

    /// Record what a job used on one of its other nodes (not the first). Returns false when
    /// that node's usage was already recorded (a resent end).
    pub fn add_member_usage(&self, job: JobId, node: &str, u: &Usage) -> Result<bool, StoreError> {
        let mut st = self
            .conn
            .prepare_cached(
                "INSERT OR IGNORE INTO member_usage (job_id, node, user_cpu_us, system_cpu_us, peak_memory_bytes)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )
            .map_err(|e| self.err(e))?;
        let n = st
            .execute(params![
                job.0 as i64,
                node,
                u.user_cpu_us as i64,
                u.system_cpu_us as i64,
                u.peak_memory_bytes as i64
            ])
            .map_err(|e| self.err(e))?;
        Ok(n == 1)
    }

    /// CPU times of a job's other nodes summed, and the largest peak memory among them.
    pub fn member_usage(&self, job: JobId) -> Result<Usage, StoreError> {
        let (u, s, m): (i64, i64, i64) = self
            .conn
            .query_row(
                "SELECT COALESCE(SUM(user_cpu_us), 0), COALESCE(SUM(system_cpu_us), 0),
                  COALESCE(MAX(peak_memory_bytes), 0) FROM member_usage WHERE job_id = ?1",
                [job.0 as i64],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .map_err(|e| self.err(e))?;
        Ok(Usage { wall_ms: 0, user_cpu_us: u as u64, system_cpu_us: s as u64, peak_memory_bytes: m as u64 })
    }

    /// Add a late node's usage to a finished job's accounting row (if it has one).
    pub fn add_to_accounting(&self, job: JobId, u: &Usage) -> Result<(), StoreError> {
        let mut st = self
            .conn
            .prepare_cached(
                "UPDATE accounting SET user_cpu_us = user_cpu_us + ?2, system_cpu_us = system_cpu_us + ?3,
                  peak_memory_bytes = MAX(peak_memory_bytes, ?4) WHERE job_id = ?1",
            )
            .map_err(|e| self.err(e))?;
        st.execute(params![job.0 as i64, u.user_cpu_us as i64, u.system_cpu_us as i64, u.peak_memory_bytes as i64])
            .map_err(|e| self.err(e))?;
        Ok(())
    }
}

pub use crate::model::step::StepRow;

impl StepRow {
    pub fn info(&self) -> StepInfo {
        StepInfo {
            job: self.job,
            step: self.step,
            user: self.user.clone(),
            uid: self.uid,
            start_time: self.start_time,
            end_time: self.end_time,
            host: self.host.clone(),
            pid: self.pid,
            cwd: self.cwd.clone(),
            argv: self.argv.clone(),
            size: self.size,
            nodes: self.nodes.clone(),
            exit_code: self.exit_code,
            failure: self.failure.clone(),
            interactive: self.interactive,
        }
    }
}

/// How long a write probe waits for another process's lock: short, the state thread serves
/// reads meanwhile.
fn wait_for_probe() -> Duration {
    Duration::from_millis(50)
}

/// Bytes free (to unprivileged users) on the filesystem holding `path`; u64::MAX if unknown.
pub fn free_bytes(path: &Path) -> u64 {
    let dir = path.parent().unwrap_or(path);
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else { return u64::MAX };
    // SAFETY: `c` is a NUL-terminated path; statvfs writes only into `st`.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return u64::MAX;
    }
    (st.f_bavail as u64).saturating_mul(st.f_frsize as u64)
}

/// Make the state directory and its database files the daemon user's alone: the directory
/// 0700, the files 0600, all owned by this process's user (root gives them back to itself;
/// another user cannot, and is told).
fn secure(dir: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    // SAFETY: geteuid/getegid cannot fail.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let db = dir.join("state.db");
    let mut paths = vec![(dir.to_path_buf(), 0o700)];
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let mut p = db.clone().into_os_string();
        p.push(suffix);
        paths.push((PathBuf::from(p), 0o600));
    }
    for (path, mode) in paths {
        let meta = match std::fs::symlink_metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => return Err(StoreError::Dir { path, source }),
        };
        if meta.file_type().is_symlink() {
            let source =
                std::io::Error::other("it is a symbolic link; the state directory must hold the files themselves");
            return Err(StoreError::Dir { path, source });
        }
        if meta.uid() != uid {
            if uid != 0 {
                let source = std::io::Error::other(format!(
                    "owned by uid {}, not by this controller's user (uid {uid}); chown it or choose another state_dir",
                    meta.uid()
                ));
                return Err(StoreError::Dir { path, source });
            }
            tracing::warn!(path = %path.display(), owner = meta.uid(), "state file not owned by root: taken back");
            std::os::unix::fs::lchown(&path, Some(uid), Some(gid))
                .map_err(|source| StoreError::Dir { path: path.clone(), source })?;
        }
        if meta.mode() & 0o7777 != mode {
            if meta.mode() & 0o077 != 0 {
                tracing::warn!(path = %path.display(), mode = format!("{:o}", meta.mode() & 0o7777), "state file readable by others: made private");
            }
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
                .map_err(|source| StoreError::Dir { path: path.clone(), source })?;
        }
    }
    Ok(())
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
    suspension: crate::model::suspension::Suspension,
    script_of: Option<i64>,
}

/// The script and environment of the jobs that share them (by the `script_of` row).
type Shared = (Arc<str>, Arc<Vec<(String, String)>>);

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
            suspension: suspend::from_columns(r.get(26)?, r.get(27)?, r.get(28)?, r.get(29)?),
            script_of: r.get(30)?,
        })
    }

    fn into_record(self, shared: &mut HashMap<i64, Shared>) -> Result<JobRecord, String> {
        let de = |what: &str, s: &str| format!("{what} column: {s}");
        let state = JobState::parse(&self.state).ok_or_else(|| de("state", &self.state))?;
        let options = serde_json::from_str(&self.request).map_err(|e| de("request", &e.to_string()))?;
        let allocation = serde_json::from_str(&self.allocation).map_err(|e| de("allocation", &e.to_string()))?;
        let groups = serde_json::from_str(&self.groups).map_err(|e| de("groups", &e.to_string()))?;
        let (script, env) = match self.script_of.and_then(|o| shared.get(&o)) {
            Some((s, e)) => (s.clone(), e.clone()),
            None => {
                let env: Vec<(String, String)> =
                    serde_json::from_str(&self.env).map_err(|e| de("env", &e.to_string()))?;
                let pair: Shared = (self.script.into(), Arc::new(env));
                if let Some(o) = self.script_of {
                    shared.insert(o, pair.clone());
                }
                pair
            }
        };
        // A suspended job's reason as typed, read back from its words.
        let suspended_reason = match state {
            JobState::Suspended => self.reason.as_deref().and_then(SuspendedReason::from_words),
            _ => None,
        };
        let record = JobRecord {
            id: JobId(self.id as u64),
            name: self.name,
            user: berth_protocol::user::UserIdentity { uid: self.uid, gid: self.gid, groups, name: self.user },
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
            script,
            env,
            usage: self.usage.map(|(w, u, s, m)| crate::model::job::Usage {
                wall_ms: w as u64,
                user_cpu_us: u as u64,
                system_cpu_us: s as u64,
                peak_memory_bytes: m as u64,
            }),
            kill_sent: None,
            suspension: crate::model::suspension::Suspension { reason: suspended_reason, ..self.suspension },
        };
        record.validate()?;
        Ok(record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_core::directives::SubmitOptions;
    use berth_core::CpuSet;
    use berth_protocol::user::UserIdentity;

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
            env: Arc::new(vec![("PATH".into(), "/bin".into())]),
            usage: None,
            kill_sent: None,
            suspension: Default::default(),
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

    fn step(job: u64, step: u32, start: f64) -> StepRow {
        StepRow {
            job: JobId(job),
            step,
            uid: 1000,
            user: "ann".into(),
            start_time: start,
            end_time: None,
            host: "login1".into(),
            pid: 4242,
            cwd: "/home/ann".into(),
            argv: vec!["./a.out".into(), "-x".into()],
            size: 4,
            nodes: vec!["n1".into(), "n2".into()],
            exit_code: None,
            failure: None,
            interactive: false,
            claims: vec![(0, CpuSet::parse_list("0-1").unwrap()), (1, CpuSet::parse_list("4,5").unwrap())],
        }
    }

    #[test]
    fn steps_round_trip_and_end() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            store.begin().unwrap();
            store.insert_job(&job(1)).unwrap();
            assert_eq!(store.job_counts_of(JobId(1)).unwrap(), (0, 0));
            store.insert_step(&step(1, 1, 10.0)).unwrap();
            store.insert_step(&step(1, 2, 11.0)).unwrap();
            let mut other = step(2, 1, 12.0);
            other.interactive = true;
            other.claims = vec![];
            store.insert_step(&other).unwrap();
            store.commit().unwrap();
        }
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.job_counts_of(JobId(1)).unwrap(), (0, 2));
        // The live jobs' counts in one go: job 1's next step is 3; job 2 has no row, no entry.
        let counts = store.job_counts().unwrap();
        assert_eq!((counts.next_step(JobId(1)), counts.requeues(JobId(1))), (3, 0));
        assert_eq!(counts.next_step(JobId(2)), 1);
        let live = store.live_steps().unwrap();
        assert_eq!(live.len(), 3);
        assert_eq!(live[0], step(1, 1, 10.0));
        assert!(live[2].interactive && live[2].claims.is_empty());
        store.end_step(JobId(1), 1, 20.0, Some(3), Some("rank 1 on n1 exited with status 3")).unwrap();
        store.close_steps(JobId(1), 21.0, "job ended").unwrap();
        let s1 = store.get_step(JobId(1), 1).unwrap().unwrap();
        assert_eq!(
            (s1.end_time, s1.exit_code, s1.failure.as_deref()),
            (Some(20.0), Some(3), Some("rank 1 on n1 exited with status 3"))
        );
        let s2 = store.get_step(JobId(1), 2).unwrap().unwrap();
        assert_eq!((s2.end_time, s2.exit_code, s2.failure.as_deref()), (Some(21.0), None, Some("job ended")));
        // `run` reports after its job ended: the status is kept, the end time too.
        store.end_step(JobId(1), 2, 30.0, Some(0), None).unwrap();
        let s2 = store.get_step(JobId(1), 2).unwrap().unwrap();
        assert_eq!((s2.end_time, s2.exit_code), (Some(21.0), Some(0)));
        assert_eq!(store.live_steps().unwrap().len(), 1);
        let recent: Vec<_> = store.recent_steps(2).unwrap().iter().map(|s| (s.job.0, s.step)).collect();
        assert_eq!(recent, vec![(2, 1), (1, 2)]);
        assert_eq!(store.job_steps(JobId(1)).unwrap().len(), 2);
        let info = s1.info();
        assert_eq!((info.size, info.nodes.len(), info.argv[0].as_str()), (4, 2, "./a.out"));
        assert!(store.get_step(JobId(1), 9).unwrap().is_none());
    }

    #[test]
    fn only_log_writes_commit_without_fsync_and_survive_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            store.begin().unwrap();
            store.insert_job(&job(1)).unwrap();
            assert!(store.durable_pending(), "a job is durable state");
            store.commit().unwrap();
            store.begin().unwrap();
            store.insert_step(&step(1, 1, 10.0)).unwrap();
            store.event(10.0, "step_start", Some(JobId(1)), None, "step 1").unwrap();
            assert!(!store.durable_pending(), "the invocation and event logs alone need no fsync");
            store.commit().unwrap();
            store.begin().unwrap();
            store.end_step(JobId(1), 1, 20.0, Some(0), None).unwrap();
            store.set_meta("k", "v").unwrap();
            assert!(store.durable_pending(), "a setting with the log rows makes the batch durable");
            store.rollback();
            assert!(!store.durable_pending(), "a rollback forgets it");
            store.begin().unwrap();
            store.end_step(JobId(1), 1, 20.0, Some(0), None).unwrap();
            store.commit().unwrap();
            // Dropped without a checkpoint, as a killed controller leaves it: the rows are in the WAL.
            std::mem::forget(store);
        }
        let store = Store::open(dir.path()).unwrap();
        let s = store.get_step(JobId(1), 1).unwrap().unwrap();
        assert_eq!((s.end_time, s.exit_code), (Some(20.0), Some(0)));
        assert_eq!(store.get_meta("k").unwrap(), None);
        assert_eq!(store.count_events(JobId(1), "step_start").unwrap(), 1);
    }

    #[test]
    fn member_usage_is_added_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let u = Usage { wall_ms: 0, user_cpu_us: 5, system_cpu_us: 7, peak_memory_bytes: 100 };
        assert!(store.add_member_usage(JobId(1), "n2", &u).unwrap());
        assert!(!store.add_member_usage(JobId(1), "n2", &u).unwrap());
        assert!(store.add_member_usage(JobId(1), "n3", &Usage { peak_memory_bytes: 300, ..u }).unwrap());
        let sum = store.member_usage(JobId(1)).unwrap();
        assert_eq!((sum.user_cpu_us, sum.system_cpu_us, sum.peak_memory_bytes), (10, 14, 300));
        assert_eq!(store.member_usage(JobId(2)).unwrap(), Usage::default());
    }

    #[test]
    fn the_state_directory_and_its_files_are_private_made_so_and_put_right() {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("controller");
        {
            let store = Store::open(&dir).unwrap();
            store.preallocate_wal();
            store.begin().unwrap();
            store.insert_job(&job(1)).unwrap();
            store.commit().unwrap();
            std::mem::forget(store); // the -wal and -shm files stay
        }
        assert_eq!(mode(&dir), 0o700);
        for f in ["state.db", "state.db-wal", "state.db-shm"] {
            assert_eq!(mode(&dir.join(f)), 0o600, "{f} made private");
        }
        // As an older berth left them: opened up; the next start closes them again.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        for f in ["state.db", "state.db-wal", "state.db-shm"] {
            std::fs::set_permissions(dir.join(f), std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        let store = Store::open(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);
        for f in ["state.db", "state.db-wal", "state.db-shm"] {
            assert_eq!(mode(&dir.join(f)), 0o600, "{f} put right");
        }
        assert_eq!(store.load_active_jobs().unwrap().len(), 1);
    }

    #[test]
    fn a_database_locked_by_another_process_is_unwritable_not_broken() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        // Another connection holds the write lock (as a process locking the WAL write byte does).
        let other = Connection::open(dir.path().join("state.db")).unwrap();
        other.execute_batch("BEGIN IMMEDIATE").unwrap();
        let t0 = std::time::Instant::now();
        let e = store.begin().expect_err("locked");
        assert!(t0.elapsed() >= BUSY_TIMEOUT / 2, "waited for the lock first: {:?}", t0.elapsed());
        assert_eq!(e.unwritable(), Some(WriteBlock::Busy), "{e}");
        assert!(e.to_string().contains("state.db") && e.to_string().contains("locked"), "{e}");
        store.rollback();
        assert!(store.probe_write(1.0).is_err(), "the probe fails while the lock is held");
        // Reads go on meanwhile.
        assert_eq!(store.load_active_jobs().unwrap().len(), 0);
        other.execute_batch("ROLLBACK").unwrap();
        store.probe_write(2.0).expect("writable once the lock is released");
        store.begin().unwrap();
        store.insert_job(&job(1)).unwrap();
        store.commit().unwrap();
        assert_eq!(store.load_active_jobs().unwrap().len(), 1);
    }

    #[test]
    fn array_tasks_share_one_script_on_disk_and_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            store.begin().unwrap();
            store.insert_job(&job(1)).unwrap();
            store.insert_job_sharing(&job(2), Some(JobId(1))).unwrap();
            store.insert_job_sharing(&job(3), Some(JobId(1))).unwrap();
            store.commit().unwrap();
            let own: (String, String) = store
                .conn
                .query_row("SELECT script, env FROM jobs WHERE id = 3", [], |r| Ok((r.get(0)?, r.get(1)?)))
                .unwrap();
            assert_eq!(own, (String::new(), "[]".to_string()), "a task keeps no copy of its own");
        }
        let store = Store::open(dir.path()).unwrap();
        let active = store.load_active_jobs().unwrap();
        assert_eq!(active.len(), 3);
        for j in &active {
            assert_eq!(&*j.script, "#!/bin/sh\ntrue\n");
            assert_eq!(*j.env, vec![("PATH".to_string(), "/bin".to_string())]);
        }
        assert!(Arc::ptr_eq(&active[1].script, &active[2].script), "one copy in memory");
        assert_eq!(&*store.get_job(JobId(2)).unwrap().unwrap().script, "#!/bin/sh\ntrue\n");
    }

    #[test]
    fn a_version_1_state_database_is_migrated() {
        let dir = tempfile::tempdir().unwrap();
        {
            let conn = Connection::open(dir.path().join("state.db")).unwrap();
            conn.execute_batch(
                "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
                 INSERT INTO meta VALUES ('schema_version', '1');
                 CREATE TABLE jobs (
                    id INTEGER PRIMARY KEY, name TEXT NOT NULL, uid INTEGER NOT NULL, gid INTEGER NOT NULL,
                    user TEXT NOT NULL, groups TEXT NOT NULL, state TEXT NOT NULL, queue TEXT NOT NULL,
                    request TEXT NOT NULL, walltime INTEGER, submit_time REAL NOT NULL,
                    start_time REAL, end_time REAL, allocation TEXT NOT NULL DEFAULT '[]',
                    exit_code INTEGER, signal INTEGER, reason TEXT, cwd TEXT NOT NULL,
                    stdout TEXT NOT NULL, stderr TEXT NOT NULL, script TEXT NOT NULL, env TEXT NOT NULL);",
            )
            .unwrap();
            conn.execute(
                "INSERT INTO jobs (id, name, uid, gid, user, groups, state, queue, request, walltime, submit_time,
                    cwd, stdout, stderr, script, env)
                 VALUES (4, 'old', 1000, 100, 'ann', '[100]', 'queued', 'batch', ?1, 60, 1.0,
                    '/home/ann', 'o', 'e', 'echo old', '[[\"A\",\"b\"]]')",
                [json(&job(4).options)],
            )
            .unwrap();
        }
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.get_meta("schema_version").unwrap().as_deref(), Some("2"));
        let active = store.load_active_jobs().unwrap();
        assert_eq!(active.len(), 1);
        assert_eq!(&*active[0].script, "echo old");
        assert_eq!(*active[0].env, vec![("A".to_string(), "b".to_string())]);
        store.begin().unwrap();
        store.insert_job(&job(5)).unwrap();
        store.insert_job_sharing(&job(6), Some(JobId(5))).unwrap();
        store.commit().unwrap();
        drop(store);
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.load_active_jobs().unwrap().len(), 3);
        assert_eq!(&*store.get_job(JobId(6)).unwrap().unwrap().script, "#!/bin/sh\ntrue\n");
    }

    #[test]
    fn corrupt_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("state.db"), b"not a database at all, just text that is long enough").unwrap();
        let err = Store::open(dir.path()).err().expect("must refuse");
        assert!(err.to_string().contains("corrupt") || err.to_string().contains("not a database"), "{err}");
    }
}
