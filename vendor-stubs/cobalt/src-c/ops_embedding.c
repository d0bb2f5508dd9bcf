/*
 * The Cobalt embedding operators of ABI 1.1:
 *   embedding           out[i..., :] = weight[indices[i...], :]
 *   embedding_backward  grad_weight[indices[i...], :] += grad_out[i..., :]
 *
 * weight and grad_weight are [V, H], floating; indices are i32 or i64 of any
 * shape (0-dim included); out and grad_out are [indices..., H] in weight's
 * dtype. Every index is checked to lie in [0, V) before anything is written:
 * one outside is an INVALID_ARGUMENT error naming its position and value.
 * The lookup copies elements bit for bit. The backward accumulates into
 * grad_weight: repeated indices add up, in double, and each touched row is
 * rounded once at the end.
 */

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cobalt.h"

/*
 * The checks both operators share: table [V, H] (named `table_name`), rows
 * [indices..., H] (named `rows_name`), indices in range; loads the indices.
 */
static PolychipError *check(const char *op, const cobalt_arg *table, const cobalt_arg *rows,
                            const cobalt_arg *indices, int64_t **out_indices) {
    const cobalt_arg pair[] = {*table, *rows};
    const cobalt_view *t = table->view;
    const cobalt_view *ix = indices->view;
    PolychipError *error = cobalt_need_float(op, pair, 2);
    error = error ? error : cobalt_need_ndim(op, table->name, t, 2, "[V, H]");
    error = error ? error : cobalt_need_index(op, indices->name, ix);
    if (error != NULL) {
        return error;
    }
    if (ix->ndim + 1 > COBALT_MAX_DIMS) {
        return cobalt_error(POLYCHIP_ERROR_UNIMPLEMENTED,
                            "cobalt: %s: indices has %d dims, so %s would have %d; cobalt supports "
                            "at most %d",
                            op, ix->ndim, rows->name, ix->ndim + 1, COBALT_MAX_DIMS);
    }
    int64_t shape[COBALT_MAX_DIMS];
    memcpy(shape, ix->shape, (size_t)ix->ndim * sizeof shape[0]);
    shape[ix->ndim] = t->shape[1];
    error = cobalt_need_shape(op, rows->name, rows->view, indices->name, ix, ix->ndim + 1, shape);
    if (error != NULL) {
        return error;
    }
    int64_t *values = NULL;
    error = cobalt_load_indices(op, ix, &values);
    for (int64_t i = 0; error == NULL && i < ix->numel; i++) {
        if (values[i] < 0 || values[i] >= t->shape[0]) {
            char s[COBALT_SHAPE_STR_BYTES];
            error = cobalt_error(POLYCHIP_ERROR_INVALID_ARGUMENT,
                                 "cobalt: %s: element %" PRId64 " (row-major) of indices is %" PRId64
                                 ", outside [0, %" PRId64 ") for %s of shape %s",
                                 op, i, values[i], t->shape[0], table->name,
                                 cobalt_shape_str(s, t->ndim, t->shape));
        }
    }
    if (error != NULL) {
        cobalt_scratch_free(values);
        return error;
    }
    *out_indices = values;
    return NULL;
}

PolychipError *cobalt_op_embedding(uint32_t device, PolychipStream *stream,
                                   const PolychipEmbeddingArgs *args) {
    const char *op = "embedding";
    PolychipError *error =
        COBALT_BEGIN(op, device, stream, args, PolychipEmbeddingArgs);
    if (error != NULL) {
        return error;
    }
    cobalt_view weight, indices, out;
    const cobalt_arg list[] = {{&weight, &args->weight, "weight"},
                               {&indices, &args->indices, "indices"},
                               {&out, &args->out, "out"}};
    int64_t *ix = NULL;
    error = cobalt_views(op, device, list, 3);
    error = error ? error : cobalt_need_writable(op, "out", &out);
    error = error ? error : check(op, &list[0], &list[2], &list[1], &ix);
    if (error != NULL) {
        return error;
    }
    if (out.numel > 0) {
        size_t row_bytes = (size_t)weight.shape[1] * weight.elem_size;
        uint8_t *table = cobalt_scratch(op, weight.numel, weight.elem_size, &error);
        uint8_t *plain = table == NULL ? NULL : cobalt_scratch(op, out.numel, out.elem_size, &error);
        if (plain != NULL) {
            cobalt_gather(&weight, table);
            for (int64_t i = 0; i < indices.numel; i++) {
                memcpy(plain + (size_t)i * row_bytes, table + (size_t)ix[i] * row_bytes, row_bytes);
            }
            cobalt_scatter(&out, plain);
        }
        cobalt_scratch_free(table);
        cobalt_scratch_free(plain);
    }
    cobalt_scratch_free(ix);
    return error;
}

PolychipError *cobalt_op_embedding_backward(uint32_t device, PolychipStream *stream,
                                            const PolychipEmbeddingBackwardArgs *args) {
    const char *op = "embedding_backward";
    PolychipError *error = COBALT_BEGIN(op, device, stream, args, PolychipEmbeddingBackwardArgs);
    if (error != NULL) {
        return error;
    }
    cobalt_view grad_out, indices, grad_weight;
    const cobalt_arg list[] = {{&grad_out, &args->grad_out, "grad_out"},
                               {&indices, &args->indices, "indices"},
                               {&grad_weight, &args->grad_weight, "grad_weight"}};
    int64_t *ix = NULL;
    error = cobalt_views(op, device, list, 3);
    error = error ? error : cobalt_need_writable(op, "grad_weight", &grad_weight);
    error = error ? error : check(op, &list[2], &list[0], &list[1], &ix);
    if (error != NULL) {
        return error;
    }
    if (grad_out.numel > 0) {
        int64_t h = grad_weight.shape[1];
        double *table = NULL;
        double *rows = NULL;
        error = cobalt_load_f64(op, &grad_weight, &table);
        error = error ? error : cobalt_load_f64(op, &grad_out, &rows);
        for (int64_t i = 0; error == NULL && i < indices.numel; i++) {
            double *dst = table + ix[i] * h;
            for (int64_t j = 0; j < h; j++) {
                dst[j] += rows[i * h + j];
            }
        }
        error = error ? error : cobalt_store_f64(op, &grad_weight, table);
        cobalt_scratch_free(table);
        cobalt_scratch_free(rows);
    }
    cobalt_scratch_free(ix);
    return error;
}
