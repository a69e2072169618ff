//! Core binding strategies, after Grid Engine's `-binding` (seeds/004): which cores of a node
//! a job gets, named by a strategy the user chooses.
//!
//! Cores are named as Grid Engine names them: `<socket>,<core>` with both counted from 0, the
//! core counted among its socket's cores; or by a global logical core number (the core's
//! index in [`Topology::cores`]). Unlike Grid Engine, berth's scheduler applies the strategy
//! to the cores that are free when it places the job, so bindings never collide.

use crate::topology::Topology;
use serde::{Deserialize, Serialize};
use std::fmt;

/// A core named by its global logical number or by `<socket>,<core>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CoreRef {
    Global(u32),
    Socket(u32, u32),
}

/// A binding strategy (the part after `--binding`, without the mode).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "strategy")]
pub enum BindingStrategy {
    /// `linear:<amount>` or `linear:<amount>:[<socket>,]<core>`.
    Linear { amount: u32, start: Option<CoreRef> },
    /// `striding:<first>-<last>:<step>` or `striding:<s>,<c>-<s>,<c>:<step>`.
    StridingRange { first: CoreRef, last: CoreRef, step: u32 },
    /// `striding:<amount>:<step>`.
    StridingCount { amount: u32, step: u32 },
    /// `explicit:<s>,<c>:<s>,<c>...`.
    Explicit { cores: Vec<(u32, u32)> },
}

/// What berth does with the bound cores on the node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BindingMode {
    /// Enforced: the job's cpuset (and its processes' affinity) is exactly those cores.
    #[default]
    Set,
    /// `BERTH_BINDING` in the job's environment lists the cores (OMP_PLACES syntax).
    Env,
    /// A rankfile with host, socket and core per rank (`BERTH_RANKFILE`).
    Pe,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Binding {
    pub strategy: BindingStrategy,
    #[serde(default)]
    pub mode: BindingMode,
}

/// Why a strategy gives no cores on a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BindMiss {
    /// The cores exist but some are taken now; the message names them.
    Busy(BindBusy),
    /// The strategy names cores this topology does not have (or too many).
    Never(BindNever),
}

/// Which cores a strategy wants are taken now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BindBusy {
    /// `linear:<amount>`: no run of `amount` free cores; `free` of the node's `cores` are free.
    NoRun { amount: usize, free: usize, cores: usize },
    /// `striding:<amount>:<step>`: no such free cores `step` apart.
    NoStride { amount: usize, step: usize, free: usize, cores: usize },
    /// The named cores in use (global numbers), grouped by socket in order.
    InUse { groups: Vec<(usize, Vec<usize>)> },
}

impl fmt::Display for BindBusy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BindBusy::NoRun { amount, free, cores } => {
                write!(f, "no {amount} successive cores are free ({free} of {cores} cores are)")
            }
            BindBusy::NoStride { amount, step, free, cores } => {
                write!(f, "no {amount} free cores {step} apart ({free} of {cores} cores are free)")
            }
            BindBusy::InUse { groups } => {
                // "cores 0,2 (socket 0) and 5 (socket 1) are in use".
                let busy: usize = groups.iter().map(|(_, list)| list.len()).sum();
                let parts: Vec<String> = groups
                    .iter()
                    .map(|(s, list)| {
                        let list: Vec<String> = list.iter().map(ToString::to_string).collect();
                        format!("{} (socket {s})", list.join(","))
                    })
                    .collect();
                let (noun, verb) = if busy == 1 { ("core", "is") } else { ("cores", "are") };
                write!(f, "{noun} {} {verb} in use", parts.join(" and "))
            }
        }
    }
}

/// A strategy this node can never satisfy, with the node's size so the user sees what it offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindNever {
    pub problem: BindProblem,
    /// Cores per socket (package), in order.
    pub per_socket: Vec<usize>,
    /// Cores in all.
    pub cores: usize,
}

impl fmt::Display for BindNever {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let plural = |n: usize, word: &str| format!("{n} {word}{}", if n == 1 { "" } else { "s" });
        let per = &self.per_socket;
        let sockets = plural(per.len(), "socket");
        let shape = match per.first() {
            Some(&c) if per.iter().all(|&x| x == c) => format!("{sockets} of {}", plural(c, "core")),
            _ => format!("{sockets} and {}", plural(self.cores, "core")),
        };
        write!(f, "{}: this node has {shape}", self.problem)
    }
}

/// What a strategy asks that a node's topology does not have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BindProblem {
    /// A zero amount or step (only from hand-made values).
    NoCores(BindingStrategy),
    LinearTooMany {
        amount: usize,
    },
    LinearPast {
        amount: u32,
        start: CoreRef,
        first: usize,
        last: usize,
    },
    StridingEmpty {
        first: CoreRef,
        last: CoreRef,
        step: u32,
    },
    /// `striding:<amount>:<step>` spanning `span` cores, more than the node has.
    StridingSpan {
        amount: usize,
        step: usize,
        span: u128,
    },
    ExplicitTwice,
    NoCore(u32),
    NoSocket(u32),
    NoSocketCore {
        socket: u32,
        core: u32,
    },
}

impl fmt::Display for BindProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BindProblem::NoCores(strategy) => write!(f, "{strategy} asks for no cores"),
            BindProblem::LinearTooMany { amount } => write!(f, "linear:{amount} asks for {amount} cores"),
            BindProblem::LinearPast { amount, start, first, last } => {
                write!(f, "linear:{amount}:{start} needs cores {first}-{last}")
            }
            BindProblem::StridingEmpty { first, last, step } => {
                write!(f, "striding:{first}-{last}:{step} names no cores")
            }
            BindProblem::StridingSpan { amount, step, span } => {
                write!(f, "striding:{amount}:{step} spans {span} cores")
            }
            BindProblem::ExplicitTwice => f.write_str("explicit names a core twice"),
            BindProblem::NoCore(g) => write!(f, "core {g} does not exist"),
            BindProblem::NoSocket(s) => write!(f, "socket {s} does not exist"),
            BindProblem::NoSocketCore { socket, core } => write!(f, "core {core} of socket {socket} does not exist"),
        }
    }
}

impl fmt::Display for BindMiss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BindMiss::Busy(b) => b.fmt(f),
            BindMiss::Never(n) => n.fmt(f),
        }
    }
}

impl BindingStrategy {
    /// The number of cores the strategy asks for when that does not depend on the topology
    /// (linear, striding:<amount>, explicit); None for ranges.
    pub fn fixed_count(&self) -> Option<u32> {
        match self {
            BindingStrategy::Linear { amount, .. } | BindingStrategy::StridingCount { amount, .. } => Some(*amount),
            BindingStrategy::StridingRange { .. } => None,
            BindingStrategy::Explicit { cores } => Some(cores.len() as u32),
        }
    }

    /// The cores (indexes into `topo.cores`, increasing) the strategy takes on `topo` when
    /// `usable[i]` says which cores may be taken now. Never returns a core that is not usable.
    ///
    /// `Never` means no amount of waiting helps (the cores do not exist), so the scheduler can
    /// skip the node for good; `Busy` means the job fits this node once cores are released.
    pub fn select(&self, topo: &Topology, usable: &[bool]) -> Result<Vec<usize>, BindMiss> {
        let n = topo.cores.len();
        // A short `usable` must not panic: missing entries count as taken.
        let free = |i: usize| usable.get(i).copied().unwrap_or(false);
        let free_count = (0..n).filter(|&i| free(i)).count();
        // Zero amounts or steps only come from hand-made values (the parser rejects them).
        let empty = match self {
            BindingStrategy::Linear { amount, .. } => *amount == 0,
            BindingStrategy::StridingRange { step, .. } => *step == 0,
            BindingStrategy::StridingCount { amount, step } => *amount == 0 || *step == 0,
            BindingStrategy::Explicit { cores } => cores.is_empty(),
        };
        if empty {
            return Err(never(topo, BindProblem::NoCores(self.clone())));
        }
        match self {
            BindingStrategy::Linear { amount, start: None } => {
                let amount = *amount as usize;
                if amount > n {
                    return Err(never(topo, BindProblem::LinearTooMany { amount }));
                }
                linear_any(topo, amount, &free).ok_or(BindMiss::Busy(BindBusy::NoRun {
                    amount,
                    free: free_count,
                    cores: n,
                }))
            }
            BindingStrategy::Linear { amount, start: Some(start) } => {
                let first = resolve(topo, *start)?;
                let end = first.saturating_add(*amount as usize);
                if end > n {
                    let last = end.saturating_sub(1);
                    return Err(never(topo, BindProblem::LinearPast { amount: *amount, start: *start, first, last }));
                }
                take(topo, (first..end).collect(), &free)
            }
            BindingStrategy::StridingRange { first, last, step } => {
                let (a, b) = (resolve(topo, *first)?, resolve(topo, *last)?);
                if a > b {
                    return Err(never(topo, BindProblem::StridingEmpty { first: *first, last: *last, step: *step }));
                }
                take(topo, (a..=b).step_by(*step as usize).collect(), &free)
            }
            BindingStrategy::StridingCount { amount, step } => {
                let (amount, step) = (*amount as usize, *step as usize);
                // Widened so that huge amounts or steps cannot overflow.
                let span = (amount as u128 - 1) * step as u128;
                if span >= n as u128 {
                    return Err(never(topo, BindProblem::StridingSpan { amount, step, span: span + 1 }));
                }
                let picks = |s: usize| (0..amount).map(move |k| s + k * step);
                (0..n - span as usize)
                    .find(|&s| picks(s).all(&free))
                    .map(|s| picks(s).collect())
                    .ok_or(BindMiss::Busy(BindBusy::NoStride { amount, step, free: free_count, cores: n }))
            }
            BindingStrategy::Explicit { cores } => {
                let mut picked =
                    cores.iter().map(|&(s, c)| resolve(topo, CoreRef::Socket(s, c))).collect::<Result<Vec<_>, _>>()?;
                picked.sort_unstable();
                if picked.windows(2).any(|w| w[0] == w[1]) {
                    return Err(never(topo, BindProblem::ExplicitTwice));
                }
                take(topo, picked, &free)
            }
        }
    }
}

impl BindingStrategy {
    /// Every set of cores the strategy may take on `topo` now, `select`'s choice first, then
    /// the others in its order of preference, each once. Placement tries the others when the
    /// first has too little memory near it (a strategy picks cores, not memory).
    pub fn choices(&self, topo: &Topology, usable: &[bool]) -> Result<Vec<Vec<usize>>, BindMiss> {
        let first = self.select(topo, usable)?;
        let n = topo.cores.len();
        let free = |i: usize| usable.get(i).copied().unwrap_or(false);
        let mut out = vec![first];
        match *self {
            // `select` succeeded, so 0 < amount <= n and the span fits in n.
            BindingStrategy::Linear { amount, start: None } => {
                let amount = amount as usize;
                let mut sockets: Vec<Vec<usize>> = (0..topo.packages.len())
                    .map(|p| (0..n).filter(|&i| topo.cores[i].package == p).collect())
                    .collect();
                // As `linear_any`: empty sockets, then the fullest first, then across sockets.
                sockets.sort_by_key(|s| {
                    let count = s.iter().filter(|&&i| free(i)).count();
                    (count != s.len(), count)
                });
                sockets.push((0..n).collect());
                for s in &sockets {
                    out.extend(s.windows(amount).filter(|w| w.iter().all(|&i| free(i))).map(<[usize]>::to_vec));
                }
            }
            BindingStrategy::StridingCount { amount, step } => {
                let (amount, step) = (amount as usize, step as usize);
                let span = (amount - 1) * step;
                let picks = |s: usize| (0..amount).map(move |k| s + k * step);
                out.extend((0..n - span).filter(|&s| picks(s).all(free)).map(|s| picks(s).collect()));
            }
            _ => {}
        }
        let mut seen = std::collections::HashSet::new();
        out.retain(|c| seen.insert(c.clone()));
        Ok(out)
    }
}

/// `linear:<amount>` without a start: an empty socket first, then the fullest socket that
/// still has a run (so emptier sockets stay whole for later jobs), then a run across sockets.
fn linear_any(topo: &Topology, amount: usize, free: &dyn Fn(usize) -> bool) -> Option<Vec<usize>> {
    let sockets: Vec<Vec<usize>> = (0..topo.packages.len())
        .map(|p| (0..topo.cores.len()).filter(|&i| topo.cores[i].package == p).collect())
        .collect();
    if let Some(s) = sockets.iter().find(|s| s.len() >= amount && s.iter().all(|&i| free(i))) {
        return Some(s[..amount].to_vec());
    }
    // min_by_key keeps the first of equal keys, so ties go to the lowest socket.
    let best = sockets
        .iter()
        .filter_map(|s| first_run(s, amount, free).map(|run| (s.iter().filter(|&&i| free(i)).count(), run)))
        .min_by_key(|(count, _)| *count);
    if let Some((_, run)) = best {
        return Some(run);
    }
    first_run(&(0..topo.cores.len()).collect::<Vec<_>>(), amount, free)
}

/// The first `amount` successive entries of `list` that are all free.
fn first_run(list: &[usize], amount: usize, free: &dyn Fn(usize) -> bool) -> Option<Vec<usize>> {
    if amount == 0 {
        return None;
    }
    list.windows(amount).find(|w| w.iter().all(|&i| free(i))).map(<[usize]>::to_vec)
}

/// All of `picked` (increasing), or `Busy` naming the ones in use.
fn take(topo: &Topology, picked: Vec<usize>, free: &dyn Fn(usize) -> bool) -> Result<Vec<usize>, BindMiss> {
    let busy: Vec<usize> = picked.iter().copied().filter(|&i| !free(i)).collect();
    if busy.is_empty() {
        return Ok(picked);
    }
    // Group global core numbers by socket: "cores 0,2 (socket 0) and 5 (socket 1) are in use".
    let mut groups: Vec<(usize, Vec<usize>)> = Vec::new();
    for &i in &busy {
        let socket = topo.cores[i].package;
        match groups.last_mut() {
            Some((s, list)) if *s == socket => list.push(i),
            _ => groups.push((socket, vec![i])),
        }
    }
    Err(BindMiss::Busy(BindBusy::InUse { groups }))
}

/// The global index of `core` on `topo`, or `Never` saying what is missing.
fn resolve(topo: &Topology, core: CoreRef) -> Result<usize, BindMiss> {
    match core {
        CoreRef::Global(g) if (g as usize) < topo.cores.len() => Ok(g as usize),
        CoreRef::Global(g) => Err(never(topo, BindProblem::NoCore(g))),
        CoreRef::Socket(s, _) if s as usize >= topo.packages.len() => Err(never(topo, BindProblem::NoSocket(s))),
        CoreRef::Socket(s, c) => {
            topo.core_index(s, c).ok_or_else(|| never(topo, BindProblem::NoSocketCore { socket: s, core: c }))
        }
    }
}

/// `Never` with the node's size, so the user sees what the node offers.
fn never(topo: &Topology, problem: BindProblem) -> BindMiss {
    let per_socket: Vec<usize> =
        (0..topo.packages.len()).map(|p| topo.cores.iter().filter(|c| c.package == p).count()).collect();
    BindMiss::Never(BindNever { problem, per_socket, cores: topo.cores.len() })
}

/// The accepted forms, shown with every parse error.
const FORMS: &str = "expected linear:<n>[:[<socket>,]<core>], striding:<first>-<last>:<step>, \
     striding:<s>,<c>-<s>,<c>:<step>, striding:<n>:<step> or explicit:<s>,<c>[:<s>,<c>...]";

/// Why a binding or a binding mode cannot be read; the messages quote what was given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BindingParseError {
    /// `--binding`: what is wrong, followed by the accepted forms.
    #[error("bad binding {text:?}: {problem}; {FORMS}")]
    Strategy { text: String, problem: BindingSyntax },
    /// `--binding-mode`.
    #[error("unknown binding mode {0:?}: use set, env or pe")]
    Mode(String),
}

/// What is wrong in the text of a binding strategy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BindingSyntax {
    #[error("missing ':' after the strategy name")]
    MissingColon,
    #[error("empty {what}")]
    Empty { what: &'static str },
    #[error("{what} {text:?} is not a number")]
    NotANumber { what: &'static str, text: String },
    #[error("{what} {text} is too large")]
    TooLarge { what: &'static str, text: String },
    #[error("{what} must be at least 1")]
    Zero { what: &'static str },
    #[error("first core {first} comes after last core {last}")]
    Reversed { first: CoreRef, last: CoreRef },
    #[error("{0:?} is not a <socket>,<core> pair")]
    NotAPair(String),
    #[error("core {socket},{core} is named twice")]
    NamedTwice { socket: u32, core: u32 },
    #[error("wrong number of ':' fields for {0}")]
    FieldCount(String),
    #[error("unknown strategy {0:?}")]
    UnknownStrategy(String),
}

/// A decimal u32 made of digits only: no sign, no spaces, not empty.
fn number(s: &str, what: &'static str) -> Result<u32, BindingSyntax> {
    if s.is_empty() {
        return Err(BindingSyntax::Empty { what });
    }
    if !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(BindingSyntax::NotANumber { what, text: s.into() });
    }
    s.parse().map_err(|_| BindingSyntax::TooLarge { what, text: s.into() })
}

fn positive(s: &str, what: &'static str) -> Result<u32, BindingSyntax> {
    match number(s, what)? {
        0 => Err(BindingSyntax::Zero { what }),
        n => Ok(n),
    }
}

fn core_ref(s: &str) -> Result<CoreRef, BindingSyntax> {
    match s.split_once(',') {
        Some((socket, core)) => Ok(CoreRef::Socket(number(socket, "socket")?, number(core, "core")?)),
        None => Ok(CoreRef::Global(number(s, "core")?)),
    }
}

/// Whether a range from `a` to `b` can be non-empty; mixed forms depend on the topology.
fn ordered(a: CoreRef, b: CoreRef) -> bool {
    match (a, b) {
        (CoreRef::Global(x), CoreRef::Global(y)) => x <= y,
        (CoreRef::Socket(s, c), CoreRef::Socket(t, d)) => (s, c) <= (t, d),
        _ => true,
    }
}

fn parse(s: &str) -> Result<BindingStrategy, BindingSyntax> {
    let (kind, rest) = s.split_once(':').ok_or(BindingSyntax::MissingColon)?;
    let fields: Vec<&str> = rest.split(':').collect();
    match (kind, fields.as_slice()) {
        ("linear", [amount]) => Ok(BindingStrategy::Linear { amount: positive(amount, "amount")?, start: None }),
        ("linear", [amount, start]) => {
            Ok(BindingStrategy::Linear { amount: positive(amount, "amount")?, start: Some(core_ref(start)?) })
        }
        ("striding", [head, step]) => {
            let step = positive(step, "step")?;
            let Some((a, b)) = head.split_once('-') else {
                return Ok(BindingStrategy::StridingCount { amount: positive(head, "amount")?, step });
            };
            let (first, last) = (core_ref(a)?, core_ref(b)?);
            if !ordered(first, last) {
                return Err(BindingSyntax::Reversed { first, last });
            }
            Ok(BindingStrategy::StridingRange { first, last, step })
        }
        ("explicit", pairs) => {
            let mut cores: Vec<(u32, u32)> = Vec::with_capacity(pairs.len());
            let mut seen = std::collections::BTreeSet::new();
            for pair in pairs {
                let CoreRef::Socket(s, c) = core_ref(pair)? else {
                    return Err(BindingSyntax::NotAPair(pair.to_string()));
                };
                if !seen.insert((s, c)) {
                    return Err(BindingSyntax::NamedTwice { socket: s, core: c });
                }
                cores.push((s, c));
            }
            Ok(BindingStrategy::Explicit { cores })
        }
        ("linear" | "striding", _) => Err(BindingSyntax::FieldCount(kind.to_string())),
        _ => Err(BindingSyntax::UnknownStrategy(kind.to_string())),
    }
}

impl std::str::FromStr for BindingStrategy {
    type Err = BindingParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        parse(s).map_err(|problem| BindingParseError::Strategy { text: s.to_string(), problem })
    }
}

/// The canonical form, which `from_str` reads back to the same value.
impl fmt::Display for BindingStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BindingStrategy::Linear { amount, start: None } => write!(f, "linear:{amount}"),
            BindingStrategy::Linear { amount, start: Some(start) } => write!(f, "linear:{amount}:{start}"),
            BindingStrategy::StridingRange { first, last, step } => write!(f, "striding:{first}-{last}:{step}"),
            BindingStrategy::StridingCount { amount, step } => write!(f, "striding:{amount}:{step}"),
            BindingStrategy::Explicit { cores } => {
                f.write_str("explicit")?;
                cores.iter().try_for_each(|(s, c)| write!(f, ":{s},{c}"))
            }
        }
    }
}

impl std::str::FromStr for BindingMode {
    type Err = BindingParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "set" => Ok(BindingMode::Set),
            "env" => Ok(BindingMode::Env),
            "pe" => Ok(BindingMode::Pe),
            _ => Err(BindingParseError::Mode(s.to_string())),
        }
    }
}

impl fmt::Display for BindingMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BindingMode::Set => "set",
            BindingMode::Env => "env",
            BindingMode::Pe => "pe",
        })
    }
}

impl fmt::Display for CoreRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CoreRef::Global(n) => write!(f, "{n}"),
            CoreRef::Socket(s, c) => write!(f, "{s},{c}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use BindingStrategy::*;
    use CoreRef::{Global, Socket};

    fn parse(s: &str) -> BindingStrategy {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn select(s: &str, topo: &Topology, usable: &[bool]) -> Result<Vec<usize>, BindMiss> {
        parse(s).select(topo, usable)
    }

    /// SCCCCSCCCC with every core usable except `busy`.
    fn two_by_four(busy: &[usize]) -> (Topology, Vec<bool>) {
        let topo = Topology::uniform(2, 1, 4, 1, 0);
        let usable = (0..8).map(|i| !busy.contains(&i)).collect();
        (topo, usable)
    }

    fn never(r: Result<Vec<usize>, BindMiss>) -> String {
        match r {
            Err(BindMiss::Never(m)) => m.to_string(),
            other => panic!("expected Never, got {other:?}"),
        }
    }

    fn busy(r: Result<Vec<usize>, BindMiss>) -> String {
        match r {
            Err(BindMiss::Busy(m)) => m.to_string(),
            other => panic!("expected Busy, got {other:?}"),
        }
    }

    /// Each typed miss's words, exactly as the strings built before they were typed.
    #[test]
    fn every_bind_miss_keeps_its_words() {
        let never = |problem: BindProblem, per_socket: Vec<usize>| {
            let cores = per_socket.iter().sum();
            BindMiss::Never(BindNever { problem, per_socket, cores }).to_string()
        };
        let cases: Vec<(String, &str)> = vec![
            (
                never(BindProblem::NoCores(parse("linear:2")), vec![4, 4]),
                "linear:2 asks for no cores: this node has 2 sockets of 4 cores",
            ),
            (
                never(BindProblem::LinearTooMany { amount: 9 }, vec![1]),
                "linear:9 asks for 9 cores: this node has 1 socket of 1 core",
            ),
            (
                never(BindProblem::LinearPast { amount: 4, start: CoreRef::Global(6), first: 6, last: 9 }, vec![4, 2]),
                "linear:4:6 needs cores 6-9: this node has 2 sockets and 6 cores",
            ),
            (
                never(
                    BindProblem::StridingEmpty { first: CoreRef::Global(5), last: CoreRef::Global(1), step: 2 },
                    vec![4, 4],
                ),
                "striding:5-1:2 names no cores: this node has 2 sockets of 4 cores",
            ),
            (
                never(BindProblem::StridingSpan { amount: 5, step: 2, span: 9 }, vec![4, 4]),
                "striding:5:2 spans 9 cores: this node has 2 sockets of 4 cores",
            ),
            (
                never(BindProblem::ExplicitTwice, vec![4, 4]),
                "explicit names a core twice: this node has 2 sockets of 4 cores",
            ),
            (never(BindProblem::NoCore(9), vec![4, 4]), "core 9 does not exist: this node has 2 sockets of 4 cores"),
            (
                never(BindProblem::NoSocket(3), vec![4, 4]),
                "socket 3 does not exist: this node has 2 sockets of 4 cores",
            ),
            (
                never(BindProblem::NoSocketCore { socket: 1, core: 4 }, vec![4, 4]),
                "core 4 of socket 1 does not exist: this node has 2 sockets of 4 cores",
            ),
            (
                BindMiss::Busy(BindBusy::NoRun { amount: 3, free: 2, cores: 8 }).to_string(),
                "no 3 successive cores are free (2 of 8 cores are)",
            ),
            (
                BindMiss::Busy(BindBusy::NoStride { amount: 4, step: 2, free: 6, cores: 8 }).to_string(),
                "no 4 free cores 2 apart (6 of 8 cores are free)",
            ),
            (BindMiss::Busy(BindBusy::InUse { groups: vec![(1, vec![7])] }).to_string(), "core 7 (socket 1) is in use"),
            (
                BindMiss::Busy(BindBusy::InUse { groups: vec![(0, vec![0, 2]), (1, vec![5])] }).to_string(),
                "cores 0,2 (socket 0) and 5 (socket 1) are in use",
            ),
        ];
        for (got, want) in cases {
            assert_eq!(got, want);
        }
    }

    #[test]
    fn parses_and_prints_every_form() {
        let cases = [
            ("linear:3", Linear { amount: 3, start: None }),
            ("linear:2:5", Linear { amount: 2, start: Some(Global(5)) }),
            ("linear:2:1,0", Linear { amount: 2, start: Some(Socket(1, 0)) }),
            ("striding:0-3:2", StridingRange { first: Global(0), last: Global(3), step: 2 }),
            ("striding:0,1-1,2:3", StridingRange { first: Socket(0, 1), last: Socket(1, 2), step: 3 }),
            ("striding:4:2", StridingCount { amount: 4, step: 2 }),
            ("explicit:1,2:0,0", Explicit { cores: vec![(1, 2), (0, 0)] }),
        ];
        for (text, want) in cases {
            assert_eq!(parse(text), want);
            assert_eq!(want.to_string(), text);
        }
        assert_eq!(parse("  linear:007 \n").to_string(), "linear:7");
    }

    #[test]
    fn rejects_bad_forms() {
        let bad = concat!(
            "|linear|linear:|linear:0|linear:-1|linear:+2|linear:2:|linear:2:1,|linear:2:,1|linear:2:1,2,3",
            "|linear:2:0:0|linear: 2|linear:4294967296|Linear:2|linear:2x|packed:2|:|striding:3-1:1",
            "|striding:1,0-0,3:1|striding:0-3:0|striding:0-3|striding:0-3:1:1|striding:-1-3:1|striding:0:1",
            "|striding:a:1|explicit:|explicit:1|explicit:0,0:0,0|explicit:0,0:|explicit:0,0::1,1",
        );
        for text in bad.split('|') {
            let err = text.parse::<BindingStrategy>().expect_err(text).to_string();
            assert!(err.contains("expected linear:<n>"), "{text}: {err}");
        }
        let err = "striding:0-3:0".parse::<BindingStrategy>().unwrap_err();
        assert!(err.to_string().contains("step must be at least 1"), "{err}");
        let err = "explicit:0,0:0,0".parse::<BindingStrategy>().unwrap_err();
        assert_eq!(
            err,
            BindingParseError::Strategy {
                text: "explicit:0,0:0,0".into(),
                problem: BindingSyntax::NamedTwice { socket: 0, core: 0 }
            }
        );
        assert_eq!(
            err.to_string(),
            format!("bad binding \"explicit:0,0:0,0\": core 0,0 is named twice; {FORMS}"),
            "the message is what it was as a String"
        );
        assert_eq!(
            " packed:2 ".parse::<BindingStrategy>().unwrap_err().to_string(),
            format!("bad binding \"packed:2\": unknown strategy \"packed\"; {FORMS}")
        );
        assert_eq!(
            "bind".parse::<BindingMode>().unwrap_err().to_string(),
            "unknown binding mode \"bind\": use set, env or pe"
        );
    }

    #[test]
    fn fixed_counts() {
        assert_eq!(parse("linear:3:1").fixed_count(), Some(3));
        assert_eq!(parse("striding:4:2").fixed_count(), Some(4));
        assert_eq!(parse("explicit:0,0:1,1").fixed_count(), Some(2));
        assert_eq!(parse("striding:0-3:2").fixed_count(), None);
    }

    #[test]
    fn seed_example_4_linear_with_start() {
        let (topo, usable) = two_by_four(&[]);
        assert_eq!(select("linear:2:0,0", &topo, &usable), Ok(vec![0, 1]));
        assert_eq!(select("linear:2:1,0", &topo, &usable), Ok(vec![4, 5]));
    }

    #[test]
    fn seed_example_4_linear_twice_takes_both_sockets() {
        let (topo, mut usable) = two_by_four(&[]);
        let first = select("linear:2", &topo, &usable).unwrap();
        assert_eq!(first, vec![0, 1]);
        first.iter().for_each(|&i| usable[i] = false);
        assert_eq!(select("linear:2", &topo, &usable), Ok(vec![4, 5]));
    }

    #[test]
    fn seed_example_5_striding() {
        let topo = Topology::uniform(2, 1, 2, 1, 0);
        assert_eq!(select("striding:0-3:2", &topo, &[true; 4]), Ok(vec![0, 2]));
    }

    #[test]
    fn linear_best_fit_partly_occupied_socket() {
        // Socket 0 has 3 free cores (1-3), socket 1 no run of 2, socket 2 exactly 2 (10, 11).
        let topo = Topology::uniform(3, 1, 4, 1, 0);
        let usable: Vec<bool> = (0..12).map(|i| ![0, 4, 6, 8, 9].contains(&i)).collect();
        assert_eq!(select("linear:2", &topo, &usable), Ok(vec![10, 11]));
        assert_eq!(select("linear:3", &topo, &usable), Ok(vec![1, 2, 3]));
    }

    #[test]
    fn linear_falls_back_across_sockets() {
        let (topo, usable) = two_by_four(&[0, 1, 2, 5, 6, 7]);
        assert_eq!(select("linear:2", &topo, &usable), Ok(vec![3, 4]));
        assert!(busy(select("linear:3", &topo, &usable)).contains("no 3 successive cores are free"));
        assert!(never(select("linear:9", &topo, &usable)).contains("this node has 2 sockets of 4 cores"));
    }

    #[test]
    fn linear_with_start_busy_and_never() {
        let (topo, usable) = two_by_four(&[5]);
        assert_eq!(select("linear:3:0,3", &topo, &[true; 8]), Ok(vec![3, 4, 5]));
        assert_eq!(busy(select("linear:3:0,3", &topo, &usable)), "core 5 (socket 1) is in use");
        assert_eq!(
            never(select("linear:2:2,0", &topo, &usable)),
            "socket 2 does not exist: this node has 2 sockets of 4 cores"
        );
        assert!(never(select("linear:2:0,4", &topo, &usable)).starts_with("core 4 of socket 0 does not exist"));
        assert!(never(select("linear:4:6", &topo, &usable)).starts_with("linear:4:6 needs cores 6-9"));
    }

    #[test]
    fn striding_range_busy_and_never() {
        let (topo, usable) = two_by_four(&[0, 2, 5]);
        assert_eq!(select("striding:0,1-1,3:3", &topo, &[true; 8]), Ok(vec![1, 4, 7]));
        assert_eq!(busy(select("striding:0-7:1", &topo, &usable)), "cores 0,2 (socket 0) and 5 (socket 1) are in use");
        assert!(never(select("striding:0-9:2", &topo, &usable)).starts_with("core 9 does not exist"));
        let backwards = StridingRange { first: Socket(1, 0), last: Global(3), step: 1 };
        assert!(never(backwards.select(&topo, &usable)).contains("names no cores"));
    }

    #[test]
    fn striding_count_busy_and_never() {
        let (topo, usable) = two_by_four(&[0]);
        assert_eq!(select("striding:4:2", &topo, &usable), Ok(vec![1, 3, 5, 7]));
        assert!(busy(select("striding:4:2", &topo, &two_by_four(&[0, 1]).1)).contains("no 4 free cores 2 apart"));
        assert!(never(select("striding:5:2", &topo, &usable)).contains("spans 9 cores"));
    }

    #[test]
    fn explicit_busy_and_never() {
        let (topo, usable) = two_by_four(&[7]);
        assert_eq!(select("explicit:1,2:0,1", &topo, &usable), Ok(vec![1, 6]));
        assert_eq!(busy(select("explicit:0,0:1,3", &topo, &usable)), "core 7 (socket 1) is in use");
        assert!(never(select("explicit:1,4", &topo, &usable)).starts_with("core 4 of socket 1 does not exist"));
        assert!(never(Explicit { cores: vec![] }.select(&topo, &usable)).contains("asks for no cores"));
    }

    fn core_ref() -> impl Strategy<Value = CoreRef> {
        prop_oneof![(0u32..12).prop_map(Global), (0u32..4, 0u32..6).prop_map(|(s, c)| Socket(s, c))]
    }

    fn strategy() -> impl Strategy<Value = BindingStrategy> {
        prop_oneof![
            (1u32..10, proptest::option::of(core_ref())).prop_map(|(amount, start)| Linear { amount, start }),
            (core_ref(), core_ref(), 1u32..4)
                .prop_filter("ordered", |(a, b, _)| ordered(*a, *b))
                .prop_map(|(first, last, step)| StridingRange { first, last, step }),
            (1u32..6, 1u32..4).prop_map(|(amount, step)| StridingCount { amount, step }),
            proptest::collection::btree_set((0u32..4, 0u32..6), 1..5)
                .prop_map(|set| set.into_iter().collect::<Vec<_>>())
                .prop_shuffle()
                .prop_map(|cores| Explicit { cores }),
        ]
    }

    proptest! {
        #[test]
        fn parsing_never_panics(s in ".*", t in "(linear|striding|explicit):[0-9,:-]{0,12}") {
            let _ = s.parse::<BindingStrategy>();
            let _ = t.parse::<BindingStrategy>();
        }

        #[test]
        fn display_round_trips(x in strategy()) {
            prop_assert_eq!(x.to_string().parse::<BindingStrategy>(), Ok(x));
        }

        #[test]
        fn select_is_sound(
            x in strategy(), p in 1u32..4, c in 1u32..6, bits in proptest::collection::vec(any::<bool>(), 18)
        ) {
            let topo = Topology::uniform(p, 1, c, 1, 0);
            let usable = &bits[..topo.cores.len()];
            let on_empty = x.select(&topo, &vec![true; usable.len()]);
            match x.select(&topo, usable) {
                Ok(cores) => {
                    prop_assert!(cores.iter().all(|&i| usable[i]));
                    prop_assert!(cores.windows(2).all(|w| w[0] < w[1]));
                    if let Some(n) = x.fixed_count() {
                        prop_assert_eq!(cores.len(), n as usize);
                    }
                }
                Err(BindMiss::Busy(_)) => prop_assert!(on_empty.is_ok()),
                Err(BindMiss::Never(_)) => prop_assert!(matches!(on_empty, Err(BindMiss::Never(_)))),
            }
            // Every choice is one `select` could make: usable, increasing, the same count.
            if let Ok(all) = x.choices(&topo, usable) {
                prop_assert_eq!(Ok(all[0].clone()), x.select(&topo, usable));
                for cores in &all {
                    prop_assert!(cores.iter().all(|&i| usable[i]));
                    prop_assert!(cores.windows(2).all(|w| w[0] < w[1]));
                    prop_assert_eq!(cores.len(), all[0].len());
                }
            }
        }
    }
}
