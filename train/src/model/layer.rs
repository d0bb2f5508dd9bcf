//! One transformer block's forward and backward pass, as its two halves
//! (a pipeline may cut a block between them): the attention half (RMSNorm,
//! rotary grouped-query attention and residual) and the feed-forward half
//! (RMSNorm, SwiGLU and residual). A feed-forward half may also be cut by
//! its width ([`crate::params::Cut`]): each stage then computes its own
//! hidden columns, and the boundary carries a pair `[2, b, s, dim]`, the
//! normed input and the residual sum so far (the gradient going back is
//! the pair of their gradients).

use polychip_host::Tensor;

use super::{Item, Stage};
use crate::error::Result;
use crate::params::block;

/// Activations of one half block kept for its backward pass.
#[derive(Debug)]
pub(super) enum HalfSaved {
    /// The attention half's.
    Attention(AttentionSaved),
    /// The feed-forward half's.
    FeedForward(FeedForwardSaved),
}

/// Activations of a block's attention half kept for its backward pass.
#[derive(Debug)]
pub(super) struct AttentionSaved {
    x: Tensor,
    h1: Tensor,
    inv1: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn: Tensor,
    lse: Tensor,
}

/// Activations of a block's feed-forward half kept for its backward pass.
#[derive(Debug)]
pub(super) struct FeedForwardSaved {
    /// The input and the norm's inverse RMS (not when the half is held
    /// from a column past its first: the earlier stage normed it).
    normed: Option<(Tensor, Tensor)>,
    h2: Tensor,
    gate: Tensor,
    up: Tensor,
    act: Tensor,
}

/// Part `i` (0: the normed activation, 1: the residual sum) of a pair
/// `[2, b, s, d]` that a cut inside a feed-forward half carries.
pub(super) fn pair_part(pair: &Tensor, i: usize) -> Result<Tensor> {
    let shape = &pair.shape()[1..];
    let n: i64 = shape.iter().product();
    let mut strides = vec![1; shape.len()];
    for k in (0..shape.len().saturating_sub(1)).rev() {
        strides[k] = strides[k + 1] * shape[k + 1];
    }
    Ok(pair.as_strided(shape, &strides, i as i64 * n)?)
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

    /// `x2 = x + attention(rms_norm(x)) Wo^T`.
    fn attention_forward(
        &self,
        layer: usize,
        x: Tensor,
        b: usize,
    ) -> Result<(AttentionSaved, Tensor)> {
        let c = &self.cfg;
        let ops = self.ops();
        let (s, d, hd) = (c.seq_len, c.dim, c.head_dim());
        let p = |w| self.block_param(layer, w).weight();
        let at = |what: &str| format!("layers.{layer}.{what}");
        let h1 = self.empty(&[b, s, d])?;
        let inv1 = self.empty_f32(&[b, s])?;
        ops.rms_norm(
            &at("attention_norm"),
            &x,
            p(block::ATTN_NORM),
            &h1,
            &inv1,
            c.norm_eps,
        )?;
        let q0 = self.empty(&[b, s, c.heads, hd])?;
        let k0 = self.empty(&[b, s, c.kv_heads, hd])?;
        let v = self.empty(&[b, s, c.kv_heads, hd])?;
        let flat = |t: &Tensor, w: usize| t.reshape(&[b as i64, s as i64, w as i64]);
        ops.linear(
            &at("attention.wq"),
            &h1,
            p(block::WQ),
            &flat(&q0, c.heads * hd)?,
        )?;
        ops.linear(
            &at("attention.wk"),
            &h1,
            p(block::WK),
            &flat(&k0, c.kv_heads * hd)?,
        )?;
        ops.linear(
            &at("attention.wv"),
            &h1,
            p(block::WV),
            &flat(&v, c.kv_heads * hd)?,
        )?;
        let q = self.empty(&[b, s, c.heads, hd])?;
        let k = self.empty(&[b, s, c.kv_heads, hd])?;
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
        let attn = self.empty(&[b, s, c.heads, hd])?;
        let lse = self.empty_f32(&[b, c.heads, s])?;
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
        let o = self.empty(&[b, s, d])?;
        ops.linear(
            &at("attention.wo"),
            &flat(&attn, c.heads * hd)?,
            p(block::WO),
            &o,
        )?;
        let x2 = self.empty(&[b, s, d])?;
        ops.add(&at("attention.residual"), &x, &o, &x2)?;
        let saved = AttentionSaved {
            x,
            h1,
            inv1,
            q,
            k,
            v,
            attn,
            lse,
        };
        Ok((saved, x2))
    }

    /// `x3 = x2 + swiglu(h2 W1^T, h2 W3^T) W2^T`, `h2 = rms_norm(x2)`, over
    /// the hidden columns the stage holds: from the first, `x2` is the
    /// input; from a later one, the input is the pair `(h2, y)` and `y`
    /// stands for `x2` plus the earlier columns' share. Short of the last
    /// column, the output is the pair `(h2, x2 + share so far)`.
    fn feed_forward(
        &self,
        layer: usize,
        input: Tensor,
        b: usize,
    ) -> Result<(FeedForwardSaved, Tensor)> {
        let c = &self.cfg;
        let ops = self.ops();
        let (s, d) = (c.seq_len, c.dim);
        let cols = self.range.ffn_cols(2 * layer + 1, c.ffn);
        let (first, last) = (cols.start == 0, cols.end == c.ffn);
        let p = |w| self.block_param(layer, w).weight();
        let at = |what: &str| format!("layers.{layer}.{what}");
        // The output: a new activation, or a pair (the input pair itself,
        // its sum updated in place, when the half continues past it).
        let out = match (first, last) {
            (_, true) => self.empty(&[b, s, d])?,
            (true, false) => self.empty(&[2, b, s, d])?,
            (false, false) => input.clone(),
        };
        let (h2, residual, normed) = match first {
            true => {
                let h2 = match last {
                    true => self.empty(&[b, s, d])?,
                    false => pair_part(&out, 0)?,
                };
                let inv2 = self.empty_f32(&[b, s])?;
                ops.rms_norm(
                    &at("ffn_norm"),
                    &input,
                    p(block::FFN_NORM),
                    &h2,
                    &inv2,
                    c.norm_eps,
                )?;
                (h2, input.clone(), Some((input, inv2)))
            }
            false => (pair_part(&input, 0)?, pair_part(&input, 1)?, None),
        };
        let w = cols.len();
        let gate = self.empty(&[b, s, w])?;
        let up = self.empty(&[b, s, w])?;
        ops.linear(&at("feed_forward.w1"), &h2, p(block::W1), &gate)?;
        ops.linear(&at("feed_forward.w3"), &h2, p(block::W3), &up)?;
        let act = self.empty(&[b, s, w])?;
        ops.swiglu(&at("feed_forward.swiglu"), &gate, &up, &act)?;
        let f = self.empty(&[b, s, d])?;
        ops.linear(&at("feed_forward.w2"), &act, p(block::W2), &f)?;
        let sum = match last {
            true => out.clone(),
            false => pair_part(&out, 1)?,
        };
        ops.add(&at("feed_forward.residual"), &residual, &f, &sum)?;
        let saved = FeedForwardSaved {
            normed,
            h2,
            gate,
            up,
            act,
        };
        Ok((saved, out))
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
        let cols = self.range.ffn_cols(2 * layer + 1, c.ffn);
        let (w, last) = (cols.len(), cols.end == c.ffn);
        let p = |w| self.block_param(layer, w);
        let at = |what: &str| format!("layers.{layer}.{what} (backward)");
        let rows = |t: &Tensor, w: usize| t.reshape(&[n, w as i64]);
        // The sum's gradient, and the normed activation's from the later
        // columns (accumulated into, in place) when the half continues.
        // Held from a later column, the pair of gradients goes back to the
        // stage that normed the input (the output's own pair when the
        // half continues past this stage).
        let first = sv.normed.is_some();
        let (g3, gh2, later, pair) = match (first, last) {
            (_, false) => {
                let (g3, gh2) = (pair_part(&g_out, 1)?, pair_part(&g_out, 0)?);
                (g3, gh2, true, Some(g_out.clone()))
            }
            (true, true) => (g_out.clone(), self.empty(&[b, s, d])?, false, None),
            (false, true) => {
                let pair = self.empty(&[2, b, s, d])?;
                (g_out.clone(), pair_part(&pair, 0)?, false, Some(pair))
            }
        };
        let g3r = rows(&g3, d)?;
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
        let (gh2r, ggr, gur) = (rows(&gh2, d)?, rows(&gg, w)?, rows(&gu, w)?);
        let h2r = rows(&sv.h2, d)?;
        let (w1, w3) = (p(block::W1), p(block::W3));
        for (name, g, wt, acc) in [("w1", &ggr, w1, later), ("w3", &gur, w3, true)] {
            let label = at(&format!("feed_forward.{name}"));
            self.linear_backward(items, label, g, &h2r, wt, &gh2r, acc)?;
        }
        drop((gg, gu));
        let Some((x2, inv2)) = sv.normed else {
            let pair = pair.expect("a half held from a later column gives a pair");
            if last {
                // The sum's gradient passes through: copied as 0 + it
                // (the operators have no copy).
                let p1 = pair_part(&pair, 1)?;
                ops.fill(&p1, 0.0)?;
                ops.add(&at("feed_forward.residual"), &p1, &g3, &p1)?;
            }
            return Ok(pair);
        };
        let fnorm = p(block::FFN_NORM);
        let g2 = self.norm_backward(&at("ffn_norm"), &gh2, &x2, fnorm, &inv2)?;
        ops.add(&at("feed_forward.residual"), &g2, &g3, &g2)?;
        Ok(g2)
    }

    /// The attention half's backward: the gradient of `x` from that of
    /// `x2`.
    fn attention_backward(
        &self,
        layer: usize,
        sv: AttentionSaved,
        g2: Tensor,
        b: usize,
        items: &mut Vec<Item>,
    ) -> Result<Tensor> {
        let c = &self.cfg;
        let ops = self.ops();
        let (s, d, hd) = (c.seq_len, c.dim, c.head_dim());
        let n = (b * s) as i64;
        let p = |w| self.block_param(layer, w);
        let at = |what: &str| format!("layers.{layer}.{what} (backward)");
        let rows = |t: &Tensor, w: usize| t.reshape(&[n, w as i64]);
        let g2r = rows(&g2, d)?;
        let qw = c.heads * hd;
        let kvw = c.kv_heads * hd;
        let gattn = self.empty(&[b, s, c.heads, hd])?;
        let wo = p(block::WO);
        let (gattnr, attnr) = (rows(&gattn, qw)?, rows(&sv.attn, qw)?);
        let label = at("attention.wo");
        self.linear_backward(items, label, &g2r, &attnr, wo, &gattnr, false)?;
        let gq = self.empty(&[b, s, c.heads, hd])?;
        let gk = self.empty(&[b, s, c.kv_heads, hd])?;
        let gv = self.empty(&[b, s, c.kv_heads, hd])?;
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
        let gq0 = self.empty(&[b, s, c.heads, hd])?;
        let gk0 = self.empty(&[b, s, c.kv_heads, hd])?;
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
        let gh1 = self.empty(&[b, s, d])?;
        let gh1r = rows(&gh1, d)?;
        let h1r = rows(&sv.h1, d)?;
        let (wq, wk, wv) = (p(block::WQ), p(block::WK), p(block::WV));
        let (gq0r, gk0r, gvr) = (rows(&gq0, qw)?, rows(&gk0, kvw)?, rows(&gv, kvw)?);
        let projections = [("wq", &gq0r, wq), ("wk", &gk0r, wk), ("wv", &gvr, wv)];
        for (i, (name, g, w)) in projections.into_iter().enumerate() {
            let label = at(&format!("attention.{name}"));
            self.linear_backward(items, label, g, &h1r, w, &gh1r, i > 0)?;
        }
        let anorm = p(block::ATTN_NORM);
        let gx = self.norm_backward(&at("attention_norm"), &gh1, &sv.x, anorm, &sv.inv1)?;
        ops.add(&at("attention.residual"), &gx, &g2, &gx)?;
        Ok(gx)
    }
}
