//! CPU masks for the processes the agent starts (the starting itself is [`crate::step::rank`]'s:
//! a `clone(CLONE_VM | CLONE_VFORK)` child, for batch scripts and ranks alike).

/// A CPU beyond what the kernel's affinity mask holds (CPU_SETSIZE).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("CPU {0} is beyond the affinity mask's {size} CPUs", size = libc::CPU_SETSIZE)]
pub struct BeyondMask(pub u32);

/// For the launch paths, which gather errors as text.
impl From<BeyondMask> for String {
    fn from(e: BeyondMask) -> String {
        e.to_string()
    }
}

/// A kernel CPU mask of `cpus`, built before the fork. Errors for CPUs beyond CPU_SETSIZE.
pub fn cpu_mask(cpus: &berth_core::CpuSet) -> Result<libc::cpu_set_t, BeyondMask> {
    // SAFETY: cpu_set_t is a plain bit array; all zeroes is the empty set.
    let mut mask: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for cpu in cpus.iter() {
        if cpu as usize >= libc::CPU_SETSIZE as usize {
            return Err(BeyondMask(cpu));
        }
        // SAFETY: cpu is below CPU_SETSIZE, checked above.
        unsafe { libc::CPU_SET(cpu as usize, &mut mask) };
    }
    Ok(mask)
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_core::CpuSet;

    #[test]
    fn cpu_mask_bits() {
        let mask = cpu_mask(&CpuSet::parse_list("0,2-3").unwrap()).unwrap();
        // SAFETY: in range of the mask.
        let on: Vec<usize> = (0..8).filter(|&c| unsafe { libc::CPU_ISSET(c, &mask) }).collect();
        assert_eq!(on, [0, 2, 3]);
        let e = cpu_mask(&CpuSet::parse_list("1024").unwrap()).unwrap_err();
        assert_eq!(e, BeyondMask(1024));
        assert_eq!(e.to_string(), "CPU 1024 is beyond the affinity mask's 1024 CPUs");
    }
}
