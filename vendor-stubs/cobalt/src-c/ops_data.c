/*
 * The Cobalt operators that move or convert data without arithmetic:
 * fill (a scalar into every element, any dtype), copy (same dtype and shape,
 * any strides on either side) and cast (between the floating dtypes,
 * rounding to nearest even once, straight from the exact source value).
 */

#include <stdlib.h>
#include <string.h>

#include "cobalt.h"

PolychipError *cobalt_op_fill(uint32_t device, PolychipStream *stream, const PolychipFillArgs *args) {
    const char *op = "fill";
    PolychipError *error = cobalt_op_begin(op, device, stream, args,
                                           COBALT_FIELD_END(PolychipFillArgs, value), "value");
    cobalt_view out;
    if (error == NULL) {
        error = cobalt_view_init(&out, &args->out, device, op, "out");
    }
    if (error != NULL || out.numel == 0) {
        return error;
    }
    uint8_t element[8];
    cobalt_write_f64(out.dtype, element, args->value);
    uint8_t *plain = cobalt_scratch(op, out.numel, out.elem_size, &error);
    if (plain == NULL) {
        return error;
    }
    for (int64_t i = 0; i < out.numel; i++) {
        memcpy(plain + (size_t)i * out.elem_size, element, out.elem_size);
    }
    cobalt_scatter(&out, plain);
    cobalt_scratch_free(plain);
    return NULL;
}

/* The checks copy and cast share: both views, and equal shapes. */
static PolychipError *check_src_dst(const char *op, uint32_t device, const PolychipTensor *src_tensor,
                                    const PolychipTensor *dst_tensor, cobalt_view *src,
                                    cobalt_view *dst) {
    PolychipError *error = cobalt_view_init(src, src_tensor, device, op, "src");
    if (error == NULL) {
        error = cobalt_view_init(dst, dst_tensor, device, op, "dst");
    }
    if (error != NULL) {
        return error;
    }
    if (!cobalt_same_shape(src->ndim, src->shape, dst->ndim, dst->shape)) {
        char s[COBALT_SHAPE_STR_BYTES];
        char d[COBALT_SHAPE_STR_BYTES];
        return cobalt_error(POLYCHIP_ERROR_SHAPE_MISMATCH,
                            "cobalt: %s: src has shape %s but dst has shape %s; they must be equal",
                            op, cobalt_shape_str(s, src->ndim, src->shape),
                            cobalt_shape_str(d, dst->ndim, dst->shape));
    }
    return NULL;
}

PolychipError *cobalt_op_copy(uint32_t device, PolychipStream *stream, const PolychipCopyArgs *args) {
    const char *op = "copy";
    PolychipError *error =
        cobalt_op_begin(op, device, stream, args, COBALT_FIELD_END(PolychipCopyArgs, dst), "dst");
    cobalt_view src;
    cobalt_view dst;
    if (error == NULL) {
        error = check_src_dst(op, device, &args->src, &args->dst, &src, &dst);
    }
    if (error != NULL) {
        return error;
    }
    if (src.dtype != dst.dtype) {
        return cobalt_error(POLYCHIP_ERROR_DTYPE_MISMATCH,
                            "cobalt: copy: src is %s but dst is %s; copy needs one dtype (use cast "
                            "to convert)",
                            cobalt_dtype_name(src.dtype), cobalt_dtype_name(dst.dtype));
    }
    if (src.numel == 0) {
        return NULL;
    }
    uint8_t *plain = cobalt_scratch(op, src.numel, src.elem_size, &error);
    if (plain == NULL) {
        return error;
    }
    cobalt_gather(&src, plain);
    cobalt_scatter(&dst, plain);
    cobalt_scratch_free(plain);
    return NULL;
}

PolychipError *cobalt_op_cast(uint32_t device, PolychipStream *stream, const PolychipCastArgs *args) {
    const char *op = "cast";
    PolychipError *error =
        cobalt_op_begin(op, device, stream, args, COBALT_FIELD_END(PolychipCastArgs, dst), "dst");
    cobalt_view src;
    cobalt_view dst;
    if (error == NULL) {
        error = check_src_dst(op, device, &args->src, &args->dst, &src, &dst);
    }
    if (error != NULL) {
        return error;
    }
    if (!cobalt_dtype_is_float(src.dtype) || !cobalt_dtype_is_float(dst.dtype)) {
        return cobalt_error(POLYCHIP_ERROR_DTYPE_MISMATCH,
                            "cobalt: cast: src is %s and dst is %s; cast converts only between "
                            "f32, f16, bf16 and f64",
                            cobalt_dtype_name(src.dtype), cobalt_dtype_name(dst.dtype));
    }
    if (src.numel == 0) {
        return NULL;
    }
    /* Every floating value widens to double exactly; then one rounding. */
    double *values;
    error = cobalt_load_f64(op, &src, &values);
    if (error != NULL) {
        return error;
    }
    error = cobalt_store_f64(op, &dst, values);
    cobalt_scratch_free(values);
    return error;
}
