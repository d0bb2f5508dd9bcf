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

/// The ways `kinds.len()` ranks (device `i` of kind `kinds[i]`) can take
/// `cores` that differ in which kinds share a core or get more cores:
/// device orders (each a permutation of `0..kinds.len()`; the device at
/// place `p` takes [`share`]`(cores, p, n)`), the first the listed order,
/// one per distinct pairing (orders that differ only in which core a group
/// gets, or swap devices of one kind, are one). `None` when there are more
/// than `limit` (or more than 8 devices: too many orders to try).
pub fn distinct_orders(kinds: &[&str], cores: &[usize], limit: usize) -> Option<Vec<Vec<usize>>> {
    let n = kinds.len();
    if n > 8 {
        return None;
    }
    // What an order gives: each core share's size and the kinds on it,
    // sorted, so that orders equal up to relabelled cores compare equal.
    let key = |order: &[usize]| -> Vec<(usize, Vec<&str>)> {
        let mut groups: Vec<(Vec<usize>, Vec<&str>)> = Vec::new();
        for (place, &d) in order.iter().enumerate() {
            let mine = share(cores, place, n);
            match groups.iter_mut().find(|(c, _)| *c == mine) {
                Some((_, k)) => k.push(kinds[d]),
                None => groups.push((mine, vec![kinds[d]])),
            }
        }
        let mut key: Vec<(usize, Vec<&str>)> = groups
            .into_iter()
            .map(|(c, mut k)| {
                k.sort_unstable();
                (c.len(), k)
            })
            .collect();
        key.sort();
        key
    };
    let mut seen = Vec::new();
    let mut orders = Vec::new();
    let mut order: Vec<usize> = (0..n).collect();
    // Heap's algorithm, iteratively; the identity first.
    let mut c = vec![0usize; n];
    let mut i = 0;
    let mut visit = |order: &[usize]| -> bool {
        let k = key(order);
        if !seen.contains(&k) {
            seen.push(k);
            orders.push(order.to_vec());
        }
        orders.len() <= limit
    };
    if !visit(&order) {
        return None;
    }
    while i < n {
        if c[i] < i {
            order.swap(if i % 2 == 0 { 0 } else { c[i] }, i);
            if !visit(&order) {
                return None;
            }
            c[i] += 1;
            i = 0;
        } else {
            c[i] = 0;
            i += 1;
        }
    }
    Some(orders)
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

    #[test]
    fn distinct_orders_are_one_per_pairing() {
        // Three kinds on two cores: which one is alone.
        let orders = distinct_orders(&["c", "f", "o"], &[0, 1], 10).unwrap();
        assert_eq!(orders[0], [0, 1, 2]);
        let alone: Vec<usize> = orders.iter().map(|o| o[1]).collect();
        let mut sorted = alone.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, [0, 1, 2], "{orders:?}");
        // Two of one kind: alone is the other kind or one of the pair.
        assert_eq!(
            distinct_orders(&["f", "f", "c"], &[0, 1], 10)
                .unwrap()
                .len(),
            2
        );
        // A core each: nothing to choose.
        assert_eq!(distinct_orders(&["a", "b"], &[0, 1], 10).unwrap().len(), 1);
        // Three on four cores: who gets the second core.
        assert_eq!(
            distinct_orders(&["a", "b", "c"], &[0, 1, 2, 3], 10)
                .unwrap()
                .len(),
            3
        );
        // Four kinds on two cores: three pairings of pairs.
        assert_eq!(
            distinct_orders(&["a", "b", "c", "d"], &[0, 1], 10)
                .unwrap()
                .len(),
            3
        );
        // Over the limit, or too many devices.
        assert!(distinct_orders(&["a", "b", "c", "d", "e"], &[0, 1], 6).is_none());
        assert!(distinct_orders(&["a"; 9], &[0, 1], 100).is_none());
    }
}
