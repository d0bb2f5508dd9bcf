//! Dealing the batch again while training (`polychip train
//! --rebalance-every N`): data-parallel replicas of one stage each measure
//! how long their passes take per sequence, and every `N` steps every rank
//! deals the step's sequences again in proportion to the measured speeds,
//! so that a replica whose chip runs slower than it was profiled (a noisy
//! neighbour, a clock that throttles, a profile taken in a fast minute)
//! stops holding back the others.
//!
//! The plan's deal is the search's prediction from a profile; the
//! measurement here is of the run itself. Every rank computes the same new
//! deal from the same all-reduced figures, so the ranks agree without a
//! coordinator. Each replica keeps its micro-batch size (so its memory is
//! unchanged) and at least one sequence; only how many micro-batches it
//! runs, the size of its last one, and where its sequences start in the
//! global batch change. The step's sequences, and so its gradient, stay the
//! same; only how they are grouped changes, so the bits of the run depend
//! on the timings (off by default).

use crate::error::{Result, TrainError};
use crate::plan::Role;
use crate::trace::Span;

/// A new deal is taken only when it is predicted to shorten the step by
/// more than this fraction, so that noise in the measurement does not move
/// sequences back and forth.
pub const MIN_GAIN: f64 = 0.05;

/// The fewest steps whose median speed a deal is made from.
pub const MIN_HISTORY: usize = 6;

/// Checks that `roles` can be dealt again: two replicas or more, each of
/// one stage.
pub fn check(roles: &[Role]) -> Result<()> {
    let replicas = roles.iter().map(|r| r.replica).max().map_or(0, |m| m + 1);
    if replicas < 2 {
        return Err(TrainError::Plan(
            "--rebalance-every deals the batch between data-parallel replicas; this plan has one"
                .into(),
        ));
    }
    if let Some(r) = roles.iter().find(|r| r.stages > 1) {
        return Err(TrainError::Plan(format!(
            "--rebalance-every applies to plans whose replicas are one stage each; replica {} \
             is a pipeline of {} stages",
            r.replica, r.stages
        )));
    }
    Ok(())
}

/// The seconds this rank's passes took among `spans` (its forward and
/// backward passes, the weights' gradients included) since `since_us`.
pub fn busy_seconds(spans: &[Span], since_us: f64) -> f64 {
    spans
        .iter()
        .rev()
        .take_while(|s| s.start_us >= since_us)
        .filter(|s| matches!(s.cat, "forward" | "backward" | crate::pipeline::WEIGHTS))
        .map(|s| s.dur_us / 1e6)
        .sum()
}

/// The deal of `total` sequences over replicas that take `per_sequence[r]`
/// seconds a sequence, each at least one: the one whose slowest replica
/// finishes first (sequences given one at a time to the replica that
/// would then finish first; ties to the lower replica).
pub fn deal(per_sequence: &[f64], total: usize) -> Vec<usize> {
    let n = per_sequence.len();
    let mut out = vec![1usize; n];
    for _ in n..total {
        let next = (0..n)
            .min_by(|&a, &b| {
                let ta = (out[a] + 1) as f64 * per_sequence[a];
                let tb = (out[b] + 1) as f64 * per_sequence[b];
                ta.total_cmp(&tb)
            })
            .expect("one replica at least");
        out[next] += 1;
    }
    out
}

/// The slowest replica's time under a deal.
fn step_time(per_sequence: &[f64], sequences: &[usize]) -> f64 {
    per_sequence
        .iter()
        .zip(sequences)
        .map(|(c, &s)| c * s as f64)
        .fold(0.0, f64::max)
}

/// What the measured passes say of the deal of a run without rebalancing:
/// from each replica's seconds of passes per step (`busy`, by replica),
/// the deal by measured speed and the share of the slowest replica's
/// passes it would save, when that is more than [`MIN_GAIN`].
pub fn suggest(roles: &[Role], busy: &[f64], total: usize) -> Option<(Vec<usize>, f64)> {
    let mut current = vec![0usize; busy.len()];
    for r in roles {
        *current.get_mut(r.replica)? = r.sequences;
    }
    let per: Vec<f64> = busy
        .iter()
        .zip(&current)
        .map(|(b, &s)| b / s.max(1) as f64)
        .collect();
    if per.iter().any(|c| !c.is_finite() || *c <= 0.0) {
        return None;
    }
    let new = deal(&per, total);
    let gain = 1.0 - step_time(&per, &new) / step_time(&per, &current);
    (gain > MIN_GAIN).then_some((new, gain))
}

/// Gives each replica of `roles` its number of `sequences`: its
/// micro-batches (of its own size, the last perhaps smaller), its count
/// and where in the global batch they start (replica by replica).
pub fn apply(roles: &mut [Role], sequences: &[usize]) {
    let mut starts = vec![0usize; sequences.len()];
    for r in 1..sequences.len() {
        starts[r] = starts[r - 1] + sequences[r - 1];
    }
    for role in roles {
        let s = sequences[role.replica];
        role.sequences = s;
        role.micro_batches = s.div_ceil(role.micro_batch_size);
        role.first_sequence = starts[role.replica];
    }
}

/// One rank's side of the rebalancing.
#[derive(Debug)]
pub struct Rebalancer {
    every: u64,
    /// This rank's seconds per sequence in its latest steps (the run's
    /// first step, which warms up, left out), at most `history`.
    samples: std::collections::VecDeque<f64>,
    history: usize,
    steps: u64,
}

impl Rebalancer {
    /// Deals again every `every` steps (at least 1), from the median speed
    /// of the latest `3 every` steps (at least [`MIN_HISTORY`]): a speed
    /// that changes shows within half of them, and one slow step does not
    /// move the batch.
    pub fn new(every: u64) -> Rebalancer {
        let every = every.max(1);
        Rebalancer {
            every,
            samples: std::collections::VecDeque::new(),
            history: usize::try_from(every.saturating_mul(3))
                .unwrap_or(usize::MAX)
                .clamp(MIN_HISTORY, 1 << 16),
            steps: 0,
        }
    }

    /// Records this rank's `busy` seconds in `step` (1-based) of its
    /// `role`, and at every `every`-th step returns the replicas' measured
    /// seconds per sequence, to be summed over the ranks (each rank fills
    /// its replica's slot, the others 0; 0 where nothing is measured yet),
    /// and dealt by [`Rebalancer::decide`].
    pub fn record(
        &mut self,
        step: u64,
        busy: f64,
        role: &Role,
        replicas: usize,
    ) -> Option<Vec<f32>> {
        self.steps += 1;
        if self.steps > 1 {
            if self.samples.len() == self.history {
                self.samples.pop_front();
            }
            self.samples.push_back(busy / role.sequences.max(1) as f64);
        }
        if step % self.every != 0 {
            return None;
        }
        let mut slots = vec![0.0f32; replicas];
        let mut w: Vec<f64> = self.samples.iter().copied().collect();
        if !w.is_empty() {
            w.sort_by(f64::total_cmp);
            slots[role.replica] = w[w.len() / 2] as f32;
        }
        Some(slots)
    }

    /// The new deal from the summed `slots`, when it is predicted to
    /// shorten the step of the current `roles` by more than [`MIN_GAIN`].
    pub fn decide(slots: &[f32], roles: &[Role], total: usize) -> Option<Vec<usize>> {
        let per: Vec<f64> = slots.iter().map(|&s| f64::from(s)).collect();
        if per.iter().any(|c| !c.is_finite() || *c <= 0.0) {
            return None;
        }
        let mut current = vec![0usize; per.len()];
        for r in roles {
            current[r.replica] = r.sequences;
        }
        let new = deal(&per, total);
        (step_time(&per, &new) < step_time(&per, &current) * (1.0 - MIN_GAIN)).then_some(new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::TrainPlan;

    #[test]
    fn the_deal_balances_by_speed_and_keeps_a_sequence_each() {
        // One replica 14 times the other's speed.
        let d = deal(&[1.0, 14.0], 64);
        assert_eq!(d.iter().sum::<usize>(), 64);
        assert_eq!(d, [60, 4]);
        // Far slower still: a sequence at least.
        assert_eq!(deal(&[1.0, 1000.0], 64), [63, 1]);
        assert_eq!(deal(&[2.0, 2.0, 2.0], 7), [3, 2, 2]);
        assert_eq!(deal(&[1.0, 1.0], 2), [1, 1]);
    }

    /// Two replicas of micro-batches of 4: Ferrite with 60 sequences,
    /// Cobalt with 4.
    fn ferrite_60_cobalt_4() -> Vec<Role> {
        let mut p = TrainPlan::parse_stages("ferrite:0=0..2", 1, 4, 15).unwrap();
        let mut cobalt = TrainPlan::parse_stages("cobalt:0=0..2", 1, 4, 1).unwrap();
        p.groups.append(&mut cobalt.groups);
        p.roles()
    }

    #[test]
    fn a_new_deal_moves_the_micro_batches_and_the_starts() {
        let mut roles = ferrite_60_cobalt_4();
        check(&roles).unwrap();
        apply(&mut roles, &[57, 7]);
        assert_eq!(
            (
                roles[0].sequences,
                roles[0].micro_batches,
                roles[0].first_sequence
            ),
            (57, 15, 0)
        );
        assert_eq!(roles[0].micro_batch(14), 1);
        assert_eq!(
            (
                roles[1].sequences,
                roles[1].micro_batches,
                roles[1].first_sequence
            ),
            (7, 2, 57)
        );
        assert_eq!(roles[1].micro_batch(1), 3);
    }

    #[test]
    fn only_a_clear_gain_deals_again() {
        let roles = ferrite_60_cobalt_4();
        // As profiled (60 and 4 at 1 and 15 s a sequence): no change.
        assert_eq!(Rebalancer::decide(&[1.0, 15.0], &roles, 64), None);
        // The second at twice its cost: sequences move to the first.
        assert_eq!(
            Rebalancer::decide(&[1.0, 30.0], &roles, 64),
            Some(vec![62, 2])
        );
        // 4% better: not worth it.
        assert_eq!(Rebalancer::decide(&[1.0, 15.6], &roles, 64), None);
        // A replica that measured nothing: no change.
        assert_eq!(Rebalancer::decide(&[1.0, 0.0], &roles, 64), None);
    }

    #[test]
    fn the_speed_is_the_median_of_the_latest_steps_after_the_first() {
        let plan = TrainPlan::parse_stages("ferrite:0=0..2", 2, 4, 1).unwrap();
        let roles = plan.roles();
        let mut rb = Rebalancer::new(1);
        // The first step (warming up) is not measured: nothing to deal by.
        assert_eq!(rb.record(1, 100.0, &roles[1], 2), Some(vec![0.0, 0.0]));
        // Then the median of the latest six, per sequence (4 a step; of an
        // even count, the upper): one slow step moves nothing.
        for (step, busy) in [(2, 8.0), (3, 4.0), (4, 400.0), (5, 4.0)] {
            assert!(rb.record(step, busy, &roles[1], 2).is_some());
        }
        assert_eq!(rb.record(6, 4.0, &roles[1], 2), Some(vec![0.0, 1.0]));
        for step in 7..=20 {
            rb.record(step, 12.0, &roles[1], 2);
        }
        assert_eq!(rb.record(21, 12.0, &roles[1], 2), Some(vec![0.0, 3.0]));
        let mut every = Rebalancer::new(4);
        assert_eq!(every.record(1, 4.0, &roles[0], 2), None);
        assert_eq!(every.record(3, 4.0, &roles[0], 2), None);
        assert_eq!(every.record(4, 4.0, &roles[0], 2), Some(vec![1.0, 0.0]));
    }

    #[test]
    fn a_run_without_rebalancing_is_told_what_it_would_gain() {
        let roles = ferrite_60_cobalt_4();
        // Balanced as measured: nothing to say.
        assert_eq!(suggest(&roles, &[60.0, 60.0], 64), None);
        // Cobalt's passes twice as long: 62 and 2, its step nearly halved.
        let (deal, gain) = suggest(&roles, &[60.0, 120.0], 64).unwrap();
        assert_eq!(deal, [62, 2]);
        assert!((gain - (1.0 - 62.0 / 120.0)).abs() < 1e-12, "{gain}");
        // A replica with no figure: nothing.
        assert_eq!(suggest(&roles, &[60.0, 0.0], 64), None);
        assert_eq!(suggest(&roles, &[60.0], 64), None);
    }

    #[test]
    fn pipelines_and_single_replicas_are_refused() {
        let one = TrainPlan::parse_stages("ferrite:0=0..2", 1, 4, 2).unwrap();
        assert!(
            check(&one.roles())
                .unwrap_err()
                .to_string()
                .contains("has one")
        );
        let pp = TrainPlan::parse_stages("ferrite:0=0..1,cobalt:0=1..2", 2, 4, 2).unwrap();
        assert!(
            check(&pp.roles())
                .unwrap_err()
                .to_string()
                .contains("a pipeline of 2 stages")
        );
    }
}
