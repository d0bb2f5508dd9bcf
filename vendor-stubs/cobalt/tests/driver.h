/*
 * Shared declarations of the C test driver (driver.c and driver_*.c): the
 * host's error object, the checking macros, the plugin under test, dtypes,
 * device buffers and tensor descriptors, f16/bf16 conversions for expected
 * values, and the check functions each driver_*.c file defines.
 */

#ifndef COBALT_DRIVER_H
#define COBALT_DRIVER_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "polychip.h"

/* The host's error objects (malloc'd {code, message}). */
struct PolychipError {
    PolychipErrorCode code;
    char *message;
};

void host_error_destroy(void *ctx, PolychipError *error);

#define CHECK(cond, ...)                                                          \
    do {                                                                          \
        if (!(cond)) {                                                            \
            fprintf(stderr, "FAILED at %s:%d: %s\n  ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                         \
            fputc('\n', stderr);                                                  \
            exit(1);                                                              \
        }                                                                         \
    } while (0)

void expect_ok_at(PolychipError *error, const char *what, const char *file, int line);
void expect_error_at(PolychipError *error, PolychipErrorCode code, const char *what,
                     const char *file, int line);
/* The call must succeed. */
#define OK(call) expect_ok_at((call), #call, __FILE__, __LINE__)
/* The call must fail with `code` and a non-empty message (printed). */
#define ERR(code, call) expect_error_at((call), (code), #call, __FILE__, __LINE__)

/* |got - want| <= tolerance * max(|want|, 1); NaN and infinities must match. */
int close_to(double got, double want, double tolerance);

/* The plugin under test and its operator table. */
extern const PolychipPluginApi *P;
extern const PolychipOpTable *OPS;

extern const PolychipDataType F32, F16, BF16, F64, I32, I64, U8, BOOL;

/* Device buffers on device 0: allocate and copy in, copy out, free. */
void *upload(const void *src, size_t bytes);
void download(void *dst, const void *device_src, size_t bytes);
void release(void *ptr);
/* A descriptor on device 0. */
PolychipTensor tensor(void *data, PolychipDataType dtype, int32_t ndim, const int64_t *shape,
                      const int64_t *strides, uint64_t byte_offset);
float bits_to_f32(uint32_t bits);

/* ---- driver_util.c ------------------------------------------------------- */

/* An uninitialised device buffer of `bytes` (at least 1). */
void *device_alloc(size_t bytes);
/* n doubles uploaded as f32, f16 or bf16 (rounded to nearest even). */
void *upload_as(PolychipDataType dtype, const double *values, size_t n);
/* n elements of f32, f16, bf16 or f64 downloaded as doubles. */
void download_as(PolychipDataType dtype, double *values, const void *device_src, size_t n);
/* Round to nearest even, and back. */
uint16_t to_f16(double value);
uint16_t to_bf16(double value);
double from_f16(uint16_t bits);
double from_bf16(uint16_t bits);
/* Rounds a double to what storing it as `dtype` gives, exactly. */
double round_to(PolychipDataType dtype, double value);
/*
 * Central differences: grad[i] = d loss() / d values[i] for i < n, where
 * loss() reads `values` (perturbed in turn by +-1e-5, then restored).
 */
void numeric_grad(double (*loss)(void), double *values, size_t n, double *grad);
/* Every got[i] within tolerance of want[i], or fails naming `what` and i. */
void check_all_close(const char *what, const double *got, const double *want, size_t n,
                     double tolerance);

/* ---- the ABI 1.1 operator checks ---------------------------------------- */

void check_unary_ops(void);          /* driver_unary.c */
void check_reduce_ops(void);         /* driver_reduce.c */
void check_norm_ops(void);           /* driver_norm.c */
void check_attention_ops(void);      /* driver_attention.c */
void check_training_ops(void);       /* driver_training.c */

#endif /* COBALT_DRIVER_H */
