//! Device containment on cgroup v2: a `BPF_PROG_TYPE_CGROUP_DEVICE` program attached to the
//! job's cgroup (docs/gpus.md, "Containment"), as runc and crun make theirs, without libbpf.
//!
//! cgroup v2 has no `devices.allow`/`devices.deny` files: on every open or mknod of a device
//! node the kernel runs the eBPF programs attached to the opener's cgroup and its ancestors
//! (attached with `BPF_F_ALLOW_MULTI`, all of them must allow). The program gets a
//! `struct bpf_cgroup_dev_ctx { u32 access_type; u32 major; u32 minor; }` (access_type:
//! `access << 16 | type`) and returns 1 to allow, 0 to deny (the open fails with `EPERM`).
//!
//! [`assemble`] turns a rule list into raw instructions (pure, unit-tested); [`load`] and
//! [`attach`] are the `bpf(2)` calls, the only unsafe code here (module `sys`). The program
//! needs no helper function, so no GPL license: it is loaded as "Apache-2.0", berth's.
//! Removing the cgroup (rmdir) detaches and frees its programs: nothing else to clean up.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

/// `BPF_DEVCG_ACC_*`: what a process does with the device.
pub const ACC_MKNOD: u32 = 1;
pub const ACC_READ: u32 = 2;
pub const ACC_WRITE: u32 = 4;
/// All three: `rwm`.
pub const ACC_ALL: u32 = ACC_MKNOD | ACC_READ | ACC_WRITE;

/// The most rules a program takes (each is at most 9 instructions; the kernel's limit for a
/// privileged loader is 1M): far above a node's GPU device files.
pub const MAX_RULES: usize = 10_000;

/// `BPF_DEVCG_DEV_*`: the kind of device a rule is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DevKind {
    Block,
    Char,
    /// Both.
    Any,
}

/// One rule; the first rule matching a request decides it, else the program's default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceRule {
    pub allow: bool,
    pub kind: DevKind,
    /// None: every major.
    pub major: Option<u32>,
    /// None: every minor.
    pub minor: Option<u32>,
    /// `ACC_*` bits. An allow rule matches a request asking for no more than these; a deny
    /// rule matches one asking for any of them (as v1's `devices.deny`: `c 195:1 r` denies a
    /// read-write open).
    pub access: u32,
}

impl DeviceRule {
    /// Deny every access to character device `major:minor` (v1's `c MAJ:MIN rwm` deny).
    pub fn deny_char(major: u32, minor: u32) -> DeviceRule {
        DeviceRule { allow: false, kind: DevKind::Char, major: Some(major), minor: Some(minor), access: ACC_ALL }
    }
}

/// Errors of the device filter. `Load` carries the verifier's log, `Sys` the failed call.
#[derive(Debug, thiserror::Error)]
pub enum DeviceFilterError {
    #[error("device filter of {count} rules: more than {MAX_RULES}")]
    TooManyRules { count: usize },
    #[error("device rule access bits {access:#x} outside rwm")]
    BadAccess { access: u32 },
    #[error("device number {number} in a device rule is out of range")]
    BadNumber { number: u32 },
    #[error(
        "bpf(BPF_PROG_LOAD) of the device filter failed: {source}{}; \
             needs root (CAP_BPF or CAP_SYS_ADMIN) and a kernel with CONFIG_CGROUP_BPF",
        log_note(log)
    )]
    Load { source: std::io::Error, log: String },
    #[error("cannot open cgroup {} for the device filter: {source}", path.display())]
    Open { path: PathBuf, source: std::io::Error },
    #[error("bpf({call}) on cgroup {} failed: {source}", path.display())]
    Sys { call: &'static str, path: PathBuf, source: std::io::Error },
}

fn log_note(log: &str) -> String {
    let log = log.trim();
    if log.is_empty() {
        String::new()
    } else {
        format!(" (verifier: {})", log.lines().last().unwrap_or_default())
    }
}

/// One eBPF instruction, `struct bpf_insn`: opcode, dst/src registers (4 bits each, dst low),
/// signed offset, signed immediate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct Insn {
    pub code: u8,
    pub regs: u8,
    pub off: i16,
    pub imm: i32,
}

// Opcodes (include/uapi/linux/bpf.h, bpf_common.h).
const LDX_MEM_W: u8 = 0x61; // BPF_LDX | BPF_MEM | BPF_W
const ALU32_AND_K: u8 = 0x54; // BPF_ALU | BPF_AND | BPF_K
const ALU32_RSH_K: u8 = 0x74; // BPF_ALU | BPF_RSH | BPF_K
const ALU32_MOV_X: u8 = 0xbc; // BPF_ALU | BPF_MOV | BPF_X
const ALU64_MOV_K: u8 = 0xb7; // BPF_ALU64 | BPF_MOV | BPF_K
const JMP_JEQ_K: u8 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
const JMP_JNE_K: u8 = 0x55; // BPF_JMP | BPF_JNE | BPF_K
const EXIT: u8 = 0x95; // BPF_JMP | BPF_EXIT

// Registers: R1 is the context on entry; R2 type, R3 access, R4 major, R5 minor.
const R0: u8 = 0;
const R1: u8 = 1;
const R2: u8 = 2;
const R3: u8 = 3;
const R4: u8 = 4;
const R5: u8 = 5;

fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn { code, regs: dst | (src << 4), off, imm }
}

/// The program for `rules` (first match decides) and `default_allow` when none matches.
pub fn assemble(rules: &[DeviceRule], default_allow: bool) -> Result<Vec<Insn>, DeviceFilterError> {
    if rules.len() > MAX_RULES {
        return Err(DeviceFilterError::TooManyRules { count: rules.len() });
    }
    if let Some(r) = rules.iter().find(|r| r.access & !ACC_ALL != 0 || r.access == 0) {
        return Err(DeviceFilterError::BadAccess { access: r.access });
    }
    // Immediates are sign-extended to 64 bits before the kernel compares them with a register
    // holding a u32, so a number above i32::MAX could never match: refused (device numbers
    // are 12-bit majors and 20-bit minors).
    let imm = |v: u32| i32::try_from(v).map_err(|_| DeviceFilterError::BadNumber { number: v });
    let mut out = vec![
        insn(LDX_MEM_W, R2, R1, 0, 0), // R2 = ctx->access_type & 0xffff: the kind
        insn(ALU32_AND_K, R2, 0, 0, 0xffff),
        insn(LDX_MEM_W, R3, R1, 0, 0), // R3 = ctx->access_type >> 16: the access
        insn(ALU32_RSH_K, R3, 0, 0, 16),
        insn(LDX_MEM_W, R4, R1, 4, 0), // R4 = ctx->major
        insn(LDX_MEM_W, R5, R1, 8, 0), // R5 = ctx->minor
    ];
    for rule in rules {
        // A block: its tests, each jumping past the block's end when the rule does not match,
        // then "r0 = allow; exit". Offsets count from the instruction after the jump.
        let mut block: Vec<Insn> = Vec::new();
        let mut skips: Vec<usize> = Vec::new(); // indexes of the jumps in `block`
        let mut test = |block: &mut Vec<Insn>, op: u8, reg: u8, value: i32| {
            skips.push(block.len());
            block.push(insn(op, reg, 0, 0, value));
        };
        match rule.kind {
            DevKind::Block => test(&mut block, JMP_JNE_K, R2, 1),
            DevKind::Char => test(&mut block, JMP_JNE_K, R2, 2),
            DevKind::Any => {}
        }
        // Every request asks for some access, so rwm matches all; else R1 = R3 & bits and an
        // allow rule skips when the request asks for more than it gives, a deny rule when it
        // asks for none of what it refuses.
        if rule.access != ACC_ALL {
            let (bits, skip_if) =
                if rule.allow { (!rule.access & ACC_ALL, JMP_JNE_K) } else { (rule.access, JMP_JEQ_K) };
            block.push(insn(ALU32_MOV_X, R1, R3, 0, 0));
            block.push(insn(ALU32_AND_K, R1, 0, 0, imm(bits)?));
            test(&mut block, skip_if, R1, 0);
        }
        if let Some(m) = rule.major {
            test(&mut block, JMP_JNE_K, R4, imm(m)?);
        }
        if let Some(m) = rule.minor {
            test(&mut block, JMP_JNE_K, R5, imm(m)?);
        }
        block.push(insn(ALU64_MOV_K, R0, 0, 0, i32::from(rule.allow)));
        block.push(insn(EXIT, 0, 0, 0, 0));
        let len = block.len();
        for at in skips {
            // At most 9 instructions a block: always fits.
            block[at].off = i16::try_from(len - at - 1).unwrap_or(i16::MAX);
        }
        out.extend(block);
    }
    out.push(insn(ALU64_MOV_K, R0, 0, 0, i32::from(default_allow)));
    out.push(insn(EXIT, 0, 0, 0, 0));
    Ok(out)
}

/// The program a job on a GPU node gets: `deny` (the node's GPUs it does not hold,
/// crate::gpu_devices::deny_rules) refused, every other device allowed, as v1's
/// `devices.deny` does (a deny list: why, in crate::gpu_devices::deny_rules).
pub fn deny_program(deny: &[(u32, u32)]) -> Result<Vec<Insn>, DeviceFilterError> {
    let rules: Vec<DeviceRule> = deny.iter().map(|&(major, minor)| DeviceRule::deny_char(major, minor)).collect();
    assemble(&rules, true)
}

/// Load `insns` as a cgroup device program; its fd is what [`attach`] takes.
pub fn load(insns: &[Insn]) -> Result<OwnedFd, DeviceFilterError> {
    sys::prog_load(insns).map_err(|(source, log)| DeviceFilterError::Load { source, log })
}

/// Whether device programs can be loaded here (root with CAP_BPF/CAP_SYS_ADMIN, a kernel
/// with CONFIG_CGROUP_BPF): an allow-all program loaded and dropped.
pub fn probe() -> Result<(), DeviceFilterError> {
    load(&assemble(&[], true)?).map(drop)
}

/// Attach program `prog` to the cgroup directory `dir` (`BPF_CGROUP_DEVICE`,
/// `BPF_F_ALLOW_MULTI`: added to the programs already there and to its ancestors', which
/// keep their say). The kernel holds the program from here: the caller may close `prog`.
pub fn attach(prog: &OwnedFd, dir: &Path) -> Result<(), DeviceFilterError> {
    let cg = open_dir(dir)?;
    sys::prog_attach(cg.as_raw_fd(), prog.as_raw_fd()).map_err(|source| DeviceFilterError::Sys {
        call: "BPF_PROG_ATTACH",
        path: dir.to_path_buf(),
        source,
    })
}

/// Load `insns` and attach them to `dir`; the program's fd is closed once attached.
pub fn load_and_attach(insns: &[Insn], dir: &Path) -> Result<(), DeviceFilterError> {
    let prog = load(insns)?;
    attach(&prog, dir)
}

/// The ids of the device programs attached to `dir` itself (`BPF_PROG_QUERY`).
pub fn attached(dir: &Path) -> Result<Vec<u32>, DeviceFilterError> {
    let cg = open_dir(dir)?;
    sys::prog_query(cg.as_raw_fd()).map_err(|source| DeviceFilterError::Sys {
        call: "BPF_PROG_QUERY",
        path: dir.to_path_buf(),
        source,
    })
}

/// Whether the kernel still has program `id` (a detached program is freed shortly after).
pub fn program_exists(id: u32) -> bool {
    sys::prog_get_fd_by_id(id).is_ok()
}

fn open_dir(dir: &Path) -> Result<std::fs::File, DeviceFilterError> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY)
        .open(dir)
        .map_err(|source| DeviceFilterError::Open { path: dir.to_path_buf(), source })
}

/// The `bpf(2)` calls: each fills its `union bpf_attr` member (a prefix of the union, which
/// the kernel accepts: it zero-fills the rest) and passes its size.
mod sys {
    use super::Insn;
    use std::io;
    use std::os::fd::{FromRawFd, OwnedFd, RawFd};

    const BPF_PROG_LOAD: libc::c_long = 5;
    const BPF_PROG_ATTACH: libc::c_long = 8;
    const BPF_PROG_QUERY: libc::c_long = 16;
    const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
    const BPF_PROG_TYPE_CGROUP_DEVICE: u32 = 15;
    const BPF_CGROUP_DEVICE: u32 = 6;
    const BPF_F_ALLOW_MULTI: u32 = 2;
    const LOG_SIZE: usize = 64 * 1024;

    #[repr(C)]
    #[derive(Default)]
    struct ProgLoad {
        prog_type: u32,
        insn_cnt: u32,
        insns: u64,
        license: u64,
        log_level: u32,
        log_size: u32,
        log_buf: u64,
        kern_version: u32,
        prog_flags: u32,
        prog_name: [u8; 16],
        prog_ifindex: u32,
        expected_attach_type: u32,
    }

    #[repr(C)]
    #[derive(Default)]
    struct ProgAttach {
        target_fd: u32,
        attach_bpf_fd: u32,
        attach_type: u32,
        attach_flags: u32,
        replace_bpf_fd: u32,
    }

    #[repr(C)]
    #[derive(Default)]
    struct ProgQuery {
        target_fd: u32,
        attach_type: u32,
        query_flags: u32,
        attach_flags: u32,
        prog_ids: u64,
        prog_cnt: u32,
    }

    #[repr(C)]
    #[derive(Default)]
    struct GetFdById {
        prog_id: u32,
        next_id: u32,
        open_flags: u32,
    }

    /// bpf(cmd, attr, sizeof attr).
    fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<libc::c_long> {
        // SAFETY: `attr` is a live, exclusively borrowed #[repr(C)] prefix of union bpf_attr
        // of the size passed; every pointer inside it (instructions, license, log, id array)
        // points to memory the caller keeps alive and writable for the call.
        let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut T, std::mem::size_of::<T>()) };
        if rc < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(rc)
        }
    }

    fn owned_fd(rc: libc::c_long) -> io::Result<OwnedFd> {
        let fd = RawFd::try_from(rc).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
        // SAFETY: the kernel just returned this new fd to us; nothing else owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    pub fn prog_load(insns: &[Insn]) -> Result<OwnedFd, (io::Error, String)> {
        let license = c"Apache-2.0";
        let mut name = [0u8; 16];
        name[..11].copy_from_slice(b"berth_devcg");
        let insn_cnt =
            u32::try_from(insns.len()).map_err(|_| (io::Error::from_raw_os_error(libc::E2BIG), String::new()))?;
        let mut attr = ProgLoad {
            prog_type: BPF_PROG_TYPE_CGROUP_DEVICE,
            insn_cnt,
            insns: insns.as_ptr() as u64,
            license: license.as_ptr() as u64,
            prog_name: name,
            ..ProgLoad::default()
        };
        match bpf(BPF_PROG_LOAD, &mut attr) {
            Ok(rc) => owned_fd(rc).map_err(|e| (e, String::new())),
            Err(first) => {
                // Again with the verifier's log, to say why.
                let mut log = vec![0u8; LOG_SIZE];
                attr.log_level = 1;
                attr.log_size = LOG_SIZE as u32;
                attr.log_buf = log.as_mut_ptr() as u64;
                match bpf(BPF_PROG_LOAD, &mut attr) {
                    Ok(rc) => owned_fd(rc).map_err(|e| (e, String::new())),
                    Err(_) => {
                        let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
                        Err((first, String::from_utf8_lossy(&log[..end]).into_owned()))
                    }
                }
            }
        }
    }

    fn fd_u32(fd: RawFd) -> io::Result<u32> {
        u32::try_from(fd).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))
    }

    pub fn prog_attach(cgroup: RawFd, prog: RawFd) -> io::Result<()> {
        let mut attr = ProgAttach {
            target_fd: fd_u32(cgroup)?,
            attach_bpf_fd: fd_u32(prog)?,
            attach_type: BPF_CGROUP_DEVICE,
            attach_flags: BPF_F_ALLOW_MULTI,
            ..ProgAttach::default()
        };
        bpf(BPF_PROG_ATTACH, &mut attr).map(drop)
    }

    pub fn prog_query(cgroup: RawFd) -> io::Result<Vec<u32>> {
        let mut ids = vec![0u32; 64];
        let mut attr = ProgQuery {
            target_fd: fd_u32(cgroup)?,
            attach_type: BPF_CGROUP_DEVICE,
            prog_ids: ids.as_mut_ptr() as u64,
            prog_cnt: ids.len() as u32,
            ..ProgQuery::default()
        };
        bpf(BPF_PROG_QUERY, &mut attr)?;
        ids.truncate((attr.prog_cnt as usize).min(64));
        Ok(ids)
    }

    pub fn prog_get_fd_by_id(id: u32) -> io::Result<OwnedFd> {
        let mut attr = GetFdById { prog_id: id, ..GetFdById::default() };
        bpf(BPF_PROG_GET_FD_BY_ID, &mut attr).and_then(owned_fd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An interpreter of the few instructions `assemble` emits, to check the programs'
    /// decisions without the kernel (the kernel runs them in `real_tests::v2_devices`).
    fn run(prog: &[Insn], kind: u32, access: u32, major: u32, minor: u32) -> u64 {
        let mut r = [0u64; 11];
        let ctx = [(access << 16) | kind, major, minor];
        let mut pc = 0usize;
        for _ in 0..10_000 {
            let i = prog[pc];
            let (dst, src) = ((i.regs & 0xf) as usize, (i.regs >> 4) as usize);
            pc += 1;
            match i.code {
                LDX_MEM_W => {
                    assert_eq!(src, 1);
                    r[dst] = u64::from(ctx[(i.off / 4) as usize]);
                }
                ALU32_AND_K => r[dst] = u64::from((r[dst] as u32) & (i.imm as u32)),
                ALU32_RSH_K => r[dst] = u64::from((r[dst] as u32) >> i.imm),
                ALU32_MOV_X => r[dst] = u64::from(r[src] as u32),
                ALU64_MOV_K => r[dst] = i.imm as i64 as u64,
                JMP_JEQ_K | JMP_JNE_K => {
                    let eq = r[dst] == i.imm as i64 as u64;
                    if eq == (i.code == JMP_JEQ_K) {
                        pc = (pc as i64 + i64::from(i.off)) as usize;
                    }
                }
                EXIT => return r[0],
                c => panic!("unexpected opcode {c:#x}"),
            }
        }
        panic!("no exit");
    }

    const CHAR: u32 = 2;
    const BLOCK: u32 = 1;

    #[test]
    fn a_deny_program_refuses_its_devices_and_allows_the_rest() {
        let p = deny_program(&[(195, 1), (226, 129)]).unwrap();
        assert_eq!(p.len(), 6 + 2 * 5 + 2, "type, major and minor tests, mov, exit");
        for acc in [ACC_READ, ACC_WRITE, ACC_MKNOD, ACC_READ | ACC_WRITE] {
            assert_eq!(run(&p, CHAR, acc, 195, 1), 0);
            assert_eq!(run(&p, CHAR, acc, 226, 129), 0);
            assert_eq!(run(&p, CHAR, acc, 195, 0), 1, "the job's own GPU");
            assert_eq!(run(&p, CHAR, acc, 1, 3), 1, "/dev/null");
            assert_eq!(run(&p, BLOCK, acc, 195, 1), 1, "a block device of the same numbers");
        }
        assert_eq!(run(&deny_program(&[]).unwrap(), CHAR, ACC_READ, 195, 1), 1);
    }

    #[test]
    fn allow_rules_give_no_more_than_their_access_and_wildcards_match_all() {
        let rules = [
            DeviceRule { allow: true, kind: DevKind::Char, major: Some(1), minor: Some(3), access: ACC_ALL },
            DeviceRule {
                allow: true,
                kind: DevKind::Char,
                major: Some(136),
                minor: None,
                access: ACC_READ | ACC_WRITE,
            },
            DeviceRule { allow: true, kind: DevKind::Any, major: None, minor: None, access: ACC_MKNOD },
            DeviceRule { allow: false, kind: DevKind::Char, major: Some(10), minor: Some(200), access: ACC_WRITE },
            DeviceRule { allow: true, kind: DevKind::Char, major: Some(10), minor: Some(200), access: ACC_ALL },
        ];
        let p = assemble(&rules, false).unwrap();
        assert_eq!(run(&p, CHAR, ACC_READ | ACC_WRITE, 1, 3), 1);
        assert_eq!(run(&p, BLOCK, ACC_READ, 1, 3), 0, "a char rule");
        assert_eq!(run(&p, CHAR, ACC_READ, 136, 7), 1, "any minor");
        assert_eq!(run(&p, CHAR, ACC_READ | ACC_MKNOD, 136, 7), 0, "mknod not given by the pts rule");
        assert_eq!(run(&p, BLOCK, ACC_MKNOD, 8, 0), 1, "mknod of anything");
        assert_eq!(run(&p, CHAR, ACC_READ, 10, 200), 1, "the deny rule is about writes");
        assert_eq!(run(&p, CHAR, ACC_READ | ACC_WRITE, 10, 200), 0, "first match decides");
        assert_eq!(run(&p, CHAR, ACC_READ, 195, 0), 0, "the default");
    }

    #[test]
    fn bad_rules_are_refused() {
        let r = DeviceRule { allow: true, kind: DevKind::Char, major: None, minor: None, access: 8 };
        assert!(matches!(assemble(&[r], true), Err(DeviceFilterError::BadAccess { access: 8 })));
        let r = DeviceRule { access: 0, ..r };
        assert!(matches!(assemble(&[r], true), Err(DeviceFilterError::BadAccess { access: 0 })));
        let many = vec![DeviceRule::deny_char(1, 1); MAX_RULES + 1];
        assert!(matches!(assemble(&many, true), Err(DeviceFilterError::TooManyRules { .. })));
        let huge = DeviceRule::deny_char(1, 1 << 31);
        assert!(matches!(assemble(&[huge], true), Err(DeviceFilterError::BadNumber { number: 0x8000_0000 })));
    }

    #[test]
    fn load_errors_say_what_is_needed() {
        let e = DeviceFilterError::Load {
            source: std::io::Error::from_raw_os_error(libc::EPERM),
            log: "0: R1=ctx\ninvalid insn\n".into(),
        };
        let s = e.to_string();
        assert!(
            s.contains("Operation not permitted") && s.contains("CAP_BPF") && s.contains("(verifier: invalid insn)"),
            "{s}"
        );
    }
}
