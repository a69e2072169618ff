//! Generic countable resources (Slurm's GRES other than GPUs) and cluster-wide licenses.
//!
//! A node may have countable resources configured (`nvme_gb = 800`, `fpga = 1`: the
//! controller's `[gres]` table); a job asks for so many of each on every node it gets
//! (`--gres nvme_gb:100`). Licenses are counted over the whole cluster (`[licenses] matlab =
//! 4`); a job asks for so many for its whole run (`--licenses matlab:2`). Both are plain
//! counts: placement never gives out more than a node, or the cluster, has, and a suspended
//! job keeps what it holds (as its memory and GPUs).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Counts by name (a node's resources, a job's request, the licenses in use).
pub type Counts = BTreeMap<String, u32>;

/// The longest name of a resource or license.
pub const MAX_NAME_LEN: usize = 32;
/// The most of one resource a node or the cluster may have, or a job ask for.
pub const MAX_COUNT: u32 = 1_000_000_000;
/// The most names in one request or one node's configuration.
pub const MAX_NAMES: usize = 16;

/// Why a list of counts is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GresError {
    #[error("{what}: a name is 1 to {MAX_NAME_LEN} letters, digits, _ - and ., starting with a letter, got {name:?}")]
    Name { what: String, name: String },
    #[error("{what}: {name}'s count must be a whole number from 1 to {MAX_COUNT}, got {count:?}")]
    Count { what: String, name: String, count: String },
    #[error("{what}: at most {MAX_NAMES} names, got {got}")]
    TooMany { what: String, got: usize },
    #[error("{what}: {name} is given twice")]
    Twice { what: String, name: String },
    #[error("{what}: {item:?} is not NAME or NAME:COUNT")]
    Malformed { what: String, item: String },
}

/// Whether `name` may name a resource or license.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name.starts_with(|c: char| c.is_ascii_alphabetic())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
}

/// A count as written (`1` to [`MAX_COUNT`]).
pub fn parse_count(what: &str, name: &str, text: &str) -> Result<u32, GresError> {
    text.trim().parse::<u32>().ok().filter(|n| (1..=MAX_COUNT).contains(n)).ok_or_else(|| GresError::Count {
        what: what.into(),
        name: name.into(),
        count: text.into(),
    })
}

/// One item of a request list: `NAME`, `NAME:COUNT` or `NAME:TYPE:COUNT`, split on `:`
/// (`what` names the option in errors). The count defaults to 1.
pub fn split_item<'a>(what: &str, item: &'a str) -> Result<(&'a str, Option<&'a str>, u32), GresError> {
    let parts: Vec<&str> = item.split(':').collect();
    let (name, kind, count) = match parts.as_slice() {
        [n] => (*n, None, None),
        [n, c] if c.chars().all(|ch| ch.is_ascii_digit()) => (*n, None, Some(*c)),
        [n, t] => (*n, Some(*t), None),
        [n, t, c] => (*n, Some(*t), Some(*c)),
        _ => return Err(GresError::Malformed { what: what.into(), item: item.into() }),
    };
    if !valid_name(name) {
        return Err(GresError::Name { what: what.into(), name: name.into() });
    }
    let count = match count {
        Some(c) => parse_count(what, name, c)?,
        None => 1,
    };
    Ok((name, kind, count))
}

/// A comma-separated list of `NAME[:COUNT]` (`--licenses matlab:2,ansys`), each name once.
pub fn parse_list(what: &str, text: &str) -> Result<Counts, GresError> {
    let mut out = Counts::new();
    for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (name, kind, count) = split_item(what, item)?;
        if kind.is_some() {
            return Err(GresError::Malformed { what: what.into(), item: item.into() });
        }
        insert(what, &mut out, name, count)?;
    }
    if out.is_empty() {
        return Err(GresError::Malformed { what: what.into(), item: text.into() });
    }
    Ok(out)
}

/// Add `name = count` to `out`, refusing a name given twice and more than [`MAX_NAMES`].
pub fn insert(what: &str, out: &mut Counts, name: &str, count: u32) -> Result<(), GresError> {
    if out.contains_key(name) {
        return Err(GresError::Twice { what: what.into(), name: name.into() });
    }
    if out.len() >= MAX_NAMES {
        return Err(GresError::TooMany { what: what.into(), got: out.len() + 1 });
    }
    out.insert(name.to_string(), count);
    Ok(())
}

/// Check a configured table (`[licenses]`, a node's `[gres]` entry): names and counts bounded.
pub fn check_config(what: &str, counts: &Counts) -> Result<(), GresError> {
    if counts.len() > MAX_NAMES {
        return Err(GresError::TooMany { what: what.into(), got: counts.len() });
    }
    for (name, &count) in counts {
        if !valid_name(name) {
            return Err(GresError::Name { what: what.into(), name: name.clone() });
        }
        if !(1..=MAX_COUNT).contains(&count) {
            return Err(GresError::Count { what: what.into(), name: name.clone(), count: count.to_string() });
        }
    }
    Ok(())
}

/// A generic resource's key: `NAME`, or `NAME:TYPE` for a typed one (`nvme:fast`, Slurm's
/// `Gres=nvme:fast:400`), split into the name and the type.
pub fn split_key(key: &str) -> (&str, Option<&str>) {
    match key.split_once(':') {
        Some((name, kind)) => (name, Some(kind)),
        None => (key, None),
    }
}

/// The key of resource `name` of type `kind` (none: the name alone).
pub fn key(name: &str, kind: Option<&str>) -> String {
    match kind {
        Some(k) => format!("{name}:{k}"),
        None => name.to_string(),
    }
}

/// Whether `key` is `NAME` or `NAME:TYPE`, each a valid name.
pub fn valid_key(key: &str) -> bool {
    let (name, kind) = split_key(key);
    valid_name(name) && kind.is_none_or(valid_name)
}

/// Check a node's configured generic resources (`[gres]` entry): as [`check_config`], and
/// the keys may be typed (`"nvme:fast" = 400`).
pub fn check_node_config(what: &str, counts: &Counts) -> Result<(), GresError> {
    if counts.len() > MAX_NAMES {
        return Err(GresError::TooMany { what: what.into(), got: counts.len() });
    }
    for (key, &count) in counts {
        if !valid_key(key) {
            return Err(GresError::Name { what: what.into(), name: key.clone() });
        }
        if !(1..=MAX_COUNT).contains(&count) {
            return Err(GresError::Count { what: what.into(), name: key.clone(), count: count.to_string() });
        }
    }
    Ok(())
}

/// How many of `want_key` `counts` (a node's total or free resources) can give: a typed key
/// (`nvme:fast`) its own entry, a type-less one (`nvme`) the untyped entry and every type's
/// together (as a GPU request without a type takes GPUs of any type).
pub fn available(counts: &Counts, want_key: &str) -> u32 {
    let (name, kind) = split_key(want_key);
    match kind {
        Some(_) => counts.get(want_key).copied().unwrap_or(0),
        None => counts.iter().filter(|(k, _)| split_key(k).0 == name).fold(0u32, |sum, (_, &n)| sum.saturating_add(n)),
    }
}

/// What a job asking for `want` takes of `free` (a node's free resources), by the node's own
/// keys: typed requests their type; then type-less ones the untyped entry first, then the
/// types in name order. None when `free` cannot give it all.
pub fn take(free: &Counts, want: &Counts) -> Option<Counts> {
    let mut left = free.clone();
    let mut out = Counts::new();
    let give = |left: &mut Counts, out: &mut Counts, key: &str, n: u32| {
        if let Some(f) = left.get_mut(key) {
            *f -= n;
        }
        *out.entry(key.to_string()).or_insert(0) += n;
    };
    let typed = want.iter().filter(|(k, _)| split_key(k).1.is_some());
    let untyped = want.iter().filter(|(k, _)| split_key(k).1.is_none());
    for (key, &n) in typed {
        if left.get(key).copied().unwrap_or(0) < n {
            return None;
        }
        give(&mut left, &mut out, key, n);
    }
    for (name, &n) in untyped {
        let mut need = n;
        let keys: Vec<String> = std::iter::once(name.clone())
            .chain(left.keys().filter(|k| split_key(k).0 == name && k.as_str() != name).cloned())
            .collect();
        for key in keys {
            let part = need.min(left.get(&key).copied().unwrap_or(0));
            if part > 0 {
                give(&mut left, &mut out, &key, part);
                need -= part;
            }
        }
        if need > 0 {
            return None;
        }
    }
    Some(out)
}

/// `name:count,...` (the form requests are written in, and views show).
pub fn render(counts: &Counts) -> String {
    counts.iter().map(|(n, c)| format!("{n}:{c}")).collect::<Vec<_>>().join(",")
}

/// The cluster's licenses: how many of each exist and how many running or suspended jobs
/// hold. `used` never exceeds `total` through [`Licenses::check`] and placement.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Licenses {
    pub total: Counts,
    #[serde(default)]
    pub used: Counts,
}

/// Why licenses cannot be given now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LicenseMiss {
    /// More than are free now: the job waits.
    #[error("{0}")]
    Busy(LicensesBusy),
    /// Unknown, or more than exist: never.
    #[error("{0}")]
    Never(LicenseNever),
}

/// The licenses a job waits for: each one's name, how many it wants, how many are free of
/// how many exist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LicensesBusy(pub Vec<LicenseShort>);

/// One license with fewer free than a job wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LicenseShort {
    pub name: String,
    pub want: u32,
    pub free: u32,
    pub total: u32,
}

impl std::fmt::Display for LicensesBusy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, s) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(
                f,
                "license {}: {} wanted, {} of {} free; it starts when running jobs free them",
                s.name, s.want, s.free, s.total
            )?;
        }
        Ok(())
    }
}

/// A license request that can never be met.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LicenseNever {
    /// The cluster has none of `name`; `have` renders the licenses it has ("none" if none).
    #[error("license {name}: the cluster has none (its [licenses] are: {have})")]
    Unknown { name: String, have: String },
    /// More than exist.
    #[error("license {name}: {want} wanted, the cluster has {total}; ask for at most {total}")]
    TooMany { name: String, want: u32, total: u32 },
}

impl Licenses {
    pub fn new(total: Counts) -> Self {
        Licenses { total, used: Counts::new() }
    }

    /// How many of `name` are free now.
    pub fn free(&self, name: &str) -> u32 {
        let total = self.total.get(name).copied().unwrap_or(0);
        total.saturating_sub(self.used.get(name).copied().unwrap_or(0))
    }

    /// Whether `want` can be given now (`Ok`), later (`Busy`) or never (`Never`), with a
    /// reason naming the license.
    pub fn check(&self, want: &Counts) -> Result<(), LicenseMiss> {
        let mut busy = vec![];
        for (name, &n) in want {
            let total = self.total.get(name).copied().unwrap_or(0);
            if total == 0 {
                let have = if self.total.is_empty() { "none".to_string() } else { render(&self.total) };
                return Err(LicenseMiss::Never(LicenseNever::Unknown { name: name.clone(), have }));
            }
            if n > total {
                return Err(LicenseMiss::Never(LicenseNever::TooMany { name: name.clone(), want: n, total }));
            }
            let free = self.free(name);
            if n > free {
                busy.push(LicenseShort { name: name.clone(), want: n, free, total });
            }
        }
        if busy.is_empty() {
            Ok(())
        } else {
            Err(LicenseMiss::Busy(LicensesBusy(busy)))
        }
    }

    /// Take `held` (a job's licenses). Counts past the total are kept (a configuration that
    /// shrank under running jobs): `free` is then 0 until enough end.
    pub fn claim(&mut self, held: &Counts) {
        for (name, &n) in held {
            let used = self.used.entry(name.clone()).or_insert(0);
            *used = used.saturating_add(n);
        }
    }

    /// Give back `held`.
    pub fn release(&mut self, held: &Counts) {
        for (name, &n) in held {
            if let Some(used) = self.used.get_mut(name) {
                *used = used.saturating_sub(n);
                if *used == 0 {
                    self.used.remove(name);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(items: &[(&str, u32)]) -> Counts {
        items.iter().map(|(n, c)| (n.to_string(), *c)).collect()
    }

    #[test]
    fn lists_parse_with_bounds() {
        assert_eq!(parse_list("--licenses", "matlab:2,ansys").unwrap(), counts(&[("ansys", 1), ("matlab", 2)]));
        for bad in ["", "matlab:0", "matlab:x:y:z", "2x:1", "matlab:1,matlab:2", "m a:1", "matlab:1000000001"] {
            assert!(parse_list("--licenses", bad).is_err(), "{bad}");
        }
        let long = "a".repeat(MAX_NAME_LEN + 1);
        assert!(matches!(parse_list("--licenses", &long), Err(GresError::Name { .. })));
        let many: Vec<String> = (0..=MAX_NAMES).map(|i| format!("l{i}")).collect();
        assert!(matches!(parse_list("--licenses", &many.join(",")), Err(GresError::TooMany { .. })));
        assert_eq!(split_item("--gres", "gpu:a100:2").unwrap(), ("gpu", Some("a100"), 2));
        assert_eq!(split_item("--gres", "nvme:10").unwrap(), ("nvme", None, 10));
        assert_eq!(render(&counts(&[("a", 1), ("b", 3)])), "a:1,b:3");
    }

    #[test]
    fn licenses_are_never_over_given() {
        let mut l = Licenses::new(counts(&[("matlab", 4)]));
        let three = counts(&[("matlab", 3)]);
        assert_eq!(l.check(&three), Ok(()));
        l.claim(&three);
        match l.check(&three) {
            Err(LicenseMiss::Busy(m)) => {
                assert!(m.to_string().contains("license matlab: 3 wanted, 1 of 4 free"), "{m}")
            }
            other => panic!("{other:?}"),
        }
        assert!(
            matches!(l.check(&counts(&[("matlab", 5)])), Err(LicenseMiss::Never(m)) if m.to_string().contains("has 4"))
        );
        assert!(
            matches!(l.check(&counts(&[("ansys", 1)])), Err(LicenseMiss::Never(m)) if m.to_string().contains("has none"))
        );
        l.release(&three);
        assert_eq!(l.free("matlab"), 4);
        assert!(l.used.is_empty());
    }

    #[test]
    fn config_is_checked() {
        assert!(check_config("[licenses]", &counts(&[("matlab", 4)])).is_ok());
        assert!(check_config("[licenses]", &counts(&[("matlab", 0)])).is_err());
        assert!(check_config("[licenses]", &counts(&[("1x", 1)])).is_err());
        assert!(check_config("[licenses]", &counts(&[("matlab:new", 1)])).is_err(), "licenses have no types");
        assert!(check_node_config("[gres] n1", &counts(&[("nvme:fast", 400), ("nvme", 8), ("fpga", 1)])).is_ok());
        for bad in ["nvme:", ":fast", "nvme:fast:x", "nvme:1x"] {
            assert!(check_node_config("[gres] n1", &counts(&[(bad, 1)])).is_err(), "{bad}");
        }
    }

    #[test]
    fn typed_resources_are_taken_by_type_and_untyped_requests_take_any() {
        let free = counts(&[("fpga", 1), ("nvme", 2), ("nvme:fast", 4), ("nvme:slow", 8)]);
        assert_eq!(available(&free, "nvme"), 14);
        assert_eq!(available(&free, "nvme:fast"), 4);
        assert_eq!(available(&free, "nvme:none"), 0);
        assert_eq!(available(&free, "fpga"), 1);
        assert_eq!(take(&free, &counts(&[("nvme:fast", 3)])), Some(counts(&[("nvme:fast", 3)])));
        assert_eq!(take(&free, &counts(&[("nvme:fast", 5)])), None);
        // Untyped: its own entry first, then the types in name order.
        assert_eq!(
            take(&free, &counts(&[("nvme", 7)])),
            Some(counts(&[("nvme", 2), ("nvme:fast", 4), ("nvme:slow", 1)]))
        );
        // A typed request is served first, an untyped one from what it leaves.
        assert_eq!(
            take(&free, &counts(&[("nvme", 10), ("nvme:fast", 4)])),
            Some(counts(&[("nvme", 2), ("nvme:fast", 4), ("nvme:slow", 8)]))
        );
        assert_eq!(take(&free, &counts(&[("nvme", 11), ("nvme:fast", 4)])), None, "14 in all");
        assert_eq!(take(&free, &counts(&[("fpga", 1), ("gpu2", 1)])), None);
        assert_eq!(split_key("nvme:fast"), ("nvme", Some("fast")));
        assert_eq!(key("nvme", Some("fast")), "nvme:fast");
    }
}
