//! Submission options, from `#BERTH` lines in a batch script and from command-line flags.
//!
//! A directive is spelled exactly like the flag: `#BERTH --cores 4 --mem=2G`. Directives are
//! read from the lines after `#!` up to the first line that is neither blank nor a comment, as
//! Slurm and PBS do; flags given on the command line override them. `#SBATCH` and `#PBS`
//! lines are read too (`foreign`), below `#BERTH` in precedence.

use crate::binding::{BindingMode, BindingStrategy};
use crate::job::{valid_gpu_type, ResourceRequest, MAX_GPUS_PER_JOB, MAX_GPUS_PER_NODE};
use crate::units::{parse_duration_secs, parse_size};
use crate::CoreError;
use serde::{Deserialize, Serialize};

pub mod array;
pub mod depend;
pub mod extra;
mod foreign;
pub use array::{ArrayError, ArraySpec, ArrayTask};
pub use depend::{Begin, BeginError, DepError, DepKind, DepTerm, Dependency};
pub use extra::{Export, MailTypes, SignalSpec};
pub use foreign::{output_patterns, parse_foreign, DirectiveError, Foreign, ForeignError, LineError};

pub const DIRECTIVE_PREFIX: &str = "#BERTH";

/// Every option a submission can carry, each optional so directives and flags can be merged.
/// Options not given are left out of the JSON (stored with every job: an array has many).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubmitOptions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cores: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks_per_node: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus_per_task: Option<u32>,
    /// Memory per node, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem: Option<u64>,
    /// Walltime, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub walltime: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// Memory per CPU, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_per_cpu: Option<u64>,
    /// Count hardware threads (PUs) rather than cores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binding: Option<BindingStrategy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binding_mode: Option<BindingMode>,
    /// Make one sub-cpuset per rank inside the job's cpuset on each node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank_cpusets: Option<bool>,
    /// The process-management interfaces of the job's steps unless `berth run --mpi` says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mpi: Option<crate::step::MpiKind>,
    /// The job may use the nodes' system CPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_cpus: Option<bool>,
    /// Subnode properties the job needs (e.g. `singlecpu`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub properties: Option<Vec<String>>,
    /// The account (project) fair share charges; default: the user's primary group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    /// The advance reservation the job runs in (its users or accounts only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation: Option<String>,
    /// On a node failure: requeue (rerun from the start), or fail. Default: the controller's
    /// `[fault] requeue` setting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requeue: Option<bool>,
    /// Keep running on the surviving nodes when one of the job's other nodes fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_kill: Option<bool>,
    /// The submitter's umask, applied to the job and its output files as sbatch does (the
    /// client sends it; not an option a user writes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub umask: Option<u32>,
    /// Start only once other jobs have started or ended so (`--dependency`, Slurm's syntax).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dependency: Option<Dependency>,
    /// Start no earlier than this (`--begin`); the controller stores it resolved (`Begin::At`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub begin: Option<Begin>,
    /// Submit held (`--hold`, `#SBATCH -H`, `#PBS -h`): it waits for `berth release`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold: Option<bool>,
    /// `--comment`: kept with the job and shown (bounded, printable).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
    /// `--chdir` (`-D`): the job's working directory (the controller makes it absolute from
    /// the submit directory); the submit directory stays `SLURM_SUBMIT_DIR`/`PBS_O_WORKDIR`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chdir: Option<String>,
    /// `--export` (`#PBS -V`/`-v`): what of the submitting environment the job gets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub export: Option<Export>,
    /// `--signal`: a signal sent some seconds before the walltime ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<SignalSpec>,
    /// `--mail-type` (`#PBS -m`): events the controller's notify hook is called for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mail_type: Option<MailTypes>,
    /// `--mail-user` (`#PBS -M`): who is notified (default: the job's user).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mail_user: Option<String>,
    /// `--exclusive`: no other job shares the job's nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclusive: Option<bool>,
    /// `--qos` (Slurm's `-q`): mapped by the controller onto the queue of that name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<String>,
    /// An admin's priority for the job (`berth update --priority`, `scontrol update
    /// Priority=`): it replaces the computed one in the queue's order, as Slurm's does. Set
    /// by admins only (the controller refuses it from anyone else).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
    /// A job array (`--array 0-15%4`): one task per index, each a job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array: Option<ArraySpec>,
    /// This job is a task of an array (set by the controller; not an option a user writes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array_task: Option<ArrayTask>,
    /// This job is an allocation (`berth alloc`, Slurm's `salloc`): queued like a batch job but
    /// with no batch script (set by the controller; not an option a user writes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alloc: Option<AllocKind>,
    /// Slurm's `--open-mode`: `Some(true)` appends to the output files instead of truncating
    /// them (sbatch and `#SBATCH` only; berth's own default truncates, as Slurm's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_append: Option<bool>,
    /// How standard error and standard output share files when the job does not name both:
    /// Slurm's rule (`#SBATCH` lines or `sbatch`), PBS's `-j oe|eo|n`; berth's own default
    /// (none) is two files, `berth-%j.out` and `berth-%j.err` (`foreign::output_patterns`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub join: Option<Join>,
    /// The tasks of a job that holds more CPUs than its tasks use: an `--exclusive` job keeps
    /// the task count it asked for on its whole nodes, as Slurm (set by the controller; not an
    /// option a user writes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks: Option<JobTasks>,
    /// `--gpus`: GPUs of the whole job, spread evenly over its nodes (Slurm's `--gpus`, `-G`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<u32>,
    /// `--gpus-per-node`: GPUs on each node (Slurm's `--gres=gpu:N`, PBS `select=...:ngpus=N`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus_per_node: Option<u32>,
    /// `--gpu-type`: only GPUs of this type (`berth nodes --topology` shows each GPU's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_type: Option<String>,
    /// `--cpus-per-gpu`: the job's CPUs on each node are this many per GPU there (Slurm's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus_per_gpu: Option<u32>,
    /// `--mem-per-gpu`: the job's memory on each node is this many bytes per GPU there
    /// (Slurm's; instead of `--mem` or `--mem-per-cpu`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_per_gpu: Option<u64>,
    /// `--gpus-per-task`: each task's own GPUs; the job gets tasks x N (Slurm's). Its steps'
    /// ranks get theirs by `--gpu-bind` (`BERTH_GPUS_PER_TASK` in the job's environment).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus_per_task: Option<u32>,
    /// `--gpu-bind closest|none|map:I,J,...` (`berth_core::gpu::GpuBind`), kept as written
    /// once checked; the job's steps get it as `BERTH_GPU_BIND`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_bind: Option<String>,
    /// `--gpu-locality strict|prefer` (Slurm's `--gres-flags=enforce-binding|disable-binding`):
    /// whether the job waits for cores next to its GPUs; over `[placement] gpu_locality`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_locality: Option<crate::gpu::GpuLocality>,
    /// `--gpus-per-socket N` (Slurm's): N GPUs on each socket the job uses on a node, with
    /// `--sockets-per-node` sockets a node; the job's GPUs on a node are their product, each
    /// socket's N attached to that socket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus_per_socket: Option<u32>,
    /// `--sockets-per-node S` (Slurm's): the sockets (packages) of each node the job uses;
    /// read with `--gpus-per-socket` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sockets_per_node: Option<u32>,
    /// `--gres NAME:COUNT[,...]`: generic resources (other than GPUs: `gpu` items set
    /// `gpus_per_node` and `gpu_type`) the job needs on each of its nodes (Slurm's `--gres`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gres: Option<crate::gres::Counts>,
    /// `--licenses NAME[:COUNT][,...]` (Slurm's `-L`): cluster-wide licenses the job holds
    /// while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub licenses: Option<crate::gres::Counts>,
}

/// How a job's standard error and output share files (`SubmitOptions::join`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Join {
    /// Slurm's: standard error goes to the output file unless `--error` names one; the output
    /// defaults to `slurm-%j.out` (`slurm-%A_%a.out` for an array).
    #[serde(rename = "slurm")]
    Slurm,
    /// PBS `-j oe`: standard error goes to the output file (an error path is not used).
    #[serde(rename = "oe")]
    Output,
    /// PBS `-j eo`: standard output goes to the error file.
    #[serde(rename = "eo")]
    Error,
    /// PBS `-j n`: two files, as berth's own default.
    #[serde(rename = "n")]
    Neither,
}

/// The tasks of a job whose CPUs its tasks do not fill (`SubmitOptions::tasks`): an
/// `--exclusive` job's, or Slurm's `-N 2 -n 5` (5 tasks, laid out 3 + 2 on nodes of 3 cores).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobTasks {
    /// The job's tasks (`SLURM_NTASKS`).
    pub total: u32,
    /// Tasks on each node, when the job gave them (`--tasks-per-node`, `-N` with `-n`); else
    /// they fill the nodes in order, each task `--cpus-per-task` CPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_node: Option<u32>,
}

impl JobTasks {
    /// Whether these are a task count that leaves the last of `nodes` nodes of `per_node`
    /// tasks each partly empty (`-N 2 -n 5`: 3 + 2), the only uneven count a job may give;
    /// anything else is not kept (the tasks follow from the cores).
    pub fn fill_nodes_unevenly(&self, nodes: u32, per_node: u32) -> bool {
        let full = u64::from(nodes) * u64::from(per_node);
        let total = u64::from(self.total);
        self.per_node.is_none() && nodes > 1 && total < full && total > full - u64::from(per_node)
    }
}

/// How an allocation (`berth alloc`) ends besides `cancel` and its walltime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AllocKind {
    /// Held by its client's connection: it ends when the client's command exits or the
    /// connection closes (so also with a controller restart).
    Held,
    /// `--no-shell`: kept until its walltime or `berth cancel`.
    NoShell,
}

/// The option names accepted as flags and directives (without the leading `--`).
pub const OPTION_NAMES: [&str; 47] = [
    "cores",
    "nodes",
    "tasks-per-node",
    "cpus-per-task",
    "mem",
    "mem-per-cpu",
    "walltime",
    "name",
    "output",
    "error",
    "queue",
    "threads",
    "binding",
    "binding-mode",
    "rank-cpusets",
    "mpi",
    "system-cpus",
    "property",
    "account",
    "reservation",
    "requeue",
    "no-requeue",
    "no-kill",
    "dependency",
    "begin",
    "hold",
    "comment",
    "chdir",
    "export",
    "signal",
    "mail-type",
    "mail-user",
    "exclusive",
    "qos",
    "array",
    "gpus",
    "gpus-per-node",
    "gpu-type",
    "cpus-per-gpu",
    "mem-per-gpu",
    "gpus-per-task",
    "gpu-bind",
    "gpu-locality",
    "gpus-per-socket",
    "sockets-per-node",
    "gres",
    "licenses",
];

/// Options that take no value (`--threads`); `--threads=no` turns one off.
pub const SWITCH_NAMES: [&str; 8] =
    ["threads", "rank-cpusets", "system-cpus", "requeue", "no-requeue", "no-kill", "hold", "exclusive"];

/// Why [`SubmitOptions::set`] refuses an option's value (or its name). `name` is the option's
/// name without `--`, `value` the value as given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionError {
    #[error("--{name} needs a positive whole number, got {value:?}")]
    NotPositive { name: String, value: String },
    #[error("--{name} needs a value")]
    Empty { name: String },
    #[error("--walltime must be at least one second")]
    ZeroWalltime,
    #[error("--account needs a name of letters, digits, _ - and ., got {0:?}")]
    Account(String),
    /// `--reservation`, `--qos`: 1 to 64 letters, digits, `_`, `-`, `.`.
    #[error("--{name} needs a name of letters, digits, _ - and . (at most 64), got {value:?}")]
    Name { name: &'static str, value: String },
    #[error("--{name} takes no value (or yes/no), got {value:?}")]
    Switch { name: String, value: String },
    #[error("--mpi takes {kinds}, got {0:?}", kinds = crate::step::MPI_KINDS)]
    Mpi(String),
    #[error("--cpus-per-gpu needs a count of CPUs per GPU from 1 to 4096, got {0:?}")]
    CpusPerGpu(String),
    #[error("--{name} needs a whole number from 1 to {max}, got {value:?}")]
    GpuCount { name: String, value: String, max: u32 },
    #[error("--{name} needs a type of letters, digits, _ - and . (at most 64), got {value:?}")]
    GpuType { name: String, value: String },
    #[error("--property needs comma-separated names of letters, digits, _ and -, got {0:?}")]
    Property(String),
    #[error("unknown option --{0}; known options are --{known}", known = OPTION_NAMES.join(", --"))]
    Unknown(String),
    /// `--mem`, `--mem-per-cpu`, `--walltime`: the unit parsers' own message.
    #[error(transparent)]
    Unit(#[from] CoreError),
    #[error("--mem-per-gpu: {0}")]
    MemPerGpu(CoreError),
    #[error("--dependency: {0}")]
    Dependency(#[from] DepError),
    #[error(transparent)]
    Begin(#[from] BeginError),
    #[error(transparent)]
    Array(#[from] ArrayError),
    #[error(transparent)]
    Value(#[from] extra::OptionValueError),
    #[error(transparent)]
    GpuBind(#[from] crate::gpu::GpuBindError),
    #[error("--gpu-locality: {0}")]
    GpuLocality(#[from] crate::gpu::UnknownGpuLocality),
    #[error("--binding: {0}")]
    Binding(crate::binding::BindingParseError),
    #[error(transparent)]
    Gres(#[from] crate::gres::GresError),
    /// Several `gpu` items in one `--gres` (`gpu:a100:1,gpu:v100:2`): a job's GPUs are of one
    /// type (docs/gpus.md, "Several GPU types").
    #[error("--gres {items}: GPUs of several types (or gpu twice) in one job are not supported: a job's GPUs are of one type; give one gpu item (gpu:N takes GPUs of any type), or submit a job per type")]
    GpuTypes { items: String },
    #[error("--binding-mode: {0}")]
    BindingMode(crate::binding::BindingParseError),
}

/// For the directive parsers and callers that gather errors as text.
impl From<OptionError> for String {
    fn from(e: OptionError) -> String {
        e.to_string()
    }
}

impl SubmitOptions {
    /// Set one option from its name (`cores`, `mem`, ...) and textual value.
    pub fn set(&mut self, name: &str, value: &str) -> Result<(), OptionError> {
        let count = |v: &str| -> Result<u32, OptionError> {
            v.parse::<u32>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| OptionError::NotPositive { name: name.to_string(), value: v.to_string() })
        };
        let text = |v: &str| -> Result<String, OptionError> {
            if v.is_empty() {
                Err(OptionError::Empty { name: name.to_string() })
            } else {
                Ok(v.to_string())
            }
        };
        match name {
            "cores" => self.cores = Some(count(value)?),
            "nodes" => self.nodes = Some(count(value)?),
            "tasks-per-node" => self.tasks_per_node = Some(count(value)?),
            "cpus-per-task" => self.cpus_per_task = Some(count(value)?),
            "mem" => self.mem = Some(parse_size(value)?),
            "walltime" => {
                let secs = parse_duration_secs(value)?;
                if secs == 0 {
                    return Err(OptionError::ZeroWalltime);
                }
                self.walltime = Some(secs)
            }
            "name" => self.name = Some(text(value)?),
            "output" => self.output = Some(text(value)?),
            "error" => self.error = Some(text(value)?),
            "queue" => self.queue = Some(text(value)?),
            "account" => {
                let a = text(value)?;
                if !a.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c)) {
                    return Err(OptionError::Account(value.to_string()));
                }
                self.account = Some(a)
            }
            "reservation" => {
                let r = text(value)?;
                if !valid_name(&r) {
                    return Err(OptionError::Name { name: "reservation", value: value.to_string() });
                }
                self.reservation = Some(r)
            }
            "mem-per-cpu" => self.mem_per_cpu = Some(parse_size(value)?),
            "threads" => self.threads = Some(switch(name, value)?),
            "rank-cpusets" => self.rank_cpusets = Some(switch(name, value)?),
            "mpi" => {
                let v = text(value)?;
                self.mpi = Some(crate::step::MpiKind::parse(&v).ok_or_else(|| OptionError::Mpi(value.to_string()))?)
            }
            "system-cpus" => self.system_cpus = Some(switch(name, value)?),
            "requeue" => self.requeue = Some(switch(name, value)?),
            "no-requeue" => self.requeue = Some(!switch(name, value)?),
            "no-kill" => self.no_kill = Some(switch(name, value)?),
            "hold" => self.hold = Some(switch(name, value)?),
            "dependency" => self.dependency = Some(Dependency::parse_slurm(value)?),
            "begin" => self.begin = Some(Begin::parse(value)?),
            "comment" => self.comment = Some(extra::parse_comment(value)?),
            "chdir" => self.chdir = Some(extra::parse_chdir(value)?),
            "export" => self.export = Some(Export::parse_slurm(value)?),
            "signal" => self.signal = Some(SignalSpec::parse(value)?),
            "mail-type" => self.mail_type = Some(MailTypes::parse_slurm(value)?),
            "mail-user" => self.mail_user = Some(extra::parse_mail_user(value)?),
            "exclusive" => self.exclusive = Some(switch(name, value)?),
            "qos" => {
                let q = text(value)?;
                if !valid_name(&q) {
                    return Err(OptionError::Name { name: "qos", value: value.to_string() });
                }
                self.qos = Some(q)
            }
            "array" => self.array = Some(ArraySpec::parse_slurm(value)?),
            "gpus" => self.gpus = Some(gpu_count(name, value, MAX_GPUS_PER_JOB)?),
            "gpus-per-node" => self.gpus_per_node = Some(gpu_count(name, value, MAX_GPUS_PER_NODE)?),
            "gpu-type" => self.gpu_type = Some(gpu_type(name, value)?),
            "cpus-per-gpu" => self.cpus_per_gpu = Some(cpus_per_gpu(value)?),
            "gpus-per-task" => self.gpus_per_task = Some(gpu_count(name, value, MAX_GPUS_PER_NODE)?),
            "gpu-bind" => self.gpu_bind = Some(crate::gpu::GpuBind::parse(value)?.to_string()),
            "gpu-locality" => self.gpu_locality = Some(crate::gpu::GpuLocality::parse(value)?),
            "gpus-per-socket" => self.gpus_per_socket = Some(gpu_count(name, value, MAX_GPUS_PER_NODE)?),
            "sockets-per-node" => {
                self.sockets_per_node = Some(gpu_count(name, value, crate::job::MAX_SOCKETS_PER_NODE)?)
            }
            "gres" => self.set_gres(value)?,
            "licenses" => self.licenses = Some(crate::gres::parse_list("--licenses", value)?),
            "mem-per-gpu" => self.mem_per_gpu = Some(parse_size(value).map_err(OptionError::MemPerGpu)?),
            "binding" => self.binding = Some(value.parse().map_err(OptionError::Binding)?),
            "binding-mode" => self.binding_mode = Some(value.parse().map_err(OptionError::BindingMode)?),
            "property" => {
                let props: Vec<String> =
                    value.split(',').map(str::trim).filter(|p| !p.is_empty()).map(String::from).collect();
                if props.is_empty()
                    || props.iter().any(|p| !p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'))
                {
                    return Err(OptionError::Property(value.to_string()));
                }
                self.properties = Some(props);
            }
            _ => return Err(OptionError::Unknown(name.to_string())),
        }
        Ok(())
    }

    /// `--gres NAME[:TYPE]:COUNT[,...]`: `gpu` items are GPUs on each node (`--gpus-per-node`,
    /// `--gpu-type`), the others generic resources: `nvme:fast:10` of type `fast`, `nvme:10`
    /// of any type (crate::gres::take).
    fn set_gres(&mut self, value: &str) -> Result<(), OptionError> {
        let what = "--gres";
        let mut gres = crate::gres::Counts::new();
        if value.split(',').all(|i| i.trim().is_empty()) {
            return Err(OptionError::Empty { name: "gres".into() });
        }
        let gpu_items: Vec<&str> = value
            .split(',')
            .map(str::trim)
            .filter(|i| crate::gres::split_item(what, i).is_ok_and(|(name, _, _)| name == "gpu"))
            .collect();
        if gpu_items.len() > 1 {
            return Err(OptionError::GpuTypes { items: gpu_items.join(",").escape_debug().to_string() });
        }
        for item in value.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (name, kind, count) = crate::gres::split_item(what, item)?;
            if name == "gpu" {
                self.gpus_per_node = Some(gpu_count("gres", &count.to_string(), MAX_GPUS_PER_NODE)?);
                if let Some(k) = kind {
                    self.gpu_type = Some(gpu_type("gres", k)?);
                }
            } else {
                if kind.is_some_and(|k| !crate::gres::valid_name(k)) {
                    return Err(
                        crate::gres::GresError::Name { what: format!("{what} (type)"), name: item.into() }.into()
                    );
                }
                crate::gres::insert(what, &mut gres, &crate::gres::key(name, kind), count)?;
            }
        }
        if !gres.is_empty() {
            self.gres = Some(gres);
        }
        Ok(())
    }

    /// These options with every option set in `over` replacing ours.
    pub fn overlay(self, over: SubmitOptions) -> SubmitOptions {
        SubmitOptions {
            cores: over.cores.or(self.cores),
            nodes: over.nodes.or(self.nodes),
            tasks_per_node: over.tasks_per_node.or(self.tasks_per_node),
            cpus_per_task: over.cpus_per_task.or(self.cpus_per_task),
            mem: over.mem.or(self.mem),
            walltime: over.walltime.or(self.walltime),
            name: over.name.or(self.name),
            output: over.output.or(self.output),
            error: over.error.or(self.error),
            queue: over.queue.or(self.queue),
            mem_per_cpu: over.mem_per_cpu.or(self.mem_per_cpu),
            threads: over.threads.or(self.threads),
            binding: over.binding.or(self.binding),
            binding_mode: over.binding_mode.or(self.binding_mode),
            rank_cpusets: over.rank_cpusets.or(self.rank_cpusets),
            mpi: over.mpi.or(self.mpi),
            system_cpus: over.system_cpus.or(self.system_cpus),
            properties: over.properties.or(self.properties),
            account: over.account.or(self.account),
            reservation: over.reservation.or(self.reservation),
            umask: over.umask.or(self.umask),
            requeue: over.requeue.or(self.requeue),
            no_kill: over.no_kill.or(self.no_kill),
            dependency: over.dependency.or(self.dependency),
            begin: over.begin.or(self.begin),
            hold: over.hold.or(self.hold),
            comment: over.comment.or(self.comment),
            chdir: over.chdir.or(self.chdir),
            export: over.export.or(self.export),
            signal: over.signal.or(self.signal),
            mail_type: over.mail_type.or(self.mail_type),
            mail_user: over.mail_user.or(self.mail_user),
            exclusive: over.exclusive.or(self.exclusive),
            qos: over.qos.or(self.qos),
            priority: over.priority.or(self.priority),
            array: over.array.or(self.array),
            array_task: over.array_task.or(self.array_task),
            alloc: over.alloc.or(self.alloc),
            open_append: over.open_append.or(self.open_append),
            join: over.join.or(self.join),
            tasks: over.tasks.or(self.tasks),
            gpus: over.gpus.or(self.gpus),
            gpus_per_node: over.gpus_per_node.or(self.gpus_per_node),
            gpu_type: over.gpu_type.or(self.gpu_type),
            cpus_per_gpu: over.cpus_per_gpu.or(self.cpus_per_gpu),
            mem_per_gpu: over.mem_per_gpu.or(self.mem_per_gpu),
            gpus_per_task: over.gpus_per_task.or(self.gpus_per_task),
            gpu_bind: over.gpu_bind.or(self.gpu_bind),
            gpu_locality: over.gpu_locality.or(self.gpu_locality),
            gpus_per_socket: over.gpus_per_socket.or(self.gpus_per_socket),
            sockets_per_node: over.sockets_per_node.or(self.sockets_per_node),
            gres: over.gres.or(self.gres),
            licenses: over.licenses.or(self.licenses),
        }
    }

    pub fn request(&self) -> ResourceRequest {
        ResourceRequest {
            nodes: self.nodes,
            cores: self.cores,
            tasks_per_node: self.tasks_per_node,
            cpus_per_task: self.cpus_per_task,
            mem_per_node: self.mem,
            mem_per_cpu: self.mem_per_cpu,
            threads: self.threads.unwrap_or(false),
            gpus: self.gpus.or_else(|| self.gpus_from_tasks(false)),
            gpus_per_node: self.gpus_per_node.or_else(|| self.gpus_from_tasks(true)),
            gpu_type: self.gpu_type.clone(),
            cpus_per_gpu: self.cpus_per_gpu,
            mem_per_gpu: self.mem_per_gpu,
            gpus_per_socket: self.gpus_per_socket,
            sockets_per_node: self.sockets_per_node,
            gres: self.gres.clone().unwrap_or_default(),
            licenses: self.licenses.clone().unwrap_or_default(),
        }
    }
}

impl SubmitOptions {
    /// The GPUs `--gpus-per-task` asks for when neither `--gpus` nor `--gpus-per-node` says:
    /// with `--tasks-per-node` that many a node (`per_node`), else the job's tasks (its cores
    /// over `--cpus-per-task`) times N in all.
    fn gpus_from_tasks(&self, per_node: bool) -> Option<u32> {
        let g = self.gpus_per_task?;
        if self.gpus.is_some() || self.gpus_per_node.is_some() || self.gpus_per_socket.is_some() {
            return None;
        }
        match (self.tasks_per_node, per_node) {
            (Some(k), true) => k.checked_mul(g),
            (None, false) => (self.cores.unwrap_or(1) / self.cpus_per_task.unwrap_or(1).max(1)).max(1).checked_mul(g),
            _ => None,
        }
    }
}

/// `--cpus-per-gpu`: 1 to 4096 CPUs per GPU.
fn cpus_per_gpu(value: &str) -> Result<u32, OptionError> {
    match value.trim().parse::<u32>() {
        Ok(n) if (1..=4096).contains(&n) => Ok(n),
        _ => Err(OptionError::CpusPerGpu(value.to_string())),
    }
}

/// A GPU count from 1 to `max`, for `--NAME`.
pub(crate) fn gpu_count(name: &str, value: &str, max: u32) -> Result<u32, OptionError> {
    value.trim().parse::<u32>().ok().filter(|n| (1..=max).contains(n)).ok_or_else(|| OptionError::GpuCount {
        name: name.to_string(),
        value: value.to_string(),
        max,
    })
}

/// A GPU type name (`a100`, `v100`, `a100-sxm4-80gb`), for `--NAME`; kept in lower case, as
/// `Gpu::type_name` gives types.
pub(crate) fn gpu_type(name: &str, value: &str) -> Result<String, OptionError> {
    let t = value.trim();
    if !valid_gpu_type(t) {
        return Err(OptionError::GpuType { name: name.to_string(), value: value.to_string() });
    }
    Ok(t.to_ascii_lowercase())
}

/// An output or error path with its patterns expanded, as sbatch does: `%j` the job id, `%x`
/// the job name (a `/` in it becomes `_`), `%u` the user, `%%` a `%`. Anything else after a
/// `%` is kept as written.
pub fn expand_output(pattern: &str, id: u64, name: &str, user: &str) -> String {
    expand_output_in(pattern, id, name, user, None)
}

/// `expand_output` for a job that may be a task of an array: `%A` the array's id, `%a` the
/// task's index (for a job of no array, as Slurm: its id, and 4294967294).
pub fn expand_output_in(pattern: &str, id: u64, name: &str, user: &str, array: Option<&ArrayTask>) -> String {
    expand_percent(pattern, |c| match c {
        'A' => Some(array.map_or(id, |t| t.job).to_string()),
        'a' => Some(array.map_or(u64::from(u32::MAX - 1), |t| u64::from(t.index)).to_string()),
        // `%J` is jobid.stepid; the batch script's step is named by the job id alone.
        'j' | 'J' => Some(id.to_string()),
        'x' => Some(name.replace('/', "_")),
        'u' => Some(user.to_string()),
        _ => None,
    })
}

/// `pattern` with each `%c` replaced by `value(c)` and `%%` by `%`; a `%c` without a value
/// (and a trailing `%`) is kept as written. Shared by job outputs and the agent's task outputs.
pub fn expand_percent(pattern: &str, value: impl Fn(char) -> Option<String>) -> String {
    let mut out = String::with_capacity(pattern.len() + 8);
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('%') => out.push('%'),
            Some(other) => match value(other) {
                Some(v) => out.push_str(&v),
                None => {
                    out.push('%');
                    out.push(other);
                }
            },
            None => out.push('%'),
        }
    }
    out
}

/// Whether `name` may name an account or a reservation: 1 to 64 letters, digits, `_`, `-`, `.`.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 64 && name.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
}

/// A switch's value: none (given as `--threads`), yes/true/1 or no/false/0.
fn switch(name: &str, value: &str) -> Result<bool, OptionError> {
    match value {
        "" | "yes" | "true" | "1" => Ok(true),
        "no" | "false" | "0" => Ok(false),
        _ => Err(OptionError::Switch { name: name.to_string(), value: value.to_string() }),
    }
}

/// Read the `#BERTH` directives of a batch script.
pub fn parse_script(script: &str) -> Result<SubmitOptions, CoreError> {
    let err = |line: usize, message: String| CoreError::Directive { line, message };
    if script.contains('\0') {
        return Err(err(1, "the script contains NUL bytes; is it a binary file? submit a text script".into()));
    }
    let mut lines = script.lines().enumerate();
    match lines.next() {
        Some((_, first)) if first.starts_with("#!") => {}
        _ => return Err(err(1, "a batch script must start with an interpreter line such as #!/bin/sh".into())),
    }
    let mut opts = SubmitOptions::default();
    for (index, raw) in lines {
        let line_no = index + 1;
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        if !line.starts_with('#') {
            break;
        }
        let Some(rest) = line.strip_prefix(DIRECTIVE_PREFIX) else { continue };
        if !rest.is_empty() && !rest.starts_with(char::is_whitespace) {
            return Err(err(
                line_no,
                format!("{line:?} is not a directive; write `{DIRECTIVE_PREFIX} --option value`"),
            ));
        }
        let tokens = tokenize(rest).map_err(|m| err(line_no, m.to_string()))?;
        let mut i = 0;
        while i < tokens.len() {
            let tok = &tokens[i];
            let Some(flag) = tok.strip_prefix("--") else {
                return Err(err(line_no, format!("expected an option like --cores, found {tok:?}")));
            };
            let (name, value) = match flag.split_once('=') {
                Some((n, v)) => (n.to_string(), v.to_string()),
                None if SWITCH_NAMES.contains(&flag) => (flag.to_string(), String::new()),
                None => {
                    i += 1;
                    let v = tokens.get(i).ok_or_else(|| err(line_no, format!("--{flag} needs a value")))?;
                    (flag.to_string(), v.clone())
                }
            };
            opts.set(&name, &value).map_err(|m| err(line_no, m.to_string()))?;
            i += 1;
        }
    }
    Ok(opts)
}

/// Every directive of a script: `#BERTH` over `#SBATCH`/`#PBS` (docs/compat.md). A foreign
/// directive berth does not support is an error naming its line, unless `ignore_unsupported`:
/// then it is one of the returned warnings ("line N: ...").
pub fn parse_script_with(script: &str, ignore_unsupported: bool) -> Result<(SubmitOptions, Vec<String>), CoreError> {
    let ours = parse_script(script)?;
    let foreign = parse_foreign(script).map_err(|e| CoreError::Directive { line: e.line, message: e.to_string() })?;
    if !ignore_unsupported {
        if let Some((line, what)) = foreign.unsupported.first() {
            return Err(CoreError::Directive {
                line: *line,
                message: format!("{what}; remove it, or submit with --ignore-unsupported to go on without it"),
            });
        }
    }
    let warnings = foreign.unsupported.iter().map(|(line, what)| format!("line {line}: {what}: ignored")).collect();
    Ok((foreign.options.overlay(ours), warnings))
}

/// Split on whitespace, honouring double quotes (`--name "my job"`).
/// A directive line with a `"` not closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("unterminated double quote")]
pub struct UnterminatedQuote;

fn tokenize(s: &str) -> Result<Vec<String>, UnterminatedQuote> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_quotes = false;
    let mut has_token = false;
    for c in s.chars() {
        match c {
            '"' => {
                in_quotes = !in_quotes;
                has_token = true;
            }
            c if c.is_whitespace() && !in_quotes => {
                if has_token {
                    out.push(std::mem::take(&mut cur));
                    has_token = false;
                }
            }
            c => {
                cur.push(c);
                has_token = true;
            }
        }
    }
    if in_quotes {
        return Err(UnterminatedQuote);
    }
    if has_token {
        out.push(cur);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn array_patterns_expand() {
        let t = array::tasks(40, &[1, 2], None)[1];
        assert_eq!(expand_output_in("%A_%a-%j.out", 41, "n", "u", Some(&t)), "40_2-41.out");
        assert_eq!(expand_output_in("%A_%a.out", 7, "n", "u", None), "7_4294967294.out");
        assert_eq!(expand_output_in("%%A%%a", 7, "n", "u", Some(&t)), "%A%a");
    }

    #[test]
    fn output_patterns_expand_as_sbatch_does() {
        assert_eq!(expand_output("/o/%x-%j.%u.out", 42, "my/job", "ann"), "/o/my_job-42.ann.out");
        assert_eq!(expand_output("100%%-%j%", 7, "n", "u"), "100%-7%");
        assert_eq!(expand_output("%A_%a", 7, "n", "u"), "7_4294967294", "as Slurm, for a job of no array");
    }

    #[test]
    fn reads_directives_until_first_command() {
        let script = "#!/bin/sh\n#BERTH --cores 4 --mem=2G\n# a comment\n\n#BERTH --name \"my job\"\n#BERTH --walltime 00:10:00\necho hi\n#BERTH --cores 99\n";
        let o = parse_script(script).unwrap();
        assert_eq!(o.cores, Some(4));
        assert_eq!(o.mem, Some(2 << 30));
        assert_eq!(o.name.as_deref(), Some("my job"));
        assert_eq!(o.walltime, Some(600));
    }

    #[test]
    fn unknown_directive_names_the_line() {
        let e = parse_script("#!/bin/sh\n#BERTH --cores 2\n#BERTH --colour blue\n").unwrap_err();
        assert_eq!(e.to_string().split(':').next(), Some("line 3"));
        assert!(e.to_string().contains("unknown option --colour"), "{e}");
    }

    #[test]
    fn malformed_scripts() {
        assert!(parse_script("echo no shebang\n").unwrap_err().to_string().contains("#!/bin/sh"));
        assert!(parse_script("").is_err());
        assert!(parse_script("#!/bin/sh\n#BERTH --cores\n").unwrap_err().to_string().contains("needs a value"));
        assert!(parse_script("#!/bin/sh\n#BERTH --cores zero\n").is_err());
        assert!(parse_script("#!/bin/sh\n#BERTHX --cores 1\n").is_err());
        assert!(parse_script("#!/bin/sh\n#BERTH cores 1\n").is_err());
        assert!(parse_script("#!/bin/sh\n#BERTH --name \"open\n").is_err());
        assert!(parse_script("#!/bin/sh\n#BERTH --walltime 0\n").is_err());
        assert!(parse_script("#!/bin/sh\0\n").is_err());
    }

    #[test]
    fn reservation_directive() {
        let o = parse_script("#!/bin/sh\n#BERTH --reservation course-1 --cores 2\n").unwrap();
        assert_eq!(o.reservation.as_deref(), Some("course-1"));
        assert!(parse_script("#!/bin/sh\n#BERTH --reservation \"a b\"\n").is_err());
        let mut flags = SubmitOptions::default();
        flags.set("reservation", "other").unwrap();
        assert_eq!(o.overlay(flags).reservation.as_deref(), Some("other"));
        // Options written before the field existed still read.
        let old: SubmitOptions = serde_json::from_str(r#"{"cores":2,"nodes":null,"tasks_per_node":null,"cpus_per_task":null,"mem":null,"walltime":null,"name":null,"output":null,"error":null,"queue":null}"#).unwrap();
        assert_eq!(old.reservation, None);
    }

    #[test]
    fn gpu_directives() {
        let o = parse_script("#!/bin/sh\n#BERTH --gpus 4 --gpu-type A100-SXM4\n#BERTH --gpus-per-node=2\n").unwrap();
        assert_eq!((o.gpus, o.gpus_per_node, o.gpu_type.as_deref()), (Some(4), Some(2), Some("a100-sxm4")));
        let r = o.request();
        assert_eq!((r.gpus, r.gpus_per_node, r.gpu_type.as_deref()), (Some(4), Some(2), Some("a100-sxm4")));
        let o = parse_script("#!/bin/sh\n#BERTH --cores 4 --gpus-per-task 1 --gpu-bind map_gpu:1,0\n").unwrap();
        assert_eq!((o.gpus_per_task, o.gpu_bind.as_deref()), (Some(1), Some("map:1,0")));
        assert_eq!((o.request().gpus, o.request().gpus_per_node), (Some(4), None), "4 tasks x 1");
        let o = parse_script("#!/bin/sh\n#BERTH --nodes 2 --tasks-per-node 2 --gpus-per-task 2\n").unwrap();
        assert_eq!((o.request().gpus, o.request().gpus_per_node), (None, Some(4)));
        let o = parse_script("#!/bin/sh\n#BERTH --gpus 1 --gpus-per-task 2\n").unwrap();
        assert_eq!((o.request().gpus, o.request().gpus_per_node), (Some(1), None), "an explicit count wins");
        let o = parse_script("#!/bin/sh\n#BERTH --gpus 2 --cpus-per-gpu 3 --mem-per-gpu 2G\n").unwrap();
        assert_eq!((o.cpus_per_gpu, o.mem_per_gpu), (Some(3), Some(2 << 30)));
        for bad in ["--gpu-bind single:0", "--gpus-per-task 0", "--cpus-per-gpu 0", "--mem-per-gpu x"] {
            assert!(parse_script(&format!("#!/bin/sh\n#BERTH {bad}\n")).is_err(), "{bad}");
        }
        for bad in ["--gpus 0", "--gpus 65537", "--gpus-per-node 257", "--gpus-per-node x", "--gpu-type \"a b\""] {
            assert!(parse_script(&format!("#!/bin/sh\n#BERTH {bad}\n")).is_err(), "{bad}");
        }
        // Options without GPUs serialize as before: no GPU keys.
        let plain = parse_script("#!/bin/sh\n#BERTH --cores 2\n").unwrap();
        assert_eq!(serde_json::to_string(&plain).unwrap(), r#"{"cores":2}"#);
        assert!(!serde_json::to_string(&plain.request()).unwrap().contains("gpu"));
    }

    #[test]
    fn flags_override_directives() {
        let from_script = parse_script("#!/bin/sh\n#BERTH --cores 4 --name a\n").unwrap();
        let mut flags = SubmitOptions::default();
        flags.set("cores", "2").unwrap();
        let merged = from_script.overlay(flags);
        assert_eq!(merged.cores, Some(2));
        assert_eq!(merged.name.as_deref(), Some("a"));
    }

    proptest::proptest! {
        #[test]
        fn never_panics(s in ".{0,200}") {
            let _ = parse_script(&s);
            let _ = parse_script(&format!("#!/bin/sh\n#BERTH {s}\n"));
        }
    }
}
