//! GPU discovery from hwloc's I/O objects (issue 20), for [`crate::hwtopo`].
//!
//! The rules (docs/gpus.md):
//! - a GPU is a PCI device with at least one compute OS device: a co-processor (CUDA `cudaN`,
//!   OpenCL `openclXdY` unless its device type is CPU, Level Zero `zeN`) or a GPU device of a
//!   compute backend (NVML `nvmlN`, RSMI `rsmiN`, Level Zero). Display-only devices (the Linux
//!   DRM `card0`/`renderD128`, GL displays `:0.0`) make no GPU by themselves but are listed
//!   with the GPU of their PCI device;
//! - all OS devices under one PCI device are one GPU (`cuda0` and `nvml0` of the same card);
//!   a compute OS device hwloc could not attach to a PCI device is a GPU of its own;
//! - its locality is the nearest non-I/O ancestor's: its cpuset (restricted to the allowed
//!   PUs) and its nodeset, which names the GPU's NUMA node when it holds exactly one ordinary
//!   one; the package is that ancestor's package;
//! - GPUs are numbered in PCI bus order;
//! - links come from hwloc's `NVLinkBandwidth` (and AMD's `XGMIBandwidth`) distance matrices:
//!   two GPUs with bandwidth both ways are linked (the smaller of the two values); GPUs linked
//!   to the same NVSwitch are linked to each other through it.

use berth_core::gpu::{link_groups, Gpu, GpuLink, GpuVendor, MAX_GPUS, MAX_GPU_TEXT, MAX_OS_DEVICES};
use berth_core::topology::NumaNode;
use berth_core::CpuSet;
use hwlocality::object::attributes::ObjectAttributes;
use hwlocality::object::types::{OSDeviceType, ObjectType};
use hwlocality::object::TopologyObject;
use std::collections::{BTreeMap, HashMap};

type HwTopology = hwlocality::Topology;

/// The distance matrices that describe GPU-to-GPU links (hwloc's NVML and RSMI backends).
const LINK_MATRICES: [&str; 2] = ["NVLinkBandwidth", "XGMIBandwidth"];

fn text(obj: &TopologyObject, key: &str) -> Option<String> {
    let value = obj.info(key)?.to_str().ok()?.trim();
    (!value.is_empty()).then(|| cut(value))
}

/// `s` cut to at most [`MAX_GPU_TEXT`] bytes, on a character boundary (what validation allows).
fn cut(s: &str) -> String {
    let mut end = s.len().min(MAX_GPU_TEXT);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

fn subtype(obj: &TopologyObject) -> String {
    obj.subtype().and_then(|s| s.to_str().ok()).unwrap_or("").to_string()
}

/// Whether this OS device is a compute device (see the module's rules).
fn is_compute(obj: &TopologyObject) -> bool {
    let Some(ObjectAttributes::OSDevice(attr)) = obj.attributes() else {
        return false;
    };
    let sub = subtype(obj);
    match attr.device_type() {
        OSDeviceType::CoProcessor => {
            !(sub.eq_ignore_ascii_case("OpenCL")
                && text(obj, "OpenCLDeviceType").is_some_and(|t| t.eq_ignore_ascii_case("CPU")))
        }
        OSDeviceType::GPU => ["NVML", "RSMI", "LevelZero"].iter().any(|s| sub.eq_ignore_ascii_case(s)),
        _ => false,
    }
}

fn is_gpu_like(obj: &TopologyObject) -> bool {
    matches!(
        obj.attributes(),
        Some(ObjectAttributes::OSDevice(attr))
            if matches!(attr.device_type(), OSDeviceType::GPU | OSDeviceType::CoProcessor)
    )
}

/// The PCI device an OS device hangs from, if any.
fn pci_parent(obj: &TopologyObject) -> Option<&TopologyObject> {
    obj.ancestors().take_while(|a| a.object_type().is_io()).find(|a| a.object_type() == ObjectType::PCIDevice)
}

fn vendor_of(pci: Option<&TopologyObject>, osdevs: &[&TopologyObject]) -> GpuVendor {
    if let Some(Some(ObjectAttributes::PCIDevice(attr))) = pci.map(TopologyObject::attributes) {
        let v = GpuVendor::from_pci_vendor(attr.vendor_id());
        if v != GpuVendor::Other {
            return v;
        }
    }
    for d in osdevs {
        let vendor = text(d, "GPUVendor").unwrap_or_default().to_ascii_lowercase();
        let sub = subtype(d);
        if vendor.contains("nvidia") || sub == "CUDA" || sub == "NVML" {
            return GpuVendor::Nvidia;
        }
        if vendor.contains("amd") || vendor.contains("advanced micro") || sub == "RSMI" {
            return GpuVendor::Amd;
        }
        if vendor.contains("intel") || sub == "LevelZero" {
            return GpuVendor::Intel;
        }
    }
    GpuVendor::Other
}

/// Device memory from the backends that report it (both in KiB).
fn memory_of(osdevs: &[&TopologyObject]) -> Option<u64> {
    osdevs.iter().find_map(|d| {
        ["CUDAGlobalMemorySize", "OpenCLGlobalMemorySize"]
            .iter()
            .find_map(|k| text(d, k)?.parse::<u64>().ok())
            .and_then(|kib| kib.checked_mul(1024))
            .filter(|&b| b > 0)
    })
}

/// The GPUs of a loaded hwloc topology, and their links. `numa_nodes` and `allowed` are
/// berth's NUMA nodes and usable PUs; `package_index` maps a Package object's persistent
/// index to berth's package index.
pub(crate) fn discover(
    hw: &HwTopology,
    numa_nodes: &[NumaNode],
    allowed: &CpuSet,
    package_index: &HashMap<u64, usize>,
) -> (Vec<Gpu>, Vec<GpuLink>) {
    // OS devices of GPU kind grouped by their PCI device (or themselves), in hwloc's order.
    let mut groups: Vec<(Option<&TopologyObject>, Vec<&TopologyObject>)> = Vec::new();
    let mut group_of: HashMap<u64, usize> = HashMap::new();
    for dev in hw.objects_with_type(ObjectType::OSDevice).filter(|d| is_gpu_like(d)) {
        let pci = pci_parent(dev);
        let key = pci.unwrap_or(dev).global_persistent_index();
        let g = *group_of.entry(key).or_insert_with(|| {
            groups.push((pci, vec![]));
            groups.len() - 1
        });
        groups[g].1.push(dev);
    }

    let mut found: Vec<(Gpu, Vec<u64>)> = Vec::new();
    // An OS device name on two GPUs would fail validation and keep the node out: first wins.
    let mut names_seen: std::collections::HashSet<String> = Default::default();
    for (pci, devs) in groups {
        if !devs.iter().any(|d| is_compute(d)) {
            continue;
        }
        let anchor = pci.unwrap_or(devs[0]);
        let ancestor = anchor.first_non_io_ancestor();
        let cpus: CpuSet = ancestor
            .and_then(|a| a.cpuset())
            .map(|set| set.iter_set().filter_map(|i| u32::try_from(usize::from(i)).ok()).collect::<CpuSet>())
            .unwrap_or_default()
            .iter()
            .filter(|&pu| allowed.contains(pu))
            .collect();
        let local_numa: Vec<u32> = ancestor
            .and_then(|a| a.nodeset())
            .map(|set| set.iter_set().filter_map(|i| u32::try_from(usize::from(i)).ok()).collect())
            .unwrap_or_default();
        let ordinary: Vec<u32> =
            local_numa.into_iter().filter(|&os| numa_nodes.iter().any(|n| n.os_index == os && !n.special)).collect();
        let package = ancestor.and_then(|a| {
            let p = if a.object_type() == ObjectType::Package {
                Some(a)
            } else {
                a.first_ancestor_with_type(ObjectType::Package)
            };
            package_index.get(&p?.global_persistent_index()).copied()
        });
        let pci_bus_id = match pci.and_then(TopologyObject::attributes) {
            Some(ObjectAttributes::PCIDevice(a)) => {
                Some(format!("{:04x}:{:02x}:{:02x}.{:x}", a.domain(), a.bus_id(), a.bus_device(), a.function()))
            }
            _ => None,
        };
        let mut os_devices: Vec<String> = devs
            .iter()
            .filter_map(|d| d.name()?.to_str().ok().map(cut))
            .filter(|n| !n.is_empty() && !names_seen.contains(n))
            .collect();
        os_devices.dedup();
        names_seen.extend(os_devices.iter().cloned());
        os_devices.truncate(MAX_OS_DEVICES);
        let model = devs.iter().find_map(|d| text(d, "GPUModel")).or_else(|| pci.and_then(|p| text(p, "PCIDevice")));
        let uuid = devs.iter().find_map(|d| ["NVIDIAUUID", "AMDUUID", "LevelZeroUUID"].iter().find_map(|k| text(d, k)));
        let gpu = Gpu {
            index: 0,
            vendor: vendor_of(pci, &devs),
            model,
            pci_bus_id,
            numa: (ordinary.len() == 1).then(|| ordinary[0]),
            package,
            cpus,
            os_devices,
            uuid,
            memory_bytes: memory_of(&devs),
            link_group: None,
            emulated: false,
            device_files: vec![],
        };
        found.push((gpu, devs.iter().map(|d| d.global_persistent_index()).collect()));
    }
    // PCI bus order; GPUs without a PCI address after, by their first OS device.
    found.sort_by(|(a, _), (b, _)| {
        (a.pci_bus_id.is_none(), &a.pci_bus_id, &a.os_devices).cmp(&(
            b.pci_bus_id.is_none(),
            &b.pci_bus_id,
            &b.os_devices,
        ))
    });
    if found.len() > MAX_GPUS {
        tracing::warn!("hwloc reports {} GPUs; berth keeps the first {MAX_GPUS}", found.len());
        found.truncate(MAX_GPUS);
    }
    let mut gpu_of: HashMap<u64, u32> = HashMap::new();
    let mut gpus = Vec::with_capacity(found.len());
    for (i, (mut gpu, ids)) in found.into_iter().enumerate() {
        gpu.index = i as u32;
        for id in ids {
            gpu_of.insert(id, i as u32);
        }
        gpus.push(gpu);
    }

    let links = links(hw, &gpu_of);
    let groups = link_groups(gpus.len(), &links);
    for (gpu, group) in gpus.iter_mut().zip(groups) {
        gpu.link_group = group;
    }
    (gpus, links)
}

/// GPU-to-GPU links from hwloc's link matrices; `gpu_of` maps OS devices to GPU indexes.
fn links(hw: &HwTopology, gpu_of: &HashMap<u64, u32>) -> Vec<GpuLink> {
    if gpu_of.is_empty() {
        return vec![];
    }
    // hwlocality asserts on matrices it does not expect; links are an optimisation.
    let matrices = crate::hwguard::guarded(|| {
        let Ok(all) = hw.distances(None) else {
            return vec![];
        };
        all.iter()
            .filter(|d| d.name().and_then(|n| n.to_str().ok()).is_some_and(|n| LINK_MATRICES.contains(&n)))
            .map(|d| {
                let ids: Vec<Option<u64>> = d.objects().map(|o| o.map(|o| o.global_persistent_index())).collect();
                let switches: Vec<bool> = d.objects().map(|o| o.is_some_and(|o| subtype(o) == "NVSwitch")).collect();
                (ids, switches, d.distances().to_vec())
            })
            .collect::<Vec<_>>()
    });
    let matrices = match matrices {
        Ok(m) => m,
        Err(detail) => {
            tracing::warn!(%detail, "cannot read hwloc's GPU link matrices; GPUs get no link groups");
            return vec![];
        }
    };
    let mut best: BTreeMap<(u32, u32), u64> = BTreeMap::new();
    let mut add = |a: u32, b: u32, bw: u64| {
        if a != b && bw > 0 {
            let e = best.entry((a.min(b), a.max(b))).or_default();
            *e = (*e).max(bw);
        }
    };
    for (ids, switches, values) in matrices {
        let n = ids.len();
        if values.len() != n * n {
            continue;
        }
        let both = |i: usize, j: usize| values[i * n + j].min(values[j * n + i]);
        let gpu = |i: usize| ids[i].and_then(|id| gpu_of.get(&id).copied());
        for (i, &switch) in switches.iter().enumerate().take(n) {
            for j in i + 1..n {
                if let (Some(a), Some(b)) = (gpu(i), gpu(j)) {
                    add(a, b, both(i, j));
                }
            }
            // An NVSwitch at i: the GPUs linked to it are linked to each other through it.
            if switch {
                let through: Vec<(u32, u64)> = (0..n)
                    .filter(|&j| j != i)
                    .filter_map(|j| Some((gpu(j)?, both(i, j))))
                    .filter(|&(_, bw)| bw > 0)
                    .collect();
                for (x, &(a, bwa)) in through.iter().enumerate() {
                    for &(b, bwb) in &through[x + 1..] {
                        add(a, b, bwa.min(bwb));
                    }
                }
            }
        }
    }
    best.into_iter().map(|((a, b), bandwidth_mbs)| GpuLink { a, b, bandwidth_mbs }).collect()
}

#[cfg(test)]
mod tests {
    use crate::hwtopo::{load, TopologyError, TopologySource};
    use berth_core::gpu::{GpuLink, GpuVendor};
    use berth_core::topology::Topology;
    use std::path::{Path, PathBuf};

    const GIB: u64 = 1 << 30;

    /// The real-machine exports (data/hwloc, from ../shared/data/hwloc: hwloc's test suite,
    /// BSD licence) and the hand-made GPU nodes (crates/agent/tests/data/hwloc, README there).
    fn shared(file: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/hwloc").join(file)
    }
    fn hand_made(file: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/hwloc").join(file)
    }
    fn xml(path: PathBuf) -> Topology {
        load(&TopologySource::Xml(path.clone())).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// The Supermicro export: an NVIDIA K40m (`cuda0`, with the DRM `card0` of the same PCI
    /// device) at 84:00.0 and an AMD Radeon (`opencl0d1`) at 84:00.1, both behind a root port of
    /// package 1 / NUMA node 1. Two other NVIDIA PCI devices (03:00.0, 83:00.0) have no OS
    /// device, so no driver: hwloc cannot say they are usable GPUs, and berth does not count them.
    #[test]
    fn shared_export_gpus_by_pci_device() {
        let t = xml(shared("32em64t-2n8c2t-pci-normalio.xml"));
        let cuda: Vec<_> = t.gpus.iter().filter(|g| g.os_device_number("cuda").is_some()).collect();
        assert_eq!(cuda.len(), 1, "{:#?}", t.gpus);
        let k40 = cuda[0];
        assert_eq!(k40.vendor, GpuVendor::Nvidia);
        assert_eq!(k40.model.as_deref(), Some("Tesla K40m"));
        assert_eq!(k40.pci_bus_id.as_deref(), Some("0000:84:00.0"));
        assert_eq!(k40.os_devices, ["cuda0", "card0"]);
        assert_eq!((k40.numa, k40.package), (Some(1), Some(1)));
        assert_eq!(k40.cpus, t.numa_nodes[t.numa_by_os(1).unwrap()].cpus);
        assert_eq!(k40.memory_bytes, Some(11796032 * 1024));
        assert_eq!(k40.os_device_number("cuda"), Some(0));
        // The other function of that slot is a GPU of its own (another vendor, OpenCL only).
        assert_eq!(t.gpus.len(), 2);
        let amd = &t.gpus[1];
        assert_eq!((amd.index, amd.vendor, amd.pci_bus_id.as_deref()), (1, GpuVendor::Amd, Some("0000:84:00.1")));
        assert_eq!((amd.os_devices.as_slice(), amd.numa), (&["opencl0d1".to_string()][..], Some(1)));
        assert!(t.gpu_links.is_empty() && t.gpus.iter().all(|g| g.link_group.is_none()));

        // Without its CUDA device the K40m is display-only (card0) and no GPU.
        let text = std::fs::read_to_string(shared("32em64t-2n8c2t-pci-normalio.xml")).unwrap();
        let cuda_dev = r#"<object type="OSDev" gp_index="136" name="cuda0" subtype="CUDA" osdev_type="5">"#;
        let edited = text.replace(cuda_dev, r#"<object type="OSDev" gp_index="136" name="eth9" osdev_type="2">"#);
        assert_ne!(edited, text);
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("no-cuda.xml"), edited).unwrap();
        let t = xml(dir.path().join("no-cuda.xml"));
        assert_eq!(t.gpus.iter().map(|g| g.os_devices.clone()).collect::<Vec<_>>(), [["opencl0d1"]]);

        // Exports without I/O objects have no GPUs, and keep their serialization.
        let knl = xml(shared("knl.xml"));
        assert!(knl.gpus.is_empty() && !serde_json::to_string(&knl).unwrap().contains("gpu"));
    }

    #[test]
    fn four_gpus_in_nvlink_pairs() {
        let t = xml(hand_made("gpu4-2p-nvlink-pairs.xml"));
        t.validate().unwrap();
        assert_eq!(t.gpus.len(), 4);
        let buses = ["0000:17:00.0", "0000:65:00.0", "0000:b3:00.0", "0000:ca:00.0"];
        for (i, g) in t.gpus.iter().enumerate() {
            assert_eq!(g.index as usize, i);
            assert_eq!(g.vendor, GpuVendor::Nvidia);
            assert_eq!(g.model.as_deref(), Some("NVIDIA A100 80GB PCIe"));
            assert_eq!(g.pci_bus_id.as_deref(), Some(buses[i]));
            // cuda and nvml of one card are one GPU, with its display-only DRM devices.
            let names =
                [format!("cuda{i}"), format!("nvml{i}"), format!("card{}", i + 1), format!("renderD{}", 128 + i)];
            assert_eq!(g.os_devices, names);
            assert_eq!(g.numa, Some(i as u32 / 2));
            assert_eq!(g.package, Some(i / 2));
            assert_eq!(g.cpus.to_list(), if i < 2 { "0-15" } else { "16-31" });
            assert_eq!(g.memory_bytes, Some(80 * GIB));
            assert_eq!(g.uuid.as_deref(), Some(format!("GPU-0000000{i}-beef-4e57-8a1b-00000000000{i}").as_str()));
            assert!(!g.emulated);
        }
        let link = |a, b| GpuLink { a, b, bandwidth_mbs: 300_000 };
        assert_eq!(t.gpu_links, [link(0, 1), link(2, 3)]);
        assert_eq!(t.gpus.iter().map(|g| g.link_group).collect::<Vec<_>>(), [Some(0), Some(0), Some(2), Some(2)]);
    }

    #[test]
    fn eight_gpus_in_nvlink_quads() {
        let t = xml(hand_made("gpu8-2p4n-nvlink-quads.xml"));
        t.validate().unwrap();
        assert_eq!((t.packages.len(), t.numa_nodes.len(), t.gpus.len()), (2, 4, 8));
        for (i, g) in t.gpus.iter().enumerate() {
            assert_eq!((g.numa, g.package), (Some(i as u32 / 2), Some(i / 4)), "GPU {i}");
            assert_eq!(g.cpus, t.numa_nodes[i / 2].cpus, "GPU {i}");
            assert_eq!(g.link_group, Some(if i < 4 { 0 } else { 4 }));
            assert_eq!(g.type_name(), "a100-sxm4-80gb");
        }
        // Every pair inside a package, none across.
        assert_eq!(t.gpu_links.len(), 12);
        assert!(t.gpu_links.iter().all(|l| l.a / 4 == l.b / 4 && l.bandwidth_mbs == 100_000), "{:?}", t.gpu_links);
        assert_eq!(t.numa_gpus(3).map(|g| g.index).collect::<Vec<_>>(), [6, 7]);
    }

    /// A GPU hwloc attaches to the whole machine (its PCI locality unknown) has no NUMA node
    /// or package; its local PUs are all of them.
    #[test]
    fn gpu_without_locality() {
        let text = std::fs::read_to_string(hand_made("gpu8-2p4n-nvlink-quads.xml")).unwrap();
        let machine_end = "  </object>\n  <support";
        assert_eq!(text.matches(machine_end).count(), 1);
        let stray = r#"    <object type="Bridge" gp_index="2000" bridge_type="0-1" depth="0" bridge_pci="0000:[ff-ff]">
      <object type="PCIDev" gp_index="2001" pci_busid="0000:ff:00.0" pci_type="0302 [10de:20b2] [10de:1463] a1">
        <object type="OSDev" gp_index="2002" name="cuda8" subtype="CUDA" osdev_type="5"/>
      </object>
    </object>
"#;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("stray.xml"), text.replace(machine_end, &format!("{stray}{machine_end}")))
            .unwrap();
        let t = xml(dir.path().join("stray.xml"));
        assert_eq!(t.gpus.len(), 9);
        let g = &t.gpus[8];
        assert_eq!((g.pci_bus_id.as_deref(), g.numa, g.package), (Some("0000:ff:00.0"), None, None));
        assert_eq!((g.cpus.to_list(), g.link_group, g.vendor), ("0-31".to_string(), None, GpuVendor::Nvidia));
        assert_eq!(t.gpus[7].link_group, Some(4), "the others keep their links");
    }

    #[test]
    fn emulated_gpus_on_synthetic_and_xml_nodes() {
        let src = TopologySource::Synthetic("package:2 numa:2 core:2 pu:1".into()).with_emulated_gpus(2);
        assert!(src.to_string().contains("2 emulated GPUs per NUMA node"), "{src}");
        let t = load(&src).unwrap();
        assert_eq!(t.gpus.len(), 8);
        assert!(t.gpus.iter().all(|g| g.emulated && g.pci_bus_id.is_none()));
        assert_eq!(t.gpus.iter().map(|g| g.numa.unwrap()).collect::<Vec<_>>(), [0, 0, 1, 1, 2, 2, 3, 3]);
        // Added after the GPUs an XML node already has.
        let t = load(&TopologySource::Xml(hand_made("gpu4-2p-nvlink-pairs.xml")).with_emulated_gpus(1)).unwrap();
        assert_eq!(t.gpus.iter().filter(|g| g.emulated).map(|g| g.index).collect::<Vec<_>>(), [4, 5]);
        // None: the source is unchanged; on the real machine: refused.
        let plain = TopologySource::Synthetic("core:2 pu:1".into());
        assert_eq!(plain.clone().with_emulated_gpus(0), plain);
        let err = load(&TopologySource::Real.with_emulated_gpus(1)).unwrap_err();
        assert!(matches!(err, TopologyError::GpusOnRealMachine), "{err:?}");
        let err = load(&plain.with_emulated_gpus(99)).unwrap_err();
        assert!(err.to_string().contains("more than 16"), "{err}");
    }
}
