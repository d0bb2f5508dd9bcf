/*
 * The Cobalt cross-entropy loss of ABI 1.1 and its backward, for logits
 * [N, C] (floating) against class targets [N] (i32 or i64):
 *
 *   cross_entropy           loss = mean over counted rows of (logsumexp(row) - row[target])
 *   cross_entropy_backward  grad_logits = grad_loss * (softmax(row) - onehot(target)) / count
 *
 * A row whose target equals ignore_index is not counted (its gradient is
 * zero); count is the number of rows counted. With no counted row the loss
 * is NaN (0 / 0) and the gradient is all zeros. A target outside [0, C) that
 * is not ignore_index is an INVALID_ARGUMENT error, raised before anything is
 * written. logsumexp subtracts the row maximum first; rows are computed in
 * double. loss is a 0-dim f32; grad_logits has logits' shape and dtype.
 */

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>

#include "cobalt.h"

/* log(sum(exp(row))), subtracting the maximum first. */
static double logsumexp(const double *row, int64_t c) {
    double max = -INFINITY;
    for (int64_t j = 0; j < c; j++) {
        max = row[j] > max || isnan(row[j]) ? row[j] : max;
    }
    double sum = 0.0;
    for (int64_t j = 0; j < c; j++) {
        sum += exp(row[j] - max);
    }
    return max + log(sum);
}

/*
 * The checks both operators share: logits [N, C] floating, targets [N] of
 * indices, each in [0, C) or equal to ignore_index. Loads logits and targets.
 */
static PolychipError *check(const char *op, const cobalt_arg *list, int64_t ignore_index,
                            double **out_logits, int64_t **out_targets) {
    const cobalt_view *logits = list[0].view;
    const cobalt_view *targets = list[1].view;
    PolychipError *error = cobalt_need_float(op, list, 1);
    error = error ? error : cobalt_need_ndim(op, "logits", logits, 2, "[N, C]");
    error = error ? error : cobalt_need_index(op, "targets", targets);
    error = error ? error
                  : cobalt_need_shape(op, "targets", targets, "logits", logits, 1, logits->shape);
    if (error != NULL) {
        return error;
    }
    int64_t c = logits->shape[1];
    int64_t *t = NULL;
    error = cobalt_load_indices(op, targets, &t);
    for (int64_t i = 0; error == NULL && i < targets->numel; i++) {
        if (t[i] != ignore_index && (t[i] < 0 || t[i] >= c)) {
            error = cobalt_error(POLYCHIP_ERROR_INVALID_ARGUMENT,
                                 "cobalt: %s: targets[%" PRId64 "] is %" PRId64 ", outside [0, %" PRId64
                                 ") for logits of shape [%" PRId64 ", %" PRId64
                                 "], and it is not ignore_index (%" PRId64 ")",
                                 op, i, t[i], c, logits->shape[0], c, ignore_index);
        }
    }
    double *x = NULL;
    error = error ? error : cobalt_load_f64(op, logits, &x);
    if (error != NULL) {
        cobalt_scratch_free(t);
        return error;
    }
    *out_logits = x;
    *out_targets = t;
    return NULL;
}

PolychipError *cobalt_op_cross_entropy(uint32_t device, PolychipStream *stream,
                                       const PolychipCrossEntropyArgs *args) {
    const char *op = "cross_entropy";
    PolychipError *error = COBALT_BEGIN(op, device, stream, args, PolychipCrossEntropyArgs);
    if (error != NULL) {
        return error;
    }
    cobalt_view logits, targets, loss;
    const cobalt_arg list[] = {{&logits, &args->logits, "logits"},
                               {&targets, &args->targets, "targets"},
                               {&loss, &args->loss, "loss"}};
    error = cobalt_views(op, device, list, 3);
    error = error ? error : cobalt_need_f32(op, "loss", &loss, "losses");
    error = error ? error : cobalt_need_shape(op, "loss", &loss, "logits", &logits, 0, NULL);
    double *x = NULL;
    int64_t *t = NULL;
    error = error ? error : check(op, list, args->ignore_index, &x, &t);
    if (error != NULL) {
        return error;
    }
    int64_t n = logits.shape[0];
    int64_t c = logits.shape[1];
    double total = 0.0;
    int64_t count = 0;
    for (int64_t i = 0; i < n; i++) {
        if (t[i] != args->ignore_index) {
            total += logsumexp(x + i * c, c) - x[i * c + t[i]];
            count++;
        }
    }
    double mean = total / (double)count; /* NaN when every row is ignored */
    error = cobalt_store_f64(op, &loss, &mean);
    cobalt_scratch_free(x);
    cobalt_scratch_free(t);
    return error;
}

PolychipError *cobalt_op_cross_entropy_backward(uint32_t device, PolychipStream *stream,
                                                const PolychipCrossEntropyBackwardArgs *args) {
    const char *op = "cross_entropy_backward";
    PolychipError *error = COBALT_BEGIN(op, device, stream, args, PolychipCrossEntropyBackwardArgs);
    if (error != NULL) {
        return error;
    }
    cobalt_view logits, targets, grad_logits;
    const cobalt_arg list[] = {{&logits, &args->logits, "logits"},
                               {&targets, &args->targets, "targets"},
                               {&grad_logits, &args->grad_logits, "grad_logits"}};
    error = cobalt_views(op, device, list, 3);
    error = error ? error : cobalt_need_float(op, (const cobalt_arg[]){list[0], list[2]}, 2);
    error = error ? error : cobalt_need_same_shapes(op, (const cobalt_arg[]){list[0], list[2]}, 2);
    error = error ? error : cobalt_need_writable(op, "grad_logits", &grad_logits);
    double *x = NULL;
    int64_t *t = NULL;
    error = error ? error : check(op, list, args->ignore_index, &x, &t);
    if (error != NULL) {
        return error;
    }
    int64_t n = logits.shape[0];
    int64_t c = logits.shape[1];
    int64_t count = 0;
    for (int64_t i = 0; i < n; i++) {
        count += t[i] != args->ignore_index;
    }
    for (int64_t i = 0; i < n; i++) {
        double *row = x + i * c;
        if (t[i] == args->ignore_index) {
            for (int64_t j = 0; j < c; j++) {
                row[j] = 0.0;
            }
            continue;
        }
        double lse = logsumexp(row, c);
        for (int64_t j = 0; j < c; j++) {
            double p = exp(row[j] - lse);
            row[j] = args->grad_loss * (p - (j == t[i] ? 1.0 : 0.0)) / (double)count;
        }
    }
    error = cobalt_store_f64(op, &grad_logits, x);
    cobalt_scratch_free(x);
    cobalt_scratch_free(t);
    return error;
}
