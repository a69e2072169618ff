//! What the controller does with each request and agent message.

use crate::model::effect::Effect;
use crate::model::job::{JobRecord, Usage};
use crate::model::request::{error, Peer};
use crate::state::{AgentTx, Controller, NodeExtra};
use crate::store::StoreError;
use berth_core::directives::parse_script_with;
use berth_core::job::{JobOutcome, JobState};
use berth_core::limits::escape_control;
use berth_core::node::NodeState;
use berth_core::placement::cluster::feasible_when_up as feasible;
use berth_core::placement::JobRequest;
use berth_core::JobId;
use berth_protocol::agent::{AgentMessage, ControllerMessage, Registration};
use berth_protocol::client::{
    ApiError, ClientRequest, ClientResponse, ErrorCode, IdResult, SubmitRequest, MAX_IDS_PER_REQUEST,
};
use berth_protocol::user::UserIdentity;
use tokio::sync::oneshot;

/// An action on one job: the outer error is the store's, the inner one the user's.
type JobOp = fn(&mut Controller, JobId, f64) -> Result<Result<(), ApiError>, StoreError>;

impl Controller {
    pub(crate) fn is_admin(&self, peer: &Peer) -> bool {
        peer.user.uid == 0 || self.cfg.admins.contains(&peer.user.name)
    }

    /// Record a refused action on someone else's job (event `denied`, by [`denial`]), besides
    /// the error the user gets: "user X may not cancel job N of user Y". Carried out at once,
    /// with what the command decided before it (kept as it was: one queue keeps the event's
    /// place among the writes either way, and no caller reads it back).
    pub(crate) fn denied(
        &mut self,
        peer: &Peer,
        action: &str,
        job: Option<JobId>,
        whose: &str,
        now: f64,
    ) -> Result<(), StoreError> {
        self.queue([denial(peer, action, job, whose)]);
        self.carry_out_effects(now)
    }

    /// `acct` for jobs: the finished ones matching (and the active ones when asked).
    fn acct(
        &self,
        limit: Option<u32>,
        (since, until): (Option<f64>, Option<f64>),
        users: &[String],
        active: bool,
        with_steps: bool,
    ) -> Result<ClientResponse, StoreError> {
        use berth_protocol::client::{JobInfo, ACCT_MAX_JOBS, ACCT_MAX_STEPS, ACCT_MAX_USERS};
        if users.len() > ACCT_MAX_USERS {
            return Ok(error(
                ErrorCode::BadRequest,
                format!("acct names {} users; at most {ACCT_MAX_USERS} at once", users.len()),
            ));
        }
        let (since, until) = (since.filter(|t| t.is_finite()), until.filter(|t| t.is_finite()));
        let limit = limit.unwrap_or(100).min(ACCT_MAX_JOBS);
        let mut jobs: Vec<JobInfo> = self
            .store
            .finished_jobs_in(since, until, users, limit)?
            .iter()
            .map(|j| j.info(self.clock.unix()))
            .collect();
        jobs.reverse();
        if active {
            let kept = |j: &JobInfo| {
                since.is_none_or(|s| j.end_time.is_none_or(|e| e >= s))
                    && until.is_none_or(|u| j.start_time.unwrap_or(j.submit_time) <= u)
                    && (users.is_empty() || users.contains(&j.user))
            };
            jobs.extend(self.jobs.values().map(|j| self.job_info(j)).filter(kept));
            jobs.sort_by_key(|j| j.id);
        }
        self.set_billing(&mut jobs);
        if with_steps {
            // sacct's `N.0` lines: the program alone (not its arguments) keeps the answer small.
            let mut left = ACCT_MAX_STEPS;
            for j in &mut jobs {
                let steps = self.store.job_steps(j.id)?;
                if steps.len() > left {
                    break;
                }
                left -= steps.len();
                j.steps = steps
                    .iter()
                    .map(|s| {
                        let mut info = s.info();
                        info.argv.truncate(1);
                        info
                    })
                    .collect();
            }
        }
        Ok(ClientResponse::Acct { jobs })
    }

    pub fn handle_client(
        &mut self,
        req: ClientRequest,
        peer: &Peer,
        reply: oneshot::Sender<ClientResponse>,
        now: f64,
    ) -> Result<(), StoreError> {
        let response = match req {
            ClientRequest::Ping => ClientResponse::Pong {
                version: env!("CARGO_PKG_VERSION").into(),
                protocol: berth_protocol::PROTOCOL_VERSION,
                nodes: self.cluster.nodes().len(),
                jobs: self.jobs.len(),
                state_store: self.store_health.clone(),
            },
            ClientRequest::Submit(sub) => match self.validate_submission(*sub, peer, now) {
                Ok(job) if job.options.array.is_some() => match self.accept_array(job) {
                    Ok(id) => ClientResponse::Submitted { id },
                    Err(e) => ClientResponse::Error(e),
                },
                Ok(job) => ClientResponse::Submitted { id: self.accept(job) },
                Err(e) => ClientResponse::Error(e),
            },
            ClientRequest::SubmitBatch { jobs } if jobs.len() > MAX_IDS_PER_REQUEST => error(
                ErrorCode::BadRequest,
                format!(
                    "{} jobs in one batch, more than the {MAX_IDS_PER_REQUEST} allowed; nothing was submitted: send them in batches",
                    jobs.len()
                ),
            ),
            ClientRequest::SubmitBatch { jobs } => {
                let mut valid = Vec::with_capacity(jobs.len());
                let mut failure = None;
                for (i, sub) in jobs.into_iter().enumerate() {
                    match self.validate_submission(sub, peer, now) {
                        Ok(j) if j.options.array.is_some() => {
                            failure = Some(ApiError::new(
                                ErrorCode::BadRequest,
                                format!("job {i} of the batch is an array: submit arrays one at a time; nothing was submitted"),
                            ));
                            break;
                        }
                        Ok(j) => valid.push(j),
                        Err(e) => {
                            failure = Some(ApiError::new(
                                e.code,
                                format!("job {i} of the batch: {}; nothing was submitted", e.message),
                            ));
                            break;
                        }
                    }
                }
                match failure {
                    Some(e) => ClientResponse::Error(e),
                    None => {
                        let mut ids = Vec::with_capacity(valid.len());
                        for job in valid {
                            ids.push(self.accept(job));
                        }
                        ClientResponse::SubmittedBatch { ids }
                    }
                }
            }
            ClientRequest::ListJobs { states, all } => {
                let mut jobs: Vec<_> = self.jobs.values().map(|j| self.job_info(j)).collect();
                if all || states.iter().any(|s| s.is_finished()) {
                    let mut finished: Vec<_> = self.store.finished_jobs(10_000)?.iter().map(|j| j.info(now)).collect();
                    finished.reverse();
                    jobs.extend(finished);
                    jobs.sort_by_key(|j| j.id);
                }
                if !states.is_empty() {
                    jobs.retain(|j| states.contains(&j.state));
                }
                ClientResponse::Jobs { jobs }
            }
            ClientRequest::ShowJob { id } => {
                let info = match self.jobs.get(&id) {
                    Some(j) => Some(self.job_info(j)),
                    None => self.ended_job(id)?.map(|j| j.info(now)),
                };
                match info {
                    Some(mut job) => {
                        job.steps = self.store.job_steps(id)?.iter().map(|s| s.info()).collect();
                        job.gpu_places = self.gpu_places(&job.allocation);
                        self.set_billing(std::slice::from_mut(&mut job));
                        ClientResponse::Job { job: Box::new(job) }
                    }
                    None => unknown_job(id),
                }
            }
            ClientRequest::Cancel { ids, only } => {
                self.for_each_id_or_array((ids, &only), peer, now, "cancel", crate::array::Whole::Active, Self::cancel_one)?
            }
            ClientRequest::Hold { ids, only } => {
                self.for_each_id_or_array((ids, &only), peer, now, "hold", crate::array::Whole::Pending, Self::hold_one)?
            }
            ClientRequest::Release { ids, only } => {
                self.for_each_id_or_array((ids, &only), peer, now, "release", crate::array::Whole::Pending, Self::release_one)?
            }
            ClientRequest::ListNodes { topology } => ClientResponse::Nodes {
                nodes: self.nodes_in_order().into_iter().map(|i| self.node_info(i, topology)).collect(),
                licenses: self.license_info(),
            },
            ClientRequest::NodeAdmin { name, action, value } => {
                self.node_admin(&name, &action, value.as_deref(), peer, now)?
            }
            ClientRequest::SubnodeAdmin { node, index, action, value } => {
                self.subnode_admin(&node, index, &action, value.as_deref(), peer)?
            }
            ClientRequest::Acct { limit, steps: true, .. } => ClientResponse::Steps {
                steps: self.store.recent_steps(limit.unwrap_or(100).min(berth_protocol::client::ACCT_MAX_JOBS))?.iter().map(|s| s.info()).collect(),
            },
            ClientRequest::Acct { limit, steps: false, since, until, users, active, with_steps } => {
                self.acct(limit, (since, until), &users, active, with_steps)?
            }
            ClientRequest::StepCreate(req) => self.step_create(*req, peer, now)?,
            ClientRequest::Queues => ClientResponse::Queues { queues: self.queue_infos() },
            ClientRequest::Share => {
                self.charge_usage(now);
                ClientResponse::Share {
                    half_life_secs: self.policy.fair_share().config.half_life_secs,
                    accounts: self.policy.fair_share().report(),
                }
            }
            ClientRequest::StepEnd { job, step, outcome } => {
                let resp = self.step_end(job, step, &outcome, peer, now)?;
                // `run` was answered when its request was queued (server.rs): log a refusal.
                if let ClientResponse::Error(e) = &resp {
                    tracing::warn!(job = %job, step, "end of step refused: {e}");
                }
                resp
            }
            ClientRequest::Signal { job, step, signal } => self.signal(job, step, signal, peer)?,
            ClientRequest::Suspend { ids } | ClientRequest::Resume { ids } if ids.len() > MAX_IDS_PER_REQUEST => error(
                ErrorCode::BadRequest,
                format!("{} job ids in one request, more than the {MAX_IDS_PER_REQUEST} allowed; nothing was done", ids.len()),
            ),
            ClientRequest::Suspend { ids } => self.suspend_request(ids, false, peer, now)?,
            ClientRequest::Resume { ids } => self.suspend_request(ids, true, peer, now)?,
            ClientRequest::Reservation { request } => self.reservation_request(*request, peer, now)?,
            ClientRequest::AdvanceCreate(body) => self.advance_create(*body, peer, now)?,
            ClientRequest::AdvanceList => self.advance_list_response(now)?,
            ClientRequest::AdvanceDelete { name } => self.advance_delete(&name, peer, now)?,
            ClientRequest::Events(q) => ClientResponse::Events { events: self.store.events(&q)? },
            ClientRequest::Update { id, change, task_only } => {
                self.update_request((id, task_only), *change, peer, now)?
            }
            ClientRequest::Requeue { ids, only } => self.requeue_request(ids, &only, peer, now)?,
            ClientRequest::Alloc(req) => self.alloc_request(*req, peer, now)?,
            ClientRequest::AllocEnd { id, exit_code } => self.alloc_end(id, exit_code, peer, now)?,
            ClientRequest::AllocHold { id } => self.alloc_hold(id, peer)?,
        };
        self.reply(reply, response);
        Ok(())
    }

    /// Check a submission and build its record, without side effects.
    pub(crate) fn validate_submission(&self, sub: SubmitRequest, peer: &Peer, now: f64) -> Result<JobRecord, ApiError> {
        let bad = |m: String| ApiError::new(ErrorCode::BadRequest, m);
        let limits = &self.cfg.limits;
        let script_name = escape_control(&sub.script_name).chars().take(256).collect::<String>();
        limits
            .check_payload(&sub.script, &sub.env)
            .map_err(|e| ApiError::new(ErrorCode::InvalidScript, format!("{script_name}: {e}")))?;
        let (directives, _warnings) = parse_script_with(&sub.script, sub.ignore_unsupported)
            .map_err(|e| ApiError::new(ErrorCode::InvalidScript, format!("{script_name}: {e}")))?;
        let mut options = directives.overlay(sub.options);
        // Only `alloc_request` makes allocations; `map_exclusive` checks tasks (below).
        options.alloc = None;
        limits.check_options(&options).map_err(|e| bad(e.to_string()))?;
        if options.priority.is_some() && !self.is_admin(peer) {
            return Err(ApiError::new(
                ErrorCode::NotPermitted,
                "only admins may set a job's priority (config key `admins`)",
            ));
        }
        limits.check_path("the submit directory", &sub.cwd).map_err(|e| bad(e.to_string()))?;
        if !sub.cwd.starts_with('/') {
            return Err(bad(format!("submit directory {} is not absolute", escape_control(&sub.cwd))));
        }
        if let Some(account) = &options.account {
            self.check_account(account, &peer.user)?;
        }
        self.check_depend_submission(&mut options, now)?;
        crate::array::check_submission(&mut options, self.cfg.scheduler.max_array_size).map_err(bad)?;
        if sub.env.iter().any(|(k, v)| k.is_empty() || k.contains(['=', '\0']) || v.contains('\0')) {
            return Err(bad(
                "the environment holds a variable that cannot be passed to a process (empty name, '=' or NUL)".into(),
            ));
        }
        self.map_qos(&mut options)?;
        self.map_exclusive(&mut options).map_err(bad)?;
        // `--chdir`: the job's working directory, absolute (a relative one from the submit
        // directory); its outputs' relative paths are taken from it, as Slurm does.
        if let Some(dir) = options.chdir.take() {
            let abs = if dir.starts_with('/') { dir } else { format!("{}/{dir}", sub.cwd.trim_end_matches('/')) };
            limits.check_path("--chdir", &abs).map_err(|e| bad(e.to_string()))?;
            options.chdir = Some(abs);
        }
        let work_dir = options.chdir.clone().unwrap_or_else(|| sub.cwd.clone());
        // `--export` (`#PBS -V`/`-v`): what of the submitting environment the job gets.
        let mut env = match &options.export {
            Some(export) => export.apply(&sub.env),
            None => sub.env,
        };
        // `berth run` in the job gives its ranks their GPUs by these (docs/gpus.md).
        for (name, value) in [
            ("BERTH_GPUS_PER_TASK", options.gpus_per_task.map(|n| n.to_string())),
            ("BERTH_GPU_BIND", options.gpu_bind.clone()),
        ] {
            if let Some(v) = value {
                env.retain(|(k, _)| k != name);
                env.push((name.to_string(), v));
            }
        }
        let queue = options.queue.clone().unwrap_or_else(|| self.cfg.default_queue().to_string());
        // Without --mem or --mem-per-cpu a job gets the default per CPU, but never more per CPU
        // than the roomiest node has: a job must not be refused for memory it did not ask for.
        if options.mem.is_none() && options.mem_per_cpu.is_none() && options.mem_per_gpu.is_none() {
            options.mem_per_cpu = Some(self.default_mem_per_cpu());
        }
        // The job's walltime, else its queue's default, else the cluster's default.
        let spec = self.cfg.queues.iter().find(|q| q.name == queue);
        let walltime = spec
            .and_then(|q| q.walltime_or_default(options.walltime))
            .or(options.walltime)
            .or(self.cfg.default_walltime_secs());
        if options.account.is_none() {
            options.account = Some(crate::users::default_account(peer.user.gid));
        }
        self.check_fit(&options, &queue, walltime, &peer.user, now)?;
        options.walltime = walltime;
        let name = options.name.clone().unwrap_or(script_name);
        // The dialect's defaults and joins (Slurm: stderr with stdout, `slurm-%j.out`; PBS `-j`).
        let resolve = |path: String| -> String {
            if path.starts_with('/') {
                path
            } else {
                format!("{}/{}", work_dir.trim_end_matches('/'), path)
            }
        };
        let (out, err) = berth_core::directives::output_patterns(&options);
        let (stdout, stderr) = (resolve(out), resolve(err));
        let job = JobRecord {
            id: JobId(0),
            name,
            user: peer.user.clone(),
            state: if sub.hold || options.hold == Some(true) { JobState::Held } else { JobState::Queued },
            queue,
            options,
            walltime,
            submit_time: now,
            start_time: None,
            end_time: None,
            allocation: vec![],
            exit_code: None,
            signal: None,
            reason: None,
            cwd: sub.cwd,
            stdout,
            stderr,
            script: sub.script.into(),
            env: std::sync::Arc::new(env),
            usage: None,
            kill_sent: None,
            suspension: Default::default(),
        };
        job.validate().map_err(bad)?;
        Ok(job)
    }

    /// Whether a job of these options may run in `queue` with `walltime` (defaults applied):
    /// its shape, the queue's limits, the cluster's walltime bound, its advance reservation,
    /// and whether any node could ever hold it. The checks of a submission, which `berth
    /// update` makes too (update.rs).
    pub(crate) fn check_fit(
        &self,
        options: &berth_core::directives::SubmitOptions,
        queue: &str,
        walltime: Option<u64>,
        user: &UserIdentity,
        now: f64,
    ) -> Result<(), ApiError> {
        let bad = |m: String| ApiError::new(ErrorCode::BadRequest, m);
        let mut request = JobRequest::from_options(options).map_err(|e| bad(e.to_string()))?;
        berth_core::sched::queue::check_in(&self.cfg.queues, queue, walltime, &request)
            .map_err(|e| ApiError::new(ErrorCode::QueueLimit, e.to_string()))?;
        // Judged (feasible, advance reservations) where its queue sends it.
        berth_core::sched::queue::target(&self.cfg.queues, queue, &mut request);
        if let Some(w) = walltime {
            // A queue's or the cluster's default is bounded like an asked-for walltime.
            self.cfg.limits.check_walltime(w).map_err(|e| bad(e.to_string()))?;
        }
        if let (Some(name), Some(account)) = (&options.reservation, &options.account) {
            self.check_advance_submission(name, user, account, walltime, &request, now)?;
        }
        self.check_gres_and_licenses(&request)?;
        if !self.cluster.nodes().is_empty() {
            // Judge against every node that ever registered, as if up: a down node may return.
            let registered = |n: &berth_core::node::NodeCapacity| self.ever_registered(n.id.0 as usize);
            feasible(self.cluster.nodes(), &self.cluster.policy, &request, registered).map_err(|why| {
                ApiError::new(
                    ErrorCode::Infeasible,
                    format!("this job can never run here: {why}; ask for less (see `berth nodes`)"),
                )
            })?;
        }
        Ok(())
    }

    /// A request for generic resources no configured node has (or more than any has), or for
    /// licenses the cluster does not have (or more than exist), can never run: refused.
    pub(crate) fn check_gres_and_licenses(&self, request: &JobRequest) -> Result<(), ApiError> {
        let never = |m: String| ApiError::new(ErrorCode::Infeasible, format!("this job can never run here: {m}"));
        for (name, &want) in &request.gres {
            let most = self.cfg.gres_max(name);
            if most == 0 {
                let known: std::collections::BTreeSet<&String> =
                    self.cfg.gres.values().flat_map(|c| c.keys()).collect();
                let known: Vec<&str> = known.into_iter().map(String::as_str).collect();
                return Err(never(format!(
                    "no node has generic resource {name} (the nodes' [gres] are: {})",
                    if known.is_empty() { "none".to_string() } else { known.join(", ") }
                )));
            }
            if want > most {
                return Err(never(format!(
                    "gres {name}: {want} wanted on each node, the most a node has is {most}; ask for at most {most}"
                )));
            }
        }
        if let Err(berth_core::gres::LicenseMiss::Never(why)) = self.cluster.licenses.check(&request.licenses) {
            return Err(never(why.to_string()));
        }
        Ok(())
    }

    /// `--qos NAME` (Slurm's `-q`): berth has no QOS of its own; a QOS is the queue of that
    /// name (it must agree with `--queue`/`--partition` if both are given). `normal`, Slurm's
    /// default QOS, changes nothing where no queue has that name. Anything else is refused
    /// naming it.
    fn map_qos(&self, options: &mut berth_core::directives::SubmitOptions) -> Result<(), ApiError> {
        let Some(qos) = options.qos.clone() else { return Ok(()) };
        let bad = |m: String| ApiError::new(ErrorCode::BadRequest, m);
        if self.cfg.queues.iter().any(|q| q.name == qos) {
            match &options.queue {
                Some(q) if *q != qos => Err(bad(format!(
                    "--qos {qos} maps to the queue {qos}, but the queue (--queue/--partition) {q} was given too; give one of them"
                ))),
                _ => {
                    options.queue = Some(qos);
                    Ok(())
                }
            }
        } else if qos == "normal" {
            Ok(())
        } else {
            let names: Vec<&str> = self.cfg.queues.iter().map(|q| q.name.as_str()).collect();
            Err(bad(format!(
                "QOS {qos} does not exist: berth maps a QOS onto the queue of that name, and the queues are {} (normal, Slurm's default QOS, is accepted as no QOS)",
                names.join(", ")
            )))
        }
    }

    /// An account given with `--account`: one of the submitter's groups (the default account
    /// is the primary group), or one the fair-share configuration lists; admins may charge any.
    fn check_account(&self, account: &str, user: &UserIdentity) -> Result<(), ApiError> {
        if !self.cfg.verify_names
            || self.cfg.fair_share.shares.contains_key(account)
            || self.cfg.admins.contains(&user.name)
        {
            return Ok(());
        }
        let mut gids = user.groups.clone();
        gids.push(user.gid);
        gids.sort_unstable();
        gids.dedup();
        let mine: Vec<String> = gids.into_iter().map(crate::users::default_account).collect();
        if mine.iter().any(|g| g == account) {
            return Ok(());
        }
        Err(ApiError::new(
            ErrorCode::BadRequest,
            format!(
                "account {account} is not known: it is neither one of your groups ({}) nor an account of the fair-share configuration; leave --account out to use {}",
                mine.join(", "),
                crate::users::default_account(user.gid)
            ),
        ))
    }

    /// Memory per CPU for a job that does not ask: the configured default, but never more per
    /// CPU than the roomiest node has (a job must not be refused for memory it did not ask for).
    /// Never 0: a job without memory would be killed at once, so nodes without any do not
    /// count, and where no node has memory the job keeps the default (and is refused, saying why).
    pub(crate) fn default_mem_per_cpu(&self) -> u64 {
        let roomiest = self
            .cluster
            .nodes()
            .iter()
            .map(|n| n.topology.memory_bytes() / n.topology.pu_count().max(1) as u64)
            .filter(|&per_pu| per_pu > 0)
            .max()
            .unwrap_or(u64::MAX);
        self.cfg.default_mem_per_core_bytes().min(roomiest).max(1)
    }

    /// Give a valid job its id and queue its row and event `submit` (by [`submitted`]); the
    /// server loop writes them in the batch's transaction, and the reply waits for the commit.
    pub(crate) fn accept(&mut self, mut job: JobRecord) -> JobId {
        let id = self.take_job_id();
        let effects = submitted(&mut job, id);
        self.queue(effects);
        self.jobs.insert(id, job);
        self.dirty = true;
        id
    }

    pub(crate) fn for_each_id(
        &mut self,
        ids: Vec<JobId>,
        peer: &Peer,
        now: f64,
        action: &str,
        op: JobOp,
    ) -> Result<ClientResponse, StoreError> {
        if ids.len() > MAX_IDS_PER_REQUEST {
            // Refused before anything is done: the answer (one result per id) must fit a frame.
            return Ok(error(
                ErrorCode::BadRequest,
                format!(
                    "{} job ids in one {action} request, more than the {MAX_IDS_PER_REQUEST} allowed; nothing was done: send them in batches (`berth` does)",
                    ids.len()
                ),
            ));
        }
        let mut results = Vec::with_capacity(ids.len());
        for id in ids {
            let outcome = match self.jobs.get(&id) {
                None => match self.ended_job(id)? {
                    Some(j) => Err(ApiError::new(
                        ErrorCode::InvalidState,
                        format!("job {id} has already ended ({})", j.state.as_str()),
                    )),
                    None => Err(ApiError::new(
                        ErrorCode::UnknownJob,
                        format!("job {id} does not exist; `berth jobs --all` lists jobs"),
                    )),
                },
                Some(j) if j.user.uid != peer.user.uid && !self.is_admin(peer) => {
                    let owner = j.user.name.clone();
                    self.denied(peer, action, Some(id), &owner, now)?;
                    Err(ApiError::new(
                        ErrorCode::NotPermitted,
                        format!("job {id} belongs to {owner}; you may only act on your own jobs"),
                    ))
                }
                Some(_) => op(self, id, now)?,
            };
            results.push(match outcome {
                Ok(()) => IdResult { id, ok: true, error: None },
                Err(e) => IdResult { id, ok: false, error: Some(e) },
            });
        }
        Ok(ClientResponse::Done { results })
    }

    pub(crate) fn cancel_one(&mut self, id: JobId, now: f64) -> Result<Result<(), ApiError>, StoreError> {
        let Some(job) = self.jobs.get_mut(&id) else { return Ok(Ok(())) };
        if job.state.is_pending() {
            let effects = cancelled_pending(job, "cancelled before it started", "", now);
            // Carried out before the job leaves memory (`retire`): from then on its state is read
            // from its history (`ended_state`: dependencies on it, its array), which must hold its
            // end.
            self.queue(effects);
            self.carry_out_effects(now)?;
            self.retire(id);
            return Ok(Ok(()));
        }
        let interactive = job.is_interactive();
        let effects = cancelled_started(job);
        self.queue(effects);
        if interactive {
            // No batch script whose end to wait for: the allocation ends now.
            self.end_interactive(id, JobState::Cancelled, None, Some("cancelled"), now)?;
        }
        // The rest is queued with the command's effects: the job stays in memory until its
        // end, and no caller reads it back or queues an order directly after this.
        Ok(Ok(()))
    }

    pub(crate) fn hold_one(&mut self, id: JobId, _now: f64) -> Result<Result<(), ApiError>, StoreError> {
        Ok(self.move_pending(id, JobState::Queued, JobState::Held, ("hold", "held")))
    }

    pub(crate) fn release_one(&mut self, id: JobId, _now: f64) -> Result<Result<(), ApiError>, StoreError> {
        Ok(self.move_pending(id, JobState::Held, JobState::Queued, ("release", "released")))
    }

    /// Move a pending job from `from` to `to`; already in `to` is fine, anything else is refused.
    fn move_pending(
        &mut self,
        id: JobId,
        from: JobState,
        to: JobState,
        (event, done): (&str, &str),
    ) -> Result<(), ApiError> {
        let Some(job) = self.jobs.get_mut(&id) else { return Ok(()) };
        if job.state == to {
            return Ok(());
        }
        if job.state != from {
            let message = format!("job {id} is {}; only {} jobs can be {done}", job.state.as_str(), from.as_str());
            return Err(ApiError::new(ErrorCode::InvalidState, message));
        }
        // Queued with the command's effects: the job stays in memory.
        let effects = moved_pending(job, to, event);
        self.queue(effects);
        self.dirty = true;
        Ok(())
    }

    /// An agent (re)registers: take its topology and reconcile the jobs it runs with ours.
    pub fn handle_register(
        &mut self,
        reg: Registration,
        conn_id: u64,
        tx: AgentTx,
        now: f64,
    ) -> Result<(), StoreError> {
        if let Err(e) = reg.topology.validate() {
            self.out.agents.push((tx, ControllerMessage::Rejected { reason: e.to_string() }));
            return Ok(());
        }
        let index = self.registered_node(&reg);
        let restarted = self.extra[index].instance != reg.instance;
        self.old_runs_on_register(index, &reg.running, &reg.ended);
        let ours = self.jobs_on_node(index);
        self.take_topology(index, &reg, &ours);
        let was_down = self.connect_agent(index, &reg, conn_id, &tx);
        self.acknowledge_registration(index, &reg, &tx, restarted);
        self.kill_jobs_not_here(index, &reg, &tx);
        self.reconcile_jobs_here(index, &reg, &tx, ours, restarted, now)?;
        self.after_registration(index, &reg, restarted, was_down, now)?;
        self.dirty = true;
        // Carried out here, as the registration's last step: the same writes and orders in the
        // same order as the server loop's call after it; callers outside that loop rely on it.
        self.carry_out_effects(now)
    }

    /// The registering agent's node: known by its name, else added (and the node order
    /// arranged again).
    fn registered_node(&mut self, reg: &Registration) -> usize {
        if let Some(i) = self.node_by_name(&reg.name) {
            return i;
        }
        let id = self.cluster.nodes().len();
        self.push_node(
            berth_core::NodeId(id as u32),
            reg.name.clone(),
            reg.topology.clone(),
            NodeState::Up,
            "",
            "",
            "",
        );
        self.nodes_changed();
        id
    }

    /// A new hardware description for node `index`: its free map rebuilt from the jobs still
    /// allocated there (`ours`).
    fn take_topology(&mut self, index: usize, reg: &Registration, ours: &[JobId]) {
        if *self.cluster.nodes()[index].topology == reg.topology {
            return;
        }
        let mut cap = berth_core::node::NodeCapacity::new(
            berth_core::NodeId(index as u32),
            reg.name.clone(),
            berth_core::node::shared_topology(self.cluster.nodes(), reg.topology.clone()),
        );
        self.apply_admin_settings(&mut cap);
        for id in ours {
            if let Some(a) = self.jobs[id].allocation.iter().find(|a| a.node_id.0 as usize == index) {
                cap.claim(a);
            }
        }
        self.cluster.replace(index, cap);
        self.nodes_changed();
    }

    /// The agent's address, CPUs, instance and connection recorded for node `index`; a node
    /// that was down comes back as cleaning. Whether it was down.
    fn connect_agent(&mut self, index: usize, reg: &Registration, conn_id: u64, tx: &AgentTx) -> bool {
        let heard = self.clock.instant();
        let ex = &mut self.extra[index];
        ex.address = reg.address.clone();
        ex.real_cpus = reg.real_cpus.clone();
        ex.instance = reg.instance.clone();
        ex.connect(conn_id, tx.clone(), heard);
        let was_down = ex.state == NodeState::Down;
        if was_down {
            // Back, but not given work while it still runs what is no longer its own, nor while
            // an admin holds it down.
            ex.state = NodeState::Cleaning;
        }
        was_down
    }

    /// The registration's row and event queued, and the agent told its node id, heartbeat
    /// interval and lease.
    fn acknowledge_registration(&mut self, index: usize, reg: &Registration, tx: &AgentTx, restarted: bool) {
        self.queue(registered(index, &reg.name, &reg.address, restarted));
        self.out.agents.push((
            tx.clone(),
            ControllerMessage::Registered {
                node_id: index as u32,
                heartbeat_interval_ms: (self.cfg.heartbeat_interval_secs * 1000.0) as u64,
                lease_ms: self.cfg.lease().filter(|_| reg.lease).map(|l| l.as_millis() as u64),
                step_ends: true,
            },
        ));
    }

    /// Jobs the agent runs (or holds, on a job's other nodes) that we do not think are there:
    /// stop them.
    fn kill_jobs_not_here(&mut self, index: usize, reg: &Registration, tx: &AgentTx) {
        for id in &reg.running {
            let known_here = self.jobs.get(id).is_some_and(|j| j.state.has_allocation() && j.on_node(index));
            if !known_here {
                self.out.agents.push((
                    tx.clone(),
                    ControllerMessage::Kill { id: *id, reason: "not running according to the controller".into() },
                ));
            }
        }
    }

    /// Jobs with a part on the node (`ours`: their batch script, or a hold for their steps)
    /// against what the agent reports: re-adopted, or lost with a restarted agent, or their
    /// launch sent again, or requeued when it never arrived.
    fn reconcile_jobs_here(
        &mut self,
        index: usize,
        reg: &Registration,
        tx: &AgentTx,
        ours: Vec<JobId>,
        restarted: bool,
        now: f64,
    ) -> Result<(), StoreError> {
        for id in ours {
            let Some(job) = self.jobs.get_mut(&id) else { continue };
            let runs_script = Self::head_node(&job.allocation) == Some(index) && !job.is_interactive();
            if reg.running.contains(&id) || reg.ended.contains(&id) {
                if restarted && reg.running.contains(&id) {
                    // The restarted agent found the job still running in its cgroup.
                    tracing::info!(job = %id, node = %reg.name, "the restarted agent re-adopted the job");
                    self.out.effects.push(Effect::job_event("job_readopted", id, Some(&reg.name), ""));
                }
                if let Some(reason) = job.kill_sent.clone() {
                    self.out.agents.push((tx.clone(), ControllerMessage::Kill { id, reason }));
                } else if let (true, Some(walltime_seconds)) = (reg.running.contains(&id), job.options.walltime) {
                    // An admin may have raised it while the agent was away (idempotent).
                    self.out.agents.push((tx.clone(), ControllerMessage::SetWalltime { id, walltime_seconds }));
                }
                continue;
            }
            if restarted {
                // A restarted agent that neither runs the job nor knows how it ended has lost
                // its part (the node rebooted, its state directory was lost): handled as a
                // failed node, by the job's policy (requeue, node_fail, or no-kill goes on).
                tracing::warn!(job = %id, node = %reg.name, "agent restarted without the job: its part there is lost");
                self.job_lost_on_node(id, index, "its agent restarted without the job", now)?;
                continue;
            }
            if !runs_script {
                // One of the job's other nodes lost its part in transit (the job's state
                // follows its first node): the launch is sent again.
                if let Some(k) = job.allocation.iter().position(|a| a.node_id.0 as usize == index) {
                    tracing::info!(job = %id, node = %reg.name, "launch was not received: sending it again");
                    let spec = self.launch_spec(&self.jobs[&id], k);
                    self.out.agents.push((tx.clone(), ControllerMessage::Launch(Box::new(spec))));
                }
                if let Some(reason) = self.jobs[&id].kill_sent.clone() {
                    self.out.agents.push((tx.clone(), ControllerMessage::Kill { id, reason }));
                }
                continue;
            }
            // Same agent process, never got the launch (lost with the old connection): requeue.
            self.requeue(id, now, &reg.name, "launch was not received", Some(index))?;
        }
        Ok(())
    }

    /// The rest of a registration: the steps rooted on the node, suspensions resent to an
    /// agent that did not restart, and a node that was down held down by an admin or checked
    /// clean.
    fn after_registration(
        &mut self,
        index: usize,
        reg: &Registration,
        restarted: bool,
        was_down: bool,
        now: f64,
    ) -> Result<(), StoreError> {
        if let Some(steps) = &reg.steps {
            self.reconcile_root_steps(index, steps, restarted, now)?;
        }
        if !restarted {
            self.resync_suspensions(index);
        }
        if was_down {
            match self.admin_down_reason(&reg.name) {
                Some(reason) => {
                    let effects = held_down(&mut self.extra[index], index, &reg.name, &reason);
                    self.queue(effects);
                }
                None => self.check_clean(index, &reg.running),
            }
        }
        Ok(())
    }

    pub fn handle_agent(&mut self, node: usize, conn_id: u64, msg: AgentMessage, now: f64) -> Result<(), StoreError> {
        let heard = self.clock.instant();
        let Some(ex) = self.extra.get_mut(node) else { return Ok(()) };
        if !ex.is_connection(conn_id) {
            return Ok(()); // a message from a replaced connection
        }
        ex.heard(heard);
        match msg {
            AgentMessage::Register(_) => {}
            AgentMessage::Heartbeat { running, steps, .. } => {
                self.check_clean(node, &running);
                if let Some(steps) = steps {
                    self.reconcile_root_steps(node, &steps, false, now)?;
                }
            }
            AgentMessage::JobStarted { id, pid, cgroups } => {
                let node_name = self.cluster.nodes()[node].name.clone();
                if self.jobs.contains_key(&id) {
                    self.cgroups.started(id, &node_name, cgroups);
                }
                self.queue([Effect::job_event("job_started", id, Some(&node_name), format!("pid {pid}"))]);
            }
            AgentMessage::JobEnded { id, outcome } => {
                let node_name = self.cluster.nodes()[node].name.clone();
                let running_here = self.jobs.get(&id).filter(|j| j.state.has_allocation() && j.on_node(node));
                let first = running_here.is_some_and(|j| Self::head_node(&j.allocation) == Some(node));
                let running_here = running_here.is_some();
                if running_here && outcome.reason.as_deref().is_some_and(|r| r.starts_with("fenced:")) {
                    // The agent fenced it (its lease ran out) before we took the node for
                    // lost: it is lost all the same, and handled by the failure policy.
                    let why = "its node lost the controller's lease and stopped it";
                    self.job_lost_on_node(id, node, why, now)?;
                    self.send_to_node(node, ControllerMessage::EndAck { id });
                    return Ok(());
                }
                if first {
                    // The first node decides: its batch script ended (or, for an interactive
                    // allocation, its hold was ended there, e.g. at the walltime). Its other
                    // nodes' usage recorded so far is the decision's input.
                    let members = self.store.member_usage(id)?;
                    if let Some(job) = self.jobs.get_mut(&id) {
                        let effects = job_ended(job, &outcome, &members, &node_name, now);
                        self.queue(effects);
                        self.end_running(id, now, "job ended", Some(node))?;
                    }
                } else {
                    // Another node of the job: its processes there ended (after the kill that
                    // follows the job's end, usually). Only its usage counts.
                    let here = self.jobs.get(&id).filter(|j| j.state.has_allocation() && j.on_node(node));
                    if here.is_some_and(|j| j.kill_sent.is_none()) {
                        tracing::warn!(job = %id, node = %node_name, "the job's part on this node ended while it runs");
                    }
                    let effects = part_ended(id, here, &node_name, &outcome);
                    self.queue(effects);
                    if !running_here {
                        // A requeued job's previous run ended here (`crate::update`).
                        self.old_run_ended(id, node);
                    }
                }
                self.send_to_node(node, ControllerMessage::EndAck { id });
            }
            AgentMessage::StepEnded { job, step, exit_code, failure } => {
                self.agent_step_end(node, job, step, exit_code, failure, now)?;
                self.send_to_node(node, ControllerMessage::StepEndAck { job, step });
            }
            AgentMessage::Suspended { id, error } => self.suspend_answer(node, id, error, now)?,
            AgentMessage::Resumed { id, error, cgroups } => self.resume_answer(node, id, error, cgroups),
            AgentMessage::Refused { what, job, detail } => {
                let effect = agent_refused(what.event_kind(), job, &self.cluster.nodes()[node].name, &detail);
                self.queue([effect]);
            }
        }
        Ok(())
    }

    /// Node `node`'s connection `conn_id` closed (by [`disconnected`]); its event is queued
    /// with the command's effects.
    pub fn handle_disconnect(&mut self, node: usize, conn_id: u64) {
        if let (Some(ex), Some(cap)) = (self.extra.get_mut(node), self.cluster.nodes().get(node)) {
            let effects = disconnected(ex, &cap.name, conn_id);
            self.queue(effects);
        }
    }

    /// Mark nodes down whose agents went quiet, and end the jobs whose batch script ran there.
    pub fn check_heartbeats(&mut self, now: f64) -> Result<(), StoreError> {
        let timeout = self.cfg.node_timeout();
        let at = self.clock.instant();
        for i in 0..self.extra.len() {
            let ex = &self.extra[i];
            // Silent since the later of our record and its connection task's (crate::lease).
            let ours = at.saturating_duration_since(ex.last_heard());
            let silent = match ex.connection_id().and_then(|c| crate::lease::silent_for(c, at)) {
                Some(s) => s.min(ours),
                None => ours,
            };
            if ex.state == NodeState::Down || !ex.ever_registered() || silent < timeout {
                continue;
            }
            self.extra[i].disconnect();
            let name = self.cluster.nodes()[i].name.clone();
            tracing::warn!(node = %name, "no heartbeat for {:?}: node down", silent);
            self.node_failed(i, &format!("missed heartbeats for {:.1} s", silent.as_secs_f64()), now)?;
        }
        Ok(())
    }
}

fn unknown_job(id: JobId) -> ClientResponse {
    error(ErrorCode::UnknownJob, format!("job {id} does not exist; `berth jobs --all` lists jobs"))
}

/// Connection `conn_id` of node `name` (its books `ex`) closed: when it is the node's live one,
/// the node has no agent any more, which the event `node_disconnect` records. A connection
/// replaced already closing changes nothing.
pub(crate) fn disconnected(ex: &mut NodeExtra, name: &str, conn_id: u64) -> Vec<Effect> {
    if !ex.is_connection(conn_id) {
        return vec![];
    }
    ex.disconnect();
    vec![Effect::node_event("node_disconnect", name, "")]
}

/// A job submitted alone, accepted as `id` (by [`crate::array::accepted`]): its row, then the event `submit`
/// naming its user. Needs no store.
pub(crate) fn submitted(job: &mut JobRecord, id: JobId) -> Vec<Effect> {
    let row = crate::array::accepted(job, id);
    vec![row, Effect::job_event("submit", id, None, job.user.name.clone())]
}

/// Job `job`'s first node reported its end (`outcome`) at `now` (from node `node`): it is
/// finished, the usage of its other nodes recorded so far (`members`) added to its own; then
/// its row, its accounting row and the event `end`. Needs no store.
pub(crate) fn job_ended(
    job: &mut JobRecord,
    outcome: &JobOutcome,
    members: &Usage,
    node: &str,
    now: f64,
) -> Vec<Effect> {
    job.finish(outcome, now);
    if let Some(u) = job.usage.as_mut() {
        u.user_cpu_us += members.user_cpu_us;
        u.system_cpu_us += members.system_cpu_us;
        u.peak_memory_bytes = u.peak_memory_bytes.max(members.peak_memory_bytes);
    }
    vec![
        Effect::UpdateJob(Box::new(job.clone())),
        Effect::InsertAccounting(Box::new(job.clone())),
        Effect::job_event("end", job.id, Some(node), job.state.as_str()),
    ]
}

/// Node `node`, not job `id`'s first, reported the job's part there ended (`outcome`): that
/// part's usage, recorded once, and added to the accounting row when the job no longer runs
/// there (`running_here` is the job while it holds the node: its end was recorded already
/// otherwise). While it runs and was sent no kill, the part ended early: event `member_ended`
/// with the agent's reason. Needs no store.
pub(crate) fn part_ended(id: JobId, running_here: Option<&JobRecord>, node: &str, outcome: &JobOutcome) -> Vec<Effect> {
    let usage = Usage {
        wall_ms: 0,
        user_cpu_us: outcome.user_cpu_us,
        system_cpu_us: outcome.system_cpu_us,
        peak_memory_bytes: outcome.peak_memory_bytes,
    };
    let mut effects =
        vec![Effect::AddMemberUsage { job: id, node: node.to_string(), usage, to_accounting: running_here.is_none() }];
    if running_here.is_some_and(|j| j.kill_sent.is_none()) {
        let detail = outcome.reason.clone().unwrap_or_default();
        effects.push(Effect::job_event("member_ended", id, Some(node), detail));
    }
    effects
}

/// Started job `job` cancelled: an interactive allocation (no batch script) has the event
/// `cancel` only, its end is the caller's (`end_interactive`); a batch job is marked killed
/// (`kill_sent`), then the event and a kill to every node of it (one not connected gets it when
/// it registers). Needs no store.
pub(crate) fn cancelled_started(job: &mut JobRecord) -> Vec<Effect> {
    if job.is_interactive() {
        return vec![Effect::job_event("cancel", job.id, None, "interactive")];
    }
    job.kill_sent = Some("cancelled".into());
    let mut effects = vec![Effect::job_event("cancel", job.id, None, "running: kill sent")];
    effects.extend(job.allocation.iter().map(|a| Effect::Send {
        node: a.node_id.0 as usize,
        msg: ControllerMessage::Kill { id: job.id, reason: "cancelled".into() },
    }));
    effects
}

/// Pending job `job` moved to state `to` (held, released): its row, then the event `event`.
/// Needs no store.
pub(crate) fn moved_pending(job: &mut JobRecord, to: JobState, event: &str) -> Vec<Effect> {
    job.state = to;
    vec![Effect::UpdateJob(Box::new(job.clone())), Effect::job_event(event, job.id, None, "")]
}

/// Node `name` (index `node`) registered from `address`: its row, then the event
/// `node_register` (a new agent process: `restarted`) or `node_reconnect`. Needs no store.
pub(crate) fn registered(node: usize, name: &str, address: &str, restarted: bool) -> Vec<Effect> {
    let kind = if restarted { "node_register" } else { "node_reconnect" };
    vec![Effect::UpsertNode { node }, Effect::node_event(kind, name, address)]
}

/// Node `name` (index `node`, its books `ex`) back after being down, but held down by an admin
/// (`reason`): down again, its row, then the event `node_held_down`. Needs no store.
pub(crate) fn held_down(ex: &mut NodeExtra, node: usize, name: &str, reason: &str) -> Vec<Effect> {
    ex.state = NodeState::Down;
    vec![Effect::UpsertNode { node }, Effect::node_event("node_held_down", name, format!("admin: {reason}"))]
}

/// Node `node`'s agent refused something (`kind`: the refusal's event kind) about `job`: its
/// event, the agent's detail cut to 2000 characters (logged too).
pub(crate) fn agent_refused(kind: &str, job: Option<JobId>, node: &str, detail: &str) -> Effect {
    let detail: String = detail.chars().take(2000).collect();
    tracing::warn!(node = %node, ?job, "agent refused: {detail}");
    Effect::Event { kind: kind.into(), job, node: Some(node.to_string()), detail }
}

/// A connection refused as an agent's (claiming node `node`, when it named one), `detail`
/// saying why: the event `auth_refused`.
pub(crate) fn auth_refused(node: Option<String>, detail: String) -> Effect {
    Effect::Event { kind: "auth_refused".into(), job: None, node, detail }
}

/// Pending job `job` is cancelled at `now`, with `reason` (its row) and `detail` (the event
/// `cancel`): its row, then the event.
pub(crate) fn cancelled_pending(job: &mut JobRecord, reason: &str, detail: &str, now: f64) -> Vec<Effect> {
    job.state = JobState::Cancelled;
    job.end_time = Some(now);
    job.reason = Some(reason.to_string());
    vec![Effect::UpdateJob(Box::new(job.clone())), Effect::job_event("cancel", job.id, None, detail)]
}

/// The event recording that `peer` was refused `action` on `job` of user `whose` (logged too):
/// "user X may not cancel job N of user Y".
pub(crate) fn denial(peer: &Peer, action: &str, job: Option<JobId>, whose: &str) -> Effect {
    let detail = match job {
        Some(id) if !whose.is_empty() => format!("user {} may not {action} job {id} of user {whose}", peer.user.name),
        Some(id) => format!("user {} may not {action} job {id}", peer.user.name),
        None => format!("user {} may not {action}", peer.user.name),
    };
    tracing::warn!(uid = peer.user.uid, "denied: {detail}");
    Effect::Event { kind: "denied".into(), job, node: None, detail }
}

#[cfg(test)]
mod effect_tests;
