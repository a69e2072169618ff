//! Steps (`berth run`): grants inside a running job's allocation, interactive allocations made
//! for one step, their ends, and signals. See docs/protocol/01-client.md, "Steps (berth run)".
//!
//! A step claims whole cores of its job (`berth_core::step::plan_step`); the claims of the
//! steps that have not ended are kept in memory and in the store (`steps` table), so a second
//! step gets other cores, and a controller restart keeps them.

use crate::model::effect::Effect;
use crate::model::job::{JobRecord, Usage, INTERACTIVE_QUEUE};
use crate::model::request::{error, Peer};
use crate::model::step::{LiveStep, LiveSteps, StepRow};
use crate::state::{Controller, NodeExtra};
use crate::store::StoreError;
use berth_core::directives::SubmitOptions;
use berth_core::job::{Allocation, JobState};
use berth_core::placement::JobRequest;
use berth_core::sched::{self, Placement};
use berth_core::step::mpmd::App;
use berth_core::step::{RankBinding, StepError, StepGpus, StepPlan};
use berth_core::topology::Topology;
use berth_core::{CpuSet, JobId};
use berth_protocol::agent::{ControllerMessage, StepRef};
use berth_protocol::auth::LinkKey;
use berth_protocol::client::{ApiError, ClientResponse, ErrorCode, IdResult};
use berth_protocol::step::{InteractiveAsk, StepCreate, StepGrant, StepNode, StepOutcome};

type Reply = Result<ClientResponse, StoreError>;

/// Failure recorded for steps whose `run` went away without reporting.
pub const RUN_DISCONNECTED: &str = "berth run disconnected";

/// Failure recorded for steps that no client watches and whose root agent does not know.
pub const ROOT_LOST: &str = "lost: the agent at the root of its control tree no longer runs it";

/// Bound on a step's ranks, nodes and cores per rank (as `max_count` bounds a job's).
const MAX_STEP_COUNT: u32 = 1 << 20;

/// Beyond a grant's lifetime: agents' clocks may run a little behind ours.
const GRANT_CLOCK_MARGIN_SECS: f64 = 30.0;

fn api(code: ErrorCode, message: impl Into<String>) -> ApiError {
    ApiError::new(code, message)
}

/// The parts of a step request that need no state.
fn check_request(req: &StepCreate) -> Result<(), ApiError> {
    let bad = |m: String| Err(api(ErrorCode::BadRequest, m));
    if req.argv.is_empty() || req.argv[0].is_empty() {
        return bad("nothing to run: give a command after the options".into());
    }
    if req.argv.iter().any(|a| a.contains('\0')) {
        return bad("an argument of the command contains a NUL byte".into());
    }
    if !req.cwd.starts_with('/') {
        return bad(format!("working directory {:?} is not absolute", req.cwd));
    }
    if req.env.iter().any(|(k, v)| k.is_empty() || k.contains(['=', '\0']) || v.contains('\0')) {
        return bad(
            "the environment holds a variable that cannot be passed to a process (empty name, '=' or NUL)".into()
        );
    }
    if let Some(parent) = &req.spawned_by {
        // A PMIx namespace name (PMIX_MAX_NSLEN), handed to the agents' PMIx servers.
        if req.job.is_none() {
            return bad("a spawned step runs in its parent's job: name the job".into());
        }
        if parent.nspace.is_empty() || parent.nspace.len() > 255 || !parent.nspace.bytes().all(|b| b.is_ascii_graphic())
        {
            return bad(
                "the spawning step's PMIx namespace is not a namespace name (1-255 printable characters)".into()
            );
        }
    }
    if req.fanout == 1 || req.fanout > 32 {
        return bad(format!("--fanout {} is out of range: give 2 to 32, or 0 for a flat launch", req.fanout));
    }
    if let Some(s) = req.notify_signal {
        if !(1..=64).contains(&s) {
            return bad(format!("notify signal {s} is not a signal number (1-64)"));
        }
    }
    let r = &req.request;
    if r.ntasks == Some(0) || r.tasks_per_node == Some(0) || r.cpus_per_task == Some(0) || r.nodes == Some(0) {
        return bad("-n, -N, --ntasks-per-node and --cpus-per-task must be at least 1".into());
    }
    // Every rank is planned in memory before anything else is checked.
    for (flag, v) in
        [("-n", r.ntasks), ("-N", r.nodes), ("--ntasks-per-node", r.tasks_per_node), ("-c", r.cpus_per_task)]
    {
        if v.is_some_and(|v| v > MAX_STEP_COUNT) {
            return bad(format!("{flag} {} is out of range: at most {MAX_STEP_COUNT}", v.unwrap_or_default()));
        }
    }
    if req.job.is_none() && req.interactive.nodes == Some(0) {
        return bad("--nodes must be at least 1".into());
    }
    mpmd::check(req)
}

/// A step that does not fit is refused as infeasible (with what to do); a malformed one is a bad request.
fn step_error(e: StepError) -> ApiError {
    let code = match e.inner() {
        StepError::Invalid(_) => ErrorCode::BadRequest,
        _ => ErrorCode::Infeasible,
    };
    api(code, e.to_string())
}

fn unknown_job(id: JobId) -> ApiError {
    api(ErrorCode::UnknownJob, format!("job {id} does not exist; `berth jobs --all` lists jobs"))
}

impl Controller {
    pub(crate) fn step_create(&mut self, req: StepCreate, peer: &Peer, now: f64) -> Reply {
        if let Err(e) = check_request(&req) {
            return Ok(ClientResponse::Error(e));
        }
        let result = match req.job {
            Some(id) => self.step_in_job(id, req, peer, now)?,
            None => self.interactive(req, peer, now)?,
        };
        Ok(match result {
            Ok(r) => r,
            Err(e) => ClientResponse::Error(e),
        })
    }

    /// Whether `peer` may act on running job `id` (or suspended, with `suspended_ok`); a
    /// refusal of someone else's job is recorded (`denied`).
    fn running_job_of(
        &mut self,
        id: JobId,
        peer: &Peer,
        what: &str,
        suspended_ok: bool,
        now: f64,
    ) -> Result<Result<(), ApiError>, StoreError> {
        let Some(job) = self.jobs.get(&id) else {
            return Ok(Err(match self.ended_job(id)? {
                Some(j) => api(
                    ErrorCode::InvalidState,
                    format!("job {id} has already ended ({}); {what} only in running jobs", j.state.as_str()),
                ),
                None => unknown_job(id),
            }));
        };
        if job.user.uid != peer.user.uid && !self.is_admin(peer) {
            let action = if what.starts_with("signal") { "signal" } else { "run steps in" };
            let owner = job.user.name.clone();
            self.denied(peer, action, Some(id), &owner, now)?;
            return Ok(Err(api(
                ErrorCode::NotPermitted,
                format!("job {id} belongs to {owner}; you may only act on your own jobs"),
            )));
        }
        if job.state != JobState::Running && !(suspended_ok && job.state == JobState::Suspended) {
            return Ok(Err(api(
                ErrorCode::InvalidState,
                format!("job {id} is {}; {what} only in running jobs (`berth show {id}`)", job.state.as_str()),
            )));
        }
        Ok(Ok(()))
    }

    fn step_in_job(
        &mut self,
        id: JobId,
        mut req: StepCreate,
        peer: &Peer,
        now: f64,
    ) -> Result<Result<ClientResponse, ApiError>, StoreError> {
        if let Err(e) = self.running_job_of(id, peer, "steps run", false, now)? {
            return Ok(Err(e));
        }
        let Some(job) = self.jobs.get(&id) else { return Ok(Err(unknown_job(id))) };
        if let Some(r) = &job.kill_sent {
            return Ok(Err(api(ErrorCode::InvalidState, format!("job {id} is ending ({r}); it takes no new steps"))));
        }
        // An --exclusive job's steps take its tasks by default, not every CPU of its whole
        // nodes (as srun in Slurm's exclusive allocation).
        if let Some(t) = job.options.tasks {
            let r = &mut req.request;
            if r.ntasks.is_none() && r.nodes.is_none() && r.tasks_per_node.is_none() {
                r.ntasks = Some(t.total);
                r.tasks_per_node = t.per_node;
            }
        }
        let in_use = self.in_use(id, &job.allocation);
        let (plan, apps) = match self.plan(&job.allocation, &in_use, &req) {
            Ok(p) => p,
            Err(e) => return Ok(Err(e)),
        };
        let mut grant = self.grant(id, plan, apps, req, peer, now, false);
        self.sign(&mut grant, now);
        Ok(Ok(self.granted(grant)))
    }

    /// PUs per node of `alloc` held by the job's live steps (overcommitted steps hold none).
    pub fn in_use(&self, id: JobId, alloc: &Allocation) -> Vec<CpuSet> {
        let mut in_use = vec![CpuSet::new(); alloc.len()];
        for live in self.steps.of(id) {
            for (k, cpus) in &live.claims {
                if let Some(u) = in_use.get_mut(*k) {
                    u.union_with(cpus);
                }
            }
        }
        in_use
    }

    /// Where the ranks go, and what each runs in an MPMD step (its apps; empty: one program).
    fn plan(&self, alloc: &Allocation, in_use: &[CpuSet], req: &StepCreate) -> Result<(StepPlan, Vec<App>), ApiError> {
        let mut topos: Vec<&Topology> = Vec::with_capacity(alloc.len());
        for a in alloc {
            match self.cluster.nodes().get(a.node_id.0 as usize) {
                Some(n) => topos.push(&n.topology),
                None => return Err(api(ErrorCode::Internal, format!("node {} of the job is unknown", a.node))),
            }
        }
        let gpus = StepGpus::of_step(&req.request, &req.env).map_err(|e| api(ErrorCode::BadRequest, e.to_string()))?;
        mpmd::plan(alloc, &topos, in_use, req, gpus.as_ref())
    }

    /// Record a planned step (durable before the grant is replied: `Effect::InsertStep`) and
    /// hold its cores; the grant is signed by the caller ([`Self::sign`]). Decided by
    /// [`step_granted`].
    #[allow(clippy::too_many_arguments)]
    fn grant(
        &mut self,
        id: JobId,
        plan: StepPlan,
        apps: Vec<App>,
        req: StepCreate,
        peer: &Peer,
        now: f64,
        interactive: bool,
    ) -> StepGrant {
        let step = self.counts.next_step(id);
        self.counts.step_taken(id, step);
        // Both callers just found the job running (or made it).
        let job = &self.jobs[&id];
        let given = Given { step, peer, now, interactive, kill_grace_ms: self.kill_grace_ms() };
        let (grant, live, effects) = step_granted(job, &self.extra, plan, apps, req, &given);
        self.steps.add(id, live);
        self.queue(effects);
        grant
    }

    /// Agents start ranks only for a grant signed with the cluster key (docs/protocol/06-auth.md,
    /// "Authentication"); nothing of it may change after this.
    fn sign(&self, grant: &mut StepGrant, now: f64) {
        if let Some(key) = &self.key {
            let expires = (now * 1000.0) as u64 + berth_protocol::auth::GRANT_LIFETIME.as_millis() as u64;
            berth_protocol::auth::sign_grant(key, grant, expires);
        }
    }

    /// The answer to `run`: the grant and its tree's link key (empty without a cluster key:
    /// unit tests only, whose grants no agent would take either).
    fn granted(&self, grant: StepGrant) -> ClientResponse {
        let link_key = self.key.as_ref().map(|k| LinkKey::of_grant(k, &grant).to_hex()).unwrap_or_default();
        ClientResponse::StepGranted { grant: Box::new(grant), link_key }
    }

    /// What an interactive allocation asks of placement, checked against `[interactive]`.
    fn interactive_request(&self, req: &StepCreate) -> Result<(SubmitOptions, JobRequest), ApiError> {
        let lim = &self.cfg.interactive;
        let r = &req.request;
        let too_large = || api(ErrorCode::BadRequest, "the request is too large");
        let cpt = r.cpus_per_task.unwrap_or(1);
        let nodes = req.interactive.nodes;
        let ntasks = match (r.ntasks, r.tasks_per_node, nodes) {
            (Some(n), _, _) => n,
            (None, Some(k), n) => k.checked_mul(n.unwrap_or(1)).ok_or_else(too_large)?,
            (None, None, Some(n)) => n,
            (None, None, None) => 1,
        };
        let mut options = SubmitOptions {
            cpus_per_task: Some(cpt),
            name: Some("interactive".into()),
            queue: Some(INTERACTIVE_QUEUE.into()),
            mem_per_cpu: Some(self.default_mem_per_cpu()),
            ..Default::default()
        };
        match (r.tasks_per_node, nodes) {
            (Some(k), n) => {
                options.nodes = Some(n.unwrap_or(ntasks.div_ceil(k)));
                options.tasks_per_node = Some(k);
            }
            (None, Some(n)) => {
                options.nodes = Some(n);
                options.tasks_per_node = Some(ntasks.div_ceil(n));
            }
            (None, None) => options.cores = Some(ntasks.checked_mul(cpt).ok_or_else(too_large)?),
        }
        if let Some(g) = r.gpus_per_task {
            if g == 0 {
                return Err(api(ErrorCode::BadRequest, "--gpus-per-task must be at least 1".to_string()));
            }
            // Each rank its own GPUs: per node as many as its ranks there, else in all.
            match options.tasks_per_node {
                Some(k) => options.gpus_per_node = Some(k.checked_mul(g).ok_or_else(too_large)?),
                None => options.gpus = Some(ntasks.checked_mul(g).ok_or_else(too_large)?),
            }
        }
        Self::interactive_resources(&req.interactive, &mut options)?;
        let request = JobRequest::from_options(&options).map_err(|e| api(ErrorCode::BadRequest, e.to_string()))?;
        self.check_gres_and_licenses(&request)?;
        let cores = request.total_cpus();
        if cores > lim.max_cores as u64 {
            return Err(api(
                ErrorCode::Infeasible,
                format!(
                    "an interactive allocation may hold at most {} cores (config [interactive] max_cores) and this one needs {cores}; ask for fewer, or submit a batch job and use `berth run` in it",
                    lim.max_cores
                ),
            ));
        }
        if let Some(n) = options.nodes.filter(|&n| n > lim.max_nodes) {
            return Err(api(
                ErrorCode::Infeasible,
                format!(
                    "an interactive allocation may span at most {} nodes (config [interactive] max_nodes) and this one needs {n}; ask for fewer, or submit a batch job and use `berth run` in it",
                    lim.max_nodes
                ),
            ));
        }
        let ask = req.interactive.walltime_seconds.unwrap_or(lim.max_walltime_secs);
        options.walltime = Some(ask.clamp(1, lim.max_walltime_secs));
        Ok((options, request))
    }

    /// An interactive allocation's GPUs, generic resources and licenses (`berth run --gpus
    /// --gres -L` outside a job) into its options, bounded as a submission's; a GPU count
    /// beside `--gpus-per-task` (which sets the GPUs from the ranks) is refused.
    fn interactive_resources(ask: &InteractiveAsk, options: &mut SubmitOptions) -> Result<(), ApiError> {
        let bad = |m: String| api(ErrorCode::BadRequest, m);
        let counted = ask.gpus.is_some() || ask.gpus_per_node.is_some() || ask.gpus_per_socket.is_some();
        if counted && (options.gpus.is_some() || options.gpus_per_node.is_some()) {
            return Err(bad(
                "--gpus-per-task sets an interactive allocation's GPUs (ranks x N); give it or --gpus/--gpus-per-node/--gpus-per-socket, not both".into(),
            ));
        }
        if counted {
            options.gpus = ask.gpus;
            options.gpus_per_node = ask.gpus_per_node;
        }
        options.gpus_per_socket = ask.gpus_per_socket;
        options.sockets_per_node = ask.sockets_per_node;
        options.gpu_type = ask.gpu_type.clone();
        if !ask.gres.is_empty() {
            berth_core::gres::check_node_config("--gres", &ask.gres).map_err(|e| bad(e.to_string()))?;
            if ask.gres.keys().any(|k| berth_core::gres::split_key(k).0 == "gpu") {
                return Err(bad("--gres: GPUs are asked with --gpus, --gpus-per-node or --gpus-per-task".into()));
            }
            options.gres = Some(ask.gres.clone());
        }
        if !ask.licenses.is_empty() {
            berth_core::gres::check_config("--licenses", &ask.licenses).map_err(|e| bad(e.to_string()))?;
            options.licenses = Some(ask.licenses.clone());
        }
        Ok(())
    }

    /// `berth run` outside a job: place an allocation now (outside the queue) or say why not,
    /// then grant its one step.
    fn interactive(
        &mut self,
        req: StepCreate,
        peer: &Peer,
        now: f64,
    ) -> Result<Result<ClientResponse, ApiError>, StoreError> {
        if !self.cfg.interactive.enabled {
            return Ok(Err(api(
                ErrorCode::NotPermitted,
                "interactive allocations are disabled here (config [interactive] enabled = false); submit a batch job and use `berth run` in it",
            )));
        }
        let mut req = req;
        if let Err(e) = mpmd::interactive_shape(&mut req) {
            return Ok(Err(e));
        }
        let (options, request) = match self.interactive_request(&req) {
            Ok(x) => x,
            Err(e) => return Ok(Err(e)),
        };
        // Off the advance reservations it would run into (docs/scheduling.md).
        let walltime = options.walltime.unwrap_or(self.cfg.interactive.max_walltime_secs) as f64;
        let alloc = match sched::place(&self.advance_view(now, walltime).0, &request) {
            Placement::Now(alloc) => alloc,
            Placement::Busy(what) => {
                let what = what.to_string();
                let reason = if what.is_empty() { "waiting for cores or memory to free up".into() } else { what };
                return Ok(Ok(ClientResponse::TryAgain { reason }));
            }
            Placement::Never(why) => {
                return Ok(Err(api(
                    ErrorCode::Infeasible,
                    format!("this interactive allocation can never be placed on the nodes up now: {why}; ask for less (see `berth nodes`)"),
                )))
            }
        };
        let max_nodes = self.cfg.interactive.max_nodes as usize;
        if alloc.len() > max_nodes {
            let reason = format!(
                "the free cores are spread over {} nodes now, more than the {max_nodes} an interactive allocation may span (config [interactive] max_nodes)",
                alloc.len()
            );
            return Ok(Ok(ClientResponse::TryAgain { reason }));
        }
        // Plan before anything is created: a step that cannot be laid out leaves no job behind.
        let empty = vec![CpuSet::new(); alloc.len()];
        let (plan, apps) = match self.plan(&alloc, &empty, &req) {
            Ok(p) => p,
            Err(e) => return Ok(Err(e)),
        };
        let job = JobRecord {
            id: JobId(0),
            name: "interactive".into(),
            user: peer.user.clone(),
            state: JobState::Running,
            queue: INTERACTIVE_QUEUE.into(),
            walltime: options.walltime,
            options,
            submit_time: now,
            start_time: Some(now),
            end_time: None,
            allocation: alloc,
            exit_code: None,
            signal: None,
            reason: None,
            cwd: req.cwd.clone(),
            stdout: "/dev/null".into(),
            stderr: "/dev/null".into(),
            script: "".into(),
            env: std::sync::Arc::new(req.env.clone()),
            usage: None,
            kill_sent: None,
            suspension: Default::default(),
        };
        let id = self.start_without_script(job, &peer.user.name, now)?;
        // The step rides on its first node's launch order: that agent starts the ranks as soon
        // as the job is set up there, while `run` is still waiting for its grant (the sync),
        // and `run` attaches to them (docs/protocol/01-client.md, "An interactive step starts
        // from its launch order").
        let first = plan.nodes.first().map(|n| n.node.clone());
        let order = self.out.agents.iter().position(|(_, m)| {
            matches!(m, ControllerMessage::Launch(s) if s.id == id && Some(&s.allocation.node) == first.as_ref())
        });
        let mut grant = self.grant(id, plan, apps, req, peer, now, true);
        grant.attach = order.is_some();
        self.sign(&mut grant, now);
        if let Some((_, ControllerMessage::Launch(spec))) = order.and_then(|i| self.out.agents.get_mut(i)) {
            spec.step = Some(Box::new(grant.clone()));
        }
        Ok(Ok(self.granted(grant)))
    }

    /// Make `job` (a running job with no batch script and its allocation placed now: an
    /// interactive allocation, or a reservation) under the next job id: written to the store,
    /// its resources claimed, and launched on every node, whose agents hold its cgroup and
    /// TMPDIR for its steps and tasks. The event is named after its queue.
    pub(crate) fn start_without_script(
        &mut self,
        mut job: JobRecord,
        detail: &str,
        now: f64,
    ) -> Result<JobId, StoreError> {
        let id = self.take_job_id();
        let effects = started_without_script(&mut job, id, detail, now);
        self.queue(effects);
        self.cluster.claim(&job.allocation);
        self.jobs.insert(id, job);
        // Sent directly (the launch's step is added to its order after this): nothing queued
        // before it in this command is a `Send` (the effects above are writes), so no order
        // decided earlier can be overtaken.
        self.launch_all(id);
        Ok(id)
    }

    /// End an interactive allocation now: it has no batch script whose end to wait for.
    pub(crate) fn end_interactive(
        &mut self,
        id: JobId,
        state: JobState,
        exit_code: Option<i32>,
        reason: Option<&str>,
        now: f64,
    ) -> Result<(), StoreError> {
        let Some(job) = self.jobs.get_mut(&id) else { return Ok(()) };
        let Some(effects) = interactive_ended(job, state, exit_code, reason, now) else { return Ok(()) };
        self.queue(effects);
        // Carried out before `end_running` retires the job (which may drain its nodes; it carries
        // out its own effects after these): a node's row queued before is written as it is now.
        self.carry_out_effects(now)?;
        self.end_running(id, now, reason.unwrap_or("job ended"), None)
    }

    pub(crate) fn step_end(&mut self, job: JobId, step: u32, outcome: &StepOutcome, peer: &Peer, now: f64) -> Reply {
        // A step not ended is in memory; one ended already (a second report) is history.
        let found = match self.steps.get(job, step) {
            Some(s) => Some((s.uid, s.user.clone(), s.interactive)),
            None => self.store.get_step(job, step)?.map(|r| (r.uid, r.user, r.interactive)),
        };
        let Some((uid, user, interactive)) = found else {
            return Ok(match self.jobs.contains_key(&job) || self.ended_job(job)?.is_some() {
                true => error(ErrorCode::UnknownJob, format!("job {job} has no step {step}")),
                false => ClientResponse::Error(unknown_job(job)),
            });
        };
        if uid != peer.user.uid && !self.is_admin(peer) {
            self.denied(peer, &format!("end step {step} of"), Some(job), &user, now)?;
            return Ok(error(
                ErrorCode::NotPermitted,
                format!("step {job}.{step} belongs to {user}; you may only end your own steps"),
            ));
        }
        let failure = outcome.failures.first().map(|f| f.describe()).or_else(|| outcome.failed_at.clone());
        let end = StepEnd { time: now, exit_code: Some(outcome.exit_code), failure: failure.clone(), node: None };
        let effects = step_closed(&mut self.steps, job, step, end, format!("step {step}: exit {}", outcome.exit_code));
        self.queue(effects);
        if interactive {
            let state = if outcome.exit_code == 0 { JobState::Completed } else { JobState::Failed };
            self.end_interactive(job, state, Some(outcome.exit_code), failure.as_deref(), now)?;
        }
        Ok(ClientResponse::Done { results: vec![IdResult { id: job, ok: true, error: None }] })
    }

    /// A step's end as the agent at the root of its control tree saw it (crate docs:
    /// docs/protocol/02-agent.md, "Step ends from agents"): closes a batch job's step that `run` did not
    /// close (it died, or its report was lost to a restart), so the step's cores are the job's
    /// again. The first end recorded wins; an interactive allocation's step ends with `run`'s
    /// connection instead.
    pub(crate) fn agent_step_end(
        &mut self,
        node: usize,
        job: JobId,
        step: u32,
        exit_code: i32,
        failure: Option<String>,
        now: f64,
    ) -> Result<(), StoreError> {
        // Only a step not ended yet (in memory) is closed here, and not an interactive one.
        if self.steps.get(job, step).is_none_or(|s| s.interactive) {
            return Ok(());
        }
        let name = self.cluster.nodes().get(node).map(|n| n.name.clone()).unwrap_or_default();
        let failure: Option<String> = failure.map(|f| f.chars().take(2000).collect());
        let detail = format!("step {step}: exit {exit_code} (reported by {name}: `berth run` did not report it)");
        let end = StepEnd { time: now, exit_code: Some(exit_code), failure, node: Some(name) };
        let effects = step_closed(&mut self.steps, job, step, end, detail);
        self.queue(effects);
        self.queue([Effect::Reschedule]);
        // Carried out now: `handle_agent` then acks the step with `send_to_node` directly, which
        // must follow the orders queued here.
        self.carry_out_effects(now)
    }

    /// Steps as the agent of `node` knows them (its registration or heartbeat): an open step
    /// rooted there that no `run` watches (its connection went with a controller restart) and
    /// that the agent does not list has ended unseen (its ranks were killed with a restarted
    /// agent, or its `run` died before starting it): closed, so its cores are the job's again.
    /// A step whose grant can still be used waits, unless the agent restarted since the grant
    /// (its new instance refuses the grant).
    pub(crate) fn reconcile_root_steps(
        &mut self,
        node: usize,
        listed: &[StepRef],
        restarted: bool,
        now: f64,
    ) -> Result<(), StoreError> {
        let Some(name) = self.cluster.nodes().get(node).map(|n| n.name.clone()) else { return Ok(()) };
        for (job, step, interactive) in lost_root_steps(&self.steps, &name, listed, restarted, now) {
            tracing::warn!(job = %job, step, node = %name, "{ROOT_LOST}");
            let end = StepEnd { time: now, exit_code: None, failure: Some(ROOT_LOST.into()), node: Some(name.clone()) };
            let effects = step_closed(&mut self.steps, job, step, end, format!("step {step}: {ROOT_LOST}"));
            self.queue(effects);
            if interactive {
                self.end_interactive(job, JobState::Failed, None, Some(ROOT_LOST), now)?;
            }
            self.queue([Effect::Reschedule]);
        }
        // The rest is queued with the command's effects: nothing after this in a registration or
        // heartbeat reads it back or queues an order directly.
        Ok(())
    }

    /// A client connection closed: the steps granted on it that were not ended are closed,
    /// and the interactive allocations made for them end (their ranks are killed).
    pub fn client_gone(&mut self, conn: u64, now: f64) -> Result<(), StoreError> {
        let gone = steps_of_connection(&self.steps, conn);
        self.allocs_gone(conn, now)?;
        for (job, step, interactive) in gone {
            tracing::info!(job = %job, step, "berth run disconnected without ending its step");
            let end = StepEnd { time: now, exit_code: None, failure: Some(RUN_DISCONNECTED.into()), node: None };
            let effects = step_closed(&mut self.steps, job, step, end, format!("step {step}: {RUN_DISCONNECTED}"));
            self.queue(effects);
            if interactive {
                self.end_interactive(job, JobState::Failed, None, Some(RUN_DISCONNECTED), now)?;
            }
        }
        Ok(())
    }

    /// Interactive allocations past their walltime end (the controller enforces it: there is
    /// no batch script whose agent would).
    pub fn check_interactive(&mut self, now: f64) -> Result<(), StoreError> {
        self.check_allocs(now)?;
        for id in interactive_over(self.jobs.values(), now) {
            self.end_interactive(id, JobState::Timeout, None, Some("walltime"), now)?;
        }
        Ok(())
    }

    /// Deliver a signal to a running job's processes on its nodes (of one step, when given).
    pub(crate) fn signal(&mut self, id: JobId, step: Option<u32>, signal: i32, peer: &Peer) -> Reply {
        if !(1..=64).contains(&signal) {
            return Ok(error(ErrorCode::BadRequest, format!("{signal} is not a signal number (1-64)")));
        }
        let outcome = self.signal_job(id, step, signal, peer)?;
        Ok(ClientResponse::Done {
            results: vec![match outcome {
                Ok(()) => IdResult { id, ok: true, error: None },
                Err(e) => IdResult { id, ok: false, error: Some(e) },
            }],
        })
    }

    fn signal_job(
        &mut self,
        id: JobId,
        step: Option<u32>,
        signal: i32,
        peer: &Peer,
    ) -> Result<Result<(), ApiError>, StoreError> {
        // A suspended job's processes get it now and act on it when the job resumes.
        let now = self.clock.unix();
        if let Err(e) = self.running_job_of(id, peer, "signals are delivered", true, now)? {
            return Ok(Err(e));
        }
        let Some(job) = self.jobs.get(&id) else { return Ok(Err(unknown_job(id))) };
        let Some(targets) = signal_targets(job, self.steps.of(id), step) else {
            let s = step.unwrap_or_default();
            return Ok(Err(match self.store.get_step(id, s)? {
                Some(_) => api(ErrorCode::InvalidState, format!("step {id}.{s} has already ended")),
                None => api(ErrorCode::UnknownJob, format!("job {id} has no step {s}")),
            }));
        };
        let connected = |n: &usize| self.extra.get(*n).is_some_and(|e| e.connected());
        let sends: Vec<Effect> = targets
            .into_iter()
            .filter(connected)
            .map(|node| Effect::Send { node, msg: ControllerMessage::Signal { id, step, signal } })
            .collect();
        let sent = sends.len();
        self.queue(sends);
        if sent == 0 {
            return Ok(Err(api(
                ErrorCode::Unavailable,
                format!("none of job {id}'s nodes is connected now; try again when they are (`berth nodes`)"),
            )));
        }
        Ok(Ok(()))
    }
}

/// What a step's grant is decided from besides the job, its plan and the request.
pub(crate) struct Given<'a> {
    /// The step's id (one more than any the job had: `JobCounts::next_step`).
    pub step: u32,
    pub peer: &'a Peer,
    pub now: f64,
    pub interactive: bool,
    pub kill_grace_ms: u64,
}

/// A planned step of `job` granted: the grant (unsigned), the step as kept live (its cores
/// held) and what to write, in order: its row, then its event. `extra` gives the nodes'
/// addresses and agent instances. Needs no store.
pub(crate) fn step_granted(
    job: &JobRecord,
    extra: &[NodeExtra],
    plan: StepPlan,
    apps: Vec<App>,
    req: StepCreate,
    given: &Given,
) -> (StepGrant, LiveStep, Vec<Effect>) {
    let Given { step, peer, now, interactive, kill_grace_ms } = *given;
    let id = job.id;
    let nodes: Vec<StepNode> = plan
        .nodes
        .iter()
        .map(|n| {
            let extra = job.allocation.get(n.alloc_index).and_then(|a| extra.get(a.node_id.0 as usize));
            StepNode {
                name: n.node.clone(),
                address: extra.map(|e| e.address.clone()).unwrap_or_default(),
                ranks: n.ranks.clone(),
                instance: extra.map(|e| e.instance.clone()).unwrap_or_default(),
            }
        })
        .collect();
    let claims: Vec<(usize, CpuSet)> = if req.request.overcommit {
        vec![]
    } else {
        plan.nodes.iter().map(|n| (n.alloc_index, n.cpus.clone())).collect()
    };
    let row = StepRow {
        job: id,
        step,
        uid: peer.user.uid,
        user: peer.user.name.clone(),
        start_time: now,
        end_time: None,
        host: req.host.clone(),
        pid: req.pid,
        cwd: req.cwd.clone(),
        argv: if apps.is_empty() { req.argv.clone() } else { berth_core::step::mpmd::command_line(&apps) },
        size: plan.size,
        nodes: plan.nodes.iter().map(|n| n.node.clone()).collect(),
        exit_code: None,
        failure: None,
        interactive,
        claims: claims.clone(),
    };
    let detail = format!("step {step}: {} ranks on {}, by {}", plan.size, row.nodes.join(","), peer.user.name);
    let live = LiveStep {
        step,
        uid: peer.user.uid,
        user: peer.user.name.clone(),
        claims,
        nodes: row.nodes.clone(),
        conn: Some(peer.conn),
        interactive,
        granted_at: now,
    };
    let effects = vec![Effect::InsertStep(Box::new(row)), Effect::job_event("step", id, None, detail)];
    let grant = StepGrant {
        job: id,
        step,
        kvsname: format!("berth_{}_{step}", id.0),
        // The caller's own ids (active gid, groups) when it owns the job; an admin acting
        // in someone else's job runs the ranks as the job's owner, never as itself.
        user: if peer.user.uid == job.user.uid { peer.user.clone() } else { job.user.clone() },
        argv: req.argv,
        env: req.env,
        cwd: req.cwd,
        size: plan.size,
        fanout: req.fanout,
        no_kill: req.no_kill,
        // A job submitted with --rank-cpusets runs its steps' ranks in rank cpusets too.
        rank_cpusets: req.rank_cpusets || job.options.rank_cpusets == Some(true),
        bind: req.request.binding != RankBinding::None,
        notify_signal: req.notify_signal,
        kill_grace_ms,
        // `run --mpi`, else the job's `#BERTH --mpi`, else both kinds of server.
        mpi: req.mpi.or(job.options.mpi).unwrap_or_default(),
        nodes,
        interactive,
        attach: false,
        expires_ms: 0,
        apps,
        spawned_by: req.spawned_by,
        mac: String::new(),
    };
    (grant, live, effects)
}

/// A job with no batch script (an interactive allocation, a reservation) made running now
/// under `id`: its row, then its event (named after its queue, on its first node). Needs no
/// store.
pub(crate) fn started_without_script(job: &mut JobRecord, id: JobId, detail: &str, now: f64) -> Vec<Effect> {
    job.id = id;
    job.state = JobState::Running;
    job.start_time = Some(now);
    let first = job.allocation.first().map(|a| a.node.clone());
    let event = Effect::job_event(&job.queue, id, first.as_deref(), detail);
    vec![Effect::InsertJob(Box::new(job.clone())), event]
}

/// An interactive allocation ends now in `state`: finished in the model; its row, its
/// accounting row and its event to write, in that order. None when it is not running (ended
/// already). Needs no store.
pub(crate) fn interactive_ended(
    job: &mut JobRecord,
    state: JobState,
    exit_code: Option<i32>,
    reason: Option<&str>,
    now: f64,
) -> Option<Vec<Effect>> {
    if job.state != JobState::Running {
        return None;
    }
    job.state = state;
    job.exit_code = exit_code;
    job.reason = reason.map(str::to_string);
    job.end_time = Some(now);
    // The agents' CPU times are added when their ends arrive (store.add_to_accounting).
    let wall_ms = ((now - job.start_time.unwrap_or(now)).max(0.0) * 1000.0) as u64;
    job.usage = Some(Usage { wall_ms, ..Default::default() });
    Some(vec![
        Effect::UpdateJob(Box::new(job.clone())),
        Effect::InsertAccounting(Box::new(job.clone())),
        Effect::job_event("end", job.id, None, state.as_str()),
    ])
}

/// How a step ended, as recorded.
pub(crate) struct StepEnd {
    pub time: f64,
    pub exit_code: Option<i32>,
    pub failure: Option<String>,
    /// The node its end event is about (the agent that reported it), if any.
    pub node: Option<String>,
}

/// Step `step` of `job` ended: no longer live (its cores are the job's again); its end and
/// its `step_end` event (`detail`) to write. Needs no store.
pub(crate) fn step_closed(steps: &mut LiveSteps, job: JobId, step: u32, end: StepEnd, detail: String) -> Vec<Effect> {
    steps.close(job, step);
    let StepEnd { time, exit_code, failure, node } = end;
    vec![
        Effect::EndStep { job, step, time, exit_code, failure },
        Effect::job_event("step_end", job, node.as_deref(), detail),
    ]
}

/// The live steps rooted at node `name` that no `run` watches and its agent no longer lists
/// (`listed`), past their grant's use (or the agent restarted since), in order, with whether
/// each made an interactive allocation.
pub(crate) fn lost_root_steps(
    steps: &LiveSteps,
    name: &str,
    listed: &[StepRef],
    restarted: bool,
    now: f64,
) -> Vec<(JobId, u32, bool)> {
    let usable_for = berth_protocol::auth::GRANT_LIFETIME.as_secs_f64() + GRANT_CLOCK_MARGIN_SECS;
    let mut lost: Vec<(JobId, u32, bool)> = steps
        .iter()
        .filter(|(_, s)| s.conn.is_none() && s.nodes.first().map(String::as_str) == Some(name))
        .filter(|(_, s)| restarted || now - s.granted_at > usable_for)
        .filter(|(id, s)| !listed.contains(&StepRef { job: *id, step: s.step }))
        .map(|(id, s)| (id, s.step, s.interactive))
        .collect();
    lost.sort();
    lost
}

/// The live steps granted on client connection `conn`, in order, with whether each made an
/// interactive allocation.
pub(crate) fn steps_of_connection(steps: &LiveSteps, conn: u64) -> Vec<(JobId, u32, bool)> {
    let mut gone: Vec<(JobId, u32, bool)> =
        steps.iter().filter(|(_, s)| s.conn == Some(conn)).map(|(id, s)| (id, s.step, s.interactive)).collect();
    gone.sort();
    gone
}

/// Running interactive allocations past their walltime at `now`.
pub(crate) fn interactive_over<'a>(jobs: impl Iterator<Item = &'a JobRecord>, now: f64) -> Vec<JobId> {
    jobs.filter(|j| j.is_interactive() && j.state == JobState::Running)
        .filter(|j| matches!((j.start_time, j.walltime), (Some(s), Some(w)) if now >= s + w as f64))
        .map(|j| j.id)
        .collect()
}

/// The nodes (indexes) a signal to `job` goes to: all of its allocation, or the nodes of its
/// live step `step` (`live`: the job's live steps). None when that step is not live.
pub(crate) fn signal_targets(job: &JobRecord, live: &[LiveStep], step: Option<u32>) -> Option<Vec<usize>> {
    let on = |a: &berth_core::job::NodeAllocation| a.node_id.0 as usize;
    match step {
        None => Some(job.allocation.iter().map(on).collect()),
        Some(s) => {
            let live = live.iter().find(|l| l.step == s)?;
            Some(job.allocation.iter().filter(|a| live.nodes.contains(&a.node)).map(on).collect())
        }
    }
}

#[cfg(test)]
mod effect_tests;
mod mpmd;
#[cfg(test)]
mod tests;
