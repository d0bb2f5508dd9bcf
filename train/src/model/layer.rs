//! One transformer block's forward and backward pass, as its two halves
//! (a pipeline may cut a block between them): the attention half (RMSNorm,
//! rotary grouped-query attention and residual) and the feed-forward half
//! (RMSNorm, SwiGLU and residual).

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
    x2: Tensor,
    h2: Tensor,
    inv2: Tensor,
    gate: Tensor,
    up: Tensor,
    act: Tensor,
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

    /// `x3 = x2 + swiglu(h2 W1^T, h2 W3^T) W2^T`, `h2 = rms_norm(x2)`.
    fn feed_forward(
        &self,
        layer: usize,
        x2: Tensor,
        b: usize,
    ) -> Result<(FeedForwardSaved, Tensor)> {
        let c = &self.cfg;
        let ops = self.ops();
        let (s, d) = (c.seq_len, c.dim);
        let p = |w| self.block_param(layer, w).weight();
        let at = |what: &str| format!("layers.{layer}.{what}");
        let h2 = self.empty(&[b, s, d])?;
        let inv2 = self.empty_f32(&[b, s])?;
        ops.rms_norm(
            &at("ffn_norm"),
            &x2,
            p(block::FFN_NORM),
            &h2,
            &inv2,
            c.norm_eps,
        )?;
        let gate = self.empty(&[b, s, c.ffn])?;
        let up = self.empty(&[b, s, c.ffn])?;
        ops.linear(&at("feed_forward.w1"), &h2, p(block::W1), &gate)?;
        ops.linear(&at("feed_forward.w3"), &h2, p(block::W3), &up)?;
        let act = self.empty(&[b, s, c.ffn])?;
        ops.swiglu(&at("feed_forward.swiglu"), &gate, &up, &act)?;
        let f = self.empty(&[b, s, d])?;
        ops.linear(&at("feed_forward.w2"), &act, p(block::W2), &f)?;
        let x3 = self.empty(&[b, s, d])?;
        ops.add(&at("feed_forward.residual"), &x2, &f, &x3)?;
        let saved = FeedForwardSaved {
            x2,
            h2,
            inv2,
            gate,
            up,
            act,
        };
        Ok((saved, x3))
    }

    /// The feed-forward half's backward: the gradient of `x2` from that of
    /// `x3`.
    fn feed_forward_backward(
        &self,
        layer: usize,
        sv: FeedForwardSaved,
        g3: Tensor,
        b: usize,
        items: &mut Vec<Item>,
    ) -> Result<Tensor> {
        let c = &self.cfg;
        let ops = self.ops();
        let (s, d) = (c.seq_len, c.dim);
        let n = (b * s) as i64;
        let p = |w| self.block_param(layer, w);
        let at = |what: &str| format!("layers.{layer}.{what} (backward)");
        let rows = |t: &Tensor, w: usize| t.reshape(&[n, w as i64]);
        let g3r = rows(&g3, d)?;
        let ga = self.empty(&[b, s, c.ffn])?;
        let w2 = p(block::W2);
        let (gar, actr) = (rows(&ga, c.ffn)?, rows(&sv.act, c.ffn)?);
        let label = at("feed_forward.w2");
        self.linear_backward(items, label, &g3r, &actr, w2, &gar, false)?;
        let gg = self.empty(&[b, s, c.ffn])?;
        let gu = self.empty(&[b, s, c.ffn])?;
        ops.swiglu_backward(
            &at("feed_forward.swiglu"),
            [&sv.gate, &sv.up, &ga],
            &gg,
            &gu,
        )?;
        drop(ga);
        let gh2 = self.empty(&[b, s, d])?;
        let (gh2r, ggr, gur) = (rows(&gh2, d)?, rows(&gg, c.ffn)?, rows(&gu, c.ffn)?);
        let h2r = rows(&sv.h2, d)?;
        let (w1, w3) = (p(block::W1), p(block::W3));
        for (name, g, w, acc) in [("w1", &ggr, w1, false), ("w3", &gur, w3, true)] {
            let label = at(&format!("feed_forward.{name}"));
            self.linear_backward(items, label, g, &h2r, w, &gh2r, acc)?;
        }
        drop((gg, gu));
        let fnorm = p(block::FFN_NORM);
        let g2 = self.norm_backward(&at("ffn_norm"), &gh2, &sv.x2, fnorm, &sv.inv2)?;
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
