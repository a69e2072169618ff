//! `berth up --netns`: each local agent in its own network namespace, joined by a bridge,
//! so agents have distinct addresses and a test can cut one agent's link (`ip link down`).
//!
//! Layout for cluster id `ID` (8 hex digits): bridge `bbID` with 10.213.K.1/24 in the host
//! namespace (the controller listens there), namespace `berth-ID-nodeI` with veth `bnIDI`
//! at 10.213.K.(I+1), its peer `bvIDI` on the bridge. K is derived from the id.

use anyhow::{bail, Context, Result};
use std::process::Command;

pub struct NetLayout {
    pub id: String,
    pub agents: usize,
    octet: u32,
}

impl NetLayout {
    pub fn new(id: &str, agents: usize) -> NetLayout {
        let octet = u32::from_str_radix(id, 16).unwrap_or(0) % 200 + 20;
        NetLayout { id: id.to_string(), agents, octet }
    }
    pub fn bridge(&self) -> String {
        format!("bb{}", self.id)
    }
    pub fn host_ip(&self) -> String {
        format!("10.213.{}.1", self.octet)
    }
    pub fn namespace(&self, i: usize) -> String {
        format!("berth-{}-node{i}", self.id)
    }
    pub fn agent_ip(&self, i: usize) -> String {
        format!("10.213.{}.{}", self.octet, i + 1)
    }
    /// The agent's veth inside its namespace (for `ip -n NS link set DEV down`).
    pub fn agent_dev(&self, i: usize) -> String {
        format!("bn{}{i}", self.id)
    }
    fn host_dev(&self, i: usize) -> String {
        format!("bv{}{i}", self.id)
    }

    /// Create the bridge and the namespaces (idempotent: existing pieces are kept).
    pub fn setup(&self) -> Result<()> {
        if self.agents > 60 {
            bail!("--netns supports at most 60 agents");
        }
        let br = self.bridge();
        if !exists_link(&br) {
            ip(&["link", "add", &br, "type", "bridge"])?;
            ip(&["addr", "add", &format!("{}/24", self.host_ip()), "dev", &br])?;
        }
        ip(&["link", "set", &br, "up"])?;
        for i in 1..=self.agents {
            let ns = self.namespace(i);
            if std::path::Path::new("/var/run/netns").join(&ns).exists() {
                continue;
            }
            let (hd, ad) = (self.host_dev(i), self.agent_dev(i));
            ip(&["netns", "add", &ns])?;
            ip(&["link", "add", &hd, "type", "veth", "peer", "name", &ad])?;
            ip(&["link", "set", &ad, "netns", &ns])?;
            ip(&["link", "set", &hd, "master", &br])?;
            ip(&["link", "set", &hd, "up"])?;
            ip(&["-n", &ns, "addr", "add", &format!("{}/24", self.agent_ip(i)), "dev", &ad])?;
            ip(&["-n", &ns, "link", "set", &ad, "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(())
    }

    /// Remove the namespaces (their veths go with them) and the bridge.
    pub fn teardown(&self) {
        for i in 1..=self.agents {
            let ns = self.namespace(i);
            if std::path::Path::new("/var/run/netns").join(&ns).exists() {
                let _ = ip(&["netns", "del", &ns]);
            }
            let hd = self.host_dev(i);
            if exists_link(&hd) {
                let _ = ip(&["link", "del", &hd]);
            }
        }
        if exists_link(&self.bridge()) {
            let _ = ip(&["link", "del", &self.bridge()]);
        }
    }
}

fn exists_link(name: &str) -> bool {
    std::path::Path::new("/sys/class/net").join(name).exists()
}

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip").args(args).output().context("cannot run `ip` (install iproute2)")?;
    if !out.status.success() {
        bail!("ip {} failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}
