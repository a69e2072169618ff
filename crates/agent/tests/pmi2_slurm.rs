//! Real PMI-2 clients (tests/pmi2/*.c, built with `cc ... -lpmi2`: Slurm's libpmi2, Debian's
//! libpmi2-0-dev) run against berth's PMI server: every rank is started here with a socketpair
//! (`PMI_FD`, `PMI_RANK`, `PMI_SIZE`, as berth sets them; libpmi2 needs only the first two), all
//! ranks are local, and a one-level "tree" answers each BarrierIn with barrier_out of the same puts.

use berth_agent::step::pmi::{process_mapping, PmiConfig, PmiEvent, PmiServer};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::timeout;

const LIMIT: Duration = Duration::from_secs(60);
/// One job at a time: this host may have few CPUs.
static ONE_JOB: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
const INSTALL: &str = "install libpmi2-0-dev (scripts/setup.sh)";

/// Compiles tests/pmi2/*.c once into a temporary directory.
fn programs() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temporary directory");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pmi2");
        for name in ["kvs", "abort"] {
            let out = Command::new("cc")
                .arg("-O1")
                .arg("-o")
                .arg(dir.path().join(name))
                .arg(src.join(format!("{name}.c")))
                .arg("-lpmi2")
                .output()
                .unwrap_or_else(|e| panic!("cannot run cc ({e}): {INSTALL}"));
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "cc {name}.c -lpmi2 failed ({INSTALL}?): {stderr}");
        }
        dir
    })
    .path()
}

struct Job {
    /// In rank order.
    children: Vec<tokio::process::Child>,
    events: mpsc::UnboundedReceiver<PmiEvent>,
}

/// Starts one rank per entry of `nodes` (ranks per node) and a PMI server for all of them.
fn launch(program: &str, nodes: &[Vec<u32>]) -> Job {
    let exe: PathBuf = programs().join(program);
    let size: u32 = nodes.iter().map(|n| n.len() as u32).sum();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let cfg = PmiConfig {
        kvsname: "berth_1_0".into(),
        size,
        appnum: 0,
        appnums: vec![],
        universe_size: size,
        process_mapping: process_mapping(nodes),
        local_ranks: (0..size).collect(),
    };
    let server = PmiServer::new(cfg, tx);
    let (seen_tx, seen) = mpsc::unbounded_channel();
    let tree = server.clone();
    tokio::spawn(async move {
        while let Some(event) = rx.recv().await {
            if let PmiEvent::BarrierIn { puts } = &event {
                tree.barrier_out(puts.clone());
            }
            let _ = seen_tx.send(event);
        }
    });
    let mut children = Vec::new();
    for ranks in nodes {
        for &rank in ranks {
            let (ours, theirs) = std::os::unix::net::UnixStream::pair().expect("socketpair");
            let fd = theirs.as_raw_fd();
            let mut cmd = tokio::process::Command::new(&exe);
            cmd.env("PMI_FD", fd.to_string())
                .env("PMI_RANK", rank.to_string())
                .env("PMI_SIZE", size.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true);
            // SAFETY: fcntl is async-signal-safe; it keeps the rank's end open across exec.
            unsafe {
                cmd.pre_exec(move || match libc::fcntl(fd, libc::F_SETFD, 0) {
                    -1 => Err(std::io::Error::last_os_error()),
                    _ => Ok(()),
                });
            }
            children.push((rank, cmd.spawn().expect("start a rank")));
            drop(theirs);
            ours.set_nonblocking(true).expect("nonblocking");
            let stream = tokio::net::UnixStream::from_std(ours).expect("tokio stream");
            let server = server.clone();
            tokio::spawn(async move { server.serve_rank(rank, stream).await });
        }
    }
    children.sort_by_key(|(rank, _)| *rank);
    Job { children: children.into_iter().map(|(_, child)| child).collect(), events: seen }
}

/// Runs a job to completion; every rank must exit 0 and finalize, without protocol errors.
/// Gives each rank's stdout and the number of barriers.
async fn run_ok(program: &str, nodes: &[Vec<u32>]) -> (Vec<String>, usize) {
    let _one = ONE_JOB.lock().await;
    let mut job = launch(program, nodes);
    let mut outputs = Vec::new();
    for (rank, child) in job.children.into_iter().enumerate() {
        let out: Output = timeout(LIMIT, child.wait_with_output())
            .await
            .unwrap_or_else(|_| panic!("{program}: rank {rank} still running after {LIMIT:?}"))
            .expect("wait for a rank");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{program} rank {rank}: {}\nstdout: {stdout}\nstderr: {stderr}", out.status);
        outputs.push(stdout);
    }
    // A rank may exit before the server has read its finalize: wait for the events, bounded.
    let (mut finalized, mut barriers) = (0, 0);
    while finalized < outputs.len() {
        match timeout(Duration::from_secs(10), job.events.recv()).await {
            Ok(Some(PmiEvent::Finalized { .. })) => finalized += 1,
            Ok(Some(PmiEvent::BarrierIn { .. })) => barriers += 1,
            Ok(Some(other)) => panic!("{program}: unexpected {other:?}"),
            Ok(None) | Err(_) => break,
        }
    }
    assert_eq!(finalized, outputs.len(), "{program}: every rank finalizes");
    (outputs, barriers)
}

fn block(n: u32) -> Vec<Vec<u32>> {
    vec![(0..n).collect()]
}

async fn kvs(nodes: &[Vec<u32>]) {
    let n = nodes.iter().map(Vec::len).sum::<usize>();
    let mapping = process_mapping(nodes);
    let (outputs, barriers) = run_ok("kvs", nodes).await;
    for (rank, out) in outputs.iter().enumerate() {
        assert_eq!(out, &format!("kvs ok rank {rank} of {n} jobid berth_1_0 mapping {mapping} fences 4\n"));
    }
    assert_eq!(barriers, 4, "three KVS rounds and the node-attribute fence");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kvs_two_ranks() {
    kvs(&block(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kvs_four_ranks() {
    kvs(&block(4)).await;
}

/// The mapping says two nodes (block and cyclic); the attributes are still those of one server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kvs_four_ranks_two_nodes_block_and_cyclic() {
    kvs(&[vec![0, 1], vec![2, 3]]).await;
    kvs(&[vec![0, 2], vec![1, 3]]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_reports_rank_and_code() {
    for n in [2, 4] {
        let _one = ONE_JOB.lock().await;
        let mut job = launch("abort", &block(n));
        let abort = timeout(LIMIT, async {
            loop {
                match job.events.recv().await.expect("PMI events") {
                    PmiEvent::BarrierIn { .. } => {}
                    event => return event,
                }
            }
        })
        .await
        .expect("an Abort event within the time limit");
        let PmiEvent::Abort { rank: 1, code: 7, message } = &abort else { panic!("{abort:?}") };
        assert_eq!(message, "application called MPI_Abort(MPI_COMM_WORLD, 7) - process 1");
        // libpmi2 exits after sending abort (status = its flag); the others sleep.
        let aborted = timeout(LIMIT, job.children[1].wait()).await.expect("rank 1 exits").expect("wait");
        assert_eq!(aborted.code(), Some(1), "rank 1 exits by itself");
        assert!(job.children[0].try_wait().expect("rank 0").is_none(), "rank 0 exited by itself");
        for child in &mut job.children {
            let _ = child.start_kill();
            timeout(LIMIT, child.wait()).await.expect("killed rank exits").expect("wait");
        }
    }
}
