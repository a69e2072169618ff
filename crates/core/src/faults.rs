//! Node event scripts: what `berth events --script` records and `berth faults replay` feeds
//! back into a running system, and what `berth faults random` generates for tests (single
//! nodes, adjacent groups, unrelated nodes, as the ALPS team's event generator did).
//!
//! One event per line: `SECONDS ACTION NODES [REASON...]`, where SECONDS is the offset from
//! the script's start, ACTION is `down` or `up`, NODES a comma-separated list; `#` starts a
//! comment line.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeAction {
    Down,
    Up,
}

impl NodeAction {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeAction::Down => "down",
            NodeAction::Up => "up",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ScriptEvent {
    /// Seconds from the start of the script.
    pub at: f64,
    pub action: NodeAction,
    pub nodes: Vec<String>,
    pub reason: String,
}

impl fmt::Display for ScriptEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.3} {} {}", self.at, self.action.as_str(), self.nodes.join(","))?;
        if !self.reason.is_empty() {
            write!(f, " {}", self.reason)?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("event script line {line}: {message}")]
pub struct ScriptError {
    pub line: usize,
    pub message: String,
}

/// Read a script; events come back sorted by time (stable for equal times).
pub fn parse_script(text: &str) -> Result<Vec<ScriptEvent>, ScriptError> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let err = |message: String| ScriptError { line: i + 1, message };
        let mut words = line.splitn(4, char::is_whitespace).filter(|w| !w.is_empty());
        let (Some(at), Some(action), Some(nodes)) = (words.next(), words.next(), words.next()) else {
            return Err(err(format!("{line:?}: write `SECONDS down|up NODE[,NODE...] [REASON]`")));
        };
        let at: f64 = at
            .parse()
            .ok()
            .filter(|t: &f64| t.is_finite() && *t >= 0.0 && *t < 1e9)
            .ok_or_else(|| err(format!("{at:?} is not a time in seconds from the start")))?;
        let action = match action {
            "down" => NodeAction::Down,
            "up" => NodeAction::Up,
            other => return Err(err(format!("unknown action {other:?}; use down or up"))),
        };
        let nodes: Vec<String> = nodes.split(',').filter(|n| !n.is_empty()).map(String::from).collect();
        if nodes.is_empty() || nodes.iter().any(|n| !crate::directives::valid_name(n)) {
            return Err(err(format!("{line:?} names no valid node")));
        }
        let reason = words.next().unwrap_or("").trim().to_string();
        out.push(ScriptEvent { at, action, nodes, reason });
    }
    out.sort_by(|a, b| a.at.total_cmp(&b.at));
    Ok(out)
}

/// Write a script that `parse_script` reads back.
pub fn format_script(events: &[ScriptEvent]) -> String {
    let mut s = String::from("# berth node event script: SECONDS down|up NODE[,NODE...] [REASON]\n");
    for e in events {
        s.push_str(&e.to_string());
        s.push('\n');
    }
    s
}

/// Which nodes fail together in a generated script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultMode {
    /// One node at a time.
    Single,
    /// `group` nodes next to each other (a blade, a cabinet).
    Adjacent,
    /// `group` nodes chosen apart from each other.
    Unrelated,
}

/// A `--mode` of random faults that is none of the three.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown mode {0:?}; use single, adjacent or unrelated")]
pub struct UnknownFaultMode(pub String);

impl std::str::FromStr for FaultMode {
    type Err = UnknownFaultMode;
    fn from_str(s: &str) -> Result<Self, UnknownFaultMode> {
        match s {
            "single" => Ok(FaultMode::Single),
            "adjacent" => Ok(FaultMode::Adjacent),
            "unrelated" => Ok(FaultMode::Unrelated),
            _ => Err(UnknownFaultMode(s.to_string())),
        }
    }
}

/// What to generate: `count` failures every `interval` seconds, each node back `downtime`
/// seconds later.
#[derive(Debug, Clone)]
pub struct RandomFaults {
    pub seed: u64,
    pub count: usize,
    pub mode: FaultMode,
    pub group: usize,
    pub interval: f64,
    pub downtime: f64,
}

/// A reproducible random script over `nodes` (in their physical order).
pub fn random_script(nodes: &[String], spec: &RandomFaults) -> Vec<ScriptEvent> {
    let mut rng = SplitMix(spec.seed);
    let mut out = Vec::new();
    if nodes.is_empty() {
        return out;
    }
    let group = match spec.mode {
        FaultMode::Single => 1,
        _ => spec.group.clamp(1, nodes.len()),
    };
    for i in 0..spec.count {
        let picked: Vec<String> = match spec.mode {
            FaultMode::Single => vec![nodes[rng.below(nodes.len())].clone()],
            FaultMode::Adjacent => {
                let first = rng.below(nodes.len() - group + 1);
                nodes[first..first + group].to_vec()
            }
            FaultMode::Unrelated => {
                unrelated(nodes.len(), group, &mut rng).into_iter().map(|k| nodes[k].clone()).collect()
            }
        };
        let at = i as f64 * spec.interval;
        let mode = format!(
            "random {}",
            match spec.mode {
                FaultMode::Single => "single",
                FaultMode::Adjacent => "adjacent",
                FaultMode::Unrelated => "unrelated",
            }
        );
        out.push(ScriptEvent { at, action: NodeAction::Down, nodes: picked.clone(), reason: mode });
        out.push(ScriptEvent { at: at + spec.downtime, action: NodeAction::Up, nodes: picked, reason: String::new() });
    }
    out.sort_by(|a, b| a.at.total_cmp(&b.at));
    out
}

/// `k` distinct indexes below `n`, no two neighbours when there is room for that.
fn unrelated(n: usize, k: usize, rng: &mut SplitMix) -> Vec<usize> {
    let spaced = n >= 2 * k - 1;
    let mut picked: Vec<usize> = Vec::with_capacity(k);
    // Bounded: a few tries per pick, then any free index.
    while picked.len() < k {
        let mut tries = 0;
        let idx = loop {
            let c = rng.below(n);
            let taken = picked.contains(&c);
            let near = spaced && picked.iter().any(|&p| p.abs_diff(c) == 1);
            if !taken && (!near || tries > 64) {
                break Some(c);
            }
            tries += 1;
            if tries > 128 {
                break (0..n).find(|c| !picked.contains(c));
            }
        };
        match idx {
            Some(c) => picked.push(c),
            None => break,
        }
    }
    picked.sort_unstable();
    picked
}

/// SplitMix64: small, seedable, good enough to pick nodes.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_modes_parse_and_an_unknown_one_is_named() {
        assert_eq!("adjacent".parse::<FaultMode>(), Ok(FaultMode::Adjacent));
        let e = "blade".parse::<FaultMode>().unwrap_err();
        assert_eq!(e, UnknownFaultMode("blade".into()));
        assert_eq!(e.to_string(), "unknown mode \"blade\"; use single, adjacent or unrelated");
    }

    fn nodes(n: usize) -> Vec<String> {
        (1..=n).map(|i| format!("node{i}")).collect()
    }

    #[test]
    fn scripts_round_trip_and_sort_by_time() {
        let text = "# comment\n2.5 up node1\n0 down node1,node2 disk errors on the blade\n\n";
        let events = parse_script(text).unwrap();
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].action, NodeAction::Down);
        assert_eq!(events[0].nodes, vec!["node1", "node2"]);
        assert_eq!(events[0].reason, "disk errors on the blade");
        assert_eq!(events[1].at, 2.5);
        assert_eq!(parse_script(&format_script(&events)).unwrap(), events);
    }

    #[test]
    fn bad_lines_say_which_and_how_to_write_them() {
        for (text, want) in [
            ("1 down", "write `SECONDS"),
            ("x down node1", "not a time"),
            ("-1 down node1", "not a time"),
            ("1 reboot node1", "unknown action"),
            ("1 down ,", "no valid node"),
            ("1 down no/de", "no valid node"),
        ] {
            let e = parse_script(&format!("# c\n{text}\n")).unwrap_err();
            assert_eq!(e.line, 2, "{text}");
            assert!(e.to_string().contains(want), "{text}: {e}");
        }
    }

    #[test]
    fn random_scripts_are_reproducible_and_follow_their_mode() {
        let all = nodes(16);
        let spec = |mode, seed| RandomFaults { seed, count: 50, mode, group: 3, interval: 10.0, downtime: 5.0 };
        for mode in [FaultMode::Single, FaultMode::Adjacent, FaultMode::Unrelated] {
            let a = random_script(&all, &spec(mode, 1));
            assert_eq!(a, random_script(&all, &spec(mode, 1)), "same seed, same script");
            assert_ne!(a, random_script(&all, &spec(mode, 2)), "another seed, another script");
            let downs: Vec<&ScriptEvent> = a.iter().filter(|e| e.action == NodeAction::Down).collect();
            assert_eq!(downs.len(), 50);
            assert_eq!(a.iter().filter(|e| e.action == NodeAction::Up).count(), 50);
            for d in downs {
                let idx: Vec<usize> = d.nodes.iter().map(|n| n[4..].parse::<usize>().unwrap()).collect();
                match mode {
                    FaultMode::Single => assert_eq!(idx.len(), 1),
                    FaultMode::Adjacent => {
                        assert_eq!(idx.len(), 3);
                        assert!(idx.windows(2).all(|w| w[1] == w[0] + 1), "{idx:?}");
                    }
                    FaultMode::Unrelated => {
                        assert_eq!(idx.len(), 3);
                        assert!(idx.windows(2).all(|w| w[1] > w[0] + 1), "{idx:?}");
                    }
                }
                // Every down is followed by the same nodes' up, downtime later.
                assert!(a.iter().any(|u| u.action == NodeAction::Up && u.nodes == d.nodes && u.at == d.at + 5.0));
            }
        }
        // Groups larger than the machine shrink to it; nothing to pick from gives nothing.
        let small = random_script(&nodes(2), &spec(FaultMode::Unrelated, 3));
        assert!(small.iter().all(|e| e.nodes.len() == 2));
        assert!(random_script(&[], &spec(FaultMode::Single, 3)).is_empty());
    }
}
