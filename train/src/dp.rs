//! The data-parallel gradient reduction's groups. Each unit of the model
//! (the embedding, each half block, the head) is held by one rank of every
//! replica; ranks holding the same units form one sub-communicator, and a
//! rank sums the packed gradients of those units over it in one call. With
//! replicas split differently (mixed groups), a rank may sit in several.

use std::ops::Range;

use polychip_comm::collectives::Communicator;

use crate::config::ModelConfig;
use crate::error::Result;
use crate::plan::Role;

/// A unit of the model as ranks hold it: 0 is the embedding, `1..=2 *
/// layers` the half blocks (unit `h + 1` is half `h`, see
/// [`crate::params::Cut`]), `2 * layers + 1` the final norm and head; with
/// the part of a half held ([`crate::params::StageRange::held`]; nothing
/// for the ends). Ranks hold the same parameters when they hold the same
/// units.
type UnitKey = (usize, Range<usize>);

/// The units `role` holds, in model order.
fn role_units(role: &Role, cfg: &ModelConfig) -> Vec<UnitKey> {
    let mut out = Vec::new();
    if role.range.embed {
        out.push((0, 0..0));
    }
    for half in role.range.halves() {
        let cols = role.range.held(half, crate::params::half_width(cfg, half));
        out.push((half + 1, cols));
    }
    if role.range.head {
        out.push((2 * cfg.layers + 1, 0..0));
    }
    out
}

fn holders(roles: &[Role], unit: &UnitKey, cfg: &ModelConfig) -> Vec<usize> {
    roles
        .iter()
        .filter(|r| role_units(r, cfg).contains(unit))
        .map(|r| r.rank)
        .collect()
}

/// Groups of ranks that hold the same parameters: for each unit, the ranks
/// holding it; units with the same holders share one gradient reduction.
fn holder_sets(roles: &[Role], cfg: &ModelConfig) -> Vec<Vec<usize>> {
    let mut units: Vec<UnitKey> = roles.iter().flat_map(|r| role_units(r, cfg)).collect();
    units.sort_by_key(|(u, c)| (*u, c.start, c.end));
    units.dedup();
    let mut sets: Vec<Vec<usize>> = Vec::new();
    for unit in &units {
        let h = holders(roles, unit, cfg);
        if !sets.contains(&h) {
            sets.push(h);
        }
    }
    sets
}

/// The units `role` holds, each with its parameters' index range in
/// [`Stage::params`] (the order of `params::stage_params`: embedding, 5 per
/// attention half and 4 per feed-forward half, one fewer for a half held
/// from a part past its first, final norm and head).
pub(crate) fn unit_params(role: &Role, cfg: &ModelConfig) -> Vec<(UnitKey, Range<usize>)> {
    let mut at = 0;
    role_units(role, cfg)
        .into_iter()
        .map(|unit| {
            let n = match unit.0 {
                0 => 1,
                u if u == 2 * cfg.layers + 1 => 2,
                u => crate::model::half_param_count(&role.range, u - 1),
            };
            at += n;
            (unit, at - n..at)
        })
        .collect()
}

/// One of a rank's gradient reductions.
#[derive(Debug)]
pub struct ReductionGroup {
    /// Its ranks' communicator.
    pub comm: Communicator,
    /// The stage's parameters (indices into [`crate::model::Stage::params`],
    /// consecutive) that every rank of the group holds.
    pub params: Range<usize>,
    /// The group's world ranks, in the communicator's rank order.
    pub members: Vec<usize>,
}

/// This rank's reduction groups. A collective call: every rank of `world`
/// calls it with the same roles.
pub fn reduction_groups(
    world: &mut Communicator,
    roles: &[Role],
    cfg: &ModelConfig,
) -> Result<Vec<ReductionGroup>> {
    let rank = world.rank();
    let mut groups = Vec::new();
    for set in holder_sets(roles, cfg) {
        if set.len() < 2 {
            continue;
        }
        let member = set.contains(&rank);
        let color = if member { 0 } else { 1 + rank as u32 };
        let mut sub = world.split(color, rank as u32)?;
        if !member {
            continue;
        }
        sub.set_deterministic(true);
        let me = &roles[rank];
        let ranges: Vec<Range<usize>> = unit_params(me, cfg)
            .into_iter()
            .filter(|(unit, _)| holders(roles, unit, cfg) == set)
            .map(|(_, r)| r)
            .collect();
        // Units with the same holders are consecutive: a rank holds one
        // contiguous range, and a replica holds every unit once.
        debug_assert!(ranges.windows(2).all(|w| w[0].end == w[1].start));
        if let (Some(first), Some(last)) = (ranges.first(), ranges.last()) {
            groups.push(ReductionGroup {
                comm: sub,
                params: first.start..last.end,
                members: set,
            });
        }
    }
    Ok(groups)
}

/// A sharded optimizer step as one rank runs it.
#[derive(Debug)]
pub struct Sharding {
    /// For each of the rank's reduction groups, its elements' shares, one
    /// per member in the group's order.
    pub shares: Vec<Vec<Range<usize>>>,
    /// The elements of the rank's stage that other ranks step (sorted).
    pub others: Vec<Range<usize>>,
}

impl Sharding {
    /// The rank's sharding under `plan`, over its reduction `groups` (from
    /// [`reduction_groups`] with the same `roles`), or `None` when the plan
    /// does not shard the optimizer step. Each member is weighted by its
    /// stage's `optimizer_weight` (a validated plan gives one on every
    /// stage).
    pub fn new(
        plan: &crate::plan::TrainPlan,
        groups: &[ReductionGroup],
        roles: &[Role],
        stage: &crate::model::Stage,
    ) -> Option<Sharding> {
        if !plan.shards_optimizer() {
            return None;
        }
        let shares: Vec<Vec<Range<usize>>> = groups
            .iter()
            .map(|g| {
                let weights: Vec<f64> = g
                    .members
                    .iter()
                    .map(|&r| roles[r].optimizer_weight.unwrap_or(1.0))
                    .collect();
                self::shares(stage.elements(g.params.clone()), &weights)
            })
            .collect();
        let mut others: Vec<Range<usize>> = shares
            .iter()
            .zip(groups)
            .flat_map(|(pieces, g)| {
                let me = g.comm.rank();
                pieces
                    .iter()
                    .enumerate()
                    .filter(move |&(i, p)| i != me && !p.is_empty())
                    .map(|(_, p)| p.clone())
            })
            .collect();
        others.sort_by_key(|r| r.start);
        Some(Sharding { shares, others })
    }
}

/// Elements per share boundary: shares start on 64-byte lines of f32.
const SHARE_ALIGN: usize = 16;

/// A sharded optimizer step's shares of one reduction group: its elements
/// `elems` cut into consecutive pieces, one per member in order, in
/// proportion to the members' `weights` (each device's optimizer speed).
/// Boundaries fall on multiples of 16 elements from the start; a piece
/// may be empty when its weight is tiny.
pub fn shares(elems: Range<usize>, weights: &[f64]) -> Vec<Range<usize>> {
    let total: f64 = weights.iter().sum();
    let len = elems.len();
    let mut out = Vec::with_capacity(weights.len());
    let (mut at, mut cum) = (elems.start, 0.0);
    for (i, w) in weights.iter().enumerate() {
        cum += w;
        let end = if i + 1 == weights.len() {
            elems.end
        } else {
            let ideal = (len as f64 * cum / total).round() as usize;
            let aligned = (ideal + SHARE_ALIGN / 2) / SHARE_ALIGN * SHARE_ALIGN;
            (elems.start + aligned.min(len)).max(at)
        };
        out.push(at..end);
        at = end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_follow_the_weights_and_cover_the_group() {
        let s = shares(100..1100, &[15.0, 1.0]);
        assert_eq!(s, vec![100..1044, 1044..1100]);
        assert_eq!(
            shares(0..1000, &[1.0, 1.0, 1.0]),
            vec![0..336, 336..672, 672..1000]
        );
        // A tiny weight may get nothing; the pieces still cover the range.
        let s = shares(0..40, &[1000.0, 1.0]);
        assert_eq!(s, vec![0..40, 40..40]);
        let s = shares(7..9, &[1.0, 1.0]);
        assert_eq!((s[0].start, s[1].end), (7, 9));
        assert!(s.windows(2).all(|w| w[0].end == w[1].start));
    }
    use crate::params::stage_params;
    use crate::plan::TrainPlan;

    #[test]
    fn replicas_of_a_width_cut_reduce_each_part_with_its_own() {
        let cfg = ModelConfig::preset("tiny").unwrap();
        let plan = TrainPlan::parse_stages(
            "ferrite=0..1.5+20,cobalt=1.5+20..1.5+90,ferrite=1.5+90..4",
            2,
            1,
            4,
        )
        .unwrap();
        plan.validate(&cfg, 8).unwrap();
        let roles = plan.roles();
        // Each stage's ranks over the two replicas, and nothing else: the
        // parts of block 1's feed-forward half are three units.
        let mut sets = holder_sets(&roles, &cfg);
        sets.sort();
        assert_eq!(sets, vec![vec![0, 3], vec![1, 4], vec![2, 5]]);
        for role in &roles {
            let units = unit_params(role, &cfg);
            let specs = stage_params(&cfg, &role.range);
            assert_eq!(units.last().unwrap().1.end, specs.len());
        }
        let middle = unit_params(&roles[1], &cfg);
        assert_eq!(middle, vec![((4, 20..90), 0..3)]);
        // Two groups split differently are refused, not reduced wrongly.
        let mut two = plan.clone();
        two.groups
            .push(TrainPlan::single("ferrite", 4, 1, 4).groups[0].clone());
        two.groups[0].copies = 1;
        let e = two.validate(&cfg, 8).unwrap_err().to_string();
        assert!(e.contains("a plan of one group"), "{e}");
    }

    #[test]
    fn units_map_onto_the_stage_parameter_order() {
        let cfg = ModelConfig::preset("tiny").unwrap();
        let plan =
            TrainPlan::parse_stages("ferrite=0..1,cobalt=1..3,ferrite=3..4", 1, 1, 4).unwrap();
        for role in plan.roles() {
            let specs = stage_params(&cfg, &role.range);
            let units = unit_params(&role, &cfg);
            assert_eq!(units.last().unwrap().1.end, specs.len());
            for ((unit, _), range) in units {
                for p in &specs[range] {
                    let want = match unit {
                        0 => "tok_embeddings".to_string(),
                        u if u == 2 * cfg.layers + 1 => String::new(),
                        u if u % 2 == 1 => format!("layers.{}.attention", (u - 1) / 2),
                        u => format!("layers.{}.f", (u - 1) / 2),
                    };
                    if unit == 2 * cfg.layers + 1 {
                        assert!(["norm.weight", "output.weight"].contains(&p.name.as_str()));
                    } else {
                        assert!(p.name.starts_with(&want), "{} in unit {unit}", p.name);
                    }
                }
            }
        }
    }
}
