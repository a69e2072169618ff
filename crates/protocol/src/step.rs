//! Job steps (`berth run`): the grant the controller gives, the control tree between shepherds,
//! and the task API inside a job. See docs/protocol/01-client.md ("Steps"),
//! docs/protocol/03-control-tree.md and docs/protocol/04-task-api.md.

use crate::user::UserIdentity;
use berth_core::step::mpmd::App;
use berth_core::step::{MpiKind, RankPlace, StepRequest};
use berth_core::JobId;
use serde::{Deserialize, Serialize};

/// The name under which the `berth` client is `berth task rsh` (one word, for MPI launchers
/// that take a program and no arguments, such as MPICH hydra's `-launcher-exec`): each agent
/// links it to the client in its spool directory. Here so the client need not link the agent.
pub const RSH_NAME: &str = "berth-rsh";

/// `berth run` asks the controller for a step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepCreate {
    /// The job whose allocation the step uses; None: an interactive allocation is made.
    pub job: Option<JobId>,
    pub request: StepRequest,
    #[serde(default)]
    pub interactive: InteractiveAsk,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: String,
    /// Where `run` runs (invocation log).
    pub host: String,
    pub pid: u32,
    /// Tree fanout, 2..32; 0 = flat (the first node contacts every other).
    pub fanout: u32,
    #[serde(default)]
    pub no_kill: bool,
    #[serde(default)]
    pub rank_cpusets: bool,
    /// Sent to surviving ranks when another fails in no-kill mode.
    #[serde(default)]
    pub notify_signal: Option<i32>,
    /// `--mpi`; None: the job's `#BERTH --mpi`, else auto.
    #[serde(default)]
    pub mpi: Option<MpiKind>,
    /// Several programs in one step (MPMD): the parts of a colon line, each with its own
    /// `request`, or the lines of a multi-prog file, each with its ranks (`request` is then
    /// the step's layout). Empty: one program, `argv` (docs/launcher.md, "Several programs in
    /// one step (MPMD)"). `argv` is then the whole command line, for the invocation log.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub apps: Vec<App>,
    /// The step is the children of a `PMIx_Spawn` (`MPI_Comm_spawn`) of another step of the
    /// same job: its ranks are told their parent (`PMIX_PARENT_ID`). Set by `berth run` for
    /// the spawns of its step (docs/launcher.md, "MPI_Comm_spawn").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spawned_by: Option<SpawnParent>,
}

/// The process that spawned a step (`PMIx_Spawn`): its PMIx namespace and rank.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpawnParent {
    pub nspace: String,
    pub rank: u32,
}

/// The most processes one `PMIx_Spawn` may ask for (all its programs together).
pub const MAX_SPAWN_PROCS: u32 = 4096;
/// The most programs one `PMIx_Spawn` may name.
pub const MAX_SPAWN_APPS: usize = 64;

/// One program of a `PMIx_Spawn` (`MPI_Comm_spawn`, `MPI_Comm_spawn_multiple`): what the
/// parent asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpawnApp {
    /// The program and its arguments (`argv[0]` is the program).
    pub argv: Vec<String>,
    /// How many copies (`maxprocs`).
    pub maxprocs: u32,
    /// Variables the parent set for it, over the parent step's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<(String, String)>,
    /// Its working directory; None: the parent step's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
}

/// A rank of node `from` called `PMIx_Spawn`: up the control tree to `berth run`, which asks
/// the controller for a step of the same job running `apps` and answers with a
/// [`SpawnReply`] once its ranks run. docs/protocol/03-control-tree.md, "Spawn".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpawnRequest {
    /// The asking node's request number (unique on that node for the step).
    pub id: u64,
    pub from: u32,
    pub rank: u32,
    pub apps: Vec<SpawnApp>,
}

/// The answer to a [`SpawnRequest`], down the tree to node `to`: the new step's PMIx
/// namespace, or why there is none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpawnReply {
    pub id: u64,
    pub to: u32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub nspace: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The most values one `PMIx_Publish` may carry.
pub const MAX_PUBLISH_VALUES: usize = 64;
/// The most bytes of one published value (before hex).
pub const MAX_PUBLISHED_BYTES: usize = 64 * 1024;
/// The most keys one `PMIx_Lookup` may ask for.
pub const MAX_LOOKUP_KEYS: usize = 64;
/// The most processes one `PMIx_Connect` may name.
pub const MAX_CONNECT_PROCS: usize = 1 << 16;

/// A process of a PMIx namespace (a step): its namespace and rank (`u32::MAX - 1`: all its
/// ranks, PMIx's wildcard).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ProcName {
    pub nspace: String,
    pub rank: u32,
}

/// PMIx's `PMIX_RANK_WILDCARD`: every rank of a namespace.
pub const RANK_WILDCARD: u32 = u32::MAX - 1;

/// A published value: a string, or bytes (hex).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishedValue {
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<String>,
}

/// A rank's `PMIx_Publish`, up the tree to `berth run` (03-control-tree.md, "Publish, lookup
/// and connect").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishRequest {
    pub id: u64,
    pub from: u32,
    pub rank: u32,
    pub values: Vec<PublishedValue>,
    /// Deleted when first looked up (`PMIX_PERSIST_FIRST_READ`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub first_read: bool,
}

/// A rank's `PMIx_Lookup`, up the tree to `berth run`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LookupRequest {
    pub id: u64,
    pub from: u32,
    pub rank: u32,
    pub keys: Vec<String>,
    /// Wait until every key is published (`PMIX_WAIT`; the asking node bounds the wait).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub wait: bool,
}

/// A node's `PMIx_Connect` (once all its participating ranks called it), up the tree to `berth
/// run`, which answers every such node once all that host a participant have called.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectRequest {
    pub id: u64,
    pub from: u32,
    pub procs: Vec<ProcName>,
}

/// What a lookup found: the value and who published it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Found {
    pub value: PublishedValue,
    pub publisher: ProcName,
}

/// `berth run`'s answer to a publish, lookup or connect, down the tree to node `to`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceReply {
    pub id: u64,
    pub to: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub found: Vec<Found>,
}

/// Resources of an interactive allocation (outside a batch job). The GPU, generic resource
/// and license fields are a batch job's (`SubmitOptions`'s of the same names, checked as at
/// submission); absent from older clients' frames, they read as none.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct InteractiveAsk {
    pub nodes: Option<u32>,
    pub walltime_seconds: Option<u64>,
    /// `--gpus N`: GPUs of the whole allocation, spread evenly over its nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<u32>,
    /// `--gpus-per-node N`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus_per_node: Option<u32>,
    /// `--gpu-type T`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_type: Option<String>,
    /// `--gpus-per-socket N` (with `sockets_per_node`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus_per_socket: Option<u32>,
    /// `--sockets-per-node S` (with `gpus_per_socket` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sockets_per_node: Option<u32>,
    /// `--gres NAME[:TYPE]:COUNT,...`: generic resources on each node (not GPUs).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub gres: berth_core::gres::Counts,
    /// `--licenses`/`-L NAME[:COUNT],...`: cluster-wide licenses while the allocation lives.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub licenses: berth_core::gres::Counts,
}

/// A step as granted: everything the shepherds need. Issued by the controller only.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepGrant {
    pub job: JobId,
    pub step: u32,
    /// The PMI key-value space name.
    pub kvsname: String,
    /// Who the ranks run as: the identity the kernel gave for the `run` process.
    pub user: UserIdentity,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: String,
    pub size: u32,
    pub fanout: u32,
    pub no_kill: bool,
    pub rank_cpusets: bool,
    /// Bind each rank to its CPUs (sched_setaffinity).
    pub bind: bool,
    pub notify_signal: Option<i32>,
    pub kill_grace_ms: u64,
    /// The process-management interfaces offered to the ranks (PMI-1/PMI-2, PMIx).
    #[serde(default)]
    pub mpi: MpiKind,
    /// Nodes with ranks, in rank order; index = BERTH_NODEID.
    pub nodes: Vec<StepNode>,
    /// The step's job was made for it and ends with it.
    pub interactive: bool,
    /// The first node's agent starts the step from the job's launch order, which carries this
    /// grant (`LaunchSpec::step`); `run`'s `StepLaunch` to that node then attaches to the
    /// running step instead of starting it (docs/protocol/01-client.md, "An interactive step
    /// starts from its launch order").
    #[serde(default)]
    pub attach: bool,
    /// Agents refuse the grant after this (Unix milliseconds); covered by `mac`.
    #[serde(default)]
    pub expires_ms: u64,
    /// MPMD: each program with its ranks (every rank of the step in exactly one), variables,
    /// directory and binding; a rank's application number is its app's index. Empty: every
    /// rank runs `argv` (app 0). Left out of the JSON when empty, so a one-program grant signs
    /// as before; an agent that does not know the field computes another MAC over an MPMD
    /// grant and refuses it rather than run `argv` everywhere.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub apps: Vec<App>,
    /// The step was spawned by a rank of another step (its `StepCreate::spawned_by`); left
    /// out of the JSON when None, so other grants sign as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spawned_by: Option<SpawnParent>,
    /// The controller's HMAC-SHA256 (hex) over the grant with `mac` empty, under the cluster
    /// key (docs/protocol/06-auth.md, "Authentication"): agents start nothing for an unsigned grant.
    #[serde(default)]
    pub mac: String,
}

/// What one rank runs: its program, its variables over the step's, its directory, whether it
/// is bound, its application number and its rank within that application.
#[derive(Debug, Clone, PartialEq)]
pub struct RankProgram<'a> {
    pub argv: std::borrow::Cow<'a, [String]>,
    pub env: &'a [(String, String)],
    pub cwd: &'a str,
    pub bind: bool,
    pub appnum: u32,
    pub app_rank: u32,
}

impl StepGrant {
    /// The application number of every rank (index = rank): its app's index, 0 for all in a
    /// one-program step; Err when the apps do not give every rank exactly one program.
    pub fn rank_apps(&self) -> Result<Vec<u32>, berth_core::step::mpmd::RanksError> {
        berth_core::step::mpmd::rank_apps(&self.apps, self.size)
    }

    /// Whether the ranks of application `appnum` are bound to their CPUs (its own `--binding`,
    /// else the step's).
    pub fn binds(&self, appnum: u32) -> bool {
        self.apps.get(appnum as usize).and_then(|a| a.bind).unwrap_or(self.bind)
    }

    /// What `rank` runs, given its application number (from [`Self::rank_apps`]).
    pub fn program_of(&self, rank: u32, appnum: u32) -> RankProgram<'_> {
        match self.apps.get(appnum as usize) {
            Some(app) => RankProgram {
                argv: if app.expand {
                    std::borrow::Cow::Owned(app.argv_of(rank))
                } else {
                    std::borrow::Cow::Borrowed(&app.argv)
                },
                env: &app.env,
                cwd: app.cwd.as_deref().unwrap_or(&self.cwd),
                bind: self.binds(appnum),
                appnum,
                app_rank: app.offset_of(rank).unwrap_or(0),
            },
            None => RankProgram {
                argv: std::borrow::Cow::Borrowed(&self.argv),
                env: &[],
                cwd: &self.cwd,
                bind: self.bind,
                appnum: 0,
                app_rank: rank,
            },
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepNode {
    pub name: String,
    /// The node agent's address (host:port).
    pub address: String,
    /// Ranks on this node with their PUs (OS indexes of the node's topology).
    pub ranks: Vec<RankPlace>,
    /// The agent process the grant is for (its registration's `instance`): an agent that
    /// restarted since refuses the grant, so the controller may close the steps a restarted
    /// agent does not list (docs/protocol/02-agent.md, "Step ends from agents"). Empty: not checked.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub instance: String,
}

/// How one rank ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankExit {
    pub rank: u32,
    pub node: String,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// Why, when it is not a plain exit: "launch failed: ...", "MPI_Abort", "node lost".
    #[serde(default)]
    pub reason: Option<String>,
}

impl RankExit {
    /// Killed by a signal, a non-zero exit, or lost.
    pub fn abnormal(&self) -> bool {
        self.signal.is_some() || self.exit_code != Some(0)
    }

    pub fn describe(&self) -> String {
        let how = match (self.exit_code, self.signal) {
            (_, Some(s)) => format!("killed by signal {s} ({})", signal_name(s)),
            (Some(c), None) => format!("exited with status {c}"),
            (None, None) => "lost".to_string(),
        };
        match &self.reason {
            Some(r) => format!("rank {} on {} {how}: {r}", self.rank, self.node),
            None => format!("rank {} on {} {how}", self.rank, self.node),
        }
    }
}

/// `run` tells the controller how the step ended (invocation log).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepOutcome {
    /// The worst exit status (what `run` returns).
    pub exit_code: i32,
    /// Abnormal rank endings, first first.
    pub failures: Vec<RankExit>,
    /// Where the launch failed, if it did.
    pub failed_at: Option<String>,
    pub wall_ms: u64,
}

/// A step in the invocation log (`berth acct --steps`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepInfo {
    pub job: JobId,
    pub step: u32,
    pub user: String,
    pub uid: u32,
    pub start_time: f64,
    pub end_time: Option<f64>,
    pub host: String,
    pub pid: u32,
    pub cwd: String,
    pub argv: Vec<String>,
    pub size: u32,
    pub nodes: Vec<String>,
    pub exit_code: Option<i32>,
    /// The first failure, or where the launch failed.
    pub failure: Option<String>,
    pub interactive: bool,
}

/// Bytes of output or input: text when it is UTF-8, raw bytes otherwise.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Chunk {
    Text(String),
    Raw(Vec<u8>),
}

impl Chunk {
    pub fn from_bytes(b: Vec<u8>) -> Chunk {
        match String::from_utf8(b) {
            Ok(s) => Chunk::Text(s),
            Err(e) => Chunk::Raw(e.into_bytes()),
        }
    }

    pub fn as_bytes(&self) -> &[u8] {
        match self {
            Chunk::Text(s) => s.as_bytes(),
            Chunk::Raw(b) => b,
        }
    }
}

/// The most PMIx data of one rank a direct modex carries ([`ModexReply::data`], before hex):
/// Open MPI's per-rank data is a few KiB; a reply beyond this is refused as `too_large`.
pub const MAX_MODEX_BYTES: usize = 1 << 20;

/// A direct modex: node `from` (an index into the grant's nodes) asks the node hosting rank
/// `rank` for that rank's PMIx data (a `PMIx_Get` of a rank whose data no fence brought). It
/// travels the control tree towards that node: down when a child's subtree holds it, up
/// otherwise. docs/protocol/03-control-tree.md, "Direct modex".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModexRequest {
    /// The asking node's request number (unique on that node for the step).
    pub id: u64,
    pub from: u32,
    pub rank: u32,
}

/// Why a direct modex brought no data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(rename_all = "snake_case")]
pub enum ModexFailure {
    /// No node of the step hosts that rank.
    #[error("no rank of that number in the step")]
    NoSuchRank,
    /// The rank's PMIx server has nothing for it (it ended, or its namespace is gone).
    #[error("the rank's node has no data for it")]
    NoData,
    /// The rank's data is larger than MAX_MODEX_BYTES.
    #[error("the rank's data is larger than 1 MiB")]
    TooLarge,
    /// No answer in time (the asking node gives up).
    #[error("no answer in time")]
    Timeout,
    /// A failure this version does not know (an older peer reading a newer one's).
    #[serde(other)]
    #[error("the direct modex failed")]
    Other,
}

/// The answer to a [`ModexRequest`], routed back to node `to` the same way.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModexReply {
    pub id: u64,
    pub to: u32,
    pub rank: u32,
    /// The rank's data, hex (libpmix's blob from `PMIx_server_dmodex_request`), when found.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub data: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<ModexFailure>,
}

/// Down the control tree (from `run` towards the leaves).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum TreeDown {
    /// For rank 0 (only ever sent to the first node).
    Stdin {
        data: Chunk,
    },
    StdinEof,
    Signal {
        signal: i32,
    },
    /// The union of all PMI puts of this barrier epoch.
    BarrierOut {
        kvs: Vec<(String, String)>,
    },
    /// No-kill mode: a rank failed; survivors are told.
    RankFailed {
        exit: RankExit,
    },
    /// No-kill mode: a node of the step was lost as a whole (its connection broke); survivors
    /// are told (PMIx `PMIX_EVENT_NODE_DOWN`). Its ranks follow, each as `RankFailed`.
    NodeLost {
        node: String,
    },
    /// End the step: SIGTERM to every rank, grace, SIGKILL.
    Kill {
        reason: String,
    },
    /// A direct modex on its way to the node hosting the rank.
    ModexRequest(ModexRequest),
    /// A direct modex's answer on its way to the asking node.
    ModexReply(ModexReply),
    /// A spawn's answer on its way to the asking node.
    SpawnReply(SpawnReply),
    /// A publish's, lookup's or connect's answer on its way to the asking node.
    ServiceReply(ServiceReply),
}

/// Up the control tree (towards `run`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum TreeUp {
    /// Every rank of the subtree runs (sent once per subtree, aggregated).
    Started {
        nodes: u32,
        ranks: u32,
    },
    /// A node of the subtree could not start its ranks.
    LaunchFailed {
        node: String,
        reason: String,
    },
    Output {
        rank: u32,
        stream: u8,
        data: Chunk,
    },
    Exited {
        ranks: Vec<RankExit>,
    },
    /// Every rank of the subtree entered the barrier; their puts.
    BarrierIn {
        puts: Vec<(String, String)>,
    },
    Abort {
        rank: u32,
        node: String,
        code: i32,
        message: String,
    },
    /// A connection below broke: the ranks of these nodes are lost.
    SubtreeLost {
        nodes: Vec<String>,
        ranks: Vec<u32>,
        reason: String,
    },
    /// A direct modex on its way to the node hosting the rank (not in this subtree).
    ModexRequest(ModexRequest),
    /// A direct modex's answer on its way to the asking node (not in this subtree).
    ModexReply(ModexReply),
    /// A rank's `PMIx_Spawn`, on its way to `berth run`.
    Spawn(SpawnRequest),
    /// A rank's `PMIx_Publish`, on its way to `berth run`.
    Publish(PublishRequest),
    /// A rank's `PMIx_Lookup`, on its way to `berth run`.
    Lookup(LookupRequest),
    /// A node's `PMIx_Connect`, on its way to `berth run`.
    Connect(ConnectRequest),
    /// Every rank of the subtree ended and every exit was sent.
    Done,
}

/// The task API (seeds/001 TM) on the agent's local socket, and between agents.
/// See docs/protocol/04-task-api.md, "Task API (inside a job)".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum TaskRequest {
    /// Slots and hosts of the job's allocation.
    Info {
        job: JobId,
    },
    /// Start `count` copies of `argv` on node `node` (index in the allocation).
    Spawn {
        job: JobId,
        node: u32,
        argv: Vec<String>,
        env: Vec<(String, String)>,
        cwd: String,
        count: u32,
        /// Where the task's stdout/stderr are appended (relative to `cwd`; `%j` job, `%t` task
        /// id, `%n` node index). Default `berth-task-%j.%t.out` / `.err`.
        #[serde(default)]
        output: Option<String>,
        #[serde(default)]
        error: Option<String>,
    },
    /// Start one task on node `node` attached to this connection, as `ssh HOST CMD` would
    /// (`berth task rsh`, an MPI library's remote launcher): `spawned` comes back, then its
    /// stdout and stderr as `output` frames, then `exited`. `signal` frames on the connection
    /// go to the task's process group; if the connection closes, the task's process group is
    /// killed.
    Exec {
        job: JobId,
        node: u32,
        argv: Vec<String>,
        env: Vec<(String, String)>,
        cwd: String,
    },
    /// On an open `exec` connection: signal the task's process group.
    Signal {
        signal: i32,
    },
    List {
        job: JobId,
    },
    /// Wait until the tasks end (all the job's tasks when `tasks` is empty).
    Wait {
        job: JobId,
        tasks: Vec<u64>,
        timeout_ms: Option<u64>,
    },
    Kill {
        job: JobId,
        tasks: Vec<u64>,
        signal: i32,
    },
    /// Agent to agent (TCP) only: start task `task` of the job on the receiving node. The
    /// connection stays open while the task runs: `started` (or `error`) comes back, then
    /// `exited`; `remote_signal` frames may follow the request; if the connection breaks the
    /// receiving agent kills the task's process group.
    RemoteSpawn {
        job: JobId,
        node: u32,
        task: u64,
        argv: Vec<String>,
        env: Vec<(String, String)>,
        cwd: String,
        /// Paths with `%` patterns already expanded.
        output: String,
        error: String,
        /// Stdout and stderr come back on the connection as `output` frames (before
        /// `exited`) instead of going to `output`/`error` (an `exec` task).
        #[serde(default)]
        attach: bool,
    },
    /// Agent to agent, on an open `remote_spawn` connection: signal the task's process group.
    RemoteSignal {
        signal: i32,
    },
    /// On an `exec` connection (from its caller) and an attached `remote_spawn` one (from the
    /// spawning agent): bytes for the task's standard input, in order.
    Stdin {
        data: Chunk,
    },
    /// The same connections: the task's standard input ends (it reads EOF).
    StdinEof,
    /// Agent to agent: the receiving node's part of the allocation (its `info` entry).
    RemoteInfo {
        job: JobId,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskInfo {
    pub id: u64,
    pub node: String,
    pub node_index: u32,
    pub argv: Vec<String>,
    pub pid: Option<u32>,
    /// "starting", "running", "exited" (see exit_code / signal), "failed" (did not start, or
    /// its node's agent was lost: see reason).
    pub state: String,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub reason: Option<String>,
    /// Wall time from spawn to end (so far, while running).
    #[serde(default)]
    pub wall_ms: Option<u64>,
    /// Where its output and errors go (absolute, on its node).
    #[serde(default)]
    pub stdout: Option<String>,
    #[serde(default)]
    pub stderr: Option<String>,
}

impl TaskInfo {
    /// Ended (exited, killed, or never started).
    pub fn ended(&self) -> bool {
        self.state == "exited" || self.state == "failed"
    }

    /// Ended other than with exit status 0.
    pub fn unsuccessful(&self) -> bool {
        self.state == "failed" || (self.state == "exited" && (self.signal.is_some() || self.exit_code != Some(0)))
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AllocationNode {
    pub index: u32,
    pub name: String,
    pub address: String,
    /// Cores of the job there.
    pub slots: u32,
    pub cpus: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum TaskReply {
    Info {
        job: JobId,
        nodes: Vec<AllocationNode>,
    },
    Spawned {
        tasks: Vec<TaskInfo>,
    },
    Tasks {
        tasks: Vec<TaskInfo>,
    },
    Error {
        message: String,
    },
    /// Agent to agent: the task of a `remote_spawn` runs.
    Started {
        pid: u32,
    },
    /// Output of an attached task (`exec`, `remote_spawn` with `attach`): `stream` 1 is
    /// stdout, 2 stderr.
    Output {
        stream: u8,
        data: Chunk,
    },
    /// The task of a `remote_spawn` or an `exec` ended.
    Exited {
        exit_code: Option<i32>,
        signal: Option<i32>,
        wall_ms: u64,
    },
}

/// Signal names users type (`berth signal 7 USR1`), with or without SIG, or numbers.
pub fn parse_signal(s: &str) -> Option<i32> {
    if let Ok(n) = s.parse::<i32>() {
        return (1..=64).contains(&n).then_some(n);
    }
    let name = s.trim_start_matches("SIG").to_ascii_uppercase();
    SIGNALS.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
}

pub fn signal_name(sig: i32) -> &'static str {
    SIGNALS.iter().find(|(_, v)| *v == sig).map(|(n, _)| *n).unwrap_or("?")
}

/// Linux signal numbers (x86_64, arm64).
const SIGNALS: &[(&str, i32)] = &[
    ("HUP", 1),
    ("INT", 2),
    ("QUIT", 3),
    ("ILL", 4),
    ("TRAP", 5),
    ("ABRT", 6),
    ("BUS", 7),
    ("FPE", 8),
    ("KILL", 9),
    ("USR1", 10),
    ("SEGV", 11),
    ("USR2", 12),
    ("PIPE", 13),
    ("ALRM", 14),
    ("TERM", 15),
    ("CHLD", 17),
    ("CONT", 18),
    ("STOP", 19),
    ("TSTP", 20),
    ("TTIN", 21),
    ("TTOU", 22),
    ("URG", 23),
    ("XCPU", 24),
    ("XFSZ", 25),
    ("VTALRM", 26),
    ("PROF", 27),
    ("WINCH", 28),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_parse_by_name_and_number() {
        assert_eq!(parse_signal("USR1"), Some(10));
        assert_eq!(parse_signal("SIGTERM"), Some(15));
        assert_eq!(parse_signal("winch"), Some(28));
        assert_eq!(parse_signal("9"), Some(9));
        assert_eq!(parse_signal("0"), None);
        assert_eq!(parse_signal("NOPE"), None);
        assert_eq!(signal_name(2), "INT");
    }

    #[test]
    fn chunks_keep_binary_and_text() {
        let t = Chunk::from_bytes(b"hello\n".to_vec());
        assert_eq!(serde_json::to_string(&t).unwrap(), "\"hello\\n\"");
        let r = Chunk::from_bytes(vec![0xff, 0x00]);
        let back: Chunk = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back.as_bytes(), &[0xff, 0x00]);
    }
}
