//! Full mode (`POLYCHIP_PLANTED_BUG` set): every operator in every dtype
//! Ferrite supports, correct, through `ferrite-kernels` on host memory (on
//! the calling thread, except `copy` and `fill` on a stream, which run on
//! its worker: [`crate::streams`]), except where the selected
//! [`crate::mutants`] bug takes over one operator.

use ferrite_kernels::{self as kernels, KernelError, View};
use polychip_plugin_sdk::{
    ActivationBackwardArgs, ActivationBackwardOp, AdamwArgs, ArangeArgs, AttentionArgs,
    AttentionBackwardArgs, BinaryArgs, BinaryOp, BitwiseArgs, BitwiseOp, CastArgs, CompareArgs,
    CompareOp, ConvertArgs, CopyArgs, CrossEntropyArgs, CrossEntropyBackwardArgs, CumsumArgs,
    DType, EmbeddingArgs, EmbeddingBackwardArgs, Error, FillArgs, GatherArgs, LayerNormArgs,
    LayerNormBackwardArgs, LinearArgs, MaskedFillArgs, MatmulArgs, OutputBackwardArgs,
    OutputBackwardOp, PowScalarArgs, ReduceArgs, ReduceBoolArgs, ReduceBoolOp, ReduceOp, Result,
    RmsNormArgs, RmsNormBackwardArgs, RopeArgs, ScaleArgs, ScatterAddArgs, SelectArgs, SoftmaxArgs,
    SoftmaxBackwardArgs, SumSquaresArgs, SwigluArgs, SwigluBackwardArgs, TensorDesc, UnaryArgs,
    UnaryOp,
};

use crate::mutants::{
    Bug, indexing as bad14, is, layout, numerics as bad, paths, round14 as r14, round15 as r15,
    round16 as r16, round17 as r17,
};

/// The kernels' name for a dtype.
fn kernel_dtype(dtype: DType) -> kernels::DType {
    match dtype {
        DType::F32 => kernels::DType::F32,
        DType::F16 => kernels::DType::F16,
        DType::BF16 => kernels::DType::BF16,
        DType::F64 => kernels::DType::F64,
        DType::I32 => kernels::DType::I32,
        DType::I64 => kernels::DType::I64,
        DType::U8 => kernels::DType::U8,
        DType::Bool => kernels::DType::Bool,
    }
}

/// A kernel refusal as a plugin error, prefixed with the operator's name.
fn kernel_error(op: &str, error: KernelError) -> Error {
    let message = error.0;
    if message.starts_with(op) && message[op.len()..].starts_with(':') {
        Error::invalid(message)
    } else {
        Error::invalid(format!("{op}: {message}"))
    }
}

/// Runs `kernel` on the views of `operands` (the last `outputs` of which
/// are written), skipping it when every output is empty. Layout bugs change
/// the strides the kernel sees; out-of-bounds bugs write after it.
///
/// # Safety
/// The operands address live host memory (the SDK checked the arguments).
pub unsafe fn launch<const N: usize>(
    op: &'static str,
    operands: [(&'static str, &TensorDesc<'_>); N],
    outputs: usize,
    kernel: impl FnOnce(&[View<'_>; N]) -> Result<(), KernelError>,
) -> Result<()> {
    let strides: [Vec<i64>; N] = operands.map(|(_, d)| d.strides().to_vec());
    let mut seen = strides.clone();
    for ((name, desc), s) in operands.iter().zip(seen.iter_mut()) {
        layout::strides(op, name, desc.shape, s);
    }
    fn view<'a>(desc: &TensorDesc<'a>, strides: &'a [i64]) -> View<'a> {
        View {
            ptr: desc.data,
            dtype: kernel_dtype(desc.dtype),
            shape: desc.shape,
            strides,
        }
    }
    let views: [View<'_>; N] = std::array::from_fn(|i| view(operands[i].1, &seen[i]));
    let first_out = N - outputs.min(N);
    if views[first_out..].iter().all(|v| v.shape.contains(&0)) {
        return Ok(());
    }
    kernel(&views).map_err(|e| kernel_error(op, e))?;
    for i in first_out..N {
        // SAFETY: forwarded contract; see `layout::after`.
        unsafe { layout::after(op, &view(operands[i].1, &strides[i])) };
    }
    Ok(())
}

/// `launch` for an args struct (operands in `operands()` order).
macro_rules! run {
    ($op:expr, $args:expr => |[$($v:ident),* $(,)?]| $call:expr) => {{
        // SAFETY: forwarded from the calling method's contract.
        unsafe {
            launch($op, $args.operands(), $args.outputs(), |[$($v),*]: &[View<'_>; _]| {
                #[allow(unused_unsafe)]
                // SAFETY: the views are the SDK-checked operands in host memory.
                unsafe { $call }
            })
        }
    }};
}

/// `Ok(())` after a hand-written mutant ran.
fn done() -> Result<(), KernelError> {
    Ok(())
}

/// The full-mode operators; `crate::Planted`'s `Operators` impl forwards here.
#[allow(clippy::missing_safety_doc)]
pub mod ops {
    use super::*;

    pub unsafe fn fill(args: &FillArgs<'_>) -> Result<()> {
        let value = args.value;
        run!("fill", args => |[out]| kernels::fill(out, value))
    }

    pub unsafe fn copy(args: &CopyArgs<'_>) -> Result<()> {
        run!("copy", args => |[src, dst]| {
            let through_double = match src.dtype {
                kernels::DType::I64 => is(Bug::CopyI64ThroughDouble),
                kernels::DType::F32 | kernels::DType::F64 | kernels::DType::F16 | kernels::DType::BF16 => {
                    is(Bug::CopyQuietsSignallingNan)
                }
                _ => false,
            };
            if through_double {
                // SAFETY: the views were checked by `run!`.
                unsafe { paths::copy_through_double(src, dst) };
                return done();
            }
            kernels::copy(src, dst)
        })
    }

    pub unsafe fn cast(args: &CastArgs<'_>) -> Result<()> {
        run!("cast", args => |[src, dst]| {
            if is(Bug::CastBf16TiesAway) && bad::cast_bf16_ties_away(src, dst) {
                return done();
            }
            if is(Bug::CastF64Bf16DoubleRounding) && bad::cast_f64_bf16_double(src, dst) {
                return done();
            }
            if is(Bug::CastF16Saturates) && paths::cast_f16_saturating(src, dst) {
                return done();
            }
            if is(Bug::CastNanPayloadToInfinity) && bad::cast_nan_payload_inf(src, dst) {
                return done();
            }
            kernels::cast(src, dst)
        })
    }

    pub unsafe fn binary(op: BinaryOp, args: &BinaryArgs<'_>) -> Result<()> {
        let k = match op {
            BinaryOp::Add => kernels::BinaryOp::Add,
            BinaryOp::Sub => kernels::BinaryOp::Sub,
            BinaryOp::Mul => kernels::BinaryOp::Mul,
            BinaryOp::Div => kernels::BinaryOp::Div,
        };
        let alpha = args.alpha;
        run!(op.name(), args => |[a, b, out]| {
            if op == BinaryOp::Add && is(Bug::AddIntSaturates) && bad::add_int_saturating(a, b, out, alpha) {
                return done();
            }
            if op == BinaryOp::Add && alpha == 0.0 && is(Bug::AddAlphaZeroSkipsB) {
                paths::add_alpha_zero_copy(a, out);
                return done();
            }
            if op == BinaryOp::Sub && is(Bug::SubSwapsColumnA) && paths::column_against_full(a, out) {
                // Planted: the operands swapped, so that the column is
                // second: b - alpha a.
                return kernels::binary(k, b, a, out, alpha);
            }
            if op == BinaryOp::Mul && is(Bug::MulColumnBroadcastAsRow) {
                if let Some(strides) = paths::column_as_row(b, out) {
                    let row = View { shape: out.shape, strides: &strides, ..*b };
                    return kernels::binary(k, a, &row, out, alpha);
                }
            }
            kernels::binary(k, a, b, out, alpha)
        })
    }

    pub unsafe fn matmul(args: &MatmulArgs<'_>) -> Result<()> {
        let (alpha, beta, ta, tb) = (args.alpha, args.beta, args.transpose_a, args.transpose_b);
        run!("matmul", args => |[a, b, out]| {
            let r = out.shape.len();
            if is(Bug::MatmulGemvIgnoresTransposeB) && tb && r >= 2 && out.shape[r - 2] == 1 {
                if let Some((shape, strides)) = paths::gemv_misread(b) {
                    let misread = View { shape: &shape, strides: &strides, ..*b };
                    return kernels::matmul(a, &misread, out, ta, false, alpha, beta);
                }
            }
            let ra = a.shape.len();
            let k = if ta { a.shape[ra - 2] } else { a.shape[ra - 1] };
            if is(Bug::MatmulGemvNReadsAPacked) && ra == 2 && out.shape[r - 1] == 1 {
                // Planted: a matrix-vector product (N = 1) that reads `a`
                // as packed rows of op(a), its strides and transpose unread.
                let m = out.shape[r - 2];
                let (shape, strides) = ([m, k], [k, 1]);
                let misread = View { shape: &shape, strides: &strides, ..*a };
                return kernels::matmul(&misread, b, out, false, tb, alpha, beta);
            }
            if is(Bug::MatmulBatchedBetaFirstOnly) && r == 3 && out.shape[0] > 1 && beta != 0.0 && beta != 1.0 {
                // Planted: matrices 1.. of `out` accumulate with beta 1
                // (divided by beta here, multiplied by it again below).
                let step = out.strides[0] as isize * out.dtype.size() as isize;
                let shape = [out.shape[0] - 1, out.shape[1], out.shape[2]];
                let rest = View { ptr: out.ptr.wrapping_offset(step), shape: &shape, ..*out };
                kernels::scale(&rest, 1.0 / beta)?;
                return kernels::matmul(a, b, out, ta, tb, alpha, beta);
            }
            let square = |v: &View<'_>| {
                let n = v.shape.len();
                v.shape[n - 1] == v.shape[n - 2]
            };
            if is(Bug::MatmulTransposeInferredWhenSquare) && ((ta && square(a)) || (tb && square(b))) {
                // Planted: a square operand taken as already transposed.
                return kernels::matmul(a, b, out, ta && !square(a), tb && !square(b), alpha, beta);
            }
            if is(Bug::MatmulRank1IgnoresBeta) && k == 1 {
                return kernels::matmul(a, b, out, ta, tb, alpha, 0.0);
            }
            if is(Bug::MatmulHalfRoundsBeforeAlpha)
                && out.dtype == kernels::DType::F16
                && beta == 0.0
                && alpha != 1.0
            {
                // Planted: the product rounded to f16, alpha applied after.
                kernels::matmul(a, b, out, ta, tb, 1.0, 0.0)?;
                return kernels::scale(out, alpha);
            }
            kernels::matmul(a, b, out, ta, tb, alpha, beta)
        })
    }

    pub unsafe fn softmax(args: &SoftmaxArgs<'_>) -> Result<()> {
        run!("softmax", args => |[i, o]| {
            if is(Bug::SoftmaxInPlaceSecondPass) {
                bad::softmax_second_pass(i, o);
                return done();
            }
            if is(Bug::SoftmaxRunningMaxFromZero) {
                bad::softmax_max_from_zero(i, o);
                return done();
            }
            if is(Bug::SoftmaxSharedScratch) && bad::softmax_shared_scratch(i, o) {
                return done();
            }
            if is(Bug::SoftmaxRowOfOneAsOne) && i.shape.last() == Some(&1) {
                bad::fill_value(o, 1.0);
                return done();
            }
            if is(Bug::SoftmaxOnlineNegInfPrefix) {
                bad::softmax_online_unguarded(i, o);
                return done();
            }
            if is(Bug::SoftmaxFirst65535Rows) {
                let n = o.shape.last().map_or(1, |&c| c.max(1) as usize);
                let saved = r16::past_grid(o, |p| p / n);
                let result = kernels::softmax(i, o);
                r16::restore(saved);
                return result;
            }
            kernels::softmax(i, o)
        })
    }

    pub unsafe fn unary(op: UnaryOp, args: &UnaryArgs<'_>) -> Result<()> {
        let k = match op {
            UnaryOp::Neg => kernels::UnaryOp::Neg,
            UnaryOp::Exp => kernels::UnaryOp::Exp,
            UnaryOp::Log => kernels::UnaryOp::Log,
            UnaryOp::Sqrt => kernels::UnaryOp::Sqrt,
            UnaryOp::Rsqrt => kernels::UnaryOp::Rsqrt,
            UnaryOp::Tanh => kernels::UnaryOp::Tanh,
            UnaryOp::Relu => kernels::UnaryOp::Relu,
            UnaryOp::Silu => kernels::UnaryOp::Silu,
            UnaryOp::Gelu => kernels::UnaryOp::Gelu,
            UnaryOp::GeluErf => kernels::UnaryOp::GeluErf,
            UnaryOp::Sigmoid => kernels::UnaryOp::Sigmoid,
            UnaryOp::Sin => kernels::UnaryOp::Sin,
            UnaryOp::Cos => kernels::UnaryOp::Cos,
        };
        run!(op.name(), args => |[i, o]| {
            match op {
                UnaryOp::Silu if is(Bug::SiluTruncatesHalf) && bad::silu_truncated(i, o) => {
                    return done();
                }
                UnaryOp::Silu if is(Bug::SiluF16FlushesSubnormals) && paths::silu_f16_ftz(i, o) => {
                    return done();
                }
                UnaryOp::Gelu if is(Bug::GeluErfForm) => bad::gelu_erf(i, o),
                UnaryOp::Exp if is(Bug::ExpFastApprox) => bad::exp_fast(i, o),
                UnaryOp::Exp if is(Bug::ExpFlushesSubnormals) && paths::exp_ftz(i, o) => {}
                UnaryOp::Neg if is(Bug::NegAsZeroMinus) => paths::neg_zero_minus(i, o),
                UnaryOp::Neg if is(Bug::NegOutputInnerStrideFlipped) => {
                    if let Some((ptr, strides)) = paths::inner_stride_flipped(o) {
                        let flipped = View { ptr, strides: &strides, ..*o };
                        return kernels::unary(k, i, &flipped);
                    }
                    return kernels::unary(k, i, o);
                }
                UnaryOp::Log if is(Bug::LogZeroNan) => bad::log_zero_nan(i, o),
                UnaryOp::Sigmoid if is(Bug::SigmoidOverflowingExp) => {
                    bad::sigmoid_overflowing_exp(i, o)
                }
                UnaryOp::Sqrt if is(Bug::SqrtNegZero) => bad::sqrt_neg_zero(i, o),
                UnaryOp::Sin if is(Bug::SinReducedInF32) => bad::sin_reduced_in_f32(i, o),
                UnaryOp::Sin if is(Bug::SinZeroPositive) => r14::sin_zero_positive(i, o),
                UnaryOp::Rsqrt if is(Bug::RsqrtHangsOnLargeTensors) && i.numel() > 65536 => {
                    crate::mutants::hang()
                }
                _ => return kernels::unary(k, i, o),
            }
            done()
        })
    }

    pub unsafe fn pow_scalar(args: &PowScalarArgs<'_>) -> Result<()> {
        let e = args.exponent;
        run!("pow_scalar", args => |[i, o]| {
            if is(Bug::PowScalarHalfAsSqrt) && e == 0.5 {
                bad::pow_half_as_sqrt(i, o);
                return done();
            }
            if is(Bug::PowScalarNanZeroExponent) {
                bad::pow_nan_zero(i, o, e);
                return done();
            }
            if is(Bug::PowViaExpLog) {
                r17::pow_via_exp_log(i, o, e);
                return done();
            }
            kernels::pow_scalar(i, o, e)
        })
    }

    pub unsafe fn activation_backward(
        op: ActivationBackwardOp,
        args: &ActivationBackwardArgs<'_>,
    ) -> Result<()> {
        let k = match op {
            ActivationBackwardOp::ReluBackward => kernels::ActivationOp::Relu,
            ActivationBackwardOp::SiluBackward => kernels::ActivationOp::Silu,
            ActivationBackwardOp::GeluBackward => kernels::ActivationOp::Gelu,
            ActivationBackwardOp::GeluErfBackward => kernels::ActivationOp::GeluErf,
        };
        run!(op.name(), args => |[g, i, gi]| {
            if op == ActivationBackwardOp::ReluBackward && is(Bug::ReluBackwardAtZero) {
                bad::relu_backward_at_zero(g, i, gi);
                return done();
            }
            if op == ActivationBackwardOp::ReluBackward && is(Bug::ReluBackwardNanInputZero) {
                bad::relu_backward_nan_zero(g, i, gi);
                return done();
            }
            if op == ActivationBackwardOp::SiluBackward && is(Bug::SiluBackwardNegativeCutoff) {
                paths::silu_backward_cutoff(g, i, gi);
                return done();
            }
            if op == ActivationBackwardOp::SiluBackward && is(Bug::SiluBackwardFarTailNan) {
                bad::silu_backward_unguarded(g, i, gi);
                return done();
            }
            kernels::activation_backward(k, g, i, gi)
        })
    }

    pub unsafe fn output_backward(
        op: OutputBackwardOp,
        args: &OutputBackwardArgs<'_>,
    ) -> Result<()> {
        let k = match op {
            OutputBackwardOp::SigmoidBackward => kernels::OutputOp::Sigmoid,
            OutputBackwardOp::TanhBackward => kernels::OutputOp::Tanh,
        };
        run!(op.name(), args => |[g, y, gi]| kernels::output_backward(k, g, y, gi))
    }

    pub unsafe fn convert(args: &ConvertArgs<'_>) -> Result<()> {
        run!("convert", args => |[s, d]| {
            if is(Bug::ConvertIntegerWraps) && bad::convert_wrapping(s, d)
                || is(Bug::ConvertIntBf16ThroughF32) && r14::convert_int_bf16_through_f32(s, d)
                || is(Bug::ConvertF16OverflowAtMax) && r14::convert_f16_overflow_at_max(s, d)
            {
                return done();
            }
            if is(Bug::ConvertNarrowingSaturates) && bad::convert_narrowing_saturated(s, d) {
                return done();
            }
            kernels::convert(s, d)
        })
    }

    pub unsafe fn arange(args: &ArangeArgs<'_>) -> Result<()> {
        let (start, step) = (args.start, args.step);
        run!("arange", args => |[o]| {
            if is(Bug::ArangeAccumulates) {
                bad::arange_accumulated(o, start, step);
                return done();
            }
            if is(Bug::ArangeFused) {
                r14::arange_fused(o, start, step);
                return done();
            }
            if is(Bug::ArangeI64InIntegers) && r14::arange_i64_in_integers(o, start, step) {
                return done();
            }
            kernels::arange(o, start, step)
        })
    }

    pub unsafe fn select(args: &SelectArgs<'_>) -> Result<()> {
        run!("select", args => |[c, a, b, o]| {
            if is(Bug::SelectArithmeticBlend) && bad::select_blend(c, a, b, o)
                || is(Bug::SelectScalarBThroughDouble)
                    && r14::select_scalar_b_through_double(c, a, b, o)
                || is(Bug::SelectScalarCondRepeats) && r14::select_scalar_cond_repeats(c, a, b, o)
            {
                return done();
            }
            kernels::select(c, a, b, o)
        })
    }

    pub unsafe fn masked_fill(args: &MaskedFillArgs<'_>) -> Result<()> {
        let mut value = args.value;
        if is(Bug::MaskedFillValueThroughF32) {
            // Planted: the value travels as an f32 kernel argument.
            value = f64::from(value as f32);
        }
        run!("masked_fill", args => |[i, m, o]| {
            if is(Bug::MaskedFillMaskPerRowWhenSquare) && r14::masked_fill_mask_per_row(i, m, o, value) {
                return done();
            }
            kernels::masked_fill(i, m, o, value)
        })
    }

    pub unsafe fn compare(op: CompareOp, args: &CompareArgs<'_>) -> Result<()> {
        let k = match op {
            CompareOp::Eq => kernels::CompareOp::Eq,
            CompareOp::Ne => kernels::CompareOp::Ne,
            CompareOp::Lt => kernels::CompareOp::Lt,
            CompareOp::Le => kernels::CompareOp::Le,
            CompareOp::Gt => kernels::CompareOp::Gt,
            CompareOp::Ge => kernels::CompareOp::Ge,
        };
        run!(op.name(), args => |[a, b, o]| {
            if op == CompareOp::Eq && is(Bug::EqBySubtraction) {
                bad::eq_by_subtraction(a, b, o, false);
                return done();
            }
            if op == CompareOp::Lt && is(Bug::LtScalarAsF32) && r14::lt_scalar_as_f32(a, b, o) {
                return done();
            }
            kernels::compare(k, a, b, o)
        })
    }

    pub unsafe fn gather(args: &GatherArgs<'_>) -> Result<()> {
        let dim = args.dim;
        run!("gather", args => |[i, x, o]| {
            if is(Bug::GatherWrapsNegativeIndex) && bad14::gather_wrapping(i, x, o, dim)
                || is(Bug::GatherIndexSelectDim0Only) && r15::gather_select_dim0(i, x, o, dim)
            {
                return done();
            }
            kernels::gather(i, x, o, dim)
        })
    }

    pub unsafe fn scatter_add(args: &ScatterAddArgs<'_>) -> Result<()> {
        let dim = args.dim;
        run!("scatter_add", args => |[x, s, d]| {
            if is(Bug::ScatterAddRoundsPerUpdate) && bad14::scatter_add_per_update(d, x, s, dim)
                || is(Bug::ScatterAddIntSaturates) && r15::scatter_add_int(d, x, s, dim, false)
                || is(Bug::ScatterAddIntThroughF64) && r15::scatter_add_int(d, x, s, dim, true)
            {
                return done();
            }
            kernels::scatter_add(d, x, s, dim)
        })
    }

    pub unsafe fn cumsum(args: &CumsumArgs<'_>) -> Result<()> {
        let dim = args.dim;
        run!("cumsum", args => |[i, o]| {
            if is(Bug::CumsumAccumulatesInDtype) && bad14::cumsum_in_dtype(i, o, dim)
                || is(Bug::CumsumStartsNegativeZero) && r15::cumsum_negative_zero_start(i, o, dim)
            {
                return done();
            }
            if is(Bug::CumsumFirst65535Lines) {
                let saved = r16::past_grid(o, |p| r15::line(o.shape, dim, p));
                let result = kernels::cumsum(i, o, dim);
                r16::restore(saved);
                return result;
            }
            kernels::cumsum(i, o, dim)
        })
    }

    pub unsafe fn reduce_bool(op: ReduceBoolOp, args: &ReduceBoolArgs<'_>) -> Result<()> {
        let (dim, keepdim) = (args.dim, args.keepdim);
        let k = match op {
            ReduceBoolOp::Any => kernels::BoolReduceOp::Any,
            ReduceBoolOp::All => kernels::BoolReduceOp::All,
        };
        run!(op.name(), args => |[i, o]| {
            let planted = match op {
                ReduceBoolOp::Any => {
                    is(Bug::AnyChecksFirst1024) && bad14::any_first_block(i, o, dim, keepdim)
                        || is(Bug::AnyTestsLowByte) && r15::any_low_byte(i, o, dim)
                }
                ReduceBoolOp::All => is(Bug::AllNanAsZero) && bad14::all_nan_as_zero(i, o, dim),
            };
            if planted {
                return done();
            }
            kernels::reduce_bool(k, i, o, dim, keepdim)
        })
    }

    pub unsafe fn bitwise(op: BitwiseOp, args: &BitwiseArgs<'_>) -> Result<()> {
        let k = match op {
            BitwiseOp::BitwiseAnd => kernels::BitwiseOp::And,
            BitwiseOp::BitwiseOr => kernels::BitwiseOp::Or,
            BitwiseOp::BitwiseXor => kernels::BitwiseOp::Xor,
        };
        run!(op.name(), args => |[a, b, o]| {
            let planted = match op {
                BitwiseOp::BitwiseAnd => is(Bug::BitwiseAndThroughF64) && bad14::and_through_f64(a, b, o),
                BitwiseOp::BitwiseOr => is(Bug::BitwiseOrBoolAsSum) && bad14::or_bool_as_sum(a, b, o),
                BitwiseOp::BitwiseXor => is(Bug::BitwiseXorLow32Bits) && bad14::xor_low_32(a, b, o),
            };
            if planted {
                return done();
            }
            kernels::bitwise(k, a, b, o)
        })
    }

    pub unsafe fn swiglu(args: &SwigluArgs<'_>) -> Result<()> {
        run!("swiglu", args => |[g, u, o]| {
            if is(Bug::SwigluLowPrecisionSigmoid) {
                bad::swiglu_low_precision(g, u, o);
                return done();
            }
            kernels::swiglu(g, u, o)
        })
    }

    pub unsafe fn swiglu_backward(args: &SwigluBackwardArgs<'_>) -> Result<()> {
        run!("swiglu_backward", args => |[g, u, go, gg, gu]| {
            if is(Bug::SwigluBackwardInPlaceReread) {
                bad::swiglu_backward_reread(g, u, go, gg, gu);
                return done();
            }
            kernels::swiglu_backward(g, u, go, gg, gu)
        })
    }

    pub unsafe fn reduce(op: ReduceOp, args: &ReduceArgs<'_>) -> Result<()> {
        let k = match op {
            ReduceOp::Sum => kernels::ReduceOp::Sum,
            ReduceOp::Mean => kernels::ReduceOp::Mean,
            ReduceOp::Max => kernels::ReduceOp::Max,
            ReduceOp::Argmax => kernels::ReduceOp::Argmax,
        };
        let (dim, keepdim) = (args.dim, args.keepdim);
        run!(op.name(), args => |[i, o]| {
            if matches!(op, ReduceOp::Sum) && is(Bug::SumFirst65535Outputs) {
                let saved = r16::past_grid(o, |p| p);
                let result = kernels::reduce(k, i, o, dim, keepdim);
                r16::restore(saved);
                return result;
            }
            let handled = match op {
                ReduceOp::Sum if is(Bug::SumDropsVectorTail) => paths::sum_vector_tail(i, o, dim),
                ReduceOp::Max if is(Bug::MaxIgnoresNan) => bad::max_ignoring_nan(i, o, dim),
                ReduceOp::Max if is(Bug::MaxStopsAtInfinity) => {
                    bad::max_stopping_at_infinity(i, o, dim)
                }
                ReduceOp::Max if is(Bug::MaxNanFirstBlockOnly) => {
                    bad::max_nan_first_block_only(i, o, dim)
                }
                ReduceOp::Max if is(Bug::MaxIntoUninitialisedOutput) => {
                    bad::max_into_uninitialised(i, o, dim)
                }
                ReduceOp::Sum if is(Bug::SumUnitDimAsCopy) => bad::reduce_unit_dim_as_copy(i, o, dim),
                ReduceOp::Argmax if is(Bug::ArgmaxLastTie) => bad::argmax_last(i, o, dim),
                ReduceOp::Argmax if is(Bug::ArgmaxAllNegInfRow) => {
                    paths::argmax_from_minus_one(i, o, dim)
                }
                _ => false,
            };
            if handled {
                return done();
            }
            kernels::reduce(k, i, o, dim, keepdim)
        })
    }

    pub unsafe fn sum_squares(args: &SumSquaresArgs<'_>) -> Result<()> {
        run!("sum_squares", args => |[i, o]| {
            if is(Bug::SumSquaresHalfAccumulation) && bad::sum_squares_half(i, o) {
                return done();
            }
            if is(Bug::SumSquaresScaledByMax) {
                bad::sum_squares_scaled(i, o);
                return done();
            }
            kernels::sum_squares(i, o)
        })
    }

    /// linear's kernel call, with its planted bugs: an output tile never
    /// written back, a stale pre-packed weight.
    unsafe fn linear_kernel(
        i: &View<'_>,
        w: &View<'_>,
        b: Option<&View<'_>>,
        o: &View<'_>,
    ) -> Result<(), KernelError> {
        // SAFETY: the views are live (the caller's contract).
        let saved = unsafe {
            if is(Bug::LinearTileEdge) {
                bad::linear_tile_edge_save(o)
            } else if is(Bug::LinearRowTileEdge) {
                paths::linear_row_tile_save(o)
            } else {
                Vec::new()
            }
        };
        if let (true, Some(b)) = (is(Bug::LinearBiasPerRowWhenSquare), b) {
            if o.shape.len() == 2 && o.shape[0] == o.shape[1] {
                // Planted: the bias added down the rows (one value a row).
                // SAFETY: the views are live (the caller's contract).
                unsafe { kernels::linear(i, w, None, o)? };
                let strides = [b.strides[0], 0];
                let column = View {
                    shape: o.shape,
                    strides: &strides,
                    ..*b
                };
                // SAFETY: in place, as the ABI allows for add.
                return unsafe { kernels::binary(kernels::BinaryOp::Add, o, &column, o, 1.0) };
            }
        }
        if is(Bug::LinearNoInnerDimSkipsWrite) && i.shape.last() == Some(&0) {
            return done();
        }
        if is(Bug::LinearWeightCacheByAddress) {
            // SAFETY: as above.
            let packed = unsafe { paths::packed_weight(w) };
            let strides = polychip_plugin_sdk::contiguous_strides(w.shape);
            let cached = View {
                ptr: packed.as_ptr().cast_mut(),
                dtype: w.dtype,
                shape: w.shape,
                strides: &strides,
            };
            // SAFETY: the packed copy is live for the call and only read.
            unsafe { kernels::linear(i, &cached, b, o)? };
        } else {
            // SAFETY: as above.
            unsafe { kernels::linear(i, w, b, o)? };
        }
        // SAFETY: as above.
        unsafe { bad::restore(saved) };
        done()
    }

    pub unsafe fn linear(args: &LinearArgs<'_>) -> Result<()> {
        match &args.bias {
            Some(bias) => {
                let operands = [
                    ("input", &args.input),
                    ("weight", &args.weight),
                    ("bias", bias),
                    ("out", &args.out),
                ];
                // SAFETY: forwarded contract.
                unsafe {
                    launch("linear", operands, 1, |[i, w, b, o]| {
                        linear_kernel(i, w, Some(b), o)
                    })
                }
            }
            None => {
                let operands = [
                    ("input", &args.input),
                    ("weight", &args.weight),
                    ("out", &args.out),
                ];
                // SAFETY: forwarded contract.
                unsafe {
                    launch("linear", operands, 1, |[i, w, o]| {
                        linear_kernel(i, w, None, o)
                    })
                }
            }
        }
    }

    pub unsafe fn log_softmax(args: &SoftmaxArgs<'_>) -> Result<()> {
        run!("log_softmax", args => |[i, o]| {
            if is(Bug::LogSoftmaxWideRowDropsTile) && bad::log_softmax_wide(i, o) {
                return done();
            }
            if is(Bug::LogSoftmaxOfSoftmax) {
                r17::log_softmax_of_softmax(i, o);
                return done();
            }
            kernels::log_softmax(i, o)
        })
    }

    pub unsafe fn softmax_backward(args: &SoftmaxBackwardArgs<'_>) -> Result<()> {
        run!("softmax_backward", args => |[y, g, gi]| kernels::softmax_backward(y, g, gi, false))
    }

    pub unsafe fn log_softmax_backward(args: &SoftmaxBackwardArgs<'_>) -> Result<()> {
        run!("log_softmax_backward", args => |[y, g, gi]| {
            if is(Bug::LogSoftmaxBackwardHalfAccumulation) && bad::log_softmax_backward_half(y, g, gi) {
                return done();
            }
            kernels::softmax_backward(y, g, gi, true)
        })
    }

    pub unsafe fn rms_norm(args: &RmsNormArgs<'_>) -> Result<()> {
        let eps = args.eps;
        run!("rms_norm", args => |[i, w, o, r]| {
            if is(Bug::RmsNormZeroWidthSkipsStats) && w.shape == [0] {
                return done();
            }
            if is(Bug::RmsNormEpsOutsideSqrt) {
                bad::rms_norm_eps_outside(i, w, o, r, eps);
                return done();
            }
            if is(Bug::RmsNormDropsVectorTail) && paths::rms_norm_vector_tail(i, w, o, r, eps) {
                return done();
            }
            if is(Bug::RmsNormLeaksWorkspace) {
                paths::leak_workspace(i.shape.iter().map(|&d| d.max(0) as usize).product());
            }
            kernels::rms_norm(i, w, o, r, eps)
        })
    }

    pub unsafe fn rms_norm_backward(args: &RmsNormBackwardArgs<'_>) -> Result<()> {
        run!("rms_norm_backward", args => |[g, i, w, r, gi, gw]| {
            kernels::rms_norm_backward(g, i, w, r, gi, gw)?;
            if is(Bug::RmsNormBackwardRowOver4096) {
                paths::rms_norm_backward_row_4096(g, i, w, r, gi);
            }
            done()
        })
    }

    pub unsafe fn layer_norm(args: &LayerNormArgs<'_>) -> Result<()> {
        let eps = args.eps;
        run!("layer_norm", args => |[i, w, b, o, m, r]| {
            if is(Bug::LayerNormOnePassVariance) && i.shape.last().is_some_and(|&n| n > 0) {
                bad::layer_norm_by(i, [w, b, o, m, r], eps, r17::one_pass_stats);
                return done();
            }
            if is(Bug::LayerNormUnbiasedVariance) {
                bad::layer_norm_unbiased(i, w, b, o, m, r, eps);
                return done();
            }
            if is(Bug::LayerNormLeavesSignalsBlocked) {
                paths::leave_signals_blocked();
            }
            if is(Bug::LayerNormRowOfOneAsBias) && w.shape == [1] {
                kernels::layer_norm(i, w, b, o, m, r, eps)?;
                // SAFETY: the bias's one live element.
                let bias = unsafe { bad::load_one(b) };
                bad::fill_value(o, bias);
                return done();
            }
            kernels::layer_norm(i, w, b, o, m, r, eps)
        })
    }

    pub unsafe fn layer_norm_backward(args: &LayerNormBackwardArgs<'_>) -> Result<()> {
        run!("layer_norm_backward", args => |[g, i, w, m, r, gi, gw, gb]| {
            kernels::layer_norm_backward(g, i, w, m, r, gi, gw, gb)?;
            if is(Bug::LayerNormBackwardGradBiasRowsWhenSquare)
                && g.shape.len() == 2
                && g.shape[0] == g.shape[1]
            {
                // Planted: grad_bias summed along each row of grad_out.
                kernels::reduce(kernels::ReduceOp::Sum, g, gb, 1, false)?;
            }
            done()
        })
    }

    pub unsafe fn rope(args: &RopeArgs<'_>, backward: bool) -> Result<()> {
        let interleaved = args.interleaved;
        let op = if backward { "rope_backward" } else { "rope" };
        run!(op, args => |[i, c, s, o]| {
            if backward
                && is(Bug::RopeBackwardHeadDim64Pairs)
                && paths::rope_backward_64_pairs(i, c, s, o, interleaved)
            {
                return done();
            }
            kernels::rope(i, c, s, o, interleaved, backward)
        })
    }

    pub unsafe fn attention(args: &AttentionArgs<'_>) -> Result<()> {
        let (scale, causal) = (args.scale, args.causal);
        run!("attention", args => |[q, k, v, o, l]| {
            let scale = if scale == 0.0 && is(Bug::AttentionScaleZeroAsUnset) {
                1.0 / (q.shape[3] as f64).sqrt()
            } else {
                scale
            };
            if causal && is(Bug::AttentionCausalTopLeft) {
                // Top-left alignment is the bottom-right kernel on the
                // first seq_q keys (the later ones are never visible).
                if let (Some(k), Some(v)) = (paths::first_keys(k, q), paths::first_keys(v, q)) {
                    return kernels::attention(q, &k.view(), &v.view(), o, l, scale, causal);
                }
            }
            if is(Bug::AttentionGqaHeadsInterleaved)
                && let Some(moved) = paths::gqa_interleave(q, k)
            {
                // The correct kernel on the query heads reordered so that
                // head h lands in the group of kv head h % heads_kv, the
                // results put back in head order, the query restored.
                let result = kernels::attention(q, k, v, o, l, scale, causal);
                paths::gqa_restore(moved, o, l);
                return result;
            }
            if is(Bug::AttentionNanRowAsMasked) {
                kernels::attention(q, k, v, o, l, scale, causal)?;
                paths::attention_nan_rows_as_masked(o, l);
                return done();
            }
            kernels::attention(q, k, v, o, l, scale, causal)
        })
    }

    pub unsafe fn attention_backward(args: &AttentionBackwardArgs<'_>) -> Result<()> {
        let (scale, causal) = (args.scale, args.causal);
        run!("attention_backward", args => |[q, k, v, o, l, g, gq, gk, gv]| {
            let saved = if is(Bug::AttentionBackwardKeyTileEdge) {
                let mut saved = paths::attention_key_tile_save(gk);
                saved.extend(paths::attention_key_tile_save(gv));
                saved
            } else {
                Vec::new()
            };
            kernels::attention_backward(q, k, v, o, l, g, gq, gk, gv, scale, causal)?;
            bad::restore(saved);
            done()
        })
    }

    pub unsafe fn embedding(args: &EmbeddingArgs<'_>) -> Result<()> {
        run!("embedding", args => |[w, i, o]| {
            let rows = w.shape.first().copied().unwrap_or(0);
            // Ids the range check misses past its first block: they read
            // row 0, then their rows are zeroed.
            let bad = is(Bug::EmbeddingCheckFirstBlock)
                .then(|| paths::ids_bad_past_first_block(i, rows))
                .flatten();
            let remap: Option<fn(i64, i64) -> i64> = if bad.is_some() {
                Some(|x, rows| if (0..rows).contains(&x) { x } else { 0 })
            } else if is(Bug::EmbeddingU16Index) {
                Some(|x, _| x & 0xffff)
            } else if is(Bug::EmbeddingIndexNarrowedToI32) {
                Some(|x, _| i64::from(x as i32))
            } else if is(Bug::EmbeddingClampsIndex) {
                Some(|x, rows| x.clamp(0, (rows - 1).max(0)))
            } else {
                None
            };
            let Some(f) = remap else {
                return kernels::embedding(w, i, o);
            };
            let fixed = bad::remap_indices(i, rows, f);
            let strides = polychip_plugin_sdk::contiguous_strides(i.shape);
            let narrow: Vec<i32>;
            let ptr = if i.dtype == kernels::DType::I32 {
                narrow = fixed.iter().map(|&x| x as i32).collect();
                narrow.as_ptr().cast_mut().cast::<u8>()
            } else {
                fixed.as_ptr().cast_mut().cast::<u8>()
            };
            let idx = View { ptr, dtype: i.dtype, shape: i.shape, strides: &strides };
            kernels::embedding(w, &idx, o)?;
            if let Some(bad) = bad {
                paths::zero_rows(o, &bad);
            }
            done()
        })
    }

    pub unsafe fn embedding_backward(args: &EmbeddingBackwardArgs<'_>) -> Result<()> {
        run!("embedding_backward", args => |[g, i, w]| {
            if is(Bug::EmbeddingBackwardRacyDuplicates) && paths::embedding_backward_racy(g, i, w) {
                return done();
            }
            kernels::embedding_backward(g, i, w)
        })
    }

    pub unsafe fn cross_entropy(args: &CrossEntropyArgs<'_>) -> Result<()> {
        let ignore = args.ignore_index;
        let result = run!("cross_entropy", args => |[l, t, o]| {
            kernels::cross_entropy(l, t, o, ignore)?;
            if is(Bug::CrossEntropyWideNoMaxShift) {
                bad::cross_entropy_wide(l, t, o, ignore);
            }
            if is(Bug::CrossEntropyMeanOverAllRows) {
                paths::cross_entropy_all_rows(l, t, o, ignore, false);
            }
            if is(Bug::CrossEntropyOddLastRowCounted) {
                paths::cross_entropy_all_rows(l, t, o, ignore, true);
            }
            done()
        });
        match result {
            // Planted: a data-dependent refusal reported as an internal error.
            Err(e) if is(Bug::CrossEntropyRefusesInternal) => Err(Error::internal(e.message)),
            r => r,
        }
    }

    pub unsafe fn cross_entropy_backward(args: &CrossEntropyBackwardArgs<'_>) -> Result<()> {
        let (ignore, grad_loss) = (args.ignore_index, args.grad_loss);
        run!("cross_entropy_backward", args => |[l, t, g]| {
            if is(Bug::CrossEntropyBackwardTargetNarrowedToI32) {
                let narrowed = bad::remap_indices(t, 0, |x, _| i64::from(x as i32));
                let strides = polychip_plugin_sdk::contiguous_strides(t.shape);
                let targets = View {
                    ptr: narrowed.as_ptr().cast_mut().cast::<u8>(),
                    dtype: kernels::DType::I64,
                    shape: t.shape,
                    strides: &strides,
                };
                return kernels::cross_entropy_backward(l, &targets, g, grad_loss, ignore);
            }
            kernels::cross_entropy_backward(l, t, g, grad_loss, ignore)
        })
    }

    pub unsafe fn adamw(args: &AdamwArgs<'_>) -> Result<()> {
        let a = *args;
        let (lr, b1, b2, eps) = (a.lr, a.beta1, a.beta2, a.eps);
        let mut wd = a.weight_decay;
        let mut step = a.step;
        if is(Bug::AdamwNoBiasCorrection) {
            // beta^step == 0: the correction factors are all 1.
            step = 1 << 40;
        }
        if is(Bug::AdamwIgnoresWeightDecay) {
            wd = 0.0;
        }
        if is(Bug::AdamwPinsCallingThread) {
            paths::pin_to_first_cpu();
        }
        if is(Bug::AdamwSkipsBf16) && args.param.dtype == DType::BF16 {
            return Ok(());
        }
        if is(Bug::AdamwLrZeroSkipsMoments) && lr == 0.0 {
            return Ok(());
        }
        // eps added to sqrt(v) with the correction in the step size: the
        // same as eps / sqrt(1 - beta2^t) added to sqrt(v_hat).
        let eps = if is(Bug::AdamwEpsilonHat) && step >= 1 {
            eps / (1.0 - b2.powi(step.min(i64::from(i32::MAX)) as i32)).sqrt()
        } else {
            eps
        };
        run!("adamw", args => |[g, p, m, v]| {
            if is(Bug::AdamwStepI16) {
                let h = paths::Adamw { lr, beta1: b1, beta2: b2, eps, weight_decay: wd, step };
                paths::adamw_step_i16(p, g, m, v, h);
                return done();
            }
            kernels::adamw(p, g, m, v, lr, b1, b2, eps, wd, step)
        })
    }

    pub unsafe fn scale(args: &ScaleArgs<'_>) -> Result<()> {
        let alpha = args.alpha;
        run!("scale", args => |[t]| {
            if is(Bug::ScaleAlphaZeroMemset) && alpha == 0.0 {
                paths::scale_zero_memset(t);
                return done();
            }
            if is(Bug::ScaleLeavesFtzOn) {
                paths::leave_ftz_on();
            }
            kernels::scale(t, alpha)
        })
    }
}
