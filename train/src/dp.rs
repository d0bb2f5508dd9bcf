//! The data-parallel gradient reduction's groups. Each unit of the model
//! (the embedding, each block, the head) is held by one rank of every
//! replica; ranks holding the same units form one sub-communicator, and a
//! rank sums the packed gradients of those units over it in one call. With
//! replicas split differently (mixed groups), a rank may sit in several.

use std::ops::Range;

use polychip_comm::collectives::Communicator;

use crate::error::Result;
use crate::params::BLOCK_PARAMS;
use crate::plan::Role;

/// The units of a model of `layers` blocks: 0 is the embedding, `1..=layers`
/// the blocks, `layers + 1` the final norm and head.
fn holders(roles: &[Role], unit: usize, layers: usize) -> Vec<usize> {
    roles
        .iter()
        .filter(|r| holds(r, unit, layers))
        .map(|r| r.rank)
        .collect()
}

fn holds(r: &Role, unit: usize, layers: usize) -> bool {
    match unit {
        0 => r.range.embed,
        u if u == layers + 1 => r.range.head,
        u => r.range.layers().contains(&(u - 1)),
    }
}

/// Groups of ranks that hold the same parameters: for each unit, the ranks
/// holding it; units with the same holders share one gradient reduction.
fn holder_sets(roles: &[Role], layers: usize) -> Vec<Vec<usize>> {
    let mut sets: Vec<Vec<usize>> = Vec::new();
    for unit in 0..layers + 2 {
        let h = holders(roles, unit, layers);
        if !sets.contains(&h) {
            sets.push(h);
        }
    }
    sets
}

/// The units `role` holds, each with its parameters' index range in
/// [`Stage::params`] (the order of `params::stage_params`: embedding, 9 per
/// block, final norm and head).
fn unit_params(role: &Role, layers: usize) -> Vec<(usize, Range<usize>)> {
    let mut out = Vec::new();
    let mut at = 0;
    let mut push = |unit: usize, n: usize| {
        out.push((unit, at..at + n));
        at += n;
    };
    if role.range.embed {
        push(0, 1);
    }
    for block in role.range.layers() {
        push(block + 1, BLOCK_PARAMS.len());
    }
    if role.range.head {
        push(layers + 1, 2);
    }
    out
}

/// This rank's reduction groups: a communicator and the range of its
/// stage's parameters (consecutive) that the group's ranks all hold. A
/// collective call: every rank of `world` calls it with the same roles.
pub fn reduction_groups(
    world: &mut Communicator,
    roles: &[Role],
    layers: usize,
) -> Result<Vec<(Communicator, Range<usize>)>> {
    let rank = world.rank();
    let mut groups = Vec::new();
    for set in holder_sets(roles, layers) {
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
        let ranges: Vec<Range<usize>> = unit_params(me, layers)
            .into_iter()
            .filter(|(unit, _)| holders(roles, *unit, layers) == set)
            .map(|(_, r)| r)
            .collect();
        // Units with the same holders are consecutive: a rank holds one
        // contiguous range, and a replica holds every unit once.
        debug_assert!(ranges.windows(2).all(|w| w[0].end == w[1].start));
        if let (Some(first), Some(last)) = (ranges.first(), ranges.last()) {
            groups.push((sub, first.start..last.end));
        }
    }
    Ok(groups)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ModelConfig;
    use crate::params::stage_params;
    use crate::plan::TrainPlan;

    #[test]
    fn units_map_onto_the_stage_parameter_order() {
        let cfg = ModelConfig::preset("tiny").unwrap();
        let plan =
            TrainPlan::parse_stages("ferrite=0..1,cobalt=1..3,ferrite=3..4", 1, 1, 4).unwrap();
        for role in plan.roles(&cfg) {
            let specs = stage_params(&cfg, &role.range);
            let units = unit_params(&role, cfg.layers);
            assert_eq!(units.last().unwrap().1.end, specs.len());
            for (unit, range) in units {
                for p in &specs[range] {
                    let want = match unit {
                        0 => "tok_embeddings".to_string(),
                        u if u == cfg.layers + 1 => String::new(),
                        u => format!("layers.{}.", u - 1),
                    };
                    if unit == cfg.layers + 1 {
                        assert!(["norm.weight", "output.weight"].contains(&p.name.as_str()));
                    } else {
                        assert!(p.name.starts_with(&want), "{} in unit {unit}", p.name);
                    }
                }
            }
        }
    }
}
