//! Clusters shared by the planner's tests and benchmarks (the `types`
//! benchmark includes this file).

use polychip_planner::cluster::ClusterSpec;

/// The 3-vendor example cluster, `examples/clusters/china-mobile-3-vendor.toml`.
pub fn example_cluster() -> ClusterSpec {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/clusters/china-mobile-3-vendor.toml"
    );
    ClusterSpec::load(path.as_ref()).expect("the example cluster parses")
}

#[allow(dead_code)]
/// `n` chip types of 64 chips (8 per node) derived from the 3-vendor
/// example, with their peak FLOP/s and memory varied per copy.
pub fn cluster_of(n: usize) -> ClusterSpec {
    let base = example_cluster();
    let mut out = base.clone();
    out.chip_types = (0..n)
        .map(|i| {
            let mut c = base.chip_types[i % base.chip_types.len()].clone();
            let f = 1.0 + 0.07 * i as f64;
            c.name = format!("{}-{i}", c.name);
            c.count = 64;
            c.peak_flops.f32 *= f;
            c.peak_flops.bf16 *= f;
            c.peak_flops.f16 *= f;
            c.memory_bytes += (i as u64) << 30;
            c
        })
        .collect();
    out
}
