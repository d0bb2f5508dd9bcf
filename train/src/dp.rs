//! The data-parallel gradient reduction's groups. Each unit of the model
//! (the embedding, each block, the head) is held by one rank of every
//! replica; ranks holding the same units form one sub-communicator, and a
//! rank sums the packed gradients of those units over it in one call. With
//! replicas split differently (mixed groups), a rank may sit in several.

use std::ops::Range;

use polychip_comm::collectives::Communicator;

use crate::error::Result;
use crate::model::Stage;
use crate::plan::Role;

/// Groups of ranks that hold the same parameters: for each unit (the
/// embedding, each block, the head), the ranks holding it; units with the
/// same holders share one gradient reduction.
fn holder_sets(roles: &[Role], layers: usize) -> Vec<Vec<usize>> {
    let mut sets: Vec<Vec<usize>> = Vec::new();
    for unit in 0..layers + 2 {
        let holders: Vec<usize> = roles
            .iter()
            .filter(|r| match unit {
                0 => r.range.embed,
                u if u == layers + 1 => r.range.head,
                u => r.range.layers().contains(&(u - 1)),
            })
            .map(|r| r.rank)
            .collect();
        if !sets.contains(&holders) {
            sets.push(holders);
        }
    }
    sets
}

/// Which of a stage's parameters a unit covers: indices into `stage.params()`.
fn params_of_set(stage: &Stage, roles: &[Role], set: &[usize], layers: usize) -> Vec<usize> {
    let mut idx = Vec::new();
    for (i, p) in stage.params().iter().enumerate() {
        let unit = if p.spec.name.starts_with("tok_embeddings") {
            0
        } else if let Some(rest) = p.spec.name.strip_prefix("layers.") {
            1 + rest
                .split('.')
                .next()
                .and_then(|n| n.parse::<usize>().ok())
                .expect("block parameter names carry their block")
        } else {
            layers + 1
        };
        let holders: Vec<usize> = roles
            .iter()
            .filter(|r| match unit {
                0 => r.range.embed,
                u if u == layers + 1 => r.range.head,
                u => r.range.layers().contains(&(u - 1)),
            })
            .map(|r| r.rank)
            .collect();
        if holders == set {
            idx.push(i);
        }
    }
    idx
}

/// This rank's reduction groups: a communicator and the range of its
/// stage's parameters (consecutive) that the group's ranks all hold. A
/// collective call: every rank of `world` calls it with the same roles.
pub fn reduction_groups(
    world: &mut Communicator,
    roles: &[Role],
    stage: &Stage,
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
        let idx = params_of_set(stage, roles, &set, layers);
        // Units with the same holders are consecutive: a rank holds one
        // contiguous range, and a replica holds every unit once.
        debug_assert!(idx.windows(2).all(|w| w[1] == w[0] + 1));
        if let (Some(&first), Some(&last)) = (idx.first(), idx.last()) {
            groups.push((sub, first..last + 1));
        }
    }
    Ok(groups)
}
