//! The write-ahead log kept at least [`WAL_PREALLOCATED`] long, zero-filled past its frames.
//!
//! Every durable commit ends with an fdatasync of the WAL. While the commit's frames extend the
//! file, that fdatasync must also write the file's new size and block map (the inode; on a
//! journaling filesystem, a journal commit shared with every other file's metadata change of
//! the moment, e.g. agents' spool directories on the same host). Frames written over blocks
//! the file already has need only the data flush. Measured on this machine's ext4 (which runs
//! without a journal: `ext4_fsync_nojournal` in perf) with a process making and removing small
//! directories meanwhile: fdatasync after a 12 KB append 530-570 µs median, after a 12 KB
//! overwrite 130 µs (BENCHMARKS.md, issue 4). Databases preallocate their logs for this reason
//! (PostgreSQL zero-fills each WAL segment before use).
//!
//! Safe for SQLite: it reads frames from the start of the WAL until one fails its salt or
//! checksum, so zeros after the last frame end the log as its own stale frames after a restart
//! do; an all-zero header is an empty WAL. Its writer overwrites the file from the start after
//! each checkpoint and does not truncate it (no `journal_size_limit`), so the size stays.

use std::io::Write;
use std::path::{Path, PathBuf};

/// A little more than the WAL reaches between automatic checkpoints (1,000 pages of 4 KB
/// plus frame headers).
pub const WAL_PREALLOCATED: u64 = 8 << 20;

/// How much WAL to preallocate with `free` bytes free on its filesystem: at most a quarter of
/// them (whole MiB), none under 1 MiB: a nearly full disk is left to the commits themselves.
pub fn budget(free: u64) -> u64 {
    const MIB: u64 = 1 << 20;
    let quarter = (free / 4) / MIB * MIB;
    if quarter < MIB {
        0
    } else {
        quarter.min(WAL_PREALLOCATED)
    }
}

fn wal_path(db: &Path) -> PathBuf {
    let mut wal = db.as_os_str().to_os_string();
    wal.push("-wal");
    PathBuf::from(wal)
}

/// Extend `db`'s WAL with zeros to `bytes` (never touching what is there), and make that
/// durable. Real zeros, not fallocate: blocks fallocate leaves unwritten turn written on the
/// first overwrite, a metadata change again. A new file is made 0600 (the state is private);
/// on a write error (the disk filled meanwhile) the file is cut back to its length before.
pub fn preallocate(db: &Path, bytes: u64) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = wal_path(db);
    if bytes == 0 {
        return Ok(());
    }
    let mut f = std::fs::OpenOptions::new().create(true).append(true).mode(0o600).open(&path)?;
    let before = f.metadata()?.len();
    let mut len = before;
    if len >= bytes {
        return Ok(());
    }
    let zeros = vec![0u8; 1 << 20];
    while len < bytes {
        let n = ((bytes - len) as usize).min(zeros.len());
        if let Err(e) = f.write_all(&zeros[..n]) {
            let _ = f.set_len(before);
            return Err(e);
        }
        len += n as u64;
    }
    f.sync_all()?;
    // The file may be new: its directory entry too.
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::Connection;

    fn count(c: &Connection) -> i64 {
        c.query_row("SELECT count(*) FROM t", [], |r| r.get(0)).unwrap()
    }

    #[test]
    fn sqlite_keeps_every_commit_across_zero_padding_crashes_and_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("state.db");
        let c = Connection::open(&db).unwrap();
        c.execute_batch("PRAGMA journal_mode=WAL; CREATE TABLE t (x INTEGER)").unwrap();
        for i in 0..50 {
            c.execute("INSERT INTO t VALUES (?1)", [i]).unwrap();
        }
        // Padded behind live frames (a controller restarting after a crash).
        preallocate(&db, WAL_PREALLOCATED).unwrap();
        assert_eq!(std::fs::metadata(wal_path(&db)).unwrap().len(), WAL_PREALLOCATED);
        for i in 50..100 {
            c.execute("INSERT INTO t VALUES (?1)", [i]).unwrap();
        }
        // A crash: the connection is leaked, nothing checkpointed; another opens the files.
        std::mem::forget(c);
        let c = Connection::open(&db).unwrap();
        assert_eq!(count(&c), 100, "every frame before and after the padding is read back");
        // Many checkpoints later the file has kept its size, and everything is there.
        for i in 100..20_000 {
            c.execute("INSERT INTO t VALUES (?1)", [i]).unwrap();
        }
        assert_eq!(std::fs::metadata(wal_path(&db)).unwrap().len(), WAL_PREALLOCATED);
        assert_eq!(count(&c), 20_000);
        assert_eq!(c.query_row("PRAGMA quick_check", [], |r| r.get::<_, String>(0)).unwrap(), "ok");
        drop(c);
        // A WAL made of zeros only (made before SQLite's first write) is an empty log.
        let other = dir.path().join("fresh.db");
        preallocate(&other, 1 << 20).unwrap();
        let c = Connection::open(&other).unwrap();
        c.execute_batch("PRAGMA journal_mode=WAL; CREATE TABLE t (x INTEGER); INSERT INTO t VALUES (1)").unwrap();
        std::mem::forget(c);
        let c = Connection::open(&other).unwrap();
        assert_eq!(count(&c), 1);
        // Never shrinks nor rewrites what is there.
        let before = std::fs::read(wal_path(&db)).ok();
        preallocate(&db, 1 << 20).unwrap();
        assert_eq!(std::fs::read(wal_path(&db)).ok(), before);
    }

    #[test]
    fn a_nearly_full_disk_gets_a_smaller_wal_or_none() {
        const MIB: u64 = 1 << 20;
        assert_eq!(budget(u64::MAX), WAL_PREALLOCATED);
        assert_eq!(budget(100 * MIB), WAL_PREALLOCATED);
        assert_eq!(budget(12 * MIB), 3 * MIB);
        assert_eq!(budget(3 * MIB), 0, "3 MB free: no preallocation");
        assert_eq!(budget(0), 0);
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("state.db");
        preallocate(&db, 0).unwrap();
        assert!(!wal_path(&db).exists(), "nothing made for a budget of 0");
        preallocate(&db, MIB).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(wal_path(&db)).unwrap().permissions().mode() & 0o777, 0o600);
    }
}
