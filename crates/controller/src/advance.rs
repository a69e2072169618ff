//! Advance reservations (`berth resv`): an admin sets resources aside for a time window for
//! some users and/or accounts (projects); their jobs (`--reservation NAME`) run there, nobody
//! else's job holds them during the window. See docs/scheduling.md, "Advance reservations".
//!
//! This module keeps them (in memory and in the store), places them at creation, checks
//! submissions to them and gives the pass its input; the pass's rules are berth-core's
//! (`sched::backfill::plan_with_advance`). Not to be confused with the reservations API
//! (`crate::reservations`), whose reservations are placed now, like running jobs.

use crate::model::advance::{Advance, AdvanceBook};
use crate::model::effect::Effect;
use crate::model::job::JobRecord;
use crate::model::request::{error, Peer};
use crate::state::Controller;
use crate::store::StoreError;
use berth_core::directives::{valid_name, SubmitOptions};
use berth_core::job::{Allocation, JobState, NodeAllocation, NumaShare};
use berth_core::placement::cluster::feasible_when_up as feasible;
use berth_core::placement::JobRequest;
use berth_core::sched::backfill::{self, AdvanceReservation, Confine, Fit, RunningJob};
use berth_core::sched::reason::{PendingReason, ReservationWait};
use berth_core::sched::ClusterState;
use berth_core::units::format_duration;
use berth_core::{CpuSet, JobId};
use berth_protocol::client::{AdvanceCreate, AdvanceInfo, ApiError, ClientResponse, ErrorCode};
use berth_protocol::user::UserIdentity;
use std::collections::{BTreeMap, HashMap};

/// Seconds a member's job may start after the window opens and still end by its end: a
/// submission's walltime must leave them (the pass runs within a second of the opening).
pub const START_MARGIN_SECS: f64 = 60.0;

/// A time for people: `HH:MM` (local time) within a day of `now`, else `YYYY-MM-DD HH:MM`.
pub fn clock(t: f64, now: f64) -> String {
    let secs = t as libc::time_t;
    // SAFETY: an all-zero tm is valid; localtime_r writes only into it.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are to live locals.
    let ok = !unsafe { libc::localtime_r(&secs, &mut tm) }.is_null();
    if !ok {
        return format!("{t:.0}");
    }
    if (t - now).abs() < 86_400.0 {
        format!("{:02}:{:02}", tm.tm_hour, tm.tm_min)
    } else {
        format!("{:04}-{:02}-{:02} {:02}:{:02}", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min)
    }
}

fn api(code: ErrorCode, message: impl Into<String>) -> ApiError {
    ApiError::new(code, message)
}

/// A user name as a reservation lists it: what a login name may hold, at most 64.
fn valid_user(name: &str) -> bool {
    !name.is_empty() && name.len() <= 64 && name.chars().all(|c| c.is_ascii_alphanumeric() || "_-.@$".contains(c))
}

impl Controller {
    /// `berth resv create`: place, persist, answer with it.
    pub(crate) fn advance_create(
        &mut self,
        body: AdvanceCreate,
        peer: &Peer,
        now: f64,
    ) -> Result<ClientResponse, StoreError> {
        self.check_advance(now)?;
        let r = match self.new_advance(body, peer, now) {
            Ok(r) => r,
            Err(e) => return Ok(ClientResponse::Error(e)),
        };
        let effects = created(self.policy.advance_mut(), r.clone(), &peer.user.name, now);
        self.queue(effects);
        Ok(ClientResponse::Advance { reservations: vec![self.advance_info(&r, now)] })
    }

    /// Check a creation and place it, without side effects.
    fn new_advance(&self, body: AdvanceCreate, peer: &Peer, now: f64) -> Result<Advance, ApiError> {
        let bad = |m: String| api(ErrorCode::BadRequest, m);
        if !self.is_admin(peer) {
            return Err(api(
                ErrorCode::NotPermitted,
                format!(
                    "only admins create advance reservations (you are {}; see `admins` in the controller's config)",
                    peer.user.name
                ),
            ));
        }
        let book = self.policy.advance();
        let name = match body.name {
            Some(n) if !valid_name(&n) => {
                return Err(bad(format!("--name needs 1 to 64 letters, digits, _ - and ., got {n:?}")))
            }
            Some(n) => n,
            None => (1u64..).map(|i| format!("resv{i}")).find(|n| !book.contains(n)).unwrap_or_default(),
        };
        if book.contains(&name) {
            return Err(bad(format!(
                "an advance reservation named {name} exists; choose another --name or `berth resv delete {name}` first"
            )));
        }
        if let Some(u) = body.users.iter().find(|u| !valid_user(u)) {
            return Err(bad(format!("--users: {u:?} is not a user name")));
        }
        if let Some(a) = body.accounts.iter().find(|a| !valid_name(a)) {
            return Err(bad(format!("--accounts: {a:?} is not an account name (letters, digits, _ - .)")));
        }
        // A typo would make a reservation nobody can use: names must be known here.
        let verify = self.cfg.verify_names;
        if let Some(u) = body.users.iter().find(|u| verify && !crate::users::user_exists(u)) {
            return Err(bad(format!(
                "--users: there is no user {u} on this host; check the name (`getent passwd {u}`)"
            )));
        }
        let known_account =
            |a: &String| !verify || self.cfg.fair_share.shares.contains_key(a) || crate::users::group_exists(a);
        if let Some(a) = body.accounts.iter().find(|a| !known_account(a)) {
            return Err(bad(format!(
                "--accounts: {a} is neither a group on this host nor an account of the fair-share configuration"
            )));
        }
        if body.users.is_empty() && body.accounts.is_empty() {
            return Err(bad("say who may use it: --users a,b and/or --accounts proj".into()));
        }
        berth_core::gres::check_config("--gres", &body.gres).map_err(|e| bad(e.to_string()))?;
        berth_core::gres::check_config("--licenses", &body.licenses).map_err(|e| bad(e.to_string()))?;
        if body.gres.contains_key("gpu") {
            return Err(bad("--gres: reserve GPUs with --gpus (with --cores), or whole --nodes".into()));
        }
        // Licenses the cluster does not have, or more than it has, can never be reserved.
        if let Err(berth_core::gres::LicenseMiss::Never(why)) =
            berth_core::gres::Licenses::new(self.cluster.licenses.total.clone()).check(&body.licenses)
        {
            return Err(api(ErrorCode::Infeasible, format!("this reservation can never be placed here: {why}")));
        }
        let start = body.start.unwrap_or(now);
        if !start.is_finite() {
            return Err(bad("the start is not a time".into()));
        }
        // A start a little in the past (the client's "now") is now.
        if start < now - 300.0 {
            return Err(bad(format!(
                "the window would start in the past ({}); give a later --start, or `now`",
                clock(start, now)
            )));
        }
        let start = start.max(now);
        let end = match (body.end, body.duration_secs) {
            (Some(_), Some(_)) => return Err(bad("give --end or --duration, not both".into())),
            (None, None) => return Err(bad("give the window's --end or its --duration".into())),
            (Some(e), None) => e,
            (None, Some(d)) => start + d as f64,
        };
        if !end.is_finite() || end <= start {
            return Err(bad(format!(
                "the window must end after it starts (start {}, end {})",
                clock(start, now),
                clock(end, now)
            )));
        }
        let allocation = match (body.nodes.is_empty(), body.cores) {
            (false, Some(_)) => return Err(bad("give --nodes (whole nodes) or --cores, not both".into())),
            (true, None) if body.licenses.is_empty() => {
                return Err(bad(
                    "say what to reserve: --nodes n1,n2 (whole nodes), --cores N, or licenses alone (-L NAME:COUNT)"
                        .into(),
                ))
            }
            (true, None)
                if body.nodes_count.is_some() || body.mem.is_some() || body.gpus.is_some() || !body.gres.is_empty() =>
            {
                return Err(bad("--nodes-count, --mem, --gres and --gpus go with --cores".into()))
            }
            // Licenses alone: held for the window, its members' cores anywhere.
            (true, None) => self.licenses_for_window(&body.licenses, (start, end), now)?,
            (false, None)
                if body.nodes_count.is_some() || body.mem.is_some() || body.gpus.is_some() || !body.gres.is_empty() =>
            {
                return Err(bad(
                    "--nodes-count, --mem, --gres and --gpus go with --cores; --nodes reserves whole nodes (their GPUs and generic resources too)"
                        .into(),
                ))
            }
            (false, None) => self.whole_nodes(&body.nodes, &body.licenses, (start, end), now)?,
            (true, Some(cores)) => {
                let what = Wanted { cores, gpus: body.gpus, gres: &body.gres, licenses: &body.licenses };
                self.cores_for_window(what, body.nodes_count, body.mem, (start, end), now)?
            }
        };
        Ok(Advance {
            name,
            start,
            end,
            users: body.users,
            accounts: body.accounts,
            allocation,
            created: now,
            created_by: peer.user.name.clone(),
        })
    }

    /// Running (and suspended) jobs with their expected ends, for placing in the future.
    fn holders(&self, now: f64) -> Vec<RunningJob<Allocation>> {
        let unlimited = self.cfg.scheduler.unlimited_walltime_secs as f64;
        self.jobs
            .values()
            .filter(|j| j.state.has_allocation())
            .map(|j| {
                // A suspended job's clock is stopped: it holds on at least as long again.
                let extra = (j.suspension.seconds(now) - j.suspension.total_secs).max(0.0);
                RunningJob { id: j.id, alloc: j.allocation.clone(), end: j.expected_end(unlimited) + extra }
            })
            .collect()
    }

    /// The live advance reservations, for placing beside them at `at` among `holders`: each
    /// less the counts its members in `holders` still running at `at` hold (those are claimed
    /// already, as holders: not twice).
    fn advance_list(&self, holders: &[RunningJob<Allocation>], at: f64) -> Vec<AdvanceReservation<Allocation>> {
        self.policy
            .advance()
            .values()
            .map(|r| {
                let held: Vec<&Allocation> = holders
                    .iter()
                    .filter(|h| h.end > at)
                    .filter(|h| {
                        self.jobs.get(&h.id).and_then(|j| j.options.reservation.as_deref()) == Some(r.name.as_str())
                    })
                    .map(|h| &h.alloc)
                    .collect();
                AdvanceReservation {
                    id: r.name.clone(),
                    alloc: <ClusterState as Confine>::unheld(&r.allocation, &held),
                    start: r.start,
                    end: r.end,
                    members: vec![],
                }
            })
            .collect()
    }

    /// Whole nodes (every usable PU but system CPUs, all memory, GPUs and generic resources),
    /// if nothing else holds them during the window: no job still running at its start (by
    /// walltime), no other advance reservation whose window overlaps; and `licenses`, if
    /// enough are not held then (by running jobs or overlapping reservations).
    fn whole_nodes(
        &self,
        names: &[String],
        licenses: &berth_core::gres::Counts,
        (start, end): (f64, f64),
        now: f64,
    ) -> Result<Allocation, ApiError> {
        let holders = self.holders(now);
        let mut busy = vec![];
        let mut alloc = Vec::with_capacity(names.len());
        for (k, name) in names.iter().enumerate() {
            if names[..k].contains(name) {
                return Err(api(ErrorCode::BadRequest, format!("node {name} is listed twice")));
            }
            let Some(i) = self.node_by_name(name) else {
                return Err(api(
                    ErrorCode::UnknownNode,
                    format!("there is no node {name:?}; `berth nodes` lists them"),
                ));
            };
            let cap = &self.cluster.nodes()[i];
            for h in holders.iter().filter(|h| h.alloc.iter().any(|a| a.node_id == cap.id)) {
                if start <= now || h.end > start {
                    busy.push(format!("job {} holds {name} until about {}", h.id, clock(h.end, now)));
                }
            }
            for r in self.policy.advance().values() {
                if r.start < end && r.end > start && r.allocation.iter().any(|a| a.node_id == cap.id) {
                    busy.push(format!(
                        "reservation {} holds {name} from {} to {}",
                        r.name,
                        clock(r.start, now),
                        clock(r.end, now)
                    ));
                }
            }
            let topo = &cap.topology;
            let mut cpus = topo.all_pus();
            cpus.subtract(&topo.disallowed);
            cpus.subtract(&cap.system_pus);
            let cores = topo.cores.iter().filter(|c| c.pus.iter().any(|&p| cpus.contains(p))).count() as u32;
            let numa_memory: Vec<NumaShare> = topo
                .numa_nodes
                .iter()
                .filter(|n| n.memory_bytes > 0)
                .map(|n| NumaShare { numa: n.os_index, bytes: n.memory_bytes })
                .collect();
            alloc.push(NodeAllocation {
                // A whole node: its generic resources too.
                gres: cap.gres_total.clone(),
                licenses: Default::default(),
                node_id: cap.id,
                node: cap.name.clone(),
                cores,
                mems: CpuSet::from_iter_u32(topo.numa_nodes.iter().map(|n| n.os_index)),
                memory_bytes: numa_memory.iter().map(|s| s.bytes).sum(),
                numa_memory,
                cpus,
                exclusive_numa: CpuSet::new(),
                subnodes: vec![],
                binding: vec![],
                ranks: vec![],
                // A whole node: its GPUs too.
                gpus: (0..topo.gpus.len() as u32).collect(),
            });
        }
        if !licenses.is_empty() {
            // Licenses at the window's start: those of jobs still running then, and of the
            // reservations overlapping it.
            let mut at = backfill::machine_at(&self.sched_view(), &holders, start, now);
            for r in self.advance_list(&holders, start).iter().filter(|r| r.start < end && r.end > start) {
                at.claim_licenses(&r.alloc);
            }
            if let Err(why) = at.licenses.check(licenses) {
                busy.push(format!("{why} (held by running jobs or reservations then)"));
            }
            if let Some(first) = alloc.first_mut() {
                first.licenses = licenses.clone();
            }
        }
        if !busy.is_empty() {
            return Err(api(
                ErrorCode::Unavailable,
                format!(
                    "not free for the whole window {} to {}: {}; choose another window or other nodes",
                    clock(start, now),
                    clock(end, now),
                    busy.join("; ")
                ),
            ));
        }
        Ok(alloc)
    }

    /// Licenses alone for the window (`berth resv create -L matlab:2` without nodes or
    /// cores), if enough are not held at its start by jobs still running then (by walltime) or
    /// by overlapping reservations: one part on no node (`backfill::licenses_only`).
    fn licenses_for_window(
        &self,
        licenses: &berth_core::gres::Counts,
        (start, end): (f64, f64),
        now: f64,
    ) -> Result<Allocation, ApiError> {
        let holders = self.holders(now);
        let mut at = backfill::machine_at(&self.sched_view(), &holders, start, now);
        for r in self.advance_list(&holders, start).iter().filter(|r| r.start < end && r.end > start) {
            at.claim_licenses(&r.alloc);
        }
        if let Err(why) = at.licenses.check(licenses) {
            return Err(api(
                ErrorCode::Unavailable,
                format!(
                    "not free for the whole window {} to {}: {why} (held by running jobs or reservations then); choose another window or fewer licenses",
                    clock(start, now),
                    clock(end, now)
                ),
            ));
        }
        Ok(vec![backfill::licenses_only(licenses.clone())])
    }

    /// `cores` cores (on `nodes` nodes) placed for the window: on the machine as it will be at
    /// its start, beside the jobs that will still run then and the overlapping reservations.
    fn cores_for_window(
        &self,
        want: Wanted<'_>,
        nodes: Option<u32>,
        mem: Option<u64>,
        (start, end): (f64, f64),
        now: f64,
    ) -> Result<Allocation, ApiError> {
        let Wanted { cores, gpus, gres, licenses } = want;
        let mut options = SubmitOptions {
            cores: Some(cores),
            nodes,
            mem,
            gpus,
            gres: (!gres.is_empty()).then(|| gres.clone()),
            licenses: (!licenses.is_empty()).then(|| licenses.clone()),
            ..Default::default()
        };
        if mem.is_none() {
            options.mem_per_cpu = Some(self.default_mem_per_cpu());
        }
        let request = JobRequest::from_options(&options).map_err(|e| api(ErrorCode::BadRequest, e.to_string()))?;
        let mut asked = match gpus {
            Some(g) => format!("{cores} cores and {g} GPU(s)"),
            None => format!("{cores} cores"),
        };
        if !gres.is_empty() {
            asked.push_str(&format!(" with {} per node", berth_core::gres::render(gres)));
        }
        if !licenses.is_empty() {
            asked.push_str(&format!(" and licenses {}", berth_core::gres::render(licenses)));
        }
        let registered = |n: &berth_core::node::NodeCapacity| self.ever_registered(n.id.0 as usize);
        feasible(self.cluster.nodes(), &self.cluster.policy, &request, registered).map_err(|why| {
            api(ErrorCode::Infeasible, format!("this reservation can never be placed here: {why}; ask for less"))
        })?;
        let mut view = self.sched_view();
        let holders = self.holders(now);
        // Suspended jobs' PUs are free now but they come back to them.
        for j in self.jobs.values().filter(|j| j.state == JobState::Suspended) {
            view.claim(&j.allocation);
        }
        let others = self.advance_list(&holders, start);
        match backfill::place_for_window(&view, &holders, &others, &request, (start, end), now) {
            Fit::Now(alloc) => Ok(alloc),
            Fit::Busy(what) => {
                let overlapping: Vec<&str> =
                    others.iter().filter(|r| r.start < end && r.end > start).map(|r| r.id.as_str()).collect();
                let also = match overlapping.is_empty() {
                    true => String::new(),
                    false => format!(" and reservation(s) {}", overlapping.join(", ")),
                };
                Err(api(
                    ErrorCode::Unavailable,
                    format!(
                        "{asked} are not free for the whole window {} to {} (at its start: {what}), given the running jobs' walltimes{also}; choose another window or fewer cores",
                        clock(start, now),
                        clock(end, now)
                    ),
                ))
            }
            Fit::Never(why) => {
                Err(api(ErrorCode::Unavailable, format!("{asked} cannot be placed on the nodes up now: {why}")))
            }
        }
    }

    /// `berth resv list`.
    pub(crate) fn advance_list_response(&mut self, now: f64) -> Result<ClientResponse, StoreError> {
        self.check_advance(now)?;
        let mut all: Vec<&Advance> = self.policy.advance().values().collect();
        all.sort_by(|a, b| a.start.total_cmp(&b.start).then(a.name.cmp(&b.name)));
        Ok(ClientResponse::Advance { reservations: all.into_iter().map(|r| self.advance_info(r, now)).collect() })
    }

    /// `berth resv delete`: its running jobs keep running; its queued jobs never start.
    pub(crate) fn advance_delete(&mut self, name: &str, peer: &Peer, now: f64) -> Result<ClientResponse, StoreError> {
        if !self.is_admin(peer) {
            return Ok(error(
                ErrorCode::NotPermitted,
                format!("only admins delete advance reservations (you are {})", peer.user.name),
            ));
        }
        self.check_advance(now)?;
        let Some(r) = self.policy.advance().get(name).cloned() else {
            return Ok(error(
                ErrorCode::UnknownReservation,
                format!("there is no advance reservation {name:?}; `berth resv list` lists them"),
            ));
        };
        let info = self.advance_info(&r, now);
        let effects = deleted(self.policy.advance_mut(), &info, &peer.user.name);
        self.queue(effects);
        Ok(ClientResponse::AdvanceDeleted { reservation: Box::new(info) })
    }

    fn advance_info(&self, r: &Advance, now: f64) -> AdvanceInfo {
        let jobs = || self.jobs.values().filter(|j| j.options.reservation.as_deref() == Some(r.name.as_str()));
        AdvanceInfo {
            name: r.name.clone(),
            start: r.start,
            end: r.end,
            users: r.users.clone(),
            accounts: r.accounts.clone(),
            allocation: r.allocation.clone(),
            cores: r.allocation.iter().map(|a| a.cores).sum(),
            gpus: r.allocation.iter().map(|a| a.gpus.len() as u32).sum(),
            gres: sum_counts(r.allocation.iter().map(|a| &a.gres)),
            licenses: sum_counts(r.allocation.iter().map(|a| &a.licenses)),
            created: r.created,
            created_by: r.created_by.clone(),
            active: r.start <= now && now < r.end,
            running_jobs: jobs().filter(|j| j.state.has_allocation()).map(|j| j.id).collect(),
            queued_jobs: jobs().filter(|j| j.state.is_pending()).map(|j| j.id).collect(),
        }
    }

    /// Remove the reservations whose window is over (an event each), and mark the state dirty
    /// when a window opened or ended since the last check (members may start, others may use
    /// the resources). Every tick and every pass.
    pub fn check_advance(&mut self, now: f64) -> Result<(), StoreError> {
        let effects = windows_checked(self.policy.advance_mut(), &self.jobs, now);
        self.queue(effects);
        // Carried out now: the scheduling pass clears `dirty` right after this (`schedule`), so a
        // `Reschedule` decided here must set it first.
        self.carry_out_effects(now)
    }

    /// A submission with `--reservation NAME`: the reservation exists, the user or the job's
    /// account is one it admits, the job fits its resources and, started at the earliest (its
    /// start, or now), ends by its end.
    pub(crate) fn check_advance_submission(
        &self,
        name: &str,
        user: &UserIdentity,
        account: &str,
        walltime: Option<u64>,
        request: &JobRequest,
        now: f64,
    ) -> Result<(), ApiError> {
        let Some(r) = self.policy.advance().get(name).filter(|r| r.end > now) else {
            return Err(api(
                ErrorCode::UnknownReservation,
                format!("there is no advance reservation {name:?}; `berth resv list` lists them"),
            ));
        };
        if !r.admits(&user.name, account) {
            return Err(api(
                ErrorCode::NotPermitted,
                format!(
                    "reservation {name} is for {}; you ({}, account {account}) are not among them",
                    r.who(),
                    user.name
                ),
            ));
        }
        // A member starts at the first pass after the window opens (or later): keep a margin.
        let from = r.start.max(now) + START_MARGIN_SECS;
        let left = (r.end - from).floor().max(0.0) as u64;
        let Some(w) = walltime else {
            return Err(api(
                ErrorCode::BadRequest,
                format!(
                    "a job in reservation {name} needs a --walltime that ends by its end ({} at most)",
                    format_duration(left)
                ),
            ));
        };
        if from + w as f64 > r.end {
            return Err(api(
                ErrorCode::BadRequest,
                format!(
                    "the job's walltime {} cannot end by reservation {name}'s end at {}: at most {} fits from {}; ask for less --walltime",
                    format_duration(w),
                    clock(r.end, now),
                    format_duration(left),
                    if r.start > now { format!("its start at {} (less a minute to start it)", clock(r.start, now)) } else { "now (less a minute to start it)".into() }
                ),
            ));
        }
        // Its licenses and generic resources come from the reservation's.
        let held = sum_counts(r.allocation.iter().map(|a| &a.licenses));
        for (l, &n) in &request.licenses {
            let have = held.get(l).copied().unwrap_or(0);
            if n > have {
                return Err(api(
                    ErrorCode::Infeasible,
                    format!(
                        "reservation {name} holds {have} of license {l} and its jobs' licenses come from it: the job wants {n}; ask for at most {have}, or ask an admin to reserve more"
                    ),
                ));
            }
        }
        for (g, &n) in &request.gres {
            let most = r.allocation.iter().filter_map(|a| a.gres.get(g).copied()).max().unwrap_or(0);
            if n > most {
                return Err(api(
                    ErrorCode::Infeasible,
                    format!(
                        "reservation {name} holds at most {g}:{most} on a node: the job wants {g}:{n} on each node; ask for at most {most}"
                    ),
                ));
            }
        }
        // On the reservation's resources with nothing running: could it ever fit?
        let mut idle = self.cluster.clone();
        for j in self.jobs.values().filter(|j| j.state.has_allocation()) {
            idle.release(&j.allocation);
        }
        idle.update_nodes(|nodes| nodes.iter_mut().for_each(|n| n.state = berth_core::node::NodeState::Up));
        let confined = idle.confine(&r.allocation, &[]);
        let why = match berth_core::sched::place(&confined, request) {
            berth_core::sched::Placement::Now(_) => return Ok(()),
            berth_core::sched::Placement::Busy(busy) => busy.to_string(),
            berth_core::sched::Placement::Never(never) => never.to_string(),
        };
        let cores: u32 = r.allocation.iter().map(|a| a.cores).sum();
        let nodes: Vec<&str> =
            r.allocation.iter().filter(|a| a.node_id != backfill::NO_NODE).map(|a| a.node.as_str()).collect();
        let holds = match nodes.is_empty() {
            true => "licenses alone; its jobs run on any node".to_string(),
            false => format!("{cores} cores on {}", nodes.join(",")),
        };
        Err(api(
            ErrorCode::Infeasible,
            format!("this job can never fit reservation {name} ({holds}): {why}; ask for less"),
        ))
    }

    /// What the pass needs of the advance reservations: each with its members (jobs asking
    /// for it whose user or account it admits, queued or running), and the pending jobs that
    /// ask for one they cannot use (gone, or no longer admitting them), with the reason.
    pub(crate) fn advance_pass_input(&self) -> (Vec<AdvanceReservation<Allocation>>, HashMap<JobId, PendingReason>) {
        let book = self.policy.advance();
        let mut members: HashMap<&str, Vec<JobId>> = HashMap::new();
        let mut shut_out = HashMap::new();
        for j in self.jobs.values().filter(|j| j.state.is_pending() || j.state.has_allocation()) {
            let Some(name) = j.options.reservation.as_deref() else { continue };
            match book.get(name) {
                Some(r) if r.admits(&j.user.name, &crate::model::job::account_of(j)) => {
                    members.entry(&r.name).or_default().push(j.id)
                }
                Some(r) if j.state.is_pending() => {
                    let why =
                        ReservationWait::NotAdmitted { name: name.into(), user: j.user.name.clone(), who: r.who() };
                    shut_out.insert(j.id, PendingReason::Reservation(why));
                }
                None if j.state.is_pending() => {
                    shut_out.insert(j.id, PendingReason::Reservation(ReservationWait::Gone { name: name.into() }));
                }
                _ => {}
            }
        }
        let advance = book
            .values()
            .map(|r| AdvanceReservation {
                id: r.name.clone(),
                alloc: r.allocation.clone(),
                start: r.start,
                end: r.end,
                members: members.remove(r.name.as_str()).unwrap_or_default(),
            })
            .collect();
        (advance, shut_out)
    }

    /// The reason shown for a member waiting for its window to open.
    pub(crate) fn advance_wait_reason(&self, job: &JobRecord, now: f64) -> Option<PendingReason> {
        let r = self.policy.advance().get(job.options.reservation.as_deref()?)?;
        (r.start > now).then(|| {
            PendingReason::Reservation(ReservationWait::Starts { name: r.name.clone(), at: clock(r.start, now) })
        })
    }

    /// The machine for a job that is not a member starting now for `w` seconds: the nodes up,
    /// with the advance reservations it would run into claimed; and whether there were any.
    pub(crate) fn advance_view(&self, now: f64, w: f64) -> (ClusterState, bool) {
        let mut view = self.sched_view();
        let mut any = false;
        for r in self.policy.advance().values() {
            if r.end > now && (r.start < now + w || r.start <= now) {
                // Less what its running members hold (claimed already: not twice).
                let held: Vec<&Allocation> = self
                    .jobs
                    .values()
                    .filter(|j| j.state.has_allocation() && j.options.reservation.as_deref() == Some(r.name.as_str()))
                    .map(|j| &j.allocation)
                    .collect();
                view.claim(&<ClusterState as Confine>::unheld(&r.allocation, &held));
                any = true;
            }
        }
        (view, any)
    }

    /// Whether job `id` runs or asks to run in a live advance reservation.
    pub(crate) fn in_advance(&self, job: &JobRecord) -> bool {
        job.options.reservation.as_deref().is_some_and(|n| self.policy.advance().contains(n))
    }
}

/// What a reservation of cores asks for besides: GPUs in all, generic resources per node,
/// licenses.
struct Wanted<'a> {
    cores: u32,
    gpus: Option<u32>,
    gres: &'a berth_core::gres::Counts,
    licenses: &'a berth_core::gres::Counts,
}

/// The counts of all `parts` added up.
fn sum_counts<'a>(parts: impl Iterator<Item = &'a berth_core::gres::Counts>) -> berth_core::gres::Counts {
    let mut out = berth_core::gres::Counts::new();
    for c in parts {
        for (name, &n) in c {
            let e = out.entry(name.clone()).or_insert(0);
            *e = e.saturating_add(n);
        }
    }
    out
}

/// Advance reservation `r`, placed, is created by `by`: kept; its row, the event and a pass
/// to write and do, in that order. Needs no store.
pub(crate) fn created(book: &mut AdvanceBook, r: Advance, by: &str, now: f64) -> Vec<Effect> {
    let nodes: Vec<String> = r
        .allocation
        .iter()
        .filter(|a| a.node_id != backfill::NO_NODE)
        .map(|a| format!("{}:{}", a.node, a.cpus))
        .collect();
    let mut held = String::new();
    for (what, counts) in [
        ("gres", sum_counts(r.allocation.iter().map(|a| &a.gres))),
        ("licenses", sum_counts(r.allocation.iter().map(|a| &a.licenses))),
    ] {
        if !counts.is_empty() {
            held.push_str(&format!(" {what} {}", berth_core::gres::render(&counts)));
        }
    }
    let detail = format!(
        "{}: {} to {} on {}{held} for {} (by {by})",
        r.name,
        clock(r.start, now),
        clock(r.end, now),
        if nodes.is_empty() { "no node".to_string() } else { nodes.join(" ") },
        r.who(),
    );
    tracing::info!("advance reservation {detail}");
    book.keep(r.clone());
    vec![Effect::SaveAdvance(Box::new(r)), advance_event("advance_create", detail), Effect::Reschedule]
}

/// Advance reservation `info.name` is deleted by `by`: forgotten; its row removed, the event
/// (naming its jobs, from `info`) and a pass, in that order. Needs no store.
pub(crate) fn deleted(book: &mut AdvanceBook, info: &AdvanceInfo, by: &str) -> Vec<Effect> {
    let name = &info.name;
    let ids = |v: &[JobId]| v.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",");
    let detail = format!(
        "{name}: deleted by {by}; running jobs [{}] keep running, queued jobs [{}] will not start",
        ids(&info.running_jobs),
        ids(&info.queued_jobs)
    );
    tracing::info!("advance reservation {detail}");
    book.remove(name);
    vec![Effect::DeleteAdvance { name: name.clone() }, advance_event("advance_delete", detail), Effect::Reschedule]
}

/// The windows at `now`: a pass when one opened since the last check (members may start);
/// each reservation whose window is over is forgotten, its row removed and its end logged
/// (naming the queued jobs of `jobs` that will not start), then a pass. Needs no store.
pub(crate) fn windows_checked(book: &mut AdvanceBook, jobs: &BTreeMap<JobId, JobRecord>, now: f64) -> Vec<Effect> {
    let since = book.checked_to(now);
    let mut effects = vec![];
    if book.values().any(|r| r.start > since && r.start <= now) {
        effects.push(Effect::Reschedule);
    }
    let over: Vec<String> = book.values().filter(|r| r.end <= now).map(|r| r.name.clone()).collect();
    for name in over {
        let Some(r) = book.remove(&name) else { continue };
        let queued: Vec<String> = jobs
            .values()
            .filter(|j| j.state.is_pending() && j.options.reservation.as_deref() == Some(name.as_str()))
            .map(|j| j.id.to_string())
            .collect();
        let detail = format!(
            "{name}: window {} to {} is over; queued jobs [{}] will not start",
            clock(r.start, now),
            clock(r.end, now),
            queued.join(",")
        );
        tracing::info!("advance reservation {detail}");
        effects.extend([Effect::DeleteAdvance { name }, advance_event("advance_end", detail), Effect::Reschedule]);
    }
    effects
}

/// An event about advance reservations (no job, no node).
fn advance_event(kind: &str, detail: String) -> Effect {
    Effect::Event { kind: kind.into(), job: None, node: None, detail }
}

#[cfg(test)]
mod effect_tests;
#[cfg(test)]
mod tests;
