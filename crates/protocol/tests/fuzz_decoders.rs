//! Fuzz tests of the protocol's decoders: frames from arbitrary bytes, byte streams read
//! frame by frame, valid messages with random edits, the HTTP API's bodies, and round trips
//! of every message berth builds. Generators are in `berth_protocol::fuzz` (feature
//! `fuzzing`), shared with `berth-bench fuzz`. `BERTH_FUZZ_CASES=100000 cargo test -p
//! berth-protocol --test fuzz_decoders` runs more cases.

use berth_core::fuzz::{cases, run, Target};
use berth_protocol::fuzz::{self, roundtrip};
use proptest::prelude::*;

const CASES: u32 = 200;

fn target(name: &str) -> Target {
    fuzz::targets().into_iter().find(|t| t.name == name).unwrap_or_else(|| panic!("no fuzz target {name}"))
}

macro_rules! fuzz_tests {
    ($($test:ident => $name:literal,)*) => {
        $(
            #[test]
            fn $test() {
                run(&target($name), cases(CASES));
            }
        )*

        #[test]
        fn every_target_has_a_test() {
            let tested = [$($name),*];
            for t in fuzz::targets() {
                assert!(tested.contains(&t.name), "no test runs fuzz target {}", t.name);
            }
        }
    };
}

fuzz_tests! {
    frame_bytes => "protocol/frame_bytes",
    frame_stream => "protocol/frame_stream",
    json_mutation => "protocol/json_mutation",
    roundtrip_bytes => "protocol/roundtrip",
    http_bodies => "protocol/http_bodies",
    small_parsers => "protocol/small_parsers",
    auth => "protocol/auth",
}

// Typed round trips: every message berth builds reads back equal to itself.
proptest! {
    #![proptest_config(ProptestConfig { cases: cases(CASES / 4), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn client_request_roundtrip(m in fuzz::client_request()) {
        prop_assert_eq!(roundtrip(&m), m);
    }

    #[test]
    fn client_response_roundtrip(m in fuzz::client_response()) {
        prop_assert_eq!(roundtrip(&m), m);
    }

    #[test]
    fn agent_messages_roundtrip(a in fuzz::agent_message(), c in fuzz::controller_message()) {
        prop_assert_eq!(roundtrip(&a), a);
        prop_assert_eq!(roundtrip(&c), c);
    }

    #[test]
    fn signed_grants_verify_after_a_round_trip_and_not_after_an_edit(g in fuzz::step_grant(), edit in 0..4u8) {
        use berth_protocol::auth::{sign_grant, verify_grant, ClusterKey};
        let key = ClusterKey::from_bytes([9; 32]);
        let mut g = g;
        sign_grant(&key, &mut g, u64::MAX);
        let back = roundtrip(&g);
        prop_assert!(verify_grant(&key, &back, 0).is_ok());
        let mut edited = back.clone();
        match edit {
            0 => edited.step ^= 1,
            1 => edited.user.uid ^= 1,
            2 => edited.argv.push("x".into()),
            _ => edited.expires_ms -= 1,
        }
        prop_assert!(verify_grant(&key, &edited, 0).is_err());
        prop_assert!(verify_grant(&ClusterKey::from_bytes([8; 32]), &back, 0).is_err());
    }

    #[test]
    fn sealed_messages_are_written_once_and_open_to_themselves(c in fuzz::controller_message(), a in fuzz::agent_message()) {
        use berth_protocol::auth::{session, ClusterKey, Role};
        let key = ClusterKey::from_bytes([9; 32]);
        let (mut ctl_tx, mut ctl_rx) = session(&key, &[1; 16], &[2; 16], Role::Controller);
        let (mut agent_tx, mut agent_rx) = session(&key, &[1; 16], &[2; 16], Role::Agent);
        let (mut twin, _) = session(&key, &[1; 16], &[2; 16], Role::Controller);
        let down = ctl_tx.seal_frame(&c).unwrap();
        prop_assert_eq!(&down, &berth_protocol::frame::encode(&twin.seal(&c).unwrap()).unwrap());
        prop_assert_eq!(agent_rx.open_frame::<berth_protocol::agent::ControllerMessage>(&down[4..]).unwrap(), c);
        let up = agent_tx.seal_frame(&a).unwrap();
        prop_assert_eq!(ctl_rx.open_frame::<berth_protocol::agent::AgentMessage>(&up[4..]).unwrap(), a);
    }

    #[test]
    fn agent_query_and_reply_roundtrip(q in fuzz::agent_query(), r in fuzz::agent_reply()) {
        prop_assert_eq!(roundtrip(&q), q);
        prop_assert_eq!(roundtrip(&r), r);
    }

    #[test]
    fn tree_and_task_roundtrip(d in fuzz::tree_down(), u in fuzz::tree_up(), q in fuzz::task_request(), r in fuzz::task_reply()) {
        prop_assert_eq!(roundtrip(&d), d);
        prop_assert_eq!(roundtrip(&u), u);
        prop_assert_eq!(roundtrip(&q), q);
        prop_assert_eq!(roundtrip(&r), r);
    }

    #[test]
    fn http_bodies_roundtrip(r in fuzz::reserve_request(), c in fuzz::confirm_request(), e in fuzz::reservation_error()) {
        let r2: berth_protocol::reservation::ReserveRequest = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        prop_assert_eq!(r2, r);
        let c2: berth_protocol::reservation::ConfirmRequest = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
        prop_assert_eq!(c2, c);
        let body = berth_protocol::reservation::ErrorBody { error: e };
        let e2: berth_protocol::reservation::ErrorBody = serde_json::from_str(&serde_json::to_string(&body).unwrap()).unwrap();
        prop_assert_eq!(e2, body);
    }
}

// Regression tests: the exact inputs the fuzzers failed on (see RELIABILITY.md, "Fuzzing").

/// serde_json's default float parser is not exact: 9744558203.308609 came back as
/// ...308607. Floats (Unix times, fair-share figures) must cross a frame unchanged.
#[test]
fn regression_floats_cross_a_frame_exactly() {
    use berth_core::sched::fairshare::ShareLine;
    use berth_protocol::client::ClientResponse;
    let line =
        ShareLine { account: String::new(), share: 0.0, usage: 0.0, usage_fraction: 9744558203.308609, factor: 0.0 };
    let m = ClientResponse::Share { half_life_secs: 0.0, accounts: vec![line] };
    assert_eq!(roundtrip(&m), m);
    for x in [9744558203.308609, 1712345678.123456, 0.1 + 0.2, f64::MAX, f64::MIN_POSITIVE, 5e-324] {
        let m = ClientResponse::Share { half_life_secs: x, accounts: vec![] };
        assert_eq!(roundtrip(&m), m, "{x}");
    }
}
