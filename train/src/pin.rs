//! Gives each simulated device (rank) its own fixed share of the CPU, as a
//! real job gives each rank its own chip: the rank's process is bound to a
//! disjoint set of cores before any plugin starts its threads, so they all
//! inherit it (and thread pools size themselves to it).

/// The cores this process may run on now.
pub fn allowed_cores() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set, and
    // sched_getaffinity writes at most size_of::<cpu_set_t>() bytes into it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

/// The share of `cores` that local rank `local_rank` of `local_world`
/// gets: a contiguous, disjoint slice when there are enough cores (the
/// first ranks take one more when they do not divide evenly), else one
/// core shared round-robin.
pub fn share(cores: &[usize], local_rank: usize, local_world: usize) -> Vec<usize> {
    if cores.is_empty() || local_world == 0 {
        return cores.to_vec();
    }
    if local_world > cores.len() {
        return vec![cores[local_rank % cores.len()]];
    }
    let (base, extra) = (cores.len() / local_world, cores.len() % local_world);
    let start = local_rank * base + local_rank.min(extra);
    let len = base + usize::from(local_rank < extra);
    cores[start..start + len].to_vec()
}

/// Binds the calling thread (and every thread it starts later) to `cores`.
pub fn pin(cores: &[usize]) -> std::io::Result<()> {
    // SAFETY: as above; CPU_SET only writes inside the set for indices
    // below CPU_SETSIZE, which the filter guarantees.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cores.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
            libc::CPU_SET(c, &mut set);
        }
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_are_disjoint_and_cover() {
        let cores: Vec<usize> = (0..5).collect();
        let all: Vec<usize> = (0..2).flat_map(|r| share(&cores, r, 2)).collect();
        assert_eq!(all, cores);
        assert_eq!(share(&cores, 0, 2), vec![0, 1, 2]);
        assert_eq!(share(&[0, 1], 2, 3), vec![0]);
        assert!(!allowed_cores().is_empty());
    }
}
