//! Authenticated control-tree connections, and the connections agent-to-agent queries keep
//! open (docs/protocol/06-auth.md, "Authentication").
//!
//! A step's tree is opened with its signed grant (`step_launch`); every frame after it, both
//! ways, is a `SessionFrame` under a key of that one connection: MAC'd and numbered, so a
//! frame forged, altered, replayed (from this connection or from another one, of this step or
//! of another) or dropped is refused. The connection's key comes from the step's link key,
//! which comes from the cluster key and the grant's signature: agents derive it themselves;
//! `berth run`, which holds no cluster key, gets it from the controller over its local socket
//! with the grant, and never sends it anywhere.
//!
//! A signed agent-to-agent query (an envelope, whose nonce the receiver's replay guard admits
//! once) opens a connection the same way: its key comes from the cluster key and that nonce.

use super::{hmac, ClusterKey, Nonce, Opener, Sealer};
use crate::step::StepGrant;

pub const LABEL_STEP_LINK: &[u8] = b"berth/v2/step-link";
pub const LABEL_TREE_LINK: &[u8] = b"berth/v2/tree-link";
pub const LABEL_TREE_DOWN: &[u8] = b"berth/v2/tree-down";
pub const LABEL_TREE_UP: &[u8] = b"berth/v2/tree-up";
pub const LABEL_QUERY_LINK: &[u8] = b"berth/v2/query-link";
pub const LABEL_QUERY_DOWN: &[u8] = b"berth/v2/query-down";
pub const LABEL_QUERY_UP: &[u8] = b"berth/v2/query-up";
pub const LABEL_PMIX_NAMESPACE: &[u8] = b"berth/v2/pmix-namespace";

/// The secret of one step's control tree.
#[derive(Clone, PartialEq, Eq)]
pub struct LinkKey([u8; 32]);

impl std::fmt::Debug for LinkKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LinkKey(..)")
    }
}

impl LinkKey {
    /// The link key of the step `grant` (signed) opens: what the controller gives `berth run`
    /// and what every agent derives on receiving the grant.
    pub fn of_grant(key: &ClusterKey, grant: &StepGrant) -> LinkKey {
        LinkKey(key.mac(&[LABEL_STEP_LINK, grant.mac.as_bytes()]))
    }

    /// The key of the connection a signed agent-to-agent query opens, from its envelope's nonce.
    pub fn of_query(key: &ClusterKey, nonce: &Nonce) -> LinkKey {
        LinkKey(key.mac(&[LABEL_QUERY_LINK, nonce]))
    }

    /// The two halves of that query's connection: `Above` is the agent that sent the query.
    pub fn query_link(&self, end: TreeEnd) -> (Sealer, Opener) {
        let (send, recv) = match end {
            TreeEnd::Above => (LABEL_QUERY_DOWN, LABEL_QUERY_UP),
            TreeEnd::Below => (LABEL_QUERY_UP, LABEL_QUERY_DOWN),
        };
        (Sealer { key: self.0, label: send, next: 1 }, Opener { key: self.0, label: recv, next: 1 })
    }

    /// The secret part of the step's PMIx namespace name (32 hex digits, 128 bits): the same
    /// on every agent of the step, unknown to anyone who holds neither the cluster key nor the
    /// step's link key. Naming a namespace is all a local process needs to be taken for one
    /// of its ranks by an agent's PMIx server (docs/launcher.md, "Who may talk to the PMIx
    /// server"), so the name must not be guessable.
    pub fn pmix_namespace_tag(&self) -> String {
        super::hex(&hmac(&self.0, &[LABEL_PMIX_NAMESPACE])[..16])
    }

    /// The step's PMIx namespace: `berth.JOB.STEP.` and [`Self::pmix_namespace_tag`], the
    /// same on every agent of the step and at its `berth run` (which names it to the rank that
    /// spawned the step).
    pub fn pmix_namespace(&self, job: berth_core::JobId, step: u32) -> String {
        format!("berth.{job}.{step}.{}", self.pmix_namespace_tag())
    }

    /// As the controller hands it to `berth run` (64 hex digits).
    pub fn to_hex(&self) -> String {
        super::hex(&self.0)
    }

    pub fn from_hex(s: &str) -> Option<LinkKey> {
        let b = super::unhex(s)?;
        Some(LinkKey(b.try_into().ok()?))
    }

    /// The two halves of the connection that opens the subtree whose first node is `first`
    /// (an index into the grant's nodes: each node heads exactly one connection of a step).
    pub fn link(&self, first: u32, end: TreeEnd) -> (Sealer, Opener) {
        let k = hmac(&self.0, &[LABEL_TREE_LINK, &first.to_be_bytes()]);
        let (send, recv) = match end {
            TreeEnd::Above => (LABEL_TREE_DOWN, LABEL_TREE_UP),
            TreeEnd::Below => (LABEL_TREE_UP, LABEL_TREE_DOWN),
        };
        (Sealer { key: k, label: send, next: 1 }, Opener { key: k, label: recv, next: 1 })
    }
}

/// Which end of a tree connection we are: the one that opened it (`berth run`, or a parent
/// shepherd), or the shepherd of the subtree it opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TreeEnd {
    Above,
    Below,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{sign_grant, KEY_BYTES};
    use crate::error::AuthError;
    use crate::frame::ProtocolError;
    use crate::step::{StepGrant, TreeDown, TreeUp};

    fn grant(step: u32) -> StepGrant {
        let text = format!(
            r#"{{"job":7,"step":{step},"kvsname":"k","user":{{"uid":0,"gid":0,"groups":[],"name":"root"}},"argv":["true"],"env":[],"cwd":"/","size":1,"fanout":8,"no_kill":false,"rank_cpusets":false,"bind":false,"kill_grace_ms":500,"nodes":[],"interactive":false,"expires_ms":0,"mac":""}}"#
        );
        serde_json::from_str(&text).unwrap()
    }

    fn signed(key: &ClusterKey, step: u32) -> StepGrant {
        let mut g = grant(step);
        sign_grant(key, &mut g, 1_000);
        g
    }

    fn auth_err(r: Result<TreeDown, ProtocolError>) -> AuthError {
        match r {
            Err(ProtocolError::Auth(e)) => e,
            other => panic!("expected an authentication error, got {other:?}"),
        }
    }

    #[test]
    fn both_ends_agree_and_frames_go_in_order_each_way() {
        let key = ClusterKey::from_bytes([3; KEY_BYTES]);
        let g = signed(&key, 1);
        let lk = LinkKey::of_grant(&key, &g);
        assert_eq!(LinkKey::from_hex(&lk.to_hex()), Some(lk.clone()));
        let (mut run_seal, mut run_open) = lk.link(0, TreeEnd::Above);
        let (mut sh_seal, mut sh_open) = lk.link(0, TreeEnd::Below);
        for sig in [10, 12] {
            let f = run_seal.seal(&TreeDown::Signal { signal: sig }).unwrap();
            assert_eq!(sh_open.open::<TreeDown>(&f).unwrap(), TreeDown::Signal { signal: sig });
        }
        let f = sh_seal.seal(&TreeUp::Done).unwrap();
        assert_eq!(run_open.open::<TreeUp>(&f).unwrap(), TreeUp::Done);
    }

    #[test]
    fn forged_replayed_and_misdirected_frames_are_refused() {
        let key = ClusterKey::from_bytes([3; KEY_BYTES]);
        let g1 = signed(&key, 1);
        let lk = LinkKey::of_grant(&key, &g1);
        let (mut down, _) = lk.link(0, TreeEnd::Above);
        let f1 = down.seal(&TreeDown::Signal { signal: 10 }).unwrap();
        let f2 = down.seal(&TreeDown::Kill { reason: "x".into() }).unwrap();

        // Replayed, and reordered (frame 2 first).
        let (_, mut open) = lk.link(0, TreeEnd::Below);
        open.open::<TreeDown>(&f1).unwrap();
        assert_eq!(auth_err(open.open(&f1)), AuthError::Sequence { expected: 2, got: 1 });
        let (_, mut open) = lk.link(0, TreeEnd::Below);
        assert_eq!(auth_err(open.open(&f2)), AuthError::Sequence { expected: 1, got: 2 });

        // Altered.
        let (_, mut open) = lk.link(0, TreeEnd::Below);
        let mut bad = f1.clone();
        bad.body = serde_json::value::RawValue::from_string(bad.body.get().replace("10", "9")).unwrap();
        assert_eq!(auth_err(open.open(&bad)), AuthError::BadMac);

        // Sent back the other way (an upward frame's label differs).
        let (_, mut up_open) = lk.link(0, TreeEnd::Above);
        assert!(matches!(up_open.open::<TreeDown>(&f1), Err(ProtocolError::Auth(AuthError::BadMac))));

        // Another connection of the same step (subtree headed by node 3).
        let (_, mut other) = lk.link(3, TreeEnd::Below);
        assert_eq!(auth_err(other.open(&f1)), AuthError::BadMac);

        // Another step, and a forger without the cluster key: a different grant signature
        // gives a different link key.
        let g2 = signed(&key, 2);
        let (_, mut step2) = LinkKey::of_grant(&key, &g2).link(0, TreeEnd::Below);
        assert_eq!(auth_err(step2.open(&f1)), AuthError::BadMac);
        let forger = ClusterKey::from_bytes([4; KEY_BYTES]);
        let (mut forged, _) = LinkKey::of_grant(&forger, &g1).link(0, TreeEnd::Above);
        let (_, mut open) = lk.link(0, TreeEnd::Below);
        assert_eq!(auth_err(open.open(&forged.seal(&TreeDown::Signal { signal: 9 }).unwrap())), AuthError::BadMac);
    }

    #[test]
    fn a_query_connection_is_keyed_by_its_nonce() {
        let key = ClusterKey::from_bytes([3; KEY_BYTES]);
        let (n1, n2) = ([1u8; 16], [2u8; 16]);
        let (mut asker, _) = LinkKey::of_query(&key, &n1).query_link(TreeEnd::Above);
        let (_, mut server) = LinkKey::of_query(&key, &n1).query_link(TreeEnd::Below);
        let f = asker.seal(&TreeDown::Signal { signal: 15 }).unwrap();
        assert_eq!(server.open::<TreeDown>(&f).unwrap(), TreeDown::Signal { signal: 15 });
        assert_eq!(auth_err(server.open(&f)), AuthError::Sequence { expected: 2, got: 1 });
        let (_, mut other) = LinkKey::of_query(&key, &n2).query_link(TreeEnd::Below);
        assert_eq!(auth_err(other.open(&f)), AuthError::BadMac);
        // Never mistaken for a tree connection's frame.
        let (_, mut tree) = LinkKey::of_query(&key, &n1).link(0, TreeEnd::Below);
        assert_eq!(auth_err(tree.open(&f)), AuthError::BadMac);
    }
}
