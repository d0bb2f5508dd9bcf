/*
 * Internal declarations shared by the Cobalt plugin's C files.
 *
 * Cobalt is the polychip example plugin written in plain C11 against
 * include/polychip.h only: a slow, synchronous "chip" with a small private
 * memory that the host cannot read directly (bytes are stored encoded).
 * The files split by concern:
 *   plugin.c    the entry symbol, the plugin table, configuration, errors, logs
 *   streams.c   streams and events (trivial: the chip is synchronous)
 *   memory.c    per-device arenas, the allocator, byte encoding, copies
 *   convert.c   f16/bf16 conversions and dtype-generic element reads/writes
 *   tensor.c    tensor descriptor checks, broadcasting, gather and scatter
 *   ops_check.c argument checks and loads shared by the ABI 1.1 operators
 *   ops_data.c, ops_elementwise.c, ops_matmul.c, ops_softmax.c  the 1.0 operators
 *   ops_unary.c, ops_activation.c, ops_reduce.c, ops_softmax_grad.c,
 *   ops_linear.c, ops_norm.c, ops_rope.c, ops_attention.c,
 *   ops_attention_grad.c, ops_embedding.c, ops_loss.c, ops_training.c
 *               the operators ABI 1.1 added
 *   ops_activation_1_2.c  the operators ABI 1.2 added
 *   ops_1_3.c   the operators ABI 1.3 added (sin, cos, select, masked_fill,
 *               convert, arange, the comparisons)
 *   ops_1_4.c   the operators ABI 1.4 added (gather, scatter_add, cumsum,
 *               any, all, the bitwise operators)
 * Nothing here is exported: the library is built with -fvisibility=hidden and
 * only polychip_plugin_init_v1 carries POLYCHIP_EXPORT.
 */

#ifndef COBALT_INTERNAL_H
#define COBALT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "polychip.h"

#if defined(__GNUC__)
#define COBALT_PRINTF(fmt_index, first_arg) __attribute__((format(printf, fmt_index, first_arg)))
#else
#define COBALT_PRINTF(fmt_index, first_arg)
#endif

/* Limits and defaults. */
#define COBALT_MAX_DEVICES 16u
#define COBALT_DEFAULT_DEVICES 1u
#define COBALT_DEFAULT_MEMORY_MIB 256u
#define COBALT_MAX_MEMORY_MIB 65536u
#define COBALT_ALIGNMENT 64u
#define COBALT_MAX_DIMS 16

/* Whether a struct that says it is `size` bytes long contains all of `field`. */
#define COBALT_HAS_FIELD(size, type, field) \
    ((size) >= offsetof(type, field) + sizeof(((type *)0)->field))
/* The byte just past `field` of `type`. */
#define COBALT_FIELD_END(type, field) (offsetof(type, field) + sizeof(((type *)0)->field))

/* ---- plugin.c: errors, logging, configuration ---------------------------- */

/* A host error object with `code` and a printf-formatted message. */
PolychipError *cobalt_error(PolychipErrorCode code, const char *fmt, ...) COBALT_PRINTF(2, 3);
/* A record through the host's log callback, when it has one. */
void cobalt_log(PolychipLogLevel level, const char *fmt, ...) COBALT_PRINTF(2, 3);
/* Number of configured devices. */
uint32_t cobalt_devices(void);
/* INVALID_ARGUMENT unless `device` is a valid index; `what` names the caller. */
PolychipError *cobalt_check_device(uint32_t device, const char *what);

/* ---- streams.c ----------------------------------------------------------- */

/* INVALID_ARGUMENT unless `stream` is NULL or a live stream of `device`. */
PolychipError *cobalt_check_stream(uint32_t device, const PolychipStream *stream, const char *what);
/*
 * Strict streams (POLYCHIP_COBALT_STRICT_STREAMS=1): a copy refuses to run
 * while another thread's copy is running on the same stream (the default
 * stream of its device included), as the ABI asks callers to serialize one
 * stream's calls; each copy then also lasts at least 200 us, so that such a
 * caller is caught. Off by default.
 */
void cobalt_set_strict_streams(int on);
/* Claims `stream` (NULL: the device's default stream) for one copy. */
PolychipError *cobalt_stream_enter(uint32_t device, PolychipStream *stream, const char *what);
/* Releases the claim of cobalt_stream_enter. */
void cobalt_stream_leave(uint32_t device, PolychipStream *stream);
PolychipError *cobalt_stream_create(uint32_t device, PolychipStream **out_stream);
PolychipError *cobalt_stream_destroy(PolychipStream *stream);
PolychipError *cobalt_stream_synchronize(PolychipStream *stream);
PolychipError *cobalt_event_create(uint32_t device, PolychipEvent **out_event);
PolychipError *cobalt_event_destroy(PolychipEvent *event);
PolychipError *cobalt_event_record(PolychipEvent *event, PolychipStream *stream);
PolychipError *cobalt_stream_wait_event(PolychipStream *stream, PolychipEvent *event);
PolychipError *cobalt_event_synchronize(PolychipEvent *event);

/* ---- memory.c ------------------------------------------------------------ */

/* Sets every device's capacity; called once from init. */
void cobalt_memory_init(uint64_t capacity_bytes);
/* Capacity of each device in bytes. */
uint64_t cobalt_memory_capacity(void);
PolychipError *cobalt_mem_alloc(uint32_t device, uint64_t bytes, void **out_ptr);
PolychipError *cobalt_mem_free(uint32_t device, void *ptr);
PolychipError *cobalt_memcpy_h2d(uint32_t device, PolychipStream *stream, void *dst,
                                 const void *src, uint64_t bytes);
PolychipError *cobalt_memcpy_d2h(uint32_t device, PolychipStream *stream, void *dst,
                                 const void *src, uint64_t bytes);
PolychipError *cobalt_memcpy_d2d(uint32_t device, PolychipStream *stream, void *dst,
                                 const void *src, uint64_t bytes);
/*
 * Checks that the `len` bytes at device address `addr` lie inside one live
 * allocation of `device` (INVALID_ARGUMENT naming `what` otherwise); on
 * success stores the device's arena base and the range's offset in it.
 */
PolychipError *cobalt_check_range(uint32_t device, const char *what, uintptr_t addr, uint64_t len,
                                  uint8_t **out_arena, uint64_t *out_offset);
/*
 * dst[i] = src[i] XOR key(offset + i) for i < n: encodes plain bytes for, or
 * decodes stored bytes from, arena offset `offset`. dst may equal src.
 */
void cobalt_xcode(uint8_t *dst, const uint8_t *src, uint64_t offset, size_t n);

/* ---- convert.c ----------------------------------------------------------- */

typedef enum cobalt_dtype {
    COBALT_F32,
    COBALT_F16,
    COBALT_BF16,
    COBALT_F64,
    COBALT_I32,
    COBALT_I64,
    COBALT_U8,
    COBALT_BOOL
} cobalt_dtype;

/* "f32", "bf16", ... */
const char *cobalt_dtype_name(cobalt_dtype dtype);
size_t cobalt_dtype_size(cobalt_dtype dtype);
int cobalt_dtype_is_float(cobalt_dtype dtype);
/* Maps a DLPack dtype to ours; 0 when it is not one of ABI v1's. */
int cobalt_dtype_from_abi(PolychipDataType abi, cobalt_dtype *out);

float cobalt_f16_to_f32(uint16_t bits);
float cobalt_bf16_to_f32(uint16_t bits);
/* Round to nearest even, directly from the double (no double rounding). */
uint16_t cobalt_f64_to_f16(double value);
uint16_t cobalt_f64_to_bf16(double value);

/* Reads one element of a floating dtype (exactly). */
double cobalt_read_f64(cobalt_dtype dtype, const uint8_t *src);
/* Reads one element of f32, f16 or bf16 (exactly); f64 is rounded. */
float cobalt_read_f32(cobalt_dtype dtype, const uint8_t *src);
/*
 * Writes `value` as one element of any dtype: floats round to nearest even;
 * integers truncate toward zero and saturate (NaN becomes 0); bool is
 * `value != 0`.
 */
void cobalt_write_f64(cobalt_dtype dtype, uint8_t *dst, double value);
/* Writes a float as one element of a floating dtype, rounding once. */
void cobalt_write_f32(cobalt_dtype dtype, uint8_t *dst, float value);

/* ---- tensor.c ------------------------------------------------------------ */

/* A checked tensor descriptor whose every element lies in one allocation. */
typedef struct cobalt_view {
    cobalt_dtype dtype;
    size_t elem_size;
    int ndim;
    int64_t shape[COBALT_MAX_DIMS];
    int64_t strides[COBALT_MAX_DIMS]; /* in elements */
    int64_t numel;
    uint8_t *arena;  /* the device's arena; NULL when numel == 0 */
    int64_t origin;  /* arena byte offset of element (0, ..., 0) */
} cobalt_view;

/* Room for "[a, b, ...]" with COBALT_MAX_DIMS 20-digit entries. */
#define COBALT_SHAPE_STR_BYTES 400
/* Writes "[2, 3]" into buf and returns it. */
const char *cobalt_shape_str(char *buf, int ndim, const int64_t *shape);

/*
 * Checks operator `op`'s tensor argument `name` for `device` and fills `out`:
 * device type and id, rank, extents, dtype, and that the byte extent implied
 * by shape, strides and byte_offset lies inside one live allocation.
 */
PolychipError *cobalt_view_init(cobalt_view *out, const PolychipTensor *tensor, uint32_t device,
                                const char *op, const char *name);
/* Whether two shapes are equal. */
int cobalt_same_shape(int ndim_a, const int64_t *a, int ndim_b, const int64_t *b);
/* NumPy broadcast shape of a and b (right-aligned); 0 when incompatible. */
int cobalt_broadcast_shape(int ndim_a, const int64_t *a, int ndim_b, const int64_t *b,
                           int *out_ndim, int64_t *out_shape);
/* `in` viewed with shape `shape` (zero strides on broadcast dims); 0 when incompatible. */
int cobalt_view_broadcast(const cobalt_view *in, int ndim, const int64_t *shape, cobalt_view *out);

/* Device elements to a contiguous row-major plain buffer, decoding. */
void cobalt_gather(const cobalt_view *view, void *plain);
/* A contiguous row-major plain buffer to the device elements, encoding. */
void cobalt_scatter(const cobalt_view *view, const void *plain);

/* A host buffer of count * size bytes (at least 1), kept buffers reused (scratch.c); NULL with
 * *error set (OUT_OF_MEMORY naming `op`) on failure. Handed back with cobalt_scratch_free. */
void *cobalt_scratch(const char *op, int64_t count, size_t size, PolychipError **error);
/* Hands back a cobalt_scratch buffer (NULL does nothing). */
void cobalt_scratch_free(void *buffer);
/* A new buffer with a floating view's elements as float / double. */
PolychipError *cobalt_load_f32(const char *op, const cobalt_view *view, float **out);
PolychipError *cobalt_load_f64(const char *op, const cobalt_view *view, double **out);
/* Writes values (row-major, view->numel of them) to a view, rounding once. */
PolychipError *cobalt_store_f32(const char *op, const cobalt_view *view, const float *values);
PolychipError *cobalt_store_f64(const char *op, const cobalt_view *view, const double *values);

/*
 * The checks every operator starts with: a valid device, a stream of that
 * device (or NULL), non-NULL args whose struct_size covers `needed` bytes.
 */
PolychipError *cobalt_op_begin(const char *op, uint32_t device, const PolychipStream *stream,
                               const void *args, size_t needed, const char *last_field);

/* ---- ops_check.c: checks shared by the ABI 1.1 operators ----------------- */

/* One tensor argument of an operator: where to put its view, and its name. */
typedef struct cobalt_arg {
    cobalt_view *view;
    const PolychipTensor *tensor;
    const char *name;
} cobalt_arg;

/*
 * cobalt_op_begin for an operator of ABI 1.1, whose every field is required:
 * struct_size must be at least sizeof(type) (as the ABI 1.1 header has it).
 */
PolychipError *cobalt_op_begin_args(const char *op, uint32_t device, const PolychipStream *stream,
                                    const void *args, size_t size, const char *type);
#define COBALT_BEGIN(op, device, stream, args, type) \
    cobalt_op_begin_args(op, device, stream, args, sizeof(type), #type)
/* cobalt_view_init for each of `count` arguments, stopping at the first error. */
PolychipError *cobalt_views(const char *op, uint32_t device, const cobalt_arg *list, int count);
/*
 * DTYPE_MISMATCH unless the first argument has a floating dtype the 1.1
 * operators take (f32, f16 or bf16) and every other argument has the same
 * dtype.
 */
PolychipError *cobalt_need_float(const char *op, const cobalt_arg *list, int count);
/* DTYPE_MISMATCH unless `v` is f32; `role` says what the tensor holds. */
PolychipError *cobalt_need_f32(const char *op, const char *name, const cobalt_view *v,
                               const char *role);
/* DTYPE_MISMATCH unless `v` holds indices (i32 or i64). */
PolychipError *cobalt_need_index(const char *op, const char *name, const cobalt_view *v);
/* SHAPE_MISMATCH unless every argument has the first one's shape. */
PolychipError *cobalt_need_same_shapes(const char *op, const cobalt_arg *list, int count);
/*
 * SHAPE_MISMATCH unless `v` (argument `name`) has exactly `shape`, which
 * follows from argument `ref_name` (`ref`):
 * "cobalt: op: name has shape A but ref_name has shape B; name must have shape C".
 */
PolychipError *cobalt_need_shape(const char *op, const char *name, const cobalt_view *v,
                                 const char *ref_name, const cobalt_view *ref, int ndim,
                                 const int64_t *shape);
/* SHAPE_MISMATCH unless `v` has `ndim` dims; `layout` describes them ("[batch, seq, heads, D]"). */
PolychipError *cobalt_need_ndim(const char *op, const char *name, const cobalt_view *v, int ndim,
                                const char *layout);
/*
 * INVALID_ARGUMENT when output `name` would write some element twice (a
 * zero stride on an extent above 1, or strides that interleave). Like the
 * host's check, it is conservative: dims sorted by |stride| must each step
 * past everything the smaller ones reach.
 */
PolychipError *cobalt_need_writable(const char *op, const char *name, const cobalt_view *v);
/* SHAPE_MISMATCH unless `v` has at least one dimension; `layout` describes it. */
PolychipError *cobalt_need_rank1(const char *op, const char *name, const cobalt_view *v,
                                 const char *layout);
/* A new buffer with an index view's elements as int64_t. */
PolychipError *cobalt_load_indices(const char *op, const cobalt_view *view, int64_t **out);
/* Frees every pointer in `list` (NULL entries included). */
void cobalt_free_all(void **list, int count);

/* ---- ops_unary.c and ops_activation.c: elementwise helpers --------------- */

/* out[k] = f(in[0], ..., in[n_in - 1]) for one element; `param` is per call. */
typedef void (*cobalt_pointwise_fn)(const double *in, double *out, double param);
/*
 * Runs an elementwise operator: `list` holds `n_in` inputs then `n_out`
 * outputs (at most 5 in all), which must share one floating dtype and one
 * shape. Inputs are read in double before any output is written, so an
 * output may be exactly an input.
 */
PolychipError *cobalt_pointwise(const char *op, uint32_t device, const cobalt_arg *list, int n_in,
                                int n_out, cobalt_pointwise_fn fn, double param);
/* A unary operator `out = fn(input)` (ops_unary.c), and an activation's
 * backward `grad_in = fn(grad_out, input)` (ops_activation.c), begun and
 * run elementwise. */
PolychipError *cobalt_unary(const char *op, uint32_t device, PolychipStream *stream,
                            const PolychipUnaryArgs *args, cobalt_pointwise_fn fn);
PolychipError *cobalt_activation_backward(const char *op, uint32_t device, PolychipStream *stream,
                                          const PolychipActivationBackwardArgs *args,
                                          cobalt_pointwise_fn fn);
/* sigmoid(x), silu(x) = x sigmoid(x), and gelu (tanh form) with derivatives. */
double cobalt_sigmoid(double x);
double cobalt_silu(double x);
double cobalt_silu_grad(double x);
double cobalt_gelu(double x);
double cobalt_gelu_grad(double x);

/* ---- ops_attention.c: the geometry attention and its backward share ------- */

typedef struct cobalt_attention_dims {
    int64_t batch, heads_q, heads_kv, seq_q, seq_kv, d;
    int64_t group; /* query heads per key/value head */
} cobalt_attention_dims;

/*
 * Checks q [batch, heads_q, seq_q, D], k and v [batch, heads_kv, seq_kv, D]
 * (heads_q a multiple of heads_kv) and fills `dims`.
 */
PolychipError *cobalt_attention_dims_of(const char *op, const cobalt_view *q, const cobalt_view *k,
                                        const cobalt_view *v, cobalt_attention_dims *dims);
/* How many keys (a prefix 0..n-1) query `i` sees. */
int64_t cobalt_attention_visible(const cobalt_attention_dims *dims, int causal, int64_t i);

/* ---- the operators (ops_*.c) --------------------------------------------- */

PolychipError *cobalt_op_fill(uint32_t device, PolychipStream *stream, const PolychipFillArgs *args);
PolychipError *cobalt_op_copy(uint32_t device, PolychipStream *stream, const PolychipCopyArgs *args);
PolychipError *cobalt_op_cast(uint32_t device, PolychipStream *stream, const PolychipCastArgs *args);
PolychipError *cobalt_op_add(uint32_t device, PolychipStream *stream, const PolychipBinaryArgs *args);
PolychipError *cobalt_op_sub(uint32_t device, PolychipStream *stream, const PolychipBinaryArgs *args);
PolychipError *cobalt_op_mul(uint32_t device, PolychipStream *stream, const PolychipBinaryArgs *args);
PolychipError *cobalt_op_div(uint32_t device, PolychipStream *stream, const PolychipBinaryArgs *args);
PolychipError *cobalt_op_matmul(uint32_t device, PolychipStream *stream,
                                const PolychipMatmulArgs *args);
PolychipError *cobalt_op_softmax(uint32_t device, PolychipStream *stream,
                                 const PolychipSoftmaxArgs *args);

/* ABI 1.1. The entry type of each operator in PolychipOpTable. */
#define COBALT_OP(name, args_type) \
    PolychipError *cobalt_op_##name(uint32_t device, PolychipStream *stream, const args_type *args)
COBALT_OP(neg, PolychipUnaryArgs);
COBALT_OP(exp, PolychipUnaryArgs);
COBALT_OP(log, PolychipUnaryArgs);
COBALT_OP(sqrt, PolychipUnaryArgs);
COBALT_OP(rsqrt, PolychipUnaryArgs);
COBALT_OP(tanh, PolychipUnaryArgs);
COBALT_OP(pow_scalar, PolychipPowScalarArgs);
COBALT_OP(relu, PolychipUnaryArgs);
COBALT_OP(relu_backward, PolychipActivationBackwardArgs);
COBALT_OP(silu, PolychipUnaryArgs);
COBALT_OP(silu_backward, PolychipActivationBackwardArgs);
COBALT_OP(gelu, PolychipUnaryArgs);
COBALT_OP(gelu_backward, PolychipActivationBackwardArgs);
COBALT_OP(swiglu, PolychipSwigluArgs);
COBALT_OP(swiglu_backward, PolychipSwigluBackwardArgs);
COBALT_OP(sum, PolychipReduceArgs);
COBALT_OP(mean, PolychipReduceArgs);
COBALT_OP(max, PolychipReduceArgs);
COBALT_OP(argmax, PolychipReduceArgs);
COBALT_OP(sum_squares, PolychipSumSquaresArgs);
COBALT_OP(linear, PolychipLinearArgs);
COBALT_OP(softmax_backward, PolychipSoftmaxBackwardArgs);
COBALT_OP(log_softmax, PolychipSoftmaxArgs);
COBALT_OP(log_softmax_backward, PolychipSoftmaxBackwardArgs);
COBALT_OP(rms_norm, PolychipRmsNormArgs);
COBALT_OP(rms_norm_backward, PolychipRmsNormBackwardArgs);
COBALT_OP(layer_norm, PolychipLayerNormArgs);
COBALT_OP(layer_norm_backward, PolychipLayerNormBackwardArgs);
COBALT_OP(rope, PolychipRopeArgs);
COBALT_OP(rope_backward, PolychipRopeArgs);
COBALT_OP(attention, PolychipAttentionArgs);
COBALT_OP(attention_backward, PolychipAttentionBackwardArgs);
COBALT_OP(embedding, PolychipEmbeddingArgs);
COBALT_OP(embedding_backward, PolychipEmbeddingBackwardArgs);
COBALT_OP(cross_entropy, PolychipCrossEntropyArgs);
COBALT_OP(cross_entropy_backward, PolychipCrossEntropyBackwardArgs);
COBALT_OP(adamw, PolychipAdamwArgs);
COBALT_OP(scale, PolychipScaleArgs);
/* ABI 1.2 (ops_activation_1_2.c). */
COBALT_OP(gelu_erf, PolychipUnaryArgs);
COBALT_OP(gelu_erf_backward, PolychipActivationBackwardArgs);
COBALT_OP(sigmoid, PolychipUnaryArgs);
COBALT_OP(sigmoid_backward, PolychipOutputBackwardArgs);
COBALT_OP(tanh_backward, PolychipOutputBackwardArgs);
/* ABI 1.3 (ops_1_3.c). */
/* add (sign 1: a + alpha b), sub (-1: a - alpha b) or mul (0: a b) on i32
 * or i64, wrapping; `a` and `b` already broadcast to out's shape. */
PolychipError *cobalt_binary_int(const char *op, int sign, const cobalt_view *a,
                                 const cobalt_view *b, const cobalt_view *out, double alpha);
COBALT_OP(sin, PolychipUnaryArgs);
COBALT_OP(cos, PolychipUnaryArgs);
COBALT_OP(select, PolychipSelectArgs);
COBALT_OP(masked_fill, PolychipMaskedFillArgs);
COBALT_OP(convert, PolychipConvertArgs);
COBALT_OP(arange, PolychipArangeArgs);
COBALT_OP(eq, PolychipCompareArgs);
COBALT_OP(ne, PolychipCompareArgs);
COBALT_OP(lt, PolychipCompareArgs);
COBALT_OP(le, PolychipCompareArgs);
COBALT_OP(gt, PolychipCompareArgs);
COBALT_OP(ge, PolychipCompareArgs);
/* `v` broadcast to out's shape and gathered into a new plain buffer
 * (cobalt_scratch: hand it back with cobalt_scratch_free); SHAPE_MISMATCH
 * when it does not broadcast. */
PolychipError *cobalt_gather_wide(const char *op, const char *name, const cobalt_view *v,
                                  const cobalt_view *out, uint8_t **plain);
/* An integer element (i32, i64, u8 or bool) as int64_t, exactly. */
int64_t cobalt_read_int(cobalt_dtype dtype, const uint8_t *p);
/* ABI 1.4 (ops_1_4.c). */
COBALT_OP(gather, PolychipGatherArgs);
COBALT_OP(scatter_add, PolychipScatterAddArgs);
COBALT_OP(cumsum, PolychipCumsumArgs);
COBALT_OP(any, PolychipReduceBoolArgs);
COBALT_OP(all, PolychipReduceBoolArgs);
COBALT_OP(bitwise_and, PolychipBitwiseArgs);
COBALT_OP(bitwise_or, PolychipBitwiseArgs);
COBALT_OP(bitwise_xor, PolychipBitwiseArgs);
#undef COBALT_OP

#endif /* COBALT_INTERNAL_H */
