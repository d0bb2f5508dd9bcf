//! One pipeline stage of the LLaMA-architecture decoder on one device:
//! its parameters (f32 master weights, AdamW state, gradients, and a bf16
//! compute copy in bf16 mode) and the forward and backward pass of a
//! micro-batch, every operator dispatched through the host to the device's
//! plugin.
//!
//! Per block: `h1 = rms_norm(x)`, `q, k, v = h1 Wq^T, h1 Wk^T, h1 Wv^T`,
//! rotary embeddings on q and k, causal grouped-query attention,
//! `x2 = x + attn Wo^T`, `h2 = rms_norm(x2)`,
//! `x3 = x2 + swiglu(h2 W1^T, h2 W3^T) W2^T`. The last stage adds the final
//! norm, the output head and the mean cross-entropy.

mod layer;
pub mod ops;
mod optim;
mod weight_grads;

use std::cell::RefCell;

use polychip_host::{DType, Device, Tensor};

use crate::config::{ModelConfig, Precision};
use crate::error::Result;
use crate::params::{
    ATTENTION_PARAMS, BLOCK_PARAMS, InitialWeights, ParamSpec, StageRange, stage_params,
};
use layer::HalfSaved;
use ops::{OpRecord, Ops};
pub use weight_grads::WeightGrads;
use weight_grads::{Item, Unit};

/// One parameter on the device.
#[derive(Debug)]
pub struct Param {
    /// Name, shape and initialization.
    pub spec: ParamSpec,
    /// f32 master value.
    pub value: Tensor,
    /// Compute copy (bf16 mode only).
    pub compute: Option<Tensor>,
    /// Gradient accumulated over the step's micro-batches, compute dtype.
    pub grad: Tensor,
    /// f32 gradient for reduction and the optimizer (bf16 mode only).
    pub grad32: Option<Tensor>,
    /// AdamW first moment.
    pub exp_avg: Tensor,
    /// AdamW second moment.
    pub exp_avg_sq: Tensor,
}

impl Param {
    /// The weight the forward pass reads.
    pub fn weight(&self) -> &Tensor {
        self.compute.as_ref().unwrap_or(&self.value)
    }

    /// The f32 gradient the optimizer reads (after [`Stage::finish_grads`]).
    pub fn grad_f32(&self) -> &Tensor {
        self.grad32.as_ref().unwrap_or(&self.grad)
    }
}

/// What the first stage's input is, or the activation a later stage received.
#[derive(Debug)]
pub enum StageInput {
    /// Token ids `[b, s]` (i32) on the device: the first stage.
    Tokens(Tensor),
    /// The previous stage's output `[b, s, dim]`.
    Hidden(Tensor),
}

/// Activations of the final norm and head.
#[derive(Debug)]
struct HeadSaved {
    x: Tensor,
    hn: Tensor,
    inv: Tensor,
    logits: Tensor,
    targets: Tensor,
}

/// Everything a micro-batch's backward pass needs.
#[derive(Debug)]
pub struct Saved {
    batch: usize,
    tokens: Option<Tensor>,
    halves: Vec<HalfSaved>,
    head: Option<HeadSaved>,
}

/// One pipeline stage's parameters and passes on one device.
#[derive(Debug)]
pub struct Stage {
    cfg: ModelConfig,
    range: StageRange,
    precision: Precision,
    device: Device,
    params: Vec<Param>,
    /// Every f32 master value, packed in parameter order (each
    /// `Param::value` is a view): a sharded optimizer step gathers spans.
    values: Tensor,
    /// The AdamW moments, packed likewise.
    moments: [Tensor; 2],
    /// Every gradient, packed in parameter order (each `Param::grad` is a view).
    grads: Tensor,
    /// The f32 gradients packed likewise (bf16 mode).
    grads32: Option<Tensor>,
    /// Each parameter's first element in the packed gradients.
    offsets: Vec<usize>,
    /// The index in `params` of each held half block's first parameter, in
    /// [`StageRange::halves`] order.
    half_starts: Vec<usize>,
    cos: Tensor,
    sin: Tensor,
    tape: Option<RefCell<Vec<OpRecord>>>,
}

/// Parameters [`stage_params`] lists for half block `half` of `range`: 5
/// for an attention half, 4 for a feed-forward half (one fewer when held
/// from a part past its first: its norm is the earlier stage's).
pub(crate) fn half_param_count(range: &StageRange, half: usize) -> usize {
    let n = match half % 2 {
        0 => ATTENTION_PARAMS,
        _ => BLOCK_PARAMS.len() - ATTENTION_PARAMS,
    };
    n - usize::from(!range.holds_norm(half))
}

/// Row-major strides of `shape`.
fn compact_strides(shape: &[i64]) -> Vec<i64> {
    let mut strides = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    strides
}

impl Stage {
    /// Allocates the stage's parameters on `device`, initialized from
    /// `seed` (the same values whatever the split), and zeroed AdamW state.
    pub fn new(
        cfg: &ModelConfig,
        range: StageRange,
        precision: Precision,
        device: &Device,
        seed: u64,
    ) -> Result<Stage> {
        Self::with_weights(
            cfg,
            range,
            precision,
            device,
            &mut InitialWeights::Seed(seed),
        )
    }

    /// Allocates the stage's parameters on `device` with the initial values
    /// `weights` gives (by name: the same values whatever the split), and
    /// zeroed AdamW state.
    pub fn with_weights(
        cfg: &ModelConfig,
        range: StageRange,
        precision: Precision,
        device: &Device,
        weights: &mut InitialWeights,
    ) -> Result<Stage> {
        let dt = precision.dtype();
        let bf16 = precision == Precision::Bf16;
        let specs = stage_params(cfg, &range);
        let total: usize = specs.iter().map(ParamSpec::numel).sum();
        let grads = device.zeros(dt, &[total as i64])?;
        let grads32 = match bf16 {
            true => Some(device.zeros(DType::F32, &[total as i64])?),
            false => None,
        };
        let mut initial = Vec::with_capacity(total);
        for spec in &specs {
            initial.extend(weights.take(spec)?);
        }
        let values = device.from_slice(&initial, &[total as i64])?;
        drop(initial);
        let moments = [
            device.zeros(DType::F32, &[total as i64])?,
            device.zeros(DType::F32, &[total as i64])?,
        ];
        let mut params = Vec::new();
        let mut offsets = Vec::new();
        let mut at = 0;
        for spec in specs {
            let compute = match bf16 {
                true => Some(device.empty(dt, &spec.shape)?),
                false => None,
            };
            let strides = compact_strides(&spec.shape);
            let off = at as i64;
            let view = |flat: &Tensor| flat.as_strided(&spec.shape, &strides, off);
            let grad32 = grads32.as_ref().map(view).transpose()?;
            offsets.push(at);
            at += spec.numel();
            params.push(Param {
                grad: view(&grads)?,
                value: view(&values)?,
                exp_avg: view(&moments[0])?,
                exp_avg_sq: view(&moments[1])?,
                spec,
                compute,
                grad32,
            });
        }
        let mut half_starts = Vec::new();
        let mut first = usize::from(range.embed);
        for h in range.halves() {
            half_starts.push(first);
            first += half_param_count(&range, h);
        }
        let (cos, sin) = rope_tables(cfg);
        let half = (cfg.head_dim() / 2) as i64;
        let shape = [cfg.seq_len as i64, half];
        let stage = Stage {
            cfg: cfg.clone(),
            range,
            precision,
            cos: device.from_slice(&cos, &shape)?,
            sin: device.from_slice(&sin, &shape)?,
            device: device.clone(),
            params,
            values,
            moments,
            grads,
            grads32,
            offsets,
            half_starts,
            tape: None,
        };
        stage.refresh_compute_weights()?;
        Ok(stage)
    }

    /// The half blocks and ends it holds.
    pub fn range(&self) -> StageRange {
        self.range
    }

    /// The shape of the activation a later stage receives from it for a
    /// micro-batch of `b` sequences: `[b, seq_len, dim]`, or the pair
    /// `[2, b, seq_len, dim]` across a cut inside a half. The gradient
    /// sent back has the same shape.
    pub fn activation_shape(cfg: &ModelConfig, pair: bool, b: usize) -> Vec<i64> {
        let one = [b as i64, cfg.seq_len as i64, cfg.dim as i64];
        match pair {
            true => [&[2][..], &one[..]].concat(),
            false => one.to_vec(),
        }
    }

    /// The shape of its input activation (not the first stage's).
    pub fn input_shape(&self, b: usize) -> Vec<i64> {
        Self::activation_shape(&self.cfg, self.range.takes_pair(), b)
    }

    /// The shape of its output activation (not the last stage's).
    pub fn output_shape(&self, b: usize) -> Vec<i64> {
        Self::activation_shape(&self.cfg, self.range.gives_pair(), b)
    }

    /// The device it runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The model's shape.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// Its parameters, in [`stage_params`] order.
    pub fn params(&self) -> &[Param] {
        &self.params
    }

    /// The compute dtype.
    pub fn dtype(&self) -> DType {
        self.precision.dtype()
    }

    /// The precision it trains in.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// The half block each parameter belongs to (see
    /// [`StageRange::halves`]), in [`Self::params`] order; `None` for the
    /// embedding's and the final norm's and head's.
    pub fn param_halves(&self) -> Vec<Option<usize>> {
        let mut out = vec![None; self.params.len()];
        for (h, &first) in self.range.halves().zip(&self.half_starts) {
            let n = half_param_count(&self.range, h);
            for o in &mut out[first..first + n] {
                *o = Some(h);
            }
        }
        out
    }

    /// Starts (or stops, with `false`) recording every operator call.
    pub fn record(&mut self, on: bool) {
        self.tape = on.then(|| RefCell::new(Vec::new()));
    }

    /// The calls recorded since [`Stage::record`].
    pub fn take_records(&mut self) -> Vec<OpRecord> {
        self.tape.as_ref().map(|t| t.take()).unwrap_or_default()
    }

    fn ops(&self) -> Ops<'_> {
        Ops::new(self.device.exec(), self.tape.as_ref())
    }

    fn empty(&self, shape: &[usize]) -> Result<Tensor> {
        let s: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
        Ok(self.device.empty(self.dtype(), &s)?)
    }

    fn empty_f32(&self, shape: &[usize]) -> Result<Tensor> {
        let s: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
        Ok(self.device.empty(DType::F32, &s)?)
    }

    /// Parameter `which` ([`crate::params::block`]) of block `layer`, a
    /// block whose half holding it the stage holds (a half held from a
    /// part past its first holds no norm).
    fn block_param(&self, layer: usize, which: usize) -> &Param {
        let ffn = usize::from(which >= ATTENTION_PARAMS);
        let half = 2 * layer + ffn;
        let mut at = which - ffn * ATTENTION_PARAMS;
        if !self.range.holds_norm(half) {
            // The half's norm is the earlier stage's: its first parameter.
            debug_assert!(at != 0);
            at -= 1;
        }
        &self.params[self.half_first_param(half) + at]
    }

    /// The index in [`Stage::params`] of the first parameter of half block
    /// `half`, one the stage holds.
    fn half_first_param(&self, half: usize) -> usize {
        self.half_starts[half - self.range.start.half]
    }

    fn head_params(&self) -> (&Param, &Param) {
        let n = self.params.len();
        (&self.params[n - 2], &self.params[n - 1])
    }

    /// Forward pass of a micro-batch of `b` sequences. Returns what the
    /// backward pass needs, the output activation `[b, s, dim]` (not for
    /// the last stage) and, on the last stage, the micro-batch's mean loss.
    /// `targets` (i32 `[b * s]`) is required on the last stage.
    pub fn forward(
        &self,
        input: StageInput,
        targets: Option<Tensor>,
    ) -> Result<(Saved, Option<Tensor>, Option<f32>)> {
        let c = &self.cfg;
        let ops = self.ops();
        let (mut x, tokens, b) = match input {
            StageInput::Tokens(tokens) => {
                let b = tokens.shape()[0] as usize;
                let x = self.empty(&[b, c.seq_len, c.dim])?;
                ops.embedding("tok_embeddings", self.params[0].weight(), &tokens, &x)?;
                (x, Some(tokens), b)
            }
            StageInput::Hidden(x) => {
                // The batch is the first axis, or the second of a pair.
                let at = usize::from(self.range.takes_pair());
                let b = x.shape().get(at).map_or(0, |&b| b as usize);
                let want = self.input_shape(b);
                if x.shape() != want.as_slice() {
                    return Err(crate::TrainError::Plan(format!(
                        "stage {}..{} takes an activation of shape {want:?}, not {:?}",
                        self.range.start,
                        self.range.end,
                        x.shape()
                    )));
                }
                (x, None, b)
            }
        };
        let mut halves = Vec::with_capacity(self.range.halves().len());
        for half in self.range.halves() {
            let (saved, out) = self.half_forward(half, x, b)?;
            halves.push(saved);
            x = out;
        }
        if !self.range.head {
            return Ok((
                Saved {
                    batch: b,
                    tokens,
                    halves,
                    head: None,
                },
                Some(x),
                None,
            ));
        }
        let targets = targets.ok_or_else(|| {
            crate::TrainError::Plan("the last stage's forward pass needs the targets".into())
        })?;
        let (hn2, inv, logits) = self.head_forward(&x, b)?;
        let loss_t = self.empty_f32(&[])?;
        ops.cross_entropy("loss", &logits, &targets, &loss_t)?;
        let loss = loss_t.to_vec::<f32>()?[0];
        let head = HeadSaved {
            x,
            hn: hn2,
            inv,
            logits,
            targets,
        };
        Ok((
            Saved {
                batch: b,
                tokens,
                halves,
                head: Some(head),
            },
            None,
            Some(loss),
        ))
    }

    /// The final norm and the output head of `x` `[b, s, dim]`: the normed
    /// activations `[b * s, dim]`, the norm's inverse RMS and the logits
    /// `[b * s, vocab]`.
    fn head_forward(&self, x: &Tensor, b: usize) -> Result<(Tensor, Tensor, Tensor)> {
        let c = &self.cfg;
        let ops = self.ops();
        let (norm, out_w) = self.head_params();
        let n = b * c.seq_len;
        let hn = self.empty(&[b, c.seq_len, c.dim])?;
        let inv = self.empty_f32(&[b, c.seq_len])?;
        ops.rms_norm("norm", x, norm.weight(), &hn, &inv, c.norm_eps)?;
        let logits = self.empty(&[n, c.vocab])?;
        let hn2 = hn.reshape(&[n as i64, c.dim as i64])?;
        ops.linear("output", &hn2, out_w.weight(), &logits)?;
        Ok((hn2, inv, logits))
    }

    /// The logits `[b * s, vocab]` of token ids `[b, s]` (i32, `s` the
    /// model's `seq_len`) on a stage that holds the whole model: the same
    /// forward pass as training's, up to the output head, without the loss.
    pub fn logits(&self, tokens: Tensor) -> Result<Tensor> {
        if !(self.range.embed && self.range.head) {
            return Err(crate::TrainError::Plan(
                "logits need a stage holding the whole model".into(),
            ));
        }
        let (b, s) = match tokens.shape() {
            &[b, s] => (b as usize, s as usize),
            other => {
                return Err(crate::TrainError::Plan(format!(
                    "logits take token ids of shape [batch, seq_len], not {other:?}"
                )));
            }
        };
        if s != self.cfg.seq_len {
            return Err(crate::TrainError::Plan(format!(
                "logits of {s} tokens on a stage built for sequences of {}",
                self.cfg.seq_len
            )));
        }
        let mut x = self.empty(&[b, s, self.cfg.dim])?;
        self.ops()
            .embedding("tok_embeddings", self.params[0].weight(), &tokens, &x)?;
        for half in self.range.halves() {
            let (_, out) = self.half_forward(half, x, b)?;
            x = out;
        }
        let (_, _, logits) = self.head_forward(&x, b)?;
        Ok(logits)
    }

    /// RMSNorm backward: returns the input's gradient and adds the weight's
    /// (which the operator writes, not accumulates) to the parameter's.
    fn norm_backward(
        &self,
        label: &str,
        g: &Tensor,
        x: &Tensor,
        norm: &Param,
        inv: &Tensor,
    ) -> Result<Tensor> {
        let ops = self.ops();
        let gx = self.device.empty(self.dtype(), x.shape())?;
        let gw = self
            .device
            .empty(self.dtype(), norm.spec.shape.as_slice())?;
        ops.rms_norm_backward(label, g, x, norm.weight(), inv, &gx, &gw)?;
        ops.add(label, &norm.grad, &gw, &norm.grad)?;
        Ok(gx)
    }

    /// Backward pass of a micro-batch: accumulates the parameters'
    /// gradients and returns the gradient of the stage's input activation
    /// (not on the first stage). The last stage starts from the loss with
    /// weight `loss_weight` (the micro-batch's share of the global batch);
    /// other stages from `grad_out`, the next stage's input gradient.
    pub fn backward(
        &self,
        saved: Saved,
        grad_out: Option<Tensor>,
        loss_weight: f64,
    ) -> Result<Option<Tensor>> {
        self.backward_with(saved, grad_out, loss_weight, &mut |_| Ok(()))
    }

    /// [`Stage::backward`], calling `done(from)` each time the pass has
    /// finished a unit (the head, each half block, the embedding): the
    /// gradients of parameters `from..` (indices into [`Stage::params`])
    /// then hold every contribution of this pass, and the pass touches them
    /// no more. `from` falls, down to 0 at the end.
    pub fn backward_with(
        &self,
        saved: Saved,
        grad_out: Option<Tensor>,
        loss_weight: f64,
        done: &mut dyn FnMut(usize) -> Result<()>,
    ) -> Result<Option<Tensor>> {
        self.backward_units(saved, grad_out, loss_weight, &mut |unit| {
            let from = unit.from;
            self.run_unit(unit)?;
            done(from)
        })
    }

    /// The backward pass's input gradients, handing each unit's weight
    /// gradient work to `unit_done` as the unit finishes.
    fn backward_units(
        &self,
        saved: Saved,
        grad_out: Option<Tensor>,
        loss_weight: f64,
        unit_done: &mut dyn FnMut(Unit) -> Result<()>,
    ) -> Result<Option<Tensor>> {
        let c = &self.cfg;
        let ops = self.ops();
        let b = saved.batch;
        let (s, d) = (c.seq_len, c.dim);
        let mut g = match saved.head {
            Some(h) => {
                let (norm, out_w) = self.head_params();
                let n = (b * s) as i64;
                let gl = self.empty(&[b * s, c.vocab])?;
                ops.cross_entropy_backward("loss", &h.logits, &h.targets, &gl, loss_weight)?;
                let ghn = self.empty(&[b, s, d])?;
                let ghn2 = ghn.reshape(&[n, d as i64])?;
                let mut items = Vec::new();
                self.linear_backward(&mut items, "output".into(), &gl, &h.hn, out_w, &ghn2, false)?;
                let g = self.norm_backward("norm", &ghn, &h.x, norm, &h.inv)?;
                let from = self.params.len() - 2;
                unit_done(Unit { from, items })?;
                g
            }
            None => grad_out.ok_or_else(|| {
                crate::TrainError::Plan("a middle stage's backward pass needs grad_out".into())
            })?,
        };
        for (half, hs) in self.range.halves().zip(saved.halves).rev() {
            let mut items = Vec::new();
            g = self.half_backward(half, hs, g, b, &mut items)?;
            let from = self.half_first_param(half);
            unit_done(Unit { from, items })?;
        }
        match saved.tokens {
            Some(tokens) => {
                let grad = self.params[0].grad.clone();
                let items = vec![Item::Embedding { g, tokens, grad }];
                unit_done(Unit { from: 0, items })?;
                Ok(None)
            }
            None => Ok(Some(g)),
        }
    }
}

/// The rotary tables `[seq_len, head_dim / 2]`: `cos(pos * theta^(-2i/hd))`
/// and the sines.
pub fn rope_tables(cfg: &ModelConfig) -> (Vec<f32>, Vec<f32>) {
    let half = cfg.head_dim() / 2;
    let mut cos = Vec::with_capacity(cfg.seq_len * half);
    let mut sin = Vec::with_capacity(cfg.seq_len * half);
    for pos in 0..cfg.seq_len {
        for i in 0..half {
            let freq = cfg.rope_theta.powf(-2.0 * i as f64 / cfg.head_dim() as f64);
            let angle = pos as f64 * freq;
            cos.push(angle.cos() as f32);
            sin.push(angle.sin() as f32);
        }
    }
    (cos, sin)
}
