/*
 * The Cobalt rotary position embedding of ABI 1.1: rope, and rope_backward
 * (the rotation by -theta, which is both its gradient and its inverse).
 *
 * input and out are [batch, seq, heads, D] with an even D, one floating
 * dtype; cos and sin are f32 [seq, D/2] tables. Pair j of a head is
 * (x[2j], x[2j+1]) when interleaved (GPT-J) and (x[j], x[j + D/2]) otherwise
 * (GPT-NeoX/LLaMA); with c = cos[s][j] and t = sin[s][j] at position s,
 *   rope:          (a, b) -> (a c - b t, a t + b c)
 *   rope_backward: (a, b) -> (a c + b t, b c - a t)
 * computed in double and rounded once. In place (out being exactly input)
 * works: the input is read before out is written.
 */

#include <stdlib.h>

#include "cobalt.h"

static PolychipError *rope(const char *op, double direction, uint32_t device,
                           PolychipStream *stream, const PolychipRopeArgs *args) {
    PolychipError *error = COBALT_BEGIN(op, device, stream, args, PolychipRopeArgs);
    if (error != NULL) {
        return error;
    }
    cobalt_view input, cos_table, sin_table, out;
    const cobalt_arg list[] = {{&input, &args->input, "input"},
                               {&cos_table, &args->cos, "cos"},
                               {&sin_table, &args->sin, "sin"},
                               {&out, &args->out, "out"}};
    error = cobalt_views(op, device, list, 4);
    error = error ? error : cobalt_need_float(op, (const cobalt_arg[]){list[0], list[3]}, 2);
    error = error ? error : cobalt_need_f32(op, "cos", &cos_table, "rope tables");
    error = error ? error : cobalt_need_f32(op, "sin", &sin_table, "rope tables");
    error = error ? error : cobalt_need_ndim(op, "input", &input, 4, "[batch, seq, heads, D]");
    error = error ? error : cobalt_need_same_shapes(op, (const cobalt_arg[]){list[0], list[3]}, 2);
    error = error ? error : cobalt_need_writable(op, "out", &out);
    if (error != NULL) {
        return error;
    }
    int64_t batch = input.shape[0];
    int64_t seq = input.shape[1];
    int64_t heads = input.shape[2];
    int64_t d = input.shape[3];
    if (d % 2 != 0) {
        char s[COBALT_SHAPE_STR_BYTES];
        return cobalt_error(POLYCHIP_ERROR_SHAPE_MISMATCH,
                            "cobalt: %s: input has shape %s; its head_dim D = %lld must be even", op,
                            cobalt_shape_str(s, input.ndim, input.shape), (long long)d);
    }
    int64_t half = d / 2;
    int64_t table[2] = {seq, half};
    error = cobalt_need_shape(op, "cos", &cos_table, "input", &input, 2, table);
    error = error ? error : cobalt_need_shape(op, "sin", &sin_table, "input", &input, 2, table);
    if (error != NULL || input.numel == 0) {
        return error;
    }
    double *x = NULL;
    double *c = NULL;
    double *t = NULL;
    error = cobalt_load_f64(op, &input, &x);
    error = error ? error : cobalt_load_f64(op, &cos_table, &c);
    error = error ? error : cobalt_load_f64(op, &sin_table, &t);
    int interleaved = args->interleaved != 0;
    for (int64_t b = 0; error == NULL && b < batch; b++) {
        for (int64_t s = 0; s < seq; s++) {
            for (int64_t h = 0; h < heads; h++) {
                double *head = x + ((b * seq + s) * heads + h) * d;
                for (int64_t j = 0; j < half; j++) {
                    double *pa = interleaved ? head + 2 * j : head + j;
                    double *pb = interleaved ? head + 2 * j + 1 : head + j + half;
                    double cj = c[s * half + j];
                    double sj = direction * t[s * half + j];
                    double a = *pa;
                    *pa = a * cj - *pb * sj;
                    *pb = a * sj + *pb * cj;
                }
            }
        }
    }
    error = error ? error : cobalt_store_f64(op, &out, x);
    void *all[] = {x, c, t};
    cobalt_free_all(all, 3);
    return error;
}

PolychipError *cobalt_op_rope(uint32_t device, PolychipStream *stream, const PolychipRopeArgs *args) {
    return rope("rope", 1.0, device, stream, args);
}

PolychipError *cobalt_op_rope_backward(uint32_t device, PolychipStream *stream,
                                       const PolychipRopeArgs *args) {
    return rope("rope_backward", -1.0, device, stream, args);
}
