//! The operator calls the model makes, each through the host to the
//! device's plugin, optionally recorded (inputs before, outputs after) so
//! that `--autocompare` can replay the step on the f64 reference.

use std::cell::RefCell;

use polychip_host::{AdamwOptions, DType, Exec, MatmulOptions, Tensor};

use crate::error::Result;

/// A tensor's values copied to the host, row-major, widened to f64
/// (indices too: they are exact in f64).
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    /// The device tensor's dtype.
    pub dtype: DType,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Its elements.
    pub values: Vec<f64>,
}

impl HostTensor {
    /// Reads `t` from its device.
    pub fn read(t: &Tensor) -> Result<HostTensor> {
        let bytes = t.read_bytes()?;
        Ok(HostTensor {
            dtype: t.dtype(),
            shape: t.shape().iter().map(|&d| d as usize).collect(),
            values: widen(t.dtype(), &bytes),
        })
    }
}

/// Native-endian elements of `dtype` as f64.
pub fn widen(dtype: DType, bytes: &[u8]) -> Vec<f64> {
    let n = dtype.size();
    bytes
        .chunks_exact(n)
        .map(|c| match dtype {
            DType::F32 => f64::from(f32::from_ne_bytes(c.try_into().expect("4"))),
            DType::F64 => f64::from_ne_bytes(c.try_into().expect("8")),
            DType::F16 => half::f16::from_ne_bytes(c.try_into().expect("2")).to_f64(),
            DType::BF16 => half::bf16::from_ne_bytes(c.try_into().expect("2")).to_f64(),
            DType::I32 => f64::from(i32::from_ne_bytes(c.try_into().expect("4"))),
            DType::I64 => i64::from_ne_bytes(c.try_into().expect("8")) as f64,
            _ => f64::NAN,
        })
        .collect()
}

/// One recorded operator call.
#[derive(Debug, Clone)]
pub struct OpRecord {
    /// The operator's name in the op table.
    pub op: &'static str,
    /// Where in the model it ran, e.g. `layers.1.attention (backward)`.
    pub label: String,
    /// Its inputs (and, for accumulating calls, the output's value before).
    pub inputs: Vec<(&'static str, HostTensor)>,
    /// Its outputs after the call.
    pub outputs: Vec<(&'static str, HostTensor)>,
    /// Its scalar arguments.
    pub scalars: Vec<(&'static str, f64)>,
}

/// Operator calls on one device, recorded when a tape is attached.
#[derive(Debug, Clone, Copy)]
pub struct Ops<'a> {
    exec: Exec<'a>,
    tape: Option<&'a RefCell<Vec<OpRecord>>>,
}

type Named<'t> = [(&'static str, &'t Tensor)];

impl<'a> Ops<'a> {
    /// Calls on `exec`, recording into `tape` when given.
    pub fn new(exec: Exec<'a>, tape: Option<&'a RefCell<Vec<OpRecord>>>) -> Ops<'a> {
        Ops { exec, tape }
    }

    fn run(
        &self,
        op: &'static str,
        label: &str,
        inputs: &Named<'_>,
        outputs: &Named<'_>,
        scalars: &[(&'static str, f64)],
        call: impl FnOnce(&Exec<'a>) -> polychip_host::Result<()>,
    ) -> Result<()> {
        let Some(tape) = self.tape else {
            return Ok(call(&self.exec)?);
        };
        let read = |list: &Named<'_>| -> Result<Vec<(&'static str, HostTensor)>> {
            list.iter()
                .map(|(n, t)| Ok((*n, HostTensor::read(t)?)))
                .collect()
        };
        let before = read(inputs)?;
        call(&self.exec)?;
        let after = read(outputs)?;
        tape.borrow_mut().push(OpRecord {
            op,
            label: label.to_string(),
            inputs: before,
            outputs: after,
            scalars: scalars.to_vec(),
        });
        Ok(())
    }

    /// `out = x @ w^T`.
    pub fn linear(&self, label: &str, x: &Tensor, w: &Tensor, out: &Tensor) -> Result<()> {
        let ins = [("input", x), ("weight", w)];
        self.run("linear", label, &ins, &[("out", out)], &[], |e| {
            e.linear(x, w, None, out)
        })
    }

    /// `out = op(a) @ op(b) + beta * out` (beta 0 or 1).
    #[allow(clippy::too_many_arguments)]
    pub fn matmul(
        &self,
        label: &str,
        a: &Tensor,
        b: &Tensor,
        out: &Tensor,
        ta: bool,
        tb: bool,
        accumulate: bool,
    ) -> Result<()> {
        let beta = if accumulate { 1.0 } else { 0.0 };
        let opts = MatmulOptions {
            transpose_a: ta,
            transpose_b: tb,
            alpha: 1.0,
            beta,
        };
        let scalars = [
            ("transpose_a", f64::from(u8::from(ta))),
            ("transpose_b", f64::from(u8::from(tb))),
            ("beta", beta),
        ];
        let with_out = [("a", a), ("b", b), ("out_before", out)];
        let ins: &Named<'_> = if accumulate {
            &with_out
        } else {
            &with_out[..2]
        };
        self.run("matmul", label, ins, &[("out", out)], &scalars, |e| {
            e.matmul(a, b, out, opts)
        })
    }

    /// The input's part of the backward of `out = x @ w^T` for the output's
    /// gradient `g [n, m]` and `w [m, k]`: `gx (+)= g @ w` (accumulating
    /// when `accumulate`, for several projections of one input).
    pub fn linear_input_grad(
        &self,
        label: &str,
        g: &Tensor,
        w: &Tensor,
        gx: &Tensor,
        accumulate: bool,
    ) -> Result<()> {
        self.matmul(label, g, w, gx, false, false, accumulate)
    }

    /// The weight's part of the backward of `out = x @ w^T` for rows
    /// `x [n, k]` and the output's gradient `g [n, m]`: `grad_w += g^T @ x`
    /// (accumulating over micro-batches).
    pub fn linear_weight_grad(
        &self,
        label: &str,
        g: &Tensor,
        x: &Tensor,
        grad_w: &Tensor,
    ) -> Result<()> {
        self.matmul(label, g, x, grad_w, true, false, true)
    }

    /// RMSNorm forward.
    pub fn rms_norm(
        &self,
        label: &str,
        x: &Tensor,
        w: &Tensor,
        out: &Tensor,
        inv: &Tensor,
        eps: f64,
    ) -> Result<()> {
        let outs = [("out", out), ("inv_rms", inv)];
        let ins = [("input", x), ("weight", w)];
        self.run("rms_norm", label, &ins, &outs, &[("eps", eps)], |e| {
            e.rms_norm(x, w, out, inv, eps)
        })
    }

    /// RMSNorm backward.
    #[allow(clippy::too_many_arguments)]
    pub fn rms_norm_backward(
        &self,
        label: &str,
        g: &Tensor,
        x: &Tensor,
        w: &Tensor,
        inv: &Tensor,
        gx: &Tensor,
        gw: &Tensor,
    ) -> Result<()> {
        let ins = [
            ("grad_out", g),
            ("input", x),
            ("weight", w),
            ("inv_rms", inv),
        ];
        let outs = [("grad_input", gx), ("grad_weight", gw)];
        self.run("rms_norm_backward", label, &ins, &outs, &[], |e| {
            e.rms_norm_backward(g, x, w, inv, gx, gw)
        })
    }

    /// Rotary embedding (its inverse when `backward`), half-split layout.
    pub fn rope(
        &self,
        label: &str,
        backward: bool,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        out: &Tensor,
    ) -> Result<()> {
        let op = if backward { "rope_backward" } else { "rope" };
        let ins = [("input", x), ("cos", cos), ("sin", sin)];
        self.run(op, label, &ins, &[("out", out)], &[], |e| {
            if backward {
                e.rope_backward(x, cos, sin, out, false)
            } else {
                e.rope(x, cos, sin, out, false)
            }
        })
    }

    /// Causal grouped-query attention.
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &self,
        label: &str,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &Tensor,
        lse: &Tensor,
        scale: f64,
    ) -> Result<()> {
        let ins = [("q", q), ("k", k), ("v", v)];
        let outs = [("out", out), ("lse", lse)];
        self.run("attention", label, &ins, &outs, &[("scale", scale)], |e| {
            e.attention(q, k, v, out, lse, scale, true)
        })
    }

    /// Backward of causal attention.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_backward(
        &self,
        label: &str,
        [q, k, v, out, lse, g]: [&Tensor; 6],
        [gq, gk, gv]: [&Tensor; 3],
        scale: f64,
    ) -> Result<()> {
        let ins = [
            ("q", q),
            ("k", k),
            ("v", v),
            ("out", out),
            ("lse", lse),
            ("grad_out", g),
        ];
        let outs = [("grad_q", gq), ("grad_k", gk), ("grad_v", gv)];
        let s = [("scale", scale)];
        self.run("attention_backward", label, &ins, &outs, &s, |e| {
            e.attention_backward(q, k, v, out, lse, g, gq, gk, gv, scale, true)
        })
    }

    /// `out = silu(gate) * up`.
    pub fn swiglu(&self, label: &str, gate: &Tensor, up: &Tensor, out: &Tensor) -> Result<()> {
        let ins = [("gate", gate), ("up", up)];
        self.run("swiglu", label, &ins, &[("out", out)], &[], |e| {
            e.swiglu(gate, up, out)
        })
    }

    /// Backward of `swiglu`.
    pub fn swiglu_backward(
        &self,
        label: &str,
        [gate, up, g]: [&Tensor; 3],
        gg: &Tensor,
        gu: &Tensor,
    ) -> Result<()> {
        let ins = [("gate", gate), ("up", up), ("grad_out", g)];
        let outs = [("grad_gate", gg), ("grad_up", gu)];
        self.run("swiglu_backward", label, &ins, &outs, &[], |e| {
            e.swiglu_backward(gate, up, g, gg, gu)
        })
    }

    /// `out = a + b` (`out` may be `a` or `b`).
    pub fn add(&self, label: &str, a: &Tensor, b: &Tensor, out: &Tensor) -> Result<()> {
        let ins = [("a", a), ("b", b)];
        self.run("add", label, &ins, &[("out", out)], &[], |e| {
            e.add(a, b, out, 1.0)
        })
    }

    /// Embedding lookup.
    pub fn embedding(&self, label: &str, w: &Tensor, idx: &Tensor, out: &Tensor) -> Result<()> {
        let ins = [("weight", w), ("indices", idx)];
        self.run("embedding", label, &ins, &[("out", out)], &[], |e| {
            e.embedding(w, idx, out)
        })
    }

    /// Embedding backward, accumulating into `gw`.
    pub fn embedding_backward(
        &self,
        label: &str,
        g: &Tensor,
        idx: &Tensor,
        gw: &Tensor,
    ) -> Result<()> {
        let ins = [
            ("grad_out", g),
            ("indices", idx),
            ("grad_weight_before", gw),
        ];
        self.run(
            "embedding_backward",
            label,
            &ins,
            &[("grad_weight", gw)],
            &[],
            |e| e.embedding_backward(g, idx, gw),
        )
    }

    /// Mean cross-entropy.
    pub fn cross_entropy(&self, label: &str, l: &Tensor, t: &Tensor, loss: &Tensor) -> Result<()> {
        let ins = [("logits", l), ("targets", t)];
        self.run("cross_entropy", label, &ins, &[("loss", loss)], &[], |e| {
            e.cross_entropy(l, t, loss, IGNORE_INDEX)
        })
    }

    /// Backward of the mean cross-entropy, scaled by `grad_loss`.
    pub fn cross_entropy_backward(
        &self,
        label: &str,
        l: &Tensor,
        t: &Tensor,
        gl: &Tensor,
        grad_loss: f64,
    ) -> Result<()> {
        let ins = [("logits", l), ("targets", t)];
        let s = [("grad_loss", grad_loss)];
        self.run(
            "cross_entropy_backward",
            label,
            &ins,
            &[("grad_logits", gl)],
            &s,
            |e| e.cross_entropy_backward(l, t, gl, grad_loss, IGNORE_INDEX),
        )
    }

    /// `dst = (dst.dtype) src`.
    pub fn cast(&self, label: &str, src: &Tensor, dst: &Tensor) -> Result<()> {
        self.run("cast", label, &[("src", src)], &[("dst", dst)], &[], |e| {
            e.cast(src, dst)
        })
    }

    /// `t = value` everywhere.
    pub fn fill(&self, t: &Tensor, value: f64) -> Result<()> {
        Ok(self.exec.fill(t, value)?)
    }

    /// `out = sum(x^2)`.
    pub fn sum_squares(&self, label: &str, x: &Tensor, out: &Tensor) -> Result<()> {
        self.run(
            "sum_squares",
            label,
            &[("input", x)],
            &[("out", out)],
            &[],
            |e| e.sum_squares(x, out),
        )
    }

    /// `t *= alpha`.
    pub fn scale(&self, label: &str, t: &Tensor, alpha: f64) -> Result<()> {
        let s = [("alpha", alpha)];
        self.run(
            "scale",
            label,
            &[("tensor_before", t)],
            &[("tensor", t)],
            &s,
            |e| e.scale(t, alpha),
        )
    }

    /// One AdamW step in place.
    pub fn adamw(&self, label: &str, [p, g, m, v]: [&Tensor; 4], h: &AdamwOptions) -> Result<()> {
        let ins = [
            ("param_before", p),
            ("grad", g),
            ("exp_avg_before", m),
            ("exp_avg_sq_before", v),
        ];
        let outs = [("param", p), ("exp_avg", m), ("exp_avg_sq", v)];
        let s = [
            ("lr", h.lr),
            ("beta1", h.beta1),
            ("beta2", h.beta2),
            ("eps", h.eps),
            ("weight_decay", h.weight_decay),
            ("step", h.step as f64),
        ];
        self.run("adamw", label, &ins, &outs, &s, |e| e.adamw(p, g, m, v, *h))
    }
}

/// Targets equal to this are ignored by the loss.
pub const IGNORE_INDEX: i64 = -100;
