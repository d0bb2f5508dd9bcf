//! One transformer block's forward and backward pass, as its two halves
//! (a pipeline may cut a block between them): the attention half (RMSNorm,
//! rotary grouped-query attention and residual) and the feed-forward half
//! (RMSNorm, SwiGLU and residual). A half may also be cut by its width
//! ([`crate::params::Cut`]: key/value heads, or hidden columns): each
//! stage then computes its own part's share of the half's output and adds
//! it to the residual sum, and the boundary carries a pair `[2, b, s,
//! dim]`, the normed input and the residual sum so far (the gradient going
//! back is the pair of their gradients).

use polychip_host::Tensor;

use super::{Item, Stage};
use crate::error::Result;
use crate::params::{block, half_width};

/// Activations of one half block kept for its backward pass.
#[derive(Debug)]
pub(super) enum HalfSaved {
    /// The attention half's.
    Attention(AttentionSaved),
    /// The feed-forward half's.
    FeedForward(FeedForwardSaved),
}

/// Activations of a block's attention half (or of the heads held) kept for
/// its backward pass.
#[derive(Debug)]
pub(super) struct AttentionSaved {
    normed: Normed,
    h1: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn: Tensor,
    lse: Tensor,
}

/// Activations of a block's feed-forward half (or of the columns held)
/// kept for its backward pass.
#[derive(Debug)]
pub(super) struct FeedForwardSaved {
    normed: Normed,
    h2: Tensor,
    gate: Tensor,
    up: Tensor,
    act: Tensor,
}

/// A half's input and its norm's inverse RMS, kept by the stage that
/// normed it (`None` on a stage holding a later part of the half: the
/// earlier stage normed it).
type Normed = Option<(Tensor, Tensor)>;

/// Part `i` (0: the normed activation, 1: the residual sum) of a pair
/// `[2, b, s, d]` that a cut inside a half carries.
pub(super) fn pair_part(pair: &Tensor, i: usize) -> Result<Tensor> {
    let shape = &pair.shape()[1..];
    let n: i64 = shape.iter().product();
    let mut strides = vec![1; shape.len()];
    for k in (0..shape.len().saturating_sub(1)).rev() {
        strides[k] = strides[k + 1] * shape[k + 1];
    }
    Ok(pair.as_strided(shape, &strides, i as i64 * n)?)
}

/// The start of a half's forward pass, whole or in part.
struct Begin {
    /// The normed input.
    h: Tensor,
    /// What the half's output is added to: the input, or the residual sum
    /// so far.
    residual: Tensor,
    normed: Normed,
    /// The pass's output: an activation, or a pair.
    out: Tensor,
    /// Where the sum goes in `out`.
    sum: Tensor,
}

/// The start of a half's backward pass, whole or in part.
struct GradBegin {
    /// The gradient of the half's sum.
    g_sum: Tensor,
    /// Where the normed input's gradient goes.
    gh: Tensor,
    /// Whether `gh` holds the later parts' share already (accumulate).
    later: bool,
    /// The pair of gradients going back, when the half's first part is
    /// another stage's.
    pair: Option<Tensor>,
}

impl Stage {
    /// Forward pass of half `half` (see [`crate::params::Cut`]) of a
    /// micro-batch of `b` sequences.
    pub(super) fn half_forward(
        &self,
        half: usize,
        x: Tensor,
        b: usize,
    ) -> Result<(HalfSaved, Tensor)> {
        let layer = half / 2;
        Ok(match half % 2 {
            0 => {
                let (sv, out) = self.attention_forward(layer, x, b)?;
                (HalfSaved::Attention(sv), out)
            }
            _ => {
                let (sv, out) = self.feed_forward(layer, x, b)?;
                (HalfSaved::FeedForward(sv), out)
            }
        })
    }

    /// Backward pass of a half: returns the gradient of its input.
    pub(super) fn half_backward(
        &self,
        half: usize,
        saved: HalfSaved,
        g: Tensor,
        b: usize,
        items: &mut Vec<Item>,
    ) -> Result<Tensor> {
        match saved {
            HalfSaved::Attention(sv) => self.attention_backward(half / 2, sv, g, b, items),
            HalfSaved::FeedForward(sv) => self.feed_forward_backward(half / 2, sv, g, b, items),
        }
    }

    /// The part of half `half` held, and whether it is the half's first
    /// part and its last.
    fn part(&self, half: usize) -> (std::ops::Range<usize>, bool, bool) {
        let width = half_width(&self.cfg, half);
        let held = self.range.held(half, width);
        let (first, last) = (held.start == 0, held.end == width);
        (held, first, last)
    }

    /// The norm (parameter `norm` of block `half / 2`) of the input of
    /// half `half`, or the normed input and the sum so far a pair brings;
    /// and the output the half's share is added into.
    fn half_begin(&self, half: usize, norm: usize, input: Tensor, b: usize) -> Result<Begin> {
        let c = &self.cfg;
        let (s, d) = (c.seq_len, c.dim);
        let (_, first, last) = self.part(half);
        // The output: a new activation, or a pair (the input pair itself,
        // its sum updated in place, when the half continues past it).
        let out = match (first, last) {
            (_, true) => self.empty(&[b, s, d])?,
            (true, false) => self.empty(&[2, b, s, d])?,
            (false, false) => input.clone(),
        };
        let sum = match last {
            true => out.clone(),
            false => pair_part(&out, 1)?,
        };
        if !first {
            let (h, residual) = (pair_part(&input, 0)?, pair_part(&input, 1)?);
            return Ok(Begin {
                h,
                residual,
                normed: None,
                out,
                sum,
            });
        }
        let h = match last {
            true => self.empty(&[b, s, d])?,
            false => pair_part(&out, 0)?,
        };
        let inv = self.empty_f32(&[b, s])?;
        let layer = half / 2;
        let label = format!("layers.{layer}.{}", norm_name(norm));
        let w = self.block_param(layer, norm).weight();
        self.ops()
            .rms_norm(&label, &input, w, &h, &inv, c.norm_eps)?;
        Ok(Begin {
            h,
            residual: input.clone(),
            normed: Some((input, inv)),
            out,
            sum,
        })
    }

    /// The gradients a half's backward pass starts from: its output's
    /// (`g_out`, a pair when the half continues past the stage).
    fn half_grad_begin(&self, half: usize, g_out: Tensor, b: usize) -> Result<GradBegin> {
        let c = &self.cfg;
        let (s, d) = (c.seq_len, c.dim);
        let (_, first, last) = self.part(half);
        Ok(match (first, last) {
            (_, false) => GradBegin {
                g_sum: pair_part(&g_out, 1)?,
                gh: pair_part(&g_out, 0)?,
                later: true,
                pair: Some(g_out),
            },
            (true, true) => GradBegin {
                g_sum: g_out,
                gh: self.empty(&[b, s, d])?,
                later: false,
                pair: None,
            },
            (false, true) => {
                let pair = self.empty(&[2, b, s, d])?;
                GradBegin {
                    g_sum: g_out,
                    gh: pair_part(&pair, 0)?,
                    later: false,
                    pair: Some(pair),
                }
            }
        })
    }

    /// The end of a half's backward pass: the input's gradient through
    /// the norm (parameter `norm`) and the residual, or, on a stage
    /// holding a later part, the pair of gradients for the stage that
    /// normed the input.
    fn half_grad_end(
        &self,
        half: usize,
        norm: usize,
        normed: Normed,
        g: GradBegin,
    ) -> Result<Tensor> {
        let ops = self.ops();
        let layer = half / 2;
        let residual = format!("layers.{layer}.{} (backward)", residual_name(norm));
        let Some((x, inv)) = normed else {
            let pair = g.pair.expect("a half held from a later part gives a pair");
            if !g.later {
                // The sum's gradient passes through: copied as 0 + it
                // (the operators have no copy).
                let p1 = pair_part(&pair, 1)?;
                ops.fill(&p1, 0.0)?;
                ops.add(&residual, &p1, &g.g_sum, &p1)?;
            }
            return Ok(pair);
        };
        let label = format!("layers.{layer}.{} (backward)", norm_name(norm));
        let w = self.block_param(layer, norm);
        let gx = self.norm_backward(&label, &g.gh, &x, w, &inv)?;
        ops.add(&residual, &gx, &g.g_sum, &gx)?;
        Ok(gx)
    }

    /// `x2 = x + attention(rms_norm(x)) Wo^T`, over the key/value heads the
    /// stage holds (and their query heads).
    fn attention_forward(
        &self,
        layer: usize,
        x: Tensor,
        b: usize,
    ) -> Result<(AttentionSaved, Tensor)> {
        let c = &self.cfg;
        let ops = self.ops();
        let (s, hd) = (c.seq_len, c.head_dim());
        let (held, ..) = self.part(2 * layer);
        let kvh = held.len();
        let qh = kvh * c.heads / c.kv_heads;
        let p = |w| self.block_param(layer, w).weight();
        let at = |what: &str| format!("layers.{layer}.{what}");
        let begin = self.half_begin(2 * layer, block::ATTN_NORM, x, b)?;
        let h1 = begin.h;
        let q0 = self.empty(&[b, s, qh, hd])?;
        let k0 = self.empty(&[b, s, kvh, hd])?;
        let v = self.empty(&[b, s, kvh, hd])?;
        let flat = |t: &Tensor, w: usize| t.reshape(&[b as i64, s as i64, w as i64]);
        ops.linear(&at("attention.wq"), &h1, p(block::WQ), &flat(&q0, qh * hd)?)?;
        ops.linear(
            &at("attention.wk"),
            &h1,
            p(block::WK),
            &flat(&k0, kvh * hd)?,
        )?;
        ops.linear(&at("attention.wv"), &h1, p(block::WV), &flat(&v, kvh * hd)?)?;
        let q = self.empty(&[b, s, qh, hd])?;
        let k = self.empty(&[b, s, kvh, hd])?;
        ops.rope(
            &at("attention.rope_q"),
            false,
            &q0,
            &self.cos,
            &self.sin,
            &q,
        )?;
        ops.rope(
            &at("attention.rope_k"),
            false,
            &k0,
            &self.cos,
            &self.sin,
            &k,
        )?;
        drop((q0, k0));
        let attn = self.empty(&[b, s, qh, hd])?;
        let lse = self.empty_f32(&[b, qh, s])?;
        let scale = 1.0 / (hd as f64).sqrt();
        ops.attention(
            &at("attention"),
            &q.transpose(1, 2)?,
            &k.transpose(1, 2)?,
            &v.transpose(1, 2)?,
            &attn.transpose(1, 2)?,
            &lse,
            scale,
        )?;
        let o = self.empty(&[b, s, c.dim])?;
        ops.linear(
            &at("attention.wo"),
            &flat(&attn, qh * hd)?,
            p(block::WO),
            &o,
        )?;
        ops.add(&at("attention.residual"), &begin.residual, &o, &begin.sum)?;
        let saved = AttentionSaved {
            normed: begin.normed,
            h1,
            q,
            k,
            v,
            attn,
            lse,
        };
        Ok((saved, begin.out))
    }

    /// `x3 = x2 + swiglu(h2 W1^T, h2 W3^T) W2^T`, `h2 = rms_norm(x2)`, over
    /// the hidden columns the stage holds.
    fn feed_forward(
        &self,
        layer: usize,
        input: Tensor,
        b: usize,
    ) -> Result<(FeedForwardSaved, Tensor)> {
        let c = &self.cfg;
        let ops = self.ops();
        let (s, d) = (c.seq_len, c.dim);
        let w = self.part(2 * layer + 1).0.len();
        let p = |w| self.block_param(layer, w).weight();
        let at = |what: &str| format!("layers.{layer}.{what}");
        let begin = self.half_begin(2 * layer + 1, block::FFN_NORM, input, b)?;
        let h2 = begin.h;
        let gate = self.empty(&[b, s, w])?;
        let up = self.empty(&[b, s, w])?;
        ops.linear(&at("feed_forward.w1"), &h2, p(block::W1), &gate)?;
        ops.linear(&at("feed_forward.w3"), &h2, p(block::W3), &up)?;
        let act = self.empty(&[b, s, w])?;
        ops.swiglu(&at("feed_forward.swiglu"), &gate, &up, &act)?;
        let f = self.empty(&[b, s, d])?;
        ops.linear(&at("feed_forward.w2"), &act, p(block::W2), &f)?;
        ops.add(
            &at("feed_forward.residual"),
            &begin.residual,
            &f,
            &begin.sum,
        )?;
        let saved = FeedForwardSaved {
            normed: begin.normed,
            h2,
            gate,
            up,
            act,
        };
        Ok((saved, begin.out))
    }

    /// The feed-forward half's backward: the gradient of its input from
    /// that of its output (each a pair where the forward's is).
    fn feed_forward_backward(
        &self,
        layer: usize,
        sv: FeedForwardSaved,
        g_out: Tensor,
        b: usize,
        items: &mut Vec<Item>,
    ) -> Result<Tensor> {
        let c = &self.cfg;
        let ops = self.ops();
        let (s, d) = (c.seq_len, c.dim);
        let n = (b * s) as i64;
        let w = self.part(2 * layer + 1).0.len();
        let p = |w| self.block_param(layer, w);
        let at = |what: &str| format!("layers.{layer}.{what} (backward)");
        let rows = |t: &Tensor, w: usize| t.reshape(&[n, w as i64]);
        let g = self.half_grad_begin(2 * layer + 1, g_out, b)?;
        let g3r = rows(&g.g_sum, d)?;
        let ga = self.empty(&[b, s, w])?;
        let w2 = p(block::W2);
        let (gar, actr) = (rows(&ga, w)?, rows(&sv.act, w)?);
        let label = at("feed_forward.w2");
        self.linear_backward(items, label, &g3r, &actr, w2, &gar, false)?;
        let gg = self.empty(&[b, s, w])?;
        let gu = self.empty(&[b, s, w])?;
        ops.swiglu_backward(
            &at("feed_forward.swiglu"),
            [&sv.gate, &sv.up, &ga],
            &gg,
            &gu,
        )?;
        drop(ga);
        let (gh2r, ggr, gur) = (rows(&g.gh, d)?, rows(&gg, w)?, rows(&gu, w)?);
        let h2r = rows(&sv.h2, d)?;
        let (w1, w3) = (p(block::W1), p(block::W3));
        for (name, gm, wt, acc) in [("w1", &ggr, w1, g.later), ("w3", &gur, w3, true)] {
            let label = at(&format!("feed_forward.{name}"));
            self.linear_backward(items, label, gm, &h2r, wt, &gh2r, acc)?;
        }
        drop((gg, gu));
        self.half_grad_end(2 * layer + 1, block::FFN_NORM, sv.normed, g)
    }

    /// The attention half's backward: the gradient of its input from that
    /// of its output (each a pair where the forward's is).
    fn attention_backward(
        &self,
        layer: usize,
        sv: AttentionSaved,
        g_out: Tensor,
        b: usize,
        items: &mut Vec<Item>,
    ) -> Result<Tensor> {
        let c = &self.cfg;
        let ops = self.ops();
        let (s, d, hd) = (c.seq_len, c.dim, c.head_dim());
        let n = (b * s) as i64;
        let kvh = self.part(2 * layer).0.len();
        let qh = kvh * c.heads / c.kv_heads;
        let p = |w| self.block_param(layer, w);
        let at = |what: &str| format!("layers.{layer}.{what} (backward)");
        let rows = |t: &Tensor, w: usize| t.reshape(&[n, w as i64]);
        let g = self.half_grad_begin(2 * layer, g_out, b)?;
        let g2r = rows(&g.g_sum, d)?;
        let (qw, kvw) = (qh * hd, kvh * hd);
        let gattn = self.empty(&[b, s, qh, hd])?;
        let wo = p(block::WO);
        let (gattnr, attnr) = (rows(&gattn, qw)?, rows(&sv.attn, qw)?);
        let label = at("attention.wo");
        self.linear_backward(items, label, &g2r, &attnr, wo, &gattnr, false)?;
        let gq = self.empty(&[b, s, qh, hd])?;
        let gk = self.empty(&[b, s, kvh, hd])?;
        let gv = self.empty(&[b, s, kvh, hd])?;
        let t = |x: &Tensor| x.transpose(1, 2);
        let scale = 1.0 / (hd as f64).sqrt();
        ops.attention_backward(
            &at("attention"),
            [
                &t(&sv.q)?,
                &t(&sv.k)?,
                &t(&sv.v)?,
                &t(&sv.attn)?,
                &sv.lse,
                &t(&gattn)?,
            ],
            [&t(&gq)?, &t(&gk)?, &t(&gv)?],
            scale,
        )?;
        drop(gattn);
        let gq0 = self.empty(&[b, s, qh, hd])?;
        let gk0 = self.empty(&[b, s, kvh, hd])?;
        ops.rope(
            &at("attention.rope_q"),
            true,
            &gq,
            &self.cos,
            &self.sin,
            &gq0,
        )?;
        ops.rope(
            &at("attention.rope_k"),
            true,
            &gk,
            &self.cos,
            &self.sin,
            &gk0,
        )?;
        drop((gq, gk));
        let gh1r = rows(&g.gh, d)?;
        let h1r = rows(&sv.h1, d)?;
        let (wq, wk, wv) = (p(block::WQ), p(block::WK), p(block::WV));
        let (gq0r, gk0r, gvr) = (rows(&gq0, qw)?, rows(&gk0, kvw)?, rows(&gv, kvw)?);
        let projections = [("wq", &gq0r, wq), ("wk", &gk0r, wk), ("wv", &gvr, wv)];
        for (i, (name, gm, w)) in projections.into_iter().enumerate() {
            let label = at(&format!("attention.{name}"));
            self.linear_backward(items, label, gm, &h1r, w, &gh1r, i > 0 || g.later)?;
        }
        self.half_grad_end(2 * layer, block::ATTN_NORM, sv.normed, g)
    }
}

/// The name of norm parameter `norm` in its block's labels.
fn norm_name(norm: usize) -> &'static str {
    match norm {
        block::ATTN_NORM => "attention_norm",
        _ => "ffn_norm",
    }
}

/// The label of the residual of the half whose norm is `norm`.
fn residual_name(norm: usize) -> &'static str {
    match norm {
        block::ATTN_NORM => "attention.residual",
        _ => "feed_forward.residual",
    }
}
