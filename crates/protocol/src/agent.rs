//! Messages between node agents and the controller.
//!
//! An agent connects to the controller, registers, and keeps the connection: heartbeats and
//! job events go up, launches and kills come down.

use crate::error::Refusal;
use crate::user::UserIdentity;
use berth_core::binding::BindingMode;
use berth_core::job::{JobOutcome, NodeAllocation};
use berth_core::topology::Topology;
use berth_core::JobId;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum AgentMessage {
    Register(Box<Registration>),
    Heartbeat {
        running: Vec<JobId>,
        /// Numbers the heartbeats of a session; a controller granting a lease answers each
        /// with `renew` carrying it (docs/protocol/02-agent.md, "Fencing").
        #[serde(default)]
        seq: u64,
        /// Steps whose control tree is rooted here and whose end the controller has not
        /// acknowledged (running, or ended and reported): the controller closes an open step
        /// rooted here that is not listed, once its grant can no longer be used. None: an
        /// agent that does not say.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        steps: Option<Vec<StepRef>>,
    },
    JobStarted {
        id: JobId,
        pid: u32,
        /// The cgroups the agent made for the job on this node and what their cpuset files
        /// hold (host CPUs and memory nodes), so `berth show` reports what the kernel enforces.
        #[serde(default)]
        cgroups: Vec<CgroupReport>,
    },
    /// Resent until acknowledged, so a controller restart loses no ending.
    JobEnded {
        id: JobId,
        outcome: JobOutcome,
    },
    /// Every rank of a step has ended, as the agent at the root of its control tree saw it:
    /// the controller closes the step if `berth run` did not (it died, or its report was lost
    /// to a controller restart). Resent until `step_end_ack`; sent only to a controller that
    /// said `step_ends` when it registered the agent.
    StepEnded {
        job: JobId,
        step: u32,
        /// The worst exit status (a signal as 128 + its number), as `run` would return.
        exit_code: i32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        failure: Option<String>,
    },
    /// Answer to `suspend`: the job's cgroup here is frozen (`error` None), or why not.
    Suspended {
        id: JobId,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// Answer to `resume`: the job runs again here (`error` None), or why it stays frozen.
    Resumed {
        id: JobId,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        /// After a move to other CPUs: the job's cgroups as the kernel now holds them.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        cgroups: Vec<CgroupReport>,
    },
    /// The agent refused something it was asked on its own port (a forged, replayed or
    /// expired step grant, a launch on CPUs the job does not hold here, an unsigned
    /// agent-to-agent request): the controller records it in its event log.
    Refused {
        what: Refusal,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        job: Option<JobId>,
        detail: String,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Registration {
    pub name: String,
    pub hostname: String,
    /// Where the agent listens (host:port).
    pub address: String,
    /// Random per agent process: tells the controller whether the agent restarted.
    pub instance: String,
    pub version: String,
    pub topology: Topology,
    /// Host CPUs (kernel list) the node's PUs are mapped onto.
    pub real_cpus: String,
    /// Jobs the agent is running now.
    pub running: Vec<JobId>,
    /// Jobs that ended but whose end the controller has not acknowledged yet; their
    /// `JobEnded` messages follow the registration.
    #[serde(default)]
    pub ended: Vec<JobId>,
    /// The agent fences (understands `lease_ms` and `renew`).
    #[serde(default)]
    pub lease: bool,
    /// As in `heartbeat`: the steps rooted here that the controller may not close yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<Vec<StepRef>>,
}

/// A step of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct StepRef {
    pub job: JobId,
    pub step: u32,
}

// `Resume` carries a whole `NodeAllocation` (with its GPUs since issue 20): messages are few
// and short-lived, so the size of the enum does not matter; boxing it would only add churn.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ControllerMessage {
    Registered {
        node_id: u32,
        heartbeat_interval_ms: u64,
        /// The lease: an agent that has not been renewed for this long stops the jobs marked
        /// `fence` (the controller requeues them once it has not heard from the agent for
        /// longer). Sent only to agents that asked (`Registration::lease`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lease_ms: Option<u64>,
        /// This controller takes `step_ended` reports.
        #[serde(default)]
        step_ends: bool,
    },
    /// A `step_ended` report is recorded.
    StepEndAck {
        job: JobId,
        step: u32,
    },
    /// The lease renewed as of heartbeat `seq` (its sending time, as the agent knows it).
    Renew {
        seq: u64,
    },
    Rejected {
        reason: String,
    },
    Launch(Box<LaunchSpec>),
    Kill {
        id: JobId,
        reason: String,
    },
    EndAck {
        id: JobId,
    },
    /// Deliver a signal to a job's processes on this node (one step's ranks when `step` is set).
    Signal {
        id: JobId,
        step: Option<u32>,
        signal: i32,
    },
    /// Freeze the job's cgroup on this node (every process of the job, its steps and tasks);
    /// its walltime clock stops. Answered with `suspended`.
    Suspend {
        id: JobId,
    },
    /// Thaw the job's cgroup on this node; with `allocation`, first move it to these CPUs and
    /// memory nodes (this node's part, as the controller now records it). Answered with
    /// `resumed`.
    Resume {
        id: JobId,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        allocation: Option<NodeAllocation>,
    },
    /// The job's walltime is now `walltime_seconds` from its start (time suspended not
    /// counted): an admin raised it (`berth update`), or a re-registered agent is told it
    /// again. Never below the walltime the job was launched with (the controller ends a job
    /// whose walltime was lowered itself). Not answered.
    SetWalltime {
        id: JobId,
        walltime_seconds: u64,
    },
}

/// A cgroup the agent made, as the kernel holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupReport {
    /// Path under the cpuset hierarchy's mount, e.g. `berth/c1/n1/job-7/rank0`.
    pub path: String,
    /// Contents of cpuset.cpus and cpuset.mems (kernel lists of the host's CPUs and nodes).
    pub cpus: String,
    pub mems: String,
    /// The rank this sub-cpuset is for; None for the job's own cgroup.
    #[serde(default)]
    pub rank: Option<u32>,
}

/// Everything an agent needs to run one job's batch script on its node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LaunchSpec {
    pub id: JobId,
    pub name: String,
    pub user: UserIdentity,
    pub env: Vec<(String, String)>,
    pub cwd: String,
    pub script: String,
    /// Absolute paths.
    pub stdout: String,
    pub stderr: String,
    /// This node's part of the allocation.
    pub allocation: NodeAllocation,
    /// Every node of the job with its core count, first node first (BERTH_NODES, nodefile).
    pub nodes: Vec<(String, u32)>,
    pub walltime_seconds: Option<u64>,
    /// Run the batch script here (the job's first node); other nodes only hold the job's
    /// cgroup and TMPDIR for its steps and tasks. Interactive jobs have no script anywhere.
    #[serde(default = "yes")]
    pub head: bool,
    /// Every node of the job with its agent address, in allocation order (for tasks).
    #[serde(default)]
    pub addresses: Vec<String>,
    /// Between SIGTERM and SIGKILL at walltime or cancel.
    pub kill_grace_ms: u64,
    /// What to do with `allocation.binding`, when the job asked for a binding.
    #[serde(default)]
    pub binding_mode: Option<BindingMode>,
    /// Contents of the job's rankfile (`--binding-mode pe`): one line per rank.
    #[serde(default)]
    pub rankfile: Option<String>,
    /// A step to start here as soon as the job is set up (an interactive allocation's one step,
    /// on its first node): its signed grant, with `attach` set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<Box<crate::step::StepGrant>>,
    /// The submitter's umask, set in the batch script's process before it opens its output
    /// files (none: the agent's default, 022).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub umask: Option<u32>,
    /// The most processes the job may have at once on this node (`[limits] pids_*`); none:
    /// no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids_max: Option<u64>,
    /// The controller requeues this job if this node goes silent: the agent kills it when
    /// its lease runs out, so that two copies never run at once.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fence: bool,
    /// Give the job's processes the Slurm and PBS variables too (docs/compat.md,
    /// "Environment"); none: the controller's `[compat] environment` is off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compat: Option<CompatEnv>,
    /// The batch script's working directory (`--chdir`); none: `cwd`, the submit directory
    /// (which `SLURM_SUBMIT_DIR`, `PBS_O_WORKDIR` and `BERTH_SUBMIT_DIR` stay).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    /// `--signal`: sent this many seconds before the walltime ends (to the batch shell only,
    /// or to every process of the job on this node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub early_signal: Option<berth_core::directives::SignalSpec>,
    /// Open the batch script's output files for appending (Slurm's `--open-mode=append`),
    /// not truncated.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub open_append: bool,
    /// The job's GPUs on every node of `nodes`, in the same order (berth's indexes on each
    /// node), for Torque's `PBS_GPUFILE`; empty (left out) when the job holds no GPU.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_gpus: Vec<Vec<u32>>,
}

/// What a job's Slurm and PBS variables need besides the rest of its launch.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompatEnv {
    /// `--cpus-per-task`, if the job gave it (`SLURM_CPUS_PER_TASK` is set only then, as
    /// Slurm does); tasks are the job's cores divided by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus_per_task: Option<u32>,
    /// `--tasks-per-node`, if the job gave it (`SLURM_NTASKS_PER_NODE`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks_per_node: Option<u32>,
    /// The job's queue (`SLURM_JOB_PARTITION`, `PBS_QUEUE`).
    #[serde(default)]
    pub queue: String,
    /// An `--exclusive` job's tasks, fewer than its whole nodes' CPUs (`SLURM_NTASKS`,
    /// `SLURM_TASKS_PER_NODE`, `PBS_NP`, the PBS node file); else its cores over
    /// `cpus_per_task`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks: Option<berth_core::directives::JobTasks>,
}

fn yes() -> bool {
    true
}

/// Requests an agent answers on its own port.
///
/// Read by hand ([`Deserialize`] below), not by serde's internally tagged enums: those buffer
/// the fields first, which would lose the exact bytes of a sealed query's body (its MAC covers
/// them).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum AgentQuery {
    Status,
    /// Opens a control-tree connection: start this step's ranks on the first node of
    /// `subtree` (indexes into `grant.nodes`) and forward it to the rest. `TreeDown` frames
    /// follow on the connection, `TreeUp` frames come back.
    StepLaunch {
        grant: Box<crate::step::StepGrant>,
        subtree: Vec<u32>,
    },
    /// The task API (local socket, or forwarded by another agent of the job).
    Task {
        request: crate::step::TaskRequest,
    },
    /// Another agent's request, signed with the cluster key (`body` is an `AgentQuery`;
    /// label `berth/v2/agent-query`). Agent-to-agent `task` requests must come this way.
    Sealed(crate::auth::Envelope),
}

const QUERY_OPS: &[&str] = &["status", "step_launch", "task", "sealed"];

#[derive(Deserialize)]
struct StepLaunchFields {
    grant: Box<crate::step::StepGrant>,
    subtree: Vec<u32>,
}

#[derive(Deserialize)]
struct TaskFields {
    request: crate::step::TaskRequest,
}

/// The query `op` names, from the rest of its fields.
fn query_of<'de, D: serde::Deserializer<'de>>(op: &str, rest: D) -> Result<AgentQuery, D::Error> {
    use serde::de::{Error, IgnoredAny};
    Ok(match op {
        "status" => {
            IgnoredAny::deserialize(rest)?;
            AgentQuery::Status
        }
        "step_launch" => {
            let f = StepLaunchFields::deserialize(rest)?;
            AgentQuery::StepLaunch { grant: f.grant, subtree: f.subtree }
        }
        "task" => AgentQuery::Task { request: TaskFields::deserialize(rest)?.request },
        "sealed" => AgentQuery::Sealed(crate::auth::Envelope::deserialize(rest)?),
        other => return Err(D::Error::unknown_variant(other, QUERY_OPS)),
    })
}

impl<'de> Deserialize<'de> for AgentQuery {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<AgentQuery, D::Error> {
        struct Query;
        impl<'de> serde::de::Visitor<'de> for Query {
            type Value = AgentQuery;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an agent query: an object with \"op\"")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<AgentQuery, A::Error> {
                use serde::de::Error;
                // As berth writes it, `op` first (after the frame's `v`): the other fields are
                // read straight from the input, so a sealed body keeps its bytes. Otherwise
                // through a JSON value (a sealed body is then written anew, and its MAC fails
                // unless its bytes were already so).
                let mut fields = serde_json::Map::new();
                let mut op = None;
                while let Some(k) = map.next_key::<String>()? {
                    if k == "op" && op.is_none() {
                        let name: String = map.next_value()?;
                        if fields.keys().all(|k| k == "v") {
                            return query_of(&name, serde::de::value::MapAccessDeserializer::new(map));
                        }
                        op = Some(name);
                    } else {
                        fields.insert(k, map.next_value()?);
                    }
                }
                let Some(op) = op else { return Err(A::Error::missing_field("op")) };
                query_of(&op, serde_json::Value::Object(fields)).map_err(A::Error::custom)
            }
        }
        d.deserialize_map(Query)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum AgentReply {
    Status { name: String, instance: String, connected: bool, running: Vec<JobId>, real_cpus: String },
    Task { reply: crate::step::TaskReply },
    Error { message: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suspend_messages_on_the_wire() {
        let m: ControllerMessage = serde_json::from_str(r#"{"op":"suspend","id":7}"#).unwrap();
        assert_eq!(m, ControllerMessage::Suspend { id: JobId(7) });
        let m: ControllerMessage = serde_json::from_str(r#"{"op":"resume","id":7}"#).unwrap();
        assert_eq!(m, ControllerMessage::Resume { id: JobId(7), allocation: None });
        let text =
            serde_json::to_string(&AgentMessage::Resumed { id: JobId(7), error: None, cgroups: vec![] }).unwrap();
        assert_eq!(text, r#"{"op":"resumed","id":7}"#);
        let m: AgentMessage = serde_json::from_str(r#"{"op":"suspended","id":7,"error":"x"}"#).unwrap();
        assert_eq!(m, AgentMessage::Suspended { id: JobId(7), error: Some("x".into()) });
    }

    #[test]
    fn agent_queries_are_read_by_hand_and_a_sealed_body_keeps_its_bytes() {
        use crate::auth::{ClusterKey, Envelope, ReplayGuard, KEY_BYTES, LABEL_AGENT_QUERY};
        use crate::frame::{decode, encode};
        use crate::step::TaskRequest;
        let key = ClusterKey::from_bytes([5; KEY_BYTES]);
        let task = AgentQuery::Task { request: TaskRequest::RemoteInfo { job: JobId(8) } };
        let sealed = AgentQuery::Sealed(Envelope::seal(&key, LABEL_AGENT_QUERY, &task).unwrap());
        for q in [AgentQuery::Status, task.clone(), sealed.clone()] {
            // As framed (`v`, then `op` first), and from a JSON value (keys sorted: `op` later).
            let framed = encode(&q).unwrap();
            assert_eq!(decode::<AgentQuery>(&framed[4..]).unwrap(), q);
            let value = serde_json::to_value(&q).unwrap();
            let back: AgentQuery = serde_json::from_value(value).unwrap();
            if !matches!(q, AgentQuery::Sealed(_)) {
                assert_eq!(back, q);
            }
        }
        // The sealed query read from its frame verifies, and holds the task.
        let framed = encode(&sealed).unwrap();
        let Ok(AgentQuery::Sealed(env)) = decode::<AgentQuery>(&framed[4..]) else { panic!("a sealed query") };
        env.open(&key, LABEL_AGENT_QUERY, &mut ReplayGuard::default(), crate::auth::now_ms()).unwrap();
        assert_eq!(env.message::<AgentQuery>().unwrap(), task);
        // Its body edited is refused.
        let text = String::from_utf8(framed[4..].to_vec()).unwrap().replace("\"job\":8", "\"job\":9");
        let Ok(AgentQuery::Sealed(env)) = decode::<AgentQuery>(text.as_bytes()) else { panic!("a sealed query") };
        assert_eq!(env.verify(&key, LABEL_AGENT_QUERY), Err(crate::error::AuthError::BadMac));
        // Unknown or missing `op`, wrong fields: errors, not panics.
        for bad in [r#"{"v":3,"op":"nope"}"#, r#"{"v":3,"x":1}"#, r#"{"v":3,"op":"task"}"#, r#"{"v":3,"op":7}"#] {
            assert!(decode::<AgentQuery>(bad.as_bytes()).is_err(), "{bad}");
        }
        let e = decode::<AgentQuery>(br#"{"v":3,"op":"nope"}"#).unwrap_err().to_string();
        assert!(e.contains("nope") && e.contains("step_launch"), "{e}");
        assert!(serde_json::from_str::<AgentQuery>(r#"{"x":1,"op":"status"}"#).is_ok());
    }
}
