//! `berth nodes --topology`: one node drawn for a terminal, one character per PU, in the spirit
//! of the cpus/mems pictures of fine-grained cpusets (which job has which CPU, how much of each
//! memory node is taken).
//!
//! Each core is a bracketed group of its PUs: `.` free, a letter for the job holding the PU,
//! `s` a system CPU (free but reserved for daemons), `x` disallowed by the OS, `!` claimed by
//! several jobs (an inconsistent report). Letters go A-Z, a-z without s and x, 0-9, then `+`
//! for every further job; the legend says which is which. On hybrid machines E-cores (kind 0)
//! get an `e` before the group, `e[..]`, other kinds none. Nothing here panics on inconsistent
//! input: unreadable cpu lists and PUs outside the topology become `note:` lines, unknown
//! indexes get labels.

use berth_core::gpu::Gpu;
use berth_core::topology::{Core, Topology};
use berth_core::units::format_size;
use berth_core::{CpuSet, JobId};
use berth_protocol::node::{GpuHolder, NodeInfo, PuHolder};
use std::collections::{BTreeSet, HashMap};

/// Job letters in order of job id; `s` and `x` are left out as they mark system and disallowed
/// PUs.
const LETTERS: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrtuvwyz0123456789";
/// The letter shared by all jobs beyond the 60 that get one of their own.
const OVERFLOW: char = '+';
const BAR_WIDTH: u64 = 10;

/// Each job holding PUs (or GPUs) with its letter, in order of job id.
pub fn job_letters(pu_jobs: &[PuHolder], gpu_jobs: &[GpuHolder]) -> Vec<(char, JobId)> {
    let ids: BTreeSet<JobId> = pu_jobs.iter().map(|h| h.job).chain(gpu_jobs.iter().map(|h| h.job)).collect();
    let mut letters = LETTERS.chars();
    ids.into_iter().map(|id| (letters.next().unwrap_or(OVERFLOW), id)).collect()
}

/// The drawing of `node`, lines of at most `width` characters (at least 40), ending in a newline.
pub fn draw_node(node: &NodeInfo, width: usize) -> String {
    let width = width.max(40);
    let mut out = String::new();
    let Some(topo) = &node.layout else {
        let text = format!("{}: topology not sent by the controller", node.name);
        fill(&mut out, &words(&text), " ", 0, 2, width);
        return out;
    };
    // A big node's GE string is long and says less than the drawing: keep it to one line.
    let ge: String = match node.topology.chars().nth(width - 3) {
        Some(_) => node.topology.chars().take(width - 3).chain(['…']).collect(),
        None => node.topology.clone(),
    };
    // GPUs are named only on nodes that have some, so other drawings stay as they were.
    let gpus = if topo.gpus.is_empty() { String::new() } else { format!(", {}", count(topo.gpus.len(), "GPU")) };
    let header = format!(
        "{} {}: {}, {}, {}, {}{gpus}; memory {}/{} used; {}",
        node.name,
        node.state,
        count(topo.packages.len(), "package"),
        count(topo.numa_nodes.len(), "NUMA node"),
        count(topo.core_count(), "core"),
        count(topo.pu_count(), "PU"),
        format_size(node.memory_allocated_bytes),
        format_size(node.memory_bytes),
        ge
    );
    fill(&mut out, &words(&header), " ", 0, 2, width);

    let mut notes = Vec::new();
    let letters = job_letters(&node.pu_jobs, &node.gpu_jobs);
    let letter_of = |job: JobId| letters.iter().find(|(_, j)| *j == job).map(|(c, _)| *c);
    let all = topo.all_pus();
    let mut held: HashMap<u32, char> = HashMap::new();
    for h in &node.pu_jobs {
        let Ok(set) = CpuSet::parse_list(&h.cpus) else {
            notes.push(format!("job {} has an unreadable cpu list {:?}", h.job, short(&h.cpus)));
            continue;
        };
        let mut outside = set.clone();
        outside.subtract(&all);
        if !outside.is_empty() {
            notes.push(format!("job {} holds PUs {} that are not in the topology", h.job, short(&outside.to_list())));
        }
        let c = letter_of(h.job).unwrap_or(OVERFLOW);
        for pu in set.iter().filter(|&p| all.contains(p)) {
            if held.insert(pu, c).is_some_and(|prev| prev != c) {
                held.insert(pu, '!');
            }
        }
    }
    let system = CpuSet::parse_list(&node.system_cpus).unwrap_or_else(|_| {
        notes.push(format!("unreadable system cpu list {:?}", short(&node.system_cpus)));
        CpuSet::new()
    });
    let cell = |pu: u32| match held.get(&pu) {
        Some(&c) => c,
        None if topo.disallowed.contains(pu) => 'x',
        None if system.contains(pu) => 's',
        None => '.',
    };
    // Only a machine with several kinds is hybrid; kind 0 alone is an ordinary machine.
    let hybrid = topo.cores.iter().any(|c| Some(c.kind) != topo.cores.first().map(|f| f.kind));
    let group = |core: &Core| {
        let mut g = String::from(if hybrid && core.kind == 0 { "e[" } else { "[" });
        g.extend(core.pus.iter().map(|&p| cell(p)));
        g.push(']');
        g
    };

    // The letter of the job holding each GPU ('!' if the books say several do).
    let mut gpu_held: HashMap<u32, char> = HashMap::new();
    for h in &node.gpu_jobs {
        let c = letter_of(h.job).unwrap_or(OVERFLOW);
        for &g in &h.gpus {
            if gpu_held.insert(g, c).is_some_and(|prev| prev != c) {
                gpu_held.insert(g, '!');
            }
        }
    }
    let gpu_holder = |g: &Gpu| gpu_held.get(&g.index).copied();
    // NUMA OS indexes padded to one width so the memory bars line up.
    let pad = topo.numa_nodes.iter().map(|n| n.os_index.to_string().len()).max().unwrap_or(1);
    let mut gpus_drawn: BTreeSet<u32> = BTreeSet::new();
    // Packages and NUMA nodes in the order their cores come, so bad indexes still get drawn.
    for p in first_seen(topo.cores.iter().map(|c| c.package)) {
        let label =
            topo.packages.get(p).map_or(format!("unknown package (index {p})"), |k| format!("package {}", k.os_index));
        fill(&mut out, &[label], " ", 2, 4, width);
        let cores: Vec<&Core> = topo.cores.iter().filter(|c| c.package == p).collect();
        for numa in first_seen(cores.iter().map(|c| c.numa)) {
            let here: Vec<&Core> = cores.iter().copied().filter(|c| c.numa == numa).collect();
            let pus: CpuSet = here.iter().flat_map(|c| c.pus.iter().copied()).collect();
            fill(&mut out, &numa_line(node, topo, numa, &pus, pad, &letter_of), "  ", 4, 8, width);
            fill(&mut out, &here.iter().map(|c| group(c)).collect::<Vec<_>>(), " ", 6, 6, width);
            // The NUMA node's GPUs beside its cores.
            let local: Vec<&Gpu> = match numa.and_then(|i| topo.numa_nodes.get(i)) {
                Some(n) => topo.numa_gpus(n.os_index).filter(|g| !gpus_drawn.contains(&g.index)).collect(),
                None => vec![],
            };
            if !local.is_empty() {
                gpus_drawn.extend(local.iter().map(|g| g.index));
                fill(
                    &mut out,
                    &local.iter().map(|g| gpu_token(g, gpu_holder(g))).collect::<Vec<_>>(),
                    " ",
                    6,
                    6,
                    width,
                );
            }
        }
    }
    // GPUs hwloc could not put on one NUMA node (locality unknown or spanning several).
    let unplaced: Vec<String> =
        topo.gpus.iter().filter(|g| !gpus_drawn.contains(&g.index)).map(|g| gpu_token(g, gpu_holder(g))).collect();
    if !unplaced.is_empty() {
        fill(&mut out, &["GPUs without a NUMA node".to_string()], " ", 2, 4, width);
        fill(&mut out, &unplaced, " ", 6, 6, width);
    }
    // Memory-only NUMA nodes (HBM, NVM without cores) belong to no package we know of.
    let coreless: Vec<usize> =
        (0..topo.numa_nodes.len()).filter(|&i| !topo.cores.iter().any(|c| c.numa == Some(i))).collect();
    if !coreless.is_empty() {
        fill(&mut out, &["memory only".to_string()], " ", 2, 4, width);
        for i in coreless {
            fill(&mut out, &numa_line(node, topo, Some(i), &CpuSet::new(), pad, &letter_of), "  ", 4, 8, width);
        }
    }
    for s in &node.subnodes {
        let mut tokens = vec![format!("subnode {}", s.index), format!("numa {}", s.numa), s.state.clone()];
        if !s.properties.is_empty() {
            tokens.push(s.properties.join(","));
        }
        fill(&mut out, &tokens, "  ", 2, 4, width);
    }
    for note in notes {
        fill(&mut out, &words(&format!("note: {note}")), " ", 2, 4, width);
    }

    let mut legend = vec![];
    legend.extend(letters.iter().filter(|(c, _)| *c != OVERFLOW).map(|(c, j)| format!("{c}=job {j}")));
    let more: Vec<String> = letters.iter().filter(|(c, _)| *c == OVERFLOW).map(|(_, j)| j.to_string()).collect();
    if !more.is_empty() {
        legend.push(format!("{OVERFLOW}=jobs {}", more.join(",")));
    }
    legend.push(".=free".into());
    let drawn: BTreeSet<char> = topo.cores.iter().flat_map(|c| c.pus.iter().map(|&p| cell(p))).collect();
    for (c, meaning) in [('s', "s=system"), ('x', "x=disallowed"), ('!', "!=several jobs")] {
        if drawn.contains(&c) {
            legend.push(meaning.into());
        }
    }
    if hybrid {
        legend.push("e[]=E-core".into());
    }
    if !topo.gpus.is_empty() {
        legend.push("<gpu N TYPE>=GPU".into());
    }
    if !gpu_held.is_empty() {
        legend.push("<L gpu ..>=held by job L".into());
    }
    if topo.gpus.iter().any(|g| g.link_group.is_some()) {
        legend.push("~K=linked GPUs (NVLink group K)".into());
    }
    legend[0] = format!("legend: {}", legend[0]);
    fill(&mut out, &legend, "  ", 2, 4, width);
    out
}

/// The line of NUMA node `numa` (an index into `topo.numa_nodes`) drawn with PUs `pus`: OS index,
/// memory bar and figures, exclusive job, special memory, cpus.
fn numa_line(
    node: &NodeInfo,
    topo: &Topology,
    numa: Option<usize>,
    pus: &CpuSet,
    pad: usize,
    letter_of: &dyn Fn(JobId) -> Option<char>,
) -> Vec<String> {
    let cpus = if pus.is_empty() { vec![] } else { vec![format!("cpus {}", pus.to_list())] };
    let Some(i) = numa else { return [vec!["no NUMA node".into()], cpus].concat() };
    let Some(n) = topo.numa_nodes.get(i) else {
        return [vec![format!("unknown NUMA node (index {i})")], cpus].concat();
    };
    let mut tokens = vec![format!("numa {:<pad$}", n.os_index)];
    let info = node.numa.iter().find(|m| m.os_index == n.os_index);
    match info {
        Some(m) => {
            let used = match m.allocated_bytes.checked_mul(BAR_WIDTH).and_then(|x| x.checked_div(m.memory_bytes)) {
                // Any allocation shows, and the bar is full only when the node is.
                Some(0) if m.allocated_bytes > 0 => 1,
                Some(u) => u.min(BAR_WIDTH),
                None => BAR_WIDTH * u64::from(m.allocated_bytes > 0),
            } as usize;
            tokens.push(format!("[{}{}]", "#".repeat(used), "-".repeat(BAR_WIDTH as usize - used)));
            tokens.push(format!("{}/{}", format_size(m.allocated_bytes), format_size(m.memory_bytes)));
        }
        None => tokens.push(format!("?/{}", format_size(n.memory_bytes))),
    }
    tokens.extend(cpus);
    if let Some(job) = info.and_then(|m| m.exclusive_job) {
        tokens.push(format!("excl job {job}{}", letter_of(job).map_or(String::new(), |c| format!(" ({c})"))));
    }
    if n.special || info.is_some_and(|m| m.special) {
        tokens.push("special".into());
    }
    // Memory not from hwloc says where it came from, as in the nodes table.
    if !n.memory_source.is_hwloc() {
        tokens.push(format!("memory from {}", n.memory_source));
    }
    tokens
}

/// One GPU as drawn: `<gpu 0 a100-sxm4-80gb ~0>`, `~0` its link group; `<A gpu 0 ...>` when
/// job A holds it.
fn gpu_token(g: &Gpu, holder: Option<char>) -> String {
    let link = g.link_group.map_or(String::new(), |l| format!(" ~{l}"));
    let held = holder.map_or(String::new(), |c| format!("{c} "));
    format!("<{held}gpu {} {}{link}>", g.index, short(&g.type_name()))
}

fn first_seen<T: PartialEq>(items: impl Iterator<Item = T>) -> Vec<T> {
    let mut seen = Vec::new();
    for item in items {
        if !seen.contains(&item) {
            seen.push(item);
        }
    }
    seen
}

fn count(n: usize, what: &str) -> String {
    format!("{n} {what}{}", if n == 1 { "" } else { "s" })
}

fn words(text: &str) -> Vec<String> {
    text.split_whitespace().map(String::from).collect()
}

/// A bad string from the wire, cut so it cannot flood the terminal.
fn short(s: &str) -> String {
    let mut cut: String = s.chars().take(40).collect();
    if cut.len() < s.len() {
        cut.push('…');
    }
    cut
}

/// Append `tokens` joined by `sep` as lines of at most `width` characters, the first indented by
/// `indent`, the rest by `cont`. A token longer than a line is cut (a big node's GE string);
/// control characters become `?` so a name from the wire cannot break the layout.
fn fill(out: &mut String, tokens: &[String], sep: &str, indent: usize, cont: usize, width: usize) {
    let mut line = " ".repeat(indent);
    let mut len = indent;
    let mut fresh = true;
    let mut flush = |line: &mut String, len: &mut usize| {
        out.push_str(line.trim_end());
        out.push('\n');
        *line = " ".repeat(cont);
        *len = cont;
    };
    for tok in tokens {
        let tok: String = tok.chars().map(|c| if c.is_control() { '?' } else { c }).collect();
        let mut rest = tok.as_str();
        loop {
            let n = rest.chars().count();
            let need = if fresh { n } else { sep.len() + n };
            if len + need <= width {
                if !fresh {
                    line.push_str(sep);
                }
                line.push_str(rest);
                len += need;
                fresh = false;
                break;
            }
            if fresh {
                let room = width.saturating_sub(len).max(1);
                let at = rest.char_indices().nth(room).map_or(rest.len(), |(i, _)| i);
                line.push_str(&rest[..at]);
                rest = &rest[at..];
            }
            flush(&mut line, &mut len);
            fresh = true;
        }
    }
    if !fresh {
        flush(&mut line, &mut len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_protocol::node::{NumaInfo, SubnodeInfo};

    const G: u64 = 1 << 30;

    fn node() -> NodeInfo {
        let topo = Topology::uniform(2, 2, 2, 2, 4 * G);
        let numa = |i: u32, used: u64, excl: Option<u64>| NumaInfo {
            os_index: i,
            memory_bytes: 4 * G,
            allocated_bytes: used,
            cpus: topo.numa_nodes[i as usize].cpus.to_list(),
            exclusive_job: excl.map(JobId),
            special: false,
            memory_source: Default::default(),
        };
        NodeInfo {
            id: 0,
            name: "n01".into(),
            state: "mixed".into(),
            address: "10.0.0.1:7101".into(),
            sockets: 2,
            cores: 8,
            pus: 16,
            topology: topo.ge_string(&CpuSet::new()),
            free: topo.ge_string(&CpuSet::parse_list("0-5,8-13").unwrap()),
            cpus_allocated: 12,
            memory_bytes: 16 * G,
            memory_allocated_bytes: 10 * G,
            numa: vec![numa(0, 4 * G, None), numa(1, 2 * G, None), numa(2, 3 * G, Some(42)), numa(3, G, None)],
            real_cpus: "0-15".into(),
            jobs: vec![JobId(17), JobId(42)],
            last_heard_seconds_ago: Some(1.0),
            system_cpus: "15".into(),
            subnodes: vec![
                SubnodeInfo { index: 0, numa: "0-1".into(), state: "up".into(), properties: vec![] },
                SubnodeInfo { index: 1, numa: "2-3".into(), state: "drained".into(), properties: vec!["fat".into()] },
            ],
            gpus: vec![],
            gpus_allocated: 0,
            gpu_jobs: vec![],
            gres: vec![],
            pu_jobs: vec![
                PuHolder { job: JobId(42), cpus: "8-13".into() },
                PuHolder { job: JobId(17), cpus: "0-5".into() },
            ],
            layout: Some(topo),
        }
    }

    #[test]
    fn draws_the_test_node() {
        let expected = "\
n01 mixed: 2 packages, 4 NUMA nodes, 8 cores, 16 PUs; memory 10G/16G used; SCTTCTTCTTCTTSCTTCTTCTTCTT
  package 0
    numa 0  [##########]  4G/4G  cpus 0-3
      [AA] [AA]
    numa 1  [#####-----]  2G/4G  cpus 4-7
      [AA] [..]
  package 1
    numa 2  [#######---]  3G/4G  cpus 8-11  excl job 42 (B)
      [BB] [BB]
    numa 3  [##--------]  1G/4G  cpus 12-15
      [BB] [.s]
  subnode 0  numa 0-1  up
  subnode 1  numa 2-3  drained  fat
  legend: A=job 17  B=job 42  .=free  s=system
";
        assert_eq!(draw_node(&node(), 120), expected);
        let mut bare = node();
        bare.layout = None;
        assert_eq!(draw_node(&bare, 80), "n01: topology not sent by the controller\n");
    }

    #[test]
    fn narrow_widths_wrap_without_losing_cores() {
        let mut big = node();
        big.layout = Some(Topology::uniform(2, 4, 16, 2, 4 * G));
        big.topology = big.layout.as_ref().unwrap().ge_string(&CpuSet::new());
        for n in [node(), big] {
            for width in 0..130 {
                let out = draw_node(&n, width);
                assert!(out.lines().all(|l| l.chars().count() <= width.max(40)), "width {width}:\n{out}");
                let drawn = out.lines().filter(|l| l.starts_with("      [")).flat_map(|l| l.split(' '));
                assert_eq!(drawn.filter(|g| g.starts_with('[')).count(), n.layout.as_ref().unwrap().core_count());
            }
        }
    }

    #[test]
    fn letters_kinds_and_conflicts() {
        let holders: Vec<PuHolder> = (1..=70).rev().map(|j| PuHolder { job: JobId(j), cpus: String::new() }).collect();
        let letters: String = job_letters(&holders, &[]).iter().map(|(c, _)| *c).collect();
        assert_eq!(&letters[..30], "ABCDEFGHIJKLMNOPQRSTUVWXYZabcd");
        assert!(!letters.contains(['s', 'x']) && letters.ends_with("89++++++++++"));

        let mut n = node();
        let mut topo = Topology::uniform(1, 1, 4, 1, G);
        topo.cores[2].kind = 1;
        topo.cores[3].kind = 1;
        topo.disallowed.insert(3);
        n.layout = Some(topo);
        n.pu_jobs = vec![PuHolder { job: JobId(5), cpus: "0-1".into() }, PuHolder { job: JobId(6), cpus: "1".into() }];
        let out = draw_node(&n, 80);
        assert!(out.starts_with("n01 mixed: 1 package, 1 NUMA node, 4 cores, 4 PUs; memory 10G/16G used;"), "{out}");
        assert!(out.contains("      e[A] e[!] [.] [x]\n"), "{out}");
        assert!(out.ends_with("legend: A=job 5  B=job 6  .=free  x=disallowed  !=several jobs  e[]=E-core\n"), "{out}");
    }

    /// Issue 20: each NUMA node's GPUs are drawn under its cores, with their type and link
    /// group; GPUs without a NUMA node get a section of their own.
    #[test]
    fn gpus_beside_their_numa_node() {
        let mut n = node();
        let topo = n.layout.as_mut().unwrap();
        topo.add_emulated_gpus(1).unwrap();
        topo.gpus[1].link_group = None;
        let mut far = topo.gpus[3].clone();
        (far.index, far.numa, far.emulated, far.model) = (4, None, false, Some("NVIDIA H100 80GB HBM3".into()));
        topo.gpus.push(far);
        topo.validate().unwrap();
        let out = draw_node(&n, 120);
        assert!(out.starts_with("n01 mixed: 2 packages, 4 NUMA nodes, 8 cores, 16 PUs, 5 GPUs; memory"), "{out}");
        assert!(out.contains("      [AA] [AA]\n      <gpu 0 emulated ~0>\n    numa 1"), "{out}");
        assert!(out.contains("      [AA] [..]\n      <gpu 1 emulated>\n  package 1"), "{out}");
        let tail = "      [BB] [.s]\n      <gpu 3 emulated ~2>\n  GPUs without a NUMA node\n      <gpu 4 hbm3 ~2>\n";
        assert!(out.contains(tail), "{out}");
        assert!(out.ends_with("s=system  <gpu N TYPE>=GPU  ~K=linked GPUs (NVLink group K)\n"), "{out}");
        // Without GPUs the drawing is unchanged (draws_the_test_node).
        assert!(!draw_node(&node(), 120).contains("gpu"));
    }

    /// Issue 20: a held GPU carries its job's letter; a job holding only GPUs (suspended: its
    /// PUs lent) still gets one.
    #[test]
    fn held_gpus_carry_their_jobs_letter() {
        let mut n = node();
        n.layout.as_mut().unwrap().add_emulated_gpus(1).unwrap();
        n.gpu_jobs = vec![
            GpuHolder { job: JobId(17), gpus: vec![0] },
            GpuHolder { job: JobId(9), gpus: vec![3] },
            GpuHolder { job: JobId(42), gpus: vec![3] },
        ];
        let out = draw_node(&n, 120);
        // Letters by job id: 9 A, 17 B, 42 C.
        assert!(out.contains("<B gpu 0 emulated ~0>"), "{out}");
        assert!(out.contains("<gpu 1 emulated ~0>"), "a free GPU is drawn as before: {out}");
        assert!(out.contains("<! gpu 3 emulated ~2>"), "two jobs on one GPU is shown: {out}");
        assert!(out.contains("A=job 9") && out.contains("<L gpu ..>=held by job L"), "{out}");
    }

    /// Issue 17 item 1: a NUMA node whose memory is not hwloc's says where it came from.
    #[test]
    fn memory_not_from_hwloc_names_its_source() {
        let mut n = node();
        if let Some(topo) = n.layout.as_mut() {
            topo.numa_nodes[1].memory_source = berth_core::topology::MemorySource::Split;
        }
        let out = draw_node(&n, 120);
        assert!(out.contains("    numa 1  [#####-----]  2G/4G  cpus 4-7  memory from split\n"), "{out}");
        assert_eq!(out.matches("memory from").count(), 1, "{out}");
    }

    /// Inconsistent reports (bad lists, indexes out of range, PUs twice) are drawn, never panic.
    #[test]
    fn garbage_does_not_panic() {
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut rnd = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n.max(1)
        };
        let lists = ["", "0-3", "x", "3-1", "5,5,,", "0-99999999", " 1 , 2 ", "-1", "1000-1100", "4294967295"];
        let names = ["", "n\n01\t\u{7}", "ñødé-名前", &"long".repeat(40)];
        for _ in 0..400 {
            let mut n = node();
            let mut t = Topology::uniform(rnd(3) as u32, 1 + rnd(2) as u32, 1 + rnd(3) as u32, 1 + rnd(2) as u32, G);
            for c in t.cores.iter_mut() {
                c.package = rnd(4) as usize;
                c.numa = [None, Some(rnd(6) as usize)][rnd(2) as usize];
                c.pus = (0..rnd(4)).map(|_| rnd(20) as u32).collect();
                c.kind = rnd(2) as u32;
            }
            t.disallowed = CpuSet::parse_list(lists[rnd(10) as usize]).unwrap_or_default();
            n.layout = Some(t);
            n.name = names[rnd(4) as usize].into();
            n.system_cpus = lists[rnd(10) as usize].into();
            n.pu_jobs = (0..rnd(5)).map(|j| PuHolder { job: JobId(j), cpus: lists[rnd(10) as usize].into() }).collect();
            for m in n.numa.iter_mut() {
                m.os_index = rnd(6) as u32;
                m.memory_bytes = [0, G, u64::MAX][rnd(3) as usize];
                m.allocated_bytes = [0, 3 * G, u64::MAX][rnd(3) as usize];
                m.exclusive_job = [None, Some(JobId(99))][rnd(2) as usize];
            }
            n.subnodes[1].properties = vec![names[rnd(4) as usize].into()];
            let width = rnd(150) as usize;
            let out = draw_node(&n, width);
            assert!(out.lines().all(|l| l.chars().count() <= width.max(40)), "width {width}:\n{out}");
        }
    }
}
