//! A node's GPUs as berth sees them: where each sits (NUMA node, package, local PUs), what it
//! is (vendor, model, PCI address), which OS devices are this GPU, and which GPUs are linked
//! to each other (NVLink and the like).
//!
//! Built by the agent from hwloc (`crates/agent/src/gpus.rs`: OS devices of GPU and
//! co-processor kind, grouped by PCI device) or emulated for tests and `berth up`
//! ([`crate::topology::Topology::add_emulated_gpus`]). Placement, allocation, device cgroups and
//! the jobs' environment (`CUDA_VISIBLE_DEVICES`, ...) build on this model; see docs/gpus.md.

use crate::CpuSet;
use serde::{Deserialize, Serialize};

/// The most GPUs one node may report: far beyond any machine (the largest have 16), small
/// enough that per-GPU tables and link matrices stay cheap.
pub const MAX_GPUS: usize = 256;

/// The most OS devices one GPU may list (CUDA, NVML, OpenCL, DRM card and render nodes...).
pub const MAX_OS_DEVICES: usize = 32;

/// The longest name or text berth keeps for a GPU (model, OS device name, PCI id, UUID).
pub const MAX_GPU_TEXT: usize = 256;

/// The most GPUs `--gpus-per-numa` may emulate on one NUMA node.
pub const MAX_EMULATED_PER_NUMA: u32 = 16;

/// A set of one node's GPUs as bits (GPU k is bit k), for GPUs numbered below [`MAX_GPUS`]:
/// 32 bytes kept inline, so counting a node's free GPUs of a type is a few word operations
/// with no pointer to follow.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GpuMask([u64; MAX_GPUS / 64]);

impl GpuMask {
    /// Add GPU `g`; a GPU numbered `MAX_GPUS` or above is not kept (see [`GpuMask::covers`]).
    pub fn insert(&mut self, g: u32) {
        if let Some(w) = self.0.get_mut(g as usize / 64) {
            *w |= 1 << (g % 64);
        }
    }

    pub fn contains(&self, g: u32) -> bool {
        self.0.get(g as usize / 64).is_some_and(|w| w & (1 << (g % 64)) != 0)
    }

    /// How many GPUs both sets hold.
    pub fn count_and(&self, other: &GpuMask) -> u32 {
        self.0.iter().zip(&other.0).map(|(a, b)| (a & b).count_ones()).sum()
    }

    /// Whether a mask can stand for a node of `gpus` GPUs (all numbered below `MAX_GPUS`).
    pub fn covers(gpus: usize) -> bool {
        gpus <= MAX_GPUS
    }
}

/// The words naming a node's GPUs for `--gpu-type` ([`Gpu::type_words`]), each with the GPUs
/// it names: made once per topology ([`crate::topology::Topology::gpu_types`]) and shared by
/// every node holding that topology, so a typed placement looks a type up in one small table
/// that stays in cache instead of following each node's own heap words.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuTypes {
    words: Vec<GpuTypeWord>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct GpuTypeWord {
    /// Lower case.
    word: Box<str>,
    /// In index order.
    gpus: Vec<u32>,
    mask: GpuMask,
}

impl GpuTypes {
    pub fn of(gpus: &[Gpu]) -> Self {
        let mut words: Vec<GpuTypeWord> = vec![];
        for g in gpus {
            for w in g.type_words() {
                let i = match words.iter().position(|v| *v.word == *w) {
                    Some(i) => i,
                    None => {
                        words.push(GpuTypeWord { word: w.into(), gpus: vec![], mask: GpuMask::default() });
                        words.len() - 1
                    }
                };
                let e = &mut words[i];
                if e.gpus.last() != Some(&g.index) {
                    e.gpus.push(g.index);
                    e.mask.insert(g.index);
                }
            }
        }
        GpuTypes { words }
    }

    /// The GPUs `kind` (any case) names, in index order, and as a mask (empty when none).
    pub fn named(&self, kind: &str) -> (&[u32], GpuMask) {
        match self.words.iter().find(|w| w.word.eq_ignore_ascii_case(kind)) {
            Some(w) => (&w.gpus, w.mask),
            None => (&[], GpuMask::default()),
        }
    }
}

/// Who made the GPU: decides later which environment variables and device files a job gets
/// (`CUDA_VISIBLE_DEVICES` and `/dev/nvidia*` for NVIDIA, `ROCR_VISIBLE_DEVICES` and
/// `/dev/kfd` + `/dev/dri` for AMD, `ZE_AFFINITY_MASK` for Intel).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuVendor {
    Nvidia,
    Amd,
    Intel,
    /// Any other maker, an emulated GPU, and what a newer agent's unknown vendor reads as.
    #[default]
    #[serde(other)]
    Other,
}

impl GpuVendor {
    pub fn as_str(&self) -> &'static str {
        match self {
            GpuVendor::Nvidia => "nvidia",
            GpuVendor::Amd => "amd",
            GpuVendor::Intel => "intel",
            GpuVendor::Other => "other",
        }
    }

    /// The vendor of a PCI vendor id (0x10de NVIDIA, 0x1002 AMD, 0x8086 Intel).
    pub fn from_pci_vendor(id: u16) -> Self {
        match id {
            0x10de => GpuVendor::Nvidia,
            0x1002 | 0x1022 => GpuVendor::Amd,
            0x8086 => GpuVendor::Intel,
            _ => GpuVendor::Other,
        }
    }
}

impl std::fmt::Display for GpuVendor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One GPU of a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gpu {
    /// berth's number for the GPU on its node, its position in `Topology::gpus`: 0, 1, ... in
    /// PCI bus order (the order of NVML, `nvidia-smi` and Slurm's NVML autodetection).
    pub index: u32,
    pub vendor: GpuVendor,
    /// The model as the driver names it (hwloc's `GPUModel`, else the PCI device name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// PCI address, `domain:bus:device.function` in hex (`0000:84:00.0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_bus_id: Option<String>,
    /// OS index of the NUMA node the GPU is attached to, when hwloc places it on exactly one
    /// NUMA node with memory; `None` when it cannot place it or its locality spans several.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa: Option<u32>,
    /// Index into `Topology::packages` of the package the GPU is attached to, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub package: Option<usize>,
    /// The PUs (OS indexes) local to the GPU: the cpuset of hwloc's nearest non-I/O ancestor,
    /// restricted to the PUs berth may use. Empty when unknown.
    #[serde(default, skip_serializing_if = "CpuSet::is_empty")]
    pub cpus: CpuSet,
    /// The OS devices that are this GPU, as hwloc names them: `cuda0`, `nvml0`, `opencl0d1`,
    /// `rsmi0`, `ze0`, and the DRM `card0`/`renderD128` of the same PCI device.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub os_devices: Vec<String>,
    /// The driver's UUID (NVML's `GPU-...`, RSMI's, Level Zero's), when hwloc gives it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// Device memory, when a backend reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// GPUs with the same link group are connected by GPU-to-GPU links (NVLink, NVSwitch,
    /// xGMI), directly or through one another: the connected parts of `Topology::gpu_links`,
    /// numbered by their lowest GPU index. `None` for a GPU with no such link.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_group: Option<u32>,
    /// Not real hardware: added by `--gpus-per-numa` to an emulated node.
    #[serde(default, skip_serializing_if = "is_false")]
    pub emulated: bool,
    /// The device files that are this GPU (absolute paths): `/dev/nvidia0`,
    /// `/dev/dri/card1`, `/dev/dri/renderD128`; on an emulated node, stand-ins under the
    /// agent's `--gpu-device-dir`. The devices cgroup of every job on the node denies those
    /// of the GPUs it does not hold. Empty when unknown (XML topologies without a device
    /// directory: their devices are another machine's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_files: Vec<String>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl Gpu {
    /// The number of the OS device named `prefix` + number (`cuda3` -> 3 for "cuda"), e.g. the
    /// CUDA ordinal for `CUDA_VISIBLE_DEVICES`.
    pub fn os_device_number(&self, prefix: &str) -> Option<u32> {
        self.os_devices.iter().find_map(|d| {
            let n = d.strip_prefix(prefix)?;
            (!n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())).then(|| n.parse().ok())?
        })
    }

    /// The names of this GPU's device files, relative to the device directory (`/dev`):
    /// `nvidiaN` for NVIDIA GPUs and GPUs of no known vendor (emulated ones), N its NVML
    /// index, else CUDA ordinal, else berth's index (the driver's minor number, which
    /// follows NVML's PCI order; the agent reads the true minor from
    /// `/proc/driver/nvidia/gpus/BUS/information` where it can), and `dri/cardN` /
    /// `dri/renderDN` for each DRM OS device (AMD's and Intel's per-GPU devices; NVIDIA's
    /// too when its DRM driver is loaded).
    pub fn device_names(&self) -> Vec<String> {
        let mut names = Vec::new();
        if matches!(self.vendor, GpuVendor::Nvidia | GpuVendor::Other) {
            let n = ["nvml", "cuda"].iter().find_map(|p| self.os_device_number(p)).unwrap_or(self.index);
            names.push(format!("nvidia{n}"));
        }
        for d in &self.os_devices {
            for prefix in ["card", "renderD"] {
                if d.strip_prefix(prefix).is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())) {
                    names.push(format!("dri/{d}"));
                }
            }
        }
        names
    }

    /// A short type name for views and, later, `--gpu-type` (`gres=gpu:TYPE:N`): the model's
    /// last word in lower case (`Tesla K40m` -> `k40m`, `NVIDIA A100-SXM4-80GB` ->
    /// `a100-sxm4-80gb`), `emulated` for emulated GPUs, else the vendor.
    pub fn type_name(&self) -> String {
        if self.emulated {
            return "emulated".into();
        }
        match self.model.as_deref().and_then(|m| m.split_whitespace().last()) {
            Some(word) => word.to_ascii_lowercase(),
            None => self.vendor.as_str().into(),
        }
    }

    /// Whether `--gpu-type KIND` (any case) names this GPU: its type name, a word of its model
    /// split at spaces and dashes (`a100` for "NVIDIA A100 80GB PCIe" and for
    /// "NVIDIA A100-SXM4-80GB", as sites name Slurm's gres types), or its vendor.
    pub fn is_type(&self, kind: &str) -> bool {
        self.type_words().iter().any(|w| w.eq_ignore_ascii_case(kind))
    }

    /// Every word [`Gpu::is_type`] accepts for this GPU, in lower case: its type name, its
    /// vendor and (not emulated) the words of its model split at spaces and dashes.
    pub fn type_words(&self) -> Vec<String> {
        let mut out = vec![self.type_name(), self.vendor.as_str().to_string()];
        if !self.emulated {
            if let Some(m) = self.model.as_deref() {
                out.extend(
                    m.split(|c: char| c.is_whitespace() || c == '-')
                        .filter(|w| !w.is_empty())
                        .map(str::to_ascii_lowercase),
                );
            }
        }
        out.sort();
        out.dedup();
        out
    }

    #[cfg(test)]
    fn is_type_by_text(&self, kind: &str) -> bool {
        self.type_name().eq_ignore_ascii_case(kind)
            || self.vendor.as_str().eq_ignore_ascii_case(kind)
            || (!self.emulated
                && self.model.as_deref().is_some_and(|m| {
                    m.split(|c: char| c.is_whitespace() || c == '-').any(|w| w.eq_ignore_ascii_case(kind))
                }))
    }
}

/// The device number (major, minor) a GPU device file under the real `/dev` has by the
/// drivers' fixed numbering, for a file that does not exist (yet): NVIDIA's `/dev/nvidiaN`
/// is character device 195:N (the driver's `nvidia-modprobe` makes them on first use, so a
/// job could have one made after it started), DRM's `/dev/dri/cardN` and `renderDN` are
/// 226:N. None for any other path.
pub fn known_device_number(path: &str) -> Option<(u32, u32)> {
    let number = |s: &str| (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse().ok())?;
    if let Some(n) = path.strip_prefix("/dev/nvidia") {
        return number(n).map(|n| (195, n));
    }
    let drm = path.strip_prefix("/dev/dri/")?;
    let n = drm.strip_prefix("renderD").or_else(|| drm.strip_prefix("card"))?;
    number(n).map(|n| (226, n))
}

/// A GPU-to-GPU link, between `Topology::gpus[a]` and `[b]` (`a < b`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuLink {
    pub a: u32,
    pub b: u32,
    /// Bandwidth in MB/s, as hwloc's `NVLinkBandwidth` matrix gives it (about 25000 per
    /// NVLink 2/3 link and direction); 0 when only the link's existence is known.
    #[serde(default)]
    pub bandwidth_mbs: u64,
}

/// Link groups from links: the connected parts of the link graph, each numbered by its
/// lowest GPU index; GPUs without a link get `None`.
pub fn link_groups(gpus: usize, links: &[GpuLink]) -> Vec<Option<u32>> {
    // Union-find over GPU indexes, the root kept as the lowest index.
    let mut parent: Vec<usize> = (0..gpus).collect();
    fn root(parent: &mut [usize], mut i: usize) -> usize {
        while parent[i] != i {
            parent[i] = parent[parent[i]];
            i = parent[i];
        }
        i
    }
    let mut linked = vec![false; gpus];
    for link in links {
        let (a, b) = (link.a as usize, link.b as usize);
        if a >= gpus || b >= gpus || a == b {
            continue;
        }
        linked[a] = true;
        linked[b] = true;
        let (ra, rb) = (root(&mut parent, a), root(&mut parent, b));
        let (lo, hi) = (ra.min(rb), ra.max(rb));
        parent[hi] = lo;
    }
    (0..gpus).map(|i| linked[i].then(|| root(&mut parent, i) as u32)).collect()
}

/// Where one GPU a job holds sits on its node (`berth show`): its NUMA node, socket, local PUs
/// and link group, and how many of the job's PUs there are local to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuPlace {
    pub node: String,
    /// berth's index of the GPU on the node ([`Gpu::index`], as `BERTH_GPUS`).
    pub index: u32,
    /// [`Gpu::type_name`].
    #[serde(rename = "type")]
    pub type_name: String,
    /// OS index of its NUMA node, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa: Option<u32>,
    /// OS index of its package (socket), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<u32>,
    /// The PUs local to it (kernel list); empty when unknown.
    #[serde(default, skip_serializing_if = "CpuSet::is_empty")]
    pub cpus: CpuSet,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_group: Option<u32>,
    /// How many of the job's PUs on the node are among `cpus`.
    #[serde(default)]
    pub job_cpus_local: u32,
}

/// The environment a job gets for its GPUs `held` (indexes into `gpus`, the node's), as Slurm
/// sets it: `BERTH_GPUS` (berth's indexes), `GPU_DEVICE_ORDINAL` (the same), and the vendor's
/// variable with the driver's numbers: `CUDA_VISIBLE_DEVICES` (the `cudaN` ordinal, else
/// `nvmlN`, else berth's index) for NVIDIA GPUs and GPUs of no known vendor (emulated ones),
/// `ROCR_VISIBLE_DEVICES` (`rsmiN`) for AMD, `ZE_AFFINITY_MASK` (`zeN`) for Intel. Nothing for
/// a job without GPUs. berth does not confine the devices yet, so the numbers are the node's,
/// not renumbered from 0.
pub fn job_env(gpus: &[Gpu], held: &[u32]) -> Vec<(&'static str, String)> {
    gpu_env(gpus, held, held, false)
}

/// The GPU variables of a process that uses GPUs `mine` of the job's `visible` ones on a node
/// (a rank's, or the job's own with `mine == visible`). `BERTH_GPUS` names the node's GPUs
/// (berth's indexes). With `relative` (the node's devices cgroup hides the job's other GPUs:
/// the CUDA, ROCm and Level Zero runtimes then number the GPUs they can open from 0, in PCI
/// order), `GPU_DEVICE_ORDINAL` and the vendor's variable give each GPU's position among the
/// job's GPUs of its vendor, as Slurm does under `ConstrainDevices`; else the node's numbers
/// as [`job_env`] says.
pub fn gpu_env(gpus: &[Gpu], visible: &[u32], mine: &[u32], relative: bool) -> Vec<(&'static str, String)> {
    if !relative {
        return node_numbered_env(gpus, mine);
    }
    let mut env = node_numbered_env(gpus, mine);
    let seen: Vec<&Gpu> = {
        let mut v: Vec<u32> = visible.to_vec();
        v.sort_unstable();
        v.dedup();
        v.iter().filter_map(|&i| gpus.get(i as usize)).collect()
    };
    let class = |g: &Gpu| match g.vendor {
        GpuVendor::Nvidia | GpuVendor::Other => 0,
        GpuVendor::Amd => 1,
        GpuVendor::Intel => 2,
    };
    let position = |g: &Gpu| seen.iter().filter(|s| class(s) == class(g) && s.index < g.index).count();
    let list = |of: &dyn Fn(&Gpu) -> bool| -> String {
        let v: Vec<String> = mine
            .iter()
            .filter_map(|&i| gpus.get(i as usize))
            .filter(|g| of(g))
            .map(|g| position(g).to_string())
            .collect();
        v.join(",")
    };
    for (name, value) in env.iter_mut() {
        *value = match *name {
            "GPU_DEVICE_ORDINAL" => list(&|_| true),
            "CUDA_VISIBLE_DEVICES" => list(&|g| class(g) == 0),
            "ROCR_VISIBLE_DEVICES" => list(&|g| class(g) == 1),
            "ZE_AFFINITY_MASK" => list(&|g| class(g) == 2),
            _ => continue,
        };
    }
    env
}

fn node_numbered_env(gpus: &[Gpu], held: &[u32]) -> Vec<(&'static str, String)> {
    let mine: Vec<&Gpu> = held.iter().filter_map(|&i| gpus.get(i as usize)).collect();
    if mine.is_empty() {
        return vec![];
    }
    let list = |f: &dyn Fn(&Gpu) -> u32, of: &dyn Fn(&Gpu) -> bool| -> Option<String> {
        let v: Vec<String> = mine.iter().filter(|g| of(g)).map(|g| f(g).to_string()).collect();
        (!v.is_empty()).then(|| v.join(","))
    };
    let ours = list(&|g| g.index, &|_| true).unwrap_or_default();
    let mut env = vec![("BERTH_GPUS", ours.clone()), ("GPU_DEVICE_ORDINAL", ours)];
    let number = |g: &Gpu, names: &[&str]| names.iter().find_map(|n| g.os_device_number(n)).unwrap_or(g.index);
    if let Some(v) =
        list(&|g| number(g, &["cuda", "nvml"]), &|g| matches!(g.vendor, GpuVendor::Nvidia | GpuVendor::Other))
    {
        env.push(("CUDA_VISIBLE_DEVICES", v));
    }
    if let Some(v) = list(&|g| number(g, &["rsmi"]), &|g| g.vendor == GpuVendor::Amd) {
        env.push(("ROCR_VISIBLE_DEVICES", v));
    }
    if let Some(v) = list(&|g| number(g, &["ze"]), &|g| g.vendor == GpuVendor::Intel) {
        env.push(("ZE_AFFINITY_MASK", v));
    }
    env
}

/// Whether a GPU job's cores must be local to its GPUs (see `crate::placement::PlacementPolicy::gpu_locality`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuLocality {
    /// Cores local to the GPUs when the node has them free, else cores anywhere on the node.
    #[default]
    Prefer,
    /// Only cores local to the job's GPUs: the job waits for them (Slurm's
    /// `--gres-flags=enforce-binding`).
    Strict,
}

impl GpuLocality {
    pub fn as_str(self) -> &'static str {
        match self {
            GpuLocality::Prefer => "prefer",
            GpuLocality::Strict => "strict",
        }
    }

    /// `strict` or `prefer` (any case).
    pub fn parse(text: &str) -> Result<Self, UnknownGpuLocality> {
        match text.trim().to_ascii_lowercase().as_str() {
            "strict" => Ok(GpuLocality::Strict),
            "prefer" => Ok(GpuLocality::Prefer),
            _ => Err(UnknownGpuLocality(text.escape_debug().to_string())),
        }
    }
}

/// A GPU locality other than `strict` or `prefer` (the text as given, escaped).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("GPU locality {0:?}: give strict (only cores next to the job's GPUs; it waits for them) or prefer (cores elsewhere on the node when those are taken)")]
pub struct UnknownGpuLocality(pub String);

impl std::fmt::Display for GpuLocality {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How the ranks of a step share the job's GPUs on a node (`--gpu-bind`, Slurm's spelling).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuBind {
    /// Each rank gets the GPUs nearest its CPUs (`closest`), its own when the job has enough.
    Closest,
    /// No binding: every rank sees all the job's GPUs on its node (`none`).
    None,
    /// Local rank i gets the node's GPU `list[i % len]` (`map:0,1` or Slurm's `map_gpu:0,1`).
    Map(Vec<u32>),
    /// Local rank i gets the node's GPUs of `list[i % len]` (Slurm's `mask_gpu:0x3,0xc`: each
    /// mask's bits are GPU indexes), kept as index sets.
    Mask(Vec<Vec<u32>>),
    /// Slurm's `single:N`: as `closest`, but one GPU a rank, N ranks a GPU: the first N ranks
    /// near some GPUs get the first of them, the next N the second, and so on.
    Single(u32),
    /// Slurm's `per_task:N`: N GPUs a rank, in order: the first rank the job's first N GPUs on
    /// the node, the next the next N (wrapping round).
    PerTask(u32),
}

/// The most entries a `--gpu-bind` map or mask list may expand to (`0*4,1*4` is 8).
pub const MAX_BIND_LIST: usize = 4096;

/// The forms `--gpu-bind` takes, for messages.
const BIND_FORMS: &str =
    "closest, none, map_gpu:I,J,... (or map:), mask_gpu:M,N,... (hex masks of GPU indexes), single:N or per_task:N";

/// Why a `--gpu-bind` value is refused, or names a GPU the job does not hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GpuBindError {
    /// `single:N` or `per_task:N` with a bad count; `shown` is the value as given, escaped.
    #[error("--gpu-bind {form}: needs a count from 1 to {max}, got {shown:?}", max = MAX_GPUS)]
    Count { form: &'static str, shown: String },
    #[error("--gpu-bind mask_gpu: {problem}, in {shown:?}")]
    Mask { problem: BindListError, shown: String },
    #[error("--gpu-bind map: needs GPU indexes 0 to {last} separated by commas (ITEM*COUNT repeats one), got {shown:?}", last = MAX_GPUS - 1)]
    Map { shown: String },
    #[error("--gpu-bind takes {BIND_FORMS}; got {shown:?}")]
    Form { shown: String },
    /// A `map` or `mask_gpu` list names a GPU the job does not hold on the node.
    #[error("--gpu-bind {form} names GPU {gpu}, which the job does not hold on this node (its GPUs here: {held})")]
    NotHeld { form: &'static str, gpu: u32, held: String },
}

/// What is wrong in a `--gpu-bind` list (`map_gpu:`, `mask_gpu:`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BindListError {
    #[error("a bad *COUNT")]
    BadRepeat,
    #[error("an empty entry")]
    EmptyEntry,
    #[error("more than {MAX_BIND_LIST} entries")]
    TooLong,
    #[error("{0:?} is not a hexadecimal mask of GPU indexes 0 to {last}", last = MAX_GPUS - 1)]
    NotHex(String),
    #[error("mask {0:?} names no GPU")]
    NoGpu(String),
}

/// For callers that still gather errors as text (the agent's step set-up).
impl From<GpuBindError> for String {
    fn from(e: GpuBindError) -> String {
        e.to_string()
    }
}

impl GpuBind {
    /// Parse `closest`, `none`, `map:I,J,...`/`map_gpu:I,J,...` (GPU indexes on the node),
    /// `mask_gpu:M,N,...` (hexadecimal, `0x` optional), `single:N`, `per_task:N`. Lists may
    /// repeat an entry with `*COUNT` (`map_gpu:0*4,1*4`), as Slurm's.
    pub fn parse(text: &str) -> Result<GpuBind, GpuBindError> {
        let t = text.trim();
        let shown = || text.escape_debug().to_string();
        match t {
            "closest" => return Ok(GpuBind::Closest),
            "none" => return Ok(GpuBind::None),
            _ => {}
        }
        let count = |form: &'static str, v: &str| -> Result<u32, GpuBindError> {
            match v.trim().parse::<u32>() {
                Ok(n) if (1..=MAX_GPUS as u32).contains(&n) => Ok(n),
                _ => Err(GpuBindError::Count { form, shown: shown() }),
            }
        };
        if let Some(n) = t.strip_prefix("single:") {
            return Ok(GpuBind::Single(count("single", n)?));
        }
        if let Some(n) = t.strip_prefix("per_task:") {
            return Ok(GpuBind::PerTask(count("per_task", n)?));
        }
        if let Some(list) = t.strip_prefix("mask_gpu:") {
            let masks = expand_list(list)
                .and_then(|items| items.iter().map(|m| mask_indexes(m)).collect::<Result<Vec<_>, _>>())
                .map_err(|problem| GpuBindError::Mask { problem, shown: shown() })?;
            return Ok(GpuBind::Mask(masks));
        }
        let list = t
            .strip_prefix("map_gpu:")
            .or_else(|| t.strip_prefix("map:"))
            .ok_or_else(|| GpuBindError::Form { shown: shown() })?;
        let ids: Option<Vec<u32>> = expand_list(list).ok().and_then(|items| {
            items.iter().map(|i| i.parse::<u32>().ok().filter(|&i| (i as usize) < MAX_GPUS)).collect()
        });
        ids.map(GpuBind::Map).ok_or_else(|| GpuBindError::Map { shown: shown() })
    }
}

/// A `--gpu-bind` list's entries with `ITEM*COUNT` repeated: at least one, at most
/// [`MAX_BIND_LIST`].
fn expand_list(list: &str) -> Result<Vec<&str>, BindListError> {
    let mut out = vec![];
    for item in list.split(',').map(str::trim) {
        let (item, times) = match item.split_once('*') {
            Some((i, n)) => {
                (i.trim(), n.trim().parse::<usize>().ok().filter(|&n| n >= 1).ok_or(BindListError::BadRepeat)?)
            }
            None => (item, 1),
        };
        if item.is_empty() {
            return Err(BindListError::EmptyEntry);
        }
        if out.len() + times > MAX_BIND_LIST {
            return Err(BindListError::TooLong);
        }
        out.extend(std::iter::repeat_n(item, times));
    }
    Ok(out)
}

/// The GPU indexes of a hexadecimal mask (`0x0f`, `f0`): bit i is GPU i; not empty.
fn mask_indexes(mask: &str) -> Result<Vec<u32>, BindListError> {
    let hex = mask.strip_prefix("0x").or_else(|| mask.strip_prefix("0X")).unwrap_or(mask);
    if hex.is_empty() || hex.len() > MAX_GPUS / 4 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(BindListError::NotHex(mask.to_string()));
    }
    let mut out = vec![];
    for (k, digit) in hex.bytes().rev().enumerate() {
        let v = (digit as char).to_digit(16).unwrap_or(0);
        out.extend((0..4).filter(|b| v & (1 << b) != 0).map(|b| (k * 4 + b) as u32));
    }
    if out.is_empty() {
        return Err(BindListError::NoGpu(mask.to_string()));
    }
    Ok(out)
}

/// `0x...` of GPU indexes (the inverse of [`mask_indexes`]).
fn mask_text(ids: &[u32]) -> String {
    let top = ids.iter().max().map_or(0, |&m| m as usize / 4);
    let digits: String = (0..=top)
        .rev()
        .map(|k| {
            let v = ids.iter().filter(|&&i| i as usize / 4 == k).fold(0u32, |v, &i| v | 1 << (i % 4));
            char::from_digit(v, 16).unwrap_or('0')
        })
        .collect();
    format!("0x{digits}")
}

impl std::fmt::Display for GpuBind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GpuBind::Closest => f.write_str("closest"),
            GpuBind::None => f.write_str("none"),
            GpuBind::Map(ids) => {
                let ids: Vec<String> = ids.iter().map(u32::to_string).collect();
                write!(f, "map:{}", ids.join(","))
            }
            GpuBind::Mask(masks) => {
                let masks: Vec<String> = masks.iter().map(|m| mask_text(m)).collect();
                write!(f, "mask_gpu:{}", masks.join(","))
            }
            GpuBind::Single(n) => write!(f, "single:{n}"),
            GpuBind::PerTask(n) => write!(f, "per_task:{n}"),
        }
    }
}

pub(crate) fn not_held(form: &'static str, gpu: u32, held: &[u32]) -> GpuBindError {
    let held: Vec<String> = held.iter().map(u32::to_string).collect();
    GpuBindError::NotHeld { form, gpu, held: held.join(",") }
}

/// The GPUs of each local rank on a node: `held` are the job's GPUs there (indexes into
/// `gpus`), `ranks` each rank's PUs, `per_task` the GPUs each rank gets with `closest`.
///
/// `closest`: ranks are served most constrained first (those with the fewest of the job's
/// GPUs local to their PUs, ranks with none last); each takes `per_task` GPUs, preferring GPUs
/// used by fewer ranks than their fair share (ranks x `per_task` over the GPUs, rounded up),
/// then the most of its PUs local to the GPU, then the GPUs fewer ranks use, then the GPU of
/// its package, then the lowest index. So a job with a GPU for each rank gives each its own, local to it
/// when the placement allows; with fewer, ranks share. `none`: every rank all of `held`.
/// `map`: rank i the node's GPU `list[i % len]`, which the job must hold.
pub fn rank_gpus(
    gpus: &[Gpu],
    held: &[u32],
    ranks: &[CpuSet],
    per_task: u32,
    bind: &GpuBind,
) -> Result<Vec<Vec<u32>>, GpuBindError> {
    let mut held: Vec<u32> = held.iter().copied().filter(|&i| (i as usize) < gpus.len()).collect();
    held.sort_unstable();
    held.dedup();
    if held.is_empty() {
        return Ok(vec![vec![]; ranks.len()]);
    }
    match bind {
        GpuBind::None => Ok(vec![held; ranks.len()]),
        GpuBind::Map(ids) => {
            if let Some(&gpu) = ids.iter().find(|i| !held.contains(i)) {
                return Err(not_held("map", gpu, &held));
            }
            Ok((0..ranks.len()).map(|i| vec![ids[i % ids.len()]]).collect())
        }
        GpuBind::Mask(masks) => {
            if let Some(&gpu) = masks.iter().flatten().find(|i| !held.contains(i)) {
                return Err(not_held("mask_gpu", gpu, &held));
            }
            Ok((0..ranks.len()).map(|i| masks[i % masks.len()].clone()).collect())
        }
        GpuBind::PerTask(n) => {
            let n = (*n as usize).clamp(1, held.len());
            Ok((0..ranks.len())
                .map(|i| {
                    let mut v: Vec<u32> = (0..n).map(|j| held[(i * n + j) % held.len()]).collect();
                    v.sort_unstable();
                    v
                })
                .collect())
        }
        GpuBind::Single(n) => {
            // Each rank's nearest GPUs (most of its PUs local; all the job's when none is);
            // ranks with the same nearest GPUs take them in blocks of n.
            let local = |g: u32, cpus: &CpuSet| gpus[g as usize].cpus.iter().filter(|&pu| cpus.contains(pu)).count();
            let mut served: Vec<(Vec<u32>, usize)> = vec![];
            let mut out = vec![];
            for cpus in ranks {
                let best = held.iter().map(|&g| local(g, cpus)).max().unwrap_or(0);
                let near: Vec<u32> = held.iter().copied().filter(|&g| best == 0 || local(g, cpus) == best).collect();
                let k = match served.iter_mut().find(|(set, _)| *set == near) {
                    Some((_, k)) => {
                        *k += 1;
                        *k - 1
                    }
                    None => {
                        served.push((near.clone(), 1));
                        0
                    }
                };
                out.push(vec![near[(k / (*n).max(1) as usize) % near.len()]]);
            }
            Ok(out)
        }
        GpuBind::Closest => {
            let per_task = (per_task.max(1) as usize).min(held.len());
            let local = |g: u32, cpus: &CpuSet| gpus[g as usize].cpus.iter().filter(|&pu| cpus.contains(pu)).count();
            let package_of_rank =
                |cpus: &CpuSet| held.iter().find(|&&g| local(g, cpus) > 0).and_then(|&g| gpus[g as usize].package);
            let mut order: Vec<usize> = (0..ranks.len()).collect();
            order.sort_by_key(|&r| {
                let n = held.iter().filter(|&&g| local(g, &ranks[r]) > 0).count();
                (n == 0, n, r)
            });
            let mut uses = vec![0usize; gpus.len()];
            let mut out = vec![vec![]; ranks.len()];
            // A GPU's fair share of ranks: below it, locality decides; at it, GPUs fewer
            // ranks use come first (so ranks share evenly, and ranks next to a GPU get it).
            let share = (ranks.len() * per_task).div_ceil(held.len()).max(1);
            for r in order {
                let cpus = &ranks[r];
                let package = package_of_rank(cpus);
                let mut choice: Vec<u32> = held.clone();
                choice.sort_by_key(|&g| {
                    let same_package = package.is_some() && gpus[g as usize].package == package;
                    let full = uses[g as usize] >= share;
                    (full, std::cmp::Reverse(local(g, cpus)), uses[g as usize], !same_package, g)
                });
                choice.truncate(per_task);
                choice.sort_unstable();
                for &g in &choice {
                    uses[g as usize] += 1;
                }
                out[r] = choice;
            }
            Ok(out)
        }
    }
}

#[cfg(test)]
mod rank_tests {
    use super::*;
    use crate::topology::Topology;

    /// 2 packages x 2 NUMA nodes x 2 cores (1 PU each), 1 GPU per NUMA node: GPU g is local to
    /// PUs 2g and 2g+1, and GPUs 0-1 / 2-3 share a package.
    fn node() -> Topology {
        let mut t = Topology::uniform(2, 2, 2, 1, 1 << 30);
        t.add_emulated_gpus(1).unwrap();
        t
    }

    fn sets(lists: &[&str]) -> Vec<CpuSet> {
        lists.iter().map(|l| CpuSet::parse_list(l).unwrap()).collect()
    }

    #[test]
    fn closest_gives_each_rank_its_own_local_gpu() {
        let t = node();
        for g in &t.gpus {
            assert_eq!(g.cpus.len(), 2, "{g:?}");
        }
        let pus = |g: usize| t.gpus[g].cpus.to_list();
        // Ranks listed against the GPUs' order: each still gets the GPU local to it.
        let ranks = sets(&[&pus(3), &pus(1), &pus(0), &pus(2)]);
        let got = rank_gpus(&t.gpus, &[0, 1, 2, 3], &ranks, 1, &GpuBind::Closest).unwrap();
        assert_eq!(got, [vec![3], vec![1], vec![0], vec![2]]);
        // Two ranks on NUMA node 0's PUs, the job holding GPUs 0 and 1: one each, the local
        // one to the first, the same package's to the second.
        let two = sets(&[&pus(0), &pus(0)]);
        assert_eq!(rank_gpus(&t.gpus, &[0, 1], &two, 1, &GpuBind::Closest).unwrap(), [vec![0], vec![1]]);
        // Two GPUs a rank.
        let ranks = sets(&[&pus(2), &pus(0)]);
        let got = rank_gpus(&t.gpus, &[0, 1, 2, 3], &ranks, 2, &GpuBind::Closest).unwrap();
        assert_eq!(got, [vec![2, 3], vec![0, 1]], "the local GPU and its package's");
    }

    #[test]
    fn a_rank_with_a_local_gpu_is_served_before_one_without() {
        let t = node();
        let pus = |g: usize| t.gpus[g].cpus.to_list();
        // Rank 0 runs where the job has no GPU; rank 1 next to GPU 1. Rank 1 keeps GPU 1.
        let ranks = sets(&[&pus(3), &pus(1)]);
        assert_eq!(rank_gpus(&t.gpus, &[0, 1], &ranks, 1, &GpuBind::Closest).unwrap(), [vec![0], vec![1]]);
    }

    #[test]
    fn more_ranks_than_gpus_share_them_evenly() {
        let t = node();
        let pus = |g: usize| t.gpus[g].cpus.to_list();
        let ranks = sets(&[&pus(0), &pus(0), &pus(1), &pus(1)]);
        let got = rank_gpus(&t.gpus, &[0, 1], &ranks, 1, &GpuBind::Closest).unwrap();
        assert_eq!(got, [vec![0], vec![0], vec![1], vec![1]], "each GPU twice, to the ranks next to it");
        let counts = [0, 1].map(|g| got.iter().filter(|r| r.contains(&g)).count());
        assert_eq!(counts, [2, 2]);
        // per_task above the job's GPUs: all of them.
        assert_eq!(rank_gpus(&t.gpus, &[0, 1], &ranks[..1], 5, &GpuBind::Closest).unwrap(), [vec![0, 1]]);
    }

    /// Uneven: ranks x GPUs a rank not a multiple of the job's GPUs. Ranks share, no GPU
    /// used by more than its fair share (ranks x per-task over the GPUs, rounded up), each
    /// rank's GPUs distinct, every GPU used.
    #[test]
    fn ranks_not_dividing_the_gpus_share_them_within_a_fair_share() {
        let t = node();
        let pus = |g: usize| t.gpus[g].cpus.to_list();
        // 4 ranks over 3 GPUs (0, 1, 2), two ranks next to GPU 0: 2, 1, 1.
        let ranks = sets(&[&pus(0), &pus(0), &pus(1), &pus(2)]);
        let got = rank_gpus(&t.gpus, &[0, 1, 2], &ranks, 1, &GpuBind::Closest).unwrap();
        assert_eq!(got, [vec![0], vec![0], vec![1], vec![2]]);
        // 5 ranks all next to GPU 0, 3 GPUs: at most 2 each.
        let ranks = sets(&[&pus(0), &pus(0), &pus(0), &pus(0), &pus(0)]);
        let got = rank_gpus(&t.gpus, &[0, 1, 2], &ranks, 1, &GpuBind::Closest).unwrap();
        let counts = [0, 1, 2].map(|g| got.iter().filter(|r| r.contains(&g)).count());
        assert_eq!(counts, [2, 2, 1], "{got:?}");
        // 2 ranks x 2 GPUs over 3: each rank two distinct GPUs, one GPU shared.
        let ranks = sets(&[&pus(0), &pus(2)]);
        let got = rank_gpus(&t.gpus, &[0, 1, 2], &ranks, 2, &GpuBind::Closest).unwrap();
        assert!(got.iter().all(|r| r.len() == 2), "{got:?}");
        let counts = [0, 1, 2].map(|g| got.iter().filter(|r| r.contains(&g)).count());
        assert_eq!(counts.iter().sum::<usize>(), 4);
        assert!(counts.iter().all(|&c| (1..=2).contains(&c)), "{got:?}");
        assert!(got[0].contains(&0) && got[1].contains(&2), "each rank keeps its local GPU: {got:?}");
    }

    #[test]
    fn none_and_map() {
        let t = node();
        let ranks = sets(&["0", "1", "2"]);
        assert_eq!(rank_gpus(&t.gpus, &[1, 0], &ranks, 1, &GpuBind::None).unwrap(), vec![vec![0, 1]; 3]);
        let map = GpuBind::parse("map_gpu:1,0").unwrap();
        assert_eq!(map, GpuBind::Map(vec![1, 0]));
        assert_eq!(rank_gpus(&t.gpus, &[0, 1], &ranks, 1, &map).unwrap(), [vec![1], vec![0], vec![1]]);
        let err = rank_gpus(&t.gpus, &[0, 1], &ranks, 1, &GpuBind::Map(vec![3])).unwrap_err();
        assert_eq!(err, GpuBindError::NotHeld { form: "map", gpu: 3, held: "0,1".into() });
        let err = err.to_string();
        assert!(err.contains("GPU 3") && err.contains("0,1"), "{err}");
        assert_eq!(rank_gpus(&t.gpus, &[], &ranks, 1, &GpuBind::Closest).unwrap(), vec![Vec::<u32>::new(); 3]);
    }

    #[test]
    fn mask_per_task_and_single() {
        let t = node();
        let ranks = sets(&["0", "1", "2", "3", "4", "5"]);
        // mask_gpu: rank i the GPUs of mask i mod 2.
        let mask = GpuBind::parse("mask_gpu:0x3,0xc").unwrap();
        let got = rank_gpus(&t.gpus, &[0, 1, 2, 3], &ranks[..3], 1, &mask).unwrap();
        assert_eq!(got, [vec![0, 1], vec![2, 3], vec![0, 1]]);
        let err = rank_gpus(&t.gpus, &[0, 1], &ranks[..1], 1, &GpuBind::parse("mask_gpu:0x4").unwrap()).unwrap_err();
        let err = err.to_string();
        assert!(err.contains("names GPU 2") && err.contains("its GPUs here: 0,1"), "{err}");
        // per_task:2: GPUs in order, two a rank, wrapping.
        let got = rank_gpus(&t.gpus, &[0, 1, 2], &ranks[..3], 1, &GpuBind::PerTask(2)).unwrap();
        assert_eq!(got, [vec![0, 1], vec![0, 2], vec![1, 2]]);
        // single:2 on a job holding the 4 GPUs: PUs 0-3 are near GPUs 0 and 1 (2 PUs each):
        // ranks on PUs 0,1 are near GPU 0 only, so both get it; PUs 2,3 near GPU 1.
        let got = rank_gpus(&t.gpus, &[0, 1, 2, 3], &ranks[..4], 1, &GpuBind::Single(2)).unwrap();
        assert_eq!(got, [vec![0], vec![0], vec![1], vec![1]]);
        // Ranks near no GPU share all the job's GPUs in blocks of 2: 0,0,1,1,0,...
        let far = sets(&["6", "6", "7", "7", "6"]);
        let got = rank_gpus(&t.gpus, &[0, 1], &far, 1, &GpuBind::Single(2)).unwrap();
        assert_eq!(got, [vec![0], vec![0], vec![1], vec![1], vec![0]]);
        // single:1 with ranks that have two GPUs equally near: one each, in block order.
        let wide = sets(&["0-3", "0-3", "0-3"]);
        let got = rank_gpus(&t.gpus, &[0, 1], &wide, 1, &GpuBind::Single(1)).unwrap();
        assert_eq!(got, [vec![0], vec![1], vec![0]]);
    }

    #[test]
    fn gpu_bind_texts() {
        for ok in
            ["closest", "none", "map:0,1,2", "map:7", "mask_gpu:0x3,0xc", "mask_gpu:0x100", "single:2", "per_task:1"]
        {
            assert_eq!(GpuBind::parse(ok).unwrap().to_string(), ok);
        }
        assert_eq!(GpuBind::parse(" map_gpu:0 ").unwrap().to_string(), "map:0");
        assert_eq!(GpuBind::parse("map_gpu:0*2,1*2").unwrap(), GpuBind::Map(vec![0, 0, 1, 1]));
        assert_eq!(
            GpuBind::parse("mask_gpu:f0*2,0X1").unwrap(),
            GpuBind::Mask(vec![vec![4, 5, 6, 7], vec![4, 5, 6, 7], vec![0]])
        );
        for bad in [
            "",
            "map:",
            "map:a",
            "map:256",
            "map:0*0",
            "map:0*5000",
            "single:0",
            "single:x",
            "per_task:257",
            "mask_gpu:",
            "mask_gpu:0x0",
            "mask_gpu:0xg",
            "Closest",
            "mask_gpu:1,,2",
        ] {
            let e = GpuBind::parse(bad).unwrap_err().to_string();
            assert!(e.contains("--gpu-bind"), "{bad}: {e}");
        }
        let e = GpuBind::parse("sockets").unwrap_err().to_string();
        assert!(e.contains("closest, none, map_gpu:I,J,... (or map:), mask_gpu:M,N,"), "{e}");
        // The messages, word for word (docs and the CLI's tests quote them).
        let text = |bad: &str| GpuBind::parse(bad).unwrap_err().to_string();
        assert_eq!(
            text("single:0"),
            format!("--gpu-bind single: needs a count from 1 to {MAX_GPUS}, got \"single:0\"")
        );
        assert_eq!(text("mask_gpu:1,,2"), "--gpu-bind mask_gpu: an empty entry, in \"mask_gpu:1,,2\"");
        assert_eq!(
            text("mask_gpu:0xg"),
            format!(
                "--gpu-bind mask_gpu: \"0xg\" is not a hexadecimal mask of GPU indexes 0 to {}, in \"mask_gpu:0xg\"",
                MAX_GPUS - 1
            )
        );
        assert_eq!(text("mask_gpu:0"), "--gpu-bind mask_gpu: mask \"0\" names no GPU, in \"mask_gpu:0\"");
        assert_eq!(text("map:0*0"), format!("--gpu-bind map: needs GPU indexes 0 to {} separated by commas (ITEM*COUNT repeats one), got \"map:0*0\"", MAX_GPUS - 1));
        assert_eq!(text("sockets"), format!("--gpu-bind takes {BIND_FORMS}; got \"sockets\""));
        assert!(matches!(
            GpuBind::parse("mask_gpu:0*9000"),
            Err(GpuBindError::Mask { problem: BindListError::TooLong, .. })
        ));
        assert!(matches!(
            GpuBind::parse("mask_gpu:1*x"),
            Err(GpuBindError::Mask { problem: BindListError::BadRepeat, .. })
        ));
    }
}

#[cfg(test)]
mod place_tests {
    use super::*;
    use crate::topology::Topology;

    /// Two packages of two NUMA nodes of two cores, a GPU on each NUMA node: each GPU's place
    /// is its NUMA node, its package's OS index, its NUMA node's PUs, and the job's PUs among
    /// them are counted.
    #[test]
    fn a_job_s_gpus_are_placed_on_their_numa_node_and_socket() {
        let mut t = Topology::uniform(2, 2, 2, 1, 1 << 30);
        t.add_emulated_gpus(1).unwrap();
        assert_eq!(t.gpus.len(), 4);
        let job = CpuSet::parse_list("0-1,4").unwrap();
        let p = t.gpu_places("g1", &[2, 0, 9], &job);
        assert_eq!(p.len(), 2, "GPU 9 is not on the node: left out: {p:?}");
        let (a, b) = (&p[0], &p[1]);
        assert_eq!((a.node.as_str(), a.index, a.type_name.as_str()), ("g1", 2, "emulated"));
        assert_eq!((a.numa, a.socket, a.cpus.to_list(), a.job_cpus_local), (Some(2), Some(1), "4-5".into(), 1));
        assert_eq!(
            (b.index, b.numa, b.socket, b.cpus.to_list(), b.job_cpus_local),
            (0, Some(0), Some(0), "0-1".into(), 2)
        );
        assert_eq!(a.link_group, t.gpus[2].link_group);
        let json = serde_json::to_value(a).unwrap();
        assert_eq!(json["type"], "emulated");
        assert_eq!(json["cpus"], "4-5");
        let back: GpuPlace = serde_json::from_value(json).unwrap();
        assert_eq!(&back, a);
        assert!(t.gpu_places("g1", &[], &job).is_empty());
    }
}

#[cfg(test)]
mod env_tests {
    use super::*;

    #[test]
    fn real_device_numbers_follow_the_drivers() {
        assert_eq!(known_device_number("/dev/nvidia3"), Some((195, 3)));
        assert_eq!(known_device_number("/dev/dri/renderD128"), Some((226, 128)));
        assert_eq!(known_device_number("/dev/dri/card1"), Some((226, 1)));
        for other in ["/dev/nvidiactl", "/dev/nvidia-uvm", "/tmp/x/nvidia0", "/dev/dri/by-path", "/dev/nvidia"] {
            assert_eq!(known_device_number(other), None, "{other}");
        }
    }

    fn gpu(index: u32, vendor: GpuVendor, devices: &[&str]) -> Gpu {
        let mut t = crate::topology::Topology::uniform(1, 1, 1, 1, 1 << 30);
        t.add_emulated_gpus(1).expect("one GPU");
        let mut g = t.gpus.remove(0);
        g.index = index;
        g.vendor = vendor;
        g.emulated = false;
        g.os_devices = devices.iter().map(|d| d.to_string()).collect();
        g
    }

    #[test]
    fn a_gpu_type_is_a_word_of_its_model_or_its_vendor() {
        let mut pcie = gpu(0, GpuVendor::Nvidia, &["cuda0"]);
        pcie.model = Some("NVIDIA A100 80GB PCIe".into());
        let mut sxm = gpu(1, GpuVendor::Nvidia, &["cuda1"]);
        sxm.model = Some("NVIDIA A100-SXM4-80GB".into());
        for g in [&pcie, &sxm] {
            assert!(g.is_type("a100") && g.is_type("A100") && g.is_type("nvidia"), "{:?}", g.model);
            assert!(!g.is_type("h100") && !g.is_type("a10") && !g.is_type(""), "{:?}", g.model);
        }
        assert!(pcie.is_type("pcie") && !pcie.is_type("sxm4"));
        assert!(sxm.is_type("a100-sxm4-80gb") && sxm.is_type("sxm4"));
        let mut emulated = gpu(2, GpuVendor::Other, &[]);
        emulated.emulated = true;
        assert!(emulated.is_type("emulated") && !emulated.is_type("a100"));
        // The words kept per node (NodeCapacity) answer as the text does, for any kind a job
        // may give (not empty: `valid_gpu_type`).
        let mut other = gpu(3, GpuVendor::Amd, &["rsmi0"]);
        other.model = Some("AMD Instinct MI250X  (x)".into());
        let mut bare = gpu(4, GpuVendor::Intel, &[]);
        bare.model = None;
        for g in [&pcie, &sxm, &emulated, &other, &bare] {
            for kind in [
                "a100",
                "A100",
                "nvidia",
                "pcie",
                "80gb",
                "a100-sxm4-80gb",
                "sxm4",
                "emulated",
                "other",
                "amd",
                "mi250x",
                "(x)",
                "instinct",
                "intel",
                "-",
                "h100",
                "NVIDIA A100",
            ] {
                assert_eq!(g.is_type(kind), g.is_type_by_text(kind), "{:?} {kind:?}", g.model);
            }
        }
    }

    #[test]
    fn each_vendor_gets_its_variable() {
        let gpus = vec![
            gpu(0, GpuVendor::Nvidia, &["cuda1", "nvml0", "card1"]),
            gpu(1, GpuVendor::Nvidia, &["nvml1"]),
            gpu(2, GpuVendor::Amd, &["rsmi0", "opencl0d0"]),
            gpu(3, GpuVendor::Intel, &["ze4"]),
            gpu(4, GpuVendor::Other, &[]),
        ];
        let env = job_env(&gpus, &[0, 1, 2, 3, 4]);
        let get = |k: &str| env.iter().find(|(n, _)| *n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("BERTH_GPUS"), Some("0,1,2,3,4"));
        assert_eq!(get("GPU_DEVICE_ORDINAL"), Some("0,1,2,3,4"));
        assert_eq!(get("CUDA_VISIBLE_DEVICES"), Some("1,1,4"), "cuda ordinal, else nvml, else berth's");
        assert_eq!(get("ROCR_VISIBLE_DEVICES"), Some("0"));
        assert_eq!(get("ZE_AFFINITY_MASK"), Some("4"));
        let names: Vec<Vec<String>> = gpus.iter().map(Gpu::device_names).collect();
        assert_eq!(names[0], ["nvidia0", "dri/card1"], "NVML's index names /dev/nvidiaN");
        assert_eq!(names[1], ["nvidia1"]);
        assert!(names[2].is_empty() && names[3].is_empty(), "AMD/Intel without DRM devices: none known");
        assert_eq!(names[4], ["nvidia4"], "no OS device: berth's index");
        let amd = gpu(5, GpuVendor::Amd, &["rsmi0", "card2", "renderD129", "cardx"]);
        assert_eq!(amd.device_names(), ["dri/card2", "dri/renderD129"]);
        let env = job_env(&gpus, &[2]);
        assert_eq!(
            env.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
            ["BERTH_GPUS", "GPU_DEVICE_ORDINAL", "ROCR_VISIBLE_DEVICES"]
        );
        assert!(job_env(&gpus, &[]).is_empty(), "no GPUs, no variables");
        // Under a devices cgroup the runtimes number the job's GPUs from 0: a rank with the
        // job's second NVIDIA GPU and its AMD one.
        let env = gpu_env(&gpus, &[0, 1, 2, 4], &[1, 2], true);
        let get = |k: &str| env.iter().find(|(n, _)| *n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("BERTH_GPUS"), Some("1,2"), "berth's names stay the node's");
        assert_eq!(get("CUDA_VISIBLE_DEVICES"), Some("1"));
        assert_eq!(get("ROCR_VISIBLE_DEVICES"), Some("0"));
        assert_eq!(get("GPU_DEVICE_ORDINAL"), Some("1,0"));
        let env = gpu_env(&gpus, &[4], &[4], true);
        assert!(env.contains(&("CUDA_VISIBLE_DEVICES", "0".into())), "{env:?}");
        assert_eq!(gpu_env(&gpus, &[1, 2], &[1, 2], false), job_env(&gpus, &[1, 2]));
        assert!(job_env(&gpus, &[99]).is_empty(), "an index the node lacks is ignored");
    }
}
