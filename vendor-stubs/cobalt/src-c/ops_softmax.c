/*
 * The Cobalt softmax over the last dimension: out = exp(x - max) / sum.
 *
 * Each row's maximum is subtracted first, so large logits do not overflow.
 * f32, f16 and bf16 are computed in f32 (each output rounded once), f64 in
 * f64. NaN propagates to its whole row, and so does a row of all -inf
 * (-inf - -inf is NaN). A 0-dim tensor is one row of one element. In place
 * (out being exactly input) works: the input is read first.
 */

#include <math.h>
#include <stdlib.h>

#include "cobalt.h"

static void softmax_rows_f32(float *x, int64_t rows, int64_t length) {
    for (int64_t r = 0; r < rows; r++) {
        float *row = x + r * length;
        float max = -INFINITY;
        for (int64_t j = 0; j < length; j++) {
            max = row[j] > max ? row[j] : max;
        }
        /* The sum in double: an f32 running sum of a vocabulary-wide row
         * (152K to millions of terms) drifts by up to 1e-3 relative,
         * which every probability of the row inherits. */
        double sum = 0.0;
        for (int64_t j = 0; j < length; j++) {
            row[j] = expf(row[j] - max);
            sum += row[j];
        }
        for (int64_t j = 0; j < length; j++) {
            row[j] = (float)((double)row[j] / sum);
        }
    }
}

static void softmax_rows_f64(double *x, int64_t rows, int64_t length) {
    for (int64_t r = 0; r < rows; r++) {
        double *row = x + r * length;
        double max = -INFINITY;
        for (int64_t j = 0; j < length; j++) {
            max = row[j] > max ? row[j] : max;
        }
        double sum = 0.0;
        for (int64_t j = 0; j < length; j++) {
            row[j] = exp(row[j] - max);
            sum += row[j];
        }
        for (int64_t j = 0; j < length; j++) {
            row[j] /= sum;
        }
    }
}

PolychipError *cobalt_op_softmax(uint32_t device, PolychipStream *stream,
                                 const PolychipSoftmaxArgs *args) {
    const char *op = "softmax";
    PolychipError *error =
        cobalt_op_begin(op, device, stream, args, COBALT_FIELD_END(PolychipSoftmaxArgs, out), "out");
    cobalt_view input;
    cobalt_view out;
    if (error == NULL) {
        error = cobalt_view_init(&input, &args->input, device, op, "input");
    }
    if (error == NULL) {
        error = cobalt_view_init(&out, &args->out, device, op, "out");
    }
    if (error != NULL) {
        return error;
    }
    if (input.dtype != out.dtype || !cobalt_dtype_is_float(input.dtype)) {
        return cobalt_error(POLYCHIP_ERROR_DTYPE_MISMATCH,
                            "cobalt: softmax: input is %s and out is %s; both must have the same "
                            "floating dtype (f32, f16, bf16 or f64)",
                            cobalt_dtype_name(input.dtype), cobalt_dtype_name(out.dtype));
    }
    if (!cobalt_same_shape(input.ndim, input.shape, out.ndim, out.shape)) {
        char si[COBALT_SHAPE_STR_BYTES];
        char so[COBALT_SHAPE_STR_BYTES];
        return cobalt_error(POLYCHIP_ERROR_SHAPE_MISMATCH,
                            "cobalt: softmax: input has shape %s but out has shape %s; they must be "
                            "equal",
                            cobalt_shape_str(si, input.ndim, input.shape),
                            cobalt_shape_str(so, out.ndim, out.shape));
    }
    if (input.numel == 0) {
        return NULL;
    }
    int64_t length = input.ndim > 0 ? input.shape[input.ndim - 1] : 1;
    int64_t rows = input.numel / length;
    if (input.dtype == COBALT_F64) {
        double *x;
        error = cobalt_load_f64(op, &input, &x);
        if (error == NULL) {
            softmax_rows_f64(x, rows, length);
            error = cobalt_store_f64(op, &out, x);
            cobalt_scratch_free(x);
        }
    } else {
        float *x;
        error = cobalt_load_f32(op, &input, &x);
        if (error == NULL) {
            softmax_rows_f32(x, rows, length);
            error = cobalt_store_f32(op, &out, x);
            cobalt_scratch_free(x);
        }
    }
    return error;
}
