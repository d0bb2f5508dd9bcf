//! The weight-gradient part of a backward pass, kept apart from the input
//! gradients so that a pipeline stage may send its input gradient first
//! and compute its weights' gradients afterwards, in time it would
//! otherwise spend waiting (the zero-bubble schedules of Qi et al., 2024).
//!
//! Run straight after each unit (the fused backward pass) or later (the
//! split one), the same operators run on the same tensors, and each
//! parameter's gradient still accumulates micro-batch after micro-batch:
//! the bits are the same.

use polychip_host::Tensor;

use super::{Param, Stage};
use crate::error::Result;

/// One weight-gradient computation.
#[derive(Debug)]
pub(super) enum Item {
    /// `grad += g^T @ x` of a linear layer.
    Linear {
        label: String,
        g: Tensor,
        x: Tensor,
        grad: Tensor,
    },
    /// The token embedding's scatter-add of `g` into the rows `tokens`.
    Embedding {
        g: Tensor,
        tokens: Tensor,
        grad: Tensor,
    },
}

/// One unit's (the head, a half block, the embedding) weight-gradient
/// work: once it has run, the gradients of parameters `from..` hold every
/// contribution of the micro-batch.
#[derive(Debug)]
pub(super) struct Unit {
    pub(super) from: usize,
    pub(super) items: Vec<Item>,
}

/// The weight-gradient work one micro-batch's backward pass left, by unit
/// in the order the pass finished them (see [`Stage::backward_split`]).
#[derive(Debug, Default)]
pub struct WeightGrads {
    units: Vec<Unit>,
}

impl Stage {
    /// The input's gradient of `out = x @ w^T` now (`gx (+)= g @ w`,
    /// accumulating when `accumulate`); the weight's, `w.grad += g^T @ x`,
    /// as an item of `items`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn linear_backward(
        &self,
        items: &mut Vec<Item>,
        label: String,
        g: &Tensor,
        x: &Tensor,
        w: &Param,
        gx: &Tensor,
        accumulate: bool,
    ) -> Result<()> {
        self.ops()
            .linear_input_grad(&label, g, w.weight(), gx, accumulate)?;
        items.push(Item::Linear {
            label,
            g: g.clone(),
            x: x.clone(),
            grad: w.grad.clone(),
        });
        Ok(())
    }

    /// Runs one unit's items.
    pub(super) fn run_unit(&self, unit: Unit) -> Result<()> {
        let ops = self.ops();
        for item in unit.items {
            match item {
                Item::Linear { label, g, x, grad } => {
                    ops.linear_weight_grad(&label, &g, &x, &grad)?;
                }
                Item::Embedding { g, tokens, grad } => {
                    ops.embedding_backward("tok_embeddings", &g, &tokens, &grad)?;
                }
            }
        }
        Ok(())
    }

    /// Computes the weight gradients a split backward pass left, calling
    /// `done(from)` after each unit as [`Stage::backward_with`] does.
    pub fn weight_pass(
        &self,
        work: WeightGrads,
        done: &mut dyn FnMut(usize) -> Result<()>,
    ) -> Result<()> {
        for unit in work.units {
            let from = unit.from;
            self.run_unit(unit)?;
            done(from)?;
        }
        Ok(())
    }

    /// The backward pass of a micro-batch without its weight gradients:
    /// returns the input's gradient (as [`Stage::backward`]) and the work
    /// for [`Stage::weight_pass`]. Norm weights' gradients, which the
    /// operator computes with the input's, are accumulated here.
    pub fn backward_split(
        &self,
        saved: super::Saved,
        grad_out: Option<Tensor>,
        loss_weight: f64,
    ) -> Result<(Option<Tensor>, WeightGrads)> {
        let mut work = WeightGrads::default();
        let g = self.backward_units(saved, grad_out, loss_weight, &mut |u| {
            work.units.push(u);
            Ok(())
        })?;
        Ok((g, work))
    }
}
