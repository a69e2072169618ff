//! A job's core binding on this node: the bound cores as host CPUs, for `BERTH_BINDING`
//! (OpenMP `OMP_PLACES` syntax), `BERTH_BINDING_CORES` and the `set` mode's affinity.

use crate::cpumap::CpuMap;
use berth_core::topology::Topology;
use berth_core::CpuSet;

/// A binding from the controller this node cannot carry out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BindingError {
    #[error("bound core {socket},{core} does not exist on this node")]
    NoSuchCore { socket: u32, core: u32 },
    /// `pus` the core's PUs, `job` the job's (kernel list format).
    #[error("bound core {socket},{core} (PUs {pus}) has no CPU in the job's allocation {job}")]
    OutsideJob { socket: u32, core: u32, pus: String, job: String },
}

/// For the launch path, which gathers errors as text.
impl From<BindingError> for String {
    fn from(e: BindingError) -> String {
        e.to_string()
    }
}

/// The bound cores, in the order the allocation names them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HostBinding {
    /// Grid Engine logical `(socket, core)` of each bound core.
    pub cores: Vec<(u32, u32)>,
    /// The host CPUs of each bound core (one OpenMP place per core).
    pub places: Vec<CpuSet>,
}

impl HostBinding {
    /// Map each `(socket, core)` of `binding` to its PUs in `topo` that the job holds
    /// (`job_pus`), then to host CPUs through `map`. The binding comes from the controller,
    /// so a core this node lacks, or one outside the job's CPUs, is an error, not a panic.
    pub fn resolve(
        topo: &Topology,
        map: &CpuMap,
        binding: &[(u32, u32)],
        job_pus: &CpuSet,
    ) -> Result<Self, BindingError> {
        let mut places = Vec::with_capacity(binding.len());
        for &(socket, core) in binding {
            let Some(core_ref) = topo.core_index(socket, core).and_then(|i| topo.cores.get(i)) else {
                return Err(BindingError::NoSuchCore { socket, core });
            };
            // With --threads a job may hold only some PUs of a bound core; never name others.
            let pus: CpuSet = core_ref.pus.iter().copied().filter(|&p| job_pus.contains(p)).collect();
            let host = map.cpus(&pus);
            if host.is_empty() {
                return Err(BindingError::OutsideJob {
                    socket,
                    core,
                    pus: CpuSet::from_iter_u32(core_ref.pus.iter().copied()).to_list(),
                    job: job_pus.to_list(),
                });
            }
            places.push(host);
        }
        Ok(HostBinding { cores: binding.to_vec(), places })
    }

    pub fn is_empty(&self) -> bool {
        self.cores.is_empty()
    }

    /// `BERTH_BINDING`: one OpenMP place per bound core listing its host CPUs, e.g. `{0,1},{2,3}`.
    /// Two PUs of an emulated core on one host CPU (round-robin map) appear once.
    pub fn omp_places(&self) -> String {
        let place = |s: &CpuSet| format!("{{{}}}", s.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(","));
        self.places.iter().map(place).collect::<Vec<_>>().join(",")
    }

    /// `BERTH_BINDING_CORES`: space-separated `socket,core` pairs.
    pub fn cores_env(&self) -> String {
        self.cores.iter().map(|(s, c)| format!("{s},{c}")).collect::<Vec<_>>().join(" ")
    }

    /// Every host CPU of the bound cores: the `set` mode's CPU affinity.
    pub fn host_cpus(&self) -> CpuSet {
        let mut all = CpuSet::new();
        self.places.iter().for_each(|p| all.union_with(p));
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(list: &str) -> CpuSet {
        CpuSet::parse_list(list).unwrap()
    }

    /// 2 sockets x 2 cores x 2 PUs: socket 0 has PUs 0-3, socket 1 PUs 4-7.
    fn small() -> Topology {
        Topology::uniform(2, 1, 2, 2, 1 << 30)
    }

    #[test]
    fn places_with_identity_map() {
        let topo = small();
        let map = CpuMap::identity(&topo, set("0-7"), set("0-1"));
        let b = HostBinding::resolve(&topo, &map, &[(0, 1), (1, 0)], &set("0-7")).unwrap();
        assert_eq!(b.omp_places(), "{2,3},{4,5}");
        assert_eq!(b.cores_env(), "0,1 1,0");
        assert_eq!(b.host_cpus().to_list(), "2-5");
    }

    #[test]
    fn places_with_round_robin_map() {
        // 8 emulated PUs dealt onto host CPUs 0-2: PU i -> CPU i % 3.
        let topo = small();
        let map = CpuMap::round_robin(&topo, set("0-2"), set("0"));
        let b = HostBinding::resolve(&topo, &map, &[(0, 0), (1, 1)], &set("0-7")).unwrap();
        assert_eq!(b.omp_places(), "{0,1},{0,1}");
        assert_eq!(b.cores_env(), "0,0 1,1");
        assert_eq!(b.host_cpus().to_list(), "0-1");
        // Onto one host CPU: both PUs of a core collapse to one CPU in the place.
        let map1 = CpuMap::round_robin(&topo, set("1"), set("0"));
        let b = HostBinding::resolve(&topo, &map1, &[(1, 0)], &set("4-5")).unwrap();
        assert_eq!(b.omp_places(), "{1}");
    }

    #[test]
    fn only_the_jobs_pus_of_a_core() {
        let topo = small();
        let map = CpuMap::identity(&topo, set("0-7"), set("0-1"));
        let b = HostBinding::resolve(&topo, &map, &[(0, 0)], &set("1")).unwrap();
        assert_eq!(b.omp_places(), "{1}");
    }

    #[test]
    fn bad_cores_are_errors() {
        let topo = small();
        let map = CpuMap::identity(&topo, set("0-7"), set("0-1"));
        let e = HostBinding::resolve(&topo, &map, &[(0, 2)], &set("0-7")).unwrap_err();
        assert_eq!(e, BindingError::NoSuchCore { socket: 0, core: 2 });
        assert_eq!(e.to_string(), "bound core 0,2 does not exist on this node");
        let e = HostBinding::resolve(&topo, &map, &[(2, 0)], &set("0-7")).unwrap_err().to_string();
        assert!(e.contains("2,0 does not exist"), "{e}");
        let e = HostBinding::resolve(&topo, &map, &[(1, 1)], &set("0-3")).unwrap_err();
        assert_eq!(e.to_string(), "bound core 1,1 (PUs 6-7) has no CPU in the job's allocation 0-3");
        let none = HostBinding::resolve(&topo, &map, &[], &set("0-3")).unwrap();
        assert!(none.is_empty() && none.omp_places().is_empty() && none.cores_env().is_empty());
    }
}
