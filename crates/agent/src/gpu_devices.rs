//! GPU device files and their containment (issue 20, docs/gpus.md "Containment").
//!
//! Each GPU of the node names its device files ([`Gpu::device_files`]): on the real machine
//! under `/dev` (`/dev/nvidiaN`, `/dev/dri/renderDN`), on an emulated node stand-ins under the
//! agent's `--gpu-device-dir` (tests make them with `mknod DIR/nvidia0 c 195 0`). A job's
//! cgroup v1 `devices` controller (on cgroup v2: a device eBPF program attached to its cgroup,
//! crate::cgroup::v2::devices) denies the character devices of the node's GPUs the job does
//! not hold: everything else stays allowed (see [`deny_rules`] for why a deny list).

use berth_core::gpu::{known_device_number, Gpu};
use berth_core::topology::Topology;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

/// Give each GPU of `topology` its device files: under `dir` when the admin named a device
/// directory (`--gpu-device-dir`, emulated nodes' stand-ins), else under `/dev` on the real
/// machine (`real`), else none (an XML topology's GPUs are another machine's devices).
/// NVIDIA GPUs take their minor number from the driver's
/// `/proc/driver/nvidia/gpus/BUS/information` when it is there.
pub fn assign_device_files(topology: &mut Topology, real: bool, dir: Option<&Path>) {
    let base = match (dir, real) {
        (Some(d), _) => d.to_path_buf(),
        (None, true) => Path::new("/dev").to_path_buf(),
        (None, false) => return,
    };
    for g in &mut topology.gpus {
        let minor = real.then(|| g.pci_bus_id.as_deref().and_then(nvidia_minor)).flatten();
        g.device_files = g
            .device_names()
            .into_iter()
            .map(|name| match (minor, name.starts_with("nvidia")) {
                (Some(m), true) => format!("nvidia{m}"),
                _ => name,
            })
            .map(|name| base.join(name).display().to_string())
            .collect();
    }
}

/// The "Device Minor" of the NVIDIA GPU at PCI address `bus` (`0000:84:00.0`), from its
/// driver's proc file.
fn nvidia_minor(bus: &str) -> Option<u32> {
    let text = std::fs::read_to_string(format!("/proc/driver/nvidia/gpus/{bus}/information")).ok()?;
    parse_minor(&text)
}

fn parse_minor(text: &str) -> Option<u32> {
    text.lines().find_map(|l| l.trim().strip_prefix("Device Minor:")?.trim().parse().ok())
}

/// The character devices (major, minor) a job holding GPUs `held` must not use: those of
/// the node's other GPUs, less any its own GPUs share. A device file that is not there counts
/// by the driver's fixed numbers under `/dev` (NVIDIA's are made on first use, so a job
/// could have one made later), else it is skipped (an emulated stand-in nobody made: there is
/// nothing to open).
///
/// A deny list, not an allow list (deny all, then allow `/dev/null`, ...): a GPU job needs
/// more than the usual devices: `/dev/nvidiactl`, `/dev/nvidia-uvm`, `/dev/nvidia-caps/*`,
/// AMD's shared `/dev/kfd`, InfiniBand's `/dev/infiniband/uverbs*` for MPI, `/dev/fuse`,
/// `/dev/shm`-less containers' devices... An allow list would have to know each site's; the
/// GPUs are what jobs must not share. Slurm made the same choice (since 21.08 it denies only
/// the GRES devices a job was not given and dropped `cgroup_allowed_devices_file`).
pub fn deny_rules(gpus: &[Gpu], held: &[u32]) -> Vec<(u32, u32)> {
    let numbers = |g: &Gpu| -> Vec<(u32, u32)> { g.device_files.iter().filter_map(|f| device_number(f)).collect() };
    let mine: Vec<(u32, u32)> = gpus.iter().filter(|g| held.contains(&g.index)).flat_map(numbers).collect();
    let mut deny: Vec<(u32, u32)> =
        gpus.iter().filter(|g| !held.contains(&g.index)).flat_map(numbers).filter(|d| !mine.contains(d)).collect();
    deny.sort_unstable();
    deny.dedup();
    deny
}

/// The device number of character device `path`, else the driver's fixed number of a real
/// `/dev` GPU path that is missing; None for anything else (a regular file, a stand-in not
/// made).
fn device_number(path: &str) -> Option<(u32, u32)> {
    match std::fs::metadata(path) {
        Ok(m) if m.file_type().is_char_device() => {
            let rdev = m.rdev();
            Some((libc::major(rdev), libc::minor(rdev)))
        }
        Ok(_) => {
            tracing::warn!(path, "GPU device file is not a character device: not contained");
            None
        }
        Err(_) => known_device_number(path),
    }
}

/// Say once, loudly, when this node's GPUs cannot be contained: no device files, cgroup v2
/// where the device eBPF program cannot be loaded (`v2_error`: the bpf() error, e.g. no
/// CAP_BPF), or cgroup v1 without the `devices` controller. Returns the warning given, if any.
pub fn containment_warning(topology: &Topology, contained: bool, v2: bool, v2_error: Option<&str>) -> Option<String> {
    let with_files = topology.gpus.iter().filter(|g| !g.device_files.is_empty()).count();
    if topology.gpus.is_empty() || contained {
        return None;
    }
    let why = if with_files == 0 {
        "no GPU has a device file (give --gpu-device-dir for an emulated node's stand-ins)".to_string()
    } else if v2 {
        format!(
            "this host uses cgroup v2, where device access is filtered by an eBPF program \
             (BPF_PROG_TYPE_CGROUP_DEVICE), and the agent cannot load one: {}",
            v2_error.unwrap_or("unknown error")
        )
    } else {
        "the cgroup v1 devices controller is not mounted (mount -t cgroup -o devices cgroup /sys/fs/cgroup/devices)"
            .to_string()
    };
    let msg = format!(
        "GPU CONTAINMENT OFF: every job on this node can open all {} GPUs' devices: {why}; jobs still get their own CUDA_VISIBLE_DEVICES etc.",
        topology.gpus.len()
    );
    tracing::warn!("{msg}");
    Some(msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(gpus_per_numa: u32) -> Topology {
        let mut t = Topology::uniform(1, 2, 2, 1, 1 << 30);
        t.add_emulated_gpus(gpus_per_numa).unwrap();
        t
    }

    #[test]
    fn device_files_under_the_named_directory_or_dev() {
        let mut t = node(1);
        assign_device_files(&mut t, false, None);
        assert!(t.gpus.iter().all(|g| g.device_files.is_empty()), "an XML node's GPUs are not this host's");
        assign_device_files(&mut t, false, Some(Path::new("/run/stand-ins")));
        let files: Vec<&[String]> = t.gpus.iter().map(|g| g.device_files.as_slice()).collect();
        assert_eq!(files, [["/run/stand-ins/nvidia0"], ["/run/stand-ins/nvidia1"]]);
        t.validate().unwrap();
        t.gpus[1].os_devices.push("renderD129".into());
        assign_device_files(&mut t, true, None);
        assert_eq!(t.gpus[1].device_files, ["/dev/nvidia1", "/dev/dri/renderD129"]);
        t.gpus[0].device_files = vec!["relative/nvidia0".into()];
        assert!(t.validate().is_err(), "device files are absolute paths");
    }

    #[test]
    fn nvidia_minor_from_the_driver() {
        let text = "Model: \t\t NVIDIA A100\nIRQ:   \t\t 34\nDevice Minor: \t 3\nBus Location: \t 0000:84:00.0\n";
        assert_eq!(parse_minor(text), Some(3));
        assert_eq!(parse_minor("Model: x\n"), None);
    }

    #[test]
    fn others_gpus_are_denied_by_number_and_missing_stand_ins_skipped() {
        let mut t = node(1);
        t.gpus[0].device_files = vec!["/dev/null".into(), "/dev/nvidia7".into()];
        t.gpus[1].device_files = vec!["/dev/zero".into(), "/nonexistent/nvidia1".into()];
        // /dev/null is 1:3, /dev/zero 1:5 on Linux; a missing /dev/nvidia7 is 195:7.
        assert_eq!(deny_rules(&t.gpus, &[0]), [(1, 5)]);
        assert_eq!(deny_rules(&t.gpus, &[1]), [(1, 3), (195, 7)]);
        assert_eq!(deny_rules(&t.gpus, &[]), [(1, 3), (1, 5), (195, 7)], "a job without GPUs gets none");
        assert!(deny_rules(&t.gpus, &[0, 1]).is_empty());
        t.gpus[1].device_files.push("/dev/null".into());
        assert_eq!(deny_rules(&t.gpus, &[0]), [(1, 5)], "a device the job's own GPU has stays usable");
    }

    #[test]
    fn the_warning_says_why() {
        let mut t = node(1);
        assert!(containment_warning(&t, false, false, None).unwrap().contains("--gpu-device-dir"));
        assert!(containment_warning(&t, false, true, None).unwrap().contains("--gpu-device-dir"));
        assign_device_files(&mut t, false, Some(Path::new("/d")));
        let v2 = containment_warning(&t, false, true, Some("bpf(BPF_PROG_LOAD) ... failed: Operation not permitted"));
        let v2 = v2.unwrap();
        assert!(
            v2.starts_with("GPU CONTAINMENT OFF") && v2.contains("eBPF") && v2.contains("Operation not permitted"),
            "{v2}"
        );
        assert!(containment_warning(&t, false, false, None).unwrap().contains("devices controller"));
        assert_eq!(containment_warning(&t, true, false, None), None);
        assert_eq!(containment_warning(&t, true, true, None), None, "a v2 node whose device program loads");
        assert_eq!(containment_warning(&node(0), false, true, None), None, "no GPUs, nothing to say");
    }
}
