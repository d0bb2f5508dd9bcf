//! Where a plan's chips sit in the nodes, and so which of its transfers
//! stay inside a node: one placement for the pipeline sends and the
//! gradient all-reduce alike, in the search and in `--evaluate`.
//!
//! The placement is the frameworks' rank order (Megatron-LM's
//! `tp-dp-pp`, DeepSpeed's pipe/data/model topology): a tensor-parallel
//! group's chips are adjacent, the data-parallel replicas of one stage come
//! next to each other, and the pipeline's stages after one another. Within
//! a run of consecutive stages of one chip type in a group of `d` identical
//! pipelines, stage `q` holds the type's chips `[o_q, o_q + d t_q)` with
//! `o_q = d (t_0 + ... + t_{q-1})`, and its replica `r` the `t_q` chips
//! from `o_q + r t_q`; the run starts on a node's first chip (a different
//! type, or the same type after another, is on other nodes). So a stage's
//! replicas share a node only while `d t_q` chips fit in one from `o_q`,
//! and a send to the next stage stays inside a node only when every
//! replica's pair of chips does. (Before this module the sends assumed each
//! pipeline's stages packed into a node while the all-reduce assumed the
//! replicas were: both cannot hold once `d t p` chips exceed a node.)

use crate::cluster::{ChipType, ClusterSpec};

/// Where one stage sits, as the cost model needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StagePlacement {
    /// Every replica's send to the next stage stays inside a node (false
    /// for the last stage and before a stage of another type).
    pub send_same_node: bool,
    /// The group's replicas of this stage all sit in one node.
    pub replicas_same_node: bool,
}

/// Whether `dp` replicas of a stage of `tp` chips of type `chip`, the first
/// of its run, sit in one node: as [`place`] puts a pipeline's first stage.
pub fn first_stage_one_node(chip: &ChipType, dp: u64, tp: u64) -> bool {
    dp.max(1).saturating_mul(tp.max(1)) <= chip.chips_per_node
}

/// The placement of each stage of a pipeline of `stages` (chip type as an
/// index into `cluster`, tensor-parallel degree), copied `copies` times.
pub fn place(cluster: &ClusterSpec, copies: u64, stages: &[(usize, u64)]) -> Vec<StagePlacement> {
    let d = copies.max(1);
    let mut out = vec![StagePlacement::default(); stages.len()];
    let mut start = 0;
    while start < stages.len() {
        let ty = stages[start].0;
        let end = stages[start..]
            .iter()
            .position(|s| s.0 != ty)
            .map_or(stages.len(), |n| start + n);
        let cpn = cluster.chip_types[ty].chips_per_node.max(1);
        let node = |chip: u64| chip / cpn;
        let mut offset = 0u64;
        for q in start..end {
            let tp = stages[q].1.max(1);
            let span = d.saturating_mul(tp);
            let next = offset.saturating_add(span);
            out[q].replicas_same_node = node(offset) == node(next - 1);
            if q + 1 < end {
                let next_tp = stages[q + 1].1.max(1);
                // A stage of `cpn` chips or more puts the next one's first
                // replica on another node; below that, `d < cpn` replicas.
                out[q].send_same_node =
                    span < cpn && (0..d).all(|r| node(offset + r * tp) == node(next + r * next_tp));
            }
            offset = next;
        }
        start = end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(cpn: &[u64]) -> ClusterSpec {
        let types: String = cpn
            .iter()
            .enumerate()
            .map(|(i, n)| {
                format!(
                    "[[chip_types]]\nname = \"T{i}\"\ncount = {}\nchips_per_node = {n}\n\
                     memory_bytes = 10000000000\npeak_flops = {{ f32 = 1e12, bf16 = 1e12, f16 = 1e12 }}\n\
                     intra_node_bandwidth = 1e10\nnic_bandwidth = 1e9\nefficiency = 0.5\n",
                    n * 8
                )
            })
            .collect();
        ClusterSpec::from_toml_str(&format!("inter_node_bandwidth = 1e9\n{types}")).unwrap()
    }

    fn flags(p: &[StagePlacement]) -> Vec<(bool, bool)> {
        p.iter()
            .map(|s| (s.send_same_node, s.replicas_same_node))
            .collect()
    }

    #[test]
    fn replicas_sit_next_to_each_other_and_stages_after_them() {
        let c = cluster(&[4]);
        // One pipeline of four stages on a node of four: all inside.
        let p = place(&c, 1, &[(0, 1); 4]);
        assert_eq!(
            flags(&p),
            [(true, true), (true, true), (true, true), (false, true)]
        );
        // Four replicas of four stages: a node per stage, sends across.
        let p = place(&c, 4, &[(0, 1); 4]);
        assert_eq!(flags(&p), [(false, true); 4]);
        // Two replicas: stages 0 and 1 share node 0, 2 and 3 node 1.
        let p = place(&c, 2, &[(0, 1); 4]);
        assert_eq!(
            flags(&p),
            [(true, true), (false, true), (true, true), (false, true)]
        );
        // Three replicas: stage 1 straddles nodes 0 and 1.
        let p = place(&c, 3, &[(0, 1); 2]);
        assert_eq!(flags(&p), [(false, true), (false, false)]);
        // Eight replicas of tp 1 span two nodes.
        let p = place(&c, 8, &[(0, 1)]);
        assert_eq!(flags(&p), [(false, false)]);
    }

    #[test]
    fn each_run_of_a_type_starts_on_its_own_node() {
        let c = cluster(&[4, 2]);
        let p = place(&c, 1, &[(0, 2), (0, 2), (1, 1), (1, 1), (0, 4)]);
        assert_eq!(
            flags(&p),
            [
                (true, true),
                (false, true),
                (true, true),
                (false, true),
                (false, true)
            ]
        );
    }
}
