//! The reservations API for external schedulers (ALPS/BASIL-style): inventory, reserve,
//! confirm, claim, release. See `docs/reservations.md` for the semantics and
//! `docs/openapi.yaml` for the HTTP/JSON interface.
//!
//! These are the bodies of the HTTP API (served by the controller on its `api.sock` Unix
//! socket and, optionally, on TCP) and of the `reservation` client request, which carries the
//! same requests over the berth protocol (`berth reservations` uses it). Request bodies refuse
//! unknown fields, so a misspelt field is an error rather than silently ignored.

use crate::error::ErrorCode;
use crate::node::NodeInfo;
use crate::step::StepInfo;
use berth_core::gres::Counts;
use berth_core::JobId;
use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// A reservation request as carried by `ClientRequest::Reservation`.
// Always boxed where it travels (`ClientRequest::Reservation`), and one is built per request.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum ReservationRequest {
    /// `GET /v1/inventory`: every node, its topology and what is free on it.
    Inventory,
    /// `GET /v1/reservations`: the reservations not released (with `all`, the released ones too).
    List {
        #[serde(default)]
        all: bool,
    },
    /// `GET /v1/reservations/{id}`: one reservation, with its claims (steps).
    Show { id: u64 },
    /// `POST /v1/reservations`.
    Reserve { body: ReserveRequest },
    /// `POST /v1/reservations/{id}/confirm`.
    Confirm { id: u64, body: ConfirmRequest },
    /// `POST /v1/reservations/{id}/renew`: keeps a session-confirmed reservation alive.
    Renew { id: u64 },
    /// `DELETE /v1/reservations/{id}`.
    Release { id: u64 },
}

/// The answer to a [`ReservationRequest`], carried by `ClientResponse::Reservation`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ReservationReply {
    Inventory(Box<Inventory>),
    List {
        reservations: Vec<ReservationInfo>,
    },
    /// One reservation; `created` when this request made it (HTTP 201).
    One {
        reservation: Box<ReservationInfo>,
        #[serde(default)]
        created: bool,
    },
    Failed(ReservationError),
}

/// An option value as JSON gives it: a number, a string (`"1G"`, `"10:00"`) or a switch.
/// It is read as `berth submit` reads the flag's text.
#[derive(Debug, Clone, PartialEq)]
pub enum OptionValue {
    Number(u64),
    Text(String),
    Switch(bool),
}

impl OptionValue {
    pub fn as_text(&self) -> String {
        match self {
            OptionValue::Number(n) => n.to_string(),
            OptionValue::Text(s) => s.clone(),
            OptionValue::Switch(b) => if *b { "yes" } else { "no" }.to_string(),
        }
    }
}

impl Serialize for OptionValue {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            OptionValue::Number(n) => s.serialize_u64(*n),
            OptionValue::Text(t) => s.serialize_str(t),
            OptionValue::Switch(b) => s.serialize_bool(*b),
        }
    }
}

impl<'de> Deserialize<'de> for OptionValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = OptionValue;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a whole number, a string such as \"1G\" or \"10:00\", or true/false")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<OptionValue, E> {
                Ok(OptionValue::Number(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<OptionValue, E> {
                u64::try_from(v)
                    .map(OptionValue::Number)
                    .map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &"a number >= 0"))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<OptionValue, E> {
                Ok(OptionValue::Text(v.to_string()))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<OptionValue, E> {
                Ok(OptionValue::Switch(v))
            }
        }
        d.deserialize_any(V)
    }
}

/// What to reserve, with the meaning of the `berth submit` options of the same names
/// (`tasks_per_node` is `--tasks-per-node`, and so on). `mem` is per node.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReserveResources {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nodes: Option<OptionValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cores: Option<OptionValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tasks_per_node: Option<OptionValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpus_per_task: Option<OptionValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mem: Option<OptionValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mem_per_cpu: Option<OptionValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threads: Option<OptionValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub property: Option<OptionValue>,
    /// GPUs of the whole reservation, spread evenly over its nodes (`--gpus`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpus: Option<OptionValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpus_per_node: Option<OptionValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_type: Option<OptionValue>,
    /// Generic resources on each node, `"nvme:500,fpga:1"` (`--gres`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gres: Option<OptionValue>,
    /// Cluster-wide licenses, `"matlab:2"` (`--licenses`); also with `node_list`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub licenses: Option<OptionValue>,
}

impl ReserveResources {
    /// The options given, as (`berth submit` option name, value).
    pub fn entries(&self) -> Vec<(&'static str, &OptionValue)> {
        [
            ("nodes", &self.nodes),
            ("cores", &self.cores),
            ("tasks-per-node", &self.tasks_per_node),
            ("cpus-per-task", &self.cpus_per_task),
            ("mem", &self.mem),
            ("mem-per-cpu", &self.mem_per_cpu),
            ("threads", &self.threads),
            ("property", &self.property),
            ("gpus", &self.gpus),
            ("gpus-per-node", &self.gpus_per_node),
            ("gpu-type", &self.gpu_type),
            ("gres", &self.gres),
            ("licenses", &self.licenses),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| (k, v)))
        .collect()
    }
}

/// One node of an explicit resource list: the node, and its PUs (a kernel cpu list of the
/// node's PU numbers; absent: every PU of the node but its system CPUs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeRequest {
    pub node: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<String>,
    /// GPUs of the node by index (as the inventory numbers them); absent: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<u32>,
    /// Generic resources of the node (`{"nvme": 500}`); absent: none.
    #[serde(default, skip_serializing_if = "Counts::is_empty")]
    pub gres: Counts,
}

/// `POST /v1/reservations`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReserveRequest {
    /// Login name the reservation (and every claim in it) belongs to; default the caller.
    /// Only admins may name someone else.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// What to place (ignored but for `mem`/`mem_per_cpu` when `node_list` is given).
    #[serde(default)]
    pub resources: ReserveResources,
    /// Required: seconds, `HH:MM:SS`, `D-HH:MM:SS`, `10m`, `2h`.
    pub walltime: OptionValue,
    /// A specific resource list, honoured exactly or not at all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_list: Vec<NodeRequest>,
    /// Fair-share account charged (default: the user's primary group).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
}

/// `POST /v1/reservations/{id}/confirm`: exactly one of the three.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfirmRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<JobId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
}

impl ConfirmRequest {
    /// The holder named, or why the body does not name exactly one.
    pub fn holder(&self) -> Result<Holder, String> {
        match (self.job, self.pid, &self.session) {
            (Some(job), None, None) => Ok(Holder::Job { job }),
            (None, Some(pid), None) if pid > 0 => Ok(Holder::Pid { pid }),
            (None, Some(_), None) => Err("pid must be a process id (> 0)".into()),
            (None, None, Some(s)) if !s.is_empty() && s.len() <= 256 => Ok(Holder::Session { session: s.clone() }),
            (None, None, Some(_)) => Err("session must be 1 to 256 characters".into()),
            (None, None, None) => Err("give the holder: {\"job\": ID}, {\"pid\": N} or {\"session\": \"...\"}".into()),
            _ => Err("give exactly one holder: job, pid or session".into()),
        }
    }
}

/// Who holds a confirmed reservation; it is released when the holder goes away.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Holder {
    /// A berth job (e.g. the external scheduler's batch job): released when it finishes.
    Job { job: JobId },
    /// A process on the controller's host: released when it exits.
    Pid { pid: u32 },
    /// An external id: released unless renewed within `[api] session_timeout_secs`.
    Session { session: String },
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Holder::Job { job } => write!(f, "job {job}"),
            Holder::Pid { pid } => write!(f, "pid {pid}"),
            Holder::Session { session } => write!(f, "session {session}"),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReservationState {
    /// Placed, waiting for `confirm` (released at `confirm_by`).
    Unconfirmed,
    /// Bound to its holder.
    Confirmed,
    /// Freed: released, expired, its holder gone, or its walltime over.
    Released,
}

impl ReservationState {
    pub fn as_str(self) -> &'static str {
        match self {
            ReservationState::Unconfirmed => "unconfirmed",
            ReservationState::Confirmed => "confirmed",
            ReservationState::Released => "released",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [ReservationState::Unconfirmed, ReservationState::Confirmed, ReservationState::Released]
            .into_iter()
            .find(|x| x.as_str() == s)
    }
}

/// Memory reserved on one NUMA node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NumaMemory {
    /// The NUMA node's OS index.
    pub numa: u32,
    pub bytes: u64,
}

/// What a reservation holds on one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReservedNode {
    pub node: String,
    /// The node agent's address (where `berth run` opens its control tree).
    pub address: String,
    /// PUs (kernel cpu list of the node's PU numbers).
    pub cpus: String,
    pub cores: u32,
    /// NUMA nodes the memory comes from (kernel list of OS indexes).
    pub mems: String,
    pub memory_bytes: u64,
    pub numa_memory: Vec<NumaMemory>,
    /// GPUs held (indexes on the node, as `berth nodes --json` numbers them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<u32>,
    /// Generic resources held on the node.
    #[serde(default, skip_serializing_if = "Counts::is_empty")]
    pub gres: Counts,
}

/// A reservation as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReservationInfo {
    pub id: u64,
    /// The berth job holding the resources: `berth run --job JOB` claims them.
    pub job: JobId,
    pub user: String,
    pub uid: u32,
    pub state: ReservationState,
    /// Unix times, seconds.
    pub created: f64,
    /// An unconfirmed reservation is released at this time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirm_by: Option<f64>,
    /// The end of its walltime.
    pub ends: f64,
    pub walltime_seconds: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<Holder>,
    /// A session-confirmed reservation is released unless renewed by this time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_by: Option<f64>,
    /// It was made from an explicit resource list.
    pub explicit: bool,
    pub nodes: Vec<ReservedNode>,
    /// Cluster-wide licenses held.
    #[serde(default, skip_serializing_if = "Counts::is_empty")]
    pub licenses: Counts,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released_at: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release_reason: Option<String>,
    /// The claims: the steps (`berth run`) run in it, first first; filled for one reservation.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub claims: Vec<StepInfo>,
}

/// `GET /v1/inventory`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Inventory {
    /// Unix time of the snapshot.
    pub time: f64,
    pub nodes: Vec<InventoryNode>,
    /// The cluster's licenses: how many exist and are held (by jobs and reservations).
    /// Each node's generic resources are in its `info.gres`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub licenses: Vec<crate::node::CountInfo>,
}

/// One node of the inventory: what `berth nodes --json` shows, plus what is free and who
/// holds the rest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InventoryNode {
    #[serde(flatten)]
    pub info: NodeInfo,
    /// Whole cores free (outside system CPUs and NUMA nodes held alone by a large job).
    pub free_cores: u32,
    /// PUs free (outside system CPUs).
    pub free_pus: u32,
    /// The free PUs (kernel list).
    pub free_cpus: String,
    pub free_memory_bytes: u64,
    /// Free memory and PUs per NUMA node.
    pub numa_free: Vec<NumaFree>,
    /// The free GPUs (indexes; absent when none is free).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub free_gpus: Vec<u32>,
    /// Jobs and reservations holding resources on the node.
    pub holders: Vec<NodeHolder>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NumaFree {
    pub os_index: u32,
    pub free_bytes: u64,
    /// Free PUs of this NUMA node (kernel list).
    pub free_cpus: String,
}

/// A job (or reservation) holding part of a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeHolder {
    pub job: JobId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation: Option<u64>,
    pub user: String,
    pub cpus: String,
    pub memory_bytes: u64,
    /// GPUs held (indexes; absent when none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<u32>,
}

/// The error body: `{"error": {"code": "...", "message": "...", "reason": "..."}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReservationError {
    /// One of the codes of docs/errors.md; the HTTP status is `code.status()`.
    pub code: ErrorCode,
    /// What went wrong and what to do.
    pub message: String,
    /// For `try_again` and `infeasible`: the placement's reason alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl ReservationError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ReservationError { code, message: message.into(), reason: None }
    }

    pub fn with_reason(code: ErrorCode, message: impl Into<String>, reason: impl Into<String>) -> Self {
        ReservationError { code, message: message.into(), reason: Some(reason.into()) }
    }
}

/// `{"error": ...}` as the HTTP API writes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ReservationError,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_body_reads_numbers_strings_and_refuses_unknown_fields() {
        let r: ReserveRequest = serde_json::from_str(
            r#"{"user":"ann","resources":{"nodes":2,"tasks_per_node":"4","mem":"1G"},"walltime":"10:00"}"#,
        )
        .unwrap();
        assert_eq!(r.user.as_deref(), Some("ann"));
        let e: Vec<(&str, String)> = r.resources.entries().into_iter().map(|(k, v)| (k, v.as_text())).collect();
        assert_eq!(e, vec![("nodes", "2".into()), ("tasks-per-node", "4".into()), ("mem", "1G".into())]);
        assert_eq!(r.walltime.as_text(), "10:00");
        let e = serde_json::from_str::<ReserveRequest>(r#"{"walltime":60,"resoures":{}}"#).unwrap_err();
        assert!(e.to_string().contains("unknown field `resoures`"), "{e}");
        let e = serde_json::from_str::<ReserveRequest>(r#"{"walltime":60,"resources":{"license":1}}"#).unwrap_err();
        assert!(e.to_string().contains("unknown field `license`"), "{e}");
        // Generic resources and licenses, and GPUs and generic resources of a listed node.
        let r: ReserveRequest = serde_json::from_str(
            r#"{"walltime":60,"resources":{"gres":"nvme:500","licenses":"matlab:2"},
                "node_list":[{"node":"n1","gpus":[0,1],"gres":{"nvme":100}}]}"#,
        )
        .unwrap();
        let e: Vec<(&str, String)> = r.resources.entries().into_iter().map(|(k, v)| (k, v.as_text())).collect();
        assert_eq!(e, vec![("gres", "nvme:500".into()), ("licenses", "matlab:2".into())]);
        assert_eq!((r.node_list[0].gpus.clone(), r.node_list[0].gres.get("nvme")), (vec![0, 1], Some(&100)));
        let r: ReserveRequest =
            serde_json::from_str(r#"{"walltime":60,"resources":{"gpus_per_node":2,"gpu_type":"a100"}}"#).unwrap();
        let e: Vec<(&str, String)> = r.resources.entries().into_iter().map(|(k, v)| (k, v.as_text())).collect();
        assert_eq!(e, vec![("gpus-per-node", "2".into()), ("gpu-type", "a100".into())]);
        let e = serde_json::from_str::<ReserveRequest>(r#"{"resources":{}}"#).unwrap_err();
        assert!(e.to_string().contains("walltime"), "{e}");
        let e = serde_json::from_str::<ReserveRequest>(r#"{"walltime":-3}"#).unwrap_err();
        assert!(e.to_string().contains(">= 0"), "{e}");
        let e = serde_json::from_str::<ReserveRequest>(r#"{"walltime":[1]}"#).unwrap_err();
        assert!(e.to_string().contains("whole number"), "{e}");
    }

    #[test]
    fn confirm_names_exactly_one_holder() {
        let c: ConfirmRequest = serde_json::from_str(r#"{"job":7}"#).unwrap();
        assert_eq!(c.holder().unwrap(), Holder::Job { job: JobId(7) });
        let c: ConfirmRequest = serde_json::from_str(r#"{"pid":42}"#).unwrap();
        assert_eq!(c.holder().unwrap(), Holder::Pid { pid: 42 });
        let c: ConfirmRequest = serde_json::from_str(r#"{"session":"pbs.123"}"#).unwrap();
        assert_eq!(c.holder().unwrap(), Holder::Session { session: "pbs.123".into() });
        assert!(serde_json::from_str::<ConfirmRequest>(r#"{}"#).unwrap().holder().is_err());
        assert!(serde_json::from_str::<ConfirmRequest>(r#"{"job":1,"pid":2}"#).unwrap().holder().is_err());
        assert!(serde_json::from_str::<ConfirmRequest>(r#"{"pid":0}"#).unwrap().holder().is_err());
        assert!(serde_json::from_str::<ConfirmRequest>(r#"{"jobs":1}"#).is_err());
    }

    #[test]
    fn requests_round_trip_inside_a_client_frame() {
        use crate::client::ClientRequest;
        let body: ReserveRequest = serde_json::from_str(r#"{"walltime":"1h","node_list":[{"node":"n1"}]}"#).unwrap();
        let req = ClientRequest::Reservation { request: Box::new(ReservationRequest::Reserve { body }) };
        let bytes = crate::frame::encode(&req).unwrap();
        let back: ClientRequest = crate::frame::decode(&bytes[4..]).unwrap();
        assert_eq!(back, req);
        let req = ClientRequest::Reservation {
            request: Box::new(ReservationRequest::Confirm {
                id: 3,
                body: ConfirmRequest { pid: Some(9), ..Default::default() },
            }),
        };
        let bytes = crate::frame::encode(&req).unwrap();
        assert_eq!(crate::frame::decode::<ClientRequest>(&bytes[4..]).unwrap(), req);
    }
}
