//! Dealing the batch again while training (`polychip train
//! --rebalance-every N`): data-parallel replicas (one stage each, or
//! pipelines) measure how long their passes take, and every `N` steps every
//! rank deals the step's sequences again by the measured speeds, so that a
//! replica whose chip runs slower than it was profiled (a noisy neighbour,
//! a clock that throttles, a profile taken in a fast minute) stops holding
//! back the others.
//!
//! The plan's deal is the search's prediction from a profile; the
//! measurement here is of the run itself. Every rank computes the same new
//! deal from the same all-reduced figures, so the ranks agree without a
//! coordinator. Each replica keeps its micro-batch size and at least one
//! sequence, and a pipeline whose stages would then hold more micro-batches
//! in flight than the plan's deal does keeps at most its micro-batches (so
//! every stage's memory stays as checked); only how many micro-batches a
//! replica runs, the size of its last one, and where its sequences start in
//! the global batch change. The step's sequences, and so its gradient, stay
//! the same; only how they are grouped changes, so the bits of the run
//! depend on the timings (off by default).
//!
//! A plan of one pipeline has no batch to deal: there the same setting
//! moves the cuts between its stages ([`crate::recut`]).

use polychip_planner::schedule::PipelineSchedule;

use crate::error::{Result, TrainError};
use crate::plan::Role;
use crate::trace::Span;

/// A new deal is taken only when it is predicted to shorten the step by
/// more than this fraction, however steady the measurements, and by more
/// than [`NOISE_MARGIN`] times their uncertainty ([`required_gain`]), so
/// that noise in the measurement does not move sequences back and forth.
pub const MIN_GAIN: f64 = 0.01;

/// How many times the measured speeds' uncertainty (the largest of the
/// ranks' relative standard errors of their medians) a new deal's gain
/// must exceed.
pub const NOISE_MARGIN: f64 = 3.0;

/// The relative uncertainty taken for a rank with fewer than
/// [`MIN_NOISE_SAMPLES`] measured steps, and where none is known: a deal
/// then needs a gain over 5%.
pub const UNKNOWN_NOISE: f64 = 0.05 / NOISE_MARGIN;

/// The fewest measured steps a rank estimates its uncertainty from.
pub const MIN_NOISE_SAMPLES: usize = 4;

/// The gain a new deal must exceed when the measured speeds' largest
/// relative standard error is `noise`: [`NOISE_MARGIN`] times it, at least
/// [`MIN_GAIN`].
pub fn required_gain(noise: f64) -> f64 {
    if noise.is_finite() {
        (NOISE_MARGIN * noise).max(MIN_GAIN)
    } else {
        f64::INFINITY
    }
}

/// The fewest steps whose median speed a deal is made from.
pub const MIN_HISTORY: usize = 6;

/// Checks that `roles` can be dealt again: two replicas or more.
pub fn check(roles: &[Role]) -> Result<()> {
    let replicas = roles.iter().map(|r| r.replica).max().map_or(0, |m| m + 1);
    if replicas < 2 {
        return Err(TrainError::Plan(
            "--rebalance-every deals the batch between data-parallel replicas; this plan has one"
                .into(),
        ));
    }
    Ok(())
}

/// Whether rebalancing `roles` moves a pipeline's cuts ([`crate::recut`]):
/// one replica of two stages or more. Replicas have their batch dealt
/// again instead.
pub fn moves_cuts(roles: &[Role]) -> bool {
    roles.len() >= 2 && roles.iter().all(|r| r.replica == 0)
}

/// Checks that `roles` can be rebalanced while training
/// (`--rebalance-every`): replicas whose batch is dealt again ([`check`]),
/// or one pipeline whose cuts move ([`moves_cuts`]).
pub fn check_rebalancing(roles: &[Role]) -> Result<()> {
    if moves_cuts(roles) || check(roles).is_ok() {
        return Ok(());
    }
    Err(TrainError::Plan(
        "--rebalance-every deals the batch between data-parallel replicas, or moves the cuts \
         between a pipeline's stages; this plan has one replica of one stage"
            .into(),
    ))
}

/// The seconds this rank's passes took among `spans` (its forward and
/// backward passes, the weights' gradients included; not its waits for
/// other stages) since `since_us`.
pub fn busy_seconds(spans: &[Span], since_us: f64) -> f64 {
    spans
        .iter()
        .rev()
        .take_while(|s| s.start_us >= since_us)
        .filter(|s| matches!(s.cat, "forward" | "backward" | crate::pipeline::WEIGHTS))
        .map(|s| s.dur_us / 1e6)
        .sum()
}

/// A replica's passes as its share of the batch changes.
#[derive(Debug, Clone, PartialEq)]
pub struct Replica {
    /// Its slowest stage's seconds per micro-batch.
    pub slowest: f64,
    /// Its stages' seconds per micro-batch, summed.
    pub total: f64,
    /// Its micro-batch size.
    pub micro_batch: usize,
    /// The most sequences its stages' checked memory allows.
    pub max_sequences: usize,
}

impl Replica {
    /// Seconds of its passes for `s` sequences: a micro-batch through every
    /// stage (the pipeline's fill and drain) and the others at the slowest
    /// stage's pace; of one stage, `s / b` micro-batches.
    pub fn time(&self, s: usize) -> f64 {
        self.slowest * (s as f64 / self.micro_batch as f64 - 1.0) + self.total
    }
}

/// The replicas of `planned` (the plan's roles, whose memory was checked),
/// from each rank's seconds per micro-batch (`per_rank`, by rank), under
/// `schedule` run `ahead` times its lead ahead (which say how many
/// micro-batches a pipeline's stages hold in flight); `None` when a figure
/// is missing or not positive.
pub fn replicas(
    planned: &[Role],
    per_rank: &[f64],
    schedule: PipelineSchedule,
    ahead: usize,
) -> Option<Vec<Replica>> {
    let n = planned.iter().map(|r| r.replica).max()? + 1;
    let mut out: Vec<Option<Replica>> = vec![None; n];
    for r in planned {
        let t = *per_rank.get(r.rank)?;
        if !(t.is_finite() && t > 0.0) {
            return None;
        }
        // Holding more micro-batches in flight than the plan's deal would
        // need memory nobody checked: such a replica keeps at most the
        // plan's micro-batches.
        let saturated = |m| schedule.in_flight(r.stage, r.stages, m, ahead);
        let grows = saturated(r.micro_batches) < saturated(usize::MAX / 2);
        let cap = match grows {
            true => r.micro_batches * r.micro_batch_size,
            false => usize::MAX,
        };
        let e = out[r.replica].get_or_insert(Replica {
            slowest: 0.0,
            total: 0.0,
            micro_batch: r.micro_batch_size,
            max_sequences: usize::MAX,
        });
        e.slowest = e.slowest.max(t);
        e.total += t;
        e.max_sequences = e.max_sequences.min(cap);
    }
    out.into_iter().collect()
}

/// The deal of `total` sequences over `replicas`, each at least one and at
/// most its `max_sequences`: the one whose slowest replica finishes first
/// (sequences given one at a time to the replica that would then finish
/// first; ties to the lower replica). `None` if they cannot hold them.
pub fn deal(replicas: &[Replica], total: usize) -> Option<Vec<usize>> {
    let n = replicas.len();
    if n == 0 || n > total {
        return None;
    }
    let mut out = vec![1usize; n];
    for _ in n..total {
        let next = (0..n)
            .filter(|&r| out[r] < replicas[r].max_sequences)
            .min_by(|&a, &b| {
                let ta = replicas[a].time(out[a] + 1);
                let tb = replicas[b].time(out[b] + 1);
                ta.total_cmp(&tb)
            })?;
        out[next] += 1;
    }
    Some(out)
}

/// The slowest replica's time under a deal.
fn step_time(replicas: &[Replica], sequences: &[usize]) -> f64 {
    replicas
        .iter()
        .zip(sequences)
        .map(|(r, &s)| r.time(s))
        .fold(0.0, f64::max)
}

/// Each replica's sequences under `roles`.
fn current(roles: &[Role], replicas: usize) -> Vec<usize> {
    let mut out = vec![0usize; replicas];
    for r in roles {
        out[r.replica] = r.sequences;
    }
    out
}

/// The deal by the measured speeds (`per_rank`: each rank's seconds per
/// micro-batch, whose largest relative standard error is `noise`) and the
/// share of the step's slowest passes it saves over the deal of `roles`,
/// when that is more than [`required_gain`] of `noise`; no pipeline holds
/// more micro-batches in flight than under `planned` (the plan's roles,
/// `roles` before any new deal) under `schedule` run `ahead` times its
/// lead ahead.
pub fn better_deal(
    roles: &[Role],
    planned: &[Role],
    per_rank: &[f64],
    noise: f64,
    total: usize,
    schedule: PipelineSchedule,
    ahead: usize,
) -> Option<(Vec<usize>, f64)> {
    let reps = replicas(planned, per_rank, schedule, ahead)?;
    let now = current(roles, reps.len());
    let new = deal(&reps, total)?;
    let gain = 1.0 - step_time(&reps, &new) / step_time(&reps, &now);
    (gain > required_gain(noise)).then_some((new, gain))
}

/// The median of `samples` and its relative standard error (from their
/// median absolute deviation, as a normal spread's: `1.2533 x 1.4826 MAD /
/// sqrt(n)` over the median), [`UNKNOWN_NOISE`] with fewer than
/// [`MIN_NOISE_SAMPLES`]; `None` without samples.
pub fn median_and_noise(samples: &[f64]) -> Option<(f64, f64)> {
    let mut w = samples.to_vec();
    w.sort_by(f64::total_cmp);
    let median = *w.get(w.len() / 2)?;
    if w.len() < MIN_NOISE_SAMPLES || median <= 0.0 {
        return Some((median, UNKNOWN_NOISE));
    }
    let mut dev: Vec<f64> = w.iter().map(|x| (x - median).abs()).collect();
    dev.sort_by(f64::total_cmp);
    let mad = dev[dev.len() / 2];
    let se = 1.2533 * 1.4826 * mad / (w.len() as f64).sqrt();
    Some((median, se / median))
}

/// Each replica of `roles` (by its stages' devices) with its value (its
/// sequences, say): `ferrite:0 60, cobalt:0|ferrite:1 4`.
pub fn describe<T: std::fmt::Display>(roles: &[Role], values: &[T]) -> String {
    let mut replicas: Vec<Vec<&str>> = vec![Vec::new(); values.len()];
    for r in roles {
        replicas[r.replica].push(&r.device);
    }
    replicas
        .iter()
        .zip(values)
        .map(|(devices, v)| format!("{} {v}", devices.join("|")))
        .collect::<Vec<_>>()
        .join(", ")
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
    /// This rank's seconds per micro-batch in its latest steps (the run's
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
    /// `role`, and at every `every`-th step returns the ranks' measured
    /// seconds per micro-batch (of the rank's size; a smaller last one
    /// counted as its share) and then their relative standard errors
    /// ([`median_and_noise`]), `2 world` figures to be summed over the
    /// ranks (each fills its own two slots, the others 0; 0 where nothing
    /// is measured yet), and dealt by [`better_deal`] ([`Speeds::from`]).
    pub fn record(&mut self, step: u64, busy: f64, role: &Role, world: usize) -> Option<Vec<f32>> {
        self.steps += 1;
        if self.steps > 1 {
            if self.samples.len() == self.history {
                self.samples.pop_front();
            }
            let micro_batches = role.sequences.max(1) as f64 / role.micro_batch_size as f64;
            self.samples.push_back(busy / micro_batches);
        }
        if step % self.every != 0 {
            return None;
        }
        let mut slots = vec![0.0f32; 2 * world];
        let w: Vec<f64> = self.samples.iter().copied().collect();
        if let Some((median, noise)) = median_and_noise(&w) {
            slots[role.rank] = median as f32;
            slots[world + role.rank] = noise as f32;
        }
        Some(slots)
    }
}

/// The ranks' figures of [`Rebalancer::record`], summed over the ranks.
#[derive(Debug, Clone, PartialEq)]
pub struct Speeds {
    /// Each rank's median seconds per micro-batch.
    pub per_rank: Vec<f64>,
    /// The largest of the ranks' relative standard errors.
    pub noise: f64,
}

impl Speeds {
    /// From the `2 world` summed slots.
    pub fn from(slots: &[f32]) -> Speeds {
        let world = slots.len() / 2;
        Speeds {
            per_rank: slots[..world].iter().map(|&x| f64::from(x)).collect(),
            noise: slots[world..]
                .iter()
                .map(|&x| f64::from(x))
                .fold(0.0, f64::max),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::TrainPlan;

    const ONE_F_ONE_B: PipelineSchedule = PipelineSchedule::OneFOneB;

    /// A replica of one stage taking `per_sequence` seconds a sequence.
    fn one_stage(per_sequence: f64) -> Replica {
        Replica {
            slowest: per_sequence,
            total: per_sequence,
            micro_batch: 1,
            max_sequences: usize::MAX,
        }
    }

    #[test]
    fn the_deal_balances_by_speed_and_keeps_a_sequence_each() {
        let deal_of = |per: &[f64], total| {
            let reps: Vec<Replica> = per.iter().map(|&c| one_stage(c)).collect();
            deal(&reps, total).unwrap()
        };
        // One replica 14 times the other's speed.
        assert_eq!(deal_of(&[1.0, 14.0], 64), [60, 4]);
        // Far slower still: a sequence at least.
        assert_eq!(deal_of(&[1.0, 1000.0], 64), [63, 1]);
        assert_eq!(deal_of(&[2.0, 2.0, 2.0], 7), [3, 2, 2]);
        assert_eq!(deal_of(&[1.0, 1.0], 2), [1, 1]);
        // Too few sequences for a replica each; a cap none can pass.
        assert_eq!(deal(&[one_stage(1.0), one_stage(1.0)], 1), None);
        let capped = Replica {
            max_sequences: 2,
            ..one_stage(1.0)
        };
        assert_eq!(deal(&[capped.clone(), capped.clone()], 5), None);
        // A capped fast replica leaves the rest to the slow one.
        assert_eq!(deal(&[capped, one_stage(10.0)], 5), Some(vec![2, 3]));
    }

    #[test]
    fn a_pipeline_pays_its_fill_once() {
        // Two stages of 1 s a micro-batch of 1: s + 1 seconds.
        let pp = Replica {
            slowest: 1.0,
            total: 2.0,
            micro_batch: 1,
            max_sequences: usize::MAX,
        };
        assert_eq!(pp.time(4), 5.0);
        // Beside a replica of one stage at 1.5 s a sequence: 10 sequences
        // go 6 (7 s) and 4 (6 s).
        assert_eq!(deal(&[pp, one_stage(1.5)], 10), Some(vec![6, 4]));
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
        let of = |r: &Role| (r.sequences, r.micro_batches, r.first_sequence);
        assert_eq!(of(&roles[0]), (57, 15, 0));
        assert_eq!(roles[0].micro_batch(14), 1);
        assert_eq!(of(&roles[1]), (7, 2, 57));
        assert_eq!(roles[1].micro_batch(1), 3);
        assert_eq!(describe(&roles, &[57, 7]), "ferrite:0 57, cobalt:0 7");
    }

    #[test]
    fn only_a_clear_gain_deals_again() {
        let roles = ferrite_60_cobalt_4();
        let better = |per_rank: &[f64]| {
            better_deal(&roles, &roles, per_rank, UNKNOWN_NOISE, 64, ONE_F_ONE_B, 1)
        };
        // As planned (micro-batches of 4 at 4 and 60 s: 60 s each): no change.
        assert_eq!(better(&[4.0, 60.0]), None);
        // Cobalt at twice its time: two sequences move, its step nearly
        // halved.
        let (deal, gain) = better(&[4.0, 120.0]).unwrap();
        assert_eq!(deal, [62, 2]);
        assert!((gain - (1.0 - 62.0 / 120.0)).abs() < 1e-12, "{gain}");
        // 4% better: not worth it when the noise is not known.
        assert_eq!(better(&[4.0, 62.4]), None);
        // 4.1% better (Cobalt at 63.6 s, 3 sequences: 61 s on Ferrite):
        // worth it when the measurements are steady to 1%, not to 2%.
        let with = |noise| better_deal(&roles, &roles, &[4.0, 63.6], noise, 64, ONE_F_ONE_B, 1);
        assert_eq!(with(UNKNOWN_NOISE), None);
        let (deal, gain) = with(0.01).unwrap();
        assert_eq!(deal, [61, 3]);
        assert!((gain - (1.0 - 61.0 / 63.6)).abs() < 1e-12, "{gain}");
        assert_eq!(with(0.02), None);
        assert_eq!(with(0.0).unwrap().0, [61, 3]);
        // Never under MIN_GAIN, however steady: 0.8% better is not taken.
        let small = better_deal(&roles, &roles, &[4.0, 61.5], 0.0, 64, ONE_F_ONE_B, 1);
        assert_eq!(small, None);
        // A rank that measured nothing, or a figure missing: no change.
        assert_eq!(better(&[4.0, 0.0]), None);
        assert_eq!(better(&[4.0]), None);
    }

    #[test]
    fn a_pipeline_that_would_hold_more_in_flight_keeps_its_micro_batches() {
        // Replica 0 a pipeline of two stages with 1 micro-batch (in flight:
        // 1 of the 2 it could hold), replica 1 one stage with 7.
        let mut p = TrainPlan::parse_stages("ferrite:0=0..1,ferrite:1=1..2", 1, 1, 1).unwrap();
        let mut one = TrainPlan::parse_stages("cobalt:0=0..2", 1, 1, 7).unwrap();
        p.groups.append(&mut one.groups);
        let roles = p.roles();
        let reps = replicas(&roles, &[0.1, 0.1, 10.0], ONE_F_ONE_B, 1).unwrap();
        assert_eq!(reps[0].max_sequences, 1);
        assert_eq!(reps[1].max_sequences, usize::MAX);
        assert_eq!((reps[0].slowest, reps[0].total), (0.1, 0.2));
        // The fast pipeline cannot grow: no better deal.
        let slow = [0.1, 0.1, 10.0];
        assert_eq!(
            better_deal(&roles, &roles, &slow, UNKNOWN_NOISE, 8, ONE_F_ONE_B, 1),
            None
        );
        // With 2 micro-batches its stages hold all they can: it may grow.
        let mut p = TrainPlan::parse_stages("ferrite:0=0..1,ferrite:1=1..2", 1, 1, 2).unwrap();
        let mut one = TrainPlan::parse_stages("cobalt:0=0..2", 1, 1, 6).unwrap();
        p.groups.append(&mut one.groups);
        let planned = p.roles();
        let (deal, _) =
            better_deal(&planned, &planned, &slow, UNKNOWN_NOISE, 8, ONE_F_ONE_B, 1).unwrap();
        assert_eq!(deal, [7, 1]);
        // Dealt down to one micro-batch, it may grow back to what the plan
        // checked: the caps are the plan's.
        let mut now = planned.clone();
        apply(&mut now, &[1, 7]);
        let (deal, _) =
            better_deal(&now, &planned, &slow, UNKNOWN_NOISE, 8, ONE_F_ONE_B, 1).unwrap();
        assert_eq!(deal, [7, 1]);
    }

    #[test]
    fn the_speed_is_the_median_of_the_latest_steps_after_the_first() {
        let plan = TrainPlan::parse_stages("ferrite:0=0..2", 2, 4, 1).unwrap();
        let roles = plan.roles();
        let mut rb = Rebalancer::new(1);
        // The first step (warming up) is not measured: nothing to deal by.
        assert_eq!(rb.record(1, 100.0, &roles[1], 2), Some(vec![0.0; 4]));
        // Then the median of the latest six, per micro-batch (one a step;
        // of an even count, the upper): one slow step moves nothing.
        for (step, busy) in [(2, 8.0), (3, 4.0), (4, 400.0), (5, 4.0)] {
            assert!(rb.record(step, busy, &roles[1], 2).is_some());
        }
        // (Five steps, three of them alike: a deviation of 0, no noise.)
        assert_eq!(
            rb.record(6, 4.0, &roles[1], 2),
            Some(vec![0.0, 4.0, 0.0, 0.0])
        );
        for step in 7..=20 {
            rb.record(step, 12.0, &roles[1], 2);
        }
        assert_eq!(
            rb.record(21, 12.0, &roles[1], 2),
            Some(vec![0.0, 12.0, 0.0, 0.0])
        );
        let mut every = Rebalancer::new(4);
        assert_eq!(every.record(1, 4.0, &roles[0], 2), None);
        assert_eq!(every.record(3, 4.0, &roles[0], 2), None);
        // Two steps measured: too few to say how steady they are.
        let slots = every.record(4, 4.0, &roles[0], 2).unwrap();
        assert_eq!(slots, vec![4.0, 0.0, UNKNOWN_NOISE as f32, 0.0]);
        let speeds = Speeds::from(&slots);
        assert_eq!(speeds.per_rank, [4.0, 0.0]);
        assert!((speeds.noise - UNKNOWN_NOISE).abs() < 1e-7);
    }

    #[test]
    fn the_noise_is_the_median_s_relative_standard_error() {
        assert_eq!(median_and_noise(&[]), None);
        assert_eq!(median_and_noise(&[2.0, 1.0]), Some((2.0, UNKNOWN_NOISE)));
        // Nine samples of 10 +- 1 (MAD 1): 1.2533 x 1.4826 / 3 / 10.
        let s = [9.0, 11.0, 10.0, 9.0, 11.0, 10.0, 9.0, 11.0, 10.0];
        let (m, noise) = median_and_noise(&s).unwrap();
        assert_eq!(m, 10.0);
        assert!((noise - 1.2533 * 1.4826 / 30.0).abs() < 1e-12, "{noise}");
        assert!((required_gain(noise) - 3.0 * noise).abs() < 1e-12);
        assert_eq!(required_gain(0.0), MIN_GAIN);
        assert_eq!(required_gain(f64::NAN), f64::INFINITY);
    }

    #[test]
    fn single_replicas_are_refused() {
        let one = TrainPlan::parse_stages("ferrite:0=0..2", 1, 4, 2).unwrap();
        assert!(
            check(&one.roles())
                .unwrap_err()
                .to_string()
                .contains("has one")
        );
        let pp = TrainPlan::parse_stages("ferrite=0..1,cobalt=1..2", 2, 4, 2).unwrap();
        check(&pp.roles()).unwrap();
    }
}
