//! Reservations for external schedulers (ALPS/BASIL-style, seeds/002): inventory, reserve
//! (atomic placement now, or "try again" with the reason), confirm (bind to a holder), claim
//! (`berth run --job` inside it), release. See docs/reservations.md.
//!
//! A reservation is a running job with no batch script in queue `reservation`, made the way
//! `berth run` makes an interactive allocation (`Controller::start_without_script`): its
//! allocation is claimed, and every node's agent holds its cgroup and TMPDIR, so steps and
//! tasks run in it through the normal paths. This module adds who holds it and until when,
//! and releases it when the holder goes away.

use crate::config::ApiConfig;
use crate::model::effect::Effect;
use crate::model::job::{JobRecord, RESERVATION_QUEUE};
use crate::model::request::Peer;
use crate::model::reservation::{Reservation, Reservations};
use crate::state::Controller;
use crate::store::StoreError;
use berth_core::directives::SubmitOptions;
use berth_core::gres::{LicenseMiss, Licenses};
use berth_core::job::{Allocation, JobState, NodeAllocation, NumaShare};
use berth_core::node::NodeState;
use berth_core::placement::cluster::feasible_when_up as feasible;
use berth_core::placement::JobRequest;
use berth_core::sched::{self, Placement};
use berth_core::units::format_size;
use berth_core::{CpuSet, JobId};
use berth_protocol::client::ClientResponse;
use berth_protocol::reservation::{
    ConfirmRequest, Holder, Inventory, InventoryNode, NodeHolder, NodeRequest, NumaFree, NumaMemory, ReservationError,
    ReservationInfo, ReservationReply, ReservationRequest, ReservationState, ReserveRequest, ReservedNode,
};
use berth_protocol::user::UserIdentity;
use berth_protocol::ErrorCode as Code;
use std::collections::{BTreeMap, HashMap};

type Answer<T> = Result<Result<T, ReservationError>, StoreError>;

fn fail<T>(code: Code, message: impl Into<String>) -> Answer<T> {
    Ok(Err(ReservationError::new(code, message)))
}

/// A process on this host as /proc shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcInfo {
    /// Start time, clock ticks after boot (field 22 of /proc/PID/stat).
    pub start: u64,
    pub zombie: bool,
    /// Real uid.
    pub uid: u32,
}

/// What /proc says of `pid`, if it exists.
pub fn proc_info(pid: u32) -> Option<ProcInfo> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?;
    let start = fields.get(19)?.parse().ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let uid = status.lines().find(|l| l.starts_with("Uid:"))?.split_whitespace().nth(1)?.parse().ok()?;
    Some(ProcInfo { start, zombie: *state == "Z" || *state == "X", uid })
}

/// Whether process `pid` still exists as the one that started at `since` (kill(pid, 0), then
/// /proc for zombies and reuse of the pid).
pub fn process_alive(pid: u32, since: Option<u64>) -> bool {
    let Ok(p) = i32::try_from(pid) else { return false };
    // SAFETY: signal 0 only checks that the process exists and may be signalled.
    let rc = unsafe { libc::kill(p, 0) };
    if rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return false;
    }
    match proc_info(pid) {
        Some(info) => !info.zombie && since.is_none_or(|s| s == info.start),
        None => false,
    }
}

/// A local user by login name: uid, primary gid and groups, from the passwd and group files.
pub fn lookup_user(name: &str) -> Option<UserIdentity> {
    let cname = std::ffi::CString::new(name).ok()?;
    let mut buf = vec![0u8; 16 * 1024];
    // SAFETY: the buffers are ours and sized; getpwnam_r writes only within them.
    let (uid, gid) = unsafe {
        let mut pwd: libc::passwd = std::mem::zeroed();
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        let rc =
            libc::getpwnam_r(cname.as_ptr(), &mut pwd, buf.as_mut_ptr() as *mut libc::c_char, buf.len(), &mut found);
        if rc != 0 || found.is_null() {
            return None;
        }
        (pwd.pw_uid, pwd.pw_gid)
    };
    let mut groups = vec![0 as libc::gid_t; 256];
    let mut n = groups.len() as libc::c_int;
    // SAFETY: `groups` has room for `n` entries; getgrouplist writes at most that many.
    let rc = unsafe { libc::getgrouplist(cname.as_ptr(), gid, groups.as_mut_ptr(), &mut n) };
    groups.truncate(if rc < 0 { 0 } else { n.max(0) as usize });
    if groups.is_empty() {
        groups.push(gid);
    }
    Some(UserIdentity { uid, gid, groups, name: name.to_string() })
}

impl Controller {
    /// A request of the reservations API (HTTP, or `reservation` on the client socket).
    pub(crate) fn reservation_request(
        &mut self,
        req: ReservationRequest,
        peer: &Peer,
        now: f64,
    ) -> Result<ClientResponse, StoreError> {
        // Answers reflect every end that happened since the last tick.
        self.check_reservations(now, true)?;
        let one = |r: Result<ReservationInfo, ReservationError>, created: bool| match r {
            Ok(info) => ReservationReply::One { reservation: Box::new(info), created },
            Err(e) => ReservationReply::Failed(e),
        };
        let reply = match req {
            ReservationRequest::Inventory => ReservationReply::Inventory(Box::new(self.inventory(now))),
            ReservationRequest::List { all } => ReservationReply::List { reservations: self.list_reservations(all)? },
            ReservationRequest::Show { id } => one(self.show_reservation(id)?, false),
            ReservationRequest::Reserve { body } => one(self.reserve(body, peer, now)?, true),
            ReservationRequest::Confirm { id, body } => one(self.confirm(id, &body, peer, now)?, false),
            ReservationRequest::Renew { id } => one(self.renew(id, peer, now)?, false),
            ReservationRequest::Release { id } => one(self.release_request(id, peer, now)?, false),
        };
        Ok(ClientResponse::Reservation { reply })
    }

    /// Every node: its `berth nodes` view, what is free, and who holds the rest.
    pub fn inventory(&self, now: f64) -> Inventory {
        let nodes = self
            .nodes_in_order()
            .into_iter()
            .map(|i| {
                let cap = &self.cluster.nodes()[i];
                let topo = &cap.topology;
                let mut free = cap.free_pus.clone();
                free.subtract(&cap.system_pus);
                let holders = self
                    .jobs_on_node(i)
                    .into_iter()
                    .filter_map(|id| {
                        let job = self.jobs.get(&id)?;
                        let part = job.allocation.iter().find(|a| a.node_id.0 as usize == i)?;
                        Some(NodeHolder {
                            job: id,
                            reservation: self.reservations.of_job(id).map(|r| r.id),
                            user: job.user.name.clone(),
                            cpus: part.cpus.to_list(),
                            memory_bytes: part.memory_bytes,
                            gpus: part.gpus.clone(),
                        })
                    })
                    .collect();
                InventoryNode {
                    info: self.node_info(i, false),
                    free_cores: cap.free_core_count,
                    free_pus: cap.free_pu_count,
                    free_cpus: free.to_list(),
                    free_memory_bytes: cap.free_memory,
                    numa_free: topo
                        .numa_nodes
                        .iter()
                        .zip(&cap.numa_free)
                        .map(|(n, bytes)| {
                            let mut cpus = n.cpus.clone();
                            cpus.subtract(&cap.busy_pus());
                            cpus.subtract(&cap.system_pus);
                            NumaFree { os_index: n.os_index, free_bytes: *bytes, free_cpus: cpus.to_list() }
                        })
                        .collect(),
                    free_gpus: cap.free_gpus_of(None).collect(),
                    holders,
                }
            })
            .collect();
        Inventory { time: now, nodes, licenses: self.license_info() }
    }

    fn list_reservations(&self, all: bool) -> Result<Vec<ReservationInfo>, StoreError> {
        let rows: Vec<Reservation> =
            if all { self.store.all_reservations(10_000)? } else { self.reservations.values().cloned().collect() };
        rows.iter().map(|r| self.reservation_info(r)).collect()
    }

    fn show_reservation(&self, id: u64) -> Answer<ReservationInfo> {
        let Some(r) = self.find_reservation(id)? else { return fail(Code::UnknownReservation, unknown(id)) };
        let mut info = self.reservation_info(&r)?;
        info.claims = self.store.job_steps(r.job)?.iter().map(|s| s.info()).collect();
        Ok(Ok(info))
    }

    fn find_reservation(&self, id: u64) -> Result<Option<Reservation>, StoreError> {
        match self.reservations.get(id) {
            Some(r) => Ok(Some(r.clone())),
            None => self.store.get_reservation(id),
        }
    }

    /// What the API shows of `r`: its allocation is its job's (live, or as stored).
    fn reservation_info(&self, r: &Reservation) -> Result<ReservationInfo, StoreError> {
        let alloc = match self.jobs.get(&r.job) {
            Some(j) => j.allocation.clone(),
            None => self.ended_job(r.job)?.map(|j| j.allocation).unwrap_or_default(),
        };
        let nodes = alloc
            .iter()
            .map(|a| ReservedNode {
                node: a.node.clone(),
                address: self.agent_address(a.node_id.0 as usize),
                cpus: a.cpus.to_list(),
                cores: a.cores,
                mems: a.mems.to_list(),
                memory_bytes: a.memory_bytes,
                numa_memory: a.numa_memory.iter().map(|s| NumaMemory { numa: s.numa, bytes: s.bytes }).collect(),
                gpus: a.gpus.clone(),
                gres: a.gres.clone(),
            })
            .collect();
        let mut licenses = berth_core::gres::Counts::new();
        for a in &alloc {
            for (name, &n) in &a.licenses {
                let c = licenses.entry(name.clone()).or_insert(0);
                *c = c.saturating_add(n);
            }
        }
        Ok(ReservationInfo {
            licenses,
            id: r.id,
            job: r.job,
            user: r.user.clone(),
            uid: r.uid,
            state: r.state,
            created: r.created,
            confirm_by: (r.state == ReservationState::Unconfirmed).then_some(r.confirm_by),
            ends: r.ends,
            walltime_seconds: r.walltime,
            holder: r.holder.clone(),
            renew_by: r.renew_by.filter(|_| r.state == ReservationState::Confirmed),
            explicit: r.explicit,
            nodes,
            released_at: r.released_at,
            release_reason: r.release_reason.clone(),
            claims: vec![],
        })
    }

    /// The identity a reservation is made for.
    fn reservation_user(&self, name: Option<&str>, peer: &Peer) -> Result<UserIdentity, ReservationError> {
        match name {
            None => Ok(peer.user.clone()),
            Some(n) if n == peer.user.name => Ok(peer.user.clone()),
            Some(n) if !self.is_admin(peer) => Err(ReservationError::new(
                Code::NotPermitted,
                format!(
                    "you ({}) may only reserve for yourself, not for {n}; only admins reserve for others",
                    peer.user.name
                ),
            )),
            Some(n) => lookup_user(n).ok_or_else(|| {
                ReservationError::new(Code::UnknownUser, format!("there is no user {n:?} on the controller's host"))
            }),
        }
    }

    /// `POST /v1/reservations`: place now, all or nothing, and persist before answering.
    fn reserve(&mut self, body: ReserveRequest, peer: &Peer, now: f64) -> Answer<ReservationInfo> {
        let user = match self.reservation_user(body.user.as_deref(), peer) {
            Ok(u) => u,
            Err(e) => return Ok(Err(e)),
        };
        let id = self.reservations.next_id();
        let mut options = SubmitOptions {
            name: Some(format!("reservation-{id}")),
            queue: Some(RESERVATION_QUEUE.into()),
            ..Default::default()
        };
        if let Err(e) = options.set("walltime", &body.walltime.as_text()) {
            return fail(Code::BadRequest, format!("walltime: {e}"));
        }
        let walltime = options.walltime.unwrap_or(1);
        let max = self.cfg.api.max_walltime_secs;
        if walltime > max {
            return fail(
                Code::Infeasible,
                format!("walltime {walltime} s is more than the {max} s a reservation may last (config [api] max_walltime_secs); ask for less"),
            );
        }
        let explicit = !body.node_list.is_empty();
        for (name, value) in body.resources.entries() {
            if explicit && !matches!(name, "mem" | "mem-per-cpu" | "threads" | "licenses") {
                return fail(
                    Code::BadRequest,
                    format!("resources.{} cannot be combined with node_list: the list says where and how much (its entries' cpus, gpus and gres); only mem, mem_per_cpu, threads and licenses may be given with it", name.replace('-', "_")),
                );
            }
            if let Err(e) = options.set(name, &value.as_text()) {
                return fail(Code::BadRequest, format!("resources.{}: {e}", name.replace('-', "_")));
            }
        }
        if let Some(a) = &body.account {
            if let Err(e) = options.set("account", a) {
                return fail(Code::BadRequest, format!("account: {e}"));
            }
        }
        if options.mem.is_none() && options.mem_per_cpu.is_none() {
            options.mem_per_cpu = Some(self.default_mem_per_cpu());
        }
        // Checked for both kinds: the job's options must describe a request (the store
        // refuses to load a job whose options do not).
        let request = match JobRequest::from_options(&options) {
            Ok(r) => r,
            Err(e) => return fail(Code::BadRequest, e.to_string()),
        };
        // Licenses the cluster does not have, or more than exist: never.
        if let Err(LicenseMiss::Never(why)) =
            Licenses::new(self.cluster.licenses.total.clone()).check(&request.licenses)
        {
            return fail(
                Code::Infeasible,
                format!("this reservation can never be placed here: {why}; ask for less (GET /v1/inventory)"),
            );
        }
        let placed = if explicit {
            self.explicit_allocation(&body.node_list, &options).and_then(|mut alloc| {
                // Free now, beside the advance reservations it would run into, as a job's.
                if !request.licenses.is_empty() {
                    let (view, _) = self.advance_view(now, walltime as f64);
                    if let Err(why) = view.licenses.check(&request.licenses) {
                        return Err(try_again(why.to_string()));
                    }
                    if let Some(first) = alloc.first_mut() {
                        first.licenses = request.licenses.clone();
                    }
                }
                Ok(alloc)
            })
        } else {
            self.place_now(&request, walltime, now)
        };
        let alloc = match placed {
            Ok(a) => a,
            Err(e) => return Ok(Err(e)),
        };
        if explicit {
            // What the list holds, for whatever reads the job's size from its options.
            options.cores = Some(alloc.iter().map(|a| a.cores).sum::<u32>().max(1));
        }
        let job = JobRecord {
            id: JobId(0),
            name: format!("reservation-{id}"),
            user: user.clone(),
            state: JobState::Running,
            queue: RESERVATION_QUEUE.into(),
            walltime: Some(walltime),
            options,
            submit_time: now,
            start_time: Some(now),
            end_time: None,
            allocation: alloc,
            exit_code: None,
            signal: None,
            reason: None,
            cwd: "/".into(),
            stdout: "/dev/null".into(),
            stderr: "/dev/null".into(),
            script: "".into(),
            env: std::sync::Arc::new(vec![
                ("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()),
                ("BERTH_RESERVATION_ID".into(), id.to_string()),
            ]),
            usage: None,
            kill_sent: None,
            suspension: Default::default(),
        };
        let job_id =
            self.start_without_script(job, &format!("reservation {id} for {} by {}", user.name, peer.user.name), now)?;
        self.reservations.id_taken();
        let r = Reservation {
            id,
            job: job_id,
            uid: user.uid,
            user: user.name.clone(),
            state: ReservationState::Unconfirmed,
            created: now,
            confirm_by: now + self.cfg.api.confirm_timeout_secs,
            ends: now + walltime as f64,
            walltime,
            holder: None,
            holder_since: None,
            renew_by: None,
            explicit,
            released_at: None,
            release_reason: None,
        };
        let effects = kept(&mut self.reservations, r.clone());
        self.queue(effects);
        Ok(Ok(self.reservation_info(&r)?))
    }

    /// Place `request` on what is free now, outside the queue: busy is "try again" with the
    /// placement's reason, impossible (even with every registered node up) is "infeasible".
    fn place_now(&self, request: &JobRequest, walltime: u64, now: f64) -> Result<Allocation, ReservationError> {
        // Off the advance reservations it would run into (docs/scheduling.md).
        let (view, _) = self.advance_view(now, walltime as f64);
        match sched::place(&view, request) {
            Placement::Now(alloc) => Ok(alloc),
            Placement::Busy(what) => {
                let what = what.to_string();
                let reason = if what.is_empty() { "waiting for cores or memory to free up".to_string() } else { what };
                Err(try_again(reason))
            }
            Placement::Never(why) => {
                let registered = |n: &berth_core::node::NodeCapacity| self.ever_registered(n.id.0 as usize);
                match feasible(self.cluster.nodes(), &self.cluster.policy, request, registered) {
                    Ok(()) => Err(try_again(format!("it needs nodes that are not up now: {why}"))),
                    Err(never) => Err(ReservationError::with_reason(
                        Code::Infeasible,
                        format!("this reservation can never be placed here: {never}; ask for less (GET /v1/inventory)"),
                        never.to_string(),
                    )),
                }
            }
        }
    }

    /// A specific resource list, honoured exactly: every PU listed must exist, be free now
    /// and not be a system CPU; the memory comes from the NUMA nodes local to the PUs.
    fn explicit_allocation(
        &self,
        list: &[NodeRequest],
        options: &SubmitOptions,
    ) -> Result<Allocation, ReservationError> {
        let bad = |m: String| ReservationError::new(Code::BadRequest, m);
        let never = |m: String| {
            ReservationError::with_reason(
                Code::Infeasible,
                format!("{m}; change the resource list (GET /v1/inventory)"),
                m,
            )
        };
        let mut alloc = Vec::with_capacity(list.len());
        for (k, want) in list.iter().enumerate() {
            if list[..k].iter().any(|w| w.node == want.node) {
                return Err(bad(format!("node {} is listed twice in node_list", want.node)));
            }
            let Some(i) = self.node_by_name(&want.node) else {
                return Err(ReservationError::new(
                    Code::UnknownNode,
                    format!("there is no node {:?}; GET /v1/inventory lists the nodes", want.node),
                ));
            };
            let cap = &self.cluster.nodes()[i];
            let topo = &cap.topology;
            let mut usable = topo.all_pus();
            usable.subtract(&topo.disallowed);
            let cpus = match &want.cpus {
                Some(text) => {
                    CpuSet::parse_list(text).map_err(|e| bad(format!("node_list {}: cpus: {e}", want.node)))?
                }
                None => {
                    let mut c = usable.clone();
                    if !options.system_cpus.unwrap_or(false) {
                        c.subtract(&cap.system_pus);
                    }
                    c
                }
            };
            if cpus.is_empty() {
                return Err(bad(format!("node_list {}: no PUs listed", want.node)));
            }
            if !cpus.is_subset_of(&usable) {
                let mut missing = cpus.clone();
                missing.subtract(&usable);
                return Err(never(format!(
                    "node {} has no usable PU(s) {} (its PUs are {})",
                    want.node,
                    missing.to_list(),
                    usable.to_list()
                )));
            }
            if cpus.intersects(&cap.system_pus) {
                let mut sys = cpus.clone();
                sys.subtract(&{
                    let mut s = cpus.clone();
                    s.subtract(&cap.system_pus);
                    s
                });
                return Err(never(format!(
                    "PU(s) {} of node {} are system CPUs, held back for daemons (`berth node system-cpus`)",
                    sys.to_list(),
                    want.node
                )));
            }
            let ex = &self.extra[i];
            if !ex.usable() {
                let state = if ex.state == NodeState::Up { "not connected" } else { ex.state.as_str() };
                return Err(try_again(format!("node {} is {state}", want.node)));
            }
            let mut busy = cpus.clone();
            busy.subtract(&cap.free_pus);
            if !busy.is_empty() {
                let holders: Vec<String> = self
                    .jobs_on_node(i)
                    .into_iter()
                    .filter(|id| {
                        self.jobs[id].allocation.iter().any(|a| a.node_id.0 as usize == i && a.cpus.intersects(&busy))
                    })
                    .map(|id| id.to_string())
                    .collect();
                return Err(try_again(format!(
                    "PU(s) {} of node {} are held by job(s) {}",
                    busy.to_list(),
                    want.node,
                    if holders.is_empty() { "?".into() } else { holders.join(", ") }
                )));
            }
            let cores: Vec<usize> =
                (0..topo.cores.len()).filter(|&c| topo.cores[c].pus.iter().any(|&p| cpus.contains(p))).collect();
            if let Some(n) = cores.iter().filter_map(|&c| topo.cores[c].numa).find(|&n| cap.numa_exclusive[n]) {
                return Err(try_again(format!(
                    "NUMA node {} of node {} is held alone by a large parallel job",
                    topo.numa_nodes[n].os_index, want.node
                )));
            }
            let units = if options.threads.unwrap_or(false) { cpus.len() as u64 } else { cores.len() as u64 };
            let need = match (options.mem, options.mem_per_cpu) {
                (Some(m), _) => m,
                (None, Some(per)) => per.saturating_mul(units),
                (None, None) => 0,
            };
            let mems = topo.mems_for(&cpus);
            let local: Vec<usize> = mems.iter().filter_map(|os| topo.numa_by_os(os)).collect();
            let capacity: u64 = local.iter().map(|&n| topo.numa_nodes[n].memory_bytes).sum();
            if need > capacity {
                return Err(never(format!(
                    "{} of memory wanted on node {} but the NUMA node(s) {} local to PUs {} have {}",
                    format_size(need),
                    want.node,
                    mems.to_list(),
                    cpus.to_list(),
                    format_size(capacity)
                )));
            }
            let gpus = self.explicit_gpus(i, want)?;
            let gres = self.explicit_gres(i, want)?;
            let mut left = need;
            let mut shares = Vec::new();
            for &n in &local {
                let take = left.min(cap.numa_free[n]);
                if take > 0 {
                    shares.push(NumaShare { numa: topo.numa_nodes[n].os_index, bytes: take });
                    left -= take;
                }
            }
            if left > 0 {
                let free: u64 = local.iter().map(|&n| cap.numa_free[n]).sum();
                return Err(try_again(format!(
                    "{} of memory wanted on node {}'s NUMA node(s) {}, {} free now",
                    format_size(need),
                    want.node,
                    mems.to_list(),
                    format_size(free)
                )));
            }
            alloc.push(NodeAllocation {
                gres,
                licenses: Default::default(),
                node_id: cap.id,
                node: cap.name.clone(),
                cpus,
                cores: cores.len() as u32,
                mems,
                memory_bytes: need,
                numa_memory: shares,
                exclusive_numa: CpuSet::new(),
                subnodes: vec![],
                binding: vec![],
                ranks: vec![],
                gpus,
            });
        }
        Ok(alloc)
    }

    /// The GPUs an explicit entry lists on node `i`, by index: each exists (else infeasible)
    /// and is free now (else try again, naming the holders).
    fn explicit_gpus(&self, i: usize, want: &NodeRequest) -> Result<Vec<u32>, ReservationError> {
        let cap = &self.cluster.nodes()[i];
        let count = cap.topology.gpus.len() as u32;
        let mut gpus: Vec<u32> = Vec::with_capacity(want.gpus.len());
        for &g in &want.gpus {
            if gpus.contains(&g) {
                return Err(ReservationError::new(
                    Code::BadRequest,
                    format!("node_list {}: GPU {g} is listed twice", want.node),
                ));
            }
            if g >= count {
                let has = match count {
                    0 => "no GPU".to_string(),
                    n => format!("GPUs 0 to {}", n - 1),
                };
                let m = format!("node {} has {has}, not GPU {g}", want.node);
                return Err(ReservationError::with_reason(
                    Code::Infeasible,
                    format!("{m}; change the resource list (GET /v1/inventory)"),
                    m,
                ));
            }
            if !cap.gpu_free.get(g as usize).copied().unwrap_or(false) {
                let holders: Vec<String> = self
                    .jobs_on_node(i)
                    .into_iter()
                    .filter(|id| {
                        self.jobs[id].allocation.iter().any(|a| a.node_id.0 as usize == i && a.gpus.contains(&g))
                    })
                    .map(|id| id.to_string())
                    .collect();
                return Err(try_again(format!(
                    "GPU {g} of node {} is held by job(s) {}",
                    want.node,
                    if holders.is_empty() { "?".into() } else { holders.join(", ") }
                )));
            }
            gpus.push(g);
        }
        gpus.sort_unstable();
        Ok(gpus)
    }

    /// The generic resources an explicit entry asks of node `i`: bounded names and counts,
    /// the node has that many (else infeasible), and they are free now (else try again).
    fn explicit_gres(&self, i: usize, want: &NodeRequest) -> Result<berth_core::gres::Counts, ReservationError> {
        let what = format!("node_list {}: gres", want.node);
        berth_core::gres::check_config(&what, &want.gres)
            .map_err(|e| ReservationError::new(Code::BadRequest, e.to_string()))?;
        let cap = &self.cluster.nodes()[i];
        for (name, &n) in &want.gres {
            let total = cap.gres_total.get(name).copied().unwrap_or(0);
            if n > total {
                let m =
                    format!("node {} has {name}:{total} ([gres] in the controller's config), {n} wanted", want.node);
                return Err(ReservationError::with_reason(
                    Code::Infeasible,
                    format!("{m}; change the resource list (GET /v1/inventory)"),
                    m,
                ));
            }
            let free = cap.free_gres(name);
            if n > free {
                return Err(try_again(format!("{name}:{n} wanted on node {}, {free} free now", want.node)));
            }
        }
        Ok(want.gres.clone())
    }

    /// The live reservation `id` if `peer` may act on it.
    fn own_live(&self, id: u64, peer: &Peer, what: &str) -> Answer<Reservation> {
        let Some(r) = self.find_reservation(id)? else { return fail(Code::UnknownReservation, unknown(id)) };
        if r.uid != peer.user.uid && !self.is_admin(peer) {
            return fail(
                Code::NotPermitted,
                format!("reservation {id} belongs to {}; you may only {what} your own reservations", r.user),
            );
        }
        if r.state == ReservationState::Released {
            return fail(
                Code::InvalidState,
                format!(
                    "reservation {id} was released ({}); reserve again",
                    r.release_reason.as_deref().unwrap_or("released")
                ),
            );
        }
        Ok(Ok(r))
    }

    /// `POST /v1/reservations/{id}/confirm`: bind it to its holder.
    fn confirm(&mut self, id: u64, body: &ConfirmRequest, peer: &Peer, now: f64) -> Answer<ReservationInfo> {
        let holder = match body.holder() {
            Ok(h) => h,
            Err(e) => return fail(Code::BadRequest, e),
        };
        let mut r = match self.own_live(id, peer, "confirm")? {
            Ok(r) => r,
            Err(e) => return Ok(Err(e)),
        };
        if let Some(old) = &r.holder {
            if *old == holder {
                return Ok(Ok(self.reservation_info(&r)?));
            }
            return fail(Code::InvalidState, format!("reservation {id} is already confirmed for {old}"));
        }
        let admin = self.is_admin(peer);
        match &holder {
            Holder::Job { job } => {
                if *job == r.job {
                    return fail(
                        Code::BadRequest,
                        format!("job {job} is the reservation's own job; name the job that holds it"),
                    );
                }
                let record = match self.jobs.get(job) {
                    Some(j) => j.clone(),
                    None => match self.ended_job(*job)? {
                        Some(j) => {
                            return fail(
                                Code::InvalidState,
                                format!("job {job} has already ended ({}); confirm with a live job", j.state.as_str()),
                            )
                        }
                        None => return fail(Code::UnknownJob, format!("job {job} does not exist")),
                    },
                };
                if record.user.uid != r.uid && !admin {
                    return fail(
                        Code::NotPermitted,
                        format!("job {job} belongs to {}, the reservation to {}", record.user.name, r.user),
                    );
                }
            }
            Holder::Pid { pid } => {
                let Some(p) = proc_info(*pid).filter(|p| !p.zombie) else {
                    return fail(Code::UnknownProcess, format!("there is no process {pid} on the controller's host"));
                };
                if p.uid != r.uid && p.uid != peer.user.uid && !admin {
                    return fail(Code::NotPermitted, format!("process {pid} is not yours"));
                }
                r.holder_since = Some(p.start);
            }
            Holder::Session { .. } => r.renew_by = Some(now + self.cfg.api.session_timeout_secs),
        }
        let effects = confirmed(&mut self.reservations, &mut r, holder);
        self.queue(effects);
        Ok(Ok(self.reservation_info(&r)?))
    }

    /// `POST /v1/reservations/{id}/renew`: a session-confirmed reservation lives on.
    fn renew(&mut self, id: u64, peer: &Peer, now: f64) -> Answer<ReservationInfo> {
        let mut r = match self.own_live(id, peer, "renew")? {
            Ok(r) => r,
            Err(e) => return Ok(Err(e)),
        };
        match &r.holder {
            Some(Holder::Session { .. }) => {}
            Some(h) => {
                return fail(Code::InvalidState, format!("reservation {id} is held by {h}; only sessions are renewed"))
            }
            None => {
                return fail(
                    Code::InvalidState,
                    format!("reservation {id} is not confirmed; confirm it with a session first"),
                )
            }
        }
        r.renew_by = Some(now + self.cfg.api.session_timeout_secs);
        let effects = kept(&mut self.reservations, r.clone());
        self.queue(effects);
        Ok(Ok(self.reservation_info(&r)?))
    }

    /// `DELETE /v1/reservations/{id}`: free it now. Releasing a released one is answered with
    /// it as it is.
    fn release_request(&mut self, id: u64, peer: &Peer, now: f64) -> Answer<ReservationInfo> {
        match self.own_live(id, peer, "release")? {
            Ok(_) => {}
            Err(e) if e.code == Code::InvalidState => {
                return match self.store.get_reservation(id)? {
                    Some(r) => Ok(Ok(self.reservation_info(&r)?)),
                    None => fail(Code::UnknownReservation, unknown(id)),
                }
            }
            Err(e) => return Ok(Err(e)),
        }
        let reason = format!("released by {}", peer.user.name);
        self.release(id, JobState::Completed, &reason, now)?;
        match self.store.get_reservation(id)? {
            Some(r) => Ok(Ok(self.reservation_info(&r)?)),
            None => fail(Code::Internal, format!("reservation {id} vanished while released")),
        }
    }

    /// Release reservation `id`: written, logged, and its job ended (its steps and tasks
    /// killed as at any job's end) when it still runs, in `state`.
    pub fn release(&mut self, id: u64, state: JobState, reason: &str, now: f64) -> Result<(), StoreError> {
        let Some((job, effects)) = released(&mut self.reservations, id, reason, now) else { return Ok(()) };
        self.queue(effects);
        if self.jobs.get(&job).is_some_and(|j| j.state == JobState::Running) {
            let exit = (state == JobState::Completed).then_some(0);
            self.end_interactive(job, state, exit, Some(reason), now)?;
        }
        // Carried out now: `release_request` reads the reservation back from the store.
        self.carry_out_effects(now)
    }

    /// Release what has lost its reason to exist: its job ended (cancelled, node lost,
    /// walltime), not confirmed in time, holder job finished, holder process gone, session
    /// not renewed, walltime over. Holders are looked at every `[api] check_interval_secs`
    /// (every call when `now_too`).
    pub fn check_reservations(&mut self, now: f64, now_too: bool) -> Result<(), StoreError> {
        if !self.reservations.holders_due(now, self.cfg.api.check_interval_secs, now_too) {
            return Ok(());
        }
        // How the jobs of reservations that no longer run ended: as memory holds them while
        // they are live (requeued, suspended), else from their history.
        let mut ended: HashMap<JobId, String> = HashMap::new();
        for r in self.reservations.values() {
            let how = |j: &JobRecord| match &j.reason {
                Some(why) => format!("{} ({why})", j.state.as_str()),
                None => j.state.as_str().to_string(),
            };
            let how = match self.jobs.get(&r.job) {
                Some(j) if j.state == JobState::Running => continue,
                Some(j) => how(j),
                None => self.ended_job(r.job)?.map_or_else(|| "gone".into(), |j| how(&j)),
            };
            ended.insert(r.job, how);
        }
        let ends = due_releases(self.reservations.values(), &self.jobs, &ended, &self.cfg.api, now, process_alive);
        for (id, state, reason) in ends {
            self.release(id, state, &reason, now)?;
        }
        Ok(())
    }
}

/// Reservation `r` kept as it is now (made, or renewed): in the book, and its row to write.
/// Needs no store.
pub(crate) fn kept(book: &mut Reservations, r: Reservation) -> Vec<Effect> {
    book.keep(r.clone());
    vec![Effect::SaveReservation(Box::new(r))]
}

/// Reservation `r` confirmed for `holder` (checked by the caller): its row, then the event.
/// Needs no store.
pub(crate) fn confirmed(book: &mut Reservations, r: &mut Reservation, holder: Holder) -> Vec<Effect> {
    let detail = format!("reservation {}: {holder}", r.id);
    r.holder = Some(holder);
    r.state = ReservationState::Confirmed;
    let mut effects = kept(book, r.clone());
    effects.push(Effect::job_event("reservation_confirm", r.job, None, detail));
    effects
}

/// Live reservation `id` released now for `reason`: out of the book; its job (to end by the
/// caller if it still runs) and, to write, its row then the event. None when it is not live.
/// Needs no store.
pub(crate) fn released(book: &mut Reservations, id: u64, reason: &str, now: f64) -> Option<(JobId, Vec<Effect>)> {
    let mut r = book.remove(id)?;
    r.state = ReservationState::Released;
    r.released_at = Some(now);
    r.release_reason = Some(reason.to_string());
    tracing::info!(reservation = id, job = %r.job, "reservation released: {reason}");
    let job = r.job;
    let event = Effect::job_event("reservation_release", job, None, format!("reservation {id}: {reason}"));
    Some((job, vec![Effect::SaveReservation(Box::new(r)), event]))
}

/// The live reservations that lost their reason to exist at `now`, in order, each with the
/// state its job ends in and why: its job ended (`ended`: how, by job), the walltime is
/// over, not confirmed in time, the holder job ended, the holder process is gone (`alive`:
/// a pid and its start time), the session was not renewed. A job being killed waits for its
/// end. Needs no store.
pub(crate) fn due_releases<'a>(
    live: impl IntoIterator<Item = &'a Reservation>,
    jobs: &BTreeMap<JobId, JobRecord>,
    ended: &HashMap<JobId, String>,
    cfg: &ApiConfig,
    now: f64,
    alive: impl Fn(u32, Option<u64>) -> bool,
) -> Vec<(u64, JobState, String)> {
    let mut ends: Vec<(u64, JobState, String)> = Vec::new();
    for r in live {
        let running = jobs.get(&r.job).filter(|j| j.state == JobState::Running);
        let Some(job) = running else {
            let how = ended.get(&r.job).map_or("gone", String::as_str);
            ends.push((r.id, JobState::Completed, format!("its job {} ended: {how}", r.job)));
            continue;
        };
        if job.kill_sent.is_some() {
            continue;
        }
        if now >= r.ends {
            ends.push((r.id, JobState::Timeout, "walltime".into()));
            continue;
        }
        let gone = match &r.holder {
            None if now >= r.confirm_by => {
                Some((JobState::Cancelled, format!("not confirmed within {} s", cfg.confirm_timeout_secs)))
            }
            None => None,
            Some(Holder::Job { job }) => match jobs.get(job) {
                Some(_) => None,
                None => Some((JobState::Completed, format!("holder job {job} ended"))),
            },
            Some(Holder::Pid { pid }) => {
                (!alive(*pid, r.holder_since)).then(|| (JobState::Completed, format!("holder process {pid} exited")))
            }
            Some(Holder::Session { session }) => r.renew_by.filter(|t| now >= *t).map(|_| {
                (JobState::Completed, format!("session {session} not renewed within {} s", cfg.session_timeout_secs))
            }),
        };
        if let Some((state, reason)) = gone {
            ends.push((r.id, state, reason));
        }
    }
    ends
}

fn unknown(id: u64) -> String {
    format!("there is no reservation {id}; GET /v1/reservations lists them")
}

fn try_again(reason: String) -> ReservationError {
    ReservationError::with_reason(Code::TryAgain, format!("busy now: {reason}; try again later"), reason)
}

#[cfg(test)]
mod effect_tests;
#[cfg(test)]
mod tests;
