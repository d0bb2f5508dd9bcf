//! The catalog of planted bugs selectable with `POLYCHIP_PLANTED_BUG`.
//!
//! Each [`Bug`] is one mutation of the otherwise correct full-mode plugin
//! (`crate::full`, every operator through `ferrite-kernels`), and touches
//! exactly one operator (the [`Kind::Stream`] bugs touch the streams, and
//! are checked at the operator they name). Each entry of [`CATALOG`] says what real-world bug
//! it imitates and which conformance check catches it
//! (`cli/tests/planted_bugs.rs` proves each one is flagged at its operator).
//!
//! The mutations live by kind: [`layout`] (view transforms and writes
//! outside the output), [`numerics`] (hand-written wrong kernels),
//! [`paths`] (kernels wrong only on a special-cased path: one class of
//! shapes or of argument values, or a call after an earlier one) and
//! [`contract`] (raw op-table entries that bypass the SDK).

pub mod contract;
pub mod elems;
pub mod indexing;
pub mod layout;
pub mod numerics;
pub mod paths;
pub mod round14;
pub mod round15;
pub mod round16;
pub mod round17;

use std::sync::OnceLock;

/// What family of bug an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Strides, offsets, broadcast and gapped views.
    Layout,
    /// In-place calls (output is exactly an input).
    Aliasing,
    /// Writes outside the output's elements.
    OutOfBounds,
    /// Wrong only beyond a size threshold.
    Size,
    /// Wrong by a little: precision, formula, accumulation dtype.
    Numerics,
    /// Rounding of exact ties.
    Rounding,
    /// NaN, signed zero, infinities, ties in index results.
    EdgeValues,
    /// Refusals and the error-object contract.
    Contract,
    /// A call that never returns.
    Liveness,
    /// Wrong only for one class of shapes or argument values that a
    /// kernel special-cases (a fast path).
    Path,
    /// Wrong only because of an earlier call (state kept between calls).
    State,
    /// Streams and events: work that runs before what it must wait for, or
    /// is read before it has finished.
    Stream,
    /// Right alone, wrong when called from several threads at once: state
    /// shared between calls without a lock.
    Concurrency,
}

/// One planted bug.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bug {
    SubIgnoresByteOffset,
    DivZeroStrideAsCompact,
    TanhNegativeStrideAbs,
    ReluOutputAssumedCompact,
    RmsNormIgnoresRowStride,
    MatmulTransposedBAsCompact,
    SoftmaxInPlaceSecondPass,
    SwigluBackwardInPlaceReread,
    AddWritesOnePastEnd,
    NegZeroesElementBefore,
    GeluBackwardWritesGaps,
    LogSoftmaxWideRowDropsTile,
    EmbeddingU16Index,
    SumSquaresHalfAccumulation,
    LinearTileEdge,
    CrossEntropyWideNoMaxShift,
    SiluTruncatesHalf,
    GeluErfForm,
    SwigluLowPrecisionSigmoid,
    ExpFastApprox,
    LogSoftmaxBackwardHalfAccumulation,
    RmsNormEpsOutsideSqrt,
    LayerNormUnbiasedVariance,
    AdamwNoBiasCorrection,
    AdamwIgnoresWeightDecay,
    AdamwSkipsBf16,
    CastBf16TiesAway,
    CastF64Bf16DoubleRounding,
    MaxIgnoresNan,
    ArgmaxLastTie,
    ReluBackwardAtZero,
    LogZeroNan,
    SqrtNegZero,
    PowScalarNanZeroExponent,
    EmbeddingClampsIndex,
    CrossEntropyRefusesInternal,
    AdamwRefusalWrongCode,
    EmbeddingBackwardForeignError,
    CrossEntropyBackwardStaleError,
    RopeBackwardNoWrite,
    RsqrtHangsOnLargeTensors,
    SumDropsVectorTail,
    MatmulGemvIgnoresTransposeB,
    MatmulRank1IgnoresBeta,
    LinearRowTileEdge,
    MulColumnBroadcastAsRow,
    SiluBackwardGradOutAsCompact,
    ScaleAlphaZeroMemset,
    ExpFlushesSubnormals,
    NegAsZeroMinus,
    CastF16Saturates,
    CrossEntropyMeanOverAllRows,
    EmbeddingBackwardRacyDuplicates,
    LinearWeightCacheByAddress,
    LayerNormInputRowsAssumedPacked,
    GeluBackwardGradOutGapsAsCompact,
    SiluF16FlushesSubnormals,
    SiluBackwardNegativeCutoff,
    AttentionBackwardKeyTileEdge,
    RopeBackwardHeadDim64Pairs,
    RmsNormBackwardRowOver4096,
    AdamwStepI16,
    AdamwLrZeroSkipsMoments,
    EmbeddingIndexNarrowedToI32,
    CrossEntropyBackwardTargetNarrowedToI32,
    ArgmaxAllNegInfRow,
    AttentionCausalTopLeft,
    AttentionGqaHeadsInterleaved,
    SoftmaxRunningMaxFromZero,
    RmsNormDropsVectorTail,
    LinearNoInnerDimSkipsWrite,
    NegOutputInnerStrideFlipped,
    EmbeddingHalfPairStorePastEnd,
    SiluBackwardFarTailNan,
    AdamwEpsilonHat,
    CastNanPayloadToInfinity,
    CopyI64ThroughDouble,
    SoftmaxSharedScratch,
    SoftmaxRowsOneStride,
    AddAlphaZeroSkipsB,
    MaxStopsAtInfinity,
    SumSquaresScaledByMax,
    RmsNormZeroWidthSkipsStats,
    AttentionScaleZeroAsUnset,
    EmbeddingCheckFirstBlock,
    MulNullStridesRefused,
    SumNullDataRefused,
    ReluBackwardNanInputZero,
    SoftmaxRowOfOneAsOne,
    SumUnitDimAsCopy,
    MaxNanFirstBlockOnly,
    LayerNormRowOfOneAsBias,
    MaxIntoUninitialisedOutput,
    MatmulGemvNReadsAPacked,
    AttentionNanRowAsMasked,
    SoftmaxOnlineNegInfPrefix,
    MatmulHalfRoundsBeforeAlpha,
    CrossEntropyOddLastRowCounted,
    PowScalarHalfAsSqrt,
    SigmoidOverflowingExp,
    CopyQuietsSignallingNan,
    MemcpyD2dFromAllocationStart,
    ScaleLeavesFtzOn,
    RmsNormLeaksWorkspace,
    LayerNormLeavesSignalsBlocked,
    AdamwPinsCallingThread,
    SubSwapsColumnA,
    MatmulBatchedBetaFirstOnly,
    MatmulTransposeInferredWhenSquare,
    LinearBiasPerRowWhenSquare,
    LayerNormBackwardGradBiasRowsWhenSquare,
    SinReducedInF32,
    SelectArithmeticBlend,
    MaskedFillValueThroughF32,
    EqBySubtraction,
    ConvertIntegerWraps,
    ConvertNarrowingSaturates,
    ArangeAccumulates,
    AddIntSaturates,
    SinZeroPositive,
    SelectScalarBThroughDouble,
    LtScalarAsF32,
    SelectScalarCondRepeats,
    MaskedFillMaskPerRowWhenSquare,
    ConvertIntBf16ThroughF32,
    ConvertF16OverflowAtMax,
    ArangeFused,
    ArangeI64InIntegers,
    GatherWrapsNegativeIndex,
    ScatterAddRoundsPerUpdate,
    CumsumAccumulatesInDtype,
    AnyChecksFirst1024,
    AllNanAsZero,
    BitwiseAndThroughF64,
    BitwiseOrBoolAsSum,
    BitwiseXorLow32Bits,
    CumsumStartsNegativeZero,
    AnyTestsLowByte,
    ScatterAddIntSaturates,
    ScatterAddIntThroughF64,
    GatherIndexSelectDim0Only,
    CumsumFirst65535Lines,
    LayerNormOnePassVariance,
    LogSoftmaxOfSoftmax,
    PowViaExpLog,
    SoftmaxFirst65535Rows,
    SumFirst65535Outputs,
    StreamWaitEventIgnored,
    EventRecordCompletesAtOnce,
    EventSynchronizeReturnsAtOnce,
    StreamSynchronizeReturnsAtOnce,
    AddIgnoresStream,
}

/// A catalog entry.
#[derive(Debug, Clone, Copy)]
pub struct Mutant {
    /// The bug.
    pub bug: Bug,
    /// Its `POLYCHIP_PLANTED_BUG` name.
    pub name: &'static str,
    /// The one operator it mutates (op-table name).
    pub op: &'static str,
    /// Its family.
    pub kind: Kind,
    /// The real-world bug it imitates.
    pub imitates: &'static str,
    /// The conformance check that catches it.
    pub caught_by: &'static str,
}

macro_rules! catalog {
    ($($bug:ident $name:literal $op:literal $kind:ident: $imitates:literal => $check:literal;)*) => {
        /// Every planted bug, one line each.
        pub const CATALOG: &[Mutant] = &[$(Mutant {
            bug: Bug::$bug,
            name: $name,
            op: $op,
            kind: Kind::$kind,
            imitates: $imitates,
            caught_by: $check,
        }),*];
    };
}

catalog! {
    SubIgnoresByteOffset "sub-ignores-byte-offset" "sub" Contract:
        "a kernel reads `a` from `data` without adding `byte_offset` (a slice view of a buffer)"
        => "layouts with a byte offset";
    DivZeroStrideAsCompact "div-zero-stride-as-compact" "div" Layout:
        "a stride-0 (expanded) operand is treated as compact, so reads run past its data"
        => "layouts with zero strides";
    TanhNegativeStrideAbs "tanh-negative-stride-abs" "tanh" Layout:
        "negative strides (a flipped view) are used as their absolute value"
        => "layouts with negative strides";
    ReluOutputAssumedCompact "relu-output-assumed-compact" "relu" Layout:
        "the output is written as if compact, ignoring its strides"
        => "strided (gapped) outputs and guard checks of the gaps";
    RmsNormIgnoresRowStride "rms-norm-ignores-row-stride" "rms_norm" Layout:
        "rows whose last dimension is contiguous are assumed packed (row stride ignored)"
        => "row-slice layouts (last dim contiguous, padded rows)";
    MatmulTransposedBAsCompact "matmul-transposed-b-as-compact" "matmul" Layout:
        "a transposed `b` operand is read as if row-major (only `b`, only when transposed)"
        => "transposed `b` operands";
    SoftmaxInPlaceSecondPass "softmax-in-place-second-pass" "softmax" Aliasing:
        "softmax's normalising pass re-reads x[i] after out[i] overwrote it (breaks in place)"
        => "in-place (aliased) calls";
    SwigluBackwardInPlaceReread "swiglu-backward-in-place-reread" "swiglu_backward" Aliasing:
        "grad_up is computed from `gate` after grad_gate overwrote it (breaks when grad_gate aliases gate)"
        => "in-place (aliased) calls";
    AddWritesOnePastEnd "add-writes-one-past-end" "add" OutOfBounds:
        "a vector tail store writes one element past the end of the output"
        => "guard zones around outputs";
    NegZeroesElementBefore "neg-zeroes-element-before" "neg" OutOfBounds:
        "an off-by-one start index clears the element just before the output"
        => "guard zones around outputs";
    GeluBackwardWritesGaps "gelu-backward-writes-gaps" "gelu_backward" OutOfBounds:
        "a wide store fills the gaps of a strided output with zeros"
        => "guard checks of a strided output's gaps";
    LogSoftmaxWideRowDropsTile "log-softmax-wide-row-drops-tile" "log_softmax" Size:
        "the path for rows wider than 65536 (vocabulary rows) drops the last tile from the log-sum-exp"
        => "realistic sizes: 152K-wide rows";
    EmbeddingU16Index "embedding-u16-index" "embedding" Size:
        "indices are narrowed to u16, so rows past 65535 of a large vocabulary alias low rows"
        => "realistic sizes: vocabularies over 65536 rows";
    SumSquaresHalfAccumulation "sum-squares-half-accumulation" "sum_squares" Size:
        "f16/bf16 inputs longer than 4096 elements are accumulated in the input dtype"
        => "realistic sizes (millions of elements) and tight tolerances";
    LinearTileEdge "linear-tile-edge" "linear" Size:
        "the last partial 64-wide column tile is not written back when out_features > 256 and not a multiple of 64"
        => "realistic sizes: matmul dimensions > 256 not multiples of 64";
    CrossEntropyWideNoMaxShift "cross-entropy-wide-no-max-shift" "cross_entropy" Size:
        "the wide-row (> 65536 classes) path computes log-sum-exp without subtracting the row maximum"
        => "realistic sizes: 152K-wide rows with large logits";
    SiluTruncatesHalf "silu-truncates-half" "silu" Numerics:
        "bf16/f16 results are truncated instead of rounded to nearest even"
        => "rounding-bias test (mean ulp)";
    GeluErfForm "gelu-erf-form" "gelu" Numerics:
        "gelu uses the erf form where the ABI specifies the tanh form"
        => "f32 tolerance";
    SwigluLowPrecisionSigmoid "swiglu-low-precision-sigmoid" "swiglu" Numerics:
        "silu(gate) is x * sigmoid(x) with a sigmoid of f16 precision"
        => "f32 tolerance";
    ExpFastApprox "exp-fast-approx" "exp" Numerics:
        "exp via a fast 2^x approximation with ~1e-3 relative error"
        => "f32 tolerance";
    LogSoftmaxBackwardHalfAccumulation "log-softmax-backward-half-accumulation" "log_softmax_backward" Numerics:
        "the row sum of grad_out is accumulated in the output dtype (bf16/f16)"
        => "long rows (4096+) in bf16/f16 with tolerances from error analysis";
    RmsNormEpsOutsideSqrt "rms-norm-eps-outside-sqrt" "rms_norm" Numerics:
        "rms_norm divides by sqrt(mean(x^2)) + eps instead of sqrt(mean(x^2) + eps)"
        => "f32 tolerance";
    LayerNormUnbiasedVariance "layer-norm-unbiased-variance" "layer_norm" Numerics:
        "layer_norm uses the unbiased variance (divides by n - 1) instead of the biased one"
        => "f32 tolerance";
    AdamwNoBiasCorrection "adamw-no-bias-correction" "adamw" Numerics:
        "AdamW without bias correction of the moments"
        => "in-place outputs vs the reference";
    AdamwIgnoresWeightDecay "adamw-ignores-weight-decay" "adamw" Numerics:
        "AdamW with the weight decay dropped (plain Adam)"
        => "in-place outputs vs the reference";
    AdamwSkipsBf16 "adamw-skips-bf16" "adamw" Numerics:
        "AdamW silently skips the step for bf16 parameters"
        => "bf16 cases of in-place outputs";
    CastBf16TiesAway "cast-bf16-ties-away" "cast" Rounding:
        "f32 -> bf16 rounds ties away from zero instead of to even"
        => "rounding ties in cast";
    CastF64Bf16DoubleRounding "cast-f64-bf16-double-rounding" "cast" Rounding:
        "f64 -> bf16 goes through f32 and so rounds twice"
        => "rounding ties in cast from f64 (double-rounding values)";
    MaxIgnoresNan "max-ignores-nan" "max" EdgeValues:
        "max uses a comparison that drops NaN instead of propagating it"
        => "special values in reductions";
    ArgmaxLastTie "argmax-last-tie" "argmax" EdgeValues:
        "argmax returns the last of equal maxima instead of the first"
        => "ties in argmax";
    ReluBackwardAtZero "relu-backward-at-zero" "relu_backward" EdgeValues:
        "relu_backward passes the gradient at exactly x == 0 (x >= 0 instead of x > 0)"
        => "special values (x == 0 exactly) in activation backward";
    LogZeroNan "log-zero-nan" "log" EdgeValues:
        "log(0) gives NaN instead of -inf"
        => "special values";
    SqrtNegZero "sqrt-neg-zero" "sqrt" EdgeValues:
        "sqrt(-0.0) gives +0.0 instead of -0.0"
        => "signed-zero comparison of special values";
    PowScalarNanZeroExponent "pow-scalar-nan-zero-exponent" "pow_scalar" EdgeValues:
        "pow_scalar(NaN, 0) gives NaN instead of 1"
        => "special values with exponent 0";
    EmbeddingClampsIndex "embedding-clamps-index" "embedding" Contract:
        "an out-of-range index is clamped to the last row instead of refused"
        => "refusals";
    CrossEntropyRefusesInternal "cross-entropy-refuses-internal" "cross_entropy" Contract:
        "an out-of-range target is refused with POLYCHIP_ERROR_INTERNAL instead of INVALID_ARGUMENT"
        => "refusals checked for their error code";
    AdamwRefusalWrongCode "adamw-refusal-wrong-code" "adamw" Contract:
        "a raw entry rewrites the refusal of step 0 to POLYCHIP_ERROR_INTERNAL"
        => "none: the host refuses step 0 before the plugin is called, so this bug is unobservable";
    EmbeddingBackwardForeignError "embedding-backward-foreign-error" "embedding_backward" Contract:
        "a refusal returns a static error pointer the host never created"
        => "refusals checked for their error code (contract violations)";
    CrossEntropyBackwardStaleError "cross-entropy-backward-stale-error" "cross_entropy_backward" Contract:
        "a sticky last-error: the error object of a refusal is returned again by the next call"
        => "contract violations on the call after a refusal";
    RopeBackwardNoWrite "rope-backward-no-write" "rope_backward" Contract:
        "a raw entry returns success without launching the kernel"
        => "poisoned outputs (never wrote)";
    RsqrtHangsOnLargeTensors "rsqrt-hangs-on-large-tensors" "rsqrt" Liveness:
        "a kernel never returns on tensors of more than 65536 elements (a grid-stride loop whose 16-bit counter wraps before it reaches the end)"
        => "the per-case timeout of an isolated run (--case-timeout): the case fails as hung and the suite goes on";
    SumDropsVectorTail "sum-drops-vector-tail" "sum" Path:
        "a vectorised row reduction (8 lanes) over a contiguous last dimension drops the remainder when the extent is over 8 and not a multiple of 8"
        => "reductions over a contiguous last dimension whose extent is not a multiple of the vector width";
    MatmulGemvIgnoresTransposeB "matmul-gemv-ignores-transpose-b" "matmul" Path:
        "the GEMV path taken for M = 1 (decoding) reads a packed b as [K, N] whatever transpose_b says"
        => "matmul with M = 1 and a transposed b (a decoding step against a weight)";
    MatmulRank1IgnoresBeta "matmul-rank1-ignores-beta" "matmul" Path:
        "the rank-1 (outer product) path taken for K = 1 overwrites out instead of adding beta * out"
        => "matmul with K = 1, M and N > 1 and beta != 0";
    LinearRowTileEdge "linear-row-tile-edge" "linear" Size:
        "the last partial 128-row tile is not written back when there are more than 128 rows (tokens) and not a multiple of 128"
        => "realistic sizes: a token count over 128 that is not a multiple of 128";
    MulColumnBroadcastAsRow "mul-column-broadcast-as-row" "mul" Layout:
        "the bias-row fast path is chosen when b has as many elements as out has columns, so a broadcast column ([N, 1] against [N, N]) is read as a row"
        => "a broadcast column with as many elements as the output has columns";
    SiluBackwardGradOutAsCompact "silu-backward-grad-out-as-compact" "silu_backward" Layout:
        "the incoming gradient is read as if compact, ignoring its strides (as gradients usually are compact)"
        => "layouts derived for every input (zero and negative strides on grad_out)";
    ScaleAlphaZeroMemset "scale-alpha-zero-memset" "scale" EdgeValues:
        "scale by 0 is a memset to +0 (as optimised BLAS scal does), so NaN and infinities vanish and -0 loses its sign"
        => "special values scaled by alpha 0";
    ExpFlushesSubnormals "exp-flushes-subnormals" "exp" EdgeValues:
        "exp flushes results in the f32 subnormal range (below 2^-126) to zero (flush-to-zero / fast math)"
        => "exp of inputs whose results are subnormal";
    NegAsZeroMinus "neg-as-zero-minus" "neg" EdgeValues:
        "neg is computed as 0 - x, so neg(+0) is +0 instead of -0"
        => "signed-zero comparison of special values";
    CastF16Saturates "cast-f16-saturates" "cast" EdgeValues:
        "conversions to f16 saturate at ±65504 (a satfinite conversion) where the ABI says overflow gives ±inf"
        => "special values and the overflow tie in cast";
    CrossEntropyMeanOverAllRows "cross-entropy-mean-over-all-rows" "cross_entropy" Numerics:
        "the mean divides by every row, ignored ones included (and is 0, not NaN, when all are ignored)"
        => "rows with ignore_index";
    EmbeddingBackwardRacyDuplicates "embedding-backward-racy-duplicates" "embedding_backward" Numerics:
        "a scatter-add without atomics: every occurrence of an index reads the old row, so of repeated indices only the last update lands"
        => "repeated indices in embedding_backward";
    LinearWeightCacheByAddress "linear-weight-cache-by-address" "linear" State:
        "a pre-packed weight cache keyed by the weight's address, shape and strides: a new weight allocated where an old one was is served stale"
        => "the same call repeated with new input values in the same buffers";
    LayerNormInputRowsAssumedPacked "layer-norm-input-rows-assumed-packed" "layer_norm" Layout:
        "contiguous input rows with padding between them (a slice of a fused projection) are read as packed: the row stride is ignored"
        => "row-slice layouts of inputs (last dim contiguous, padded rows)";
    GeluBackwardGradOutGapsAsCompact "gelu-backward-grad-out-gaps-as-compact" "gelu_backward" Layout:
        "the 1-D fast path taken when an operand's dimensions collapse into one (a gapped view, stride 2) assumes that one stride is 1: a gapped grad_out is read as compact"
        => "layouts derived for every input: gaps between elements (stride 2)";
    SiluF16FlushesSubnormals "silu-f16-flushes-subnormals" "silu" EdgeValues:
        "the f32-to-f16 store flushes results in the f16 subnormal range (below 2^-14) to zero (a hand-rolled conversion without denormals)"
        => "large negative inputs: results in the subnormal range";
    SiluBackwardNegativeCutoff "silu-backward-negative-cutoff" "silu_backward" Path:
        "an early-out for the saturated tail returns a zero gradient for x < -16, where the exact one is g e^x (1 + x), tiny but not 0"
        => "large negative inputs: results in the subnormal range";
    AttentionBackwardKeyTileEdge "attention-backward-key-tile-edge" "attention_backward" Size:
        "the last partial 128-key tile of grad_k and grad_v is never written back when seq_kv is over 128 and not a multiple of 128"
        => "realistic sizes: attention backward at a head dim of 128 and 300 tokens";
    RopeBackwardHeadDim64Pairs "rope-backward-head-dim-64-pairs" "rope_backward" Size:
        "a half-split kernel written for head_dim 64 rotates each 64-wide chunk of a wider head on its own, pairing x[j] with x[j + 32] instead of x[j + D/2]"
        => "realistic sizes: rope at a head dim of 128";
    RmsNormBackwardRowOver4096 "rms-norm-backward-row-over-4096" "rms_norm_backward" Size:
        "the row's dot product sum(g w x) of grad_input stops after 4096 elements (one block per row, no loop over the rest of a wider row)"
        => "realistic sizes: norm backwards over 8192-wide rows";
    AdamwStepI16 "adamw-step-i16" "adamw" Size:
        "the step is packed into a signed 16-bit field of the kernel's parameters: from step 32768 it wraps negative and the bias correction 1 - beta^step goes negative (NaN)"
        => "AdamW at step 100000";
    AdamwLrZeroSkipsMoments "adamw-lr-zero-skips-moments" "adamw" Path:
        "a learning rate of 0 (the first step of a warm-up schedule) returns early, so the moments are not updated"
        => "AdamW with lr 0 (the moments still update)";
    EmbeddingIndexNarrowedToI32 "embedding-index-narrowed-to-i32" "embedding" Contract:
        "i64 indices are narrowed to i32 before the range check, so 2^32 + k passes it and reads row k"
        => "refusals of indices at the integer dtype's extremes";
    CrossEntropyBackwardTargetNarrowedToI32 "cross-entropy-backward-target-narrowed-to-i32" "cross_entropy_backward" Contract:
        "i64 targets are narrowed to i32 before the range check, so 2^32 + k is taken as class k (and 2^32 - 100 as ignored)"
        => "refusals of targets at the integer dtype's extremes";
    AttentionCausalTopLeft "attention-causal-top-left" "attention" Path:
        "the causal mask is aligned at the top left (query i sees keys j <= i, PyTorch's is_causal) where the ABI aligns it at the bottom right: with fewer queries than keys (decoding with a KV cache) each query misses the newest keys"
        => "causal attention with fewer queries than keys (decoding)";
    AttentionGqaHeadsInterleaved "attention-gqa-heads-interleaved" "attention" Path:
        "with grouped-query attention, query head h reads key/value head h % heads_kv instead of h / (heads_q / heads_kv)"
        => "grouped-query attention with several query heads per key/value head";
    ArgmaxAllNegInfRow "argmax-all-neg-inf-row" "argmax" EdgeValues:
        "argmax starts from index -1 and a running maximum of -inf, updated on a strict >: a row whose every element is -inf (a fully masked row) gives -1"
        => "rows of -inf and of the lowest finite value";
    SoftmaxRunningMaxFromZero "softmax-running-max-from-zero" "softmax" EdgeValues:
        "the running row maximum starts at 0 instead of -inf: a row whose logits are all far below 0 underflows every exponential and gives 0/0"
        => "large negative logits";
    RmsNormDropsVectorTail "rms-norm-drops-vector-tail" "rms_norm" Size:
        "the sum of squares runs 4 lanes wide and drops the remainder of a row whose width is not a multiple of 4"
        => "rows of an odd width";
    LinearNoInnerDimSkipsWrite "linear-no-inner-dim-skips-write" "linear" EdgeValues:
        "with no input features (K = 0) the kernel returns early, leaving the output unwritten instead of the bias (or zeros)"
        => "linear with K = 0";
    NegOutputInnerStrideFlipped "neg-output-inner-stride-flipped" "neg" Layout:
        "an output whose last dimension runs backwards (negative inner stride) is written forwards from the row's lowest address: each row comes out reversed"
        => "outputs reversed along their last dimension";
    EmbeddingHalfPairStorePastEnd "embedding-half-pair-store-past-end" "embedding" OutOfBounds:
        "16-bit rows are stored two elements at a time: with an odd number of elements the last pair store writes one element past the end"
        => "odd output sizes and the guard after the output";
    SiluBackwardFarTailNan "silu-backward-far-tail-nan" "silu_backward" EdgeValues:
        "the derivative is computed as 1/(1+e) + x e/(1+e)^2 with e = exp(-x): below x = -709 e overflows and the result is NaN instead of 0"
        => "inputs from -110 to the lowest finite value";
    AdamwEpsilonHat "adamw-epsilon-hat" "adamw" Path:
        "the bias correction is folded into the step size (Adam's paper's epsilon-hat form, as TF/Keras): eps is added to sqrt(v) instead of sqrt(v / (1 - beta2^t))"
        => "gradients about eps in the first steps";
    CastNanPayloadToInfinity "cast-nan-payload-to-infinity" "cast" EdgeValues:
        "f64 is narrowed to 16 bits by shifting the mantissa without setting the quiet bit: a NaN whose payload lies in the low bits becomes infinity"
        => "NaNs with low payload bits";
    CopyI64ThroughDouble "copy-i64-through-double" "copy" Numerics:
        "one element-wise copy loop for every dtype, through a double: an i64 beyond 2^53 is rounded to a double's precision (2^53 + 1 comes back as 2^53)"
        => "i64 copies of values a double cannot hold, compared bit for bit";
    SoftmaxSharedScratch "softmax-shared-scratch" "softmax" Concurrency:
        "each row's exponentials go through one process-wide scratch buffer, without a lock (a static workspace, as a library's cached handle or buffer is): two threads' calls at once read each other's rows"
        => "the call made from several threads at once";
    SoftmaxRowsOneStride "softmax-rows-one-stride" "softmax" Layout:
        "a view of three or more dims is walked as [rows, C] with one row stride, the second-to-last dim's: a permuted view (scores [b, h, s, k] of a [b, s, h, k] tensor) is read in the wrong order (mutation round 8, a shared copy routine of a C plugin)"
        => "permuted inputs (dims 0 and 1 swapped in memory)";
    // Mutation round 9 (2026-12-05): one per class the round found missed.
    AddAlphaZeroSkipsB "add-alpha-zero-skips-b" "add" Path:
        "add with alpha 0 copies `a` and never reads `b` (BLAS axpy's early return), so an infinite or NaN `b` does not make the result NaN"
        => "special values at alpha 0";
    MaxStopsAtInfinity "max-stops-at-infinity" "max" EdgeValues:
        "max stops scanning a lane at the first +inf, as nothing can beat it, and misses a NaN after it"
        => "+inf before NaN in rows and columns";
    SumSquaresScaledByMax "sum-squares-scaled-by-max" "sum_squares" EdgeValues:
        "the sum of squares is scaled by the largest |x| to avoid overflow (LAPACK's nrm2): an infinity gives inf / inf = NaN where the norm is +inf"
        => "sum_squares of an infinity";
    RmsNormZeroWidthSkipsStats "rms-norm-zero-width-skips-stats" "rms_norm" EdgeValues:
        "rms_norm returns early when the weight is empty (H = 0), leaving inv_rms unwritten where the mean of nothing makes it NaN"
        => "rows of no elements ([3, 0])";
    AttentionScaleZeroAsUnset "attention-scale-zero-as-unset" "attention" Path:
        "a scale of 0 is taken for \"unset\" (PyTorch's scale=None) and replaced by 1/sqrt(head_dim)"
        => "attention with scale 0";
    EmbeddingCheckFirstBlock "embedding-check-first-block" "embedding" Contract:
        "the device-side range check of the indices covers one work-group's first 256 ids: a bad id past them is not refused, and its row is written as zeros"
        => "an index out of range after 1100 in range";
    MulNullStridesRefused "mul-null-strides-refused" "mul" Contract:
        "a raw entry that needs explicit strides refuses a tensor whose strides are NULL, which the ABI (as DLPack) defines as compact row-major"
        => "NULL strides for compact tensors";
    SumNullDataRefused "sum-null-data-refused" "sum" Contract:
        "a raw entry refuses an empty tensor whose data is NULL (a zero-byte allocation may be NULL) before seeing that it has no elements"
        => "NULL data for empty tensors";
    ReluBackwardNanInputZero "relu-backward-nan-input-zero" "relu_backward" EdgeValues:
        "relu_backward written as `x > 0 ? g : 0`: a NaN input gives 0 where the ABI's select (`x <= 0 ? 0 : g`, PyTorch's threshold_backward) passes the gradient"
        => "special values in relu_backward";
    // Mutation round 10: one per class the round found missed.
    SoftmaxRowOfOneAsOne "softmax-row-of-one-as-one" "softmax" Path:
        "softmax over a last dimension of 1 writes 1 without reading the logits: a NaN or infinite logit gives 1 where exp(inf - inf) is NaN"
        => "rows of one logit";
    SumUnitDimAsCopy "sum-unit-dim-as-copy" "sum" Path:
        "a sum over a dimension of extent 1 taken for a copy of the input in memory order: a transposed or strided input comes out permuted"
        => "a reduction over an extent-1 dim of a transposed input";
    MaxNanFirstBlockOnly "max-nan-first-block-only" "max" EdgeValues:
        "max combines the maxima of a lane's blocks of 64 (or of a work-group's items) with a plain comparison: a NaN outside the first block is dropped"
        => "a NaN past the first 512 of a row of 600";
    LayerNormRowOfOneAsBias "layer-norm-row-of-one-as-bias" "layer_norm" Path:
        "layer_norm over rows of one element writes the bias (x - mean taken as 0): NaN and infinite inputs give the bias where inf - inf is NaN"
        => "rows of one element holding NaN and infinities";
    MaxIntoUninitialisedOutput "max-into-uninitialised-output" "max" State:
        "max takes fmax of each element and the output, which it never initialised (an atomic-max kernel that counts on a memset): the NaN poison is ignored by fmax, a number left there wins"
        => "outputs holding a large finite value before the call";
    MatmulGemvNReadsAPacked "matmul-gemv-n-reads-a-packed" "matmul" Path:
        "a matrix-vector product (N = 1) reads `a` as packed rows of op(a), ignoring its strides and transpose_a"
        => "N = 1 with a transposed a";
    AttentionNanRowAsMasked "attention-nan-row-as-masked" "attention" EdgeValues:
        "the running row maximum is taken with fmax, which drops NaN: a row whose scores hold NaN (or +inf, whose inf - inf is NaN) is taken for one that saw no key and written as zeros with lse = -inf, hiding a diverged run"
        => "NaN in q or k and +inf scores";
    // Mutation round 11: one per class the round found missed.
    SoftmaxOnlineNegInfPrefix "softmax-online-neg-inf-prefix" "softmax" EdgeValues:
        "an online softmax (a running maximum started at the first logit, the sum rescaled by exp(old max - new max)) with no guard for a maximum still at -inf: a row led by two -inf logits computes exp(-inf - -inf), NaN"
        => "rows led by -inf logits";
    MatmulHalfRoundsBeforeAlpha "matmul-half-rounds-before-alpha" "matmul" Numerics:
        "the f16 epilogue rounds the f32 accumulator to f16 and applies alpha after (a half-precision C tile): a sum past 65504 is infinite even where alpha brings the result back into range"
        => "sums past 65504 scaled back by alpha";
    CrossEntropyOddLastRowCounted "cross-entropy-odd-last-row-counted" "cross_entropy" Path:
        "rows are taken in pairs and an odd last row on a scalar path without the ignore test: an ignored last row is counted in the mean's denominator"
        => "an odd number of rows whose last is ignored";
    // Mutation round 12: one per class the round found missed.
    PowScalarHalfAsSqrt "pow-scalar-half-as-sqrt" "pow_scalar" EdgeValues:
        "exponent 0.5 special-cased as sqrt (as exponent 2 as x * x): C's pow(-0, 0.5) is +0 and pow(-inf, 0.5) +inf, where sqrt gives -0 and NaN"
        => "special values at the exponents kernels special-case";
    SigmoidOverflowingExp "sigmoid-overflowing-exp" "sigmoid" EdgeValues:
        "sigmoid as 1 / (1 + exp(-x)) in f32: below x = -88.7 exp(-x) overflows and the result is 0 where the ABI wants e^x, a subnormal f32 down to -103"
        => "sigmoid results in the subnormal range";
    CopyQuietsSignallingNan "copy-quiets-signalling-nan" "copy" Numerics:
        "floats are copied element by element through a double (one conversion loop for every dtype): a signalling NaN comes back quiet, its payload shifted"
        => "NaN bit patterns copied bit for bit";
    MemcpyD2dFromAllocationStart "memcpy-d2d-from-allocation-start" "copy" Contract:
        "memcpy_d2d resolves its source to the allocation that holds it and copies from that allocation's start (a runtime addressed by buffer handle and offset, the offset dropped): a view inside a buffer is copied from the buffer's first byte"
        => "a copy staged by memcpy_d2d from inside its buffer";
    // ABI 1.3: one per new operator family.
    SinReducedInF32 "sin-reduced-in-f32" "sin" Numerics:
        "sin reduces its argument in f32 (x - round(x / 2pi) 2pi, each step rounded to f32) before a short polynomial: right to a few ULPs for |x| below 10, off by up to |x| u(f32) beyond, where a rotary table's 1e5 rad lives"
        => "large arguments up to 1e5";
    SelectArithmeticBlend "select-arithmetic-blend" "select" EdgeValues:
        "select computed as cond * a + (1 - cond) * b in floating point (a branch-free blend): a NaN or infinity in the branch not taken leaks into the result as NaN, and -0 picked from a becomes +0"
        => "NaN and infinities in the branch not taken";
    MaskedFillValueThroughF32 "masked-fill-value-through-f32" "masked_fill" Rounding:
        "the fill value is passed through an f32 kernel argument before its conversion to the dtype: a value on a bf16 or f16 tie after f32 rounding is rounded twice, and i32/i64 values past 2^24 lose their low bits"
        => "fill values at rounding ties and past 2^24";
    EqBySubtraction "eq-by-subtraction" "eq" EdgeValues:
        "eq computed as (a - b) == 0 in f64: an infinity compared with itself gives inf - inf = NaN, not equal, and i64s past 2^53 that differ by one compare equal"
        => "special values against themselves";
    ConvertIntegerWraps "convert-integer-wraps" "convert" EdgeValues:
        "floats convert to integers through a C cast to a wider integer and a truncation (x as i64 as i32, x as i64 as u8): out-of-range values and infinities wrap around instead of saturating"
        => "values past the integer range";
    ConvertNarrowingSaturates "convert-narrowing-saturates" "convert" EdgeValues:
        "an integer converts to a narrower integer with saturation (a clamp before the cast, or OpenCL's convert_int_sat) where the ABI and PyTorch keep the low bits: i64 2^40 to i32 gives 2147483647 instead of 0, i32 -1 to u8 0 instead of 255"
        => "integer range ends narrowed";
    ArangeAccumulates "arange-accumulates" "arange" Numerics:
        "arange as a running sum (out[i] = out[i - 1] + step) in the output's dtype: each step rounds, and the error grows with i (0.1 added 1000 times in f32 is 100.00099)"
        => "long ranges with a step that is not a power of two";
    AddIntSaturates "add-int-saturates" "add" EdgeValues:
        "integer add saturates at the ends of the range (a SIMD saturating add, as for u8 pixels) where the ABI and PyTorch wrap in two's complement"
        => "integer sums past the ends of the range";
    // ABI 1.4: one per new operator.
    GatherWrapsNegativeIndex "gather-wraps-negative-index" "gather" EdgeValues:
        "gather takes an index in [-n, 0) from the end (Python's and NumPy's rule) where the ABI and PyTorch refuse it: a wrong index reads a real element instead of failing"
        => "a negative index refused";
    ScatterAddRoundsPerUpdate "scatter-add-rounds-per-update" "scatter_add" Rounding:
        "scatter_add adds f16 and bf16 updates one at a time in the dtype (a half-precision atomic add): each partial sum rounds, and many small updates to one element vanish"
        => "eight half-ULP updates into one element";
    CumsumAccumulatesInDtype "cumsum-accumulates-in-dtype" "cumsum" Numerics:
        "cumsum keeps the running sum in the tensor's dtype (out[k] = out[k-1] + x[k]): in f16 and bf16 a long row of small terms stops growing once the sum's half-ULP exceeds a term"
        => "a long row of small positive terms";
    AnyChecksFirst1024 "any-checks-first-1024" "any" Path:
        "any looks at the first 1,024 elements of each row only (one work-group's reduction without the loop over the rest)"
        => "the deciding element last in a row of 1,101";
    AllNanAsZero "all-nan-as-zero" "all" EdgeValues:
        "all tests x > 0 || x < 0 for nonzero, under which NaN counts as zero (false) where a conversion to bool gives true"
        => "every pair of special values";
    BitwiseAndThroughF64 "bitwise-and-through-f64" "bitwise_and" EdgeValues:
        "bitwise_and of i64 goes through double (a kernel written for floating dtypes): the bits below the 53rd of large values are lost"
        => "every pair of the dtype's extremes (i64)";
    BitwiseOrBoolAsSum "bitwise-or-bool-as-sum" "bitwise_or" EdgeValues:
        "bitwise_or of bools adds the bytes (logical or done as arithmetic): true | true stores 2, which is not a bool"
        => "bool operands";
    BitwiseXorLow32Bits "bitwise-xor-low-32-bits" "bitwise_xor" EdgeValues:
        "bitwise_xor of i64 by the 32-bit kernel: the low halves, sign-extended; the high bits are lost"
        => "every pair of the dtype's extremes (i64)";
    // Mutation round 15: a running sum from -0, a nonzero test on the low
    // byte, integer updates saturating or through double, an index_select
    // fast path written for dim 0.
    CumsumStartsNegativeZero "cumsum-starts-negative-zero" "cumsum" EdgeValues:
        "cumsum starts its running sum from -0 (IEEE's additive identity, so that x + acc is x for every x) where the ABI and PyTorch start from +0: a row that starts with -0 keeps -0 in its first outputs"
        => "rows starting with -0";
    AnyTestsLowByte "any-tests-low-byte" "any" EdgeValues:
        "any of i32 and i64 tests each element's first byte (the bool kernel run on every dtype): 256, 2^24, the sign bit and 2^32 count as zero"
        => "nonzero values whose low byte is 0";
    ScatterAddIntSaturates "scatter-add-int-saturates" "scatter_add" EdgeValues:
        "integer scatter_add saturates each update at the dtype's range (a saturating atomic) where the ABI and PyTorch wrap: partial sums that leave the range and come back end at the limit"
        => "partial sums past the ends of the range wrap";
    ScatterAddIntThroughF64 "scatter-add-int-through-f64" "scatter_add" EdgeValues:
        "integer scatter_add adds each update in double (one accumulation path for every dtype): i64 updates past 2^53 lose their low bits"
        => "partial sums past the ends of the range wrap (i64 updates past 2^53)";
    GatherIndexSelectDim0Only "gather-index-select-dim0-only" "gather" Path:
        "gather with an index that has a zero stride on every dimension but dim (PyTorch's index_select) takes a row-copy fast path written for dim 0: along dim 1 it copies whole rows by the first index of each row"
        => "an index_select along columns (zero-stride index, dim 1)";
    // Mutation round 16: lines past a GPU grid's second dimension (65,535
    // blocks) never reached.
    CumsumFirst65535Lines "cumsum-first-65535-lines" "cumsum" Size:
        "cumsum launches one block row per line in a grid's second dimension, which holds 65,535 (PaddlePaddle/Paddle#43722): the lines past it are never computed, and their outputs keep whatever they held"
        => "more lines than 65,535";
    SoftmaxFirst65535Rows "softmax-first-65535-rows" "softmax" Size:
        "softmax launches one block per row in a grid's second dimension (65,535 at most): the rows past it are never written"
        => "more rows than 65,535";
    SumFirst65535Outputs "sum-first-65535-outputs" "sum" Size:
        "sum launches one block per output in a grid's second dimension (65,535 at most): the outputs past it are never written"
        => "more outputs than 65,535";
    // Mutation round 17: formulas exact in real arithmetic, wrong in the
    // kernel's.
    LayerNormOnePassVariance "layer-norm-one-pass-variance" "layer_norm" Numerics:
        "layer_norm's variance from one pass of f32 sums, E[x^2] - E[x]^2, which cancels on rows whose mean is large beside their spread (activations with an offset)"
        => "rows far from zero mean";
    LogSoftmaxOfSoftmax "log-softmax-of-softmax" "log_softmax" Numerics:
        "log_softmax as the log of a softmax in f32: a term more than about 104 below the row's maximum underflows to 0 and its log to -inf"
        => "rows spread wider than f32's exp range";
    PowViaExpLog "pow-via-exp-log" "pow_scalar" EdgeValues:
        "pow_scalar as exp(e ln x): NaN for every negative base, the squares and cubes of negative numbers among them"
        => "negative bases with integral exponents";
    // Stop 44: what a call leaves behind on its thread and in the process.
    ScaleLeavesFtzOn "scale-leaves-ftz-on" "scale" State:
        "scale turns on flush-to-zero and denormals-are-zero for speed and returns without restoring them: every later floating-point operation of the calling thread flushes subnormals (ABI rule 12)"
        => "the calling thread's floating-point environment after the call";
    RmsNormLeaksWorkspace "rms-norm-leaks-workspace" "rms_norm" State:
        "rms_norm allocates a workspace per call (a copy of the input in f64) and never frees it: right on every call, out of memory after enough steps"
        => "the same call made again and again on one upload";
    // Stop 45: the process state a call leaves behind (ABI rule 13).
    LayerNormLeavesSignalsBlocked "layer-norm-leaves-signals-blocked" "layer_norm" State:
        "layer_norm blocks SIGINT and SIGTERM around its parallel section, so that no signal interrupts a worker mid-row, and returns without unblocking them: Ctrl-C and a launcher's stop no longer reach the calling thread (ABI rule 13)"
        => "the calling thread's signal mask after the case";
    AdamwPinsCallingThread "adamw-pins-calling-thread" "adamw" State:
        "adamw runs on a thread pool bound the OpenMP way (OMP_PROC_BIND=true): the calling thread, the pool's master, is bound to the first CPU of its set and never unbound, so every later computation of that thread, the framework's and other plugins' included, runs on one core (ABI rule 13)"
        => "the calling thread's CPU affinity after the case";
    // Mutation round 13: shapes with two readings (a broadcast `a`, a batch
    // of accumulating products, square operands).
    SubSwapsColumnA "sub-swaps-column-a" "sub" Path:
        "sub serves an `a` broadcast along its last dim (a column against a full `b`) by swapping the operands so that the broadcast one is second, as its column fast path wants, and forgets that sub does not commute: b - alpha a"
        => "a [5, 1] broadcast against b [5, 6]";
    MatmulBatchedBetaFirstOnly "matmul-batched-beta-first-only" "matmul" Path:
        "a batched matmul applies beta once per call, to the first matrix of the batch, and accumulates into the others with beta 1 (a pre-pass that scales `out` written for one matrix)"
        => "every batch accumulating";
    MatmulTransposeInferredWhenSquare "matmul-transpose-inferred-when-square" "matmul" Path:
        "a matmul wrapper infers whether an operand needs transposing from its shape (already [M, K] or [K, N]) instead of reading the flag, so a square operand marked transposed is used as it is"
        => "square operands transposed";
    LinearBiasPerRowWhenSquare "linear-bias-per-row-when-square" "linear" Path:
        "linear picks the bias's axis by matching its length against the output's extents, and takes it for a per-row (column) bias when the output has as many rows as features"
        => "as many rows as output features";
    LayerNormBackwardGradBiasRowsWhenSquare "layer-norm-backward-grad-bias-rows-when-square" "layer_norm_backward" Path:
        "layer_norm_backward finds the axis to sum grad_bias over by extent, and sums along each row instead of down each column when there are as many rows as features"
        => "as many rows as features";
    // Mutation round 14: the operators of ABI 1.3 (a zero's sign, a 0-d
    // operand a narrower kernel argument cannot hold, a 0-d cond, square
    // shapes, two roundings, arange's rounding and past 2^53).
    SinZeroPositive "sin-zero-positive" "sin" EdgeValues:
        "sin takes a fast path for zero inputs that writes +0 (a memset of the zero lanes): sin(-0) is +0 where IEEE, C and PyTorch give -0"
        => "±0 and arguments so small that sin(x) is x";
    SelectScalarBThroughDouble "select-scalar-b-through-double" "select" Numerics:
        "a 0-d b (torch.where(cond, x, scalar)) is passed to the kernel as a double and converted back for each element it fills: an i64 past 2^53 loses its low bits, a signalling NaN comes back quiet"
        => "a 0-d b holding bits a double cannot carry";
    LtScalarAsF32 "lt-scalar-as-f32" "lt" Numerics:
        "lt against a 0-d b (x < threshold) passes b as an f32 kernel argument: in f64 0.1 becomes 0.10000000149 and 0.1 < 0.1 is true, in i64 2^53 + 1 becomes 2^53"
        => "a 0-d b against its neighbours";
    SelectScalarCondRepeats "select-scalar-cond-repeats" "select" Path:
        "a 0-d cond takes a copy path that fills out with the chosen branch's elements in order, repeated, without broadcasting it to out's shape: a branch of [3, 1] against out [3, 4] comes out in the wrong places"
        => "cond 0-d true a [3, 1] b [1, 4]";
    MaskedFillMaskPerRowWhenSquare "masked-fill-mask-per-row-when-square" "masked_fill" Path:
        "masked_fill picks the axis of a 1-D mask by matching its length against the input's extents, and reads it per row when the input has as many rows as columns (NumPy aligns it with the last dim: per column)"
        => "a square input, the mask per column";
    ConvertIntBf16ThroughF32 "convert-int-bf16-through-f32" "convert" Rounding:
        "integers convert to bf16 through f32 (an int-to-float instruction, then the float-to-bf16 one): an integer one past a bf16 tie is rounded onto the tie by f32 and then to the even neighbour below"
        => "integers one past a bf16 tie";
    ConvertF16OverflowAtMax "convert-f16-overflow-at-max" "convert" EdgeValues:
        "floats convert to f16 with an overflow test against the largest f16 (|x| > 65504 gives infinity) instead of rounding first: 65505 to 65519 give infinity where they round to 65504"
        => "just past the largest f16";
    ArangeFused "arange-fused" "arange" Numerics:
        "arange computes start + i * step as one fused multiply-add (a compiler contracting it, or fma() for speed): one rounding where the ABI rounds the product and the sum, so f64 values differ in the last bit"
        => "the product rounded before the sum";
    ArangeI64InIntegers "arange-i64-in-integers" "arange" Numerics:
        "arange into i64 computes in integers when start and step are whole (the exact answer, it seems): past 2^53 the ABI's values are the f64 results, 2^53 + 1 is 2^53"
        => "past 2^53: the f64 values";
    // Streams: in full mode `copy` and `fill` run on their stream's worker
    // thread (`crate::streams`), the other operators on the calling thread
    // once their stream's earlier work is done. The first two show at every
    // operator's stream case, the next two where `copy`'s is awaited that
    // way, the last at `add`'s.
    StreamWaitEventIgnored "stream-wait-event-ignored" "copy" Stream:
        "stream_wait_event returns without queueing the wait: later work on the stream runs before the event's work"
        => "the stream case: the call's stream waits for another stream's work through an event";
    EventRecordCompletesAtOnce "event-record-completes-at-once" "copy" Stream:
        "event_record marks the event complete when recorded instead of when the stream reaches it"
        => "the stream case: the call's stream waits for another stream's work through an event";
    EventSynchronizeReturnsAtOnce "event-synchronize-returns-at-once" "copy" Stream:
        "event_synchronize returns without waiting for the event (the work before it is still running)"
        => "the stream case awaited by event_synchronize (copy in f32)";
    StreamSynchronizeReturnsAtOnce "stream-synchronize-returns-at-once" "copy" Stream:
        "stream_synchronize returns without waiting for the stream's work"
        => "the stream case awaited by stream_synchronize (copy in f64)";
    AddIgnoresStream "add-ignores-stream" "add" Stream:
        "add runs at once, as if on the default stream, without waiting for the work queued on the stream it is given"
        => "the stream case: the call's stream waits for another stream's work through an event";
}

/// A kernel that never returns ([`Bug::RsqrtHangsOnLargeTensors`]): the
/// calling thread waits for ever, as a device queue would on a kernel that
/// never finishes. For its first 60 s it prints a heartbeat on standard
/// output, as a vendor runtime's watchdog might log: the suite must neither
/// take that for a result nor let it put off the timeout.
pub fn hang() -> ! {
    for _ in 0..120 {
        println!("planted: still waiting for the rsqrt kernel");
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}

/// The plugin's mode, chosen once at init from `POLYCHIP_PLANTED_BUG`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Unset: the seven fixed bugs of the f32-only plugin.
    Legacy,
    /// `none`: every operator correct, in every dtype.
    Correct,
    /// A catalog name: every operator correct except this one's.
    Planted(Bug),
}

static MODE: OnceLock<Mode> = OnceLock::new();

/// The environment variable that selects the mode.
pub const ENV: &str = "POLYCHIP_PLANTED_BUG";

/// Reads the mode from the environment (once); an unknown name is an error
/// listing the known ones.
pub fn init_mode() -> Result<Mode, String> {
    if let Some(mode) = MODE.get() {
        return Ok(*mode);
    }
    let mode = match std::env::var(ENV) {
        Err(_) => Mode::Legacy,
        Ok(name) if name == "none" => Mode::Correct,
        Ok(name) => match CATALOG.iter().find(|m| m.name == name) {
            Some(m) => Mode::Planted(m.bug),
            None => {
                // One name a line: a host prints at most 1,000
                // characters of a line, and the catalog is longer.
                let names: Vec<&str> = CATALOG.iter().map(|m| m.name).collect();
                return Err(format!(
                    "planted: unknown {ENV}={name:?}; known (one a line):\nnone\n{}",
                    names.join("\n")
                ));
            }
        },
    };
    Ok(*MODE.get_or_init(|| mode))
}

/// The mode (Legacy before init).
pub fn mode() -> Mode {
    MODE.get().copied().unwrap_or(Mode::Legacy)
}

/// Whether `bug` is the one planted.
pub fn is(bug: Bug) -> bool {
    mode() == Mode::Planted(bug)
}
