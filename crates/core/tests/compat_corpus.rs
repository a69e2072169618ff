//! The Slurm/PBS compatibility corpus (issue 19, "Proof"): every job script in
//! `tests/data/compat/` (at the repository root; see its README.md) is read by the parser
//! `berth submit` and the controller use (`parse_script_with`), and what it gives is compared
//! with the `.expect` file beside it: every option the script sets, and nothing else, or the
//! exact error. The test fails listing each script that does not match.

use berth_core::directives::{parse_script_with, SubmitOptions};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/compat")
}

/// What an `.expect` file says.
#[derive(Debug, Default)]
struct Expect {
    /// `with = --ignore-unsupported`.
    ignore_unsupported: bool,
    /// `reject = line N: ...`: the exact error.
    reject: Option<String>,
    /// `warning = line N: ...`, in order.
    warnings: Vec<String>,
    /// Every other `key = value`: an option the script sets.
    options: BTreeMap<String, String>,
}

fn read_expect(text: &str) -> Result<Expect, String> {
    let mut e = Expect::default();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (key, value) =
            line.split_once(" = ").ok_or_else(|| format!("line {}: expected `key = value`, got {line:?}", i + 1))?;
        match key {
            "with" if value == "--ignore-unsupported" => e.ignore_unsupported = true,
            "with" => return Err(format!("line {}: unknown `with` {value:?}", i + 1)),
            "reject" => e.reject = Some(value.to_string()),
            "warning" => e.warnings.push(value.to_string()),
            _ => {
                if e.options.insert(key.to_string(), value.to_string()).is_some() {
                    return Err(format!("line {}: {key} given twice", i + 1));
                }
            }
        }
    }
    if e.reject.is_some() && (!e.options.is_empty() || !e.warnings.is_empty()) {
        return Err("a rejected script expects no options and no warnings".into());
    }
    Ok(e)
}

/// Every option that is set, by its serialized name: text as it is, numbers and switches as
/// written, arrays, dependencies and begin times as berth prints them, the rest as JSON.
fn render(o: &SubmitOptions) -> BTreeMap<String, String> {
    let serde_json::Value::Object(map) = serde_json::to_value(o).expect("options serialize") else {
        panic!("options serialize to an object")
    };
    let mut out = BTreeMap::new();
    for (key, value) in map {
        let text = match (key.as_str(), &value) {
            (_, serde_json::Value::Null) => continue,
            ("array", _) => o.array.as_ref().map(ToString::to_string).unwrap_or_default(),
            ("dependency", _) => o.dependency.as_ref().map(ToString::to_string).unwrap_or_default(),
            ("begin", _) => o.begin.as_ref().map(ToString::to_string).unwrap_or_default(),
            (_, serde_json::Value::String(s)) => s.clone(),
            (_, v) => v.to_string(),
        };
        out.insert(key, text);
    }
    out
}

/// The differences between what `name` gives and what its `.expect` says; none when they match.
fn check(script: &str, expect: &Expect) -> Vec<String> {
    let mut diffs = Vec::new();
    match (parse_script_with(script, expect.ignore_unsupported), &expect.reject) {
        (Err(e), Some(want)) => {
            if e.to_string() != *want {
                diffs.push(format!("error\n      got:  {e}\n      want: {want}"));
            }
        }
        (Err(e), None) => diffs.push(format!("rejected: {e}")),
        (Ok((o, _)), Some(want)) => diffs.push(format!("accepted ({:?}), expected the error: {want}", render(&o))),
        (Ok((o, warnings)), None) => {
            if warnings != expect.warnings {
                diffs.push(format!("warnings\n      got:  {warnings:?}\n      want: {:?}", expect.warnings));
            }
            let got = render(&o);
            for key in got.keys().chain(expect.options.keys()).collect::<std::collections::BTreeSet<_>>() {
                match (got.get(key), expect.options.get(key)) {
                    (Some(g), Some(w)) if g == w => {}
                    (g, w) => diffs.push(format!(
                        "{key}: got {}, want {}",
                        g.map_or("(unset)".to_string(), |v| format!("{v:?}")),
                        w.map_or("(unset)".to_string(), |v| format!("{v:?}"))
                    )),
                }
            }
        }
    }
    diffs
}

fn scripts() -> Vec<PathBuf> {
    let dir = corpus_dir();
    let mut out: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read the corpus {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "sh"))
        .collect();
    out.sort();
    out
}

#[test]
fn every_corpus_script_gives_its_expected_request() {
    let scripts = scripts();
    let mut report = String::new();
    let mut failed = 0;
    for path in &scripts {
        let name = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        let expect_path = path.with_extension("expect");
        let diffs = match (std::fs::read_to_string(path), std::fs::read_to_string(&expect_path)) {
            (Ok(script), Ok(text)) => match read_expect(&text) {
                Ok(expect) => check(&script, &expect),
                Err(e) => vec![format!("{}: {e}", expect_path.display())],
            },
            (Err(e), _) => vec![format!("cannot read the script: {e}")],
            (_, Err(e)) => vec![format!("cannot read {}: {e}", expect_path.display())],
        };
        if !diffs.is_empty() {
            failed += 1;
            let _ = writeln!(report, "  {name}:");
            for d in diffs {
                let _ = writeln!(report, "    {d}");
            }
        }
    }
    println!("compat corpus: {} of {} scripts give their expected request", scripts.len() - failed, scripts.len());
    assert!(failed == 0, "{failed} of {} corpus scripts do not match their .expect:\n{report}", scripts.len());
}

/// The corpus is what the issue asks: at least 40 scripts, each with its expectation, in both
/// dialects, with GPU requests, other generic resources and licenses read and unsupported
/// directives refused by line.
#[test]
fn the_corpus_covers_what_it_must() {
    let scripts = scripts();
    assert!(scripts.len() >= 40, "only {} scripts in the corpus", scripts.len());
    let mut texts = Vec::new();
    for path in &scripts {
        let expect = path.with_extension("expect");
        assert!(expect.is_file(), "{} has no {}", path.display(), expect.display());
        texts.push((
            std::fs::read_to_string(path).expect("script reads"),
            std::fs::read_to_string(&expect).expect("expect reads"),
        ));
    }
    let count = |f: &dyn Fn(&str, &str) -> bool| texts.iter().filter(|(s, e)| f(s, e)).count();
    assert!(count(&|s, _| s.contains("#SBATCH")) >= 20, "Slurm scripts");
    assert!(count(&|s, _| s.contains("#PBS")) >= 10, "PBS scripts");
    assert!(count(&|s, _| s.contains("select=")) >= 5, "PBS select scripts");
    assert!(count(&|s, _| s.contains("nodes=") && s.contains(":ppn=")) >= 2, "Torque nodes=N:ppn=P scripts");
    assert!(count(&|_, e| e.contains("cpus_per_task") && e.contains("tasks_per_node")) >= 4, "hybrid scripts");
    assert!(count(&|_, e| e.contains("array = ")) >= 4, "array scripts");
    assert!(count(&|_, e| e.contains("dependency = ")) >= 4, "dependency scripts");
    assert!(count(&|_, e| e.contains("exclusive = true")) >= 2, "exclusive scripts");
    assert!(count(&|_, e| e.contains("mem_per_cpu = ")) >= 4, "memory-per-CPU scripts");
    assert!(count(&|_, e| e.contains("gpus_per_node = ") || e.contains("gpus = ")) >= 5, "GPU requests read");
    assert!(count(&|s, e| s.contains("ngpus=") && e.contains("gpus_per_node = ")) >= 1, "PBS ngpus read");
    assert!(count(&|_, e| e.contains("gres = ")) >= 1, "other generic resources read");
    assert!(count(&|_, e| e.contains("licenses = ")) >= 1, "licenses read");
    assert!(count(&|_, e| e.contains("reject = line ")) >= 10, "rejected scripts, with their line");
    assert!(count(&|_, e| e.contains("with = --ignore-unsupported")) >= 4, "--ignore-unsupported scripts");
    // Every Slurm time format.
    for t in ["-t 90", "--time=45:30", "--time=12:00:00", "--time=1-12", "--time 2-06:30", "-t 3-00:00:00"] {
        assert!(count(&|s, _| s.contains(&format!("#SBATCH {t}\n"))) >= 1, "the time format {t}");
    }
}

#[test]
fn a_mismatch_is_reported() {
    // The comparison itself: a wrong expectation, a missing option and an unexpected one are
    // all differences.
    let script = "#!/bin/sh\n#SBATCH -n 2 -t 5\n";
    let e = read_expect("cores = 3\nname = x\njoin = slurm\n").unwrap();
    let diffs = check(script, &e);
    assert_eq!(diffs.len(), 3, "{diffs:?}");
    assert!(diffs[0].starts_with("cores: got \"2\", want \"3\""), "{diffs:?}");
    assert!(diffs.iter().any(|d| d.starts_with("name: got (unset)")), "{diffs:?}");
    assert!(diffs.iter().any(|d| d.starts_with("walltime: got \"300\", want (unset)")), "{diffs:?}");
    let e = read_expect("reject = line 2: nope\n").unwrap();
    assert_eq!(check(script, &e).len(), 1);
    assert!(read_expect("reject = x\ncores = 1\n").is_err());
    assert!(read_expect("cores 1\n").is_err());
}
