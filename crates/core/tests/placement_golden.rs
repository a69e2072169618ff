//! Golden placement scenarios.
//!
//! For every fixture machine (tests/fixtures/topologies/*.json, berth's model of real hwloc
//! exports) and a few synthetic ones, a fixed script of jobs is placed one after another on a
//! single node, each success claimed before the next step. Every step's outcome is rendered as
//! one line and the whole is compared with tests/golden/<machine>.txt.
//!
//! The script's numbers are derived from the machine (cores of socket 0, cores and memory of a
//! NUMA node, ...) so that every step means the same on every machine. `BERTH_BLESS=1`
//! rewrites the golden files; review the diff before committing it.

use berth_core::binding::BindingStrategy;
use berth_core::directives::SubmitOptions;
use berth_core::job::{NodeAllocation, Shape};
use berth_core::node::{NodeCapacity, PROP_SINGLE_CPU};
use berth_core::placement::cluster::{place, Placement};
use berth_core::placement::{JobRequest, MemRequest, PlacementPolicy};
use berth_core::topology::Topology;
use berth_core::{CpuSet, NodeId};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const BLESS: &str = "BERTH_BLESS=1 cargo test -p berth-core --test placement_golden";
const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

fn tests_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests")
}

/// The fixture machines, by file stem, in name order.
fn fixture_machines() -> Vec<(String, Topology)> {
    let dir = tests_dir().join("fixtures/topologies");
    let mut files: Vec<PathBuf> =
        std::fs::read_dir(&dir).map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect()).unwrap_or_default();
    files.retain(|p| p.extension().is_some_and(|e| e == "json"));
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            let topo: Topology = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            topo.validate().unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p.file_stem().unwrap().to_string_lossy().into_owned(), topo)
        })
        .collect()
}

/// Synthetic machines with goldens of their own: a regular SMT box and an Altix-like host
/// (NUMA nodes of 2 CPUs, as in seeds/000).
fn synthetic_machines() -> Vec<(String, Topology)> {
    vec![
        ("uniform-2p2n4c2t".into(), Topology::uniform(2, 2, 4, 2, 4 * GIB)),
        ("uniform-altix-4p4n2c1t".into(), Topology::uniform(4, 4, 2, 1, 4 * GIB)),
    ]
}

// ---------------------------------------------------------------------------------------------
// Rendering

/// Exact sizes: `1G`, `1536M`, `4097K`, `12345B`.
fn size(b: u64) -> String {
    for (unit, s) in [("T", 1u64 << 40), ("G", GIB), ("M", MIB), ("K", 1 << 10)] {
        if b >= s && b.is_multiple_of(s) {
            return format!("{}{unit}", b / s);
        }
    }
    format!("{b}B")
}

fn label(r: &JobRequest) -> String {
    let unit = if r.threads { "pus" } else { "cores" };
    let mut s = match (&r.binding, r.shape) {
        (Some(b), _) => b.to_string(),
        (None, Shape::PerNode { nodes: 1, cores_per_node }) => format!("{cores_per_node} {unit}"),
        (None, Shape::PerNode { nodes, cores_per_node }) => format!("{nodes}x{cores_per_node} {unit}"),
        (None, Shape::Total { cores, chunk }) => format!("total {cores} {unit} in chunks of {chunk}"),
    };
    match r.mem {
        MemRequest::PerNode(0) => {}
        MemRequest::PerNode(b) => write!(s, " mem {}", size(b)).unwrap(),
        MemRequest::PerCpu(b) => write!(s, " mem-per-cpu {}", size(b)).unwrap(),
    }
    if r.system_cpus {
        s.push_str(" system-cpus");
    }
    if !r.properties.is_empty() {
        write!(s, " props {}", r.properties.join(",")).unwrap();
    }
    if r.rank_cpus > 0 {
        write!(s, " rank-cpus {}", r.rank_cpus).unwrap();
    }
    s
}

fn render_part(a: &NodeAllocation) -> String {
    let mut s = format!("cpus {} mems {} mem ", a.cpus, a.mems);
    if a.numa_memory.is_empty() {
        s.push('-');
    } else {
        let shares: Vec<String> = a.numa_memory.iter().map(|m| format!("{}:{}", m.numa, size(m.bytes))).collect();
        s.push_str(&shares.join(","));
    }
    if !a.exclusive_numa.is_empty() {
        write!(s, " exclusive {}", a.exclusive_numa).unwrap();
    }
    if !a.subnodes.is_empty() {
        let subs: Vec<String> = a.subnodes.iter().map(u32::to_string).collect();
        write!(s, " subnodes {}", subs.join(",")).unwrap();
    }
    if !a.binding.is_empty() {
        s.push_str(" binding");
        a.binding.iter().for_each(|(so, c)| write!(s, " {so},{c}").unwrap());
    }
    if !a.ranks.is_empty() {
        s.push_str(" ranks");
        a.ranks.iter().for_each(|r| write!(s, " {}/{}", r.cpus, r.mems).unwrap());
    }
    s
}

fn describe_machine(t: &Topology) -> Vec<String> {
    let mut out = vec![format!(
        "# {} packages, {} NUMA nodes, {} cores, {} PUs, {} memory",
        t.packages.len(),
        t.numa_nodes.len(),
        t.core_count(),
        t.pu_count(),
        size(t.memory_bytes())
    )];
    for (p, _) in t.packages.iter().enumerate() {
        let cores: Vec<usize> = (0..t.cores.len()).filter(|&i| t.cores[i].package == p).collect();
        out.push(format!(
            "# package {p}: cores {}-{} ({} cores)",
            cores.first().copied().unwrap_or(0),
            cores.last().copied().unwrap_or(0),
            cores.len()
        ));
    }
    for (i, n) in t.numa_nodes.iter().enumerate() {
        out.push(format!(
            "# numa[{i}] os {}: cpus {} mem {}{}",
            n.os_index,
            if n.cpus.is_empty() { "-".into() } else { n.cpus.to_list() },
            size(n.memory_bytes),
            if n.special { " special" } else { "" }
        ));
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The script

#[allow(clippy::large_enum_variant)] // a test script, a few steps
enum Step {
    /// A job, with what the step shows.
    Job(String, JobRequest),
    /// Release the job of an earlier step of the same phase (1-based within the phase).
    Release(usize),
}

struct Phase {
    title: String,
    setup: Box<dyn Fn(&mut NodeCapacity)>,
    steps: Vec<Step>,
}

fn job(note: &str, r: JobRequest) -> Step {
    Step::Job(note.into(), r)
}

fn cores(c: u32) -> JobRequest {
    JobRequest::simple(Shape::PerNode { nodes: 1, cores_per_node: c }, 0)
}

fn pus(c: u32) -> JobRequest {
    JobRequest { threads: true, ..cores(c) }
}

fn with_mem(r: JobRequest, b: u64) -> JobRequest {
    JobRequest { mem: MemRequest::PerNode(b), ..r }
}

/// A bound job as `berth submit --binding <spec>` makes it (shape from the binding).
fn bound(spec: &str, mem: u64) -> JobRequest {
    let b: BindingStrategy = spec.parse().unwrap_or_else(|e| panic!("{spec}: {e}"));
    let o = SubmitOptions { binding: Some(b), mem: (mem > 0).then_some(mem), ..Default::default() };
    JobRequest::from_options(&o).unwrap_or_else(|e| panic!("{spec}: {e}"))
}

/// What the script derives from the machine.
struct Facts {
    packages: u32,
    /// Cores of each package.
    per_socket: Vec<u32>,
    cores: u32,
    pus: u32,
    /// Ordinary NUMA nodes with cores (indexes into `numa_nodes`).
    numa: Vec<usize>,
    /// Cores and memory of the first such NUMA node.
    numa_cores: u32,
    numa_pus: u32,
    numa_mem: u64,
    total_mem: u64,
}

impl Facts {
    fn of(t: &Topology) -> Self {
        let per_socket: Vec<u32> =
            (0..t.packages.len()).map(|p| t.cores.iter().filter(|c| c.package == p).count() as u32).collect();
        let numa: Vec<usize> =
            (0..t.numa_nodes.len()).filter(|&n| !t.numa_nodes[n].special && t.numa_cores(n).next().is_some()).collect();
        let first = numa[0];
        Facts {
            packages: t.packages.len() as u32,
            per_socket,
            cores: t.core_count() as u32,
            pus: t.pu_count() as u32,
            numa_cores: t.numa_cores(first).count() as u32,
            numa_pus: t.numa_cores(first).map(|c| t.cores[c].pus.len() as u32).sum(),
            numa_mem: t.numa_nodes[first].memory_bytes,
            total_mem: t.numa_nodes.iter().filter(|n| !n.special).map(|n| n.memory_bytes).sum(),
            numa,
        }
    }

    /// A small memory amount (an eighth of a NUMA node, whole MiB).
    fn small_mem(&self) -> u64 {
        self.numa_mem / 8 / MIB * MIB
    }

    /// More than a NUMA node has (one and a half), or 1G where nodes report no memory.
    fn wide_mem(&self) -> u64 {
        if self.numa_mem == 0 {
            GIB
        } else {
            self.numa_mem / 2 * 3
        }
    }
}

fn fresh(_: &mut NodeCapacity) {}

fn script(t: &Topology) -> Vec<Phase> {
    let f = Facts::of(t);
    let (p, s0) = (f.packages, f.per_socket[0]);
    let last = p - 1;
    let k_last = f.per_socket[last as usize];
    let n = s0.min(4);
    let m = k_last.min(2);
    let mut phases = vec![];

    // Binding strategies, every form (seeds/004), in two phases so that each form has free
    // cores to take, also on small machines. First the linear forms and striding:<n>:<step>.
    phases.push(Phase {
        title: "binding strategies: linear, striding:<n>:<step>".into(),
        setup: Box::new(fresh),
        steps: vec![
            job("an empty socket first", bound(&format!("linear:{n}"), 0)),
            job("again: the next empty socket, else the fullest socket with a run", bound(&format!("linear:{n}"), 0)),
            job("the last cores of the last socket", bound(&format!("linear:{m}:{last},{}", k_last - m), 0)),
            job("2 free cores 3 apart, the first such", bound("striding:2:3", 0)),
            job("a named core that is taken: busy", bound("linear:1:0,0", 0)),
            job("more cores than the node has: never", bound(&format!("linear:{}", f.cores + 1), 0)),
            job("a socket that does not exist: never", bound(&format!("linear:1:{p},0"), 0)),
        ],
    });

    // Then ranges (global and <socket>,<core>) and explicit lists.
    let hi = (f.cores - 1).min(5);
    let lo_last = k_last.saturating_sub(5);
    let x_last = k_last.saturating_sub(2);
    let explicit =
        if (last, x_last) == (0, 0) { "explicit:0,0".to_string() } else { format!("explicit:0,0:{last},{x_last}") };
    phases.push(Phase {
        title: "binding strategies: striding ranges, explicit".into(),
        setup: Box::new(fresh),
        steps: vec![
            job("global range, every second core", bound(&format!("striding:1-{hi}:2"), 0)),
            job(
                "<socket>,<core> range at the end of the last socket, every second core",
                bound(&format!("striding:{last},{lo_last}-{last},{}:2", k_last - 1), 0),
            ),
            job("explicit: the first core and one near the end", bound(&explicit, 0)),
            job("explicit naming a taken core: busy", bound("explicit:0,1", 0)),
            job("a socket that does not exist: never", bound(&format!("explicit:{p},0"), 0)),
            job("a core that does not exist: never", bound(&format!("striding:0-{}:1", f.cores), 0)),
            job("a bound job with memory: local memory of its core", bound("striding:1:1", f.small_mem())),
        ],
    });

    // Memory: local when small, borrowed from a neighbour when more than a NUMA node has,
    // never oversubscribed.
    phases.push(Phase {
        title: "memory".into(),
        setup: Box::new(fresh),
        steps: vec![
            job("small memory: the local NUMA node only", with_mem(cores(2), f.small_mem())),
            job("more than a NUMA node has: borrows from a neighbour", with_mem(cores(2), f.wide_mem())),
            job(
                "memory per CPU",
                JobRequest { mem: MemRequest::PerCpu(f.small_mem() / 2), ..cores(3.min(f.numa_cores)) },
            ),
            job("all the node's memory while some is taken: busy", with_mem(cores(1), f.total_mem.max(1))),
            job("more memory than the node has: never", with_mem(cores(1), f.total_mem + 1)),
            job(
                "a total-cores shape with memory",
                JobRequest::simple(Shape::Total { cores: 2, chunk: 1 }, f.small_mem()),
            ),
        ],
    });

    // Whole NUMA nodes for core counts that are multiples of a NUMA node's.
    phases.push(Phase {
        title: "NUMA alignment".into(),
        setup: Box::new(fresh),
        steps: vec![
            job("one core: some NUMA node becomes partly used", cores(1)),
            job("a NUMA node's worth of cores: a whole NUMA node, not the partly used one", cores(f.numa_cores)),
            job("two NUMA nodes' worth", cores(2 * f.numa_cores)),
            job("a NUMA node's worth of PUs: a whole NUMA node", pus(f.numa_pus)),
            job("an odd count", cores(3)),
        ],
    });

    // Large parallel jobs (more than 8 CPUs): whole NUMA nodes nobody else uses.
    phases.push(Phase {
        title: "large parallel jobs".into(),
        setup: Box::new(fresh),
        steps: vec![
            job("large, on a fresh node: whole NUMA nodes, held exclusively", cores(9)),
            job("a small job: not in the large job's NUMA nodes", cores(2)),
            job("more memory than a NUMA node: never borrowed from the large job's", with_mem(cores(1), f.wide_mem())),
            job("a second large job with memory: only untouched NUMA nodes", with_mem(cores(9), f.small_mem())),
            Step::Release(1),
            job("large job of PUs: whole NUMA nodes too", pus(9)),
            job("a bound large job: cores in untouched NUMA nodes only", bound("linear:9", 0)),
            job("the whole node: busy", cores(f.cores)),
        ],
    });

    // Hardware threads.
    phases.push(Phase {
        title: "threads (PUs)".into(),
        setup: Box::new(fresh),
        steps: vec![
            job("3 PUs", pus(3)),
            job("1 PU: a partly used core's PU first", pus(1)),
            job("1 core: a whole core, never a partly used one", cores(1)),
            job("PUs with memory per CPU", JobRequest { mem: MemRequest::PerCpu(f.small_mem() / 4), ..pus(2) }),
            job("more PUs than the node has: never", pus(f.pus + 1)),
        ],
    });

    // System CPUs: the first PU is held back for daemons (seeds/000).
    let first_pu = t.cores[0].pus[0];
    phases.push(Phase {
        title: format!("system CPUs (PU {first_pu} held back)"),
        setup: Box::new(move |node| {
            node.system_pus = CpuSet::from_iter_u32([first_pu]);
            node.refresh();
        }),
        steps: vec![
            job("1 core: never the system PU's core", cores(1)),
            job("1 PU: never the system PU", pus(1)),
            job("1 PU allowed system CPUs: may take the system PU", JobRequest { system_cpus: true, ..pus(1) }),
            job("a NUMA node's worth: the system PU's NUMA node is not whole", cores(f.numa_cores)),
            job("all the cores: never (system PU held back)", cores(f.cores)),
            job("all the cores allowed system CPUs: busy", JobRequest { system_cpus: true, ..cores(f.cores) }),
            job("all the PUs: never", pus(f.pus)),
        ],
    });

    // Per-rank sub-cpusets.
    phases.push(Phase {
        title: "rank sub-cpusets".into(),
        setup: Box::new(fresh),
        steps: vec![
            job("large, ranks of 4 cores with local memory", JobRequest { rank_cpus: 4, ..cores(12) }),
            Step::Release(1),
            job("4 ranks of 1 core", JobRequest { rank_cpus: 1, ..cores(4) }),
            job("3 ranks of 2 cores", JobRequest { rank_cpus: 2, ..cores(6) }),
            job("3 cores, ranks of 2: one rank", JobRequest { rank_cpus: 2, ..cores(3) }),
            job("4 PUs, a rank per PU", JobRequest { rank_cpus: 1, ..pus(4) }),
            job("2 cores, ranks of 4: one rank", JobRequest { rank_cpus: 4, ..cores(2) }),
        ],
    });

    // Subnodes of 2 NUMA nodes; subnode 1 only for single-CPU jobs.
    if f.numa.len() >= 4 {
        phases.push(Phase {
            title: "subnodes of 2 NUMA nodes, subnode 1 singlecpu".into(),
            setup: Box::new(|node| {
                node.set_subnode_size(2);
                node.subnodes[1].properties = vec![PROP_SINGLE_CPU.into()];
            }),
            steps: vec![
                job(
                    "1 core asking singlecpu: in subnode 1",
                    JobRequest { properties: vec!["singlecpu".into()], ..cores(1) },
                ),
                job("2 cores: not in the singlecpu subnode", cores(2)),
                job("2 cores asking singlecpu: never", JobRequest { properties: vec!["singlecpu".into()], ..cores(2) }),
                job("a property no subnode has: never", JobRequest { properties: vec!["nosuch".into()], ..cores(1) }),
                job("large: whole subnodes, untouched, not singlecpu", cores(9)),
                job("more memory than a NUMA node: borrowed within its subnode", with_mem(cores(2), f.wide_mem())),
                job("1 core without properties", cores(1)),
            ],
        });
    }
    phases
}

/// Run the script on `t`; one line per step.
fn run(name: &str, t: Topology) -> String {
    let topo = Arc::new(t);
    let policy = PlacementPolicy::default();
    let mut out = vec![format!("# placement golden for {name}; regenerate with {BLESS}")];
    out.extend(describe_machine(&topo));
    let mut number = 0;
    for (pi, phase) in script(&topo).into_iter().enumerate() {
        let mut node = NodeCapacity::new(NodeId(0), "n0", topo.clone());
        (phase.setup)(&mut node);
        out.push(String::new());
        out.push(format!("== phase {}: {} (fresh node)", pi + 1, phase.title));
        if !node.subnodes.is_empty() {
            for (i, s) in node.subnodes.iter().enumerate() {
                let os: Vec<String> = s.numa.iter().map(|&n| topo.numa_nodes[n].os_index.to_string()).collect();
                out.push(format!("# subnode {i}: numa os {} props [{}]", os.join(","), s.properties.join(",")));
            }
        }
        // Per step of the phase: the global number and the allocation it holds.
        let mut held: Vec<(usize, Option<NodeAllocation>)> = vec![];
        for step in phase.steps {
            number += 1;
            let (note, req) = match step {
                Step::Job(note, req) => (note, req),
                Step::Release(k) => {
                    let (n, alloc) = &mut held[k - 1];
                    let line = match alloc.take() {
                        Some(a) => {
                            node.release(&a);
                            format!("step {number}: release step {n} -> ok")
                        }
                        None => format!("step {number}: release step {n} -> nothing held"),
                    };
                    out.push(line);
                    held.push((number, None));
                    continue;
                }
            };
            let result = match place(std::slice::from_ref(&node), &policy, &req) {
                Placement::Now(alloc) => {
                    assert_eq!(alloc.len(), 1, "one node, one part");
                    node.claim(&alloc[0]);
                    let line = render_part(&alloc[0]);
                    held.push((number, Some(alloc.into_iter().next().unwrap())));
                    line
                }
                Placement::Busy(m) => {
                    held.push((number, None));
                    format!("busy: {m}")
                }
                Placement::Never(m) => {
                    held.push((number, None));
                    format!("never: {m}")
                }
            };
            out.push(format!("# {note}"));
            out.push(format!("step {number}: {} -> {result}", label(&req)));
        }
    }
    out.push(String::new());
    out.join("\n")
}

/// Compare (or with BERTH_BLESS=1 write) the golden of each machine; all mismatches at once.
fn check(machines: Vec<(String, Topology)>) {
    let dir = tests_dir().join("golden");
    let bless = std::env::var("BERTH_BLESS").is_ok_and(|v| v == "1");
    let mut problems = vec![];
    for (name, topo) in machines {
        let got = run(&name, topo);
        let path = dir.join(format!("{name}.txt"));
        if bless {
            std::fs::create_dir_all(&dir).unwrap();
            if std::fs::read_to_string(&path).ok().as_deref() != Some(got.as_str()) {
                std::fs::write(&path, &got).unwrap();
                eprintln!("blessed {}", path.display());
            }
            continue;
        }
        match std::fs::read_to_string(&path) {
            Err(e) => problems.push(format!("{}: {e}; create it with `{BLESS}`", path.display())),
            Ok(want) if want == got => {}
            Ok(want) => {
                let (w, g): (Vec<&str>, Vec<&str>) = (want.lines().collect(), got.lines().collect());
                let mut diff = vec![];
                for i in 0..w.len().max(g.len()) {
                    let (a, b) = (w.get(i).copied().unwrap_or("<none>"), g.get(i).copied().unwrap_or("<none>"));
                    if a != b {
                        diff.push(format!("  line {}:\n    want {a}\n    got  {b}", i + 1));
                    }
                }
                let shown = diff.len().min(12);
                problems.push(format!(
                    "{} differs ({} lines):\n{}{}",
                    path.display(),
                    diff.len(),
                    diff[..shown].join("\n"),
                    if diff.len() > shown { "\n  ..." } else { "" }
                ));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{}\nif the change is intended, run `{BLESS}` and review the diff",
        problems.join("\n")
    );
}

#[test]
fn golden_synthetic_machines() {
    check(synthetic_machines());
}

#[test]
fn golden_fixture_machines() {
    let machines = fixture_machines();
    assert!(
        !machines.is_empty(),
        "no topology fixtures in {}; they are generated with `BERTH_BLESS=1 cargo test -p berth-agent fixtures_match_xml`",
        tests_dir().join("fixtures/topologies").display()
    );
    check(machines);
}

/// Every golden file belongs to a machine: a renamed or removed fixture leaves none behind.
#[test]
fn golden_files_have_machines() {
    let mut names: Vec<String> = fixture_machines().into_iter().chain(synthetic_machines()).map(|m| m.0).collect();
    names.sort();
    let dir = tests_dir().join("golden");
    let Ok(rd) = std::fs::read_dir(&dir) else { return };
    let stale: Vec<String> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| e.path().file_stem().map(|s| s.to_string_lossy().into_owned()))
        .filter(|s| names.binary_search(s).is_err())
        .collect();
    assert!(stale.is_empty(), "golden files without a machine in {}: {stale:?}", dir.display());
}
