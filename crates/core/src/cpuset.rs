//! Sets of CPU (or memory node) indexes, printed and parsed in the kernel's list format.

use crate::CoreError;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// A set of small non-negative integers (PU os indexes, NUMA node indexes) as a bitmap.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct CpuSet {
    words: Vec<u64>,
}

impl CpuSet {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn from_iter_u32(items: impl IntoIterator<Item = u32>) -> Self {
        let mut s = Self::new();
        for i in items {
            s.insert(i);
        }
        s
    }

    pub fn insert(&mut self, i: u32) {
        let (w, b) = ((i / 64) as usize, i % 64);
        if self.words.len() <= w {
            self.words.resize(w + 1, 0);
        }
        self.words[w] |= 1 << b;
    }

    /// Insert `lo..=hi` (`lo <= hi`), a 64-bit word at a time.
    fn insert_range(&mut self, lo: u32, hi: u32) {
        let (first, last) = ((lo / 64) as usize, (hi / 64) as usize);
        if self.words.len() <= last {
            self.words.resize(last + 1, 0);
        }
        for w in first..=last {
            let from = if w == first { lo % 64 } else { 0 };
            let to = if w == last { hi % 64 } else { 63 };
            self.words[w] |= (u64::MAX >> (63 - to)) & (u64::MAX << from);
        }
    }

    pub fn remove(&mut self, i: u32) {
        let (w, b) = ((i / 64) as usize, i % 64);
        if let Some(word) = self.words.get_mut(w) {
            *word &= !(1 << b);
        }
        self.trim();
    }

    pub fn contains(&self, i: u32) -> bool {
        let (w, b) = ((i / 64) as usize, i % 64);
        self.words.get(w).is_some_and(|word| word & (1 << b) != 0)
    }

    pub fn len(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.words.iter().all(|w| *w == 0)
    }

    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.words.iter().enumerate().flat_map(|(wi, &word)| {
            (0..64u32).filter(move |b| word & (1u64 << b) != 0).map(move |b| wi as u32 * 64 + b)
        })
    }

    pub fn union_with(&mut self, other: &CpuSet) {
        if self.words.len() < other.words.len() {
            self.words.resize(other.words.len(), 0);
        }
        for (a, b) in self.words.iter_mut().zip(&other.words) {
            *a |= b;
        }
    }

    pub fn subtract(&mut self, other: &CpuSet) {
        for (a, b) in self.words.iter_mut().zip(&other.words) {
            *a &= !b;
        }
        self.trim();
    }

    pub fn intersects(&self, other: &CpuSet) -> bool {
        self.words.iter().zip(&other.words).any(|(a, b)| a & b != 0)
    }

    pub fn is_subset_of(&self, other: &CpuSet) -> bool {
        self.words.iter().enumerate().all(|(i, w)| w & !other.words.get(i).copied().unwrap_or(0) == 0)
    }

    fn trim(&mut self) {
        while self.words.last() == Some(&0) {
            self.words.pop();
        }
    }

    /// Parse the kernel list format: `0-3,8,10-11`; empty string is the empty set.
    pub fn parse_list(input: &str) -> Result<Self, CoreError> {
        let bad = |reason: &str| CoreError::BadCpuList { input: input.to_string(), reason: reason.to_string() };
        let mut set = CpuSet::new();
        let s = input.trim();
        if s.is_empty() {
            return Ok(set);
        }
        let mut ranges = Vec::new();
        for part in s.split(',') {
            let part = part.trim();
            let (lo, hi) = match part.split_once('-') {
                Some((a, b)) => (a.trim(), b.trim()),
                None => (part, part),
            };
            let lo: u32 = lo.parse().map_err(|_| bad(&format!("{part:?} is not a number or range")))?;
            let hi: u32 = hi.parse().map_err(|_| bad(&format!("{part:?} is not a number or range")))?;
            if lo > hi {
                return Err(bad(&format!("range {part:?} is backwards")));
            }
            if hi >= 1 << 20 {
                return Err(bad(&format!("{hi} is too large for a cpu index")));
            }
            ranges.push((lo, hi));
        }
        // Merged, then filled a word at a time: the work is bounded by the input's length and
        // the 2^20 indexes, however large or often repeated the ranges are.
        ranges.sort_unstable();
        let mut merged: Vec<(u32, u32)> = Vec::with_capacity(ranges.len());
        for (lo, hi) in ranges {
            match merged.last_mut() {
                Some((_, end)) if lo <= end.saturating_add(1) => *end = (*end).max(hi),
                _ => merged.push((lo, hi)),
            }
        }
        for (lo, hi) in merged {
            set.insert_range(lo, hi);
        }
        Ok(set)
    }

    /// The kernel list format, ranges collapsed: `0-3,8,10-11`.
    pub fn to_list(&self) -> String {
        let mut out = String::new();
        let mut iter = self.iter().peekable();
        while let Some(start) = iter.next() {
            let mut end = start;
            while iter.peek() == Some(&(end + 1)) {
                end = iter.next().unwrap_or(end);
            }
            if !out.is_empty() {
                out.push(',');
            }
            if start == end {
                out.push_str(&start.to_string());
            } else {
                out.push_str(&format!("{start}-{end}"));
            }
        }
        out
    }
}

impl fmt::Display for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_list())
    }
}

impl fmt::Debug for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CpuSet({})", self.to_list())
    }
}

impl FromIterator<u32> for CpuSet {
    fn from_iter<T: IntoIterator<Item = u32>>(iter: T) -> Self {
        Self::from_iter_u32(iter)
    }
}

// On the wire and in the database a set is its list string: readable and compact.
impl Serialize for CpuSet {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_list())
    }
}

impl<'de> Deserialize<'de> for CpuSet {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        CpuSet::parse_list(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parse_and_print() {
        let s = CpuSet::parse_list("0-3,11,13,15").unwrap();
        assert_eq!(s.len(), 7);
        assert_eq!(s.to_list(), "0-3,11,13,15");
        assert_eq!(CpuSet::parse_list("5,1,2,3").unwrap().to_list(), "1-3,5");
        assert_eq!(CpuSet::parse_list("").unwrap().to_list(), "");
        assert_eq!(CpuSet::parse_list("63-65").unwrap().to_list(), "63-65");
        assert!(CpuSet::parse_list("3-1").is_err());
        assert!(CpuSet::parse_list("a").is_err());
        assert!(CpuSet::parse_list("1,,2").is_err());
        assert!(CpuSet::parse_list("99999999").is_err());
    }

    #[test]
    fn set_ops() {
        let mut a = CpuSet::parse_list("0-7").unwrap();
        let b = CpuSet::parse_list("2-3").unwrap();
        assert!(b.is_subset_of(&a));
        assert!(a.intersects(&b));
        a.subtract(&b);
        assert_eq!(a.to_list(), "0-1,4-7");
        assert!(!a.intersects(&b));
        a.union_with(&b);
        assert_eq!(a.to_list(), "0-7");
    }

    proptest! {
        #[test]
        fn list_roundtrip(items in proptest::collection::vec(0u32..300, 0..50)) {
            let s = CpuSet::from_iter_u32(items.iter().copied());
            let parsed = CpuSet::parse_list(&s.to_list()).unwrap();
            prop_assert_eq!(&parsed, &s);
            let mut sorted = items.clone();
            sorted.sort();
            sorted.dedup();
            prop_assert_eq!(s.iter().collect::<Vec<_>>(), sorted);
        }
    }
}
