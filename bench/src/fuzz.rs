//! `berth-bench fuzz [--minutes M | --seconds S] [--targets a,b] [--seed N] [--out DIR] [--json]`:
//! a bounded fuzzing run over every fuzz target of berth (the generators and properties of the
//! `fuzzing` features of berth-core, berth-protocol, berth-agent and berth-sim, the same the
//! `tests/fuzz_*.rs` suites run), with random seeds, for M minutes shared equally between the
//! targets (round-robin slices of a few seconds).
//!
//! Every case runs under `catch_unwind`; a watchdog notes a case running over 1 s as slow and
//! one over 60 s as hung (the target is then dropped for the rest of the run). Each distinct
//! failure (panic location) is shrunk with proptest and saved under `bench/results/fuzz-crashes/`
//! (`TARGET-N.bin`: the input as generated; `.min.bin`: shrunk; `.txt`: message and inputs).
//! Prints per target the cases run, failures, slow cases and hangs; the seed reproduces the run.
//!
//! `berth-bench fuzz --targets TARGET --replay FILE` runs one saved input again (exit status 1
//! if it still fails), e.g. after a fix, before making it a regression test.
//!
//! Release builds do not check integer overflow; for that (as the test suites do) build with
//! `CARGO_PROFILE_RELEASE_OVERFLOW_CHECKS=true` (the run reports whether checks are on).

use anyhow::{bail, Context, Result};
use berth_core::fuzz::{panic_message, Target};
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A case running longer is noted (and its input saved) as slow.
const SLOW: Duration = Duration::from_secs(1);
/// A case running longer is a hang: its target is dropped for the rest of the run.
const HANG: Duration = Duration::from_secs(60);
/// Time per round-robin slice of one target.
const SLICE: Duration = Duration::from_secs(5);
/// Most time spent shrinking one failure.
const SHRINK_TIME: Duration = Duration::from_secs(20);
/// Inputs kept per distinct failure.
const KEEP: usize = 3;

struct Opts {
    duration: Duration,
    targets: Option<Vec<String>>,
    seed: u64,
    out: PathBuf,
    json: bool,
    replay: Option<PathBuf>,
}

fn parse_opts(args: &[String]) -> Result<Opts> {
    let mut o = Opts {
        duration: Duration::from_secs(60),
        targets: None,
        seed: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos() as u64
            ^ u64::from(std::process::id()),
        out: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("results/fuzz-crashes"),
        json: false,
        replay: None,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--minutes" => o.duration = Duration::from_secs_f64(value()?.parse::<f64>().context("--minutes")? * 60.0),
            "--seconds" => o.duration = Duration::from_secs_f64(value()?.parse::<f64>().context("--seconds")?),
            "--targets" => o.targets = Some(value()?.split(',').map(str::to_string).collect()),
            "--seed" => o.seed = value()?.parse().context("--seed")?,
            "--out" => o.out = PathBuf::from(value()?),
            "--json" => o.json = true,
            "--replay" => o.replay = Some(PathBuf::from(value()?)),
            _ => bail!(
                "usage: berth-bench fuzz [--minutes M | --seconds S] [--targets a,b] [--seed N] [--out DIR] [--json] \
                 | fuzz --targets TARGET --replay FILE"
            ),
        }
    }
    Ok(o)
}

/// Every fuzz target of berth.
pub fn all_targets() -> Vec<Target> {
    let mut t = berth_core::fuzz::targets();
    t.extend(berth_protocol::fuzz::targets());
    t.extend(berth_agent::fuzz::targets());
    t.extend(berth_sim::fuzz::targets());
    t
}

/// A distinct failure of a target: where it panicked, how often, on what.
#[derive(Default)]
struct Failure {
    message: String,
    count: u64,
    inputs: Vec<Vec<u8>>,
    shrunk: Option<Vec<u8>>,
}

#[derive(Default)]
struct Stats {
    cases: u64,
    /// Time in checks, and in all (generating inputs too).
    busy: Duration,
    wall: Duration,
    failures: BTreeMap<String, Failure>,
    slow: Vec<(Duration, Vec<u8>)>,
    hung: Option<Vec<u8>>,
}

/// The case a worker is running, for the watchdog.
#[derive(Default)]
struct Current {
    started: Option<Instant>,
    input: Vec<u8>,
    noted_slow: bool,
}

thread_local! {
    /// Where the last panic of this thread happened, recorded by the panic hook.
    static LAST_PANIC: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Quiet panics (they are counted and saved instead), keeping their location.
fn install_hook() {
    std::panic::set_hook(Box::new(|info| {
        let at = info.location().map(|l| format!("{}:{}", l.file(), l.line())).unwrap_or_default();
        LAST_PANIC.with(|p| *p.borrow_mut() = at);
    }));
}

/// One case: Ok, or the panic's (location, message).
fn run_one(check: fn(&[u8]), input: &[u8]) -> Result<(), (String, String)> {
    LAST_PANIC.with(|p| p.borrow_mut().clear());
    std::panic::catch_unwind(|| check(input)).map_err(|payload| {
        let at = LAST_PANIC.with(|p| p.borrow().clone());
        (at, panic_message(&*payload))
    })
}

/// Shrink a failing case with proptest's value tree: the smallest input failing at `at`.
fn shrink(tree: &mut dyn ValueTree<Value = Vec<u8>>, check: fn(&[u8]), at: &str) -> Vec<u8> {
    let start = Instant::now();
    let fails = |input: &[u8]| matches!(run_one(check, input), Err((a, _)) if a == at);
    let mut best = tree.current();
    while start.elapsed() < SHRINK_TIME && tree.simplify() {
        loop {
            let candidate = tree.current();
            if fails(&candidate) {
                best = candidate;
                break;
            }
            if start.elapsed() >= SHRINK_TIME || !tree.complicate() {
                return best;
            }
        }
    }
    best
}

/// Derive the seed of slice `n` from the run's seed (splitmix64).
fn slice_seed(seed: u64, n: u64) -> [u8; 32] {
    let mut out = [0u8; 32];
    let mut x = seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    for chunk in out.chunks_mut(8) {
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        chunk.copy_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out
}

/// Run cases of `target` until `until` (or `stop`), on this thread.
fn work(
    target: Target,
    seed: [u8; 32],
    until: Instant,
    stop: &AtomicBool,
    current: &Mutex<Current>,
    stats: &Mutex<Stats>,
) {
    let config = Config { failure_persistence: None, ..Config::default() };
    let mut runner = TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &seed));
    let strategy = (target.input)();
    while Instant::now() < until && !stop.load(Ordering::Relaxed) {
        let Ok(mut tree) = strategy.new_tree(&mut runner) else { continue };
        let input = tree.current();
        let t0 = Instant::now();
        if let Ok(mut c) = current.lock() {
            *c = Current { started: Some(t0), input: input.clone(), noted_slow: false };
        }
        let result = run_one(target.check, &input);
        if let Ok(mut c) = current.lock() {
            c.started = None;
        }
        let elapsed = t0.elapsed();
        let mut s = stats.lock().unwrap_or_else(|e| e.into_inner());
        s.cases += 1;
        s.busy += elapsed;
        let Err((at, message)) = result else { continue };
        let first = !s.failures.contains_key(&at);
        let f = s.failures.entry(at.clone()).or_default();
        f.count += 1;
        if f.inputs.len() < KEEP {
            f.inputs.push(input);
        }
        if first {
            f.message = message;
            drop(s);
            let small = shrink(&mut *tree, target.check, &at);
            let mut s = stats.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(f) = s.failures.get_mut(&at) {
                f.shrunk = Some(small);
            }
        }
    }
}

fn file_name(target: &str) -> String {
    target.replace('/', "-")
}

/// Save what a target's failures, slow cases and hang ran on; the files written.
fn save(out: &std::path::Path, target: &str, s: &Stats) -> Result<Vec<PathBuf>> {
    let mut written = vec![];
    let base = file_name(target);
    let mut write = |name: String, bytes: &[u8]| -> Result<()> {
        std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
        let p = out.join(name);
        std::fs::write(&p, bytes).with_context(|| format!("writing {}", p.display()))?;
        written.push(p);
        Ok(())
    };
    for (i, (at, f)) in s.failures.iter().enumerate() {
        let mut report = format!("target: {target}\npanicked at: {at}\nmessage: {}\ntimes: {}\n", f.message, f.count);
        if let Some(small) = &f.shrunk {
            report.push_str(&format!("shrunk input: {:?}\n", String::from_utf8_lossy(small)));
            write(format!("{base}-{i}.min.bin"), small)?;
        }
        for (j, input) in f.inputs.iter().enumerate() {
            report.push_str(&format!("input {j}: {:?}\n", String::from_utf8_lossy(input)));
            write(format!("{base}-{i}.{j}.bin"), input)?;
        }
        write(format!("{base}-{i}.txt"), report.as_bytes())?;
    }
    for (i, (took, input)) in s.slow.iter().enumerate() {
        write(format!("{base}-slow-{i}.bin"), input)?;
        write(format!("{base}-slow-{i}.txt"), format!("target: {target}\nslow: {took:?}\n").as_bytes())?;
    }
    if let Some(input) = &s.hung {
        write(format!("{base}-hang.bin"), input)?;
    }
    Ok(written)
}

/// Whether this build checks integer overflow (release builds do not, unless asked).
fn overflow_checks() -> bool {
    let x = std::hint::black_box(u32::MAX);
    std::panic::catch_unwind(|| std::hint::black_box(x) + std::hint::black_box(1)).is_err()
}

pub fn run(args: &[String]) -> Result<()> {
    let o = parse_opts(args)?;
    let say = |s: String| if o.json { eprintln!("{s}") } else { println!("{s}") };
    let mut targets = all_targets();
    if let Some(only) = &o.targets {
        targets.retain(|t| only.iter().any(|n| t.name == n || t.name.starts_with(&format!("{n}/"))));
        if targets.is_empty() {
            bail!(
                "no fuzz target matches {only:?}; targets are {:?}",
                all_targets().iter().map(|t| t.name).collect::<Vec<_>>()
            );
        }
    }
    install_hook();
    if let Some(file) = &o.replay {
        let [target] = targets.as_slice() else { bail!("--replay needs --targets naming one target") };
        let input = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
        return match run_one(target.check, &input) {
            Ok(()) => {
                say(format!("{}: {} passes", target.name, file.display()));
                Ok(())
            }
            Err((at, message)) => bail!("{}: {} fails at {at}: {message}", target.name, file.display()),
        };
    }
    let checks = overflow_checks();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    say(format!(
        "fuzz: {} targets for {:.1} min, seed {}, overflow checks {}, {cpus} CPUs",
        targets.len(),
        o.duration.as_secs_f64() / 60.0,
        o.seed,
        if checks { "on" } else { "off (set CARGO_PROFILE_RELEASE_OVERFLOW_CHECKS=true to catch overflows)" },
    ));
    let stats: Vec<Arc<Mutex<Stats>>> = targets.iter().map(|_| Default::default()).collect();
    let mut dropped = vec![false; targets.len()];
    let start = Instant::now();
    let deadline = start + o.duration;
    let mut slices = 0u64;
    // Each slice goes to the live target that has had the least time: equal shares, and the
    // run ends at the deadline whatever the slices' lengths.
    let mut used = vec![Duration::ZERO; targets.len()];
    let slice = SLICE.min(o.duration / targets.len() as u32).max(Duration::from_millis(100));
    loop {
        let now = Instant::now();
        let Some(i) = (0..targets.len()).filter(|&i| !dropped[i]).min_by_key(|&i| used[i]) else { break };
        if now >= deadline {
            break;
        }
        let target = &targets[i];
        let until = now + slice.min(deadline - now);
        slices += 1;
        let n = slices;
        let (stop, current, st) =
            (Arc::new(AtomicBool::new(false)), Arc::new(Mutex::new(Current::default())), stats[i].clone());
        let worker = {
            let (stop, current, st, target) = (stop.clone(), current.clone(), st.clone(), *target);
            let seed = slice_seed(o.seed, n);
            std::thread::Builder::new()
                .name(format!("fuzz-{}", target.name))
                .stack_size(16 << 20)
                .spawn(move || work(target, seed, until, &stop, &current, &st))?
        };
        // Watchdog: note slow cases, give up on a hung one.
        loop {
            std::thread::sleep(Duration::from_millis(50));
            if worker.is_finished() {
                break;
            }
            let mut c = current.lock().unwrap_or_else(|e| e.into_inner());
            let Some(started) = c.started else { continue };
            let took = started.elapsed();
            if took > HANG {
                stop.store(true, Ordering::Relaxed);
                let mut s = st.lock().unwrap_or_else(|e| e.into_inner());
                s.hung = Some(c.input.clone());
                dropped[i] = true;
                say(format!("{}: a case still runs after {HANG:?}: target dropped", target.name));
                break;
            }
            if took > SLOW && !c.noted_slow {
                c.noted_slow = true;
                let mut s = st.lock().unwrap_or_else(|e| e.into_inner());
                if s.slow.len() < KEEP {
                    s.slow.push((took, c.input.clone()));
                }
            }
        }
        if !dropped[i] {
            let _ = worker.join();
        }
        used[i] += now.elapsed();
        stats[i].lock().unwrap_or_else(|e| e.into_inner()).wall += now.elapsed();
    }
    let elapsed = start.elapsed();
    say(format!(
        "{:<24} {:>10} {:>9} {:>7} {:>7} {:>5} {:>5}  failures",
        "target", "cases", "cases/s", "wall s", "check s", "slow", "hang"
    ));
    let mut total_cases = 0;
    let mut total_failures = 0;
    let mut rows = vec![];
    for (t, s) in targets.iter().zip(&stats) {
        let s = s.lock().unwrap_or_else(|e| e.into_inner());
        let (busy, wall) = (s.busy.as_secs_f64(), s.wall.as_secs_f64());
        let rate = if wall > 0.0 { s.cases as f64 / wall } else { 0.0 };
        let failures: Vec<String> =
            s.failures.iter().map(|(at, f)| format!("{at} x{}: {}", f.count, f.message)).collect();
        say(format!(
            "{:<24} {:>10} {:>9.0} {:>7.1} {:>7.1} {:>5} {:>5}  {}",
            t.name,
            s.cases,
            rate,
            wall,
            busy,
            s.slow.len(),
            u8::from(s.hung.is_some()),
            if failures.is_empty() { "-".to_string() } else { failures.join("; ") }
        ));
        total_cases += s.cases;
        total_failures += s.failures.len();
        let written = save(&o.out, t.name, &s)?;
        for p in &written {
            say(format!("  saved {}", p.display()));
        }
        rows.push(serde_json::json!({
            "target": t.name, "cases": s.cases, "seconds": wall, "check_seconds": busy,
            "failures": s.failures.iter().map(|(at, f)| serde_json::json!({
                "at": at, "message": f.message, "count": f.count,
                "shrunk": f.shrunk.as_ref().map(|b| String::from_utf8_lossy(b).into_owned()),
            })).collect::<Vec<_>>(),
            "slow": s.slow.len(), "hung": s.hung.is_some(),
        }));
    }
    say(format!(
        "total: {total_cases} cases in {:.1} min, {total_failures} distinct failures, seed {}",
        elapsed.as_secs_f64() / 60.0,
        o.seed
    ));
    if o.json {
        println!(
            "{}",
            serde_json::json!({
                "bench": "fuzz", "seed": o.seed, "seconds": elapsed.as_secs_f64(), "overflow_checks": checks,
                "cpus": cpus, "cases": total_cases, "distinct_failures": total_failures, "targets": rows,
            })
        );
    }
    if dropped.iter().any(|d| *d) {
        // A hung case's thread cannot be stopped: leave now rather than wait for it.
        std::process::exit(if total_failures > 0 { 1 } else { 0 });
    }
    Ok(())
}
