/*
 * The Cobalt operators of ABI 1.4: gather and scatter_add along one
 * dimension by i32/i64 indices, cumsum, the boolean reductions any and all,
 * and the bitwise operators and, or and xor.
 *
 * Every operand is gathered (decoded) into a plain row-major buffer, the
 * work is done there and the written tensor is scattered (encoded) back, so
 * strides never matter and an in-place cumsum or bitwise call reads all of
 * its input before it writes. Every index is checked before anything is
 * written (INVALID_ARGUMENT names the first bad one). scatter_add adds the
 * updates of each element in double and rounds once (only elements that
 * receive an update are rewritten: the others keep their bits, NaN
 * payloads included); integers wrap. cumsum keeps a running sum in double
 * from +0 (as PyTorch's CPU does for f32: bit for bit), integers wrapping.
 */

#include <string.h>

#include "cobalt.h"

/* INVALID_ARGUMENT unless 0 <= dim < v's rank. */
static PolychipError *need_dim(const char *op, const cobalt_view *v, int32_t dim) {
    if (dim >= 0 && dim < v->ndim) {
        return NULL;
    }
    char s[COBALT_SHAPE_STR_BYTES];
    return cobalt_error(POLYCHIP_ERROR_INVALID_ARGUMENT,
                        "cobalt: %s: dim %d is out of range for a tensor of shape %s", op,
                        (int)dim, cobalt_shape_str(s, v->ndim, v->shape));
}

/* Wrapping int64 addition (no signed overflow). */
static int64_t add_wrapping(int64_t x, int64_t y) {
    return (int64_t)((uint64_t)x + (uint64_t)y);
}

/* Stores the low bits of `v` as an integer element of `dtype`. */
static void write_int(cobalt_dtype dtype, uint8_t *p, int64_t v) {
    if (dtype == COBALT_I32) {
        int32_t w = (int32_t)(uint32_t)(uint64_t)v;
        memcpy(p, &w, sizeof w);
    } else if (dtype == COBALT_I64) {
        memcpy(p, &v, sizeof v);
    } else {
        p[0] = (uint8_t)v;
    }
}

/* The checked views of gather or scatter_add: `data` indexed along `dim`,
 * `index` (i32 or i64) and `other` (out or src) of index's shape and
 * data's dtype, index of data's rank with no extent but dim's above data's;
 * and the indices as int64_t (a new scratch buffer in *idx), each checked
 * in [0, data.shape[dim]). */
static PolychipError *indexed(const char *op, const cobalt_view *data, const cobalt_view *index,
                              const char *other_name, const cobalt_view *other, int32_t dim,
                              int64_t **idx) {
    *idx = NULL;
    PolychipError *error = need_dim(op, data, dim);
    if (error == NULL) {
        error = cobalt_need_index(op, "index", index);
    }
    if (error != NULL) {
        return error;
    }
    if (other->dtype != data->dtype) {
        return cobalt_error(POLYCHIP_ERROR_DTYPE_MISMATCH,
                            "cobalt: %s: %s is %s but the data is %s; they must have one dtype", op,
                            other_name, cobalt_dtype_name(other->dtype),
                            cobalt_dtype_name(data->dtype));
    }
    int fits = index->ndim == data->ndim &&
               cobalt_same_shape(index->ndim, index->shape, other->ndim, other->shape);
    for (int d = 0; fits && d < data->ndim; d++) {
        fits = d == dim || index->shape[d] <= data->shape[d];
    }
    if (!fits) {
        char si[COBALT_SHAPE_STR_BYTES], so[COBALT_SHAPE_STR_BYTES], sd[COBALT_SHAPE_STR_BYTES];
        return cobalt_error(POLYCHIP_ERROR_SHAPE_MISMATCH,
                            "cobalt: %s: index has shape %s and %s %s; both must have the data's "
                            "rank and no extent but dim %d's above the data's shape %s",
                            op, cobalt_shape_str(si, index->ndim, index->shape), other_name,
                            cobalt_shape_str(so, other->ndim, other->shape), (int)dim,
                            cobalt_shape_str(sd, data->ndim, data->shape));
    }
    uint8_t *raw = cobalt_scratch(op, index->numel, index->elem_size, &error);
    if (raw == NULL) {
        return error;
    }
    cobalt_gather(index, raw);
    int64_t *v = cobalt_scratch(op, index->numel, sizeof(int64_t), &error);
    if (v == NULL) {
        cobalt_scratch_free(raw);
        return error;
    }
    int64_t n = data->shape[dim];
    for (int64_t k = 0; k < index->numel; k++) {
        v[k] = cobalt_read_int(index->dtype, raw + (size_t)k * index->elem_size);
        if (v[k] < 0 || v[k] >= n) {
            error = cobalt_error(POLYCHIP_ERROR_INVALID_ARGUMENT,
                                 "cobalt: %s: index %lld (element %lld of index) is out of range "
                                 "[0, %lld) for dim %d",
                                 op, (long long)v[k], (long long)k, (long long)n, (int)dim);
            break;
        }
    }
    cobalt_scratch_free(raw);
    if (error != NULL) {
        cobalt_scratch_free(v);
        return error;
    }
    *idx = v;
    return NULL;
}

/* The row-major position in `data` of element `k` of a tensor of `index`'s
 * shape, with its coordinate along `dim` replaced by `at`. */
static int64_t position(const cobalt_view *data, const cobalt_view *index, int32_t dim, int64_t k,
                        int64_t at) {
    int64_t pos = 0, stride = 1;
    for (int d = index->ndim - 1; d >= 0; d--) {
        int64_t c = k % index->shape[d];
        k /= index->shape[d];
        pos += (d == dim ? at : c) * stride;
        stride *= data->shape[d];
    }
    return pos;
}

/* The views of gather or scatter_add, `list` holding the data, the index
 * and the other tensor (out or src) in that order, checked as `indexed`
 * checks them, with list[written] writable; the indices in *idx (NULL
 * on error). */
static PolychipError *indexed_call(const char *op, uint32_t device, const cobalt_arg list[3],
                                   int written, int32_t dim, int64_t **idx) {
    *idx = NULL;
    PolychipError *error = cobalt_views(op, device, list, 3);
    if (error == NULL) {
        error = indexed(op, list[0].view, list[1].view, list[2].name, list[2].view, dim, idx);
    }
    if (error == NULL) {
        error = cobalt_need_writable(op, list[written].name, list[written].view);
    }
    if (error != NULL) {
        cobalt_scratch_free(*idx);
        *idx = NULL;
    }
    return error;
}

PolychipError *cobalt_op_gather(uint32_t device, PolychipStream *stream,
                                const PolychipGatherArgs *args) {
    const char *op = "gather";
    PolychipError *error = COBALT_BEGIN(op, device, stream, args, PolychipGatherArgs);
    if (error != NULL) {
        return error;
    }
    cobalt_view input, index, out;
    const cobalt_arg list[] = {
        {&input, &args->input, "input"}, {&index, &args->index, "index"}, {&out, &args->out, "out"}};
    int64_t *idx = NULL;
    error = indexed_call(op, device, list, 2, args->dim, &idx);
    if (error != NULL || out.numel == 0) {
        cobalt_scratch_free(idx);
        return error;
    }
    size_t size = out.elem_size;
    uint8_t *x = cobalt_scratch(op, input.numel, size, &error);
    uint8_t *r = x == NULL ? NULL : cobalt_scratch(op, out.numel, size, &error);
    if (r != NULL) {
        cobalt_gather(&input, x);
        for (int64_t k = 0; k < out.numel; k++) {
            int64_t from = position(&input, &index, args->dim, k, idx[k]);
            memcpy(r + (size_t)k * size, x + (size_t)from * size, size);
        }
        cobalt_scatter(&out, r);
    }
    cobalt_scratch_free(idx);
    cobalt_scratch_free(x);
    cobalt_scratch_free(r);
    return error;
}

PolychipError *cobalt_op_scatter_add(uint32_t device, PolychipStream *stream,
                                     const PolychipScatterAddArgs *args) {
    const char *op = "scatter_add";
    PolychipError *error = COBALT_BEGIN(op, device, stream, args, PolychipScatterAddArgs);
    if (error != NULL) {
        return error;
    }
    cobalt_view dst, index, src;
    const cobalt_arg list[] = {
        {&dst, &args->dst, "dst"}, {&index, &args->index, "index"}, {&src, &args->src, "src"}};
    int64_t *idx = NULL;
    error = indexed_call(op, device, list, 0, args->dim, &idx);
    int is_float = error == NULL && cobalt_dtype_is_float(dst.dtype);
    if (error == NULL && !is_float && dst.dtype != COBALT_I32 && dst.dtype != COBALT_I64) {
        error = cobalt_error(POLYCHIP_ERROR_DTYPE_MISMATCH,
                             "cobalt: scatter_add: dst is %s; it must be floating, i32 or i64",
                             cobalt_dtype_name(dst.dtype));
    }
    if (error != NULL || src.numel == 0) {
        cobalt_scratch_free(idx);
        return error;
    }
    size_t size = dst.elem_size;
    /* Each element's sum (double, or int64_t bits) and whether it has one. */
    uint8_t *d = cobalt_scratch(op, dst.numel, size, &error);
    uint8_t *s = d == NULL ? NULL : cobalt_scratch(op, src.numel, size, &error);
    int64_t *sums = s == NULL ? NULL : cobalt_scratch(op, dst.numel, sizeof(int64_t), &error);
    uint8_t *hit = sums == NULL ? NULL : cobalt_scratch(op, dst.numel, 1, &error);
    if (hit != NULL) {
        cobalt_gather(&dst, d);
        cobalt_gather(&src, s);
        memset(hit, 0, (size_t)dst.numel);
        for (int64_t k = 0; k < src.numel; k++) {
            int64_t to = position(&dst, &index, args->dim, k, idx[k]);
            const uint8_t *u = s + (size_t)k * size;
            const uint8_t *old = d + (size_t)to * size;
            if (is_float) {
                double acc;
                if (hit[to]) {
                    memcpy(&acc, &sums[to], sizeof acc);
                } else {
                    acc = cobalt_read_f64(dst.dtype, old);
                }
                acc += cobalt_read_f64(dst.dtype, u);
                memcpy(&sums[to], &acc, sizeof acc);
            } else {
                int64_t acc = hit[to] ? sums[to] : cobalt_read_int(dst.dtype, old);
                sums[to] = add_wrapping(acc, cobalt_read_int(dst.dtype, u));
            }
            hit[to] = 1;
        }
        for (int64_t i = 0; i < dst.numel; i++) {
            if (!hit[i]) {
                continue;
            }
            uint8_t *p = d + (size_t)i * size;
            if (is_float) {
                double acc;
                memcpy(&acc, &sums[i], sizeof acc);
                cobalt_write_f64(dst.dtype, p, acc);
            } else {
                write_int(dst.dtype, p, sums[i]);
            }
        }
        cobalt_scatter(&dst, d);
    }
    cobalt_scratch_free(idx);
    cobalt_scratch_free(d);
    cobalt_scratch_free(s);
    cobalt_scratch_free(sums);
    cobalt_scratch_free(hit);
    return error;
}

PolychipError *cobalt_op_cumsum(uint32_t device, PolychipStream *stream,
                                const PolychipCumsumArgs *args) {
    const char *op = "cumsum";
    PolychipError *error = COBALT_BEGIN(op, device, stream, args, PolychipCumsumArgs);
    if (error != NULL) {
        return error;
    }
    cobalt_view input, out;
    const cobalt_arg list[] = {{&input, &args->input, "input"}, {&out, &args->out, "out"}};
    error = cobalt_views(op, device, list, 2);
    if (error == NULL) {
        error = need_dim(op, &input, args->dim);
    }
    if (error == NULL) {
        error = cobalt_need_same_shapes(op, list, 2);
    }
    if (error != NULL) {
        return error;
    }
    int is_float = cobalt_dtype_is_float(input.dtype);
    if (out.dtype != input.dtype || (!is_float && input.dtype != COBALT_I32 && input.dtype != COBALT_I64)) {
        return cobalt_error(POLYCHIP_ERROR_DTYPE_MISMATCH,
                            "cobalt: cumsum: input is %s and out is %s; they must have one dtype, "
                            "floating, i32 or i64",
                            cobalt_dtype_name(input.dtype), cobalt_dtype_name(out.dtype));
    }
    error = cobalt_need_writable(op, "out", &out);
    if (error != NULL || out.numel == 0) {
        return error;
    }
    size_t size = out.elem_size;
    uint8_t *x = cobalt_scratch(op, input.numel, size, &error);
    if (x == NULL) {
        return error;
    }
    cobalt_gather(&input, x);
    int64_t n = input.shape[args->dim], inner = 1;
    for (int d = args->dim + 1; d < input.ndim; d++) {
        inner *= input.shape[d];
    }
    for (int64_t line = 0; line < input.numel / n; line++) {
        int64_t base = (line / inner) * n * inner + line % inner;
        double f = 0.0;
        int64_t w = 0;
        for (int64_t k = 0; k < n; k++) {
            uint8_t *p = x + (size_t)(base + k * inner) * size;
            if (is_float) {
                f += cobalt_read_f64(input.dtype, p);
                cobalt_write_f64(input.dtype, p, f);
            } else {
                w = add_wrapping(w, cobalt_read_int(input.dtype, p));
                write_int(input.dtype, p, w);
            }
        }
    }
    cobalt_scatter(&out, x);
    cobalt_scratch_free(x);
    return NULL;
}

/* any (every == 0) or all (every == 1) over dim. */
static PolychipError *reduce_bool(const char *op, int every, uint32_t device,
                                  PolychipStream *stream, const PolychipReduceBoolArgs *args) {
    PolychipError *error = COBALT_BEGIN(op, device, stream, args, PolychipReduceBoolArgs);
    if (error != NULL) {
        return error;
    }
    cobalt_view input, out;
    const cobalt_arg list[] = {{&input, &args->input, "input"}, {&out, &args->out, "out"}};
    error = cobalt_views(op, device, list, 2);
    if (error == NULL) {
        error = need_dim(op, &input, args->dim);
    }
    if (error != NULL) {
        return error;
    }
    if (out.dtype != COBALT_BOOL) {
        return cobalt_error(POLYCHIP_ERROR_DTYPE_MISMATCH, "cobalt: %s: out is %s; it must be bool",
                            op, cobalt_dtype_name(out.dtype));
    }
    int64_t want[COBALT_MAX_DIMS];
    int ndim = 0;
    for (int d = 0; d < input.ndim; d++) {
        if (d != args->dim) {
            want[ndim++] = input.shape[d];
        } else if (args->keepdim) {
            want[ndim++] = 1;
        }
    }
    error = cobalt_need_shape(op, "out", &out, "input", &input, ndim, want);
    if (error == NULL) {
        error = cobalt_need_writable(op, "out", &out);
    }
    if (error != NULL || out.numel == 0) {
        return error;
    }
    int64_t n = input.shape[args->dim], inner = 1;
    for (int d = args->dim + 1; d < input.ndim; d++) {
        inner *= input.shape[d];
    }
    size_t size = input.elem_size;
    uint8_t *x = input.numel == 0 ? NULL : cobalt_scratch(op, input.numel, size, &error);
    uint8_t *r = error != NULL ? NULL : cobalt_scratch(op, out.numel, 1, &error);
    if (r != NULL) {
        if (x != NULL) {
            cobalt_gather(&input, x);
        }
        int is_float = cobalt_dtype_is_float(input.dtype);
        for (int64_t o = 0; o < out.numel; o++) {
            int64_t base = (o / inner) * n * inner + o % inner;
            int result = every;
            for (int64_t k = 0; k < n && result == every; k++) {
                const uint8_t *p = x + (size_t)(base + k * inner) * size;
                int nonzero = is_float ? cobalt_read_f64(input.dtype, p) != 0.0
                                       : cobalt_read_int(input.dtype, p) != 0;
                if (nonzero != every) {
                    result = !every;
                }
            }
            r[o] = (uint8_t)result;
        }
        cobalt_scatter(&out, r);
    }
    cobalt_scratch_free(x);
    cobalt_scratch_free(r);
    return error;
}

PolychipError *cobalt_op_any(uint32_t device, PolychipStream *stream,
                             const PolychipReduceBoolArgs *args) {
    return reduce_bool("any", 0, device, stream, args);
}

PolychipError *cobalt_op_all(uint32_t device, PolychipStream *stream,
                             const PolychipReduceBoolArgs *args) {
    return reduce_bool("all", 1, device, stream, args);
}

typedef enum bitwise_kind { BIT_AND, BIT_OR, BIT_XOR } bitwise_kind;

static const char *const g_bitwise_names[] = {"bitwise_and", "bitwise_or", "bitwise_xor"};

static PolychipError *bitwise(bitwise_kind kind, uint32_t device, PolychipStream *stream,
                              const PolychipBitwiseArgs *args) {
    const char *op = g_bitwise_names[kind];
    PolychipError *error = COBALT_BEGIN(op, device, stream, args, PolychipBitwiseArgs);
    if (error != NULL) {
        return error;
    }
    cobalt_view a, b, out;
    const cobalt_arg list[] = {{&a, &args->a, "a"}, {&b, &args->b, "b"}, {&out, &args->out, "out"}};
    error = cobalt_views(op, device, list, 3);
    if (error != NULL) {
        return error;
    }
    if (a.dtype != out.dtype || b.dtype != out.dtype || cobalt_dtype_is_float(out.dtype)) {
        return cobalt_error(POLYCHIP_ERROR_DTYPE_MISMATCH,
                            "cobalt: %s: a is %s, b is %s and out is %s; they must have one "
                            "integer or bool dtype",
                            op, cobalt_dtype_name(a.dtype), cobalt_dtype_name(b.dtype),
                            cobalt_dtype_name(out.dtype));
    }
    error = cobalt_need_writable(op, "out", &out);
    if (error != NULL || out.numel == 0) {
        return error;
    }
    uint8_t *x = NULL, *y = NULL;
    error = cobalt_gather_wide(op, "a", &a, &out, &x);
    if (error == NULL) {
        error = cobalt_gather_wide(op, "b", &b, &out, &y);
    }
    if (error == NULL) {
        size_t size = out.elem_size;
        for (int64_t i = 0; i < out.numel; i++) {
            uint8_t *p = x + (size_t)i * size;
            int64_t l = cobalt_read_int(out.dtype, p);
            int64_t r = cobalt_read_int(out.dtype, y + (size_t)i * size);
            int64_t v = kind == BIT_AND ? (l & r) : kind == BIT_OR ? (l | r) : (l ^ r);
            write_int(out.dtype, p, v);
        }
        cobalt_scatter(&out, x);
    }
    cobalt_scratch_free(x);
    cobalt_scratch_free(y);
    return error;
}

PolychipError *cobalt_op_bitwise_and(uint32_t device, PolychipStream *stream,
                                     const PolychipBitwiseArgs *args) {
    return bitwise(BIT_AND, device, stream, args);
}

PolychipError *cobalt_op_bitwise_or(uint32_t device, PolychipStream *stream,
                                    const PolychipBitwiseArgs *args) {
    return bitwise(BIT_OR, device, stream, args);
}

PolychipError *cobalt_op_bitwise_xor(uint32_t device, PolychipStream *stream,
                                     const PolychipBitwiseArgs *args) {
    return bitwise(BIT_XOR, device, stream, args);
}
