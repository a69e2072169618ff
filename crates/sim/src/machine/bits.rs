//! A fixed-size set of cores as bits (set = free), with the range operations the pool needs.

/// Core `i` is bit `i % 64` of word `i / 64`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Bits {
    words: Vec<u64>,
}

/// Bits `lo..hi` (within one word, `hi - lo` in 1..=64) as a mask.
fn mask(lo: u32, hi: u32) -> u64 {
    let width = hi - lo;
    let ones = if width == 64 { u64::MAX } else { (1u64 << width) - 1 };
    ones << lo
}

impl Bits {
    /// `len` bits, all set.
    pub fn full(len: u64) -> Self {
        let mut words = vec![u64::MAX; len.div_ceil(64) as usize];
        let tail = len % 64;
        if let (true, Some(last)) = (tail > 0, words.last_mut()) {
            *last = (1u64 << tail) - 1;
        }
        Bits { words }
    }

    /// `len` bits, all clear.
    pub fn empty(len: u64) -> Self {
        Bits { words: vec![0; len.div_ceil(64) as usize] }
    }

    /// Keep only the bits also set in `other` (of the same length).
    pub fn and_with(&mut self, other: &Bits) {
        for (w, o) in self.words.iter_mut().zip(&other.words) {
            *w &= o;
        }
    }

    /// Call `f(word index, mask)` for the parts of `start..start + len` in each word.
    fn for_range(start: u32, len: u32, mut f: impl FnMut(usize, u64)) {
        let (mut at, end) = (start, start + len);
        while at < end {
            let word = at / 64;
            let hi = end.min((word + 1) * 64);
            f(word as usize, mask(at % 64, (hi - 1) % 64 + 1));
            at = hi;
        }
    }

    /// Set bits in `start..start + len`.
    pub fn count_range(&self, start: u32, len: u32) -> u32 {
        let mut n = 0;
        Self::for_range(start, len, |w, m| n += (self.words[w] & m).count_ones());
        n
    }

    /// Clear `start..start + len`; returns how many bits were set (claimed now).
    pub fn clear_range(&mut self, start: u32, len: u32) -> u32 {
        let mut n = 0;
        Self::for_range(start, len, |w, m| {
            n += (self.words[w] & m).count_ones();
            self.words[w] &= !m;
        });
        n
    }

    /// Set `start..start + len`; returns how many bits were clear (given back now).
    pub fn set_range(&mut self, start: u32, len: u32) -> u32 {
        let mut n = 0;
        Self::for_range(start, len, |w, m| {
            n += (!self.words[w] & m).count_ones();
            self.words[w] |= m;
        });
        n
    }

    /// The first `want` set bits in `from..to`, appended to `out` as runs `(start, len)`
    /// (merged with a run `out` ends with); returns how many were found (at most `want`).
    pub fn take_first(&self, from: u32, to: u32, want: u32, out: &mut Vec<(u32, u32)>) -> u32 {
        let mut got = 0;
        let mut word = from / 64;
        while got < want && word * 64 < to {
            let lo = if word == from / 64 { from % 64 } else { 0 };
            let hi = if to <= (word + 1) * 64 { (to - 1) % 64 + 1 } else { 64 };
            let mut bits = self.words[word as usize] & mask(lo, hi);
            while bits != 0 && got < want {
                // A run of set bits starting at the lowest one.
                let first = bits.trailing_zeros();
                let run = (bits >> first).trailing_ones().min(want - got);
                let start = word * 64 + first;
                match out.last_mut() {
                    Some(last) if last.0 + last.1 == start => last.1 += run,
                    _ => out.push((start, run)),
                }
                got += run;
                bits &= !mask(first, first + run);
            }
            word += 1;
        }
        got
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_across_words() {
        let mut b = Bits::full(200);
        assert_eq!(b.count_range(0, 200), 200);
        assert_eq!(b.clear_range(60, 10), 10);
        assert_eq!(b.clear_range(65, 10), 5, "5 of them were clear already");
        assert_eq!(b.count_range(0, 200), 185);
        let mut out = vec![];
        assert_eq!(b.take_first(0, 200, 70, &mut out), 70);
        assert_eq!(out, vec![(0, 60), (75, 10)]);
        let mut out = vec![];
        assert_eq!(b.take_first(190, 200, 20, &mut out), 10);
        assert_eq!(out, vec![(190, 10)]);
        assert_eq!(b.set_range(0, 128), 15);
        assert_eq!(b.count_range(0, 200), 200);
    }

    #[test]
    fn whole_words() {
        let mut b = Bits::full(128);
        assert_eq!(b.clear_range(0, 128), 128);
        let mut out = vec![];
        assert_eq!(b.take_first(0, 128, 1, &mut out), 0);
        assert_eq!(b.set_range(64, 64), 64);
        assert_eq!(b.take_first(0, 128, 64, &mut out), 64);
        assert_eq!(out, vec![(64, 64)]);
    }
}
