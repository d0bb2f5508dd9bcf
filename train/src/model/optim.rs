//! The step's gradient bookkeeping and optimizer on one stage: zeroing,
//! the f32 copy (bf16 mode), the packed view the reduction reads, the norm
//! for clipping, clipping, and AdamW.

use std::ops::Range;

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
        self.finish_grads_of(0..self.params.len())
    }

    /// [`Stage::finish_grads`] for parameters `range` (indices into
    /// [`Stage::params`]) alone: their gradients are final.
    pub fn finish_grads_of(&self, range: Range<usize>) -> Result<()> {
        match &self.grads32 {
            Some(_) if range.is_empty() => Ok(()),
            Some(g32) => {
                let elems = self.elements(range);
                self.ops().cast(
                    "gradients",
                    &span(&self.grads, elems.clone())?,
                    &span(g32, elems)?,
                )
            }
            None => Ok(()),
        }
    }

    /// The elements of parameters `range` (indices into [`Stage::params`])
    /// in the packed buffers: consecutive.
    pub fn elements(&self, range: Range<usize>) -> Range<usize> {
        let start = self.offsets[range.start];
        let end = match self.offsets.get(range.end) {
            Some(&e) => e,
            None => self.grads.numel(),
        };
        start..end
    }

    /// The packed f32 gradients of parameters `range` (indices into
    /// [`Stage::params`]), one 1-dimensional view.
    pub fn grad_span(&self, range: Range<usize>) -> Result<Tensor> {
        span(self.grad_f32(), self.elements(range))
    }

    /// The packed f32 master values of elements `elems`, one 1-dimensional
    /// view (a sharded optimizer step gathers these).
    pub fn value_span(&self, elems: Range<usize>) -> Result<Tensor> {
        span(&self.values, elems)
    }

    /// The packed AdamW moments of elements `elems` (gathered before a
    /// checkpoint when the step is sharded).
    pub fn moment_spans(&self, elems: Range<usize>) -> Result<[Tensor; 2]> {
        Ok([
            span(&self.moments[0], elems.clone())?,
            span(&self.moments[1], elems)?,
        ])
    }

    fn grad_f32(&self) -> &Tensor {
        self.grads32.as_ref().unwrap_or(&self.grads)
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

    /// The first master weight of this stage that is not finite: the
    /// parameter's name, the element's index in it and its value. One read
    /// of the weights to the host: called before a checkpoint is saved,
    /// not every step.
    pub fn first_non_finite_weight(&self) -> Result<Option<(String, usize, f32)>> {
        for p in &self.params {
            let values = p.value.to_vec::<f32>()?;
            if let Some(i) = values.iter().position(|v| !v.is_finite()) {
                return Ok(Some((p.spec.name.clone(), i, values[i])));
            }
        }
        Ok(None)
    }

    /// Scales the f32 gradients by `alpha` (clipping).
    pub fn scale_grads(&self, alpha: f64) -> Result<()> {
        let all = self.grad_span(0..self.params.len())?;
        self.ops().scale("gradients", &all, alpha)
    }

    /// One AdamW step of every parameter (1-based `step`, learning rate
    /// `lr`), then refreshes the compute copies.
    pub fn adamw(&self, t: &TrainConfig, step: u64, lr: f64) -> Result<()> {
        self.adamw_except(t, step, lr, &[])?;
        self.refresh_compute_weights()
    }

    /// One AdamW step of every element but those in `others` (element
    /// ranges of the packed buffers, sorted and disjoint: the shares of a
    /// sharded step that other ranks update). The compute copies are left
    /// to refresh once the shares are gathered. A parameter wholly its own is stepped as one tensor, a
    /// parameter cut by a share boundary piece by piece (AdamW is
    /// elementwise, so the values are the same).
    pub fn adamw_except(
        &self,
        t: &TrainConfig,
        step: u64,
        lr: f64,
        others: &[Range<usize>],
    ) -> Result<()> {
        let ops = self.ops();
        for (i, p) in self.params.iter().enumerate() {
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
            let mine = self.elements(i..i + 1);
            let pieces = subtract(mine.clone(), others);
            if pieces.first() == Some(&mine) {
                ops.adamw(
                    &label,
                    [&p.value, p.grad_f32(), &p.exp_avg, &p.exp_avg_sq],
                    &h,
                )?;
                continue;
            }
            for piece in pieces {
                let [m, v] = self.moment_spans(piece.clone())?;
                let value = self.value_span(piece.clone())?;
                let grad = span(self.grad_f32(), piece)?;
                ops.adamw(&label, [&value, &grad, &m, &v], &h)?;
            }
        }
        Ok(())
    }
}

/// Elements `elems` of the packed buffer `flat`, one 1-dimensional view.
fn span(flat: &Tensor, elems: Range<usize>) -> Result<Tensor> {
    Ok(flat.as_strided(&[elems.len() as i64], &[1], elems.start as i64)?)
}

/// `whole` less the sorted, disjoint ranges `cut`: what is left, in order.
fn subtract(whole: Range<usize>, cut: &[Range<usize>]) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut at = whole.start;
    for c in cut {
        if c.end <= at || c.start >= whole.end {
            continue;
        }
        if c.start > at {
            out.push(at..c.start);
        }
        at = at.max(c.end);
    }
    if at < whole.end {
        out.push(at..whole.end);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::subtract;

    #[test]
    #[allow(clippy::single_range_in_vec_init)]
    fn subtracting_share_ranges() {
        assert_eq!(subtract(0..10, &[]), vec![0..10]);
        assert_eq!(subtract(0..10, &[3..5]), vec![0..3, 5..10]);
        assert_eq!(subtract(4..10, &[0..5, 8..20]), vec![5..8]);
        assert_eq!(subtract(4..10, &[0..4, 10..12]), vec![4..10]);
        assert!(subtract(4..10, &[0..12]).is_empty());
        assert!(subtract(4..4, &[]).is_empty());
    }
}
