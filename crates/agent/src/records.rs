//! What the agent keeps on disk about its jobs, so that a restarted agent re-adopts the jobs
//! still running in its cgroups and reports those that ended while it was down.
//!
//! In the agent's state directory (root only):
//! - `jobs/<id>.json`: a [`LocalJobRecord`], written once the job is set up (its shim started);
//! - `ended/<id>.json`: the [`JobOutcome`] of a job that ended here and whose end the
//!   controller has not acknowledged yet.
//!
//! - `step_ends/<job>.<step>.json`: a step's end as its control tree's root reported it
//!   (`step_ended`), until the controller acknowledges it (`StepEndAck`).
//!
//! The first two are removed when the controller acknowledges the end (`EndAck`). Every file is
//! written to a temporary name and renamed into place; an outcome is also synced (file and
//! directory): it is the only trace of the job's end if the node loses power before the
//! controller has it. A job record is not (see `save_job`).

use berth_core::job::JobOutcome;
use berth_core::JobId;
use berth_protocol::agent::{AgentMessage, LaunchSpec};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

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

/// The `jobs/` and `ended/` directories of an agent's state directory.
#[derive(Debug)]
pub struct Records {
    jobs: PathBuf,
    ended: PathBuf,
    step_ends: PathBuf,
    /// The renewal time of the lease last written, held while one is written: renewals are
    /// saved by concurrent tasks through one temporary file, and an older renewal must never
    /// replace a newer one.
    lease_written: std::sync::Mutex<Option<u64>>,
}

impl Records {
    /// Make (root only, 0700) the directories under `state_dir`.
    pub fn open(state_dir: &Path) -> std::io::Result<Records> {
        let r = Records {
            jobs: state_dir.join("jobs"),
            ended: state_dir.join("ended"),
            step_ends: state_dir.join("step_ends"),
            lease_written: std::sync::Mutex::new(None),
        };
        for d in [&r.jobs, &r.ended, &r.step_ends] {
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(d)?;
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700))?;
        }
        Ok(r)
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

    pub fn save_ended(&self, id: JobId, outcome: &JobOutcome) -> std::io::Result<()> {
        let bytes = serde_json::to_vec(outcome).map_err(std::io::Error::other)?;
        write_atomically(&self.ended, &file_name(id), &bytes, true)
    }

    /// The job's end was acknowledged: nothing about it is kept. Only the end record's removal
    /// is synced: the job record never was (see [`Records::save_job`]), so syncing its removal
    /// would promise nothing (one fsync less per job).
    pub fn forget(&self, id: JobId) {
        for (d, durably) in [(&self.jobs, false), (&self.ended, true)] {
            match std::fs::remove_file(d.join(file_name(id))) {
                Ok(()) if durably => sync_dir(d),
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => tracing::warn!(job = %id, "cannot remove the record in {}: {e}", d.display()),
            }
        }
    }

    /// Every readable job record; unreadable ones are logged and removed.
    pub fn load_jobs(&self) -> Vec<LocalJobRecord> {
        load::<LocalJobRecord>(&self.jobs).into_iter().map(|(_, r)| r).collect()
    }

    /// Every ended-but-unacknowledged outcome.
    pub fn load_ended(&self) -> Vec<(JobId, JobOutcome)> {
        load(&self.ended)
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
    fn start_time_field() {
        let line = "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_start_time(line), Some(987654));
        assert_eq!(parse_start_time("1 (x) S 0"), None);
        let me = std::process::id() as i32;
        assert!(proc_start_time(me).is_some());
        assert_eq!(proc_parent(me), Some(std::os::unix::process::parent_id() as i32));
    }
}
