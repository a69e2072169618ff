//! The agent's resident memory while idle: the pages of code and read-only data its start-up
//! touched (argument parsing, the topology, cgroup set-up, re-adoption) and a job's launch
//! path stay mapped, and the kernel maps them in 64 KB pieces (fault-around): most of an idle
//! agent's RSS is its own binary (BENCHMARKS.md, issue 18). When the node is idle, the agent
//! unmaps its clean read-only file pages ([`drop_clean_file_pages`]); what it runs next is
//! mapped again from the page cache (minor faults), and only that stays resident.
//!
//! Only mappings that can be re-read from their file unchanged are dropped: private,
//! read-only (`r--p`, `r-xp`), of a file, holding no anonymous (copied) page. The relocated
//! read-only data of a position-independent binary (RELRO: written by the loader, then made
//! read-only) holds anonymous pages and is kept.

use std::path::Path;

/// One mapping of `/proc/self/smaps` whose pages may be dropped: `[start, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Droppable {
    pub start: usize,
    pub end: usize,
    /// Its resident size (kB) when read.
    pub rss_kb: u64,
}

/// What [`drop_clean_file_pages`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Dropped {
    /// Mappings unmapped.
    pub mappings: usize,
    /// Their resident size before (kB).
    pub kb: u64,
}

/// The mappings of an smaps text (`/proc/PID/smaps`) whose pages can be dropped and read
/// again from their files unchanged: private, not writable, file-backed, no anonymous page,
/// not locked, and resident now.
pub fn droppable(smaps: &str) -> Vec<Droppable> {
    /// The mapping being read, its header having qualified.
    struct Reading {
        start: usize,
        end: usize,
        rss_kb: Option<u64>,
        anonymous_kb: Option<u64>,
        locked: bool,
    }
    let mut out = Vec::new();
    let mut cur: Option<Reading> = None;
    let finish = |c: Option<Reading>, out: &mut Vec<Droppable>| {
        if let Some(Reading { start, end, rss_kb: Some(rss_kb), anonymous_kb: Some(0), locked: false }) = c {
            if rss_kb > 0 {
                out.push(Droppable { start, end, rss_kb });
            }
        }
    };
    for line in smaps.lines() {
        let mut fields = line.split_ascii_whitespace();
        let Some(first) = fields.next() else { continue };
        if let Some((lo, hi)) = first.split_once('-').filter(|_| !first.ends_with(':')) {
            finish(cur.take(), &mut out);
            let (Ok(start), Ok(end)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16)) else {
                continue;
            };
            let perms = fields.next().unwrap_or("");
            let _offset = fields.next();
            let _dev = fields.next();
            let inode = fields.next().unwrap_or("0");
            let path = fields.next().unwrap_or("");
            let clean_kind = perms == "r--p" || perms == "r-xp";
            if clean_kind && inode != "0" && path.starts_with('/') && end > start {
                cur = Some(Reading { start, end, rss_kb: None, anonymous_kb: None, locked: false });
            }
            continue;
        }
        let Some(c) = cur.as_mut() else { continue };
        let value = || fields.clone().next().and_then(|v| v.parse::<u64>().ok());
        match first {
            "Rss:" => c.rss_kb = value(),
            "Anonymous:" => c.anonymous_kb = value(),
            // A locked mapping refuses MADV_DONTNEED (and is locked to stay resident).
            "Locked:" => c.locked = value().is_none_or(|kb| kb > 0),
            "VmFlags:" => c.locked |= fields.clone().any(|f| f == "lo"),
            _ => {}
        }
    }
    finish(cur.take(), &mut out);
    out
}

/// Unmap the resident pages of this process's clean read-only file mappings ([`droppable`]):
/// its own code and constants, and the shared libraries'. They are mapped again, from the
/// page cache, when next used. Errors are reported, never fatal: nothing changes then.
pub fn drop_clean_file_pages() -> std::io::Result<Dropped> {
    drop_in(Path::new("/proc/self/smaps"))
}

fn drop_in(smaps: &Path) -> std::io::Result<Dropped> {
    let text = std::fs::read_to_string(smaps)?;
    let mut done = Dropped::default();
    for m in droppable(&text) {
        // SAFETY: [start, end) is a whole mapping of this process, private, read-only and of
        // a file, with no anonymous page (checked above from smaps; read-only mappings gain
        // none: nothing writes them). MADV_DONTNEED on such a mapping only unmaps its pages:
        // the next access maps the same bytes from the file again. No memory is freed that
        // Rust code owns.
        let rc = unsafe { libc::madvise(m.start as *mut libc::c_void, m.end - m.start, libc::MADV_DONTNEED) };
        if rc == 0 {
            done.mappings += 1;
            done.kb += m.rss_kb;
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
55d0a0000000-55d0a0400000 r--p 00000000 fe:00 1234                       /usr/sbin/berthd
Size:               4096 kB
Rss:                1792 kB
Anonymous:             0 kB
Locked:                0 kB
VmFlags: rd mr mw me sd
55d0a0400000-55d0a1000000 r-xp 00400000 fe:00 1234                       /usr/sbin/berthd
Size:              12288 kB
Rss:                7648 kB
Anonymous:             0 kB
Locked:                0 kB
VmFlags: rd ex mr mw me sd
55d0a1000000-55d0a1070000 r--p 01000000 fe:00 1234                       /usr/sbin/berthd
Size:                448 kB
Rss:                 460 kB
Anonymous:           460 kB
Locked:                0 kB
VmFlags: rd mr mw me ac sd
55d0a1070000-55d0a1077000 rw-p 01070000 fe:00 1234                       /usr/sbin/berthd
Size:                 28 kB
Rss:                  28 kB
Anonymous:            28 kB
Locked:                0 kB
VmFlags: rd wr mr mw me ac sd
55d0a2000000-55d0a2040000 rw-p 00000000 00:00 0                          [heap]
Size:                256 kB
Rss:                 204 kB
Anonymous:           204 kB
Locked:                0 kB
VmFlags: rd wr mr mw me ac sd
7f0000000000-7f0000100000 r-xp 00028000 fe:00 99                         /usr/lib/x86_64-linux-gnu/libc.so.6
Size:               1024 kB
Rss:                1048 kB
Anonymous:             0 kB
Locked:                0 kB
VmFlags: rd ex mr mw me sd
7f0000200000-7f0000210000 r-xp 00000000 fe:00 98                         /usr/lib/locked.so
Size:                 64 kB
Rss:                  64 kB
Anonymous:             0 kB
Locked:               64 kB
VmFlags: rd ex mr mw me lo sd
7f0000300000-7f0000310000 r--p 00000000 fe:00 97                         /usr/lib/cold.so
Size:                 64 kB
Rss:                   0 kB
Anonymous:             0 kB
Locked:                0 kB
VmFlags: rd mr mw me sd
7f0000400000-7f0000401000 r--s 00000000 00:05 96                         /dev/shm/shared
Size:                  4 kB
Rss:                   4 kB
Anonymous:             0 kB
Locked:                0 kB
VmFlags: rd mr me ms sd
7ffd00000000-7ffd00002000 r-xp 00000000 00:00 0                          [vdso]
Size:                  8 kB
Rss:                   8 kB
Anonymous:             0 kB
Locked:                0 kB
VmFlags: rd ex mr mw me de sd
";

    #[test]
    fn only_clean_private_read_only_file_mappings_are_dropped() {
        let got = droppable(SMAPS);
        assert_eq!(
            got,
            vec![
                Droppable { start: 0x55d0a0000000, end: 0x55d0a0400000, rss_kb: 1792 },
                Droppable { start: 0x55d0a0400000, end: 0x55d0a1000000, rss_kb: 7648 },
                Droppable { start: 0x7f0000000000, end: 0x7f0000100000, rss_kb: 1048 },
            ],
            "kept: RELRO (anonymous pages), writable, heap, locked, not resident, shared, vdso"
        );
    }

    #[test]
    fn a_mapping_without_its_anonymous_line_is_kept() {
        // An smaps of another shape (fields missing): nothing is assumed clean.
        let text = "7f0000000000-7f0000100000 r-xp 00000000 fe:00 99 /usr/lib/x.so\nRss: 64 kB\n";
        assert!(droppable(text).is_empty());
        assert!(droppable("").is_empty());
        assert!(droppable("garbage-line with words\nRss: 12 kB\n").is_empty());
    }

    #[test]
    fn dropped_pages_read_back_the_same_bytes() {
        use std::io::Write;
        use std::os::fd::AsRawFd;
        let dir = std::env::temp_dir().join(format!("berth-resident-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("data");
        let len = 1 << 20;
        let bytes: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::File::create(&path).unwrap().write_all(&bytes).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        // SAFETY: a private read-only mapping of a file we made; unmapped below.
        let ptr =
            unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_PRIVATE, file.as_raw_fd(), 0) };
        assert_ne!(ptr, libc::MAP_FAILED);
        // SAFETY: `len` readable bytes at `ptr` while mapped.
        let view = unsafe { std::slice::from_raw_parts(ptr as *const u8, len) };
        let sum = |v: &[u8]| v.iter().map(|b| u64::from(*b)).sum::<u64>();
        let expected = sum(&bytes);
        assert_eq!(sum(view), expected);
        let start = ptr as usize;
        let resident = |start: usize| {
            let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
            droppable(&smaps).iter().find(|d| d.start == start).map_or(0, |d| d.rss_kb)
        };
        assert!(resident(start) >= 1024, "the whole mapping was read: resident");
        let done = drop_clean_file_pages().unwrap();
        assert!(done.mappings >= 1 && done.kb >= 1024, "{done:?}");
        assert_eq!(resident(start), 0, "the mapping's pages were dropped");
        assert_eq!(sum(view), expected, "the same bytes again, from the file");
        // SAFETY: the mapping made above, not used after.
        unsafe { libc::munmap(ptr, len) };
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
