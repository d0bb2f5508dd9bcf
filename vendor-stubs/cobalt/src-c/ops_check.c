/*
 * Argument checks and loads shared by the operators ABI 1.1 added: checking
 * a list of tensor arguments at once, the dtype rules (one floating dtype
 * among f32, f16 and bf16; f32 statistics; i32 or i64 indices), the
 * shape rules, and moving index tensors between the device and plain
 * int64_t buffers.
 *
 * Every message names the operator, the argument and the shapes involved,
 * e.g. "cobalt: linear: bias has shape [3] but weight has shape [4, 3]; bias
 * must have shape [4]". The 1.1 floating operators take f32, f16 and bf16
 * only (f64 is not part of their contract and is refused, as the host's own
 * checks refuse it). Outputs must not overlap themselves.
 */

#include <stdlib.h>
#include <string.h>

#include "cobalt.h"

PolychipError *cobalt_op_begin_args(const char *op, uint32_t device, const PolychipStream *stream,
                                    const void *args, size_t size, const char *type) {
    PolychipError *error = cobalt_op_begin(op, device, stream, args, 0, type);
    if (error != NULL) {
        return error;
    }
    size_t got;
    memcpy(&got, args, sizeof got);
    if (got < size) {
        return cobalt_error(POLYCHIP_ERROR_INVALID_ARGUMENT,
                            "cobalt: %s: args->struct_size is %zu bytes, smaller than %s (%zu bytes "
                            "in ABI 1.1, all of them required)",
                            op, got, type, size);
    }
    return NULL;
}

PolychipError *cobalt_views(const char *op, uint32_t device, const cobalt_arg *list, int count) {
    for (int i = 0; i < count; i++) {
        PolychipError *error = cobalt_view_init(list[i].view, list[i].tensor, device, op, list[i].name);
        if (error != NULL) {
            return error;
        }
    }
    return NULL;
}

PolychipError *cobalt_need_float(const char *op, const cobalt_arg *list, int count) {
    const cobalt_view *first = list[0].view;
    cobalt_dtype d = first->dtype;
    if (d != COBALT_F32 && d != COBALT_F16 && d != COBALT_BF16) {
        return cobalt_error(POLYCHIP_ERROR_DTYPE_MISMATCH,
                            "cobalt: %s: %s is %s; %s takes f32, f16 or bf16", op, list[0].name,
                            cobalt_dtype_name(d), op);
    }
    for (int i = 1; i < count; i++) {
        if (list[i].view->dtype != first->dtype) {
            return cobalt_error(POLYCHIP_ERROR_DTYPE_MISMATCH,
                                "cobalt: %s: %s is %s but %s is %s; they must have the same "
                                "floating dtype",
                                op, list[0].name, cobalt_dtype_name(first->dtype), list[i].name,
                                cobalt_dtype_name(list[i].view->dtype));
        }
    }
    return NULL;
}

PolychipError *cobalt_need_f32(const char *op, const char *name, const cobalt_view *v,
                               const char *role) {
    if (v->dtype != COBALT_F32) {
        return cobalt_error(POLYCHIP_ERROR_DTYPE_MISMATCH, "cobalt: %s: %s is %s; %s are always f32",
                            op, name, cobalt_dtype_name(v->dtype), role);
    }
    return NULL;
}

PolychipError *cobalt_need_index(const char *op, const char *name, const cobalt_view *v) {
    if (v->dtype != COBALT_I32 && v->dtype != COBALT_I64) {
        return cobalt_error(POLYCHIP_ERROR_DTYPE_MISMATCH,
                            "cobalt: %s: %s is %s; indices must be i32 or i64", op, name,
                            cobalt_dtype_name(v->dtype));
    }
    return NULL;
}

PolychipError *cobalt_need_same_shapes(const char *op, const cobalt_arg *list, int count) {
    const cobalt_view *first = list[0].view;
    for (int i = 1; i < count; i++) {
        const cobalt_view *v = list[i].view;
        if (!cobalt_same_shape(first->ndim, first->shape, v->ndim, v->shape)) {
            char a[COBALT_SHAPE_STR_BYTES];
            char b[COBALT_SHAPE_STR_BYTES];
            return cobalt_error(POLYCHIP_ERROR_SHAPE_MISMATCH,
                                "cobalt: %s: %s has shape %s but %s has shape %s; they must be equal",
                                op, list[0].name, cobalt_shape_str(a, first->ndim, first->shape),
                                list[i].name, cobalt_shape_str(b, v->ndim, v->shape));
        }
    }
    return NULL;
}

PolychipError *cobalt_need_shape(const char *op, const char *name, const cobalt_view *v,
                                 const char *ref_name, const cobalt_view *ref, int ndim,
                                 const int64_t *shape) {
    if (cobalt_same_shape(v->ndim, v->shape, ndim, shape)) {
        return NULL;
    }
    char got[COBALT_SHAPE_STR_BYTES];
    char r[COBALT_SHAPE_STR_BYTES];
    char want[COBALT_SHAPE_STR_BYTES];
    return cobalt_error(POLYCHIP_ERROR_SHAPE_MISMATCH,
                        "cobalt: %s: %s has shape %s but %s has shape %s; %s must have shape %s", op,
                        name, cobalt_shape_str(got, v->ndim, v->shape), ref_name,
                        cobalt_shape_str(r, ref->ndim, ref->shape), name,
                        cobalt_shape_str(want, ndim, shape));
}

PolychipError *cobalt_need_ndim(const char *op, const char *name, const cobalt_view *v, int ndim,
                                const char *layout) {
    if (v->ndim == ndim) {
        return NULL;
    }
    char s[COBALT_SHAPE_STR_BYTES];
    return cobalt_error(POLYCHIP_ERROR_SHAPE_MISMATCH,
                        "cobalt: %s: %s has shape %s (%d dims) but must have %d dims, %s", op, name,
                        cobalt_shape_str(s, v->ndim, v->shape), v->ndim, ndim, layout);
}

PolychipError *cobalt_need_writable(const char *op, const char *name, const cobalt_view *v) {
    if (v->numel == 0) {
        return NULL;
    }
    /* (|stride|, extent) of the dims with extent > 1, sorted by |stride|. */
    uint64_t stride[COBALT_MAX_DIMS];
    uint64_t extent[COBALT_MAX_DIMS];
    int n = 0;
    for (int k = 0; k < v->ndim; k++) {
        if (v->shape[k] > 1) {
            uint64_t s = v->strides[k] < 0 ? 0u - (uint64_t)v->strides[k] : (uint64_t)v->strides[k];
            int at = n++;
            for (; at > 0 && stride[at - 1] > s; at--) {
                stride[at] = stride[at - 1];
                extent[at] = extent[at - 1];
            }
            stride[at] = s;
            extent[at] = (uint64_t)v->shape[k];
        }
    }
    uint64_t reach = 0; /* elements the smaller dims span; fits: the view lies in memory */
    for (int k = 0; k < n; k++) {
        if (stride[k] <= reach) {
            char s[COBALT_SHAPE_STR_BYTES];
            char t[COBALT_SHAPE_STR_BYTES];
            return cobalt_error(POLYCHIP_ERROR_INVALID_ARGUMENT,
                                "cobalt: %s: output %s with shape %s and strides %s writes some "
                                "elements more than once; outputs must not overlap themselves",
                                op, name, cobalt_shape_str(s, v->ndim, v->shape),
                                cobalt_shape_str(t, v->ndim, v->strides));
        }
        reach += stride[k] * (extent[k] - 1);
    }
    return NULL;
}

PolychipError *cobalt_need_rank1(const char *op, const char *name, const cobalt_view *v,
                                 const char *layout) {
    if (v->ndim >= 1) {
        return NULL;
    }
    return cobalt_error(POLYCHIP_ERROR_SHAPE_MISMATCH,
                        "cobalt: %s: %s is 0-dimensional; it must be %s, with at least 1 dim", op,
                        name, layout);
}

PolychipError *cobalt_load_indices(const char *op, const cobalt_view *view, int64_t **out) {
    PolychipError *error = NULL;
    int64_t *values = cobalt_scratch(op, view->numel, sizeof *values, &error);
    uint8_t *raw = values == NULL ? NULL : cobalt_scratch(op, view->numel, view->elem_size, &error);
    if (raw == NULL) {
        cobalt_scratch_free(values);
        return error;
    }
    cobalt_gather(view, raw);
    for (int64_t i = 0; i < view->numel; i++) {
        if (view->dtype == COBALT_I32) {
            int32_t v;
            memcpy(&v, raw + (size_t)i * sizeof v, sizeof v);
            values[i] = v;
        } else {
            memcpy(&values[i], raw + (size_t)i * sizeof values[i], sizeof values[i]);
        }
    }
    cobalt_scratch_free(raw);
    *out = values;
    return NULL;
}

void cobalt_free_all(void **list, int count) {
    for (int i = 0; i < count; i++) {
        cobalt_scratch_free(list[i]);
    }
}
