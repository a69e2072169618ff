//! What this agent accepts on its own port, and from whom (docs/protocol/06-auth.md,
//! "Authentication"): step launches only for a grant the controller signed, naming this
//! node, for a job running here, on CPUs of the job's allocation here, once; agent-to-agent
//! task requests only signed with the cluster key. Refusals are logged here and reported to
//! the controller (`refused`), which records them in its event log.

use berth_core::JobId;
use berth_protocol::agent::{AgentMessage, AgentQuery};
use berth_protocol::auth::{
    now_ms, random_nonce, verify_grant, ClusterKey, Envelope, LinkKey, ReplayGuard, LABEL_AGENT_QUERY,
};
use berth_protocol::error::Refusal;
use berth_protocol::step::StepGrant;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

pub struct AgentAuth {
    pub key: Arc<ClusterKey>,
    /// This node's name (what grants must name).
    pub name: String,
    /// This agent process (its registration's `instance`): grants made for an earlier one
    /// are refused, so the controller can close the steps a restarted agent does not list.
    pub instance: String,
    guard: Mutex<ReplayGuard>,
    /// (job, step) of grants accepted here, until the grant expires: a grant works once.
    launched: Mutex<HashMap<(JobId, u32), u64>>,
    /// Where refusals go to the controller (the agent's outgoing events, queued while it is
    /// not connected); None: logged only.
    reporter: Option<mpsc::UnboundedSender<AgentMessage>>,
}

/// A refusal: what kind, and why (said to the caller, logged, reported).
pub type Refused = (Refusal, String);

impl AgentAuth {
    pub fn new(
        key: Arc<ClusterKey>,
        name: String,
        instance: String,
        reporter: Option<mpsc::UnboundedSender<AgentMessage>>,
    ) -> AgentAuth {
        AgentAuth {
            key,
            name,
            instance,
            guard: Mutex::new(ReplayGuard::default()),
            launched: Mutex::new(HashMap::new()),
            reporter,
        }
    }

    /// Log a refusal and tell the controller (queued while it is not connected).
    pub fn refuse(&self, what: Refusal, job: Option<JobId>, detail: &str) {
        tracing::warn!(kind = what.event_kind(), job = ?job, "refused: {detail}");
        if let Some(tx) = &self.reporter {
            let _ = tx.send(AgentMessage::Refused { what, job, detail: detail.to_string() });
        }
    }

    /// Sign a query to another agent; the key of the connection it opens (every later frame,
    /// both ways, is sealed under it).
    pub fn seal_query(&self, q: &AgentQuery) -> Result<(AgentQuery, LinkKey), QueryError> {
        let nonce = random_nonce();
        let env = Envelope::seal_at(&self.key, LABEL_AGENT_QUERY, q, now_ms(), nonce).map_err(QueryError::Encode)?;
        Ok((AgentQuery::Sealed(env), LinkKey::of_query(&self.key, &nonce)))
    }

    /// Check another agent's signed query: MAC, time window, nonce never seen; the query and
    /// the key of its connection.
    pub fn open_query(&self, env: &Envelope) -> Result<(AgentQuery, LinkKey), QueryError> {
        let mut guard = self.guard.lock().map_err(|_| QueryError::Poisoned)?;
        let nonce = env.open(&self.key, LABEL_AGENT_QUERY, &mut guard, now_ms()).map_err(QueryError::Refused)?;
        drop(guard);
        let q = env.message::<AgentQuery>().map_err(QueryError::Decode)?;
        Ok((q, LinkKey::of_query(&self.key, &nonce)))
    }

    /// A launch of the whole step (`run`'s, to the step's first node), not of a subtree.
    pub fn is_root_launch(&self, grant: &StepGrant, subtree: &[u32]) -> bool {
        subtree.first() == Some(&0) && subtree.len() == grant.nodes.len()
    }

    /// What `run`'s launch of a step already started here from its launch order must pass
    /// (the step's start passed [`crate::step::launch::check`], which made the grant used): signed,
    /// unexpired, for this node. Attaching works once (crate::ports::attach).
    pub fn check_step_attach(&self, grant: &StepGrant, subtree: &[u32]) -> Result<(), Refused> {
        self.check_grant_here(grant, subtree, now_ms())
    }

    /// The grant is the controller's, unexpired, and `subtree` is this node's part of it.
    pub(crate) fn check_grant_here(&self, grant: &StepGrant, subtree: &[u32], now: u64) -> Result<(), Refused> {
        let auth = |m: String| (Refusal::Auth, m);
        let launch = |m: String| (Refusal::Launch, m);
        let (job, step) = (grant.job, grant.step);
        verify_grant(&self.key, grant, now).map_err(|e| auth(format!("step grant {job}.{step}: {e}")))?;
        let me = subtree.first().and_then(|&i| grant.nodes.get(i as usize));
        match me {
            Some(n) if n.name == self.name && !n.instance.is_empty() && n.instance != self.instance => {
                return Err(launch(format!(
                    "step {job}.{step} was granted before node {}'s agent restarted; its ranks there were killed with \
                     the old agent: start the step again",
                    self.name
                )))
            }
            Some(n) if n.name == self.name => {}
            Some(n) => {
                return Err(launch(format!(
                    "step {job}.{step} was sent to node {} but this launch is for node {}",
                    self.name, n.name
                )))
            }
            None => {
                return Err(launch(format!("step {job}.{step}: the launch names no node of the step for this agent")))
            }
        }
        if subtree.iter().any(|&i| i as usize >= grant.nodes.len()) {
            return Err(launch(format!("step {job}.{step}: the launch's subtree names nodes the step does not have")));
        }
        Ok(())
    }

    /// Record that the step of `grant` is launched here (a grant works once): refused when it
    /// was already, until the grant expires.
    pub fn record_launch(&self, grant: &StepGrant, now: u64) -> Result<(), Refused> {
        let (job, step) = (grant.job, grant.step);
        let mut seen = self.launched.lock().map_err(|_| (Refusal::Auth, "launch record poisoned".to_string()))?;
        seen.retain(|_, until| *until >= now);
        if seen.contains_key(&(job, step)) {
            return Err((
                Refusal::Auth,
                format!("step {job}.{step} was already launched on this node (replayed grant)"),
            ));
        }
        seen.insert((job, step), grant.expires_ms);
        Ok(())
    }
}

/// A query to another agent, signed with `auth` (the agent's, from its [`crate::ports::JobContext`]), and
/// the key of the connection it opens.
pub fn to_agent(auth: Option<&AgentAuth>, q: AgentQuery) -> Result<(AgentQuery, LinkKey), QueryError> {
    match auth {
        Some(a) => a.seal_query(&q),
        None => Err(QueryError::NoKey),
    }
}

/// Why a query between agents could not be signed or was not taken.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// The query could not be encoded.
    #[error(transparent)]
    Encode(berth_protocol::ProtocolError),
    /// Its MAC, time or nonce failed (a forgery, a replay, a clock too far off).
    #[error(transparent)]
    Refused(berth_protocol::error::AuthError),
    /// Signed, but not a query this agent reads.
    #[error(transparent)]
    Decode(berth_protocol::ProtocolError),
    #[error("replay guard poisoned")]
    Poisoned,
    #[error("this process has no cluster key to sign agent queries with")]
    NoKey,
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_core::step::RankPlace;
    use berth_protocol::auth::{sign_grant, KEY_BYTES};
    use berth_protocol::step::StepNode;
    use berth_protocol::user::UserIdentity;

    fn grant(key: &ClusterKey, instance: &str) -> StepGrant {
        let mut g = StepGrant {
            job: JobId(4),
            step: 2,
            kvsname: "berth_4_2".into(),
            user: UserIdentity { uid: 1000, gid: 1000, groups: vec![], name: "ann".into() },
            argv: vec!["true".into()],
            env: vec![],
            cwd: "/".into(),
            size: 1,
            fanout: 0,
            no_kill: false,
            rank_cpusets: false,
            bind: true,
            notify_signal: None,
            kill_grace_ms: 500,
            mpi: Default::default(),
            nodes: vec![StepNode {
                name: "node1".into(),
                address: "127.0.0.1:1".into(),
                ranks: vec![RankPlace { rank: 0, cpus: berth_core::CpuSet::parse_list("0").unwrap() }],
                instance: instance.into(),
            }],
            interactive: false,
            attach: false,
            expires_ms: 0,
            apps: vec![],
            spawned_by: None,
            mac: String::new(),
        };
        sign_grant(key, &mut g, now_ms() + 60_000);
        g
    }

    #[test]
    fn grants_for_an_earlier_agent_process_are_refused() {
        let key = Arc::new(ClusterKey::from_bytes([7; KEY_BYTES]));
        let auth = AgentAuth::new(key.clone(), "node1".into(), "reborn".into(), None);
        auth.check_grant_here(&grant(&key, "reborn"), &[0], now_ms()).unwrap();
        // Grants made before instance fields existed are not checked.
        auth.check_grant_here(&grant(&key, ""), &[0], now_ms()).unwrap();
        let (what, why) = auth.check_grant_here(&grant(&key, "old"), &[0], now_ms()).unwrap_err();
        assert_eq!(what, Refusal::Launch);
        assert!(why.contains("granted before node node1's agent restarted"), "{why}");
        // The instance is under the MAC: changing it breaks the signature.
        let mut forged = grant(&key, "old");
        forged.nodes[0].instance = "reborn".into();
        assert_eq!(auth.check_grant_here(&forged, &[0], now_ms()).unwrap_err().0, Refusal::Auth);
    }
}
