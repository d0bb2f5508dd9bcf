/*
 * libpolychip from C: an all-reduce over the ranks of a job, each rank on
 * its own device (rank r takes device r of the runtime, so two ranks use
 * two vendors' devices when both bundled plugins are there).
 *
 *   polychip launch -n 2 -- ./allreduce
 *
 * Each rank fills a tensor with rank + 1, sums it across ranks, and checks
 * the sum: world * (world + 1) / 2.
 */
#include <stdio.h>
#include <string.h>

#include "libpolychip.h"

static int failed(polychip_error_t *error, const char *what) {
    if (error == NULL) {
        return 0;
    }
    fprintf(stderr, "%s: %s (code %u)\n", what, polychip_error_message(error),
            (unsigned)polychip_error_code(error));
    polychip_error_destroy(error);
    return 1;
}

int main(void) {
    polychip_runtime_t *runtime = NULL;
    polychip_comm_t *comm = NULL;
    if (failed(polychip_runtime_new(NULL, &runtime), "runtime") ||
        failed(polychip_comm_init_env(&comm), "comm")) {
        return 1;
    }
    uint32_t rank = 0, world = 0, count = 0;
    if (failed(polychip_comm_rank(comm, &rank, &world), "rank") ||
        failed(polychip_runtime_device_count(runtime, &count), "device count") || count == 0) {
        return 1;
    }
    uint32_t device = rank % count;
    polychip_device_info_t info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    if (failed(polychip_runtime_device_info(runtime, device, &info), "device info")) {
        return 1;
    }
    const int64_t shape[1] = {1000};
    polychip_tensor_t *t = NULL;
    if (failed(polychip_tensor_new(runtime, device, POLYCHIP_DTYPE_F32, 1, shape, false, &t), "tensor") ||
        failed(polychip_op_fill(NULL, t, (double)(rank + 1)), "fill") ||
        failed(polychip_comm_all_reduce(comm, t, POLYCHIP_REDUCE_SUM), "all-reduce")) {
        return 1;
    }
    float out[1000];
    if (failed(polychip_tensor_read(t, out, sizeof out), "read")) {
        return 1;
    }
    const float want = (float)(world * (world + 1) / 2);
    for (int i = 0; i < 1000; i++) {
        if (out[i] != want) {
            fprintf(stderr, "rank %u: element %d is %g, want %g\n", (unsigned)rank, i, out[i], want);
            return 1;
        }
    }
    printf("rank %u of %u on %s %s: all-reduce sum %g ok\n", (unsigned)rank, (unsigned)world,
           info.vendor, info.name, want);
    polychip_tensor_destroy(t);
    if (failed(polychip_comm_destroy(comm), "comm destroy")) {
        return 1;
    }
    polychip_runtime_destroy(runtime);
    return 0;
}
