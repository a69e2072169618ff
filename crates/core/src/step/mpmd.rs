//! MPMD steps: several programs in one parallel step, numbered across the programs, as
//! mpiexec's `-n 2 ./a.out : -n 4 ./b.out`, aprun's `-n 2 a.out : -n 4 b.out` and srun's
//! `--multi-prog FILE` give (docs/launcher.md, "Several programs in one step (MPMD)").
//!
//! Each program is an [`App`]: its argv, the variables and working directory it adds to the
//! step's, and its ranks. The parts of a colon line carry their own layout (`request`) and are
//! planned one after another over the job's free cores ([`plan_mpmd`]): part 0 gets ranks
//! 0..n0-1, part 1 the next n1, and so on. The lines of a multi-prog file name their ranks
//! (`0-3,5`, `*` for the rest) and share the step's layout ([`resolve_ranks`]). An app's index is
//! its application number (`MPI_APPNUM`, PMI's `appnum`, PMIx's `PMIX_APPNUM`).

use super::{plan_step, RankPlace, StepError, StepNodePlan, StepPlan, StepRequest};
use crate::job::NodeAllocation;
use crate::topology::Topology;
use crate::CpuSet;
use serde::{Deserialize, Serialize};

/// Most programs one step may run (parts of a colon line, lines of a multi-prog file).
pub const MAX_APPS: usize = 1024;
/// Largest multi-prog file read.
pub const MAX_MULTI_PROG_BYTES: usize = 1 << 20;
/// Longest line of a multi-prog file.
pub const MAX_LINE_BYTES: usize = 64 * 1024;
/// Ranks are below this (the controller's bound on a step's ranks).
pub const MAX_RANKS: u32 = 1 << 20;

fn is_false(b: &bool) -> bool {
    !*b
}

/// One program of an MPMD step.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct App {
    /// The program and its arguments (`%t` and `%o` expanded per rank when `expand`).
    pub argv: Vec<String>,
    /// Variables set for its ranks, over the step's environment.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<(String, String)>,
    /// Its working directory (absolute); None: the step's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Its ranks as inclusive ranges, ascending and disjoint. In a request: a multi-prog line's
    /// ranks (empty with `rest`); a colon part's are set by the controller. In a grant: always.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ranks: Vec<(u32, u32)>,
    /// A multi-prog line `*`: every rank no other line names.
    #[serde(default, skip_serializing_if = "is_false")]
    pub rest: bool,
    /// srun's multi-prog substitutions: `%t` the rank, `%o` its offset among the app's ranks.
    #[serde(default, skip_serializing_if = "is_false")]
    pub expand: bool,
    /// A colon part's own layout (`-n`, `-N`, `--ntasks-per-node`, `-d`, `--binding`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<StepRequest>,
    /// In a grant: bind its ranks to their CPUs (its part's `--binding` is not `none`); None: as
    /// the step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bind: Option<bool>,
}

impl App {
    /// How many ranks it has (from `ranks`).
    pub fn size(&self) -> u32 {
        self.ranks.iter().map(|(a, b)| b - a + 1).sum()
    }

    /// Its lowest rank (PMIx's `PMIX_APPLDR`).
    pub fn leader(&self) -> Option<u32> {
        self.ranks.first().map(|r| r.0)
    }

    /// The offset of `rank` among the app's ranks (`%o`, PMIx's `PMIX_APP_RANK`).
    pub fn offset_of(&self, rank: u32) -> Option<u32> {
        let mut before = 0;
        for &(a, b) in &self.ranks {
            if (a..=b).contains(&rank) {
                return Some(before + rank - a);
            }
            before += b - a + 1;
        }
        None
    }

    /// The argv of `rank` (srun's `%t` and `%o` expanded when `expand`).
    pub fn argv_of(&self, rank: u32) -> Vec<String> {
        if !self.expand {
            return self.argv.clone();
        }
        let offset = self.offset_of(rank).unwrap_or(0);
        self.argv
            .iter()
            .map(|a| {
                if a.contains('%') {
                    a.replace("%t", &rank.to_string()).replace("%o", &offset.to_string())
                } else {
                    a.clone()
                }
            })
            .collect()
    }
}

/// Why a step's programs do not give each of its ranks exactly one ([`rank_apps`],
/// [`resolve_ranks`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RanksError {
    /// An app (by index) names ranks at or beyond the step's size.
    #[error("program {program} names ranks {first}-{last}, beyond the step's {size} ranks")]
    Beyond { program: usize, first: u32, last: u32, size: u32 },
    /// Two apps (by index) name the same rank.
    #[error("rank {rank} has two programs ({first} and {second})")]
    TwoPrograms { rank: u32, first: u32, second: usize },
    #[error("rank {0} has no program")]
    NoProgram(usize),
    /// A multi-prog line (1-based, its program) names a rank beyond the step's size.
    #[error(
        "program {line} ({program}) names rank {rank}, but the step has {size} rank(s) (0-{}); name ranks below {size} or ask for more with -n",
        size.saturating_sub(1)
    )]
    NamedBeyond { line: usize, program: String, rank: u32, size: u32 },
    /// Two multi-prog lines (1-based) name the same rank.
    #[error("rank {rank} is named by programs {first} and {second}")]
    NamedTwice { rank: u32, first: usize, second: usize },
    /// Ranks (as ranges, `1,3-4`) no multi-prog line names, without a `*` line.
    #[error(
        "rank(s) {ranks} of the step's {size} have no program; name them, add a `*` line for the rest, or ask for fewer ranks with -n"
    )]
    Unnamed { ranks: String, size: u32 },
}

/// The application number of every rank of a step of `size` ranks (index = rank), or why the
/// apps do not cover the ranks exactly once. Empty apps: every rank is app 0.
pub fn rank_apps(apps: &[App], size: u32) -> Result<Vec<u32>, RanksError> {
    if apps.is_empty() {
        return Ok(vec![0; size as usize]);
    }
    let mut of = vec![u32::MAX; size as usize];
    for (i, app) in apps.iter().enumerate() {
        for &(a, b) in &app.ranks {
            if a > b || b >= size {
                return Err(RanksError::Beyond { program: i, first: a, last: b, size });
            }
            for r in a..=b {
                if of[r as usize] != u32::MAX {
                    return Err(RanksError::TwoPrograms { rank: r, first: of[r as usize], second: i });
                }
                of[r as usize] = i as u32;
            }
        }
    }
    if let Some(r) = of.iter().position(|&a| a == u32::MAX) {
        return Err(RanksError::NoProgram(r));
    }
    Ok(of)
}

/// Ranks as ascending inclusive ranges.
fn ranges_of(mut ranks: Vec<u32>) -> Vec<(u32, u32)> {
    ranks.sort_unstable();
    ranks.dedup();
    let mut out: Vec<(u32, u32)> = Vec::new();
    for r in ranks {
        match out.last_mut() {
            Some(last) if last.1 + 1 == r => last.1 = r,
            _ => out.push((r, r)),
        }
    }
    out
}

fn show_ranges(ranges: &[(u32, u32)]) -> String {
    ranges.iter().map(|&(a, b)| if a == b { a.to_string() } else { format!("{a}-{b}") }).collect::<Vec<_>>().join(",")
}

/// A multi-prog file's lines over a step of `size` ranks: the `*` line takes every rank no
/// other line names (and is dropped when there is none), every rank must have exactly one
/// program, and no line may name a rank at or beyond `size`. Each line keeps its place: its
/// index is its application number.
pub fn resolve_ranks(apps: &[App], size: u32) -> Result<Vec<App>, RanksError> {
    let mut named = vec![usize::MAX; size as usize];
    for (i, app) in apps.iter().enumerate() {
        for &(a, b) in &app.ranks {
            if b >= size {
                return Err(RanksError::NamedBeyond {
                    line: i + 1,
                    program: app.argv.first().cloned().unwrap_or_default(),
                    rank: b,
                    size,
                });
            }
            for r in a..=b {
                if named[r as usize] != usize::MAX {
                    return Err(RanksError::NamedTwice { rank: r, first: named[r as usize] + 1, second: i + 1 });
                }
                named[r as usize] = i;
            }
        }
    }
    let rest: Vec<u32> = (0..size).filter(|&r| named[r as usize] == usize::MAX).collect();
    let mut out = Vec::with_capacity(apps.len());
    for app in apps {
        let mut app = app.clone();
        if app.rest {
            app.rest = false;
            app.ranks = ranges_of(rest.clone());
            if app.ranks.is_empty() {
                continue;
            }
        }
        out.push(app);
    }
    if !rest.is_empty() && !apps.iter().any(|a| a.rest) {
        return Err(RanksError::Unnamed { ranks: show_ranges(&ranges_of(rest)), size });
    }
    Ok(out)
}

/// The ranks a multi-prog file needs when `-n` is not given: one past the highest it names,
/// or None when a `*` line leaves the count to the step's default.
pub fn multi_prog_size(apps: &[App]) -> Option<u32> {
    if apps.iter().any(|a| a.rest) {
        return None;
    }
    apps.iter().flat_map(|a| a.ranks.iter().map(|r| r.1 + 1)).max()
}

/// Why a multi-prog file cannot be read, with its line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct MultiProgError {
    pub line: usize,
    pub message: String,
}

/// Read a Slurm `--multi-prog` file: each line `RANKS PROGRAM ARGS...`, where RANKS is a
/// comma-separated list of ranks and ranges (`0,2-3`) or `*` (every rank no other line names);
/// `%t` in the arguments is the rank, `%o` its offset among the line's ranks; words may be
/// quoted with `'...'` or `"..."`; blank lines and lines starting with `#` are skipped.
pub fn parse_multi_prog(text: &str) -> Result<Vec<App>, MultiProgError> {
    let err = |line: usize, message: String| MultiProgError { line, message };
    if text.len() > MAX_MULTI_PROG_BYTES {
        return Err(err(0, format!("the file is larger than {MAX_MULTI_PROG_BYTES} bytes")));
    }
    let mut apps: Vec<App> = Vec::new();
    let mut star: Option<usize> = None;
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        if raw.len() > MAX_LINE_BYTES {
            return Err(err(n, format!("the line is longer than {MAX_LINE_BYTES} bytes")));
        }
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let words = split_words(line).map_err(|e| err(n, e.to_string()))?;
        let Some((ranks, argv)) = words.split_first() else { continue };
        if argv.is_empty() {
            return Err(err(n, format!("ranks {ranks:?} but no program; write `RANKS PROGRAM [ARGS...]`")));
        }
        if apps.len() >= MAX_APPS {
            return Err(err(n, format!("more than {MAX_APPS} programs")));
        }
        let mut app = App { argv: argv.to_vec(), expand: true, ..Default::default() };
        if ranks == "*" {
            if let Some(first) = star {
                return Err(err(
                    n,
                    format!("a second `*` line (the first is line {first}); only one may take the rest"),
                ));
            }
            star = Some(n);
            app.rest = true;
        } else {
            app.ranks = parse_rank_list(ranks).map_err(|e| err(n, e.to_string()))?;
        }
        apps.push(app);
    }
    if apps.is_empty() {
        return Err(err(0, "no program in the file: each line is `RANKS PROGRAM [ARGS...]`".into()));
    }
    // Overlaps between lines are reported here, with their lines, before any step is asked for.
    let mut seen: Vec<(u32, u32, usize)> = Vec::new();
    for (i, app) in apps.iter().enumerate() {
        for &(a, b) in &app.ranks {
            if let Some(&(_, _, j)) = seen.iter().find(|(x, y, _)| a <= *y && *x <= b) {
                let r =
                    seen.iter().filter(|(x, y, _)| a <= *y && *x <= b).map(|(x, _, _)| (*x).max(a)).min().unwrap_or(a);
                return Err(err(
                    line_of(text, i),
                    format!("rank {r} is also named by program {} (each rank has one program)", j + 1),
                ));
            }
        }
        seen.extend(app.ranks.iter().map(|&(a, b)| (a, b, i)));
    }
    Ok(apps)
}

/// The line number of the `index`-th program line of a multi-prog file.
fn line_of(text: &str, index: usize) -> usize {
    text.lines()
        .enumerate()
        .filter(|(_, l)| {
            let l = l.trim();
            !l.is_empty() && !l.starts_with('#')
        })
        .nth(index)
        .map(|(i, _)| i + 1)
        .unwrap_or(0)
}

/// Why a multi-prog line's RANKS cannot be read (`s` is the whole field, `item` one of its
/// comma-separated parts).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RankListError {
    #[error("ranks {0:?}: expected ranks and ranges such as 0,2-3, or *")]
    Syntax(String),
    #[error("rank {0} is out of range: ranks are below {MAX_RANKS}")]
    OutOfRange(u32),
    #[error("ranks {item:?}: the range runs backwards; write {last}-{first}")]
    Backwards { item: String, first: u32, last: u32 },
    #[error("ranks {0:?} name more than {MAX_RANKS} ranks")]
    TooMany(String),
    #[error("ranks {0:?} name a rank twice")]
    Twice(String),
}

/// `0,2-3`: ascending disjoint ranges.
fn parse_rank_list(s: &str) -> Result<Vec<(u32, u32)>, RankListError> {
    let num = |t: &str| -> Result<u32, RankListError> {
        let v: u32 = t.trim().parse().map_err(|_| RankListError::Syntax(s.to_string()))?;
        if v >= MAX_RANKS {
            return Err(RankListError::OutOfRange(v));
        }
        Ok(v)
    };
    let mut ranks: Vec<u32> = Vec::new();
    for item in s.split(',') {
        let (a, b) = match item.split_once('-') {
            Some((a, b)) => (num(a)?, num(b)?),
            None => {
                let v = num(item)?;
                (v, v)
            }
        };
        if a > b {
            return Err(RankListError::Backwards { item: item.to_string(), first: a, last: b });
        }
        if ranks.len() as u64 + u64::from(b - a) + 1 > u64::from(MAX_RANKS) {
            return Err(RankListError::TooMany(s.to_string()));
        }
        ranks.extend(a..=b);
    }
    let n = ranks.len();
    ranks.sort_unstable();
    ranks.dedup();
    if ranks.len() != n {
        return Err(RankListError::Twice(s.to_string()));
    }
    Ok(ranges_of(ranks))
}

/// Why a multi-prog line cannot be split into words: a quote (`'` or `"`) left open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("an unterminated {0} quote")]
pub struct UnterminatedQuote(pub char);

/// Words of a line: separated by blanks, `'...'` and `"..."` quoting (no escapes inside).
fn split_words(line: &str) -> Result<Vec<String>, UnterminatedQuote> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\'' | '"' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some(q) if q == c => break,
                        Some(o) => cur.push(o),
                        None => return Err(UnterminatedQuote(c)),
                    }
                }
            }
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            c => {
                in_word = true;
                cur.push(c);
            }
        }
    }
    if in_word {
        words.push(cur);
    }
    Ok(words)
}

/// Plan a colon line's parts one after another over the allocation: each part is laid out by
/// its own request ([`plan_step`]) on the cores the parts before it left (overcommitting parts
/// may share them), its ranks numbered after theirs. Returns the merged plan (nodes ordered by
/// their lowest rank) and each part's ranks as an inclusive range.
pub fn plan_mpmd(
    alloc: &[NodeAllocation],
    topos: &[&Topology],
    in_use: &[CpuSet],
    parts: &[StepRequest],
) -> Result<(StepPlan, Vec<(u32, u32)>), StepError> {
    if parts.is_empty() || parts.len() > MAX_APPS {
        return Err(StepError::Invalid(format!("an MPMD step runs 1 to {MAX_APPS} programs, not {}", parts.len())));
    }
    let mut used: Vec<CpuSet> = in_use.to_vec();
    let mut nodes: Vec<StepNodePlan> = Vec::new();
    let mut ranges = Vec::with_capacity(parts.len());
    let mut offset = 0u32;
    for (i, req) in parts.iter().enumerate() {
        let in_part = |e: StepError| StepError::InPart { part: i as u32, error: Box::new(e) };
        let p = plan_step(alloc, topos, &used, req).map_err(in_part)?;
        let end = offset
            .checked_add(p.size)
            .filter(|&e| e <= MAX_RANKS)
            .ok_or_else(|| in_part(StepError::Invalid(format!("the parts add up to more than {MAX_RANKS} ranks"))))?;
        for n in p.nodes {
            if let Some(u) = used.get_mut(n.alloc_index) {
                u.union_with(&n.cpus);
            }
            let ranks = n.ranks.into_iter().map(|r| RankPlace { rank: r.rank + offset, cpus: r.cpus });
            match nodes.iter_mut().find(|m| m.alloc_index == n.alloc_index) {
                Some(m) => {
                    m.ranks.extend(ranks);
                    m.cpus.union_with(&n.cpus);
                }
                None => nodes.push(StepNodePlan {
                    alloc_index: n.alloc_index,
                    node: n.node,
                    ranks: ranks.collect(),
                    cpus: n.cpus,
                }),
            }
        }
        if p.size == 0 {
            return Err(in_part(StepError::Invalid("the part has no ranks".into())));
        }
        ranges.push((offset, end - 1));
        offset = end;
    }
    nodes.sort_by_key(|n| n.ranks.iter().map(|r| r.rank).min().unwrap_or(u32::MAX));
    Ok((StepPlan { size: offset, nodes }, ranges))
}

/// An MPMD step's programs as one command line for the invocation log (`berth acct --steps`):
/// the parts joined by `:`, each with its ranks (`--ranks 0-1`), variables and directory.
pub fn command_line(apps: &[App]) -> Vec<String> {
    let mut out = Vec::new();
    for (i, app) in apps.iter().enumerate() {
        if i > 0 {
            out.push(":".to_string());
        }
        if !app.ranks.is_empty() {
            out.push("--ranks".into());
            out.push(show_ranges(&app.ranks));
        } else if app.rest {
            out.push("--ranks".into());
            out.push("*".into());
        }
        for (k, v) in &app.env {
            out.push("--env".into());
            out.push(format!("{k}={v}"));
        }
        if let Some(d) = &app.cwd {
            out.push("--chdir".into());
            out.push(d.clone());
        }
        out.extend(app.argv.iter().cloned());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app(ranks: &[(u32, u32)], argv: &str) -> App {
        App {
            argv: argv.split_whitespace().map(String::from).collect(),
            ranks: ranks.to_vec(),
            expand: true,
            ..Default::default()
        }
    }

    #[test]
    fn a_multi_prog_file_reads_as_slurm_writes_it() {
        let text = "# a comment\n\n0-1,4  ./master --id %t\n  2 './b c' \"x y\" %o\n3 ./w\n* ./rest %t:%o\n";
        let apps = parse_multi_prog(text).unwrap();
        assert_eq!(apps.len(), 4);
        assert_eq!(apps[0].ranks, vec![(0, 1), (4, 4)]);
        assert_eq!(apps[1].argv, vec!["./b c", "x y", "%o"]);
        assert!(apps[3].rest && apps[3].ranks.is_empty());
        assert_eq!(multi_prog_size(&apps), None, "a * line leaves the count to -n");
        let resolved = resolve_ranks(&apps, 8).unwrap();
        assert_eq!(resolved[3].ranks, vec![(5, 7)]);
        assert_eq!(resolved[0].argv_of(4), vec!["./master", "--id", "4"]);
        assert_eq!(resolved[3].argv_of(6), vec!["./rest", "6:1"], "%o counts within the line's ranks");
        assert_eq!(rank_apps(&resolved, 8).unwrap(), vec![0, 0, 1, 2, 0, 3, 3, 3]);
        // Without * the highest rank named gives the count; a * with nothing left is dropped.
        let apps = parse_multi_prog("0 a\n1-2 b\n").unwrap();
        assert_eq!(multi_prog_size(&apps), Some(3));
        let apps = parse_multi_prog("0-1 a\n* b\n").unwrap();
        assert_eq!(resolve_ranks(&apps, 2).unwrap().len(), 1);
    }

    #[test]
    fn bad_multi_prog_files_say_which_line_and_what_to_do() {
        let cases = [
            ("0 ./a\n1\n", "line 2", "no program"),
            ("0-x ./a\n", "line 1", "expected ranks"),
            ("3-1 ./a\n", "line 1", "backwards"),
            ("0 ./a\n* b\n* c\n", "line 3", "second `*`"),
            ("0-3 ./a\n# c\n2 ./b\n", "line 3", "rank 2 is also named by program 1"),
            ("0 './a\n", "line 1", "unterminated"),
            ("99999999 ./a\n", "line 1", "out of range"),
            ("0,0 ./a\n", "line 1", "twice"),
            ("# nothing\n\n", "line 0", "no program"),
        ];
        for (text, line, what) in cases {
            let e = parse_multi_prog(text).unwrap_err().to_string();
            assert!(e.starts_with(line) && e.contains(what), "{text:?}: {e}");
        }
        let big = "0 a\n".repeat(MAX_MULTI_PROG_BYTES / 4 + 1);
        assert!(parse_multi_prog(&big).unwrap_err().to_string().contains("larger than"));
        let long = format!("0 {}\n", "a".repeat(MAX_LINE_BYTES));
        assert!(parse_multi_prog(&long).unwrap_err().to_string().contains("longer than"));
        let many: String = (0..=MAX_APPS).map(|i| format!("{i} a\n")).collect();
        assert!(parse_multi_prog(&many).unwrap_err().to_string().contains("more than 1024 programs"));
        // Against the step's size: ranks beyond it, ranks without a program.
        let apps = parse_multi_prog("0-5 a\n").unwrap();
        assert_eq!(
            resolve_ranks(&apps, 4).unwrap_err().to_string(),
            "program 1 (a) names rank 5, but the step has 4 rank(s) (0-3); name ranks below 4 or ask for more with -n"
        );
        let apps = parse_multi_prog("0 a\n2 b\n").unwrap();
        let e = resolve_ranks(&apps, 4).unwrap_err();
        assert_eq!(e, RanksError::Unnamed { ranks: "1,3".into(), size: 4 });
        assert_eq!(
            e.to_string(),
            "rank(s) 1,3 of the step's 4 have no program; name them, add a `*` line for the rest, or ask for fewer ranks with -n"
        );
        let apps = vec![app(&[(0, 1)], "a"), app(&[(1, 1)], "b")];
        assert_eq!(resolve_ranks(&apps, 2).unwrap_err().to_string(), "rank 1 is named by programs 1 and 2");
    }

    #[test]
    fn ranks_offsets_and_apps_of_a_colon_line() {
        let a = app(&[(0, 1)], "./a.out %t");
        let b = App { expand: false, ..app(&[(2, 5)], "./b.out %t") };
        assert_eq!((a.size(), b.size(), b.leader(), b.offset_of(4)), (2, 4, Some(2), Some(2)));
        assert_eq!(b.argv_of(3), vec!["./b.out", "%t"], "a colon part's words are its own");
        assert_eq!(rank_apps(&[a.clone(), b.clone()], 6).unwrap(), vec![0, 0, 1, 1, 1, 1]);
        assert_eq!(rank_apps(&[a.clone(), b.clone()], 7).unwrap_err().to_string(), "rank 6 has no program");
        assert_eq!(rank_apps(&[a.clone(), a.clone()], 2).unwrap_err().to_string(), "rank 0 has two programs (0 and 1)");
        assert_eq!(
            rank_apps(&[a.clone(), b.clone()], 4).unwrap_err().to_string(),
            "program 1 names ranks 2-5, beyond the step's 4 ranks"
        );
        assert_eq!(rank_apps(&[], 3).unwrap(), vec![0, 0, 0]);
        assert_eq!(
            command_line(&[a, b]),
            "--ranks 0-1 ./a.out %t : --ranks 2-5 ./b.out %t".split(' ').collect::<Vec<_>>()
        );
    }

    #[test]
    fn colon_parts_are_planned_one_after_another() {
        use crate::job::NodeAllocation;
        let topo = Topology::uniform(1, 1, 4, 1, 1 << 30);
        let node = |name: &str| NodeAllocation {
            gres: Default::default(),
            licenses: Default::default(),
            node_id: crate::NodeId(0),
            node: name.into(),
            cpus: CpuSet::parse_list("0-3").unwrap(),
            cores: 4,
            mems: CpuSet::parse_list("0").unwrap(),
            memory_bytes: 0,
            numa_memory: vec![],
            exclusive_numa: CpuSet::new(),
            subnodes: vec![],
            binding: vec![],
            ranks: vec![],
            gpus: vec![],
        };
        let alloc = [node("n1"), node("n2")];
        let topos = [&topo, &topo];
        let free = [CpuSet::new(), CpuSet::new()];
        let req = |n: u32| StepRequest { ntasks: Some(n), ..Default::default() };
        // Block: part 0 fills n1's first cores, part 1 the rest of n1 and then n2.
        let (plan, ranges) = plan_mpmd(&alloc, &topos, &free, &[req(2), req(4)]).unwrap();
        assert_eq!((plan.size, ranges.clone()), (6, vec![(0, 1), (2, 5)]));
        let show: Vec<(String, Vec<u32>)> =
            plan.nodes.iter().map(|n| (n.node.clone(), n.ranks.iter().map(|r| r.rank).collect())).collect();
        assert_eq!(show, vec![("n1".into(), vec![0, 1, 2, 3]), ("n2".into(), vec![4, 5])]);
        assert_eq!(plan.nodes[0].ranks[2].cpus.to_list(), "2", "part 1 takes the cores part 0 left");
        // Each part its own nodes: -N 2 for both puts ranks of both parts on each node.
        let spread = StepRequest { ntasks: Some(2), nodes: Some(2), ..Default::default() };
        let (plan, _) = plan_mpmd(&alloc, &topos, &free, &[spread.clone(), spread]).unwrap();
        let show: Vec<Vec<u32>> = plan.nodes.iter().map(|n| n.ranks.iter().map(|r| r.rank).collect()).collect();
        assert_eq!(show, vec![vec![0, 2], vec![1, 3]]);
        // Too many: the part that does not fit is named.
        let e = plan_mpmd(&alloc, &topos, &free, &[req(6), req(4)]).unwrap_err();
        assert!(matches!(e, StepError::InPart { part: 1, .. }), "{e:?}");
        assert!(e.to_string().starts_with("part 2 of the MPMD command"), "{e}");
        let over = StepRequest { overcommit: true, ..req(4) };
        let (plan, _) = plan_mpmd(&alloc, &topos, &free, &[req(8), over]).unwrap();
        assert_eq!(plan.size, 12, "an overcommitting part shares the cores");
    }
}
