//! The agent's PMIx server (OpenPMIx's server library, libpmix), for Open MPI and other PMIx
//! clients: one server per agent process (libpmix allows one per process), one namespace per
//! step (`berth.JOB.STEP.SECRET`, [`namespace_name`]) registered while the step's ranks run on this node.
//!
//! The C glue (shim.c) fills PMIx's structures with PMIx's own macros; this module only calls
//! its flat functions. libpmix calls back from its progress thread: the callbacks copy what
//! they are given and queue it to the step's shepherd ([`PmixEvent`]), found by namespace.
//!
//! A fence (`PMIx_Fence`, the modex of `MPI_Init`) reaches the agent once every local rank
//! has entered it, with the node's data: the shepherd sends it up the control tree as a
//! barrier (as PMI-1's), and completes the fence with every node's data concatenated in
//! node order when the barrier comes back down ([`FenceToken::complete`]).

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::Path;
use std::sync::{Mutex, OnceLock};
use tokio::sync::mpsc;

mod sys {
    use std::ffi::{c_char, c_int, c_void};

    pub type FenceFn =
        unsafe extern "C" fn(nspace: *const c_char, data: *const c_char, ndata: usize, token: *mut c_void);
    pub type AbortFn = unsafe extern "C" fn(nspace: *const c_char, rank: u32, status: c_int, msg: *const c_char);
    pub type FinalizedFn = unsafe extern "C" fn(nspace: *const c_char, rank: u32);
    pub type ErrorFn = unsafe extern "C" fn(nspace: *const c_char, msg: *const c_char);
    pub type DmodexFn = unsafe extern "C" fn(nspace: *const c_char, rank: u32, token: *mut c_void);
    pub type DmodexDataFn = unsafe extern "C" fn(key: u64, found: c_int, data: *const c_char, ndata: usize);
    pub type UnsupportedFn = unsafe extern "C" fn(nspace: *const c_char, rank: u32, what: *const c_char);
    pub type PublishFn = unsafe extern "C" fn(
        nspace: *const c_char,
        rank: u32,
        n: usize,
        keys: *const *const c_char,
        kinds: *const c_int,
        datas: *const *const c_char,
        lens: *const usize,
        first_read: c_int,
        token: *mut c_void,
    );
    pub type LookupFn = unsafe extern "C" fn(
        nspace: *const c_char,
        rank: u32,
        keys: *const *const c_char,
        wait: c_int,
        timeout: c_int,
        token: *mut c_void,
    );
    pub type ConnectFn =
        unsafe extern "C" fn(n: usize, nspaces: *const *const c_char, ranks: *const u32, token: *mut c_void);
    pub type SpawnFn = unsafe extern "C" fn(
        nspace: *const c_char,
        rank: u32,
        napps: usize,
        cmds: *const *const c_char,
        argvs: *const *const *const c_char,
        envs: *const *const *const c_char,
        cwds: *const *const c_char,
        maxprocs: *const c_int,
        token: *mut c_void,
    );

    extern "C" {
        pub fn berth_pmix_init(
            tmpdir: *const c_char,
            fence: FenceFn,
            abort: AbortFn,
            finalized: FinalizedFn,
            error: ErrorFn,
            dmodex: DmodexFn,
            dmodex_data: DmodexDataFn,
            unsupported: UnsupportedFn,
            spawn: SpawnFn,
            publish: PublishFn,
            lookup: LookupFn,
            connect: ConnectFn,
            err: *mut c_char,
            errlen: usize,
        ) -> c_int;
        #[allow(clippy::too_many_arguments)]
        pub fn berth_pmix_register(
            nspace: *const c_char,
            jobid: *const c_char,
            size: u32,
            rank_app: *const u32,
            napps: u32,
            nodes: *const *const c_char,
            nnodes: u32,
            me: u32,
            rank_node: *const u32,
            rank_local: *const u32,
            rank_cpus: *const *const c_char,
            nsdir: *const c_char,
            uid: u32,
            gid: u32,
            parent_nspace: *const c_char,
            parent_rank: u32,
            err: *mut c_char,
            errlen: usize,
        ) -> c_int;
        #[cfg(test)]
        pub fn berth_pmix_setup_fork(
            nspace: *const c_char,
            rank: u32,
            env: *mut *mut *mut c_char,
            err: *mut c_char,
            errlen: usize,
        ) -> c_int;
        #[cfg(test)]
        pub fn berth_pmix_rank_binding(
            cpus: *const c_char,
            cpuset: *mut *mut c_char,
            locality: *mut *mut c_char,
            err: *mut c_char,
            errlen: usize,
        ) -> c_int;
        pub fn berth_pmix_fork_template(env: *mut *mut *mut c_char, err: *mut c_char, errlen: usize) -> c_int;
        pub fn berth_pmix_free_env(env: *mut *mut c_char);
        pub fn berth_pmix_deregister(nspace: *const c_char);
        pub fn berth_pmix_spawn_done(token: *mut c_void, nspace: *const c_char, why: c_int);
        pub fn berth_pmix_op_done(token: *mut c_void, why: c_int);
        #[allow(clippy::too_many_arguments)]
        pub fn berth_pmix_lookup_done(
            token: *mut c_void,
            why: c_int,
            n: usize,
            keys: *const *const c_char,
            kinds: *const c_int,
            datas: *const *const c_char,
            lens: *const usize,
            pub_nspaces: *const *const c_char,
            pub_ranks: *const u32,
        );
        pub fn berth_pmix_modex_done(token: *mut c_void, why: c_int, data: *const c_char, ndata: usize);
        pub fn berth_pmix_dmodex_request(nspace: *const c_char, rank: u32, key: u64) -> c_int;
        pub fn berth_pmix_notify_lost(nspace: *const c_char, rank: u32) -> c_int;
        pub fn berth_pmix_notify_node_down(
            nspace: *const c_char,
            nodeid: u32,
            host: *const c_char,
            ranks: *const u32,
            nranks: usize,
        ) -> c_int;
    }
}

/// What a step's ranks ask of the PMIx server.
#[derive(Debug)]
pub enum PmixEvent {
    /// Every local rank entered a fence: this node's data. Complete `token` with all nodes'.
    Fence { data: Vec<u8>, token: ModexToken },
    /// A local rank asked for data of rank `rank` that this server does not hold (a remote
    /// rank whose data no fence brought): direct modex. Complete `token` with the blob of
    /// [`Namespace::dmodex_request`] on the rank's node.
    DirectModex { rank: u32, token: ModexToken },
    /// This node's server answered [`Namespace::dmodex_request`]'s `key`: the rank's data, or
    /// None when it has none.
    DmodexAnswered { key: u64, data: Option<Vec<u8>> },
    /// A rank called `PMIx_Abort` (Open MPI's `MPI_Abort`).
    Abort { rank: u32, code: i32, message: String },
    /// A rank called `PMIx_Finalize`.
    Finalized { rank: u32 },
    /// A rank called `PMIx_Spawn` (`MPI_Comm_spawn`): start `apps` as a new step of the job
    /// and complete `token` with its namespace once its ranks run.
    Spawn { rank: u32, apps: Vec<berth_protocol::step::SpawnApp>, token: SpawnToken },
    /// A rank called `PMIx_Publish`: its values (`PublishedValue`s), to `berth run`.
    Publish { rank: u32, values: Vec<berth_protocol::step::PublishedValue>, first_read: bool, token: OpToken },
    /// A rank called `PMIx_Lookup` of `keys`, waiting for them when `wait` (at most
    /// `timeout_s` seconds when not 0).
    Lookup { rank: u32, keys: Vec<String>, wait: bool, timeout_s: u32, token: LookupToken },
    /// This node's participants in a `PMIx_Connect` of `procs` all called it.
    Connect { procs: Vec<berth_protocol::step::ProcName>, token: OpToken },
    /// A rank asked for what berth does not support yet (`what`: `PMIx_Publish of a value
    /// neither a string nor bytes`, ...); it was answered PMIX_ERR_NOT_SUPPORTED.
    Unsupported { rank: u32, what: String },
}

/// A fence or a direct modex libpmix waits on. Dropped without [`ModexToken::complete`] or
/// [`ModexToken::fail`], it fails (the ranks' `PMIx_Fence` or `PMIx_Get` returns an error
/// rather than hanging).
#[derive(Debug)]
pub struct ModexToken(*mut c_void);

// SAFETY: the token is an opaque heap block of shim.c, completed at most once (complete, fail
// and drop take it), and libpmix's completion callback may be called from any thread.
unsafe impl Send for ModexToken {}

/// A `PMIx_Spawn` libpmix waits on. Dropped without [`SpawnToken::complete`] or
/// [`SpawnToken::fail`], it fails (the rank's `PMIx_Spawn` returns an error rather than
/// hanging).
#[derive(Debug)]
pub struct SpawnToken(*mut c_void);

// SAFETY: as ModexToken's: an opaque heap block of shim.c, completed at most once, and
// libpmix's spawn callback may be called from any thread.
unsafe impl Send for SpawnToken {}

/// Why a spawn failed (shim.c's `why` of berth_pmix_spawn_done).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpawnFailure {
    /// The children could not be started (PMIX_ERR_JOB_FAILED_TO_LAUNCH).
    Launch = 1,
    /// No answer in time (PMIX_ERR_TIMEOUT).
    Timeout = 2,
    /// Refused (PMIX_ERR_NOT_SUPPORTED).
    Refused = 3,
}

impl SpawnToken {
    /// The children run, in namespace `nspace`.
    pub fn complete(mut self, nspace: &str) {
        let t = std::mem::replace(&mut self.0, std::ptr::null_mut());
        match CString::new(nspace) {
            // SAFETY: `t` came from shim.c's spawn callback and is completed once (nulled
            // here); a NUL-terminated name, copied by shim.c.
            Ok(ns) => unsafe { sys::berth_pmix_spawn_done(t, ns.as_ptr(), 0) },
            // SAFETY: as above, without a name.
            Err(_) => unsafe { sys::berth_pmix_spawn_done(t, std::ptr::null(), SpawnFailure::Launch as c_int) },
        }
    }

    pub fn fail(mut self, why: SpawnFailure) {
        let t = std::mem::replace(&mut self.0, std::ptr::null_mut());
        // SAFETY: as in complete, without a name.
        unsafe { sys::berth_pmix_spawn_done(t, std::ptr::null(), why as c_int) };
    }
}

impl Drop for SpawnToken {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: as in complete; a failure.
            unsafe { sys::berth_pmix_spawn_done(self.0, std::ptr::null(), SpawnFailure::Launch as c_int) };
        }
    }
}

/// Why a publish, lookup or connect failed (shim.c's `why` of berth_pmix_op_done and
/// berth_pmix_lookup_done).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpFailure {
    Failed = 1,
    Timeout = 2,
    NotFound = 3,
}

/// A `PMIx_Publish` or `PMIx_Connect` libpmix waits on; dropped unanswered, it fails.
#[derive(Debug)]
pub struct OpToken(*mut c_void);

// SAFETY: as ModexToken's.
unsafe impl Send for OpToken {}

impl OpToken {
    pub fn done(mut self) {
        let t = std::mem::replace(&mut self.0, std::ptr::null_mut());
        // SAFETY: `t` came from shim.c's publish or connect callback; completed once (nulled).
        unsafe { sys::berth_pmix_op_done(t, 0) };
    }

    pub fn fail(mut self, why: OpFailure) {
        let t = std::mem::replace(&mut self.0, std::ptr::null_mut());
        // SAFETY: as in done.
        unsafe { sys::berth_pmix_op_done(t, why as c_int) };
    }
}

impl Drop for OpToken {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: as in done; a failure.
            unsafe { sys::berth_pmix_op_done(self.0, OpFailure::Failed as c_int) };
        }
    }
}

/// A `PMIx_Lookup` libpmix waits on; dropped unanswered, it fails.
#[derive(Debug)]
pub struct LookupToken(*mut c_void);

// SAFETY: as ModexToken's.
unsafe impl Send for LookupToken {}

impl LookupToken {
    /// Answer with what was found (none: PMIX_ERR_NOT_FOUND). A value that cannot be given
    /// to libpmix (a NUL in a string or name, bad hex) fails the lookup.
    pub fn found(mut self, found: &[berth_protocol::step::Found]) {
        let t = std::mem::replace(&mut self.0, std::ptr::null_mut());
        let mut keys = Vec::new();
        let mut datas: Vec<Vec<u8>> = Vec::new();
        let mut kinds = Vec::new();
        let mut nspaces = Vec::new();
        let mut ranks = Vec::new();
        for f in found {
            let data = match (&f.value.text, &f.value.bytes) {
                (Some(t), _) if !t.contains('\0') => {
                    kinds.push(0);
                    let mut d = t.as_bytes().to_vec();
                    d.push(0);
                    d
                }
                (None, Some(h)) => match berth_protocol::auth::unhex(h) {
                    Some(d) => {
                        kinds.push(1);
                        d
                    }
                    None => return unsafe_fail(t),
                },
                _ => return unsafe_fail(t),
            };
            let (Ok(k), Ok(ns)) = (CString::new(f.value.key.as_str()), CString::new(f.publisher.nspace.as_str()))
            else {
                return unsafe_fail(t);
            };
            datas.push(data);
            keys.push(k);
            nspaces.push(ns);
            ranks.push(f.publisher.rank);
        }
        let key_ptrs: Vec<*const c_char> = keys.iter().map(|k| k.as_ptr()).collect();
        let ns_ptrs: Vec<*const c_char> = nspaces.iter().map(|k| k.as_ptr()).collect();
        let data_ptrs: Vec<*const c_char> = datas.iter().map(|d| d.as_ptr().cast()).collect();
        // A string's length leaves its NUL out.
        let lens: Vec<usize> =
            datas.iter().zip(&kinds).map(|(d, &k)| if k == 0 { d.len() - 1 } else { d.len() }).collect();
        // SAFETY: `t` came from shim.c's lookup callback, completed once (nulled); `n` entries
        // in every array, alive across the call (libpmix packs them during it).
        unsafe {
            sys::berth_pmix_lookup_done(
                t,
                0,
                keys.len(),
                key_ptrs.as_ptr(),
                kinds.as_ptr(),
                data_ptrs.as_ptr(),
                lens.as_ptr(),
                ns_ptrs.as_ptr(),
                ranks.as_ptr(),
            )
        };
    }

    pub fn fail(mut self, why: OpFailure) {
        let t = std::mem::replace(&mut self.0, std::ptr::null_mut());
        // SAFETY: as in found, with nothing.
        unsafe { lookup_fail(t, why) };
    }
}

/// Fail lookup token `t` (from shim.c, not completed yet).
unsafe fn lookup_fail(t: *mut c_void, why: OpFailure) {
    use std::ptr::null;
    // SAFETY: the caller's contract; no entries.
    unsafe { sys::berth_pmix_lookup_done(t, why as c_int, 0, null(), null(), null(), null(), null(), null()) };
}

fn unsafe_fail(t: *mut c_void) {
    // SAFETY: `t` was taken from a LookupToken (not completed yet).
    unsafe { lookup_fail(t, OpFailure::Failed) };
}

impl Drop for LookupToken {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: not completed yet (nulled when it is).
            unsafe { lookup_fail(self.0, OpFailure::Failed) };
        }
    }
}

/// shim.c's `why` of berth_pmix_modex_done.
const MODEX_OK: c_int = 0;
const MODEX_FAILED: c_int = 1;
const MODEX_NOT_FOUND: c_int = 2;
const MODEX_TIMEOUT: c_int = 3;

impl ModexToken {
    /// Complete a fence with every participating node's data, concatenated, or a direct
    /// modex with the rank's node's blob.
    pub fn complete(mut self, data: &[u8]) {
        let t = std::mem::replace(&mut self.0, std::ptr::null_mut());
        // SAFETY: `t` came from shim.c's fence or direct modex callback and is completed once
        // (nulled here).
        unsafe { sys::berth_pmix_modex_done(t, MODEX_OK, data.as_ptr().cast(), data.len()) };
    }

    /// Fail it: the ranks' call returns PMIX_ERR_NOT_FOUND (no such rank, no data),
    /// PMIX_ERR_TIMEOUT or PMIX_ERROR.
    pub fn fail(mut self, why: berth_protocol::step::ModexFailure) {
        use berth_protocol::step::ModexFailure as F;
        let t = std::mem::replace(&mut self.0, std::ptr::null_mut());
        let code = match why {
            F::NoSuchRank | F::NoData => MODEX_NOT_FOUND,
            F::Timeout => MODEX_TIMEOUT,
            F::TooLarge | F::Other => MODEX_FAILED,
        };
        // SAFETY: as in complete, without data.
        unsafe { sys::berth_pmix_modex_done(t, code, std::ptr::null(), 0) };
    }
}

impl Drop for ModexToken {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: as in complete; a failure with no data.
            unsafe { sys::berth_pmix_modex_done(self.0, MODEX_FAILED, std::ptr::null(), 0) };
        }
    }
}

/// Where libpmix's callbacks go, by namespace: one record behind one lock, process-wide
/// because libpmix's server library is (its callbacks carry no context of ours). A
/// namespace's queue and its direct modex requests are added while it is registered and
/// removed with it ([`Namespace`]'s drop).
#[derive(Default)]
struct Routes {
    /// The shepherds' queues, by namespace.
    queues: HashMap<String, mpsc::UnboundedSender<PmixEvent>>,
    /// Direct modex requests this node's server is answering: key → namespace, so libpmix's
    /// answer (which carries only the key) reaches the step's shepherd.
    dmodex: HashMap<u64, String>,
    /// The key of the next direct modex request (1, 2, ...).
    last_dmodex: u64,
}

impl Routes {
    /// The queue of `nspace`, if it is registered here.
    fn queue(&self, nspace: &str) -> Option<mpsc::UnboundedSender<PmixEvent>> {
        self.queues.get(nspace).cloned()
    }
}

/// The one [`Routes`], locked (a panic while it was held leaves it as it was: each change is
/// one map operation).
fn routes() -> std::sync::MutexGuard<'static, Routes> {
    static ROUTES: OnceLock<Mutex<Routes>> = OnceLock::new();
    ROUTES.get_or_init(Default::default).lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn route(nspace: *const c_char, ev: PmixEvent) {
    if nspace.is_null() {
        return;
    }
    // SAFETY: libpmix passes a NUL-terminated namespace (pmix_proc_t.nspace).
    let ns = unsafe { CStr::from_ptr(nspace) }.to_string_lossy();
    let tx = routes().queue(&ns);
    match tx {
        // A fence of a namespace gone: its token fails the fence when dropped here.
        Some(tx) => drop(tx.send(ev)),
        None => tracing::debug!("PMIx event for unknown namespace {ns}"),
    }
}

unsafe extern "C" fn on_fence(nspace: *const c_char, data: *const c_char, ndata: usize, token: *mut c_void) {
    let data = if data.is_null() || ndata == 0 {
        Vec::new()
    } else {
        // SAFETY: libpmix's fence data: `ndata` bytes at `data`, valid during this call.
        unsafe { std::slice::from_raw_parts(data.cast::<u8>(), ndata) }.to_vec()
    };
    route(nspace, PmixEvent::Fence { data, token: ModexToken(token) });
}

unsafe extern "C" fn on_dmodex(nspace: *const c_char, rank: u32, token: *mut c_void) {
    route(nspace, PmixEvent::DirectModex { rank, token: ModexToken(token) });
}

unsafe extern "C" fn on_dmodex_data(key: u64, found: c_int, data: *const c_char, ndata: usize) {
    let data = if found == 0 {
        None
    } else if data.is_null() || ndata == 0 {
        Some(Vec::new())
    } else {
        // SAFETY: libpmix's blob: `ndata` bytes at `data`, valid during this call.
        Some(unsafe { std::slice::from_raw_parts(data.cast::<u8>(), ndata) }.to_vec())
    };
    let tx = {
        let mut routes = routes();
        routes.dmodex.remove(&key).map(|nspace| routes.queue(&nspace))
    };
    let Some(tx) = tx else {
        tracing::debug!("PMIx direct modex answer {key} for a namespace gone");
        return;
    };
    if let Some(tx) = tx {
        let _ = tx.send(PmixEvent::DmodexAnswered { key, data });
    }
}

unsafe extern "C" fn on_abort(nspace: *const c_char, rank: u32, status: c_int, msg: *const c_char) {
    let message = if msg.is_null() {
        String::new()
    } else {
        // SAFETY: shim.c passes a NUL-terminated message ("" when the client gave none).
        unsafe { CStr::from_ptr(msg) }.to_string_lossy().into_owned()
    };
    route(nspace, PmixEvent::Abort { rank, code: status, message });
}

unsafe extern "C" fn on_unsupported(nspace: *const c_char, rank: u32, what: *const c_char) {
    let what = if what.is_null() {
        String::new()
    } else {
        // SAFETY: shim.c passes a NUL-terminated static string.
        unsafe { CStr::from_ptr(what) }.to_string_lossy().into_owned()
    };
    route(nspace, PmixEvent::Unsupported { rank, what });
}

/// A NULL-ended array of C strings as Strings (none when NULL).
///
/// # Safety
/// `p` is NULL or a NULL-terminated array of NUL-terminated strings, valid during the call.
unsafe fn strings(p: *const *const c_char) -> Vec<String> {
    let mut out = Vec::new();
    if p.is_null() {
        return out;
    }
    let mut q = p;
    // SAFETY: read up to the terminator (the caller's contract).
    unsafe {
        while !(*q).is_null() {
            out.push(CStr::from_ptr(*q).to_string_lossy().into_owned());
            q = q.add(1);
        }
    }
    out
}

unsafe extern "C" fn on_publish(
    nspace: *const c_char,
    rank: u32,
    n: usize,
    keys: *const *const c_char,
    kinds: *const c_int,
    datas: *const *const c_char,
    lens: *const usize,
    first_read: c_int,
    token: *mut c_void,
) {
    use berth_protocol::step::{PublishedValue, MAX_PUBLISHED_BYTES, MAX_PUBLISH_VALUES};
    let token = OpToken(token);
    if n == 0 || n > MAX_PUBLISH_VALUES {
        return token.fail(OpFailure::Failed);
    }
    let mut values = Vec::with_capacity(n);
    for i in 0..n {
        // SAFETY: shim.c passes `n` entries in each array, valid during this call; a key is
        // NUL-terminated, a value `lens[i]` bytes.
        let (key, kind, data, len) = unsafe { (*keys.add(i), *kinds.add(i), *datas.add(i), *lens.add(i)) };
        if key.is_null() || len > MAX_PUBLISHED_BYTES || (data.is_null() && len > 0) {
            return token.fail(OpFailure::Failed);
        }
        // SAFETY: as above.
        let key = unsafe { CStr::from_ptr(key) }.to_string_lossy().into_owned();
        let bytes: &[u8] = if len == 0 { &[] } else { unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) } };
        let value = if kind == 0 {
            PublishedValue { key, text: Some(String::from_utf8_lossy(bytes).into_owned()), bytes: None }
        } else {
            PublishedValue { key, text: None, bytes: Some(berth_protocol::auth::hex(bytes)) }
        };
        values.push(value);
    }
    route(nspace, PmixEvent::Publish { rank, values, first_read: first_read != 0, token });
}

unsafe extern "C" fn on_lookup(
    nspace: *const c_char,
    rank: u32,
    keys: *const *const c_char,
    wait: c_int,
    timeout: c_int,
    token: *mut c_void,
) {
    let token = LookupToken(token);
    // SAFETY: libpmix's NULL-ended keys, valid during this call.
    let keys = unsafe { strings(keys) };
    if keys.is_empty() || keys.len() > berth_protocol::step::MAX_LOOKUP_KEYS {
        return token.fail(OpFailure::Failed);
    }
    let timeout_s = u32::try_from(timeout).unwrap_or(0);
    route(nspace, PmixEvent::Lookup { rank, keys, wait: wait != 0, timeout_s, token });
}

unsafe extern "C" fn on_connect(n: usize, nspaces: *const *const c_char, ranks: *const u32, token: *mut c_void) {
    let token = OpToken(token);
    if n == 0 || n > berth_protocol::step::MAX_CONNECT_PROCS {
        return token.fail(OpFailure::Failed);
    }
    let mut procs = Vec::with_capacity(n);
    for i in 0..n {
        // SAFETY: shim.c passes `n` entries, NUL-terminated namespaces, valid during this call.
        let (ns, rank) = unsafe { (*nspaces.add(i), *ranks.add(i)) };
        if ns.is_null() {
            return token.fail(OpFailure::Failed);
        }
        // SAFETY: as above.
        let nspace = unsafe { CStr::from_ptr(ns) }.to_string_lossy().into_owned();
        procs.push(berth_protocol::step::ProcName { nspace, rank });
    }
    // The step of any participating namespace registered here takes it (libpmix calls once per
    // node, whichever namespaces its local participants are of).
    let tx = {
        let routes = routes();
        procs.iter().find_map(|p| routes.queue(&p.nspace))
    };
    match tx {
        Some(tx) => drop(tx.send(PmixEvent::Connect { procs, token })),
        None => token.fail(OpFailure::NotFound),
    }
}

unsafe extern "C" fn on_spawn(
    nspace: *const c_char,
    rank: u32,
    napps: usize,
    cmds: *const *const c_char,
    argvs: *const *const *const c_char,
    envs: *const *const *const c_char,
    cwds: *const *const c_char,
    maxprocs: *const c_int,
    token: *mut c_void,
) {
    let token = SpawnToken(token);
    if napps > berth_protocol::step::MAX_SPAWN_APPS {
        return token.fail(SpawnFailure::Launch);
    }
    let text = |p: *const c_char| {
        // SAFETY: shim.c passes libpmix's NUL-terminated strings or NULL, valid during this call.
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    };
    let mut apps = Vec::with_capacity(napps);
    for i in 0..napps {
        // SAFETY: shim.c passes `napps` entries in each array, valid during this call.
        let (cmd, argv, env, cwd, max) =
            unsafe { (*cmds.add(i), *argvs.add(i), *envs.add(i), *cwds.add(i), *maxprocs.add(i)) };
        // SAFETY: libpmix's NULL-ended argv and env (pmix_app_t), or NULL.
        let (mut argv, env) = unsafe { (strings(argv), strings(env)) };
        // The program is `cmd`; argv[0] (Open MPI sets it to the command too) is replaced.
        match text(cmd) {
            Some(c) if argv.is_empty() => argv.push(c),
            Some(c) => argv[0] = c,
            None => {}
        }
        let env = env.iter().filter_map(|e| e.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect();
        apps.push(berth_protocol::step::SpawnApp {
            argv,
            maxprocs: u32::try_from(max).unwrap_or(0),
            env,
            cwd: text(cwd).filter(|c| !c.is_empty()),
        });
    }
    route(nspace, PmixEvent::Spawn { rank, apps, token });
}

unsafe extern "C" fn on_finalized(nspace: *const c_char, rank: u32) {
    route(nspace, PmixEvent::Finalized { rank });
}

/// A registration queued without waiting failed (its ranks' `PMIx_Init` will fail, saying
/// so): logged.
unsafe extern "C" fn on_error(nspace: *const c_char, msg: *const c_char) {
    let text = |p: *const c_char| {
        if p.is_null() {
            String::new()
        } else {
            // SAFETY: shim.c passes NUL-terminated strings, valid during this call.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    };
    tracing::warn!(namespace = %text(nspace), "PMIx: {}", text(msg));
}

const ERR_LEN: usize = 512;

fn err_text(buf: &[u8]) -> String {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// Why this node's PMIx server or a step's namespace is not there.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PmixError {
    #[error("the PMIx {what} {value:?} contains a NUL byte")]
    Nul { what: &'static str, value: String },
    #[error("cannot create {}: {error}", .dir.display())]
    CreateDir { dir: std::path::PathBuf, error: std::sync::Arc<std::io::Error> },
    #[error("chmod {}: {error}", .dir.display())]
    Chmod { dir: std::path::PathBuf, error: std::sync::Arc<std::io::Error> },
    /// libpmix's message.
    #[error("cannot start the PMIx server: {0}")]
    Start(String),
    #[error("the PMIx server gives ranks no environment: {0}")]
    NoForkEnv(String),
    #[error("inconsistent PMIx namespace {name} (size {size})")]
    Inconsistent { name: String, size: usize },
    #[error("a rank of PMIx namespace {0} is on no node")]
    RankOnNoNode(String),
    #[error("a rank of PMIx namespace {0} has no application")]
    RankWithoutApp(String),
    /// libpmix refused to register the namespace: its message.
    #[error("{0}")]
    Register(String),
}

/// A barrier's PMIx fence data that cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("node {node}'s PMIx fence data is not hex")]
pub struct FenceNotHex {
    pub node: u32,
}

fn cstring(what: &'static str, s: &str) -> Result<CString, PmixError> {
    CString::new(s).map_err(|_| PmixError::Nul { what, value: s.to_string() })
}

/// The variables of `PMIx_server_setup_fork` every rank of this server gets, bar
/// `PMIX_NAMESPACE` and `PMIX_RANK` (shim.c, `berth_pmix_fork_template`).
static FORK_TEMPLATE: OnceLock<Vec<(String, String)>> = OnceLock::new();

/// Set in the agent's environment before any thread starts (berthd's main), unless the
/// administrator chose otherwise: libpmix keeps job data in its "hash" store only. Its
/// shared-memory stores (ds12, ds21) create, map and remove files for every namespace:
/// registering a step's namespace cost ~1-2 ms of the server's time and deregistering it
/// 7-11 ms on the 2-vCPU test machine, against ~0.2 ms for the hash store, whose price is a
/// copy of the job data sent to each rank at `PMIx_Init` (small at berth's sizes).
pub const GDS_VAR: (&str, &str) = ("PMIX_MCA_gds", "hash");

/// A step's PMIx namespace: `berth.JOB.STEP.` and the secret part of its link key
/// (`LinkKey::pmix_namespace_tag`), the same on every node of the step: the name (with a
/// rank and the step's uid, which a client only declares) is all a local process needs to be
/// taken for a rank by the server, so no one outside the step can guess it.
pub fn namespace_name(job: berth_core::JobId, step: u32, link: &berth_protocol::auth::LinkKey) -> String {
    link.pmix_namespace(job, step)
}

/// `env`, a NULL-ended array from libpmix, as pairs; the array is freed.
///
/// # Safety
/// `env` is NULL or a NULL-terminated array of NUL-terminated strings from shim.c, not used
/// again by the caller.
unsafe fn take_env(env: *mut *mut c_char) -> Vec<(String, String)> {
    let mut vars = Vec::new();
    if env.is_null() {
        return vars;
    }
    let mut p = env;
    // SAFETY: read up to the terminator (the caller's contract), then freed once by shim.c.
    unsafe {
        while !(*p).is_null() {
            let s = CStr::from_ptr(*p).to_string_lossy();
            if let Some((k, v)) = s.split_once('=') {
                vars.push((k.to_string(), v.to_string()));
            }
            p = p.add(1);
        }
        sys::berth_pmix_free_env(env);
    }
    vars
}

/// Start this process's PMIx server (once; later calls return the first outcome), its
/// rendezvous files under `tmpdir`.
pub fn ensure_server(tmpdir: &Path) -> Result<(), PmixError> {
    static SERVER: OnceLock<Result<(), PmixError>> = OnceLock::new();
    SERVER
        .get_or_init(|| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::create_dir_all(tmpdir)
                .map_err(|e| PmixError::CreateDir { dir: tmpdir.to_path_buf(), error: e.into() })?;
            // Ranks run as their users and read the server's files here.
            std::fs::set_permissions(tmpdir, std::fs::Permissions::from_mode(0o755))
                .map_err(|e| PmixError::Chmod { dir: tmpdir.to_path_buf(), error: e.into() })?;
            let dir = cstring("directory", &tmpdir.display().to_string())?;
            let mut err = [0u8; ERR_LEN];
            // SAFETY: NUL-terminated path, callbacks with the signatures shim.c declares, and
            // an error buffer of ERR_LEN bytes; called once per process (OnceLock).
            let rc = unsafe {
                sys::berth_pmix_init(
                    dir.as_ptr(),
                    on_fence,
                    on_abort,
                    on_finalized,
                    on_error,
                    on_dmodex,
                    on_dmodex_data,
                    on_unsupported,
                    on_spawn,
                    on_publish,
                    on_lookup,
                    on_connect,
                    err.as_mut_ptr().cast(),
                    ERR_LEN,
                )
            };
            if rc != 0 {
                return Err(PmixError::Start(err_text(&err)));
            }
            let mut env: *mut *mut c_char = std::ptr::null_mut();
            // SAFETY: the server runs; an out pointer for libpmix's NULL-ended array, read
            // and freed by take_env; an ERR_LEN error buffer.
            let rc = unsafe { sys::berth_pmix_fork_template(&mut env, err.as_mut_ptr().cast(), ERR_LEN) };
            // SAFETY: as above.
            let vars = unsafe { take_env(env) };
            if rc != 0 {
                return Err(PmixError::NoForkEnv(err_text(&err)));
            }
            let template: Vec<(String, String)> =
                vars.into_iter().filter(|(k, _)| k != "PMIX_NAMESPACE" && k != "PMIX_RANK").collect();
            let _ = FORK_TEMPLATE.set(template);
            Ok(())
        })
        .clone()
}

/// A step's namespace on this node.
pub struct NamespaceSpec<'a> {
    pub name: String,
    pub jobid: String,
    pub size: u32,
    /// Each rank's application number (MPMD: its program; indexed by rank), all below `napps`.
    pub rank_app: Vec<u32>,
    /// How many programs the step runs (PMIX_JOB_NUM_APPS).
    pub napps: u32,
    /// Node names, in node order.
    pub nodes: Vec<&'a str>,
    /// This node's index.
    pub me: u32,
    /// Each rank's node index (indexed by rank).
    pub rank_node: Vec<u32>,
    /// Each rank's index among its node's ranks.
    pub rank_local: Vec<u32>,
    /// Each bound local rank's host CPUs (indexed by rank; None for remote and unbound ranks;
    /// empty: none bound): its `PMIX_CPUSET` and `PMIX_LOCALITY_STRING`.
    pub rank_cpus: Vec<Option<String>>,
    /// A directory for the namespace (PMIX_NSDIR).
    pub nsdir: &'a Path,
    pub uid: u32,
    pub gid: u32,
    /// The process that spawned the step (`PMIx_Spawn`): its namespace and rank
    /// (`PMIX_PARENT_ID`); None for a step `berth run` started.
    pub parent: Option<(String, u32)>,
}

/// A registered namespace: deregistered (its clients too) when dropped. Neither waits for
/// libpmix: both are queued to its progress thread (shim.c).
pub struct Namespace {
    name: CString,
    key: String,
}

impl Namespace {
    /// Register the step's namespace and this node's ranks as its clients; the server's
    /// events for it go to `events`. Returns once the registration is queued: the ranks may
    /// be forked at once (their connections are handled after it), and a failure that shows
    /// only later is logged.
    pub fn register(spec: &NamespaceSpec, events: mpsc::UnboundedSender<PmixEvent>) -> Result<Namespace, PmixError> {
        let n = spec.size as usize;
        if spec.rank_node.len() != n
            || spec.rank_local.len() != n
            || spec.rank_app.len() != n
            || !(spec.rank_cpus.is_empty() || spec.rank_cpus.len() == n)
            || spec.me as usize >= spec.nodes.len()
        {
            return Err(PmixError::Inconsistent { name: spec.name.clone(), size: n });
        }
        if spec.rank_node.iter().any(|&i| i as usize >= spec.nodes.len()) {
            return Err(PmixError::RankOnNoNode(spec.name.clone()));
        }
        if spec.napps == 0 || spec.rank_app.iter().any(|&a| a >= spec.napps) {
            return Err(PmixError::RankWithoutApp(spec.name.clone()));
        }
        let name = cstring("namespace", &spec.name)?;
        let jobid = cstring("job id", &spec.jobid)?;
        let nsdir = cstring("directory", &spec.nsdir.display().to_string())?;
        let nodes: Vec<CString> = spec.nodes.iter().map(|n| cstring("node name", n)).collect::<Result<_, _>>()?;
        let node_ptrs: Vec<*const c_char> = nodes.iter().map(|n| n.as_ptr()).collect();
        let cpus: Vec<Option<CString>> = spec
            .rank_cpus
            .iter()
            .map(|c| c.as_deref().map(|c| cstring("CPU list", c)).transpose())
            .collect::<Result<_, _>>()?;
        let cpu_ptrs: Vec<*const c_char> =
            cpus.iter().map(|c| c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr())).collect();
        let parent = spec.parent.as_ref().map(|(ns, _)| cstring("parent namespace", ns)).transpose()?;
        let parent_rank = spec.parent.as_ref().map_or(0, |(_, r)| *r);
        routes().queues.insert(spec.name.clone(), events);
        let mut err = [0u8; ERR_LEN];
        // SAFETY: NUL-terminated strings, `nodes.len()` node pointers, `size` entries in the
        // rank arrays (checked above; the CPU lists' NULL when none), all alive across the
        // call; an ERR_LEN error buffer.
        let rc = unsafe {
            sys::berth_pmix_register(
                name.as_ptr(),
                jobid.as_ptr(),
                spec.size,
                spec.rank_app.as_ptr(),
                spec.napps,
                node_ptrs.as_ptr(),
                node_ptrs.len() as u32,
                spec.me,
                spec.rank_node.as_ptr(),
                spec.rank_local.as_ptr(),
                if cpu_ptrs.is_empty() { std::ptr::null() } else { cpu_ptrs.as_ptr() },
                nsdir.as_ptr(),
                spec.uid,
                spec.gid,
                parent.as_ref().map_or(std::ptr::null(), |p| p.as_ptr()),
                parent_rank,
                err.as_mut_ptr().cast(),
                ERR_LEN,
            )
        };
        let ns = Namespace { name, key: spec.name.clone() };
        if rc != 0 {
            return Err(PmixError::Register(err_text(&err)));
        }
        Ok(ns)
    }

    /// The variables a local rank needs to reach the server (PMIX_NAMESPACE, PMIX_RANK,
    /// PMIX_SERVER_URI*, ...): those `PMIx_server_setup_fork` gives, from the server's
    /// template (no call into libpmix per rank).
    pub fn fork_env(&self, rank: u32) -> Vec<(String, String)> {
        let template = FORK_TEMPLATE.get().map(Vec::as_slice).unwrap_or_default();
        let mut env = Vec::with_capacity(template.len() + 2);
        env.push(("PMIX_NAMESPACE".to_string(), self.key.clone()));
        env.push(("PMIX_RANK".to_string(), rank.to_string()));
        env.extend(template.iter().cloned());
        env
    }

    /// Ask this node's server for local rank `rank`'s data for another node (direct modex):
    /// the answer comes as [`PmixEvent::DmodexAnswered`] with the key returned, once the rank
    /// has committed its data. None: libpmix refused (no answer follows).
    pub fn dmodex_request(&self, rank: u32) -> Option<u64> {
        let key = {
            let mut routes = routes();
            routes.last_dmodex += 1;
            let key = routes.last_dmodex;
            routes.dmodex.insert(key, self.key.clone());
            key
        };
        // SAFETY: a registered namespace; the key is a plain number libpmix hands back.
        if unsafe { sys::berth_pmix_dmodex_request(self.name.as_ptr(), rank, key) } == 0 {
            Some(key)
        } else {
            routes().dmodex.remove(&key);
            None
        }
    }

    /// Tell the step's ranks here that `rank` was lost (event PMIX_ERR_PROC_ABORTED).
    pub fn notify_lost(&self, rank: u32) -> bool {
        // SAFETY: a registered namespace.
        unsafe { sys::berth_pmix_notify_lost(self.name.as_ptr(), rank) == 0 }
    }

    /// Tell the step's ranks here that node `nodeid` (`host`, running `ranks`) was lost as a
    /// whole (event PMIX_EVENT_NODE_DOWN).
    pub fn notify_node_down(&self, nodeid: u32, host: &str, ranks: &[u32]) -> bool {
        let Ok(host) = CString::new(host) else { return false };
        // SAFETY: a registered namespace, a NUL-terminated host name, `ranks.len()` ranks.
        unsafe {
            sys::berth_pmix_notify_node_down(self.name.as_ptr(), nodeid, host.as_ptr(), ranks.as_ptr(), ranks.len())
                == 0
        }
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        {
            let mut routes = routes();
            routes.queues.remove(&self.key);
            routes.dmodex.retain(|_, ns| *ns != self.key);
        }
        // SAFETY: the namespace registered by `register` (deregistering an unknown one is a
        // no-op in libpmix).
        unsafe { sys::berth_pmix_deregister(self.name.as_ptr()) };
    }
}

/// The data of one fence from every node, as the control tree's barrier carries it: one key
/// per node.
pub fn fence_key(node: u32) -> String {
    format!("pmix-fence.{node}")
}

/// Every node's fence data out of a barrier's key-value pairs, concatenated in node order;
/// None when the barrier carries none (a PMI barrier).
pub fn fence_data(kvs: &[(String, String)]) -> Option<Result<Vec<u8>, FenceNotHex>> {
    let mut parts: Vec<(u32, &str)> = kvs
        .iter()
        .filter_map(|(k, v)| k.strip_prefix("pmix-fence.").and_then(|n| n.parse().ok()).map(|n| (n, v.as_str())))
        .collect();
    if parts.is_empty() {
        return None;
    }
    parts.sort_by_key(|(n, _)| *n);
    let mut all = Vec::new();
    for (n, hex) in parts {
        match berth_protocol::auth::unhex(hex) {
            Some(mut b) => all.append(&mut b),
            None => return Some(Err(FenceNotHex { node: n })),
        }
    }
    Some(Ok(all))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fence_data_is_concatenated_in_node_order_and_pmi_barriers_carry_none() {
        let kvs = vec![
            (fence_key(2), "0304".to_string()),
            ("PMI_key".to_string(), "v".to_string()),
            (fence_key(0), "01".to_string()),
            (fence_key(10), "ff".to_string()),
        ];
        assert_eq!(fence_data(&kvs), Some(Ok(vec![1, 3, 4, 0xff])));
        assert_eq!(fence_data(&[("PMI_key".into(), "v".into())]), None);
        assert!(matches!(fence_data(&[(fence_key(1), "zz".into())]), Some(Err(_))));
    }

    /// What `PMIx_server_setup_fork` itself gives `rank` of `ns`, sorted, once it is `want`
    /// (the registration is queued: until the progress thread has done it, the dstore adds
    /// nothing for the namespace); what it gave last after 2 s otherwise.
    fn real_fork_env(ns: &str, rank: u32, want: &[(String, String)]) -> Vec<(String, String)> {
        let name = CString::new(ns).unwrap();
        let mut last = Vec::new();
        for _ in 0..200 {
            let mut env: *mut *mut c_char = std::ptr::null_mut();
            let mut err = [0u8; ERR_LEN];
            // SAFETY: a NUL-terminated name, an out pointer read and freed by take_env.
            let rc =
                unsafe { sys::berth_pmix_setup_fork(name.as_ptr(), rank, &mut env, err.as_mut_ptr().cast(), ERR_LEN) };
            // SAFETY: as above.
            let mut vars = unsafe { take_env(env) };
            vars.sort();
            if rc == 0 && vars == want {
                return vars;
            }
            last = vars;
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        last
    }

    /// The real server: a namespace of 3 ranks over 2 nodes, 2 of them here, gives each local
    /// rank the variables Open MPI looks for, the very ones `PMIx_server_setup_fork` gives it
    /// (the template holds); a second namespace registers beside it.
    #[test]
    fn a_registered_namespace_gives_its_ranks_the_servers_address() {
        let tmp = tempfile::tempdir().unwrap();
        start_server(&tmp.path().join("pmix"));
        let (tx, _rx) = mpsc::unbounded_channel();
        let spec = NamespaceSpec {
            name: "berth.test.1".into(),
            jobid: "test.1".into(),
            size: 3,
            rank_app: vec![0, 0, 1],
            napps: 2,
            nodes: vec!["n0", "n1"],
            me: 0,
            rank_node: vec![0, 0, 1],
            rank_local: vec![0, 1, 0],
            rank_cpus: vec![Some("0".into()), None, None],
            nsdir: tmp.path(),
            uid: unsafe_ids().0,
            gid: unsafe_ids().1,
            parent: None,
        };
        let ns = Namespace::register(&spec, tx.clone()).expect("register");
        let env = ns.fork_env(1);
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        assert_eq!(get("PMIX_NAMESPACE").as_deref(), Some("berth.test.1"), "{env:?}");
        assert_eq!(get("PMIX_RANK").as_deref(), Some("1"), "{env:?}");
        assert!(get("PMIX_SERVER_URI41").or(get("PMIX_SERVER_URI4")).is_some(), "{env:?}");
        let sorted = |mut v: Vec<(String, String)>| {
            v.sort();
            v
        };
        let want = sorted(env.clone());
        assert_eq!(want, real_fork_env("berth.test.1", 1, &want));
        let spec2 = NamespaceSpec { name: "berth.test.2".into(), uid: 65534, gid: 65534, ..spec };
        let ns2 = Namespace::register(&spec2, tx).expect("a second namespace");
        let want = sorted(ns2.fork_env(0));
        assert_eq!(want, real_fork_env("berth.test.2", 0, &want));
        drop(ns);
        drop(ns2);
        let routes = routes();
        assert!(routes.queue("berth.test.1").is_none() && routes.queue("berth.test.2").is_none());
    }

    /// A bound rank's PMIX_CPUSET and PMIX_LOCALITY_STRING as libpmix formats them, from this
    /// host's topology: CPU 0 is on package 0, core 0, PU 0; every online CPU is the PUs of
    /// the whole host; a CPU list libpmix cannot read is refused.
    #[test]
    fn a_bound_ranks_cpuset_and_locality_are_libpmixs_own_strings() {
        let tmp = tempfile::tempdir().unwrap();
        start_server(&tmp.path().join("pmix"));
        let binding = |cpus: &str| -> Result<(String, String), String> {
            let list = CString::new(cpus).unwrap();
            let (mut set, mut loc) = (std::ptr::null_mut(), std::ptr::null_mut());
            let mut err = [0u8; ERR_LEN];
            // SAFETY: a NUL-terminated list, two out pointers, an ERR_LEN buffer; the strings
            // returned are malloc'ed by libpmix and freed here.
            unsafe {
                if sys::berth_pmix_rank_binding(list.as_ptr(), &mut set, &mut loc, err.as_mut_ptr().cast(), ERR_LEN)
                    != 0
                {
                    return Err(err_text(&err));
                }
                let out = (
                    CStr::from_ptr(set).to_string_lossy().into_owned(),
                    CStr::from_ptr(loc).to_string_lossy().into_owned(),
                );
                libc::free(set.cast());
                libc::free(loc.cast());
                Ok(out)
            }
        };
        let (set, loc) = binding("0").expect("CPU 0");
        assert_eq!(set, "hwloc:0");
        let fields: Vec<&str> = loc.split(':').collect();
        for want in ["SK0", "CR0", "HT0"] {
            assert!(fields.contains(&want), "{loc}");
        }
        let all = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
        let (set, loc) = binding(all.trim()).expect("every CPU");
        assert_eq!(set, format!("hwloc:{}", all.trim()));
        assert!(loc.split(':').any(|f| f == format!("HT{}", all.trim())), "{loc}");
        // libpmix reads no CPU out of it and has no locality for it: no data rather than wrong.
        let bad = binding("zero").expect_err("a list of no CPU");
        assert!(bad.contains("cannot describe CPUs zero"), "{bad}");
    }

    /// `pmixguard.c` (crates/agent/tests/mpi), a plain libpmix client, built once per test
    /// binary in a directory every user may read (it is also run as nobody).
    fn guard_client() -> &'static std::path::Path {
        static BIN: OnceLock<std::path::PathBuf> = OnceLock::new();
        BIN.get_or_init(|| {
            use std::os::unix::fs::PermissionsExt;
            let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mpi/pmixguard.c");
            let dir = std::env::temp_dir().join(format!("berth-pmixguard-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
            let bin = dir.join("pmixguard");
            let st = std::process::Command::new("cc")
                .arg("-o")
                .arg(&bin)
                .arg(&src)
                .args(["-I/usr/lib/x86_64-linux-gnu/pmix2/include", "-lpmix"])
                .status()
                .expect("cannot run cc: install build-essential and libpmix-dev (scripts/setup.sh)");
            assert!(st.success(), "cc pmixguard.c -lpmix failed: install libpmix-dev (scripts/setup.sh)");
            bin
        })
    }

    /// The client with exactly `env` (and PATH), as `uid` when given.
    fn guard(env: &[(String, String)], uid: Option<u32>, args: &[&str]) -> std::process::Command {
        use std::os::unix::process::CommandExt;
        let mut cmd = std::process::Command::new(guard_client());
        cmd.args(args).env_clear().env("PATH", "/usr/bin:/bin").envs(env.iter().cloned());
        cmd.stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        if let Some(uid) = uid {
            cmd.uid(uid).gid(uid);
        }
        cmd
    }

    fn output(cmd: &mut std::process::Command) -> (Option<i32>, String) {
        let out = cmd.output().expect("run pmixguard");
        (out.status.code(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
    }

    /// A listening client: its stdout lines, each as it comes.
    fn listen(env: &[(String, String)], seconds: u32) -> (std::process::Child, std::sync::mpsc::Receiver<String>) {
        use std::io::BufRead;
        let mut child = guard(env, None, &["listen", &seconds.to_string()]).spawn().expect("run pmixguard listen");
        let out = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        (child, rx)
    }

    /// Lines of `rx` up to one starting with `want` (within 10 s), all of them.
    fn lines_until(rx: &std::sync::mpsc::Receiver<String>, want: &str) -> Vec<String> {
        let mut seen = Vec::new();
        let t0 = std::time::Instant::now();
        while t0.elapsed() < std::time::Duration::from_secs(10) {
            match rx.recv_timeout(std::time::Duration::from_millis(100)) {
                Ok(l) => {
                    let done = l.starts_with(want);
                    seen.push(l);
                    if done {
                        return seen;
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(_) => break,
            }
        }
        panic!("no line {want:?} from the client: {seen:?}");
    }

    /// Who may connect to the server and what reaches whom: a step's rank with its own
    /// environment connects; a namespace named without its secret part is unknown to the
    /// server; another user's process naming the step's namespace and a rank is refused by
    /// libpmix's uid check (which only holds against a client that sends its real uid); and
    /// an event a rank sends (range GLOBAL), like one the agent raises for its step, reaches
    /// the handlers of its own step's ranks only, never those of another step on the node.
    #[test]
    fn only_a_steps_ranks_connect_and_its_events_stay_in_the_step() {
        /// The client's directory goes with the test, passed or not.
        struct RemoveClient;
        impl Drop for RemoveClient {
            fn drop(&mut self) {
                if let Some(dir) = guard_client().parent() {
                    let _ = std::fs::remove_dir_all(dir);
                }
            }
        }
        let _remove = RemoveClient;
        let tmp = tempfile::tempdir().unwrap();
        start_server(&tmp.path().join("pmix"));
        let (uid, gid) = unsafe_ids();
        let (tx, _rx) = mpsc::unbounded_channel();
        let spec = |name: &str, size: u32| NamespaceSpec {
            name: name.into(),
            jobid: name.into(),
            size,
            rank_app: vec![0; size as usize],
            napps: 1,
            nodes: vec!["n0"],
            me: 0,
            rank_node: vec![0; size as usize],
            rank_local: (0..size).collect(),
            rank_cpus: vec![],
            nsdir: tmp.path(),
            uid,
            gid,
            parent: None,
        };
        let tag = "0123456789abcdef0123456789abcdef";
        let a = Namespace::register(&spec(&format!("berth.70.1.{tag}"), 3), tx.clone()).expect("register A");
        let b = Namespace::register(&spec("berth.71.1.fedcba9876543210fedcba9876543210", 1), tx).expect("register B");
        // A rank with its own environment connects.
        let (code, out) = output(&mut guard(&a.fork_env(0), None, &["init"]));
        assert_eq!(code, Some(0), "{out}");
        assert!(out.contains(&format!("init ok berth.70.1.{tag} 0")), "{out}");
        // The name without its secret part (all a stranger can guess) names nothing.
        let mut guessed = a.fork_env(0);
        guessed.retain(|(k, _)| k != "PMIX_NAMESPACE");
        guessed.push(("PMIX_NAMESPACE".into(), "berth.70.1".into()));
        let (code, out) = output(&mut guard(&guessed, None, &["init"]));
        assert_eq!(code, Some(3), "a guessed namespace connected: {out}");
        // Another user (nobody) who knows the name, with libpmix's own client (which sends
        // its real uid): refused. (A rank refused so cannot connect afterwards either: a
        // libpmix 4.2 bug; rank 2 is left aside for it.)
        let (code, out) = output(&mut guard(&a.fork_env(2), Some(65534), &["init"]));
        assert_eq!(code, Some(3), "another user connected as rank 2: {out}");
        assert!(out.contains("init failed"), "{out}");
        // Events: rank 1 of A and rank 0 of B listen; rank 0 of A sends one (range GLOBAL),
        // then the agent announces rank 0 of A lost.
        let (mut a1, a1_lines) = listen(&a.fork_env(1), 4);
        let (mut b0, b0_lines) = listen(&b.fork_env(0), 4);
        assert!(lines_until(&a1_lines, "registered").last().unwrap() == "registered");
        assert!(lines_until(&b0_lines, "registered").last().unwrap() == "registered");
        let (code, out) = output(&mut guard(&a.fork_env(0), None, &["notify"]));
        assert_eq!(code, Some(0), "{out}");
        assert!(a.notify_lost(0), "the agent's own event was not sent");
        let a1_seen = lines_until(&a1_lines, "listened");
        let b0_seen = lines_until(&b0_lines, "listened");
        let _ = (a1.wait(), b0.wait());
        let from_a0 = format!("event PROC-ABORTED from berth.70.1.{tag}:0");
        assert_eq!(a1_seen.iter().filter(|l| **l == from_a0).count(), 2, "A's rank 1 saw: {a1_seen:?}");
        assert_eq!(a1_seen.last().map(String::as_str), Some("listened, 2 events"), "{a1_seen:?}");
        assert_eq!(b0_seen.last().map(String::as_str), Some("listened, 0 events"), "B's rank 0 saw: {b0_seen:?}");
        drop(a);
        drop(b);
    }

    /// A step's namespace is the same on all its agents (from its link key) and tells
    /// nothing of another step's: 128 secret bits after `berth.JOB.STEP.`.
    #[test]
    fn a_steps_namespace_name_carries_a_secret_of_its_link_key() {
        let link = |b: u8| berth_protocol::auth::LinkKey::from_hex(&format!("{b:02x}").repeat(32)).unwrap();
        let job = berth_core::JobId(12);
        let name = namespace_name(job, 3, &link(1));
        assert_eq!(name, namespace_name(job, 3, &link(1)));
        let tag = name.strip_prefix("berth.12.3.").expect(&name);
        assert_eq!(tag.len(), 32, "{name}");
        assert!(tag.bytes().all(|b| b.is_ascii_hexdigit()), "{name}");
        assert_ne!(name, namespace_name(job, 3, &link(2)), "another step's key, another name");
        assert!(name.len() < 255, "PMIX_MAX_NSLEN");
    }

    /// This process's PMIx server, as the agent starts it (berthd's main sets the variables
    /// before any thread starts; here, before the server is, once for every test).
    fn start_server(tmpdir: &Path) {
        static VARS: std::sync::Once = std::sync::Once::new();
        VARS.call_once(|| {
            for (k, v) in [GDS_VAR] {
                if std::env::var_os(k).is_none() {
                    std::env::set_var(k, v);
                }
            }
        });
        ensure_server(tmpdir).expect("PMIx server");
    }

    fn unsafe_ids() -> (u32, u32) {
        // SAFETY: no arguments, cannot fail.
        unsafe { (libc::getuid(), libc::getgid()) }
    }
}
