/*
 * Helpers of the C test driver for the ABI 1.1 operator checks: device
 * buffers filled from and read back into doubles in any floating dtype, an
 * f16/bf16 round-to-nearest-even written independently of the plugin's (with
 * frexp, ldexp and nearbyint), and an array comparison.
 */

#include "driver.h"

void *device_alloc(size_t bytes) {
    void *ptr = NULL;
    OK(P->mem_alloc(0, bytes > 0 ? bytes : 1, &ptr));
    return ptr;
}

/* x rounded to a binary format with `mantissa_bits` stored bits, smallest
 * normal exponent `min_exponent` and largest finite `max_finite`. */
static double round_narrow(double x, int mantissa_bits, int min_exponent, double max_finite) {
    if (isnan(x) || isinf(x) || x == 0.0) {
        return x;
    }
    int e;
    frexp(fabs(x), &e);
    int lead = e - 1 < min_exponent ? min_exponent : e - 1;
    double quantum = ldexp(1.0, lead - mantissa_bits);
    double y = nearbyint(x / quantum) * quantum; /* the default mode: to nearest even */
    if (fabs(y) > max_finite) {
        return x > 0 ? INFINITY : -INFINITY;
    }
    return y;
}

uint16_t to_f16(double value) {
    double r = round_narrow(value, 10, -14, 65504.0);
    if (isnan(r)) {
        return 0x7E00;
    }
    uint16_t sign = signbit(r) ? 0x8000 : 0;
    double a = fabs(r);
    if (isinf(a)) {
        return (uint16_t)(sign | 0x7C00);
    }
    if (a < 0x1p-14) {
        return (uint16_t)(sign | (uint16_t)(a / 0x1p-24));
    }
    int e;
    frexp(a, &e);
    int lead = e - 1;
    uint16_t mantissa = (uint16_t)((ldexp(a, -lead) - 1.0) * 1024.0);
    return (uint16_t)(sign | (uint16_t)((lead + 15) << 10) | mantissa);
}

uint16_t to_bf16(double value) {
    double r = round_narrow(value, 7, -126, 0x1.FEp127);
    if (isnan(r)) {
        return 0x7FC0;
    }
    float f = (float)r; /* exact: every bf16 value is an f32 value */
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    return (uint16_t)(bits >> 16);
}

double from_f16(uint16_t bits) {
    int exponent = (bits >> 10) & 0x1F;
    int mantissa = bits & 0x3FF;
    double sign = bits & 0x8000 ? -1.0 : 1.0;
    if (exponent == 0) {
        return sign * ldexp(mantissa, -24);
    }
    if (exponent == 31) {
        return mantissa ? NAN : sign * INFINITY;
    }
    return sign * ldexp(1024 + mantissa, exponent - 25);
}

double from_bf16(uint16_t bits) { return (double)bits_to_f32((uint32_t)bits << 16); }

static size_t dtype_size(PolychipDataType dtype) { return dtype.bits / 8u; }

static int is(PolychipDataType a, PolychipDataType b) { return a.code == b.code && a.bits == b.bits; }

double round_to(PolychipDataType dtype, double value) {
    if (is(dtype, F16)) {
        return round_narrow(value, 10, -14, 65504.0);
    }
    if (is(dtype, BF16)) {
        return round_narrow(value, 7, -126, 0x1.FEp127);
    }
    if (is(dtype, F32)) {
        return (double)(float)value;
    }
    return value;
}

void *upload_as(PolychipDataType dtype, const double *values, size_t n) {
    size_t size = dtype_size(dtype);
    unsigned char *plain = malloc(n * size + 1);
    CHECK(plain != NULL, "out of host memory");
    for (size_t i = 0; i < n; i++) {
        if (is(dtype, F32)) {
            float v = (float)values[i];
            memcpy(plain + i * size, &v, size);
        } else if (is(dtype, F16) || is(dtype, BF16)) {
            uint16_t v = is(dtype, F16) ? to_f16(values[i]) : to_bf16(values[i]);
            memcpy(plain + i * size, &v, size);
        } else {
            memcpy(plain + i * size, &values[i], size);
        }
    }
    void *ptr = device_alloc(n * size);
    if (n > 0) {
        OK(P->memcpy_h2d(0, NULL, ptr, plain, n * size));
    }
    free(plain);
    return ptr;
}

void download_as(PolychipDataType dtype, double *values, const void *device_src, size_t n) {
    size_t size = dtype_size(dtype);
    unsigned char *plain = malloc(n * size + 1);
    CHECK(plain != NULL, "out of host memory");
    if (n > 0) {
        download(plain, device_src, n * size);
    }
    for (size_t i = 0; i < n; i++) {
        if (is(dtype, F32)) {
            float v;
            memcpy(&v, plain + i * size, size);
            values[i] = v;
        } else if (is(dtype, F16) || is(dtype, BF16)) {
            uint16_t v;
            memcpy(&v, plain + i * size, size);
            values[i] = is(dtype, F16) ? from_f16(v) : from_bf16(v);
        } else {
            memcpy(&values[i], plain + i * size, size);
        }
    }
    free(plain);
}

void check_all_close(const char *what, const double *got, const double *want, size_t n,
                     double tolerance) {
    for (size_t i = 0; i < n; i++) {
        CHECK(close_to(got[i], want[i], tolerance), "%s[%zu] = %.9g, expected %.9g", what, i,
              got[i], want[i]);
    }
}

void numeric_grad(double (*loss)(void), double *values, size_t n, double *grad) {
    const double h = 1e-5;
    for (size_t i = 0; i < n; i++) {
        double saved = values[i];
        values[i] = saved + h;
        double up = loss();
        values[i] = saved - h;
        double down = loss();
        values[i] = saved;
        grad[i] = (up - down) / (2.0 * h);
    }
}
