//! Operator calls: check the arguments with the same rules the SDK applies
//! (so errors name the op and shapes before anything crosses the boundary),
//! build the ABI args struct, and call the plugin's op-table entry.

use std::mem::size_of;

use polychip_plugin_sdk::BinaryOp;

mod elementwise;
mod layers;
mod training;

use polychip_plugin_sdk::abi::{
    PolychipBinaryArgs, PolychipCastArgs, PolychipCopyArgs, PolychipFillArgs, PolychipMatmulArgs,
    PolychipSoftmaxArgs,
};
use polychip_plugin_sdk::check::{self, ArgError};
pub use training::AdamwOptions;

use crate::device::Device;
use crate::error::{HostError, Result};
use crate::stream::Stream;
use crate::tensor::Tensor;

/// Options of [`Exec::matmul`]: `out = alpha * op(a) @ op(b) + beta * out`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MatmulOptions {
    /// Use `a`'s transpose (last two dimensions).
    pub transpose_a: bool,
    /// Use `b`'s transpose (last two dimensions).
    pub transpose_b: bool,
    /// Scale of the product.
    pub alpha: f64,
    /// Scale of the previous `out`; 0 means `out` is not read.
    pub beta: f64,
}

impl Default for MatmulOptions {
    fn default() -> Self {
        MatmulOptions {
            transpose_a: false,
            transpose_b: false,
            alpha: 1.0,
            beta: 0.0,
        }
    }
}

/// Where operators run: a device's default stream or one of its streams.
#[derive(Debug, Clone, Copy)]
pub struct Exec<'a> {
    device: &'a Device,
    stream: Option<&'a Stream>,
}

impl<'a> Exec<'a> {
    pub(crate) fn new(device: &'a Device, stream: Option<&'a Stream>) -> Exec<'a> {
        Exec { device, stream }
    }

    /// The device the operators run on.
    pub fn device(&self) -> &Device {
        self.device
    }

    /// Keeps a buffer alive until the stream synchronizes.
    fn pin(&self, t: &Tensor) {
        if let Some(stream) = self.stream {
            stream.pin(t.buffer());
        }
    }

    pub(crate) fn on_device(
        &self,
        op: &'static str,
        tensors: &[(&'static str, &Tensor)],
    ) -> Result<()> {
        for (name, t) in tensors {
            if t.device() != self.device {
                return Err(HostError::Usage(format!(
                    "{op}: {name} is on {} but the call runs on {}; copy it with Tensor::to_device first",
                    t.device(),
                    self.device
                )));
            }
        }
        Ok(())
    }

    pub(crate) fn invalid(&self, source: ArgError) -> HostError {
        HostError::InvalidArguments {
            plugin: self.device.plugin().vendor().to_string(),
            source,
        }
    }

    pub(crate) fn call<A>(
        &self,
        op: &'static str,
        entry: Option<
            unsafe extern "C" fn(
                u32,
                *mut polychip_plugin_sdk::abi::PolychipStream,
                *const A,
            ) -> *mut polychip_plugin_sdk::abi::PolychipError,
        >,
        args: &A,
        tensors: &[(&'static str, &Tensor)],
    ) -> Result<()> {
        let plugin = self.device.plugin();
        // SAFETY: every tensor was checked to be on this device, its view lies
        // inside its live buffer, and a stream pins the buffers until it
        // synchronizes (below), so the memory outlives the work.
        unsafe {
            plugin.call_op(
                op,
                entry,
                self.device.index(),
                self.stream.map(Stream::raw),
                args,
            )?
        };
        for (_, t) in tensors {
            self.pin(t);
        }
        Ok(())
    }

    /// `out[...] = value`.
    pub fn fill(&self, out: &Tensor, value: f64) -> Result<()> {
        let tensors = [("out", out)];
        self.on_device("fill", &tensors)?;
        check::fill(&out.desc()).map_err(|e| self.invalid(e))?;
        let args = PolychipFillArgs {
            struct_size: size_of::<PolychipFillArgs>(),
            out: out.raw(),
            value,
        };
        self.call("fill", self.device.plugin().ops.fill, &args, &tensors)
    }

    /// `dst = src`, any strides.
    pub fn copy(&self, src: &Tensor, dst: &Tensor) -> Result<()> {
        let tensors = [("src", src), ("dst", dst)];
        self.on_device("copy", &tensors)?;
        check::copy(&src.desc(), &dst.desc()).map_err(|e| self.invalid(e))?;
        let args = PolychipCopyArgs {
            struct_size: size_of::<PolychipCopyArgs>(),
            src: src.raw(),
            dst: dst.raw(),
        };
        self.call("copy", self.device.plugin().ops.copy, &args, &tensors)
    }

    /// `dst = (dst.dtype) src`, rounding to nearest even.
    pub fn cast(&self, src: &Tensor, dst: &Tensor) -> Result<()> {
        let tensors = [("src", src), ("dst", dst)];
        self.on_device("cast", &tensors)?;
        check::cast(&src.desc(), &dst.desc()).map_err(|e| self.invalid(e))?;
        let args = PolychipCastArgs {
            struct_size: size_of::<PolychipCastArgs>(),
            src: src.raw(),
            dst: dst.raw(),
        };
        self.call("cast", self.device.plugin().ops.cast, &args, &tensors)
    }

    /// Elementwise `out = a OP b` with broadcasting; `alpha` scales `b` for
    /// add and sub.
    pub fn binary(
        &self,
        op: BinaryOp,
        a: &Tensor,
        b: &Tensor,
        out: &Tensor,
        alpha: f64,
    ) -> Result<()> {
        let name = op.name();
        let tensors = [("a", a), ("b", b), ("out", out)];
        self.on_device(name, &tensors)?;
        check::binary(name, &a.desc(), &b.desc(), &out.desc()).map_err(|e| self.invalid(e))?;
        let args = PolychipBinaryArgs {
            struct_size: size_of::<PolychipBinaryArgs>(),
            a: a.raw(),
            b: b.raw(),
            out: out.raw(),
            alpha,
        };
        let ops = &self.device.plugin().ops;
        let entry = match op {
            BinaryOp::Add => ops.add,
            BinaryOp::Sub => ops.sub,
            BinaryOp::Mul => ops.mul,
            BinaryOp::Div => ops.div,
        };
        self.call(name, entry, &args, &tensors)
    }

    /// `out = a + b`.
    pub fn add(&self, a: &Tensor, b: &Tensor, out: &Tensor) -> Result<()> {
        self.binary(BinaryOp::Add, a, b, out, 1.0)
    }

    /// `out = a - b`.
    pub fn sub(&self, a: &Tensor, b: &Tensor, out: &Tensor) -> Result<()> {
        self.binary(BinaryOp::Sub, a, b, out, 1.0)
    }

    /// `out = a * b`.
    pub fn mul(&self, a: &Tensor, b: &Tensor, out: &Tensor) -> Result<()> {
        self.binary(BinaryOp::Mul, a, b, out, 1.0)
    }

    /// `out = a / b`.
    pub fn div(&self, a: &Tensor, b: &Tensor, out: &Tensor) -> Result<()> {
        self.binary(BinaryOp::Div, a, b, out, 1.0)
    }

    /// Batched `out = alpha * op(a) @ op(b) + beta * out`.
    pub fn matmul(
        &self,
        a: &Tensor,
        b: &Tensor,
        out: &Tensor,
        options: MatmulOptions,
    ) -> Result<()> {
        let tensors = [("a", a), ("b", b), ("out", out)];
        self.on_device("matmul", &tensors)?;
        check::matmul(
            &a.desc(),
            &b.desc(),
            &out.desc(),
            options.transpose_a,
            options.transpose_b,
        )
        .map_err(|e| self.invalid(e))?;
        let args = PolychipMatmulArgs {
            struct_size: size_of::<PolychipMatmulArgs>(),
            a: a.raw(),
            b: b.raw(),
            out: out.raw(),
            alpha: options.alpha,
            beta: options.beta,
            transpose_a: u8::from(options.transpose_a),
            transpose_b: u8::from(options.transpose_b),
        };
        self.call("matmul", self.device.plugin().ops.matmul, &args, &tensors)
    }

    /// Softmax over the last dimension.
    pub fn softmax(&self, input: &Tensor, out: &Tensor) -> Result<()> {
        let tensors = [("input", input), ("out", out)];
        self.on_device("softmax", &tensors)?;
        check::softmax(&input.desc(), &out.desc()).map_err(|e| self.invalid(e))?;
        let args = PolychipSoftmaxArgs {
            struct_size: size_of::<PolychipSoftmaxArgs>(),
            input: input.raw(),
            out: out.raw(),
        };
        self.call("softmax", self.device.plugin().ops.softmax, &args, &tensors)
    }
}
