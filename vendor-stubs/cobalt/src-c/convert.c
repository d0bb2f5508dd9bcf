/*
 * Element types of the Cobalt plugin: the mapping from DLPack dtypes, names
 * for messages, the f16 and bf16 conversions, and reading and writing one
 * element of any dtype from and to a plain (decoded) buffer.
 *
 * Narrowing conversions round to nearest even. Doubles are rounded to f16 and
 * bf16 directly, never through float: rounding twice (double to float, then
 * float to f16) gives the wrong answer when the first rounding lands exactly
 * on a halfway point of the second. Floats widen to double exactly, so
 * float-to-f16 goes through the same code. NaN stays a (quiet) NaN, keeping
 * the top payload bits; values beyond the largest finite become infinity.
 */

#include <math.h>
#include <string.h>

#include "cobalt.h"

static const char *const g_names[] = {"f32", "f16", "bf16", "f64", "i32", "i64", "u8", "bool"};
static const size_t g_sizes[] = {4, 2, 2, 8, 4, 8, 1, 1};

const char *cobalt_dtype_name(cobalt_dtype dtype) { return g_names[dtype]; }

size_t cobalt_dtype_size(cobalt_dtype dtype) { return g_sizes[dtype]; }

int cobalt_dtype_is_float(cobalt_dtype dtype) {
    return dtype == COBALT_F32 || dtype == COBALT_F16 || dtype == COBALT_BF16 || dtype == COBALT_F64;
}

int cobalt_dtype_from_abi(PolychipDataType abi, cobalt_dtype *out) {
    static const struct {
        uint8_t code;
        uint8_t bits;
        cobalt_dtype dtype;
    } known[] = {
        {POLYCHIP_DTYPE_CODE_FLOAT, 32, COBALT_F32}, {POLYCHIP_DTYPE_CODE_FLOAT, 16, COBALT_F16},
        {POLYCHIP_DTYPE_CODE_BFLOAT, 16, COBALT_BF16}, {POLYCHIP_DTYPE_CODE_FLOAT, 64, COBALT_F64},
        {POLYCHIP_DTYPE_CODE_INT, 32, COBALT_I32},   {POLYCHIP_DTYPE_CODE_INT, 64, COBALT_I64},
        {POLYCHIP_DTYPE_CODE_UINT, 8, COBALT_U8},    {POLYCHIP_DTYPE_CODE_BOOL, 8, COBALT_BOOL},
    };
    if (abi.lanes != 1) {
        return 0;
    }
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        if (known[i].code == abi.code && known[i].bits == abi.bits) {
            *out = known[i].dtype;
            return 1;
        }
    }
    return 0;
}

/* ---- f16 and bf16 -------------------------------------------------------- */

float cobalt_f16_to_f32(uint16_t bits) {
    uint32_t sign = (uint32_t)(bits & 0x8000u) << 16;
    uint32_t exponent = (bits >> 10) & 0x1Fu;
    uint32_t mantissa = bits & 0x3FFu;
    uint32_t out;
    if (exponent == 0) {
        float magnitude = (float)mantissa * 0x1p-24f; /* zero or subnormal, exact */
        return sign ? -magnitude : magnitude;
    }
    if (exponent == 0x1Fu) {
        out = sign | 0x7F800000u | (mantissa << 13); /* infinity or NaN */
    } else {
        out = sign | ((exponent + 112u) << 23) | (mantissa << 13);
    }
    float value;
    memcpy(&value, &out, sizeof value);
    return value;
}

float cobalt_bf16_to_f32(uint16_t bits) {
    uint32_t out = (uint32_t)bits << 16;
    float value;
    memcpy(&value, &out, sizeof value);
    return value;
}

/*
 * Rounds `value` to nearest even in a binary format with `mantissa_bits`
 * stored mantissa bits and `exponent_bits` exponent bits (IEEE layout, at most
 * 16 bits wide), returning its bit pattern.
 */
static uint16_t round_to_narrow(double value, int mantissa_bits, int exponent_bits) {
    uint64_t bits;
    memcpy(&bits, &value, sizeof bits);
    uint32_t sign = (uint32_t)(bits >> 63) << (mantissa_bits + exponent_bits);
    uint32_t exponent_all = (1u << exponent_bits) - 1u;
    uint32_t infinity = exponent_all << mantissa_bits;
    int bias = (1 << (exponent_bits - 1)) - 1;
    int min_exponent = 1 - bias;
    int double_exponent = (int)((bits >> 52) & 0x7FFu);
    uint64_t double_mantissa = bits & ((1ull << 52) - 1u);

    if (double_exponent == 0x7FF) {
        if (double_mantissa == 0) {
            return (uint16_t)(sign | infinity);
        }
        uint32_t payload = (uint32_t)(double_mantissa >> (52 - mantissa_bits));
        return (uint16_t)(sign | infinity | payload | (1u << (mantissa_bits - 1)));
    }
    if (double_exponent == 0) {
        return (uint16_t)sign; /* zero, or far below the smallest narrow subnormal */
    }
    /* value = m * 2^(e - 52), with m's leading bit set. */
    uint64_t m = double_mantissa | (1ull << 52);
    int e = double_exponent - 1023;
    int shift = 52 - mantissa_bits;
    if (e < min_exponent) {
        shift += min_exponent - e; /* subnormal in the narrow format */
    }
    if (shift > 53) {
        return (uint16_t)sign; /* below half the smallest subnormal */
    }
    uint64_t q = m >> shift;
    uint64_t rest = m & ((1ull << shift) - 1u);
    uint64_t half = 1ull << (shift - 1);
    if (rest > half || (rest == half && (q & 1u))) {
        q++;
    }
    uint64_t magnitude;
    if (e < min_exponent) {
        /* q <= 2^mantissa_bits; reaching it is exactly the smallest normal. */
        magnitude = q;
    } else {
        /* q includes the implicit bit, which adds one to the exponent field;
         * a carry out of the mantissa moves into the exponent correctly. */
        magnitude = ((uint64_t)(e - min_exponent) << mantissa_bits) + q;
        if (magnitude >= infinity) {
            magnitude = infinity;
        }
    }
    return (uint16_t)(sign | (uint32_t)magnitude);
}

uint16_t cobalt_f64_to_f16(double value) { return round_to_narrow(value, 10, 5); }

uint16_t cobalt_f64_to_bf16(double value) { return round_to_narrow(value, 7, 8); }

/* ---- one element --------------------------------------------------------- */

double cobalt_read_f64(cobalt_dtype dtype, const uint8_t *src) {
    switch (dtype) {
    case COBALT_F64: {
        double v;
        memcpy(&v, src, sizeof v);
        return v;
    }
    default:
        return (double)cobalt_read_f32(dtype, src);
    }
}

float cobalt_read_f32(cobalt_dtype dtype, const uint8_t *src) {
    switch (dtype) {
    case COBALT_F32: {
        float v;
        memcpy(&v, src, sizeof v);
        return v;
    }
    case COBALT_F16: {
        uint16_t v;
        memcpy(&v, src, sizeof v);
        return cobalt_f16_to_f32(v);
    }
    case COBALT_BF16: {
        uint16_t v;
        memcpy(&v, src, sizeof v);
        return cobalt_bf16_to_f32(v);
    }
    case COBALT_F64: {
        double v;
        memcpy(&v, src, sizeof v);
        return (float)v;
    }
    default:
        return NAN; /* not reached: callers check for a floating dtype */
    }
}

void cobalt_write_f64(cobalt_dtype dtype, uint8_t *dst, double value) {
    switch (dtype) {
    case COBALT_F32: {
        float v = (float)value; /* the default rounding mode: nearest even */
        memcpy(dst, &v, sizeof v);
        break;
    }
    case COBALT_F16: {
        uint16_t v = cobalt_f64_to_f16(value);
        memcpy(dst, &v, sizeof v);
        break;
    }
    case COBALT_BF16: {
        uint16_t v = cobalt_f64_to_bf16(value);
        memcpy(dst, &v, sizeof v);
        break;
    }
    case COBALT_F64:
        memcpy(dst, &value, sizeof value);
        break;
    case COBALT_I32: {
        int32_t v = isnan(value)              ? 0
                    : value >= 2147483647.0   ? INT32_MAX
                    : value <= -2147483648.0  ? INT32_MIN
                                              : (int32_t)value;
        memcpy(dst, &v, sizeof v);
        break;
    }
    case COBALT_I64: {
        int64_t v = isnan(value)                       ? 0
                    : value >= 9223372036854775808.0   ? INT64_MAX
                    : value < -9223372036854775808.0   ? INT64_MIN
                                                       : (int64_t)value;
        memcpy(dst, &v, sizeof v);
        break;
    }
    case COBALT_U8: {
        uint8_t v = isnan(value) || value <= 0.0 ? 0 : value >= 255.0 ? 255 : (uint8_t)value;
        *dst = v;
        break;
    }
    case COBALT_BOOL:
        *dst = value != 0.0 ? 1 : 0; /* NaN is nonzero */
        break;
    }
}

void cobalt_write_f32(cobalt_dtype dtype, uint8_t *dst, float value) {
    if (dtype == COBALT_F32) {
        memcpy(dst, &value, sizeof value);
    } else {
        cobalt_write_f64(dtype, dst, (double)value); /* widening is exact */
    }
}
