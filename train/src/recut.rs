//! Moving a pipeline's cuts while training (`polychip train
//! --rebalance-every N` on a plan of one pipeline): every stage measures
//! how long its passes take, and every `N` steps every rank computes, from
//! the same all-reduced figures, where the cuts between the stages would
//! balance them; when that is predicted to shorten the slowest stage by
//! more than the measurements' noise allows ([`crate::rebalance::required_gain`]),
//! the stages hand each other the parameters and AdamW moments of the work
//! that changes hands, at a step boundary, and train on.
//!
//! Where the plan's cuts came from a profile, these come from the run: a
//! chip slowed by a neighbour on its core, a clock that throttles or a
//! profile taken in a fast minute stops setting the pipeline's pace. The
//! cuts fall at the grain a plan's can ([`Cut`]: between half blocks, or
//! inside one after a key/value head or a feed-forward column), and every
//! stage keeps at least one such grain of block work, so that its speed
//! stays measured. In f32 the run's losses are those of the fixed split to
//! the last digit (a cut does not change the arithmetic); in bf16 a cut
//! inside a half rounds its residual sum once more, as such a plan does.
//!
//! The work of a part of the model is counted in multiply-adds per token
//! ([`Work`]); each stage's measured seconds over its work give its pace,
//! so that the count only has to be right in proportion between the
//! parts next to a cut.

use std::ops::Range;
use std::path::{Path, PathBuf};

use polychip_comm::collectives::Communicator;

use crate::checkpoint;
use crate::config::ModelConfig;
use crate::error::{Result, TrainError};
use crate::model::Stage;
use crate::params::{Cut, StageRange};
use crate::plan::{Role, TrainPlan};
use crate::safetensors::SafeTensors;

/// The most stages whose cuts are chosen by trying both neighbouring
/// grains of every cut (`2^(stages - 1)` layouts); longer pipelines take
/// each cut's nearer grain.
const EXHAUSTIVE_STAGES: usize = 12;

/// Work (multiply-adds per token of a forward pass) of the model's parts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Work {
    /// One key/value head's share of an attention half: the rows of `wq`,
    /// `wk`, `wv` and columns of `wo` of its group's heads, and the scores
    /// and weighted values over (on average, causal) half the sequence.
    pub kv_head: f64,
    /// One hidden column of a feed-forward half (a row of `w1` and `w3`, a
    /// column of `w2`).
    pub column: f64,
    /// The embedding (a row read per token).
    pub embedding: f64,
    /// The final norm, output head and loss (the logits, and a few
    /// operations per logit for the softmax and the loss).
    pub head: f64,
}

impl Work {
    /// The counts for `cfg`.
    pub fn of(cfg: &ModelConfig) -> Work {
        let (dim, hd) = (cfg.dim as f64, cfg.head_dim() as f64);
        let group = (cfg.heads / cfg.kv_heads.max(1)) as f64;
        let vocab = cfg.vocab as f64;
        Work {
            kv_head: dim * hd * (2.0 * group + 2.0) + group * hd * cfg.seq_len as f64,
            column: 3.0 * dim,
            embedding: dim,
            head: vocab * dim + 4.0 * vocab,
        }
    }

    /// Half `half`'s width (key/value heads or columns) and one grain's work.
    fn grain(&self, cfg: &ModelConfig, half: usize) -> (usize, f64) {
        match half % 2 {
            0 => (cfg.kv_heads, self.kv_head),
            _ => (cfg.ffn, self.column),
        }
    }

    /// The work of one block.
    fn block(&self, cfg: &ModelConfig) -> f64 {
        cfg.kv_heads as f64 * self.kv_head + cfg.ffn as f64 * self.column
    }

    /// The smallest grain of block work.
    fn least_grain(&self) -> f64 {
        self.kv_head.min(self.column)
    }

    /// The block work before `cut`.
    pub fn position(&self, cfg: &ModelConfig, cut: Cut) -> f64 {
        let attention = cfg.kv_heads as f64 * self.kv_head;
        let blocks = (cut.half / 2) as f64 * self.block(cfg);
        let halfway = if cut.half % 2 == 1 { attention } else { 0.0 };
        blocks + halfway + cut.cols as f64 * self.grain(cfg, cut.half).1
    }

    /// A stage's work: its blocks, and the embedding or the head it holds.
    pub fn stage(&self, cfg: &ModelConfig, range: &StageRange) -> f64 {
        let blocks = self.position(cfg, range.end) - self.position(cfg, range.start);
        blocks + self.ends(range.embed, range.head)
    }

    /// The work of the embedding and the head, where held.
    fn ends(&self, embed: bool, head: bool) -> f64 {
        (if embed { self.embedding } else { 0.0 }) + if head { self.head } else { 0.0 }
    }

    /// The grains at or before and at or after block work `x` (one cut
    /// twice when `x` falls on one).
    fn around(&self, cfg: &ModelConfig, x: f64) -> [Cut; 2] {
        let halves = 2 * cfg.layers;
        let mut at = 0.0;
        for h in 0..halves {
            let (width, g) = self.grain(cfg, h);
            let span = width as f64 * g;
            if x < at + span || h + 1 == halves {
                let k = ((x - at) / g).clamp(0.0, width as f64);
                let cut = |c: usize| match c {
                    0 => Cut::at(h),
                    c if c >= width => Cut::at(h + 1),
                    c => Cut::inside(h, c),
                };
                return [cut(k.floor() as usize), cut(k.ceil() as usize)];
            }
            at += span;
        }
        [Cut::at(0); 2]
    }
}

/// New cuts for a pipeline: [`better_cuts`]'s answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Recut {
    /// The cuts between the stages (one fewer than the stages).
    pub cuts: Vec<Cut>,
    /// The slowest stage's predicted seconds a micro-batch with them.
    pub slowest: f64,
    /// The slowest stage's measured seconds a micro-batch now.
    pub now: f64,
}

impl Recut {
    /// The predicted share of the slowest stage's time saved.
    pub fn gain(&self) -> f64 {
        1.0 - self.slowest / self.now
    }
}

/// The stages of a model of `layers` blocks between `cuts`.
pub fn ranges(cuts: &[Cut], layers: usize) -> Vec<StageRange> {
    let mut ends = vec![Cut::at(0)];
    ends.extend_from_slice(cuts);
    ends.push(Cut::block(layers));
    ends.windows(2)
        .enumerate()
        .map(|(i, w)| StageRange {
            start: w[0],
            end: w[1],
            embed: i == 0,
            head: i + 2 == ends.len(),
        })
        .collect()
}

/// Where the cuts between a pipeline's stages (`ranges`, first to last,
/// of model `cfg`) would balance them, given each stage's measured seconds
/// a micro-batch (`per_stage`) and their relative uncertainty (`noise`,
/// see [`crate::rebalance::Speeds`]): `None` unless they are predicted to
/// shorten the slowest stage by more than
/// [`crate::rebalance::required_gain`].
///
/// Each stage's pace is its seconds over its [`Work`]; the cuts are placed
/// so that every stage's work at its pace is the same (a stage whose share
/// would be less than a grain keeps one), then each is moved to the grain
/// before or after it, whichever pair of neighbours is predicted to finish
/// sooner. Every stage must keep some blocks' work and fit its device's
/// memory (`fits(stage, range)`); where one would not at the balance, the
/// cuts move a half, a quarter or an eighth of the way there instead.
pub fn better_cuts(
    cfg: &ModelConfig,
    ranges_now: &[StageRange],
    per_stage: &[f64],
    noise: f64,
    fits: &dyn Fn(usize, &StageRange) -> bool,
) -> Option<Recut> {
    let p = ranges_now.len();
    if p < 2
        || per_stage.len() != p
        || per_stage.iter().any(|t| !(t.is_finite() && *t > 0.0))
        || cfg.layers == 0
    {
        return None;
    }
    let work = Work::of(cfg);
    let paces: Vec<f64> = ranges_now
        .iter()
        .zip(per_stage)
        .map(|(r, t)| t / work.stage(cfg, r).max(work.least_grain()))
        .collect();
    let extra: Vec<f64> = (0..p).map(|s| work.ends(s == 0, s + 1 == p)).collect();
    // Equal times T: stage s takes T / pace_s of work, its ends included,
    // at least a grain of blocks. Stages held at the least are taken out
    // and T solved again.
    let total = work.position(cfg, Cut::block(cfg.layers));
    let least = work.kv_head.max(work.column);
    let mut blocks = vec![0.0; p];
    let mut held: Vec<bool> = vec![false; p];
    for _ in 0..p {
        let fixed: f64 = (0..p).filter(|&s| held[s]).map(|_| least).sum();
        let free: Vec<usize> = (0..p).filter(|&s| !held[s]).collect();
        if free.is_empty() {
            // Fewer grains than stages could use: nothing to balance.
            return None;
        }
        let inverse: f64 = free.iter().map(|&s| 1.0 / paces[s]).sum();
        let t = (total - fixed + free.iter().map(|&s| extra[s]).sum::<f64>()) / inverse;
        let mut changed = false;
        for s in 0..p {
            blocks[s] = match held[s] {
                true => least,
                false => t / paces[s] - extra[s],
            };
            if !held[s] && blocks[s] < least {
                held[s] = true;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    let mut x = 0.0;
    let balanced: Vec<f64> = blocks[..p - 1]
        .iter()
        .map(|b| {
            x += b;
            x
        })
        .collect();
    let now_cuts: Vec<Cut> = ranges_now[..p - 1].iter().map(|r| r.end).collect();
    let now_at: Vec<f64> = now_cuts.iter().map(|&c| work.position(cfg, c)).collect();
    let now = per_stage.iter().copied().fold(0.0, f64::max);
    // The slowest stage's predicted time between `cuts`, if every stage
    // keeps some blocks' work and fits its memory.
    let time = |cuts: &[Cut]| -> Option<f64> {
        let rs = ranges(cuts, cfg.layers);
        if rs
            .iter()
            .enumerate()
            .any(|(s, r)| r.end <= r.start || !fits(s, r))
        {
            return None;
        }
        Some(
            rs.iter()
                .zip(&paces)
                .map(|(r, pace)| pace * work.stage(cfg, r))
                .fold(0.0, f64::max),
        )
    };
    // The balance point first; where a stage's memory does not hold its
    // share there, points nearer the cuts of now.
    for toward in [1.0, 0.5, 0.25, 0.125] {
        let at: Vec<f64> = (0..p - 1)
            .map(|k| now_at[k] + toward * (balanced[k] - now_at[k]))
            .collect();
        let around: Vec<[Cut; 2]> = at.iter().map(|&x| work.around(cfg, x)).collect();
        let mut best: Option<(f64, Vec<Cut>)> = None;
        if p <= EXHAUSTIVE_STAGES {
            for pick in 0u32..(1 << (p - 1)) {
                let cuts: Vec<Cut> = (0..p - 1)
                    .map(|k| around[k][((pick >> k) & 1) as usize])
                    .collect();
                if let Some(t) = time(&cuts)
                    && best.as_ref().is_none_or(|(b, _)| t < *b)
                {
                    best = Some((t, cuts));
                }
            }
        } else {
            let cuts: Vec<Cut> = (0..p - 1)
                .map(|k| {
                    let [lo, hi] = around[k];
                    match at[k] - work.position(cfg, lo) <= work.position(cfg, hi) - at[k] {
                        true => lo,
                        false => hi,
                    }
                })
                .collect();
            best = time(&cuts).map(|t| (t, cuts));
        }
        if let Some((slowest, cuts)) = best {
            let recut = Recut { cuts, slowest, now };
            if recut.cuts != now_cuts && recut.gain() > crate::rebalance::required_gain(noise) {
                return Some(recut);
            }
        }
    }
    None
}

/// `plan` (of one pipeline) with its stages between `cuts`, the
/// predicted passes dropped (they were for the old cuts).
pub fn replan(plan: &TrainPlan, cuts: &[Cut]) -> TrainPlan {
    let mut plan = plan.clone();
    if let Some(g) = plan.groups.first_mut() {
        // The last stage ends at the model's end: its block count.
        let layers = g.stages.last().map_or(0, |s| s.layers[1].half / 2);
        for (s, r) in g.stages.iter_mut().zip(ranges(cuts, layers)) {
            s.layers = [r.start, r.end];
            s.predicted_passes = None;
        }
    }
    plan.predicted_step_seconds = None;
    plan
}

/// Whether two half-block ranges share a half.
fn share(a: &Range<usize>, b: &Range<usize>) -> bool {
    a.start < b.end && b.start < a.end
}

/// Moves this rank's `stage` (its role in `old`) to its range in `new`,
/// the same pipeline with other cuts, over `comm` (the job's world; every
/// rank of the pipeline calls it at the same step): each rank sends every
/// rank that will hold a half block it holds (whole or in part) its
/// weights and AdamW moments of the halves that rank will hold, the parts
/// of a half cut by width are joined, the old stage is freed and the new
/// one allocated and filled. The embedding and the head stay with the
/// first and last stages. `seed` only initializes what is then
/// overwritten.
pub fn move_stage(
    stage: Stage,
    old: &[Role],
    new: &[Role],
    rank: usize,
    comm: &mut Communicator,
    seed: u64,
) -> Result<Stage> {
    let cfg = stage.config().clone();
    let (precision, device) = (stage.precision(), stage.device().clone());
    let halves = stage.param_halves();
    // The parameters (indices) of this stage that a stage holding
    // `range` needs: those of the halves it holds, and (for this rank's
    // own new stage) the ends it keeps.
    let needed = |range: &StageRange, own: bool| -> Vec<usize> {
        let wanted = range.halves();
        halves
            .iter()
            .enumerate()
            .filter(|(_, h)| match h {
                Some(h) => wanted.contains(h),
                None => own,
            })
            .map(|(i, _)| i)
            .collect()
    };
    // The most bytes a stage's state can take: every parameter of the
    // model with its two moments, in f32, and a header's room.
    let bound: u64 = crate::params::stage_params(&cfg, &StageRange::whole(&cfg))
        .iter()
        .map(|s| s.numel() as u64 * 12)
        .sum::<u64>()
        + (1 << 20);
    let mut tensors: Vec<(PathBuf, SafeTensors)> = vec![(
        PathBuf::from(format!("rank {rank}'s stage")),
        checkpoint::param_tensors(&stage, &needed(&new[rank].range, true))?,
    )];
    // Every transfer in one order on every rank, each between its two
    // ranks: the first one left is always the first of both of its ranks,
    // so none waits on another.
    for (j, from) in old.iter().enumerate() {
        for (i, to) in new.iter().enumerate() {
            if i == j || !share(&from.range.halves(), &to.range.halves()) {
                continue;
            }
            if rank == j {
                let bytes =
                    checkpoint::param_tensors(&stage, &needed(&to.range, false))?.to_bytes();
                comm.send(&(bytes.len() as u64).to_le_bytes(), i)?;
                comm.send(&bytes, i)?;
            } else if rank == i {
                let mut len = [0u8; 8];
                comm.recv(&mut len, j)?;
                let len = u64::from_le_bytes(len);
                let label = PathBuf::from(format!("rank {j}'s stage"));
                if len > bound {
                    return Err(TrainError::Plan(format!(
                        "moving the pipeline's cuts: rank {j} would send {len} bytes, more than \
                         the whole model's state ({bound} bytes)"
                    )));
                }
                let mut bytes = vec![0u8; len as usize];
                comm.recv(&mut bytes, j)?;
                tensors.push((label.clone(), SafeTensors::from_bytes(&label, &bytes)?));
            }
        }
    }
    checkpoint::join_parts(&mut tensors)?;
    let range = new[rank].range;
    drop(stage);
    let moved = Stage::new(&cfg, range, precision, &device, seed)?;
    checkpoint::restore_tensors(&mut tensors, Path::new("the stages moved"), &moved)?;
    Ok(moved)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ANY: &dyn Fn(usize, &StageRange) -> bool = &|_, _| true;

    fn deep() -> ModelConfig {
        ModelConfig::preset("deep").unwrap()
    }

    fn cut(s: &str) -> Cut {
        Cut::parse(s).unwrap()
    }

    #[test]
    fn work_counts_the_parts_in_order() {
        let cfg = deep();
        let w = Work::of(&cfg);
        // A block is its attention half and its feed-forward half.
        let block = w.position(&cfg, cut("1"));
        assert_eq!(w.position(&cfg, cut("0")), 0.0);
        assert!((w.position(&cfg, cut("3")) - 3.0 * block).abs() < 1e-9 * block);
        let half = w.position(&cfg, cut("0.5"));
        assert!(half > 0.0 && half < block);
        // One kv head of two is half the attention half.
        assert!((w.position(&cfg, cut("0+1")) - half / 2.0).abs() < 1e-9 * block);
        // 88 of 176 columns: halfway through the feed-forward half.
        let mid = w.position(&cfg, cut("0.5+88"));
        assert!((mid - (half + block) / 2.0).abs() < 1e-9 * block);
        // The whole model's stage is its blocks and both ends.
        let whole = StageRange::whole(&cfg);
        let total = w.stage(&cfg, &whole);
        assert!((total - (16.0 * block + w.embedding + w.head)).abs() < 1e-9 * total);
        // Around a point: the grains on either side, or the one it is on.
        assert_eq!(w.around(&cfg, mid), [cut("0.5+88"), cut("0.5+88")]);
        let [lo, hi] = w.around(&cfg, half * 0.75);
        assert_eq!((lo, hi), (cut("0+1"), cut("0.5")));
        assert_eq!(w.around(&cfg, 1e30), [cut("16"), cut("16")]);
    }

    #[test]
    fn the_cuts_balance_measured_paces() {
        let cfg = deep();
        let w = Work::of(&cfg);
        // Cobalt 0..1.5, Ferrite 1.5..16 with Cobalt now three times as
        // slow as the plan had it: its stage takes 3 s where Ferrite's 1.
        let now = ranges(&[cut("1.5")], cfg.layers);
        let r = better_cuts(&cfg, &now, &[3.0, 1.0], 0.0, ANY).unwrap();
        assert_eq!(r.now, 3.0);
        assert!(r.gain() > 0.5, "{r:?}");
        // About a third of Cobalt's work stays with it.
        let kept = w.position(&cfg, r.cuts[0]);
        let before = w.position(&cfg, cut("1.5"));
        assert!(kept > 0.2 * before && kept < 0.5 * before, "{r:?}");
        // Balanced already: nothing moves.
        assert_eq!(better_cuts(&cfg, &now, &[1.0, 1.0], 0.0, ANY), None);
        // A gain within the noise's margin is not taken.
        let slight = better_cuts(&cfg, &now, &[1.04, 1.0], 0.0, ANY);
        assert!(slight.is_some_and(|r| r.gain() < 0.03));
        assert_eq!(better_cuts(&cfg, &now, &[1.04, 1.0], 0.02, ANY), None);
        // Nothing measured, or nonsense: nothing moves.
        assert_eq!(better_cuts(&cfg, &now, &[0.0, 1.0], 0.0, ANY), None);
        assert_eq!(better_cuts(&cfg, &now, &[f64::NAN, 1.0], 0.0, ANY), None);
        assert_eq!(better_cuts(&cfg, &now[..1], &[1.0], 0.0, ANY), None);
        // Cobalt's memory holds at most 1.25 blocks: the cut moves part of
        // the way, to a point its memory holds.
        let w = Work::of(&cfg);
        let limit = 1.25 * w.position(&cfg, cut("1"));
        let small = |s: usize, r: &StageRange| s != 0 || w.stage(&cfg, r) <= limit;
        let now = ranges(&[cut("1")], cfg.layers);
        let r = better_cuts(&cfg, &now, &[1.0, 3.0], 0.0, &small).unwrap();
        let held = w.position(&cfg, r.cuts[0]);
        assert!(held > w.position(&cfg, cut("1")) && held <= limit, "{r:?}");
        // And not at all where it holds nothing more.
        let none = |s: usize, r: &StageRange| s != 0 || r.end <= cut("1");
        assert_eq!(better_cuts(&cfg, &now, &[1.0, 3.0], 0.0, &none), None);
    }

    #[test]
    fn a_very_slow_stage_keeps_a_grain_and_every_stage_some_blocks() {
        let cfg = deep();
        let now = ranges(&[cut("4"), cut("8"), cut("12")], cfg.layers);
        let r = better_cuts(&cfg, &now, &[1.0, 1000.0, 1.0, 1.0], 0.0, ANY).unwrap();
        let rs = ranges(&r.cuts, cfg.layers);
        assert!(rs.iter().all(|x| x.start < x.end), "{r:?}");
        // The slow stage keeps one kv head or so.
        let w = Work::of(&cfg);
        let slow = w.stage(&cfg, &rs[1]);
        assert!(slow <= w.kv_head.max(w.column) * 1.01, "{r:?}");
        // Long pipelines take the nearer grain of each cut.
        let many: Vec<Cut> = (1..16).map(Cut::block).collect();
        let now = ranges(&many, cfg.layers);
        let mut t = vec![1.0; 16];
        t[0] = 2.0;
        let r = better_cuts(&cfg, &now, &t, 0.0, ANY).unwrap();
        assert_eq!(r.cuts.len(), 15);
        assert!(r.cuts[0] < cut("1"), "{r:?}");
        assert!(r.cuts.windows(2).all(|c| c[0] < c[1]), "{r:?}");
    }

    #[test]
    fn replanning_moves_every_stage_and_drops_the_predictions() {
        let mut plan = TrainPlan::parse_stages("cobalt:0=0..2,ferrite:0=2..16", 1, 4, 8).unwrap();
        plan.groups[0].stages[0].predicted_passes = Some([1.0, 2.0]);
        plan.predicted_step_seconds = Some(3.0);
        let moved = replan(&plan, &[cut("1+1")]);
        let s = &moved.groups[0].stages;
        assert_eq!(s[0].layers, [cut("0"), cut("1+1")]);
        assert_eq!(s[1].layers, [cut("1+1"), cut("16")]);
        assert!(s[0].predicted_passes.is_none() && moved.predicted_step_seconds.is_none());
        assert_eq!(moved.roles()[1].range.start, cut("1+1"));
    }
}
