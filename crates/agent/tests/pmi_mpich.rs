//! Real MPICH programs (tests/mpi/*.c, built with `mpicc`) run against berth's PMI server: every
//! rank is started here with a socketpair (`PMI_FD`, `PMI_RANK`, `PMI_SIZE`), all ranks are local,
//! and a one-level "tree" answers each BarrierIn with barrier_out of the same puts. Mappings that
//! claim several nodes make MPICH talk through UCX between ranks of this one host.

use berth_agent::step::pmi::{process_mapping, PmiConfig, PmiEvent, PmiServer};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::timeout;

const LIMIT: Duration = Duration::from_secs(60);
/// One job at a time: MPICH ranks poll, and this host may have few CPUs.
static ONE_JOB: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Compiles tests/mpi/*.c once into a temporary directory.
fn programs() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temporary directory");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mpi");
        for name in ["hello", "allreduce", "ring", "abort"] {
            let out = Command::new("mpicc")
                .arg("-O1")
                .arg("-o")
                .arg(dir.path().join(name))
                .arg(src.join(format!("{name}.c")))
                .output()
                .unwrap_or_else(|e| panic!("cannot run mpicc ({e}): install mpich libmpich-dev (scripts/setup.sh)"));
            assert!(out.status.success(), "mpicc {name}.c failed: {}", String::from_utf8_lossy(&out.stderr));
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
fn launch(program: &str, nodes: &[Vec<u32>], env: &[(&str, &str)]) -> Job {
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
        for (local, &rank) in ranks.iter().enumerate() {
            let (ours, theirs) = std::os::unix::net::UnixStream::pair().expect("socketpair");
            let fd = theirs.as_raw_fd();
            let mut cmd = tokio::process::Command::new(&exe);
            cmd.env("PMI_FD", fd.to_string())
                .env("PMI_RANK", rank.to_string())
                .env("PMI_SIZE", size.to_string())
                .env("MPI_LOCALNRANKS", ranks.len().to_string())
                .env("MPI_LOCALRANKID", local.to_string())
                .envs(env.iter().copied())
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
            children.push((rank, cmd.spawn().expect("start an MPI rank")));
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
async fn run_ok(program: &str, nodes: &[Vec<u32>], env: &[(&str, &str)]) -> Vec<String> {
    let _one = ONE_JOB.lock().await;
    let mut job = launch(program, nodes, env);
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
    let mut finalized = 0;
    while finalized < outputs.len() {
        match timeout(Duration::from_secs(10), job.events.recv()).await {
            Ok(Some(PmiEvent::Finalized { .. })) => finalized += 1,
            Ok(Some(PmiEvent::BarrierIn { .. })) => {}
            Ok(Some(other)) => panic!("{program}: unexpected {other:?}"),
            Ok(None) | Err(_) => break,
        }
    }
    assert_eq!(finalized, outputs.len(), "{program}: every rank finalizes");
    outputs
}

fn block(n: u32) -> Vec<Vec<u32>> {
    vec![(0..n).collect()]
}

async fn hello_allreduce_ring(nodes: &[Vec<u32>]) {
    let n = nodes.iter().map(Vec::len).sum::<usize>();
    for (rank, out) in run_ok("hello", nodes, &[]).await.iter().enumerate() {
        assert!(out.starts_with(&format!("hello from rank {rank} of {n} on ")), "hello: {out}");
    }
    let expected = n * (n - 1) / 2;
    for out in run_ok("allreduce", nodes, &[]).await {
        assert_eq!(out, format!("allreduce sum={expected} expected={expected}\n"));
    }
    let ring = run_ok("ring", nodes, &[]).await;
    assert_eq!(ring[0], format!("ring ok laps=10 token={}\n", 10 * n));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_ranks_one_node() {
    hello_allreduce_ring(&block(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_ranks_one_node() {
    hello_allreduce_ring(&block(4)).await;
}

/// MPICH believes these are two nodes, so ranks talk through UCX (which finds this one host).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_ranks_two_nodes_block_and_cyclic() {
    hello_allreduce_ring(&[vec![0, 1], vec![2, 3]]).await;
    hello_allreduce_ring(&[vec![0, 2], vec![1, 3]]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_ranks_one_per_node_over_ucx_tcp() {
    hello_allreduce_ring(&[vec![0], vec![1]]).await;
    let out = run_ok("ring", &[vec![0], vec![1]], &[("UCX_TLS", "tcp,self")]).await;
    assert_eq!(out[0], "ring ok laps=10 token=20\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_reports_rank_and_code() {
    for n in [2, 4] {
        let _one = ONE_JOB.lock().await;
        let mut job = launch("abort", &block(n), &[]);
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
        assert!(matches!(abort, PmiEvent::Abort { rank: 1, code: 7, .. }), "{abort:?}");
        // The other ranks are sleeping: the launcher has to kill them.
        assert!(job.children[0].try_wait().expect("rank 0").is_none(), "rank 0 exited by itself");
        for child in &mut job.children {
            let _ = child.start_kill();
            timeout(LIMIT, child.wait()).await.expect("killed rank exits").expect("wait");
        }
    }
}
