//! A step's ranks on this node: checked against the job, placed in its cgroup (and per-rank
//! sub-cpusets when asked), bound, given their environment and PMI sockets, started.

use crate::ports::{JobContext, JobHandle};
use crate::step::pmi::{PmiConfig, PmiEvent, PmiServer};
use berth_core::CpuSet;
use berth_protocol::step::{StepGrant, StepNode};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::mpsc;

/// Why this node's ranks of a step did not start (the reason the step's launch fails with).
#[derive(Debug, thiserror::Error)]
pub enum RanksError {
    #[error("job {job} belongs to uid {owner}, not to uid {asked} named by this step")]
    NotTheOwner { job: berth_core::JobId, owner: u32, asked: u32 },
    #[error(
        "the step's group ids are not among those job {0}'s owner had at submission; submit the job from that group"
    )]
    NotTheOwnersGroups(berth_core::JobId),
    #[error("rank {rank}'s CPUs [{cpus}] are not inside job {job}'s CPUs {job_cpus} on this node")]
    CpusOutsideJob { rank: u32, cpus: String, job: berth_core::JobId, job_cpus: String },
    #[error("job {job} is not running on node {node}")]
    JobNotHere { job: berth_core::JobId, node: String },
    #[error("the step's programs do not fit its ranks: {0}")]
    Programs(berth_core::step::mpmd::RanksError),
    #[error("cannot create {}: {error}", .path.display())]
    FailuresFile { path: PathBuf, error: std::io::Error },
    #[error("cannot open the job's cgroup: {0}")]
    JobCgroup(crate::cgroup::CgroupError),
    #[error("cannot create rank {rank}'s sub-cpuset: {error}")]
    MakeSubCpuset { rank: u32, error: crate::cgroup::CgroupError },
    #[error("cannot open rank {rank}'s sub-cpuset: {error}")]
    OpenSubCpuset { rank: u32, error: std::io::Error },
    #[error(transparent)]
    Mask(#[from] crate::spawn::BeyondMask),
    #[error("cannot make a PMI socket: {0}")]
    PmiPair(std::io::Error),
    #[error("PMI socket: {0}")]
    PmiSocket(std::io::Error),
    #[error("rank {rank}: {error}")]
    Spawn { rank: u32, error: crate::step::rank::SpawnError },
    /// The step asked for PMIx, which this node cannot serve.
    #[error("{0}; check that libpmix is installed (scripts/setup.sh) or run with --mpi pmi2")]
    NoPmixServer(crate::step::pmix::PmixError),
    #[error("rank {rank} is beyond the step's size {size}")]
    RankBeyondSize { rank: u32, size: usize },
    #[error("rank {0} of the step is on no node")]
    RankOnNoNode(usize),
    #[error("PMIx: {0}")]
    Pmix(crate::step::pmix::PmixError),
    #[error("BERTH_GPUS_PER_TASK={0:?}: give a count of GPUs per rank, at least 1")]
    GpusPerTask(String),
    #[error(transparent)]
    GpuBind(#[from] berth_core::gpu::GpuBindError),
}

/// A started rank.
pub struct LocalRank {
    pub rank: u32,
    pub child: crate::step::rank::Process,
}

/// What the shepherd gets back from starting its ranks.
pub struct StartedRanks {
    pub ranks: Vec<LocalRank>,
    pub pmi: PmiServer,
    /// The step's PMIx namespace here (deregistered when dropped), when PMIx is offered.
    pub pmix: Option<crate::step::pmix::Namespace>,
    /// Where survivors read about failed ranks (`BERTH_FAILED_RANKS`): `--no-kill` steps only
    /// (otherwise a failure ends them all and nobody would read it).
    pub failures_file: Option<PathBuf>,
    /// Rank sub-cpusets made for this step (removed at its end).
    pub sub_cpusets: Vec<String>,
}

/// Check that the grant fits the job as this node knows it.
pub fn check(job: &JobHandle, grant: &StepGrant, node: &StepNode) -> Result<(), RanksError> {
    let spec = &job.spec;
    // Until grants are signed (cluster key), never run ranks as anyone but the job's owner,
    // with groups the owner had at submission: a forged grant cannot gain root or a group.
    if grant.user.uid != spec.user.uid {
        return Err(RanksError::NotTheOwner { job: spec.id, owner: spec.user.uid, asked: grant.user.uid });
    }
    let allowed = |g: &u32| *g == spec.user.gid || spec.user.groups.contains(g);
    if !allowed(&grant.user.gid) || !grant.user.groups.iter().all(allowed) {
        return Err(RanksError::NotTheOwnersGroups(spec.id));
    }
    let allocation = job.allocation();
    for r in &node.ranks {
        if r.cpus.is_empty() || !r.cpus.is_subset_of(&allocation.cpus) {
            return Err(RanksError::CpusOutsideJob {
                rank: r.rank,
                cpus: r.cpus.to_list(),
                job: spec.id,
                job_cpus: allocation.cpus.to_list(),
            });
        }
    }
    Ok(())
}

/// The environment every local rank shares: the user's, then berth's per-step variables.
fn node_env(
    grant: &StepGrant,
    node_index: usize,
    job: &JobHandle,
    failures: Option<&std::path::Path>,
) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> =
        grant.env.iter().filter(|(k, _)| !k.starts_with("PMI_") && k != "TMPDIR").cloned().collect();
    let nodes: Vec<&str> = grant.nodes.iter().map(|n| n.name.as_str()).collect();
    let size = grant.size.to_string();
    let local_size = grant.nodes[node_index].ranks.len().to_string();
    set_vars(
        &mut env,
        [
            ("BERTH_JOB_ID", grant.job.to_string()),
            ("BERTH_STEP_ID", grant.step.to_string()),
            ("BERTH_SIZE", size.clone()),
            ("BERTH_LOCAL_SIZE", local_size.clone()),
            ("BERTH_NODEID", node_index.to_string()),
            ("BERTH_NNODES", grant.nodes.len().to_string()),
            ("BERTH_STEP_NODES", nodes.join(",")),
            ("TMPDIR", job.tmpdir().display().to_string()),
            ("MPI_SIZE", size.clone()),
            ("MPI_LOCALNRANKS", local_size.clone()),
            ("OMPI_COMM_WORLD_SIZE", size.clone()),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", local_size),
            ("PMI_SIZE", size),
        ],
    );
    if let Some(f) = failures {
        set_vars(&mut env, [("BERTH_FAILED_RANKS", f.display().to_string())]);
    }
    if let Some(compat) = &job.spec.compat {
        use crate::compat_env::{job_vars, step_vars};
        let cpus = job.allocation().cpus.len();
        let in_job = crate::compat_env::node_index(&job.spec);
        set_compat(&mut env, job_vars(&job.spec, compat, in_job, cpus));
        set_compat(&mut env, step_vars(grant, node_index, &job.allocation().gpus));
    }
    env
}

/// Set `vars` over `env` (crate::compat_env).
fn set_compat(env: &mut Vec<(String, String)>, vars: crate::compat_env::Vars) {
    env.retain(|(k, _)| !vars.iter().any(|(v, _)| v == k));
    env.extend(vars.into_iter().map(|(k, v)| (k.to_string(), v)));
}

/// One rank's own variables on top of the node's.
fn rank_env(base: &[(String, String)], rank: u32, local_rank: usize, host_cpus: &CpuSet) -> Vec<(String, String)> {
    let mut env = base.to_vec();
    let (rank, local) = (rank.to_string(), local_rank.to_string());
    set_vars(
        &mut env,
        [
            ("BERTH_RANK", rank.clone()),
            ("BERTH_LOCAL_RANK", local.clone()),
            ("BERTH_RANK_CPUS", host_cpus.to_list()),
            // For scripts written for other launchers.
            ("MPI_RANK", rank.clone()),
            ("MPI_LOCALRANKID", local.clone()),
            ("OMPI_COMM_WORLD_RANK", rank.clone()),
            ("OMPI_COMM_WORLD_LOCAL_RANK", local),
            ("PMI_RANK", rank),
        ],
    );
    env
}

fn set_vars<const N: usize>(env: &mut Vec<(String, String)>, vars: [(&str, String); N]) {
    env.retain(|(k, _)| !vars.iter().any(|(v, _)| v == k));
    env.extend(vars.into_iter().map(|(k, v)| (k.to_string(), v)));
}

/// Start this node's ranks. On error, ranks already started are returned to be killed by
/// the caller through `partial`.
pub fn start(
    ctx: &Arc<JobContext>,
    job: &Arc<JobHandle>,
    grant: &StepGrant,
    node_index: usize,
    pmi_events: mpsc::UnboundedSender<PmiEvent>,
    (pmix_name, pmix_events): (String, mpsc::UnboundedSender<crate::step::pmix::PmixEvent>),
    partial: &mut Vec<LocalRank>,
) -> Result<StartedRanks, RanksError> {
    let node = &grant.nodes[node_index];
    check(job, grant, node)?;
    let ranks_per_node: Vec<Vec<u32>> = grant.nodes.iter().map(|n| n.ranks.iter().map(|r| r.rank).collect()).collect();
    // MPMD: each rank's program (its application number); all 0 for one program.
    let rank_apps = grant.rank_apps().map_err(RanksError::Programs)?;
    let app_of = |rank: u32| rank_apps.get(rank as usize).copied().unwrap_or(0);
    let pmi = PmiServer::new(
        PmiConfig {
            kvsname: grant.kvsname.clone(),
            size: grant.size,
            appnum: 0,
            appnums: if grant.apps.is_empty() { vec![] } else { node.ranks.iter().map(|r| app_of(r.rank)).collect() },
            universe_size: grant.size,
            process_mapping: crate::step::pmi::process_mapping(&ranks_per_node),
            local_ranks: node.ranks.iter().map(|r| r.rank).collect(),
        },
        pmi_events,
    );
    // A file created per step costs the launch ~0.1-0.2 ms (ext4 inode allocation among the
    // spool's recently deleted ones): only no-kill steps have survivors to read it.
    let failures_file = if grant.no_kill {
        let f = job.spool.join(format!("step{}.failed", grant.step));
        std::fs::write(&f, "").map_err(|error| RanksError::FailuresFile { path: f.clone(), error })?;
        let _ = std::os::unix::fs::lchown(&f, Some(job.spec.user.uid), Some(job.spec.user.gid));
        Some(f)
    } else {
        None
    };
    let pmix = pmix_namespace(ctx, job, grant, node_index, &rank_apps, (pmix_name, pmix_events))?;
    let mut sub_cpusets = Vec::new();
    let mut base = node_env(grant, node_index, job, failures_file.as_deref());
    set_vars(&mut base, [("BERTH_AGENT_SOCKET", ctx.agent_socket.display().to_string())]);
    // Open MPI names its shared-memory segments after the host name, the job (from the PMIx
    // namespace) and the local rank: agents sharing one host (emulated nodes) would collide
    // in /dev/shm. The job's TMPDIR is per node and removed with the job; a user's own
    // setting wins.
    if pmix.is_some() && !base.iter().any(|(k, _)| k == OMPI_VADER_DIR) {
        base.push((OMPI_VADER_DIR.into(), job.tmpdir().display().to_string()));
    }
    // Opened once for the step: every rank joins through the same files.
    let job_join = job.cgroup.join_files().map_err(RanksError::JobCgroup)?;
    let rank_gpus = gpus_of_ranks(ctx, job, grant, node, &rank_apps)?;
    for local in spawn_order(node, &ctx.cpumap) {
        let place = &node.ranks[local];
        let host = ctx.cpumap.cpus(&place.cpus);
        let mut join: Vec<std::os::fd::RawFd> = job_join.iter().map(|f| f.as_raw_fd()).collect();
        let mut rank_procs = None;
        if grant.rank_cpusets {
            let name = format!("s{}r{}", grant.step, place.rank);
            let mems = rank_mems(ctx, job, &place.cpus);
            let dir = job
                .cgroup
                .make_child(&name, &host.to_list(), &mems)
                .map_err(|error| RanksError::MakeSubCpuset { rank: place.rank, error })?;
            sub_cpusets.push(name);
            let procs = std::fs::OpenOptions::new()
                .write(true)
                .open(dir.join(job.cgroup.join_file_name()))
                .map_err(|error| RanksError::OpenSubCpuset { rank: place.rank, error })?;
            join.push(procs.as_raw_fd());
            rank_procs = Some(procs);
        }
        let program = grant.program_of(place.rank, app_of(place.rank));
        let affinity = if program.bind { Some(crate::spawn::cpu_mask(&host)?) } else { None };
        // PMI-1/PMI-2's socket, unless the step asked for PMIx (or nothing) only.
        let pair = if grant.mpi.offers_pmi() {
            Some(std::os::unix::net::UnixStream::pair().map_err(RanksError::PmiPair)?)
        } else {
            None
        };
        let mut env = rank_env(&base, place.rank, local, &host);
        if !grant.apps.is_empty() {
            // An MPMD part's own variables, and its number for scripts (MPI_APPNUM's value).
            let own = program.env.iter().cloned().chain([("BERTH_APPNUM".to_string(), program.appnum.to_string())]);
            for (k, v) in own {
                env.retain(|(n, _)| *n != k);
                env.push((k, v));
            }
        }
        if let Some(vars) = rank_gpus.get(local) {
            env.retain(|(k, _)| !GPU_VARS.contains(&k.as_str()));
            env.extend(vars.iter().map(|(k, v)| (k.to_string(), v.clone())));
        }
        if job.spec.compat.is_some() {
            set_compat(&mut env, crate::compat_env::rank_vars(place.rank, local));
        }
        if let Some(ns) = &pmix {
            let vars = ns.fork_env(place.rank);
            env.retain(|(k, _)| !vars.iter().any(|(v, _)| v == k));
            env.extend(vars);
        }
        if let Some((_, theirs)) = &pair {
            env.push(("PMI_FD".into(), theirs.as_raw_fd().to_string()));
        } else {
            env.retain(|(k, _)| k != "PMI_SIZE" && k != "PMI_RANK");
        }
        let child = crate::step::rank::spawn(crate::step::rank::RankLaunch {
            argv: &program.argv,
            env,
            cwd: program.cwd,
            user: &grant.user,
            join_fds: join,
            affinity,
            pmi_fd: pair.as_ref().map(|(_, theirs)| theirs.as_raw_fd()),
            stdin: place.rank == 0,
            umask: job.spec.umask,
            nice: ctx.priority.job_nice(),
        })
        .map_err(|error| RanksError::Spawn { rank: place.rank, error })?;
        berth_protocol::probe::mark("agent rank spawned");
        drop(rank_procs);
        if let Some((ours, theirs)) = pair {
            drop(theirs);
            ours.set_nonblocking(true).map_err(RanksError::PmiSocket)?;
            let stream = tokio::net::UnixStream::from_std(ours).map_err(RanksError::PmiSocket)?;
            let server = pmi.clone();
            let rank = place.rank;
            tokio::spawn(async move { server.serve_rank(rank, stream).await });
        }
        partial.push(LocalRank { rank: place.rank, child });
    }
    Ok(StartedRanks { ranks: std::mem::take(partial), pmi, pmix, failures_file, sub_cpusets })
}

const OMPI_VADER_DIR: &str = "OMPI_MCA_btl_vader_backing_directory";

/// The PMIx namespace `name` of the step on this node
/// ([`crate::step::pmix::namespace_name`]), its events to `events`.
/// Under `--mpi auto`, a server that cannot start costs only PMIx: the ranks still get
/// PMI-1/PMI-2.
fn pmix_namespace(
    ctx: &JobContext,
    job: &JobHandle,
    grant: &StepGrant,
    node_index: usize,
    rank_apps: &[u32],
    (name, events): (String, mpsc::UnboundedSender<crate::step::pmix::PmixEvent>),
) -> Result<Option<crate::step::pmix::Namespace>, RanksError> {
    if !grant.mpi.offers_pmix() {
        return Ok(None);
    }
    if let Err(e) = crate::step::pmix::ensure_server(&ctx.spool_root.join("pmix")) {
        if grant.mpi == berth_core::step::MpiKind::Pmix {
            return Err(RanksError::NoPmixServer(e));
        }
        tracing::warn!(job = %grant.job, step = grant.step, "no PMIx for this step: {e}");
        return Ok(None);
    }
    let size = grant.size as usize;
    let (mut rank_node, mut rank_local) = (vec![u32::MAX; size], vec![0u32; size]);
    for (n, node) in grant.nodes.iter().enumerate() {
        for (i, r) in node.ranks.iter().enumerate() {
            match rank_node.get_mut(r.rank as usize) {
                Some(slot) => *slot = n as u32,
                None => return Err(RanksError::RankBeyondSize { rank: r.rank, size }),
            }
            rank_local[r.rank as usize] = i as u32;
        }
    }
    if let Some(r) = rank_node.iter().position(|&n| n == u32::MAX) {
        return Err(RanksError::RankOnNoNode(r));
    }
    // A bound rank's host CPUs (its own sub-cpuset confines it as binding does): Open MPI
    // computes its local peers' relative locality from them.
    let mut rank_cpus = vec![None; size];
    for r in &grant.nodes[node_index].ranks {
        let app = rank_apps.get(r.rank as usize).copied().unwrap_or(0);
        if grant.binds(app) || grant.rank_cpusets {
            rank_cpus[r.rank as usize] = Some(ctx.cpumap.cpus(&r.cpus).to_list());
        }
    }
    let nsdir = job.tmpdir();
    let spec = crate::step::pmix::NamespaceSpec {
        name,
        jobid: format!("{}.{}", grant.job, grant.step),
        size: grant.size,
        rank_app: rank_apps.to_vec(),
        napps: grant.apps.len().max(1) as u32,
        nodes: grant.nodes.iter().map(|n| n.name.as_str()).collect(),
        me: node_index as u32,
        rank_node,
        rank_local,
        rank_cpus,
        nsdir: &nsdir,
        uid: grant.user.uid,
        gid: grant.user.gid,
        parent: grant.spawned_by.as_ref().map(|p| (p.nspace.clone(), p.rank)),
    };
    crate::step::pmix::Namespace::register(&spec, events).map(Some).map_err(RanksError::Pmix)
}

/// The GPU variables a rank's environment may carry from its job (replaced per rank).
const GPU_VARS: [&str; 5] =
    ["BERTH_GPUS", "GPU_DEVICE_ORDINAL", "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "ZE_AFFINITY_MASK"];

/// Each local rank's GPU variables (indexed as `node.ranks`), when the job holds GPUs on this
/// node: with `BERTH_GPUS_PER_TASK` or `BERTH_GPU_BIND` in the variables of the rank's
/// program (an MPMD part's own `--gpus-per-task`/`--gpu-bind`) or else of the step (`berth
/// run --gpus-per-task`/`--gpu-bind`, or the job's), each rank its own
/// ([`berth_core::gpu::rank_gpus`], `closest` unless told); else every rank the job's GPUs
/// on the node. The parts are dealt in order, each from the GPUs no earlier part's rank took
/// when enough are left for it (else from all the job's). Empty for a node where the job has
/// none.
fn gpus_of_ranks(
    ctx: &JobContext,
    job: &JobHandle,
    grant: &StepGrant,
    node: &StepNode,
    rank_apps: &[u32],
) -> Result<Vec<Vec<(&'static str, String)>>, RanksError> {
    use berth_core::gpu::{gpu_env, rank_gpus, GpuBind};
    let held = &job.allocation().gpus;
    if held.is_empty() {
        return Ok(vec![]);
    }
    let app_of = |rank: u32| rank_apps.get(rank as usize).copied().unwrap_or(0);
    // The node's ranks by program, in program order (one group in a one-program step).
    let mut groups: std::collections::BTreeMap<u32, Vec<usize>> = std::collections::BTreeMap::new();
    for (i, r) in node.ranks.iter().enumerate() {
        groups.entry(app_of(r.rank)).or_default().push(i);
    }
    let relative = ctx.cgroups.contains_devices();
    let gpus = &ctx.topology.gpus;
    let mut sets: Vec<Vec<u32>> = vec![vec![]; node.ranks.len()];
    let mut taken: Vec<u32> = Vec::new();
    for (app, members) in groups {
        let app_env = grant.apps.get(app as usize).map(|a| a.env.as_slice()).unwrap_or(&[]);
        let var = |name: &str| {
            app_env.iter().chain(grant.env.iter()).find(|(k, _)| k == name).map(|(_, v)| v.trim().to_string())
        };
        let per_task = match var("BERTH_GPUS_PER_TASK") {
            Some(v) => {
                Some(v.parse::<u32>().ok().filter(|&n| n > 0).ok_or_else(|| RanksError::GpusPerTask(v.clone()))?)
            }
            None => None,
        };
        let bind = var("BERTH_GPU_BIND").filter(|b| !b.is_empty()).map(|b| GpuBind::parse(&b)).transpose()?;
        let mine: Vec<Vec<u32>> = match (per_task, bind) {
            (None, None) => vec![held.clone(); members.len()],
            (per_task, bind) => {
                let n = per_task.unwrap_or(1);
                let free: Vec<u32> = held.iter().copied().filter(|g| !taken.contains(g)).collect();
                let want = (members.len() as u64).saturating_mul(u64::from(n));
                let bind = bind.unwrap_or(GpuBind::Closest);
                // `none` (all of them) and explicit maps name the job's GPUs themselves.
                let dealt = matches!(bind, GpuBind::Closest | GpuBind::PerTask(_) | GpuBind::Single(_));
                let from = if dealt && free.len() as u64 >= want { &free } else { held };
                let cpus: Vec<berth_core::CpuSet> = members.iter().map(|&i| node.ranks[i].cpus.clone()).collect();
                let sets = rank_gpus(gpus, from, &cpus, n, &bind)?;
                for s in &sets {
                    taken.extend(s.iter().copied());
                }
                sets
            }
        };
        for (&i, set) in members.iter().zip(mine) {
            sets[i] = set;
        }
    }
    Ok(sets.iter().map(|mine| gpu_env(gpus, held, mine, relative)).collect())
}

/// The order to start the node's ranks in (indexes into its ranks): those whose CPUs exclude
/// the CPU this thread runs on first. A rank's child is made on this CPU (see
/// `rank::clone_vfork`) and leaves it when it binds; one bound here stays, and the next
/// child would queue behind its program (0.5-0.8 ms for `-n 2 true` on 2 CPUs). Ranks of one
/// node are independent; only the local rank numbers (their positions) mean anything.
fn spawn_order(node: &StepNode, cpumap: &crate::cpumap::CpuMap) -> Vec<usize> {
    // SAFETY: no arguments; -1 on failure.
    let here = unsafe { libc::sched_getcpu() };
    spawn_order_from(node, cpumap, u32::try_from(here).ok())
}

fn spawn_order_from(node: &StepNode, cpumap: &crate::cpumap::CpuMap, here: Option<u32>) -> Vec<usize> {
    let mut order: Vec<usize> = (0..node.ranks.len()).collect();
    if let Some(here) = here {
        // Stable: otherwise in rank order.
        order.sort_by_key(|&i| cpumap.cpus(&node.ranks[i].cpus).contains(here));
    }
    order
}

/// The job's memory nodes local to `cpus`, as host nodes; the job's own when none is.
fn rank_mems(ctx: &JobContext, job: &JobHandle, cpus: &CpuSet) -> String {
    let topo = &ctx.topology;
    let job_mems = job.allocation().mems;
    let local: CpuSet = topo
        .numa_nodes
        .iter()
        .filter(|n| n.cpus.intersects(cpus) && job_mems.contains(n.os_index))
        .map(|n| n.os_index)
        .collect();
    let mems = if local.is_empty() { job_mems } else { local };
    ctx.cpumap.mems(&mems).to_list()
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_core::step::RankPlace;
    use berth_core::topology::Topology;

    #[test]
    fn ranks_bound_to_the_spawning_cpu_start_last() {
        // 4 emulated PUs dealt onto host CPUs 0-1: PU i -> CPU i % 2.
        let topo = Topology::uniform(1, 1, 4, 1, 1 << 30);
        let map = crate::cpumap::CpuMap::round_robin(
            &topo,
            CpuSet::parse_list("0-1").unwrap(),
            CpuSet::parse_list("0").unwrap(),
        );
        let place = |rank: u32, pus: &str| RankPlace { rank, cpus: CpuSet::parse_list(pus).unwrap() };
        let node = StepNode {
            name: "n".into(),
            address: String::new(),
            ranks: vec![place(0, "0"), place(1, "1"), place(2, "2"), place(3, "3")],
            instance: String::new(),
        };
        assert_eq!(spawn_order_from(&node, &map, Some(0)), vec![1, 3, 0, 2]);
        assert_eq!(spawn_order_from(&node, &map, Some(1)), vec![0, 2, 1, 3]);
        assert_eq!(spawn_order_from(&node, &map, None), vec![0, 1, 2, 3]);
    }
}
