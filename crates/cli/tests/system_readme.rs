//! System test: README's "Using it" commands, run as written, one by one, on the cluster its
//! own `berth up` line starts (issue 17 item 12: its `berth run -n 8 -N 2` example failed on
//! that very cluster). Every line must parse (no usage error: README and the CLI agree); the
//! lines that need no earlier state to fail must succeed; the parallel run puts 4 ranks on
//! each of 2 nodes.
//!
//! Lines not run, and why: the build line (the test's binaries are put on PATH instead),
//! `berth up --agents 4 --netns` (a second cluster layout; `system_faults` covers --netns).
//! `berth events --follow` runs for 3 s (it follows until interrupted).

mod common;

use common::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

/// The shell block under "## Using it" in README.md.
fn using_it_block() -> Vec<String> {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md")).unwrap();
    let start = readme.find("## Using it").expect("README has a \"Using it\" section");
    let block = &readme[start..];
    let open = block.find("```sh\n").expect("a sh block") + "```sh\n".len();
    let len = block[open..].find("```").expect("the block ends");
    block[open..open + len].lines().map(String::from).collect()
}

/// A line without its trailing `   # comment` (never inside the here-document).
fn command_of(line: &str) -> String {
    match line.find("  #") {
        Some(i) => line[..i].trim_end().to_string(),
        None => line.trim_end().to_string(),
    }
}

#[test]
fn readme_using_it_runs_as_written() {
    require_root();
    let tmp = tempfile::Builder::new().prefix("berth-readme-").tempdir().unwrap();
    let work = tmp.path();
    let bindir = Path::new(BIN).parent().unwrap().to_path_buf();
    // The programs README's `berth run` lines start.
    let program = "#!/bin/sh\necho \"rank $BERTH_RANK of $BERTH_SIZE on node $BERTH_NODEID\"\n";
    for name in ["a.out", "mpi_app"] {
        std::fs::write(work.join(name), program).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(work.join(name), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    // One script: each README command runs as written, its output and status recorded.
    let lines = using_it_block();
    let mut script = format!("export PATH={}:$PATH\n", bindir.display());
    let mut commands: BTreeMap<usize, String> = BTreeMap::new();
    let mut heredoc_end: Option<String> = None;
    for (n, line) in lines.iter().enumerate() {
        if let Some(end) = &heredoc_end {
            script.push_str(line);
            script.push('\n');
            if line == end {
                heredoc_end = None;
            }
            continue;
        }
        let cmd = command_of(line);
        if cmd.starts_with("bash scripts/build.sh") || cmd.contains("--netns") {
            continue;
        }
        if let Some(i) = cmd.find("<<'") {
            heredoc_end = Some(cmd[i + 3..].trim_end_matches('\'').to_string());
            script.push_str(&cmd);
            script.push('\n');
            continue;
        }
        if cmd.starts_with("export ") {
            script.push_str(&cmd);
            script.push('\n');
            continue;
        }
        assert!(!cmd.contains('\''), "quote README line {n} without single quotes: {cmd}");
        // Bounded: `--follow` follows until interrupted, anything else may not hang the test.
        let limit = if cmd.contains("--follow") { 3 } else { 120 };
        script.push_str(&format!("timeout {limit} sh -c '{cmd}' >out.{n} 2>err.{n} </dev/null; echo $? >rc.{n}\n"));
        commands.insert(n, cmd);
    }
    std::fs::write(work.join("readme.sh"), &script).unwrap();
    let guard = scopeguard(work);
    let out = Command::new("sh").arg("readme.sh").current_dir(work).output().unwrap();
    let read = |kind: &str, n: usize| std::fs::read_to_string(work.join(format!("{kind}.{n}"))).unwrap_or_default();
    assert!(out.status.success(), "the README script itself failed: {}", String::from_utf8_lossy(&out.stderr));
    let mut report = String::new();
    for (&n, cmd) in &commands {
        report.push_str(&format!("$ {cmd}\n  rc {} {}{}", read("rc", n).trim(), read("out", n), read("err", n)));
    }
    for (&n, cmd) in &commands {
        let err = read("err", n);
        assert!(
            !err.contains("Usage:") && !err.contains("unexpected argument") && !err.contains("invalid value"),
            "README line does not parse: {cmd}\n{err}\n--- all:\n{report}"
        );
    }
    let rc = |needle: &str| -> (usize, String) {
        let (&n, _) = commands.iter().find(|(_, c)| c.starts_with(needle)).unwrap_or_else(|| panic!("no {needle}"));
        (n, read("rc", n).trim().to_string())
    };
    for must in [
        "berth up --agents 3",
        "berth submit job.sh",
        "berth submit --cores 2 job.sh",
        "berth jobs --all",
        "berth show 1",
        "berth queues",
        "berth share",
        "berth nodes",
        "berth node drain node2",
        "berth nodes --topology",
        "berth acct",
        "berth run -n 8 -N 2 --label ./a.out",
        "berth run --no-kill -np 4 ./mpi_app",
        "berth acct --steps",
        "berth reservations",
        "berth status",
        "berth down",
    ] {
        let (_, code) = rc(must);
        assert_eq!(code, "0", "`{must}` failed\n--- all:\n{report}");
    }
    // 8 ranks, labelled, 4 on each of 2 nodes.
    let (n, _) = rc("berth run -n 8 -N 2");
    let text = read("out", n);
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    for line in text.lines() {
        let node = line.rsplit(' ').next().unwrap_or("").to_string();
        *per_node.entry(node).or_default() += 1;
    }
    assert_eq!(per_node.values().copied().collect::<Vec<_>>(), vec![4, 4], "{text}\n--- all:\n{report}");
    assert!(text.lines().all(|l| l.contains(": rank ")), "labelled: {text}");
    drop(guard);
}

/// `berth down` in the README directory if the test fails before the README's own does it.
fn scopeguard(work: &Path) -> impl Drop + '_ {
    struct Down<'a>(&'a Path);
    impl Drop for Down<'_> {
        fn drop(&mut self) {
            let _ = Command::new(BIN).args(["down"]).current_dir(self.0).output();
        }
    }
    Down(work)
}
