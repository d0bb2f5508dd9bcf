//! The step's gradient bookkeeping and optimizer on one stage: zeroing,
//! the f32 copy (bf16 mode), the packed view the reduction reads, the norm
//! for clipping, clipping, and AdamW.

use polychip_host::{AdamwOptions, Tensor};

use super::Stage;
use crate::config::TrainConfig;
use crate::error::Result;

impl Stage {
    /// Zeroes the gradients (start of a step).
    pub fn zero_grads(&self) -> Result<()> {
        self.ops().fill(&self.grads, 0.0)
    }

    /// After the last micro-batch: the f32 gradients the reduction and the
    /// optimizer read (a cast in bf16 mode, nothing in f32).
    pub fn finish_grads(&self) -> Result<()> {
        match &self.grads32 {
            Some(g32) => self.ops().cast("gradients", &self.grads, g32),
            None => Ok(()),
        }
    }

    /// The packed f32 gradients of parameters `range` (indices into
    /// [`Stage::params`]), one 1-dimensional view.
    pub fn grad_span(&self, range: std::ops::Range<usize>) -> Result<Tensor> {
        let flat = self.grads32.as_ref().unwrap_or(&self.grads);
        let start = self.offsets[range.start];
        let end = match self.offsets.get(range.end) {
            Some(&e) => e,
            None => flat.numel(),
        };
        Ok(flat.as_strided(&[(end - start) as i64], &[1], start as i64)?)
    }

    /// Copies the master weights into the compute copies (bf16 mode).
    pub fn refresh_compute_weights(&self) -> Result<()> {
        let ops = self.ops();
        for p in &self.params {
            if let Some(c) = &p.compute {
                ops.cast(&p.spec.name, &p.value, c)?;
            }
        }
        Ok(())
    }

    /// This stage's sum of squared f32 gradients (for clipping).
    pub fn grad_sum_squares(&self) -> Result<f64> {
        let out = self.empty_f32(&[])?;
        let all = self.grad_span(0..self.params.len())?;
        self.ops().sum_squares("gradients", &all, &out)?;
        Ok(f64::from(out.to_vec::<f32>()?[0]))
    }

    /// Scales the f32 gradients by `alpha` (clipping).
    pub fn scale_grads(&self, alpha: f64) -> Result<()> {
        let all = self.grad_span(0..self.params.len())?;
        self.ops().scale("gradients", &all, alpha)
    }

    /// One AdamW step of every parameter (1-based `step`, learning rate
    /// `lr`), then refreshes the compute copies.
    pub fn adamw(&self, t: &TrainConfig, step: u64, lr: f64) -> Result<()> {
        let ops = self.ops();
        for p in &self.params {
            let h = AdamwOptions {
                lr,
                beta1: t.beta1,
                beta2: t.beta2,
                eps: t.eps,
                weight_decay: if p.spec.decayed() {
                    t.weight_decay
                } else {
                    0.0
                },
                step: step as i64,
            };
            let label = format!("{} (optimizer)", p.spec.name);
            ops.adamw(
                &label,
                [&p.value, p.grad_f32(), &p.exp_avg, &p.exp_avg_sq],
                &h,
            )?;
        }
        self.refresh_compute_weights()
    }
}
