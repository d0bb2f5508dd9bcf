//! The example cluster files in `examples/clusters/` parse and validate,
//! and have the shapes issue 5 asks for.

use std::path::PathBuf;

use polychip_planner::cluster::ClusterSpec;
use polychip_planner::settings::Dtype;

fn load(name: &str) -> ClusterSpec {
    let path: PathBuf = [
        env!("CARGO_MANIFEST_DIR"),
        "..",
        "examples",
        "clusters",
        name,
    ]
    .iter()
    .collect();
    ClusterSpec::load(&path).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn h2_like_has_1024_chips_of_4_types_that_do_not_rank_consistently() {
    let c = load("h2-like-1024.toml");
    assert_eq!(c.total_chips(), 1024);
    assert_eq!(c.chip_types.len(), 4);
    // No type dominates another on both sustained speed and memory.
    for a in &c.chip_types {
        for b in &c.chip_types {
            let faster = a.sustained_flops(Dtype::Bf16) > b.sustained_flops(Dtype::Bf16);
            if faster {
                assert!(
                    a.memory_bytes < b.memory_bytes,
                    "{} dominates {}",
                    a.name,
                    b.name
                );
            }
        }
    }
}

#[test]
fn china_mobile_has_three_vendors() {
    let c = load("china-mobile-3-vendor.toml");
    assert_eq!(c.chip_types.len(), 3);
    assert_eq!(c.total_chips(), 768);
    assert!(c.inter_node_bandwidth > 0.0);
}
