//! System tests of GPU jobs on emulated GPU nodes (issue 20): device containment with the
//! cgroup v1 `devices` controller, on stand-in device files made with mknod.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// One package, two NUMA nodes of two cores: with `--gpus-per-numa 1`, GPU 0 on NUMA node 0
/// and GPU 1 on NUMA node 1.
const TOPO: &str = "package:1 numa:2 core:2 pu:1";

/// A cluster of one emulated 2-GPU node whose GPUs' device files are stand-ins in `DEV`:
/// `nvidia0` with /dev/full's numbers (1:7), `nvidia1` with /dev/random's (1:8), both
/// readable by anyone, so that a denied open is the cgroup's doing.
fn gpu_cluster(topology: &str) -> (Cluster, PathBuf) {
    gpu_cluster_configured(topology, None)
}

/// [`gpu_cluster`] with controller settings `toml` (e.g. a `[preempt]` table) in its berth.toml.
fn gpu_cluster_configured(topology: &str, toml: Option<&str>) -> (Cluster, PathBuf) {
    require_root();
    let devices = cgroup_mount("devices");
    assert!(
        devices.join("devices.deny").exists(),
        "this test needs the cgroup v1 devices controller at {} (mount -t cgroup -o devices cgroup {0})",
        devices.display()
    );
    let tmp = tempfile::Builder::new().prefix("berth-test-").tempdir().expect("tempdir");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let dev = tmp.path().join("dev");
    std::fs::create_dir(&dev).unwrap();
    for (gpu, minor) in [(0, 7), (1, 8)] {
        let path = dev.join(format!("nvidia{gpu}"));
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid C path; mknod has no other precondition.
        let rc = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, minor)) };
        assert_eq!(rc, 0, "mknod {}: {}", path.display(), std::io::Error::last_os_error());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    }
    if let Some(toml) = toml {
        let dir = tmp.path().join("cluster");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("berth.toml"), toml).unwrap();
    }
    let dev_s = dev.display().to_string();
    let c = Cluster::up_with(tmp, 1, topology, &["--gpus-per-numa", "1", "--gpu-device-dir", &dev_s]);
    (c, dev)
}

/// The script's report of each stand-in: `nvidiaN ok` or `nvidiaN denied: ERROR`.
fn probe_script(dev: &Path) -> String {
    format!(
        "#!/bin/sh\necho \"gpus=$BERTH_GPUS cuda=$CUDA_VISIBLE_DEVICES\"\ngrep devices /proc/self/cgroup\n\
         for i in 0 1; do\n  if err=$(head -c1 {dev}/nvidia$i 2>&1 >/dev/null); then echo \"nvidia$i ok\"; \
         else echo \"nvidia$i denied: $err\"; fi\ndone\n",
        dev = dev.display()
    )
}

fn job_devices_cgroup(c: &Cluster, id: u64) -> PathBuf {
    cgroup_mount("devices").join("berth").join(c.cluster_id()).join("node1").join(format!("job_{id}"))
}

fn wait_gone(path: &Path, c: &Cluster) {
    let t0 = Instant::now();
    while path.exists() {
        assert!(t0.elapsed() < Duration::from_secs(15), "{} left after the job\n{}", path.display(), c.logs());
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_gpu_job_opens_its_gpu_and_not_the_others() {
    let (c, dev) = gpu_cluster(TOPO);
    let nodes = c.json(&["nodes"]);
    let gpus = &nodes[0]["gpus"];
    assert_eq!(gpus.as_array().map(Vec::len), Some(2), "{nodes:#}");
    assert_eq!(gpus[0]["device_files"][0], format!("{}/nvidia0", dev.display()), "{nodes:#}");

    let script = probe_script(&dev);
    let id = c.submit("gpu.sh", &script, &["--gpus", "1", "--gpu-type", "emulated"]);
    let j = c.wait_finished(id, Duration::from_secs(60));
    assert_eq!(j["state"], "completed", "{j:#}\n{}", c.logs());
    let out = std::fs::read_to_string(c.root().join(format!("berth-{id}.out"))).unwrap();
    let mine: u32 = out
        .lines()
        .find_map(|l| l.strip_prefix("gpus=")?.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no BERTH_GPUS in the output:\n{out}"));
    let other = 1 - mine;
    assert!(out.contains(&format!("nvidia{mine} ok")), "its own GPU opens:\n{out}");
    assert!(
        out.contains(&format!("nvidia{other} denied:")) && out.contains("Operation not permitted"),
        "the other GPU is EPERM:\n{out}"
    );
    assert!(out.contains(&format!("/node1/job_{id}")), "the job ran in its devices cgroup:\n{out}");
    wait_gone(&job_devices_cgroup(&c, id), &c);

    // A job without GPUs on a GPU node gets none of them.
    let id = c.submit("nogpu.sh", &script, &[]);
    let j = c.wait_finished(id, Duration::from_secs(60));
    assert_eq!(j["state"], "completed", "{j:#}\n{}", c.logs());
    let out = std::fs::read_to_string(c.root().join(format!("berth-{id}.out"))).unwrap();
    assert!(out.contains("nvidia0 denied:") && out.contains("nvidia1 denied:"), "{out}");
    wait_gone(&job_devices_cgroup(&c, id), &c);
    // Outside any job, the stand-ins open: the rules are the jobs' own.
    assert!(std::fs::File::open(dev.join("nvidia1")).is_ok());
    assert_no_job_cgroups(&c);
}

/// `berth run -n 2 --gpus-per-task 1` on a node of two NUMA nodes, one core and one GPU each:
/// the interactive allocation takes both, each rank runs on one NUMA node's core and gets the
/// GPU of that NUMA node, in its own CUDA_VISIBLE_DEVICES.
#[test]
fn each_rank_gets_the_gpu_next_to_its_core() {
    let (c, _dev) = gpu_cluster("package:1 numa:2 core:1 pu:1");
    // The emulated node's PUs map onto the host's CPUs in order (round robin): PU i is host
    // CPU real[i % n], so with two host CPUs a rank's BERTH_RANK_CPUS names its PU.
    let root = cgroup_mount("cpuset").join("berth").join(c.cluster_id()).join("node1").join("cpuset.cpus");
    let real = expand(&std::fs::read_to_string(&root).unwrap());
    assert!(
        real.len() >= 2,
        "this test needs 2 host CPUs in {} to tell the ranks' cores apart: {real:?}",
        root.display()
    );
    let nodes = c.json(&["nodes"]);
    let gpus = nodes[0]["gpus"].as_array().cloned().unwrap_or_default();
    assert_eq!(gpus.len(), 2, "{nodes:#}");
    let out = c.berth(&[
        "run",
        "-n",
        "2",
        "--gpus-per-task",
        "1",
        "--label",
        "sh",
        "-c",
        "echo \"rank=$BERTH_RANK cpus=$BERTH_RANK_CPUS gpus=$BERTH_GPUS cuda=$CUDA_VISIBLE_DEVICES\"",
    ]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}{}\n{}", String::from_utf8_lossy(&out.stderr), c.logs());
    let mut seen_gpus = vec![];
    let mut seen_cuda = vec![];
    for line in text.lines().filter(|l| l.contains("rank=")) {
        let field = |k: &str| line.split(' ').find_map(|w| w.strip_prefix(k)).unwrap_or("").to_string();
        let (cpus, gpu, cuda) = (field("cpus="), field("gpus="), field("cuda="));
        let g: usize = gpu.parse().unwrap_or_else(|_| panic!("one GPU per rank: {line}"));
        // The GPU's local PU (the node's topology) as the host CPU the rank runs on.
        let pu: usize = gpus[g]["cpus"].as_str().and_then(|l| l.parse().ok()).unwrap_or_else(|| panic!("{nodes:#}"));
        assert_eq!(cpus, real[pu % real.len()].to_string(), "rank not next to its GPU {g}: {line}");
        seen_gpus.push(gpu);
        seen_cuda.push(cuda);
    }
    seen_gpus.sort();
    seen_cuda.sort();
    assert_eq!(seen_gpus, ["0", "1"], "{text}");
    // Under the devices cgroup the job's two GPUs are 0 and 1 to CUDA: one each.
    assert_eq!(seen_cuda, ["0", "1"], "{text}");
    assert_no_job_cgroups(&c);
}

/// MPMD with GPUs per part, in a job holding both GPUs of the node: `-n 1 --gpus-per-task 1
/// a : -n 1 --gpus-per-task 1 b` gives each part's rank its own GPU (the second part's from
/// those the first left), and a part's own `--gpu-bind none` gives its rank both while the
/// first part's rank keeps one.
#[test]
fn each_mpmd_part_gets_its_own_gpus() {
    let (c, _dev) = gpu_cluster(TOPO);
    let probe = |tag: &str| format!("sh -c 'echo {tag} rank=$BERTH_RANK app=$BERTH_APPNUM gpus=$BERTH_GPUS'");
    let script = format!(
        "#!/bin/sh\n{BIN} run -n 1 --gpus-per-task 1 {a} : -n 1 --gpus-per-task 1 {b}\necho own-rc=$?\n\
         {BIN} run -n 1 --gpus-per-task 1 {c} : -n 1 --gpu-bind none {d}\necho none-rc=$?\n",
        a = probe("a"),
        b = probe("b"),
        c = probe("c"),
        d = probe("d"),
    );
    let id = c.submit("mpmd-gpu.sh", &script, &["--gpus", "2", "--cores", "2"]);
    let job = c.wait_finished(id, Duration::from_secs(60));
    let read = |f: &str| std::fs::read_to_string(c.root().join(f)).unwrap_or_default();
    let (out, err) = (read(&format!("berth-{id}.out")), read(&format!("berth-{id}.err")));
    assert_eq!(job["state"], "completed", "{job:#}\n{out}\n{err}\n{}", c.logs());
    assert!(out.contains("own-rc=0") && out.contains("none-rc=0"), "{out}\n{err}");
    let gpus_of = |tag: &str| -> String {
        let line =
            out.lines().find(|l| l.starts_with(&format!("{tag} "))).unwrap_or_else(|| panic!("no {tag}: {out}\n{err}"));
        line.split(' ').find_map(|w| w.strip_prefix("gpus=")).unwrap_or_default().to_string()
    };
    let (a, b) = (gpus_of("a"), gpus_of("b"));
    let mut own = vec![a.clone(), b.clone()];
    own.sort();
    assert_eq!(own, ["0", "1"], "one GPU each, not the same: a={a} b={b}\n{out}");
    let (cg, dg) = (gpus_of("c"), gpus_of("d"));
    assert!(cg == "0" || cg == "1", "the first part's rank has one GPU: {cg}\n{out}");
    assert_eq!(dg, "0,1", "--gpu-bind none: both of the job's GPUs\n{out}");
    assert!(out.contains("b rank=1 app=1") && out.contains("d rank=1 app=1"), "{out}");
    assert_no_job_cgroups(&c);
}

/// A batch job holding a node's 4 cores and its 2 GPUs (one per NUMA node): `berth run -n 2
/// --gpus-per-task 1 --rank-cpusets` inside it puts rank 1 on NUMA node 1's first core, next to
/// GPU 1 (without the GPUs in the plan both ranks went to NUMA node 0's two cores, rank 1 far
/// from its GPU), and each rank gets its own GPU in BERTH_GPUS/CUDA_VISIBLE_DEVICES/
/// GPU_DEVICE_ORDINAL, its rank cpuset holding that core.
#[test]
fn ranks_of_a_batch_step_get_cores_next_to_their_gpus() {
    let (c, _dev) = gpu_cluster(TOPO);
    // Emulated PU i runs on host CPU real[i % n] (round robin over the node's cpuset).
    let root = cgroup_mount("cpuset").join("berth").join(c.cluster_id()).join("node1").join("cpuset.cpus");
    let real = expand(&std::fs::read_to_string(&root).unwrap());
    assert!(
        real.len() == 2,
        "this test needs exactly 2 host CPUs in {} to tell the ranks' PUs apart: {real:?}",
        root.display()
    );
    let nodes = c.json(&["nodes"]);
    let gpus = nodes[0]["gpus"].as_array().cloned().unwrap_or_default();
    assert_eq!(gpus.len(), 2, "{nodes:#}");
    assert_eq!((gpus[0]["cpus"].as_str(), gpus[1]["cpus"].as_str()), (Some("0-1"), Some("2-3")), "{nodes:#}");
    let script = format!(
        "#!/bin/sh\n{BIN} run -n 2 --gpus-per-task 1 --rank-cpusets sh -c \
         'echo \"rank=$BERTH_RANK cpus=$BERTH_RANK_CPUS gpus=$BERTH_GPUS cuda=$CUDA_VISIBLE_DEVICES \
         ordinal=$GPU_DEVICE_ORDINAL cpuset=$(cat /sys/fs/cgroup/cpuset$(cat /proc/self/cpuset)/cpuset.cpus)\"'\n"
    );
    let id = c.submit("ranks.sh", &script, &["--cores", "4", "--gpus", "2"]);
    let j = c.wait_finished(id, Duration::from_secs(60));
    let out = std::fs::read_to_string(c.root().join(format!("berth-{id}.out"))).unwrap_or_default();
    assert_eq!(j["state"], "completed", "{j:#}\n{out}\n{}", c.logs());
    let mut lines: Vec<&str> = out.lines().filter(|l| l.starts_with("rank=")).collect();
    lines.sort();
    assert_eq!(lines.len(), 2, "{out}");
    // Rank 0 on PU 0 (GPU 0's), rank 1 on PU 2 (GPU 1's): both on host CPU real[0].
    for (rank, line) in lines.iter().enumerate() {
        let field = |k: &str| line.split(' ').find_map(|w| w.strip_prefix(k)).unwrap_or("").to_string();
        let pu = rank * 2;
        let host = real[pu % real.len()].to_string();
        assert_eq!(field("cpus="), host, "rank {rank} not on PU {pu}, next to GPU {rank}: {out}");
        assert_eq!(field("cpuset="), host, "rank {rank}'s cpuset: {out}");
        assert_eq!(field("gpus="), rank.to_string(), "{out}");
        // Under the devices cgroup the job's GPUs are 0 and 1 to CUDA.
        assert_eq!(field("cuda="), rank.to_string(), "{out}");
        assert_eq!(field("ordinal="), rank.to_string(), "{out}");
    }
    assert_no_job_cgroups(&c);
}

/// A kernel CPU list ("0-1,3") as its CPUs.
fn expand(list: &str) -> Vec<u32> {
    let mut out = vec![];
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => out.extend(a.parse::<u32>().unwrap()..=b.parse::<u32>().unwrap()),
            None => out.push(part.parse().unwrap()),
        }
    }
    out
}

/// Two emulated nodes of two NUMA nodes with two cores and two GPUs each (4 GPUs a node), no
/// device files (no containment needed to see which GPUs a job got).
fn two_gpu_nodes() -> Cluster {
    require_root();
    let tmp = tempfile::Builder::new().prefix("berth-test-").tempdir().expect("tempdir");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    Cluster::up_with(tmp, 2, "package:1 numa:2 core:2 pu:1", &["--gpus-per-numa", "2"])
}

/// The job's GPUs as `<host>-gpu<N>` lines, node by node, from its allocation.
fn gpu_lines(job: &serde_json::Value) -> Vec<String> {
    let mut lines = vec![];
    for part in job["allocation"].as_array().into_iter().flatten() {
        for g in part["gpus"].as_array().into_iter().flatten() {
            lines.push(format!("{}-gpu{}", part["node"].as_str().unwrap_or("?"), g));
        }
    }
    lines
}

/// Torque's `$PBS_GPUFILE`: a line `<host>-gpu<N>` for each GPU of the job on all its nodes,
/// as its allocation says; a job without GPUs has no such variable.
#[test]
fn pbs_gpufile_lists_the_job_s_gpus_on_all_its_nodes() {
    let c = two_gpu_nodes();
    let script = "#!/bin/sh\n#PBS -l nodes=2:ppn=1:gpus=3\n\
                  echo \"file=${PBS_GPUFILE:-unset}\" > gpufile.env\n\
                  if [ -n \"$PBS_GPUFILE\" ]; then cat \"$PBS_GPUFILE\" > gpufile.txt; \
                  stat -c '%u %a' \"$PBS_GPUFILE\" > gpufile.mode; fi\n";
    let id = c.submit("torque.sh", script, &[]);
    let job = c.wait_finished(id, Duration::from_secs(60));
    assert_eq!(job["state"], "completed", "{job:#}\n{}", c.logs());
    let want = gpu_lines(&job);
    assert_eq!(want.len(), 6, "3 GPUs on each of 2 nodes: {job:#}");
    let env = std::fs::read_to_string(c.root().join("gpufile.env")).unwrap();
    assert!(env.trim().ends_with("/pbs_gpufile"), "PBS_GPUFILE names the spool's file: {env}");
    let got = std::fs::read_to_string(c.root().join("gpufile.txt")).unwrap();
    assert_eq!(got.lines().collect::<Vec<_>>(), want, "{got}");
    let hosts: std::collections::BTreeSet<&str> = got.lines().filter_map(|l| l.split("-gpu").next()).collect();
    assert_eq!(hosts.len(), 2, "both nodes' GPUs: {got}");
    // The job's own file (its user's uid), readable by no one else.
    let mode = std::fs::read_to_string(c.root().join("gpufile.mode")).unwrap();
    // SAFETY: getuid has no precondition.
    let uid = unsafe { libc::getuid() };
    assert_eq!(mode.trim(), format!("{uid} 600"), "owner and mode of $PBS_GPUFILE");

    // Without GPUs: no file, no variable.
    std::fs::remove_file(c.root().join("gpufile.env")).unwrap();
    let id = c.submit("plain.sh", &script.replace(":gpus=3", ""), &[]);
    let job = c.wait_finished(id, Duration::from_secs(60));
    assert_eq!(job["state"], "completed", "{job:#}\n{}", c.logs());
    let env = std::fs::read_to_string(c.root().join("gpufile.env")).unwrap();
    assert_eq!(env.trim(), "file=unset");
    assert_no_job_cgroups(&c);
}

/// `berth show` says where each GPU of a job sits (NUMA node, socket, local cpus and how many
/// of the job's are among them), in text and in `--json`'s `gpu_places`.
#[test]
fn show_tells_where_each_gpu_sits() {
    let c = two_gpu_nodes();
    let id = c.submit("place.sh", "#!/bin/sh\ntrue\n", &["--gpus", "2", "--cores", "2", "--gpu-locality", "strict"]);
    let job = c.wait_finished(id, Duration::from_secs(60));
    assert_eq!(job["state"], "completed", "{job:#}\n{}", c.logs());
    let part = &job["allocation"][0];
    let node = part["node"].as_str().unwrap().to_string();
    let job_cpus = expand(part["cpus"].as_str().unwrap());
    let places = job["gpu_places"].as_array().cloned().unwrap_or_default();
    let held: Vec<u64> = part["gpus"].as_array().unwrap().iter().filter_map(|g| g.as_u64()).collect();
    assert_eq!(places.iter().filter_map(|p| p["index"].as_u64()).collect::<Vec<_>>(), held, "{job:#}");
    let layout = c.json(&["nodes"]);
    let topo = layout.as_array().unwrap().iter().find(|n| n["name"] == node.as_str()).expect("the job's node");
    for p in &places {
        assert_eq!(p["node"], node.as_str());
        assert_eq!(p["type"], "emulated");
        assert_eq!(p["socket"], 0, "one package: {p}");
        let gpu = &topo["gpus"][p["index"].as_u64().unwrap() as usize];
        assert_eq!(p["numa"], gpu["numa"], "{p} vs {gpu}");
        assert_eq!(p["cpus"], gpu["cpus"], "{p} vs {gpu}");
        // Strict locality: both of the job's cores are next to each of its GPUs.
        let local = expand(p["cpus"].as_str().unwrap());
        assert!(job_cpus.iter().all(|c| local.contains(c)), "{p} vs job cpus {job_cpus:?}");
        assert_eq!(p["job_cpus_local"], 2, "{p}");
    }
    let out = c.berth(&["show", &id.to_string()]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let numa = places[0]["numa"].as_u64().unwrap();
    let line = format!("gpu: {node}: gpu {} (emulated) on NUMA node {numa}, socket 0", held[0]);
    assert!(text.contains(&line), "{line:?} in:\n{text}");
    assert!(text.contains("2 of the job's"), "{text}");
    // A job without GPUs has no such lines and no gpu_places.
    let id = c.submit("plain.sh", "#!/bin/sh\ntrue\n", &["--cores", "1"]);
    let job = c.wait_finished(id, Duration::from_secs(60));
    assert!(job.get("gpu_places").is_none(), "{job:#}");
    let out = c.berth(&["show", &id.to_string()]);
    assert!(!String::from_utf8_lossy(&out.stdout).contains(" gpu"), "{}", String::from_utf8_lossy(&out.stdout));
}

/// Slurm's `--gpus-per-socket N --sockets-per-node S` (`#SBATCH` and berth's flags): N GPUs
/// on each of S sockets of the node; without `--sockets-per-node` refused, more GPUs on a
/// socket than it has refused as never fitting.
#[test]
fn gpus_per_socket_take_gpus_of_each_socket() {
    require_root();
    let tmp = tempfile::Builder::new().prefix("berth-test-").tempdir().expect("tempdir");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    // Two sockets of one NUMA node and two cores each, two GPUs on each socket.
    let c = Cluster::up_with(tmp, 1, "package:2 numa:1 core:2 pu:1", &["--gpus-per-numa", "2"]);
    let nodes = c.json(&["nodes"]);
    let gpus = nodes[0]["gpus"].as_array().cloned().unwrap_or_default();
    assert_eq!(gpus.len(), 4, "{nodes:#}");
    let script = "#!/bin/sh\n#SBATCH --gpus-per-socket=1 --sockets-per-node=2 -c 2\necho \"gpus=$BERTH_GPUS\"\n";
    let id = c.submit("socket.sh", script, &[]);
    let job = c.wait_finished(id, Duration::from_secs(60));
    assert_eq!(job["state"], "completed", "{job:#}\n{}", c.logs());
    let held: Vec<usize> = job["allocation"][0]["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|g| g.as_u64())
        .map(|g| g as usize)
        .collect();
    let mut sockets: Vec<u64> = held.iter().filter_map(|&g| gpus[g]["package"].as_u64()).collect();
    sockets.sort_unstable();
    assert_eq!(sockets, [0, 1], "one GPU on each socket: {held:?}\n{nodes:#}");
    let show = String::from_utf8_lossy(&c.berth(&["show", &id.to_string()]).stdout).into_owned();
    assert!(show.contains("gpus wanted: 1 per socket on 2 socket(s) a node"), "{show}");
    // Two on one socket: both of that socket.
    let id = c.submit("two.sh", "#!/bin/sh\ntrue\n", &["--gpus-per-socket", "2", "--sockets-per-node", "1"]);
    let job = c.wait_finished(id, Duration::from_secs(60));
    let held: Vec<usize> = job["allocation"][0]["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|g| g.as_u64())
        .map(|g| g as usize)
        .collect();
    assert_eq!(held.len(), 2, "{job:#}");
    assert_eq!(gpus[held[0]]["package"], gpus[held[1]]["package"], "{held:?}");
    // Refused: no socket count; more GPUs a socket than a socket has.
    let path = c.root().join("two.sh").display().to_string();
    let out = c.berth(&["submit", "--gpus-per-socket", "1", &path]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success() && err.contains("--sockets-per-node"), "{err}");
    let out = c.berth(&["submit", "--gpus-per-socket", "3", "--sockets-per-node", "1", &path]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success() && err.contains("per socket"), "{err}");
}

/// A job that appends a line to `count` every 50 ms, `n` times, then probes the stand-ins
/// (`probe_script`'s report: its GPUs in BERTH_GPUS, which open and which are denied).
fn counting_probe(dev: &Path, count: &Path, n: u32) -> String {
    let probe = probe_script(dev);
    let body = probe.strip_prefix("#!/bin/sh\n").unwrap_or(&probe);
    format!(
        "#!/bin/sh\ni=0\nwhile [ $i -lt {n} ]; do i=$((i+1)); echo $i >> {f}; sleep 0.05; done\n{body}",
        f = count.display()
    )
}

fn lines(file: &Path) -> usize {
    std::fs::read_to_string(file).map(|t| t.lines().count()).unwrap_or(0)
}

fn wait_for(what: &str, c: &Cluster, mut ok: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !ok() {
        assert!(t0.elapsed() < Duration::from_secs(30), "timed out waiting for {what}\n{}", c.logs());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The GPU indexes a job holds on its first node (its allocation).
fn held_gpus(job: &serde_json::Value) -> Vec<u64> {
    job["allocation"][0]["gpus"].as_array().into_iter().flatten().filter_map(|g| g.as_u64()).collect()
}

/// The ended job `id` ran with GPU `mine` only: its BERTH_GPUS, its own stand-in opened, the
/// other denied by its devices cgroup (probed after its counting, so after any resume).
fn assert_ran_on_gpu(c: &Cluster, id: u64, mine: u64) {
    let out = std::fs::read_to_string(c.root().join(format!("berth-{id}.out"))).unwrap_or_default();
    let other = 1 - mine;
    assert!(out.contains(&format!("gpus={mine} ")), "job {id} ran with GPU {mine}:\n{out}");
    assert!(out.contains(&format!("nvidia{mine} ok")), "job {id} opens its GPU after resuming:\n{out}");
    assert!(out.contains(&format!("nvidia{other} denied:")), "job {id} is still denied the other GPU:\n{out}");
}

/// Suspension by the admin (issue 20): a suspended job lends its core but keeps its GPU. While
/// it is suspended, a 1-GPU job gets the node's other GPU (never its), and a job wanting both
/// GPUs waits, its reason naming the GPUs, though cores are free; on resume the job holds the
/// same GPU (berth show), still opens it and only it, and completes; the 2-GPU job then runs.
#[test]
fn a_suspended_job_keeps_its_gpu_and_gets_it_back_on_resume() {
    let (c, dev) = gpu_cluster(TOPO);
    let count = c.root().join("count");
    let a = c.submit("a.sh", &counting_probe(&dev, &count, 120), &["--cores", "1", "--gpus", "1"]);
    c.wait_state(a, &["running"], Duration::from_secs(30));
    wait_for("job a to count", &c, || lines(&count) > 2);
    let held = held_gpus(&c.show(a));
    assert_eq!(held.len(), 1, "{:#}", c.show(a));
    let (mine, other) = (held[0], 1 - held[0]);

    let r = c.json(&["suspend", &a.to_string()]);
    assert_eq!(r[0]["ok"], true, "{r:#}");
    let s = c.show(a);
    assert_eq!(s["state"], "suspended", "{s:#}");
    assert_eq!(held_gpus(&s), held, "a suspended job keeps its GPU in its allocation: {s:#}");
    // Its core is lent, its GPU is not.
    let node = &c.json(&["nodes"])[0];
    assert_eq!((node["cpus_allocated"].as_u64(), node["gpus_allocated"].as_u64()), (Some(0), Some(1)), "{node:#}");

    // A 1-GPU job gets the other GPU and runs.
    let one = c.submit("one.sh", &probe_script(&dev), &["--cores", "1", "--gpus", "1"]);
    let j = c.wait_finished(one, Duration::from_secs(60));
    assert_eq!(j["state"], "completed", "{j:#}\n{}", c.logs());
    assert_eq!(held_gpus(&j), [other], "the free GPU, not the suspended job's: {j:#}");
    assert_ran_on_gpu(&c, one, other);

    // A job wanting both GPUs waits for the suspended job's, with cores free.
    let both = c.submit("both.sh", "#!/bin/sh\necho \"gpus=$BERTH_GPUS\"\n", &["--cores", "1", "--gpus", "2"]);
    wait_for("a reason for the 2-GPU job", &c, || !c.show(both)["reason"].as_str().unwrap_or("").is_empty());
    std::thread::sleep(Duration::from_secs(2));
    let w = c.show(both);
    assert_eq!(w["state"], "queued", "a suspended job's GPU was given away: {w:#}\n{}", c.logs());
    let reason = w["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("GPUs") && reason.contains("suspended jobs free them"), "{reason}");
    let frozen = lines(&count);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(lines(&count), frozen, "the suspended job went on counting");
    assert_eq!(c.show(a)["state"], "suspended");

    let r = c.json(&["resume", &a.to_string()]);
    assert_eq!(r[0]["ok"], true, "{r:#}");
    let s = c.show(a);
    assert_eq!(s["state"], "running", "{s:#}");
    assert_eq!(held_gpus(&s), held, "the resumed job holds the same GPU: {s:#}");
    let text = String::from_utf8_lossy(&c.berth(&["show", &a.to_string()]).stdout).into_owned();
    assert!(text.contains(&format!("gpu {mine} (emulated)")), "berth show names its GPU {mine}:\n{text}");

    let d = c.wait_finished(a, Duration::from_secs(60));
    assert_eq!(d["state"], "completed", "{d:#}\n{}", c.logs());
    assert_eq!(lines(&count), 120, "it counted to its end after resuming");
    assert!(d["suspended_seconds"].as_f64().unwrap_or(0.0) >= 2.0, "{d:#}");
    assert_ran_on_gpu(&c, a, mine);
    let b = c.wait_finished(both, Duration::from_secs(60));
    assert_eq!(b["state"], "completed", "{b:#}\n{}", c.logs());
    assert_eq!(held_gpus(&b), [0, 1], "{b:#}");
    assert_no_job_cgroups(&c);
}

/// Jobs of more than 2 CPUs are large and may suspend smaller ones at once.
const PREEMPT: &str = "[preempt]\nenabled = true\nlarge_cpus = 2\nmin_score = 1.0\n\
                       min_run_secs_before_suspend = 0.0\nmax_suspended_secs = 600.0\n";

/// Preemption by suspension with GPUs (issue 20): a large job that needs the GPU a small job
/// holds cannot suspend it for that GPU (a suspended job's GPUs are never lent) and waits, the
/// small job running on; a large job that needs the node's cores and one GPU suspends the
/// small job and runs on the other GPU; the small job resumes after it on its own GPU and
/// completes.
#[test]
fn preemption_by_suspension_lends_cores_never_gpus() {
    let (c, dev) = gpu_cluster_configured(TOPO, Some(PREEMPT));
    let count = c.root().join("count");
    let a = c.submit("a.sh", &counting_probe(&dev, &count, 200), &["--cores", "1", "--gpus", "1", "--walltime", "120"]);
    c.wait_state(a, &["running"], Duration::from_secs(30));
    wait_for("job a to count", &c, || lines(&count) > 2);
    let held = held_gpus(&c.show(a));
    assert_eq!(held.len(), 1, "{:#}", c.show(a));
    let (mine, other) = (held[0], 1 - held[0]);

    // All the cores and both GPUs: suspending the small job frees no GPU, so it is not done.
    let script = "#!/bin/sh\necho \"gpus=$BERTH_GPUS\"\nsleep 3\n";
    let greedy = c.submit("greedy.sh", script, &["--cores", "4", "--gpus", "2", "--walltime", "60"]);
    wait_for("a reason for the 2-GPU large job", &c, || !c.show(greedy)["reason"].as_str().unwrap_or("").is_empty());
    std::thread::sleep(Duration::from_secs(2));
    let g = c.show(greedy);
    assert_eq!(g["state"], "queued", "{g:#}\n{}", c.logs());
    let s = c.show(a);
    assert_eq!(s["state"], "running", "suspended for GPUs it would not have lent: {s:#}");
    let r = c.json(&["cancel", &greedy.to_string()]);
    assert_eq!(r[0]["ok"], true, "{r:#}");
    c.wait_finished(greedy, Duration::from_secs(30));

    // All the cores and one GPU: the small job is suspended, the large one takes the other GPU.
    let large = c.submit("large.sh", script, &["--cores", "4", "--gpus", "1", "--walltime", "60"]);
    let l = c.wait_state(large, &["running"], Duration::from_secs(30));
    assert_eq!(held_gpus(&l), [other], "the preemptor got the suspended job's GPU: {l:#}");
    let s = c.show(a);
    assert_eq!(s["state"], "suspended", "{s:#}");
    assert!(s["reason"].as_str().unwrap_or("").contains(&format!("preempted by job {large}")), "{s:#}");
    assert_eq!(held_gpus(&s), held, "{s:#}");
    let l = c.wait_finished(large, Duration::from_secs(60));
    assert_eq!(l["state"], "completed", "{l:#}\n{}", c.logs());
    let out = std::fs::read_to_string(c.root().join(format!("berth-{large}.out"))).unwrap_or_default();
    assert_eq!(out.trim(), format!("gpus={other}"), "{out}");

    let d = c.wait_finished(a, Duration::from_secs(60));
    assert_eq!(d["state"], "completed", "{d:#}\n{}", c.logs());
    assert_eq!(held_gpus(&d), [mine], "{d:#}");
    assert_eq!(lines(&count), 200, "it counted to its end after resuming");
    assert!(d["suspended_seconds"].as_f64().unwrap_or(0.0) >= 1.5, "it was suspended while the large job ran: {d:#}");
    assert_ran_on_gpu(&c, a, mine);
    assert_no_job_cgroups(&c);
}
