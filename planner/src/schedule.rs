//! The timings of one training step of one pipeline (one data-parallel
//! replica), as the cost model predicts them and the simulator consumes
//! them. Times are in seconds.

use serde::{Deserialize, Serialize};

/// One pipeline stage's costs per micro-batch and per step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageTiming {
    /// A name for traces, e.g. `"stage 0 (A100 x8, layers 0-23)"`.
    pub name: String,
    /// Forward time of one micro-batch on this stage.
    pub forward: f64,
    /// Backward time of one micro-batch on this stage.
    pub backward: f64,
    /// Time to send one micro-batch's activations to the next stage (and,
    /// equally, the activation gradient back from it); 0 for the last stage.
    pub send_next: f64,
    /// The stage's data-parallel gradient all-reduce after the last backward
    /// (the part not overlapped with computation).
    pub dp_allreduce: f64,
    /// The optimizer step after the all-reduce.
    pub optimizer: f64,
    /// Whether the stage's sends leave it free at once (a sender thread
    /// sends them one after another) instead of blocking it until each
    /// transfer has arrived; see [`crate::sim`].
    #[serde(default)]
    pub sends_async: bool,
    /// The part of `backward` that computes the weights' gradients, which
    /// the zero-bubble schedule runs after sending the input's gradient
    /// (0: not known, the backward pass is not split).
    #[serde(default)]
    pub weight_grad: f64,
}

/// The order of a pipeline stage's passes (see [`crate::sim`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PipelineSchedule {
    /// Non-interleaved one forward, one backward (PipeDream-Flush,
    /// Megatron-LM, DeepSpeed).
    #[default]
    #[serde(rename = "1f1b")]
    OneFOneB,
    /// After ZB-H2 (Qi et al., "Zero Bubble Pipeline Parallelism", 2024):
    /// a stage that sends gradients splits each backward pass, sends the
    /// input's gradient, then computes the weights'; and stage `i` of `p`
    /// runs `min(2 (p - i - 1), m)` forward passes before the steady
    /// phase's first (1F1B: `min(p - i - 1, m)`). `polychip train
    /// --schedule zero-bubble`.
    ZeroBubble,
    /// 1F1B whose stages after the first defer the weights' gradients of
    /// their last [`DEFERRED_WEIGHTS`] backward passes to the end of the
    /// step: each of those passes computes the input's gradient and sends
    /// it, and the weights' passes run after the stage's last one, while
    /// the stages before it drain. The warm-up, the order of every other
    /// pass and the memory of 1F1B (the last stage holds one micro-batch
    /// more at its end); only these passes are split, where zero bubble
    /// splits all (a split pass costs the bundled CPU devices 3-10% more
    /// than a whole one). After the placement of weight passes in the cool-down of
    /// ZB-H1 (Qi et al., 2024). `polychip train --schedule
    /// 1f1b-deferred`.
    #[serde(rename = "1f1b-deferred")]
    OneFOneBDeferred,
    /// GPipe (Huang et al., 2019; `ScheduleGPipe` of PyTorch's pipelining):
    /// every forward pass of the step, then every backward pass, so each
    /// stage holds the activations of all `m` micro-batches. As fast as
    /// 1F1B (the same bubble), with more memory; for scoring runs that used
    /// it (the search proposes 1F1B and zero bubble).
    #[serde(rename = "gpipe")]
    GPipe,
}

impl PipelineSchedule {
    /// The name on the command line and in files.
    pub fn name(self) -> &'static str {
        match self {
            PipelineSchedule::OneFOneB => "1f1b",
            PipelineSchedule::ZeroBubble => "zero-bubble",
            PipelineSchedule::OneFOneBDeferred => "1f1b-deferred",
            PipelineSchedule::GPipe => "gpipe",
        }
    }

    /// Whether stage `stage` splits the backward pass of micro-batch `j`
    /// (of `m`): computes the input's gradient, sends it, and computes the
    /// weights' gradients apart. Zero bubble splits every pass of every
    /// stage but the first (which sends no gradient), running each weights'
    /// pass right after its input's; [`Self::OneFOneBDeferred`] the last
    /// [`DEFERRED_WEIGHTS`] of those stages, running their weights' passes
    /// after the stage's last backward pass ([`Self::defers_weights`]).
    pub fn splits(self, stage: usize, j: usize, m: usize) -> bool {
        match self {
            PipelineSchedule::ZeroBubble => stage > 0,
            PipelineSchedule::OneFOneBDeferred => stage > 0 && j + DEFERRED_WEIGHTS >= m,
            PipelineSchedule::OneFOneB | PipelineSchedule::GPipe => false,
        }
    }

    /// Whether stage `stage` splits its last backward pass (of any count),
    /// whose weights' part then finishes its gradients.
    pub fn splits_last(self, stage: usize) -> bool {
        self.splits(stage, 0, 1)
    }

    /// Whether the weights' passes of split backward passes run after the
    /// stage's last backward pass ([`Self::OneFOneBDeferred`]) rather than
    /// right after their own.
    pub fn defers_weights(self) -> bool {
        self == PipelineSchedule::OneFOneBDeferred
    }

    /// Forward passes stage `stage` of `stages` runs before its steady
    /// phase of one forward and one backward pass (of `m` micro-batches):
    /// before its first backward pass it runs one more. `ahead`
    /// ([`Schedule::run_ahead`], 0 taken as 1) multiplies the lead each
    /// stage keeps over the next: 1F1B's one micro-batch per later stage,
    /// zero bubble's two.
    pub fn warm_up(self, stage: usize, stages: usize, m: usize, ahead: usize) -> usize {
        let depth = stages.saturating_sub(stage + 1);
        let lead = depth.saturating_mul(ahead.max(1));
        match self {
            PipelineSchedule::OneFOneB | PipelineSchedule::OneFOneBDeferred => lead.min(m),
            PipelineSchedule::ZeroBubble => lead.saturating_mul(2).min(m),
            PipelineSchedule::GPipe => m.saturating_sub(1),
        }
    }

    /// The micro-batches whose activations stage `stage` of `stages` holds
    /// at most (of `m`): those it has run forward before its first
    /// backward pass, and under a split one more, whose weights'
    /// gradients still hold its inputs and output gradients. Under
    /// [`Self::OneFOneBDeferred`] the last stage (of two or more) holds one
    /// more at its end: its second-last micro-batch's weights' pass waits
    /// for the last one's input gradient; a stage before it holds its
    /// last micro-batches' anyway while it drains.
    pub fn in_flight(self, stage: usize, stages: usize, m: usize, ahead: usize) -> usize {
        let held = (self.warm_up(stage, stages, m, ahead) + 1).min(m);
        match self {
            PipelineSchedule::ZeroBubble => held + usize::from(stage > 0),
            PipelineSchedule::OneFOneBDeferred if stage > 0 && stage + 1 == stages => {
                held.max(DEFERRED_WEIGHTS.min(m))
            }
            _ => held,
        }
    }
}

/// The backward passes at the end of a step whose weights' gradients each
/// stage after the first defers under [`PipelineSchedule::OneFOneBDeferred`]:
/// two, so that the last stage of a pipeline of two, whose second-last
/// weights' pass would otherwise run before its last input gradient, sends
/// that gradient as early as it can (a stage's weights' pass is a third
/// to a half of its backward pass, and the first stage drains in one whole
/// backward pass), while no stage holds more than one micro-batch more
/// than 1F1B.
pub const DEFERRED_WEIGHTS: usize = 2;

/// The largest run-ahead ([`Schedule::run_ahead`]) a plan may give: a
/// stage then holds up to 64 times the micro-batches 1F1B has it hold.
pub const MAX_RUN_AHEAD: usize = 64;

/// The run-ahead `polychip train --plan auto` gives a pipeline whose
/// stages' memory allows it (else the largest that fits, and 1 where it
/// would lengthen the simulated step): each stage may run up to four
/// micro-batches per later stage ahead of the next. Measured on the two
/// bundled vendors (`deep`, 512 sequences, docs/performance.md, "Running
/// ahead"): as fast as 1F1B on a quiet machine (six paired runs, median
/// 0.4% faster, -2.3% to +2.0%), and beside a CPU hog free to move between
/// the cores 76% of the quiet throughput kept against 1F1B's 56%: the
/// buffered micro-batches carry one stage through the time the hog holds
/// the other's core.
pub const AUTO_RUN_AHEAD: usize = 4;

impl std::str::FromStr for PipelineSchedule {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "1f1b" => Ok(PipelineSchedule::OneFOneB),
            "zero-bubble" => Ok(PipelineSchedule::ZeroBubble),
            "1f1b-deferred" => Ok(PipelineSchedule::OneFOneBDeferred),
            "gpipe" => Ok(PipelineSchedule::GPipe),
            _ => Err(format!(
                "unknown pipeline schedule `{s}`: expected 1f1b, 1f1b-deferred, zero-bubble or gpipe"
            )),
        }
    }
}

/// One pipeline's step: its stages in order and the micro-batch count.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Schedule {
    /// Stages, first to last.
    pub stages: Vec<StageTiming>,
    /// Micro-batches per step (`m`).
    pub microbatches: usize,
    /// The order of each stage's passes.
    #[serde(default)]
    pub pipeline: PipelineSchedule,
    /// Model chunks per device (`v`): 1, or under Megatron-LM's interleaved
    /// 1F1B schedule (Narayanan et al., 2021) more, when `stages` lists the
    /// `p v` chunks in model order and chunk `k` runs on device `k mod p`
    /// ([`crate::sim`]).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub virtual_stages: usize,
    /// How far each stage may run ahead of the next, as a multiple of the
    /// schedule's own lead ([`PipelineSchedule::warm_up`]): 1 (the
    /// schedule as published) or more, at most [`MAX_RUN_AHEAD`]. A stage
    /// that runs further ahead holds more micro-batches' activations and
    /// buffers more of them for the next stage, which then rides out a
    /// slow spell of its neighbour instead of waiting on it.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub run_ahead: usize,
}

fn one() -> usize {
    1
}

fn is_one(v: &usize) -> bool {
    *v == 1
}

/// The model chunks a device of an interleaved pipeline of `p` devices, `v`
/// chunks each, and `m` micro-batches holds activations for at most:
/// Megatron-LM's warm-up, `2 (p - i - 1) + (v - 1) p` chunk passes (all of
/// them when `m = p`), and one more, of the `m v` it runs.
pub fn interleaved_in_flight(device: usize, p: usize, v: usize, m: usize) -> usize {
    (interleaved_warm_up(device, p, v, m) + 1).min(m * v)
}

/// The forward chunk passes device `device` of `p` runs before its first
/// backward one under the interleaved schedule, less one (as
/// [`PipelineSchedule::warm_up`]).
pub fn interleaved_warm_up(device: usize, p: usize, v: usize, m: usize) -> usize {
    let total = m * v;
    if m == p {
        return total;
    }
    (2 * p.saturating_sub(device + 1) + (v - 1) * p).min(total)
}

impl Schedule {
    /// Devices in the pipeline (`p`): its stages, or under interleaving
    /// its chunks over `v`.
    pub fn devices(&self) -> usize {
        self.stages.len() / self.virtual_stages.max(1)
    }

    /// The analytic 1F1B step time with unequal stages (Metis, AMP):
    /// `T = (m - 1) * max_i t_i + sum_i t_i + p2p + max_i (dp_i + opt_i)`,
    /// where `t_i = forward_i + backward_i`, and `p2p` is the forward and
    /// backward transfers of one micro-batch through the whole pipeline
    /// (`2 * sum_i send_next_i`).
    ///
    /// Under interleaving (`v` chunks per device, `t_i` the sum of device
    /// `i`'s chunks, `dp_i + opt_i` too) the fill and drain shrink by `v`
    /// (Narayanan et al., 2021): `T = (m - 1/v) max_i t_i + (sum_i t_i +
    /// p2p) / v + max_i (dp_i + opt_i)`, which is the formula above at `v =
    /// 1` and `(m + (p - 1)/v) t` for equal stages.
    pub fn analytic_step_time(&self) -> f64 {
        let p = self.devices().max(1);
        let v = self.virtual_stages.max(1);
        let mut t = vec![0.0; p];
        let mut tail = vec![0.0; p];
        for (k, s) in self.stages.iter().enumerate() {
            t[k % p] += s.forward + s.backward;
            tail[k % p] += s.dp_allreduce + s.optimizer;
        }
        let max = t.iter().cloned().fold(0.0, f64::max);
        let sum: f64 = t.iter().sum();
        let p2p: f64 = 2.0 * self.stages.iter().map(|s| s.send_next).sum::<f64>();
        let tail = tail.iter().cloned().fold(0.0, f64::max);
        let m = self.microbatches.max(1) as f64;
        let v = v as f64;
        (m - 1.0 / v) * max + (sum + p2p) / v + tail
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stage(f: f64, b: f64) -> StageTiming {
        StageTiming {
            name: String::new(),
            forward: f,
            backward: b,
            send_next: 0.0,
            dp_allreduce: 0.0,
            optimizer: 0.0,
            sends_async: false,
            weight_grad: 0.0,
        }
    }

    #[test]
    fn gpipe_runs_every_forward_first_and_holds_every_micro_batch() {
        use crate::sim::{Pass, stage_order, step};
        let (p, m) = (3usize, 5usize);
        for i in 0..p {
            let order = stage_order(i, p, m, PipelineSchedule::GPipe, 1);
            let passes: Vec<Pass> = order.iter().map(|&(pass, _)| pass).collect();
            assert_eq!(passes[..m], [Pass::Forward; 5]);
            assert_eq!(passes[m..], [Pass::Backward; 5]);
            assert_eq!(PipelineSchedule::GPipe.in_flight(i, p, m, 1), m);
        }
        assert_eq!("gpipe".parse(), Ok(PipelineSchedule::GPipe));
        // Equal stages: the same step as 1F1B, (m + p - 1) t.
        let mut s = Schedule {
            stages: (0..p).map(|_| stage(1.0, 2.0)).collect(),
            microbatches: m,
            pipeline: PipelineSchedule::GPipe,
            virtual_stages: 1,
            run_ahead: 1,
        };
        let gpipe = step(&s).step_time;
        s.pipeline = PipelineSchedule::OneFOneB;
        assert!(
            (gpipe - step(&s).step_time).abs() < 1e-9 && (gpipe - 21.0).abs() < 1e-9,
            "{gpipe}"
        );
    }

    #[test]
    fn deferred_weights_split_the_last_two_passes_and_run_their_weights_last() {
        use crate::sim::{Pass, stage_order, step};
        use PipelineSchedule::OneFOneBDeferred as D;
        let (p, m) = (2usize, 4usize);
        // The first stage sends no gradient: 1F1B's order, nothing split.
        assert_eq!(
            stage_order(0, p, m, D, 1),
            stage_order(0, p, m, PipelineSchedule::OneFOneB, 1)
        );
        let last = stage_order(1, p, m, D, 1);
        use Pass::{Backward as B, Forward as F, Weights as W};
        let want = [
            (F, 0),
            (B, 0),
            (F, 1),
            (B, 1),
            (F, 2),
            (B, 2),
            (F, 3),
            (B, 3),
        ];
        assert_eq!(last[..8], want);
        assert_eq!(last[8..], [(W, 2), (W, 3)]);
        assert!((0..m).all(|j| D.splits(1, j, m) == (j >= 2) && !D.splits(0, j, m)));
        // A middle stage drains its last two before their weights' passes.
        let middle = stage_order(1, 3, m, D, 1);
        assert_eq!(middle[middle.len() - 4..], [(B, 2), (B, 3), (W, 2), (W, 3)]);
        // The last stage holds the second-last micro-batch's inputs while
        // it runs the last forward pass; the others hold what 1F1B does.
        assert_eq!(D.in_flight(1, p, m, 4), 2);
        assert_eq!(D.in_flight(1, p, 1, 1), 1);
        assert_eq!(D.in_flight(0, p, m, 1), 2);
        assert_eq!(D.in_flight(0, 1, m, 1), 1);
        assert_eq!("1f1b-deferred".parse(), Ok(D));
        assert_eq!(D.name(), "1f1b-deferred");
        // Forward 1, backward 2 of which the weights' part 1: the first
        // stage's last backward pass starts after the last stage's input
        // gradient, a weights' pass earlier than under 1F1B (15).
        let stage = |f, b| StageTiming {
            weight_grad: 1.0,
            ..stage(f, b)
        };
        let mut s = Schedule {
            stages: vec![stage(1.0, 2.0), stage(1.0, 2.0)],
            microbatches: m,
            pipeline: PipelineSchedule::OneFOneB,
            virtual_stages: 1,
            run_ahead: 1,
        };
        assert!((step(&s).step_time - 15.0).abs() < 1e-12);
        s.pipeline = D;
        assert!((step(&s).step_time - 14.0).abs() < 1e-12, "{:?}", step(&s));
    }

    #[test]
    fn running_ahead_multiplies_the_lead_of_every_stage_but_the_last() {
        use PipelineSchedule::*;
        let (p, m) = (4usize, 64usize);
        for i in 0..p {
            let depth = p - i - 1;
            for ahead in [1, 2, 4] {
                assert_eq!(OneFOneB.warm_up(i, p, m, ahead), depth * ahead);
                assert_eq!(ZeroBubble.warm_up(i, p, m, ahead), 2 * depth * ahead);
                assert_eq!(GPipe.warm_up(i, p, m, ahead), m - 1);
                assert_eq!(OneFOneB.in_flight(i, p, m, ahead), depth * ahead + 1);
            }
            // 0 is the schedule as published.
            assert_eq!(OneFOneB.warm_up(i, p, m, 0), depth);
        }
        // The last stage runs each backward pass after its forward pass,
        // however far the others run ahead; no stage holds more than the
        // step's micro-batches, however large the multiple.
        assert_eq!(OneFOneB.in_flight(p - 1, p, m, MAX_RUN_AHEAD), 1);
        assert_eq!(ZeroBubble.in_flight(0, p, 5, usize::MAX), 5);
        assert_eq!(OneFOneB.warm_up(0, usize::MAX, 3, usize::MAX), 3);
    }

    #[test]
    fn running_ahead_keeps_every_pass_and_its_order_within_each_kind() {
        use crate::sim::{Pass, stage_order};
        for schedule in [
            PipelineSchedule::OneFOneB,
            PipelineSchedule::OneFOneBDeferred,
            PipelineSchedule::ZeroBubble,
        ] {
            for (p, m) in [(2usize, 9usize), (3, 16), (4, 3)] {
                for i in 0..p {
                    for ahead in [1, 3, 64] {
                        let order = stage_order(i, p, m, schedule, ahead);
                        for pass in [Pass::Forward, Pass::Backward] {
                            let of: Vec<usize> = order
                                .iter()
                                .filter(|(x, _)| *x == pass)
                                .map(|&(_, j)| j)
                                .collect();
                            assert_eq!(of, (0..m).collect::<Vec<_>>(), "{schedule:?} {i}");
                        }
                        // A micro-batch's backward pass after its forward.
                        let at = |pass, j| order.iter().position(|&x| x == (pass, j));
                        assert!((0..m).all(|j| at(Pass::Forward, j) < at(Pass::Backward, j)));
                        let warm = schedule.warm_up(i, p, m, ahead);
                        let first_b = at(Pass::Backward, 0).unwrap();
                        assert_eq!(first_b, (warm + 1).min(m), "{schedule:?} {i} {ahead}");
                    }
                }
            }
        }
    }

    #[test]
    fn equal_stages_give_the_textbook_bubble() {
        // p equal stages of t each, m micro-batches: (m + p - 1) * t, so the
        // bubble fraction is (p - 1) / (m + p - 1).
        let (p, m, t) = (4usize, 8usize, 1.0);
        let s = Schedule {
            stages: (0..p).map(|_| stage(t / 3.0, 2.0 * t / 3.0)).collect(),
            microbatches: m,
            pipeline: Default::default(),
            virtual_stages: 1,
            run_ahead: 1,
        };
        let time = s.analytic_step_time();
        assert!((time - (m + p - 1) as f64 * t).abs() < 1e-12);
        let bubble = 1.0 - (m as f64 * t) / time;
        assert!((bubble - (p - 1) as f64 / (m + p - 1) as f64).abs() < 1e-12);
    }
}
