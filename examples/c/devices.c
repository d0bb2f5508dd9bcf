/*
 * libpolychip from C: list every device of every vendor, move a tensor from
 * one vendor's device to another's, run a matmul there, read the result
 * back, and show what a bad call reports.
 *
 *   cc -std=c11 -I include devices.c -L target/release -lpolychip \
 *      -Wl,-rpath,target/release -o devices && ./devices
 *
 * The bundled plugins beside libpolychip are loaded, and those that
 * POLYCHIP_PLUGIN_PATH names. Exits 0 when every check passes.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "libpolychip.h"

/* Prints and frees an error; returns whether there was one. */
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
    polychip_runtime_options_t options;
    memset(&options, 0, sizeof options);
    options.struct_size = sizeof options;
    if (failed(polychip_runtime_options_init(&options), "options")) {
        return 1;
    }
    polychip_runtime_t *runtime = NULL;
    if (failed(polychip_runtime_new(&options, &runtime), "runtime")) {
        return 1;
    }

    uint32_t count = 0;
    if (failed(polychip_runtime_device_count(runtime, &count), "device count")) {
        return 1;
    }
    /* The first device of the first vendor, and one of another vendor. */
    uint32_t first = 0, other = count;
    const char *first_vendor = NULL;
    for (uint32_t i = 0; i < count; i++) {
        polychip_device_info_t info;
        memset(&info, 0, sizeof info);
        info.struct_size = sizeof info;
        if (failed(polychip_runtime_device_info(runtime, i, &info), "device info")) {
            return 1;
        }
        printf("device %u: %s %s, %.2f GiB%s, %u/%u operators\n", (unsigned)i, info.vendor,
               info.name, (double)info.memory_bytes / (1 << 30),
               info.host_visible ? ", host-visible" : "", (unsigned)info.ops_implemented,
               (unsigned)info.ops_total);
        if (i == 0) {
            first_vendor = info.vendor;
        } else if (other == count && strcmp(info.vendor, first_vendor) != 0) {
            other = i;
        }
    }
    if (count == 0) {
        fprintf(stderr, "no device: no plugin was found\n");
        return 1;
    }
    if (other == count) {
        other = 0; /* one vendor only: stay on it */
    }

    /* a = [[1, 2, 3], [4, 5, 6]] on the first device, b = a^T's shape of ones. */
    const int64_t shape_a[2] = {2, 3};
    const int64_t shape_b[2] = {3, 2};
    const int64_t shape_c[2] = {2, 2};
    const float a_host[6] = {1, 2, 3, 4, 5, 6};
    const float b_host[6] = {1, 1, 1, 1, 1, 1};
    polychip_tensor_t *a = NULL, *b = NULL, *c = NULL, *a_there = NULL;
    if (failed(polychip_tensor_new(runtime, first, POLYCHIP_DTYPE_F32, 2, shape_a, false, &a), "a") ||
        failed(polychip_tensor_write(a, a_host, sizeof a_host), "write a") ||
        failed(polychip_tensor_to_device(a, runtime, other, &a_there), "move a") ||
        failed(polychip_tensor_new(runtime, other, POLYCHIP_DTYPE_F32, 2, shape_b, false, &b), "b") ||
        failed(polychip_tensor_write(b, b_host, sizeof b_host), "write b") ||
        failed(polychip_tensor_new(runtime, other, POLYCHIP_DTYPE_F32, 2, shape_c, true, &c), "c")) {
        return 1;
    }
    printf("moved a from device %u to device %u\n", (unsigned)first, (unsigned)other);

    if (failed(polychip_op_matmul(NULL, a_there, b, c, 1.0, 0.0, false, false), "matmul")) {
        return 1;
    }
    float c_host[4];
    if (failed(polychip_tensor_read(c, c_host, sizeof c_host), "read c")) {
        return 1;
    }
    printf("a @ b = [[%g, %g], [%g, %g]]\n", c_host[0], c_host[1], c_host[2], c_host[3]);
    const float want[4] = {6, 6, 15, 15};
    for (int i = 0; i < 4; i++) {
        if (fabsf(c_host[i] - want[i]) > 1e-5f) {
            fprintf(stderr, "wrong result at %d: %g, want %g\n", i, c_host[i], want[i]);
            return 1;
        }
    }

    /* A bad call: the host names the operator, the argument and the shapes. */
    polychip_error_t *error = polychip_op_matmul(NULL, a_there, a_there, c, 1.0, 0.0, false, false);
    if (error == NULL || polychip_error_code(error) != POLYCHIP_API_ERROR_SHAPE_MISMATCH) {
        fprintf(stderr, "a shape mismatch was not reported as one\n");
        return 1;
    }
    printf("refused: %s\n", polychip_error_message(error));
    polychip_error_destroy(error);

    /* A freed handle is an error, not a crash. */
    polychip_tensor_destroy(b);
    error = polychip_op_matmul(NULL, a_there, b, c, 1.0, 0.0, false, false);
    if (error == NULL) {
        fprintf(stderr, "a freed tensor was accepted\n");
        return 1;
    }
    printf("refused: %s\n", polychip_error_message(error));
    polychip_error_destroy(error);

    polychip_tensor_destroy(a);
    polychip_tensor_destroy(a_there);
    polychip_tensor_destroy(c);
    polychip_runtime_destroy(runtime);
    printf("ok\n");
    return 0;
}
