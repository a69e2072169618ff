//! Host lists in Slurm's ranged form: `node1,node2,node3,node10` is `node[1-3,10]`.
//!
//! [`compress`] keeps the list's order (the first host stays first: it runs the batch script)
//! and its zero padding (`node01,node02` is `node[01-02]`), so that [`expand`] gives back
//! exactly the list it was given. Hosts are grouped under one prefix only while they follow
//! each other in the list, as Slurm's `hostlist_ranged_string` does for an unsorted list.

use crate::hierarchy::{expand_hostlist, HostlistError, MAX_HOSTLIST_NAMES};

/// A name split into its prefix and trailing number (`node010` is `node`, 10, written with
/// 3 digits); None when it has no trailing digits, or too many to be a number.
fn split(name: &str) -> Option<(&str, u64, usize)> {
    let digits = name.bytes().rev().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return None;
    }
    let (prefix, num) = name.split_at(name.len() - digits);
    // `[`, `]` and `,` are the syntax: such a name is listed as it is, never in a range.
    if prefix.contains(['[', ']', ',']) {
        return None;
    }
    num.parse().ok().map(|n| (prefix, n, digits))
}

/// A run of numbers under one prefix, written with at least `width` digits.
struct Range {
    lo: u64,
    hi: u64,
    width: usize,
}

impl Range {
    fn text(&self) -> String {
        let w = self.width;
        if self.lo == self.hi {
            format!("{:0w$}", self.lo)
        } else {
            format!("{:0w$}-{:0w$}", self.lo, self.hi)
        }
    }
}

/// The list in ranged form, in its order: `node[1-3,10]`, `a[01-02],login,b7`.
pub fn compress<S: AsRef<str>>(names: &[S]) -> String {
    // Consecutive names under one prefix: (prefix, ranges), or a name listed as it is.
    let mut groups: Vec<(Option<&str>, Vec<Range>, &str)> = Vec::new();
    for name in names.iter().map(AsRef::as_ref) {
        let Some((prefix, n, digits)) = split(name) else {
            groups.push((None, Vec::new(), name));
            continue;
        };
        if let Some((Some(p), ranges, _)) = groups.last_mut() {
            if *p == prefix {
                let last = ranges.last_mut().filter(|r| r.hi.checked_add(1) == Some(n));
                // `n` written with the range's width must be the name's own digits.
                match last {
                    Some(r) if format!("{n:0w$}", w = r.width).len() == digits => r.hi = n,
                    _ => ranges.push(Range { lo: n, hi: n, width: digits }),
                }
                continue;
            }
        }
        groups.push((Some(prefix), vec![Range { lo: n, hi: n, width: digits }], name));
    }
    let parts: Vec<String> = groups
        .into_iter()
        .map(|(prefix, ranges, name)| match prefix {
            None => name.to_string(),
            Some(p) if ranges.len() == 1 && ranges[0].lo == ranges[0].hi => format!("{p}{}", ranges[0].text()),
            Some(p) => format!("{p}[{}]", ranges.iter().map(Range::text).collect::<Vec<_>>().join(",")),
        })
        .collect();
    parts.join(",")
}

/// The names of a ranged list (`node[1-3,10],login`), in its order; at most
/// [`MAX_HOSTLIST_NAMES`] in all.
pub fn expand(list: &str) -> Result<Vec<String>, HostlistError> {
    let unbalanced = || HostlistError::Unbalanced { list: list.to_string() };
    let mut out = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    let mut items = Vec::new();
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.checked_sub(1).ok_or_else(unbalanced)?,
            ',' if depth == 0 => {
                items.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(unbalanced());
    }
    items.push(&list[start..]);
    for item in items.into_iter().filter(|s| !s.is_empty()) {
        let names = expand_hostlist(item)?;
        if out.len() + names.len() > MAX_HOSTLIST_NAMES {
            return Err(HostlistError::TooMany { list: list.to_string(), what: "hosts" });
        }
        out.extend(names);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn ranges_under_one_prefix() {
        assert_eq!(compress(&["node1", "node2", "node3", "node10"]), "node[1-3,10]");
        assert_eq!(compress(&["node1", "node2", "node3"]), "node[1-3]");
        assert_eq!(compress(&["node2"]), "node2");
        assert_eq!(compress::<&str>(&[]), "");
        assert_eq!(compress(&["node9", "node10", "node11"]), "node[9-11]");
    }

    #[test]
    fn zero_padding_is_kept() {
        assert_eq!(compress(&["n01", "n02", "n03"]), "n[01-03]");
        assert_eq!(compress(&["n09", "n10", "n11"]), "n[09-11]");
        assert_eq!(compress(&["n99", "n100"]), "n[99-100]");
        assert_eq!(compress(&["n1", "n02"]), "n[1,02]");
        assert_eq!(compress(&["n008", "n009", "n010"]), "n[008-010]");
        assert_eq!(expand("n[09-100]").unwrap().len(), 92);
    }

    #[test]
    fn order_is_kept() {
        // The first node runs the script: a job's list is not sorted.
        assert_eq!(compress(&["node3", "node1", "node2"]), "node[3,1-2]");
        assert_eq!(compress(&["a1", "b1", "a2"]), "a1,b1,a2");
        assert_eq!(compress(&["node1", "node1"]), "node[1,1]");
    }

    #[test]
    fn names_without_numbers_are_listed_as_they_are() {
        assert_eq!(compress(&["login", "node1", "node2", "gw"]), "login,node[1-2],gw");
        assert_eq!(compress(&["rack1-node3", "rack1-node4"]), "rack1-node[3-4]");
        assert_eq!(compress(&["x99999999999999999999999"]), "x99999999999999999999999");
        assert_eq!(compress(&["a[1", "a[2"]), "a[1,a[2");
    }

    #[test]
    fn expands_lists() {
        assert_eq!(expand("node[1-3,10],login").unwrap(), ["node1", "node2", "node3", "node10", "login"]);
        assert_eq!(expand("a[1-2]b[3,5]").unwrap(), ["a1b3", "a1b5", "a2b3", "a2b5"]);
        assert_eq!(expand("").unwrap(), Vec::<String>::new());
        assert!(expand("node[1-3").is_err());
        assert!(expand("node]1[").is_err());
        let e = expand("n[1-99999],m[1-99999]").unwrap_err();
        assert_eq!(e, HostlistError::TooMany { list: "n[1-99999],m[1-99999]".into(), what: "hosts" });
        assert_eq!(e.to_string(), format!("\"n[1-99999],m[1-99999]\" names more than {MAX_HOSTLIST_NAMES} hosts"));
        assert_eq!(expand("node]1[").unwrap_err().to_string(), "\"node]1[\": unbalanced [ ]");
        assert_eq!(expand("n[a-b]").unwrap_err().to_string(), "\"n[a-b]\": \"a-b\" is not a range like 1-4");
    }

    fn host() -> impl Strategy<Value = String> {
        prop_oneof![
            // Mostly a few prefixes with numbers, padded or not, so that ranges form.
            (prop::sample::select(vec!["node", "n", "rack1-n", ""]), 0u64..40, 0usize..4)
                .prop_map(|(p, n, w)| format!("{p}{n:0w$}")),
            "[a-z][a-z0-9.-]{0,6}[a-z]",
        ]
    }

    proptest! {
        #[test]
        fn expanding_the_compressed_list_gives_it_back(names in prop::collection::vec(host(), 0..30)) {
            let names: Vec<String> = names.into_iter().filter(|n| !n.is_empty()).collect();
            let ranged = compress(&names);
            prop_assert_eq!(expand(&ranged).unwrap(), names, "{}", ranged);
        }

        #[test]
        fn sorted_runs_compress_to_one_bracket(lo in 0u64..1000, len in 2u64..50, w in 0usize..5) {
            let names: Vec<String> = (lo..lo + len).map(|n| format!("node{n:0w$}")).collect();
            let ranged = compress(&names);
            prop_assert!(!ranged.contains(','), "{}", ranged);
            prop_assert_eq!(expand(&ranged).unwrap(), names);
        }
    }
}
