//! What the agent keeps on disk about its jobs, so that a restarted agent re-adopts the jobs
//! still running in its cgroups and reports those that ended while it was down.
//!
//! In the agent's state directory (root only):
//! - `jobs/<id>.json`: a [`LocalJobRecord`], written once the job is set up (its shim started);
//! - `ended.log`: the [`JobOutcome`]s of jobs that ended here and whose end the controller
//!   has not acknowledged yet: an append-only log of `E <id> <outcome JSON>` (an end, synced
//!   before it is reported) and `A <id>` (its acknowledgement) lines, rewritten with only the
//!   unacknowledged ends when the agent starts and whenever it has grown past
//!   [`LOG_COMPACT_BYTES`]. Two `fdatasync`s per job (its end, its acknowledgement) and no
//!   file made or removed: the `ended/<id>.json` file per end that it replaced cost three
//!   fsyncs and three inode operations per job (files left there by an older agent are read
//!   once, into the log);
//!
//! - `step_ends/<job>.<step>.json`: a step's end as its control tree's root reported it
//!   (`step_ended`), until the controller acknowledges it (`StepEndAck`).
//!
//! Both are dropped when the controller acknowledges the end (`EndAck`). Every file is
//! written to a temporary name and renamed into place, but for the log, which is appended to;
//! an outcome is synced: it is the only trace of the job's end if the node loses power before
//! the controller has it; so is its acknowledgement. A job record is not (see `save_job`).

use berth_core::job::JobOutcome;
use berth_core::JobId;
use berth_protocol::agent::{AgentMessage, LaunchSpec};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The end log is rewritten (unacknowledged ends only) once it has grown past this.
pub const LOG_COMPACT_BYTES: u64 = 256 * 1024;
const LOG_NAME: &str = "ended.log";

/// A job set up on this node, as a restarted agent needs it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LocalJobRecord {
    pub spec: LaunchSpec,
    /// The shim (the batch script's parent) on the job's first node; None elsewhere.
    pub shim_pid: Option<i32>,
    /// Its start time (field 22 of /proc/<pid>/stat, clock ticks since boot), so that a
    /// reused pid is not taken for it.
    pub shim_start_time: Option<u64>,
    /// When the job started here (milliseconds since the Unix epoch): the walltime's base.
    pub started_unix_ms: u64,
    /// The job's cgroup name under the agent's root (`job_<id>`).
    pub cgroup: String,
    /// `BERTH_CPUSET`.
    pub cpuset_dir: PathBuf,
    /// The job's spool directory (script, nodefile, TMPDIR, exit status).
    pub spool: PathBuf,
}

/// A lease held from the controller, as a restarted agent reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldLease {
    pub lease_ms: u64,
    /// When it was last renewed (milliseconds since the Unix epoch).
    pub renewed_unix_ms: u64,
}

/// The `jobs/`, `step_ends/` directories and the end log of an agent's state directory.
#[derive(Debug)]
pub struct Records {
    jobs: PathBuf,
    step_ends: PathBuf,
    /// The renewal time of the lease last written, held while one is written: renewals are
    /// saved by concurrent tasks through one temporary file, and an older renewal must never
    /// replace a newer one.
    lease_written: Mutex<Option<u64>>,
    log: Mutex<EndLog>,
}

/// The end log open for appending, and the unacknowledged ends it holds (their lines), which
/// a compaction rewrites.
#[derive(Debug)]
struct EndLog {
    path: PathBuf,
    file: Arc<std::fs::File>,
    bytes: u64,
    unacked: BTreeMap<JobId, Vec<u8>>,
}

impl Records {
    /// Make (root only, 0700) the directories under `state_dir`, and read the end log (and
    /// an older agent's `ended/` files), rewritten with the unacknowledged ends only.
    pub fn open(state_dir: &Path) -> std::io::Result<Records> {
        // `ended/`: where an older agent kept one file per unacknowledged end (read, then gone).
        let (jobs, ended, step_ends) = (state_dir.join("jobs"), state_dir.join("ended"), state_dir.join("step_ends"));
        for d in [&jobs, &step_ends] {
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(d)?;
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700))?;
        }
        let path = state_dir.join(LOG_NAME);
        let mut unacked = match std::fs::read(&path) {
            Ok(bytes) => parse_log(&bytes),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(e),
        };
        let older = load::<JobOutcome>(&ended);
        for (id, outcome) in &older {
            unacked.entry(*id).or_insert(end_line(*id, outcome)?);
        }
        let file = rewrite_log(&path, &unacked)?;
        let bytes = file.metadata()?.len();
        // Only once their ends are in the synced log.
        if older.is_empty() {
            let _ = std::fs::remove_dir(&ended);
        } else {
            let _ = std::fs::remove_dir_all(&ended);
            sync_dir(state_dir);
        }
        let log = Mutex::new(EndLog { path, file: Arc::new(file), bytes, unacked });
        Ok(Records { jobs, step_ends, lease_written: Mutex::new(None), log })
    }

    /// Not synced: it describes processes that a power loss of this node kills with it, and
    /// a restarted agent needs it only after a crash of the agent alone (the page cache
    /// survives that). The rename keeps it whole.
    pub fn save_job(&self, rec: &LocalJobRecord) -> std::io::Result<()> {
        let bytes = serde_json::to_vec(rec).map_err(std::io::Error::other)?;
        write_atomically(&self.jobs, &file_name(rec.spec.id), &bytes, false)
    }

    /// A running job's walltime was raised to `secs`: a restarted agent enforces that one.
    pub fn save_walltime(&self, id: JobId, secs: u64) -> std::io::Result<()> {
        let bytes = std::fs::read(self.jobs.join(file_name(id)))?;
        let mut rec: LocalJobRecord = serde_json::from_slice(&bytes).map_err(std::io::Error::other)?;
        if rec.spec.walltime_seconds == Some(secs) {
            return Ok(());
        }
        rec.spec.walltime_seconds = Some(secs);
        self.save_job(&rec)
    }

    /// The job's end, appended to the end log and synced (`fdatasync`: ends appended by
    /// other jobs meanwhile are synced with it) before this returns.
    pub fn save_ended(&self, id: JobId, outcome: &JobOutcome) -> std::io::Result<()> {
        let line = end_line(id, outcome)?;
        let file = {
            let mut log = self.lock_log();
            log.append(&line)?;
            log.unacked.insert(id, line);
            log.file.clone()
        };
        // Outside the lock: appends of other ends go on meanwhile (and are synced with it).
        file.sync_data()
    }

    /// The job's end was acknowledged: nothing about it is kept. The acknowledgement is synced
    /// (a node that lost power must not report an acknowledged end again); the job record's
    /// removal is not: it never was (see [`Records::save_job`]).
    pub fn forget(&self, id: JobId) {
        match std::fs::remove_file(self.jobs.join(file_name(id))) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(job = %id, "cannot remove the record in {}: {e}", self.jobs.display()),
        }
        let file = {
            let mut log = self.lock_log();
            if log.unacked.remove(&id).is_none() {
                return;
            }
            log.append(format!("A {id}\n").as_bytes()).map(|()| log.file.clone())
        };
        if let Err(e) = file.and_then(|f| f.sync_data()) {
            tracing::warn!(job = %id, "cannot log the acknowledgement of the job's end ({e}): a restarted agent reports it again");
        }
    }

    fn lock_log(&self) -> std::sync::MutexGuard<'_, EndLog> {
        // A panic while it was held left the log as appended so far: still usable.
        self.log.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Every readable job record; unreadable ones are logged and removed.
    pub fn load_jobs(&self) -> Vec<LocalJobRecord> {
        load::<LocalJobRecord>(&self.jobs).into_iter().map(|(_, r)| r).collect()
    }

    /// Every ended-but-unacknowledged outcome, in id order.
    pub fn load_ended(&self) -> Vec<(JobId, JobOutcome)> {
        let log = self.lock_log();
        log.unacked.iter().filter_map(|(id, line)| Some((*id, parse_end(line)?.1))).collect()
    }

    /// The controller's lease as last renewed (`lease.json` beside `jobs/`), so that a
    /// restarted agent fences its re-adopted jobs when it runs out (crate::fence). Not synced:
    /// written at every renewal, needed only after a crash of the agent alone.
    pub fn save_lease(&self, lease: &HeldLease) -> std::io::Result<()> {
        let mut written = self.lease_written.lock().unwrap_or_else(|p| p.into_inner());
        if written.is_some_and(|at| at > lease.renewed_unix_ms) {
            return Ok(()); // a later renewal is on disk already
        }
        let bytes = serde_json::to_vec(lease).map_err(std::io::Error::other)?;
        let dir = self.jobs.parent().unwrap_or(&self.jobs);
        write_atomically(dir, "lease.json", &bytes, false)?;
        *written = Some(lease.renewed_unix_ms);
        Ok(())
    }

    /// No lease is held (the controller grants none).
    pub fn forget_lease(&self) {
        let mut written = self.lease_written.lock().unwrap_or_else(|p| p.into_inner());
        *written = None;
        let dir = self.jobs.parent().unwrap_or(&self.jobs);
        let _ = std::fs::remove_file(dir.join("lease.json"));
    }

    pub fn load_lease(&self) -> Option<HeldLease> {
        let dir = self.jobs.parent().unwrap_or(&self.jobs);
        std::fs::read(dir.join("lease.json")).ok().and_then(|b| serde_json::from_slice(&b).ok())
    }

    /// Not synced, as a job record: a restarted agent resends it, so the step closes with its
    /// exit status rather than as lost.
    pub fn save_step_end(&self, job: JobId, step: u32, msg: &AgentMessage) -> std::io::Result<()> {
        let bytes = serde_json::to_vec(msg).map_err(std::io::Error::other)?;
        write_atomically(&self.step_ends, &format!("{job}.{step}.json"), &bytes, false)
    }

    pub fn forget_step_end(&self, job: JobId, step: u32) {
        let _ = std::fs::remove_file(self.step_ends.join(format!("{job}.{step}.json")));
    }

    /// Every reported-but-unacknowledged step end; unreadable files are logged and removed.
    pub fn load_step_ends(&self) -> Vec<((JobId, u32), AgentMessage)> {
        let mut out = Vec::new();
        let Ok(rd) = std::fs::read_dir(&self.step_ends) else { return out };
        for p in rd.flatten().map(|e| e.path()) {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
            let parsed = std::fs::read(&p)
                .ok()
                .filter(|_| name.ends_with(".json"))
                .and_then(|b| serde_json::from_slice::<AgentMessage>(&b).ok());
            match parsed {
                Some(msg @ AgentMessage::StepEnded { job, step, .. }) => out.push(((job, step), msg)),
                _ => {
                    tracing::warn!(file = %p.display(), "removing an unreadable step end record");
                    let _ = std::fs::remove_file(&p);
                }
            }
        }
        out.sort_by_key(|(k, _)| *k);
        out
    }
}

impl EndLog {
    /// Append `line` (compacting the log first once it is large).
    fn append(&mut self, line: &[u8]) -> std::io::Result<()> {
        if self.bytes >= LOG_COMPACT_BYTES {
            let file = rewrite_log(&self.path, &self.unacked)?;
            self.bytes = file.metadata()?.len();
            self.file = Arc::new(file);
        }
        // One write(2) in append mode: the line is never interleaved with another.
        (&*self.file).write_all(line)?;
        self.bytes += line.len() as u64;
        Ok(())
    }
}

/// `E <id> <outcome JSON>\n` (the JSON has no newline: serde_json escapes them in strings).
fn end_line(id: JobId, outcome: &JobOutcome) -> std::io::Result<Vec<u8>> {
    let mut line = format!("E {id} ").into_bytes();
    serde_json::to_writer(&mut line, outcome).map_err(std::io::Error::other)?;
    line.push(b'\n');
    Ok(line)
}

/// An `E` line's job and outcome (with or without its newline).
fn parse_end(line: &[u8]) -> Option<(JobId, JobOutcome)> {
    let text = std::str::from_utf8(line).ok()?.trim_end_matches('\n');
    let (id, json) = text.strip_prefix("E ")?.split_once(' ')?;
    Some((JobId(id.parse().ok()?), serde_json::from_str(json).ok()?))
}

/// The unacknowledged ends of a log's bytes: the last segment without a newline (a write cut
/// off by a crash) is ignored, as is any line that does not parse (logged).
fn parse_log(bytes: &[u8]) -> BTreeMap<JobId, Vec<u8>> {
    let mut unacked = BTreeMap::new();
    let whole = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    for line in bytes[..whole].split_inclusive(|b| *b == b'\n') {
        if let Some((id, _)) = parse_end(line) {
            unacked.insert(id, line.to_vec());
            continue;
        }
        let ack = std::str::from_utf8(line).ok().and_then(|t| t.trim_end().strip_prefix("A ")?.parse::<u64>().ok());
        match ack {
            Some(id) => {
                unacked.remove(&JobId(id));
            }
            None => {
                tracing::warn!(line = %String::from_utf8_lossy(line).escape_debug(), "skipping an unreadable line of the end log")
            }
        }
    }
    if whole < bytes.len() {
        tracing::warn!(bytes = bytes.len() - whole, "skipping the unfinished last line of the end log");
    }
    unacked
}

/// Write the log anew with `unacked`'s lines (tmp, fsync, rename, directory fsync); the new
/// file, open for appending.
fn rewrite_log(path: &Path, unacked: &BTreeMap<JobId, Vec<u8>>) -> std::io::Result<std::fs::File> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = path.with_extension("log.tmp");
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
    let text: Vec<u8> = unacked.values().flatten().copied().collect();
    f.write_all(&text)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path)?;
    sync_dir(dir);
    std::fs::OpenOptions::new().append(true).open(path)
}

fn file_name(id: JobId) -> String {
    format!("{id}.json")
}

fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| rd.flatten().map(|e| e.path()).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .filter(|p: &PathBuf| {
            p.extension().is_some_and(|e| e == "json")
                && p.file_stem().and_then(|s| s.to_str()).is_some_and(|s| s.parse::<u64>().is_ok())
        })
        .collect();
    out.sort_by_key(|p| p.file_stem().and_then(|s| s.to_str()).and_then(|s| s.parse::<u64>().ok()));
    out
}

fn load<T: serde::de::DeserializeOwned>(dir: &Path) -> Vec<(JobId, T)> {
    let mut out = Vec::new();
    for p in entries(dir) {
        let Some(id) = p.file_stem().and_then(|s| s.to_str()).and_then(|s| s.parse().ok()) else { continue };
        match std::fs::read(&p)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice::<T>(&b).map_err(|e| e.to_string()))
        {
            Ok(v) => out.push((JobId(id), v)),
            Err(e) => {
                tracing::warn!(file = %p.display(), "removing an unreadable job record: {e}");
                let _ = std::fs::remove_file(&p);
            }
        }
    }
    // Temporaries of a write the agent did not finish.
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten().filter(|e| e.file_name().to_string_lossy().ends_with(".tmp")) {
            let _ = std::fs::remove_file(e.path());
        }
    }
    out
}

/// tmp + rename, with `durably` an fsync of the file before and of the directory after.
fn write_atomically(dir: &Path, name: &str, bytes: &[u8], durably: bool) -> std::io::Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    if durably {
        f.sync_all()?;
    }
    drop(f);
    std::fs::rename(&tmp, dir.join(name))?;
    if durably {
        sync_dir(dir);
    }
    Ok(())
}

fn sync_dir(dir: &Path) {
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

/// Start time of process `pid` (field 22 of /proc/<pid>/stat, in clock ticks after boot);
/// None if there is no such process.
pub fn proc_start_time(pid: i32) -> Option<u64> {
    parse_start_time(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Field 22 of a /proc/<pid>/stat line; the command (field 2) may hold spaces and parens.
pub(crate) fn parse_start_time(stat: &str) -> Option<u64> {
    let after = &stat[stat.rfind(')')? + 1..];
    // Fields 3.. follow the command: field 22 is the 20th of them.
    after.split_whitespace().nth(19)?.parse().ok()
}

/// Parent pid (field 4 of /proc/<pid>/stat).
pub(crate) fn proc_parent(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(1)?.parse().ok()
}

pub(crate) fn now_unix_ms() -> u64 {
    (crate::now_nanos() / 1_000_000) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(id: u64) -> LaunchSpec {
        serde_json::from_value(serde_json::json!({
            "id": id, "name": "t", "user": {"uid": 1000, "gid": 1000, "groups": [10], "name": "u"},
            "env": [["A", "b"]], "cwd": "/", "script": "#!/bin/sh\ntrue\n", "stdout": "/o", "stderr": "/e",
            "allocation": {"node_id": 0, "node": "n", "cpus": "0-1", "cores": 2, "mems": "0", "memory_bytes": 1024},
            "nodes": [["n", 2]], "walltime_seconds": 60, "kill_grace_ms": 100
        }))
        .unwrap()
    }

    #[test]
    fn concurrent_lease_saves_all_succeed_and_the_latest_renewal_stays() {
        let tmp = tempfile::tempdir().unwrap();
        let r = std::sync::Arc::new(Records::open(tmp.path()).unwrap());
        // Renewals saved by 8 tasks at once, in no particular order (they once shared the
        // temporary file unguarded: "cannot record the lease: No such file or directory").
        let threads: Vec<_> = (0..8u64)
            .map(|t| {
                let r = r.clone();
                std::thread::spawn(move || {
                    for i in 0..50u64 {
                        let at = 1_000 + i * 8 + t;
                        r.save_lease(&HeldLease { lease_ms: 2000, renewed_unix_ms: at }).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(r.load_lease().map(|l| l.renewed_unix_ms), Some(1_000 + 49 * 8 + 7));
        // An older renewal arriving late leaves the newer one in place.
        r.save_lease(&HeldLease { lease_ms: 2000, renewed_unix_ms: 5 }).unwrap();
        assert_eq!(r.load_lease().map(|l| l.renewed_unix_ms), Some(1_000 + 49 * 8 + 7));
        r.forget_lease();
        assert!(r.load_lease().is_none());
        r.save_lease(&HeldLease { lease_ms: 2000, renewed_unix_ms: 5 }).unwrap();
        assert_eq!(r.load_lease().map(|l| l.renewed_unix_ms), Some(5));
    }

    #[test]
    fn step_ends_are_kept_until_acknowledged() {
        let tmp = tempfile::tempdir().unwrap();
        let r = Records::open(tmp.path()).unwrap();
        let end = |job: u64, step: u32| AgentMessage::StepEnded {
            job: JobId(job),
            step,
            exit_code: 137,
            failure: Some("rank 0 on n killed by signal 9".into()),
        };
        r.save_step_end(JobId(9), 2, &end(9, 2)).unwrap();
        r.save_step_end(JobId(3), 1, &end(3, 1)).unwrap();
        // A file that is not a step end, and a torn write: removed, never resent.
        std::fs::write(tmp.path().join("step_ends/4.1.json"), "{\"op\":\"heartbeat\",\"running\":[]}").unwrap();
        std::fs::write(tmp.path().join("step_ends/5.1.json.tmp"), "{").unwrap();
        let loaded = r.load_step_ends();
        assert_eq!(loaded, vec![((JobId(3), 1), end(3, 1)), ((JobId(9), 2), end(9, 2))]);
        assert_eq!(std::fs::read_dir(tmp.path().join("step_ends")).unwrap().count(), 2);
        r.forget_step_end(JobId(9), 2);
        assert_eq!(r.load_step_ends(), vec![((JobId(3), 1), end(3, 1))]);
    }

    #[test]
    fn records_round_trip_and_forget() {
        let tmp = tempfile::tempdir().unwrap();
        let r = Records::open(tmp.path()).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!(std::fs::metadata(tmp.path().join("jobs")).unwrap().mode() & 0o777, 0o700);
        let rec = LocalJobRecord {
            spec: spec(7),
            shim_pid: Some(1234),
            shim_start_time: Some(99),
            started_unix_ms: 1_700_000_000_000,
            cgroup: "job_7".into(),
            cpuset_dir: "/sys/fs/cgroup/cpuset/berth/n/job_7".into(),
            spool: "/tmp/berth/n/7".into(),
        };
        r.save_job(&rec).unwrap();
        let mut other = rec.clone();
        other.spec = spec(12);
        other.shim_pid = None;
        r.save_job(&other).unwrap();
        assert_eq!(r.load_jobs(), vec![rec.clone(), other.clone()]);
        let out = JobOutcome { exit_code: Some(7), wall_ms: 10, ..Default::default() };
        r.save_ended(JobId(7), &out).unwrap();
        assert_eq!(r.load_ended(), vec![(JobId(7), out)]);
        // Garbage and leftovers of an unfinished write are dropped.
        std::fs::write(tmp.path().join("jobs/13.json"), "{not json").unwrap();
        std::fs::write(tmp.path().join("jobs/14.json.tmp"), "{").unwrap();
        assert_eq!(r.load_jobs().len(), 2);
        assert!(!tmp.path().join("jobs/13.json").exists() && !tmp.path().join("jobs/14.json.tmp").exists());
        r.forget(JobId(7));
        assert_eq!(r.load_jobs(), vec![other]);
        assert!(r.load_ended().is_empty());
        r.forget(JobId(12));
        assert!(r.load_jobs().is_empty());
    }

    #[test]
    fn ends_outlive_a_restart_until_acknowledged() {
        let tmp = tempfile::tempdir().unwrap();
        let out = |code: i32| JobOutcome {
            exit_code: Some(code),
            wall_ms: 5,
            reason: Some("a\nb".into()),
            ..Default::default()
        };
        {
            let r = Records::open(tmp.path()).unwrap();
            for id in [3, 1, 2] {
                r.save_ended(JobId(id), &out(id as i32)).unwrap();
            }
            r.forget(JobId(1));
            r.forget(JobId(9)); // never ended here: nothing logged
        }
        // A write cut off by a crash: its unfinished line is skipped.
        let log = tmp.path().join(LOG_NAME);
        std::fs::OpenOptions::new().append(true).open(&log).unwrap().write_all(b"E 4 {\"exit_co").unwrap();
        let r = Records::open(tmp.path()).unwrap();
        assert_eq!(r.load_ended(), vec![(JobId(2), out(2)), (JobId(3), out(3))]);
        // Rewritten at open: the unacknowledged ends only, whole lines.
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(text.ends_with('\n') && text.lines().count() == 2 && !text.contains("A "), "{text}");
        // Appends after the rewrite are whole lines again.
        r.save_ended(JobId(4), &out(4)).unwrap();
        r.forget(JobId(2));
        drop(r);
        let r = Records::open(tmp.path()).unwrap();
        assert_eq!(r.load_ended(), vec![(JobId(3), out(3)), (JobId(4), out(4))]);
        use std::os::unix::fs::MetadataExt;
        assert_eq!(std::fs::metadata(&log).unwrap().mode() & 0o777, 0o600);
    }

    #[test]
    fn an_older_agents_end_files_are_taken_over() {
        let tmp = tempfile::tempdir().unwrap();
        let ended = tmp.path().join("ended");
        std::fs::create_dir(&ended).unwrap();
        let out = JobOutcome { signal: Some(9), ..Default::default() };
        std::fs::write(ended.join("12.json"), serde_json::to_vec(&out).unwrap()).unwrap();
        std::fs::write(ended.join("13.json.tmp"), "{").unwrap();
        let r = Records::open(tmp.path()).unwrap();
        assert_eq!(r.load_ended(), vec![(JobId(12), out.clone())]);
        assert!(!ended.exists(), "moved into the log");
        drop(r);
        let r = Records::open(tmp.path()).unwrap();
        assert_eq!(r.load_ended(), vec![(JobId(12), out)]);
        r.forget(JobId(12));
        assert!(r.load_ended().is_empty());
    }

    #[test]
    fn the_log_is_compacted_as_it_grows() {
        let tmp = tempfile::tempdir().unwrap();
        let r = Records::open(tmp.path()).unwrap();
        let out = JobOutcome { exit_code: Some(0), reason: Some("x".repeat(4000)), ..Default::default() };
        let per_job = end_line(JobId(1), &out).unwrap().len() as u64;
        let jobs = 3 * LOG_COMPACT_BYTES / per_job;
        for id in 1..=jobs {
            r.save_ended(JobId(id), &out).unwrap();
            if id != 7 {
                r.forget(JobId(id));
            }
        }
        let size = std::fs::metadata(tmp.path().join(LOG_NAME)).unwrap().len();
        assert!(size < LOG_COMPACT_BYTES + 2 * per_job, "{size} bytes after {jobs} jobs");
        assert_eq!(r.load_ended(), vec![(JobId(7), out.clone())]);
        drop(r);
        assert_eq!(Records::open(tmp.path()).unwrap().load_ended(), vec![(JobId(7), out)]);
    }

    #[test]
    fn start_time_field() {
        let line = "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_start_time(line), Some(987654));
        assert_eq!(parse_start_time("1 (x) S 0"), None);
        let me = std::process::id() as i32;
        assert!(proc_start_time(me).is_some());
        assert_eq!(proc_parent(me), Some(std::os::unix::process::parent_id() as i32));
    }
}
