//! Controller configuration: a TOML file, then `BERTH_<KEY>` environment variables, then
//! command-line flags, each overriding the one before. Validated at start; errors name the key.

use berth_core::hierarchy::{Hierarchy, SwitchDef};
use berth_core::placement::PlacementPolicy;
use berth_core::sched::backfill::BackfillPolicy;
use berth_core::sched::fairshare::FairShareConfig;
use berth_core::sched::preempt::PreemptConfig;
use berth_core::sched::priority::PriorityWeights;
use berth_core::sched::queue::QueueSpec;
use serde::Deserialize;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ControllerConfig {
    /// Directory of the state database and logs.
    pub state_dir: PathBuf,
    /// Unix socket users' commands connect to.
    pub socket: PathBuf,
    /// TCP address agents connect to.
    #[serde(default = "default_listen")]
    pub listen: String,
    #[serde(default = "default_heartbeat_interval")]
    pub heartbeat_interval_secs: f64,
    /// A node is marked down after this many missed heartbeats.
    #[serde(default = "default_heartbeat_misses")]
    pub heartbeat_misses: u32,
    /// Time between SIGTERM and SIGKILL when a job is cancelled or over its walltime.
    #[serde(default = "default_kill_grace")]
    pub kill_grace_secs: f64,
    /// Memory given per allocated core when a job does not ask (`--mem`).
    #[serde(default = "default_mem_per_core")]
    pub default_mem_per_core: String,
    /// Walltime for jobs that do not ask; none means unlimited.
    #[serde(default)]
    pub default_walltime: Option<String>,
    /// Users who may act on every job and node.
    #[serde(default = "default_admins")]
    pub admins: Vec<String>,
    /// PUs of every node held back for system daemons (kernel list, e.g. "0"); each node's can
    /// be changed at run time with `berth node system-cpus NODE LIST`.
    #[serde(default)]
    pub system_cpus: String,
    /// Split every node into subnodes of this many NUMA nodes (0: none).
    #[serde(default)]
    pub subnode_numa: u32,
    /// Placement rules (`[placement]`).
    #[serde(default)]
    pub placement: PlacementPolicy,
    /// The interconnect (`[interconnect]`): switches, or building blocks in CPUs.
    #[serde(default)]
    pub interconnect: InterconnectConfig,
    /// Limits of interactive allocations (`[interactive]`, `berth run` outside a job).
    #[serde(default)]
    pub interactive: InteractiveConfig,
    /// Queue policy (`[scheduler]`): backfill kind and how much one pass may do.
    #[serde(default)]
    pub scheduler: SchedulerConfig,
    /// Multifactor priority weights (`[priority]`).
    #[serde(default)]
    pub priority: PriorityWeights,
    /// Equal-access fair share (`[fair_share]`): half-life and shares per account.
    #[serde(default)]
    pub fair_share: FairShareConfig,
    /// Preemption by suspension (`[preempt]`): scores, cutoffs, the bound on suspension.
    #[serde(default)]
    pub preempt: PreemptConfig,
    /// The batch queues (`[[queues]]`), the first being the default; one queue "batch" with
    /// no limits when none is configured.
    #[serde(default = "default_queues")]
    pub queues: Vec<QueueSpec>,
    /// The reservations API for external schedulers (`[api]`, docs/reservations.md).
    #[serde(default)]
    pub api: ApiConfig,
    /// What happens to jobs when a node fails (`[fault]`).
    #[serde(default)]
    pub fault: FaultConfig,
    /// The cluster key agents and the controller prove themselves with (`berth keygen`;
    /// docs/protocol/06-auth.md, "Authentication"). `berth server` defaults it to DIR/cluster.key.
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    /// How far a signed timestamp may be from this controller's clock (seconds).
    #[serde(default = "default_replay_window")]
    pub replay_window_secs: u64,
    /// Bounds on what one submission may ask for and carry (`[limits]`).
    #[serde(default)]
    pub limits: berth_core::limits::SubmitLimits,
    /// Caps on the connections of the local socket, and when idle ones are closed
    /// (`[connections]`, docs/protocol/00-framing.md "Limits").
    #[serde(default)]
    pub connections: ConnectionsConfig,
    /// Slurm and PBS compatibility (`[compat]`, docs/compat.md).
    #[serde(default)]
    pub compat: CompatConfig,
    /// Job notifications (`[notify]`: `command`, `timeout_secs`), for `--mail-type`.
    #[serde(default)]
    pub notify: NotifyConfig,
    /// Refuse user and account names this host does not know (`--account`, `resv create
    /// --users/--accounts`). Off only in unit tests, whose users are made up.
    #[serde(default = "yes", skip)]
    pub verify_names: bool,
    /// `[licenses]`: cluster-wide licenses and how many of each exist (`matlab = 4`), which
    /// jobs ask for with `--licenses` (Slurm's `Licenses=` of slurm.conf).
    #[serde(default)]
    pub licenses: berth_core::gres::Counts,
    /// `[gres]`: generic countable resources of nodes, by node name or host list
    /// (`"node[1-4]" = { nvme_gb = 800 }`, `fpga01 = { fpga = 1 }`), which jobs ask for on
    /// each node with `--gres` (Slurm's `Gres=` of a `NodeName=` line). A node named by
    /// several entries has them all (a name given twice for one node: the last entry's count).
    #[serde(default)]
    pub gres: std::collections::BTreeMap<String, berth_core::gres::Counts>,
}

fn yes() -> bool {
    true
}

/// `[fault]`: the node-failure policy. A job's `--requeue` / `--no-requeue` wins over
/// `requeue`; `--no-kill` jobs keep running on their surviving nodes.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct FaultConfig {
    /// Requeue the batch jobs of a failed node (rerun from the start), as PBS's rerunnable
    /// jobs and Slurm's `JobRequeue=1`; otherwise they fail with `node_fail`.
    pub requeue: bool,
    /// A job requeued this many times for node failures fails on the next one instead.
    pub max_requeues: u32,
    /// Fencing by lease: an agent that has not heard from the controller for its lease
    /// (the node timeout less a margin) kills the jobs that would be requeued, so that a
    /// requeued job never runs twice at once (docs/protocol/02-agent.md, "Fencing").
    pub fence: bool,
}

impl Default for FaultConfig {
    fn default() -> Self {
        FaultConfig { requeue: true, max_requeues: 3, fence: true }
    }
}

/// `[api]`: the reservations API and the lifetime rules of reservations.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ApiConfig {
    /// Serve the API at all (the `reservation` client request works either way).
    pub enabled: bool,
    /// The Unix socket (default: `api.sock` in the controller socket's directory).
    pub socket: Option<PathBuf>,
    /// Also serve on this TCP address (e.g. "127.0.0.1:7118"); needs `token_file`.
    pub listen: Option<String>,
    /// File holding the bearer token TCP clients must send (they get admin rights).
    pub token_file: Option<PathBuf>,
    /// An unconfirmed reservation is released after this long.
    pub confirm_timeout_secs: f64,
    /// A session-confirmed reservation is released unless renewed within this long.
    pub session_timeout_secs: f64,
    /// How often holders (jobs, processes, sessions) are checked.
    pub check_interval_secs: f64,
    /// The longest walltime a reservation may ask for.
    pub max_walltime_secs: u64,
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            enabled: true,
            socket: None,
            listen: None,
            token_file: None,
            confirm_timeout_secs: 60.0,
            session_timeout_secs: 300.0,
            check_interval_secs: 1.0,
            max_walltime_secs: 7 * 86400,
        }
    }
}

impl ApiConfig {
    /// What is wrong with it, naming the key.
    pub fn validate(&self) -> Result<(), String> {
        for (key, v) in [
            ("confirm_timeout_secs", self.confirm_timeout_secs),
            ("session_timeout_secs", self.session_timeout_secs),
            ("check_interval_secs", self.check_interval_secs),
        ] {
            if !(v > 0.0 && v.is_finite()) {
                return Err(format!("[api] {key} must be a positive number of seconds, not {v}"));
            }
        }
        if self.max_walltime_secs == 0 {
            return Err("[api] max_walltime_secs must be at least 1".into());
        }
        if let Some(l) = &self.listen {
            if l.parse::<std::net::SocketAddr>().is_err() {
                return Err(format!("[api] listen {l:?} is not an address like 127.0.0.1:7118"));
            }
            if self.token_file.is_none() {
                return Err(
                    "[api] listen needs [api] token_file: TCP clients are authenticated by a bearer token only".into(),
                );
            }
        }
        Ok(())
    }

    /// Where the Unix socket is.
    pub fn socket_path(&self, controller_socket: &std::path::Path) -> PathBuf {
        self.socket.clone().unwrap_or_else(|| {
            controller_socket.parent().map(|d| d.join("api.sock")).unwrap_or_else(|| PathBuf::from("api.sock"))
        })
    }
}

/// `[notify]` in the controller's configuration.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct NotifyConfig {
    /// The hook: an absolute path, run directly (no shell). None: notifications are recorded
    /// only.
    pub command: Option<PathBuf>,
    /// Seconds a hook may run before it is killed.
    pub timeout_secs: f64,
    /// The most hooks running at once; past it an event is logged and dropped.
    pub max_running: usize,
}

impl Default for NotifyConfig {
    fn default() -> Self {
        NotifyConfig { command: None, timeout_secs: 10.0, max_running: 32 }
    }
}

impl NotifyConfig {
    /// Checked when the configuration is loaded.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(c) = &self.command {
            if !c.is_absolute() {
                return Err(format!("notify.command must be an absolute path, got {}", c.display()));
            }
        }
        if !(self.timeout_secs.is_finite() && self.timeout_secs > 0.0) {
            return Err("notify.timeout_secs must be a positive number of seconds".into());
        }
        Ok(())
    }
}

/// `[compat]`: what berth does for scripts written for Slurm and PBS.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct CompatConfig {
    /// Give jobs, their steps and tasks the `SLURM_*` and `PBS_*` variables as well as
    /// berth's own (docs/compat.md, "Environment").
    pub environment: bool,
}

impl Default for CompatConfig {
    fn default() -> Self {
        CompatConfig { environment: true }
    }
}

/// `[connections]`: what the users of the local socket may hold. Past a cap a connection is
/// answered with an error saying which, then closed; root has `root_reserve` more places
/// than `max_total` and no per-user cap, so an administrator can always get in.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ConnectionsConfig {
    /// Connections one user (uid) may hold at once.
    pub max_per_uid: usize,
    /// Connections all users but root may hold together (lowered at start to what the
    /// descriptor limit allows).
    pub max_total: usize,
    /// Places kept for root past `max_total`.
    pub root_reserve: usize,
    /// A connection with no request in flight that sends nothing this long is closed (those
    /// holding a `berth run` step are not); also the time a request may take to arrive once
    /// it has begun.
    pub idle_timeout_secs: u64,
}

impl Default for ConnectionsConfig {
    fn default() -> Self {
        ConnectionsConfig { max_per_uid: 256, max_total: 4096, root_reserve: 64, idle_timeout_secs: 60 }
    }
}

fn default_replay_window() -> u64 {
    60
}

/// `[scheduler]`: which backfill, and bounds on one pass so a huge queue never stalls it.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct SchedulerConfig {
    pub policy: BackfillPolicy,
    /// Most reservations ("will run at") computed per pass; later jobs may still start now.
    pub max_reservations: usize,
    /// Walltime assumed, for reservations only, of jobs that have none (seconds).
    pub unlimited_walltime_secs: u64,
    /// Wall-clock budget for a pass's reservations (milliseconds; 0: none): past it, the pass
    /// reserves nothing more, as past `max_reservations`, so it cannot hold up the controller.
    pub reservation_budget_ms: u64,
    /// Cancel a job whose dependency can never be met (Slurm's `kill_invalid_depend`); by
    /// default it waits, with reason `DependencyNeverSatisfied`, as in Slurm.
    pub kill_invalid_depend: bool,
    /// A job array's indexes run from 0 to one less than this (Slurm's `MaxArraySize`, whose
    /// default it has): a bigger array is refused.
    pub max_array_size: u32,
    /// Under a stream of changes, a scheduling pass waits this many times the last pass's
    /// cost after it (`crate::pacing`; at most 250 ms); 0: a pass after every batch that
    /// changed something, however long the queue (at most 100).
    pub pass_pace: u32,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            policy: BackfillPolicy::Easy,
            max_reservations: 200,
            unlimited_walltime_secs: 365 * 86400,
            reservation_budget_ms: 500,
            kill_invalid_depend: false,
            max_array_size: berth_core::directives::array::DEFAULT_MAX_ARRAY_SIZE,
            pass_pace: crate::pacing::DEFAULT_PACE,
        }
    }
}

/// `[interactive]`: allocations `berth run` makes outside any batch job. They are placed at
/// once or refused (never queued), so they are kept small and short.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct InteractiveConfig {
    pub enabled: bool,
    pub max_nodes: u32,
    pub max_cores: u32,
    /// Also the walltime of an interactive allocation that does not ask for one.
    pub max_walltime_secs: u64,
}

impl Default for InteractiveConfig {
    fn default() -> Self {
        InteractiveConfig { enabled: true, max_nodes: 4, max_cores: 64, max_walltime_secs: 3600 }
    }
}

/// `[interconnect]`: `blocks = [8, 32, 128, 512]`, or `[[interconnect.switch]]` tables with
/// `name` and `nodes` (leaf) or `switches` (upper); `order = ["n[1-32]", ...]`: the order nodes
/// are grouped into blocks and listed in (default: names in natural order, node2 before node10).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct InterconnectConfig {
    #[serde(default)]
    pub blocks: Vec<u64>,
    #[serde(default)]
    pub switch: Vec<SwitchDef>,
    /// Nodes in their physical order (host lists allowed); nodes not named come after, by name.
    #[serde(default)]
    pub order: Vec<String>,
}

fn default_queues() -> Vec<QueueSpec> {
    vec![QueueSpec::default()]
}

fn default_listen() -> String {
    "127.0.0.1:7117".into()
}
fn default_heartbeat_interval() -> f64 {
    5.0
}
fn default_heartbeat_misses() -> u32 {
    3
}
fn default_kill_grace() -> f64 {
    10.0
}
fn default_mem_per_core() -> String {
    "256M".into()
}
fn default_admins() -> Vec<String> {
    vec!["root".into()]
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("config file {path}: {message}")]
    Parse { path: String, message: String },
    #[error("config key `{key}`: {message}")]
    Invalid { key: String, message: String },
}

/// Values that override the file, e.g. from flags: (key, TOML-ish value).
pub type Overrides = Vec<(String, String)>;

/// The keys a config may hold, for environment lookups.
const KEYS: [&str; 11] = [
    "system_cpus",
    "subnode_numa",
    "state_dir",
    "socket",
    "listen",
    "heartbeat_interval_secs",
    "heartbeat_misses",
    "kill_grace_secs",
    "default_mem_per_core",
    "default_walltime",
    "admins",
];

impl ControllerConfig {
    /// Load: `defaults`, then the file (optional), then environment `BERTH_<KEY>`, then `flags`.
    pub fn load(
        file: Option<&Path>,
        defaults: &Overrides,
        env: &[(String, String)],
        flags: &Overrides,
    ) -> Result<Self, ConfigError> {
        let label = file.map(|p| p.display().to_string()).unwrap_or_else(|| "(defaults)".into());
        let mut table = match file {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
                text.parse::<toml::Table>()
                    .map_err(|e| ConfigError::Parse { path: label.clone(), message: e.to_string() })?
            }
            None => toml::Table::new(),
        };
        for (k, v) in defaults {
            if !table.contains_key(k) {
                table.insert(k.clone(), env_value(k, v));
            }
        }
        for key in KEYS {
            let var = format!("BERTH_{}", key.to_ascii_uppercase());
            if let Some((_, v)) = env.iter().find(|(k, _)| *k == var) {
                table.insert(key.to_string(), env_value(key, v));
            }
        }
        for (k, v) in flags {
            table.insert(k.clone(), env_value(k, v));
        }
        let config: ControllerConfig = toml::Value::Table(table)
            .try_into()
            .map_err(|e: toml::de::Error| ConfigError::Parse { path: label, message: e.message().to_string() })?;
        config.validate()?;
        Ok(config)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key: &str, message: String| Err(ConfigError::Invalid { key: key.into(), message });
        if !(self.heartbeat_interval_secs > 0.0 && self.heartbeat_interval_secs <= 3600.0) {
            return invalid(
                "heartbeat_interval_secs",
                format!("{} is not between 0 and 3600 seconds", self.heartbeat_interval_secs),
            );
        }
        if self.heartbeat_misses == 0 {
            return invalid("heartbeat_misses", "must be at least 1".into());
        }
        if let Err(e) = self.notify.validate() {
            return invalid("notify", e);
        }
        if let Err(e) = berth_core::gres::check_config("[licenses]", &self.licenses) {
            return invalid("licenses", e.to_string());
        }
        if self.gres.len() > 4096 {
            return invalid("gres", format!("at most 4096 entries, got {}", self.gres.len()));
        }
        for (hosts, counts) in &self.gres {
            if let Err(e) = berth_core::hostlist::expand(hosts) {
                return invalid("gres", format!("{hosts:?} is not a node name or host list: {e}"));
            }
            if let Err(e) = berth_core::gres::check_node_config(&format!("[gres] {hosts}"), counts) {
                return invalid("gres", e.to_string());
            }
            if counts.keys().any(|k| berth_core::gres::split_key(k).0 == "gpu") {
                return invalid(
                    "gres",
                    format!("[gres] {hosts}: gpu is not configured here; the agents find GPUs (docs/gpus.md)"),
                );
            }
        }
        if !(self.kill_grace_secs >= 0.0 && self.kill_grace_secs <= 3600.0) {
            return invalid("kill_grace_secs", format!("{} is not between 0 and 3600 seconds", self.kill_grace_secs));
        }
        if let Err(e) = berth_core::units::parse_size(&self.default_mem_per_core) {
            return invalid("default_mem_per_core", e.to_string());
        }
        if let Some(w) = &self.default_walltime {
            if let Err(e) = berth_core::units::parse_duration_secs(w) {
                return invalid("default_walltime", e.to_string());
            }
        }
        if let Err(e) = berth_core::CpuSet::parse_list(&self.system_cpus) {
            return invalid("system_cpus", e.to_string());
        }
        if !self.interconnect.blocks.is_empty() && !self.interconnect.switch.is_empty() {
            return invalid("interconnect", "give blocks or switches, not both".into());
        }
        if let Err(e) = self.hierarchy().and_then(|_| self.node_order()) {
            return invalid("interconnect", e.to_string());
        }
        if self.scheduler.pass_pace > crate::pacing::MAX_PACE {
            return invalid(
                "scheduler",
                format!("pass_pace {} is above {}", self.scheduler.pass_pace, crate::pacing::MAX_PACE),
            );
        }
        let l = &self.limits;
        if l.max_walltime_secs == 0 || l.max_count == 0 || l.min_mem_bytes > l.max_mem_bytes {
            return invalid(
                "limits",
                "max_walltime_secs and max_count must be at least 1, min_mem_bytes at most max_mem_bytes".into(),
            );
        }
        let c = &self.connections;
        if c.max_per_uid == 0 || c.max_total == 0 || c.idle_timeout_secs == 0 {
            return invalid("connections", "max_per_uid, max_total and idle_timeout_secs must be at least 1".into());
        }
        let i = &self.interactive;
        if i.max_nodes == 0 || i.max_cores == 0 || i.max_walltime_secs == 0 {
            return invalid("interactive", "max_nodes, max_cores and max_walltime_secs must be at least 1".into());
        }
        if self.fair_share.half_life_secs <= 0.0 || !self.fair_share.half_life_secs.is_finite() {
            return invalid("fair_share", "half_life_secs must be a positive number of seconds".into());
        }
        if self.fair_share.shares.values().chain([&self.fair_share.default_share]).any(|s| *s < 0.0 || !s.is_finite()) {
            return invalid("fair_share", "shares must be numbers >= 0".into());
        }
        if let Err(why) = self.fair_share.check_weights() {
            return invalid("fair_share", why.to_string());
        }
        let p = &self.priority;
        if [p.age, p.size, p.queue, p.fair_share].iter().any(|w| *w < 0.0 || !w.is_finite()) || p.max_age_secs <= 0.0 {
            return invalid("priority", "weights must be numbers >= 0 and max_age_secs > 0".into());
        }
        if self.queues.is_empty() {
            return invalid("queues", "configure at least one queue".into());
        }
        for (i, q) in self.queues.iter().enumerate() {
            let good = !q.name.is_empty() && q.name.chars().all(|c| c.is_ascii_alphanumeric() || "_-".contains(c));
            if !good {
                return invalid("queues", format!("queue name {:?}: use letters, digits, _ and -", q.name));
            }
            if ["interactive", "reservation"].contains(&q.name.as_str()) {
                return invalid("queues", format!("queue name {:?} is reserved for berth's own allocations", q.name));
            }
            if self.queues[..i].iter().any(|o| o.name == q.name) {
                return invalid("queues", format!("queue {:?} is configured twice", q.name));
            }
            if let (Some(d), Some(m)) = (q.default_walltime_secs, q.max_walltime_secs) {
                if d > m {
                    return invalid(
                        "queues",
                        format!("queue {}: default_walltime_secs exceeds max_walltime_secs", q.name),
                    );
                }
            }
            let property =
                |p: &String| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || "_-".contains(c));
            if !q.target_properties.iter().all(property) {
                return invalid(
                    "queues",
                    format!("queue {}: target_properties are names of letters, digits, _ and -", q.name),
                );
            }
            if q.reserved && q.target_properties.is_empty() {
                return invalid(
                    "queues",
                    format!("queue {}: reserved keeps others off its target_properties; set them", q.name),
                );
            }
        }
        if self.listen.parse::<std::net::SocketAddr>().is_err() {
            return invalid("listen", format!("{:?} is not an address like 127.0.0.1:7117", self.listen));
        }
        Ok(())
    }

    pub fn hierarchy(&self) -> Result<Hierarchy, berth_core::CoreError> {
        if !self.interconnect.switch.is_empty() {
            Hierarchy::from_switches(&self.interconnect.switch)
        } else if !self.interconnect.blocks.is_empty() {
            Ok(Hierarchy::blocks_in(self.interconnect.blocks.clone(), self.node_order()?))
        } else {
            Ok(Hierarchy::Flat)
        }
    }

    /// The order nodes are grouped into blocks and listed in (`[interconnect] order`, then names).
    pub fn node_order(&self) -> Result<berth_core::hierarchy::NodeOrder, berth_core::CoreError> {
        berth_core::hierarchy::NodeOrder::listed(&self.interconnect.order)
    }

    pub fn system_cpu_set(&self) -> berth_core::CpuSet {
        berth_core::CpuSet::parse_list(&self.system_cpus).unwrap_or_default()
    }

    /// The generic resources `[gres]` gives node `name`.
    pub fn gres_of(&self, name: &str) -> berth_core::gres::Counts {
        let mut out = berth_core::gres::Counts::new();
        for (hosts, counts) in &self.gres {
            let named =
                hosts == name || berth_core::hostlist::expand(hosts).is_ok_and(|list| list.iter().any(|h| h == name));
            if named {
                out.extend(counts.iter().map(|(k, v)| (k.clone(), *v)));
            }
        }
        out
    }

    /// The most of generic resource `name` (a key: `nvme:fast` of that type, `nvme` of any
    /// type, berth_core::gres::available) an entry of `[gres]` gives a node (0: none has it).
    pub fn gres_max(&self, name: &str) -> u32 {
        self.gres.values().map(|c| berth_core::gres::available(c, name)).max().unwrap_or(0)
    }

    pub fn default_mem_per_core_bytes(&self) -> u64 {
        berth_core::units::parse_size(&self.default_mem_per_core).unwrap_or(256 << 20)
    }

    /// Where jobs go that name no queue: the first enabled queue (else the first).
    pub fn default_queue(&self) -> &str {
        self.queues.iter().find(|q| q.enabled).or(self.queues.first()).map(|q| q.name.as_str()).unwrap_or("batch")
    }

    pub fn default_walltime_secs(&self) -> Option<u64> {
        self.default_walltime.as_deref().and_then(|w| berth_core::units::parse_duration_secs(w).ok())
    }

    /// How long without a message before a node is marked down.
    pub fn node_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs_f64(self.heartbeat_interval_secs * self.heartbeat_misses as f64)
    }

    /// An agent's lease: the node timeout less a margin (a third of it, at least 1 s, and at
    /// least one heartbeat less), by which the agent has killed its fenced jobs before this
    /// controller, having heard nothing for the node timeout, requeues them. None when
    /// fencing is off or the timeout leaves no room for it.
    pub fn lease(&self) -> Option<std::time::Duration> {
        if !self.fault.fence {
            return None;
        }
        let timeout = self.node_timeout();
        let margin = (timeout / 3).max(std::time::Duration::from_secs(1));
        let lease = timeout.checked_sub(margin)?;
        (lease >= std::time::Duration::from_secs_f64(self.heartbeat_interval_secs)).then_some(lease)
    }
}

/// Environment and flag values are text; numbers and lists are read as TOML when they parse.
fn env_value(key: &str, v: &str) -> toml::Value {
    if key == "admins" {
        return toml::Value::Array(v.split(',').map(|s| toml::Value::String(s.trim().to_string())).collect());
    }
    if let Ok(i) = v.parse::<i64>() {
        if key != "default_mem_per_core" && key != "default_walltime" && key != "system_cpus" {
            return toml::Value::Integer(i);
        }
    }
    if let Ok(f) = v.parse::<f64>() {
        if key.ends_with("_secs") {
            return toml::Value::Float(f);
        }
    }
    toml::Value::String(v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(text: &str) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), text).unwrap();
        f
    }

    #[test]
    fn file_env_flags_precedence() {
        let f = write(
            "state_dir = \"/tmp/s\"\nsocket = \"/tmp/s.sock\"\nheartbeat_interval_secs = 2.0\nkill_grace_secs = 3\n",
        );
        let env =
            vec![("BERTH_HEARTBEAT_MISSES".to_string(), "7".to_string()), ("BERTH_KILL_GRACE_SECS".into(), "4".into())];
        let flags = vec![("kill_grace_secs".to_string(), "5".to_string())];
        let c = ControllerConfig::load(Some(f.path()), &vec![("listen".into(), "127.0.0.1:9".into())], &env, &flags)
            .unwrap();
        assert_eq!(c.heartbeat_interval_secs, 2.0);
        assert_eq!(c.heartbeat_misses, 7);
        assert_eq!(c.kill_grace_secs, 5.0);
        assert_eq!(c.listen, "127.0.0.1:9");
    }

    #[test]
    fn errors_name_the_key() {
        let f = write("state_dir = \"/tmp/s\"\nsocket = \"/tmp/s.sock\"\nheartbeat_intervl = 2\n");
        let e = ControllerConfig::load(Some(f.path()), &vec![], &[], &vec![]).unwrap_err().to_string();
        assert!(e.contains("heartbeat_intervl"), "{e}");
        let f = write("state_dir = \"/tmp/s\"\nsocket = \"/tmp/s.sock\"\nheartbeat_misses = 0\n");
        let e = ControllerConfig::load(Some(f.path()), &vec![], &[], &vec![]).unwrap_err().to_string();
        assert!(e.contains("heartbeat_misses"), "{e}");
        let f = write("state_dir = \"/tmp/s\"\nsocket = \"/tmp/s.sock\"\ndefault_mem_per_core = \"lots\"\n");
        let e = ControllerConfig::load(Some(f.path()), &vec![], &[], &vec![]).unwrap_err().to_string();
        assert!(e.contains("default_mem_per_core"), "{e}");
        let f = write("state_dir = \"/tmp/s\"\nsocket = \"/tmp/s.sock\"\nheartbeat_misses = \"x\"\n");
        let e = ControllerConfig::load(Some(f.path()), &vec![], &[], &vec![]).unwrap_err().to_string();
        assert!(e.contains("heartbeat_misses") || e.contains("invalid type"), "{e}");
        let f = write("this is not toml");
        assert!(ControllerConfig::load(Some(f.path()), &vec![], &[], &vec![]).is_err());
        let e = ControllerConfig::load(None, &vec![], &[], &vec![]).unwrap_err().to_string();
        assert!(e.contains("state_dir"), "{e}");
    }

    /// Queue targets from the file; `reserved` without targets, or a bad property, is an error.
    #[test]
    fn queue_subnode_targets() {
        let base = "state_dir = \"/tmp/s\"\nsocket = \"/tmp/s.sock\"\n[[queues]]\nname = \"batch\"\n[[queues]]\nname = \"big\"\n";
        let f = write(&format!("{base}target_properties = [\"fat\"]\nreserved = true\n"));
        let c = ControllerConfig::load(Some(f.path()), &vec![], &[], &vec![]).unwrap();
        assert_eq!((c.queues[1].target_properties.clone(), c.queues[1].reserved), (vec!["fat".to_string()], true));
        for (extra, wanted) in [("reserved = true\n", "set them"), ("target_properties = [\"a b\"]\n", "letters")] {
            let f = write(&format!("{base}{extra}"));
            let e = ControllerConfig::load(Some(f.path()), &vec![], &[], &vec![]).unwrap_err().to_string();
            assert!(e.contains("queue big") && e.contains(wanted), "{e}");
        }
    }

    #[test]
    fn compat_section() {
        let base = "state_dir = \"/tmp/s\"\nsocket = \"/tmp/s.sock\"\n";
        let c = ControllerConfig::load(Some(write(base).path()), &vec![], &[], &vec![]).unwrap();
        assert!(c.compat.environment, "on by default");
        let f = write(&format!("{base}[compat]\nenvironment = false\n"));
        assert!(!ControllerConfig::load(Some(f.path()), &vec![], &[], &vec![]).unwrap().compat.environment);
        let f = write(&format!("{base}[compat]\nenviron = false\n"));
        let e = ControllerConfig::load(Some(f.path()), &vec![], &[], &vec![]).unwrap_err().to_string();
        assert!(e.contains("environ"), "{e}");
    }

    #[test]
    fn interactive_section() {
        let f = write("state_dir = \"/tmp/s\"\nsocket = \"/tmp/s.sock\"\n");
        let c = ControllerConfig::load(Some(f.path()), &vec![], &[], &vec![]).unwrap();
        assert_eq!(c.interactive, InteractiveConfig::default());
        let f =
            write("state_dir = \"/tmp/s\"\nsocket = \"/tmp/s.sock\"\n[interactive]\nmax_cores = 8\nenabled = false\n");
        let c = ControllerConfig::load(Some(f.path()), &vec![], &[], &vec![]).unwrap();
        assert_eq!((c.interactive.max_cores, c.interactive.enabled, c.interactive.max_nodes), (8, false, 4));
        let f = write("state_dir = \"/tmp/s\"\nsocket = \"/tmp/s.sock\"\n[interactive]\nmax_nodes = 0\n");
        let e = ControllerConfig::load(Some(f.path()), &vec![], &[], &vec![]).unwrap_err().to_string();
        assert!(e.contains("interactive"), "{e}");
    }

    #[test]
    fn scheduler_section() {
        let f = write("state_dir = \"/tmp/s\"\nsocket = \"/tmp/s.sock\"\n");
        let c = ControllerConfig::load(Some(f.path()), &vec![], &[], &vec![]).unwrap();
        assert_eq!((c.scheduler.max_reservations, c.scheduler.reservation_budget_ms), (200, 500));
        let f = write(
            "state_dir = \"/tmp/s\"\nsocket = \"/tmp/s.sock\"\n[scheduler]\npolicy = \"conservative\"\nreservation_budget_ms = 0\n",
        );
        let c = ControllerConfig::load(Some(f.path()), &vec![], &[], &vec![]).unwrap();
        assert_eq!((c.scheduler.policy, c.scheduler.reservation_budget_ms), (BackfillPolicy::Conservative, 0));
        assert_eq!(c.scheduler.pass_pace, 3, "passes paced by default");
        let f = write("state_dir = \"/tmp/s\"\nsocket = \"/tmp/s.sock\"\n[scheduler]\npass_pace = 0\n");
        assert_eq!(ControllerConfig::load(Some(f.path()), &vec![], &[], &vec![]).unwrap().scheduler.pass_pace, 0);
        let f = write("state_dir = \"/tmp/s\"\nsocket = \"/tmp/s.sock\"\n[scheduler]\npass_pace = 101\n");
        let e = ControllerConfig::load(Some(f.path()), &vec![], &[], &vec![]).unwrap_err().to_string();
        assert!(e.contains("pass_pace 101 is above 100"), "{e}");
    }
}
