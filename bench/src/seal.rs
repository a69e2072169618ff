//! `berth-bench seal [N] [--json]`: the cost of one sealed controller-to-agent order, without
//! the network: `write_sealed` of a typical job launch into a buffer, then `read_sealed` of it
//! (MAC checked, message decoded), N times (default 100,000), as the controller's writer and
//! the agent's reader do for every launch. Prints nanoseconds per message (median of 5 runs of
//! N/5) and the frame's size.

use anyhow::{bail, Context, Result};
use berth_protocol::agent::{ControllerMessage, LaunchSpec};
use berth_protocol::auth::{read_sealed, session, write_sealed, ClusterKey, Role, KEY_BYTES};
use std::time::Instant;

/// A launch as a typical batch job gets it: the submitter's environment (~40 variables, ~2.5
/// KB), a short script, one node's allocation.
fn typical_launch() -> Result<ControllerMessage> {
    let mut env: Vec<(String, String)> = vec![
        ("PATH".into(), "/home/alice/.local/bin:/opt/openmpi/4.1/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()),
        ("HOME".into(), "/home/alice".into()),
        ("SHELL".into(), "/bin/bash".into()),
        ("LANG".into(), "en_US.UTF-8".into()),
        ("LD_LIBRARY_PATH".into(), "/opt/openmpi/4.1/lib:/opt/intel/oneapi/mkl/latest/lib/intel64".into()),
        ("MODULEPATH".into(), "/etc/modulefiles:/usr/share/modulefiles:/opt/modulefiles/Linux:/opt/modulefiles/Core".into()),
        ("LS_COLORS".into(), "rs=0:di=01;34:ln=01;36:mh=00:pi=40;33:so=01;35:do=01;35:bd=40;33;01:cd=40;33;01:or=40;31;01:mi=00:su=37;41:sg=30;43:ca=30;41:tw=30;42:ow=34;42:st=37;44:ex=01;32".into()),
        ("PWD".into(), "/home/alice/runs/case-17".into()),
        ("BERTH_SOCKET".into(), "/run/berth/berth.sock".into()),
    ];
    for i in 0..32 {
        env.push((format!("APP_SETTING_{i}"), format!("value-{i}-{}", "x".repeat(i % 24))));
    }
    let spec = serde_json::json!({
        "id": 123456, "name": "case-17", "user": {"uid": 1000, "gid": 1000, "groups": [10, 100], "name": "alice"},
        "env": env, "cwd": "/home/alice/runs/case-17",
        "script": "#!/bin/bash\n#BERTH --nodes 1 --cores 16\nmodule load openmpi\nsrun ./solver --input case.in --steps 1000\n",
        "stdout": "/home/alice/runs/case-17/berth-123456.out", "stderr": "/home/alice/runs/case-17/berth-123456.err",
        "allocation": {"node_id": 3, "node": "node004", "cpus": "0-15", "cores": 16, "mems": "0", "memory_bytes": 68719476736u64},
        "nodes": [["node004", 16]], "walltime_seconds": 3600, "addresses": ["10.0.0.4:7070"], "kill_grace_ms": 10000
    });
    let spec: LaunchSpec = serde_json::from_value(spec).context("the sample launch")?;
    Ok(ControllerMessage::Launch(Box::new(spec)))
}

pub async fn run(args: &[String]) -> Result<()> {
    let json = args.iter().any(|a| a == "--json");
    let n: usize = match args.iter().find(|a| !a.starts_with("--")) {
        Some(s) => s.parse().context("N")?,
        None => 100_000,
    };
    let msg = typical_launch()?;
    let key = ClusterKey::from_bytes([7; KEY_BYTES]);
    let (mut sealer, _) = session(&key, &[1; 16], &[2; 16], Role::Controller);
    let (_, mut opener) = session(&key, &[1; 16], &[2; 16], Role::Agent);
    let mut frame_bytes = 0;
    let rounds = 5;
    let per = (n / rounds).max(1);
    let mut runs = Vec::new();
    for _ in 0..rounds {
        let t0 = Instant::now();
        for _ in 0..per {
            let mut buf: Vec<u8> = Vec::new();
            write_sealed(&mut buf, &mut sealer, &msg).await?;
            frame_bytes = buf.len();
            let mut rd: &[u8] = &buf;
            match read_sealed::<_, ControllerMessage>(&mut rd, &mut opener).await? {
                Some(ControllerMessage::Launch(s)) if s.id.0 == 123456 => {}
                other => bail!("the frame did not open to the launch: {other:?}"),
            }
        }
        runs.push(t0.elapsed().as_nanos() as f64 / per as f64);
    }
    runs.sort_by(f64::total_cmp);
    let median = runs[rounds / 2];
    if json {
        println!(
            "{}",
            serde_json::json!({"bench": "seal", "n": per * rounds, "frame_bytes": frame_bytes, "ns_per_message": median, "runs_ns": runs})
        );
    } else {
        println!(
            "seal+open of a {frame_bytes}-byte launch frame: {:.2} µs per message (median of {rounds} runs of {per}; runs {:?} ns)",
            median / 1000.0,
            runs.iter().map(|r| r.round() as u64).collect::<Vec<_>>()
        );
    }
    Ok(())
}
