// Conversions between the floating dtypes (a program of its own, built
// with PC_BITS=uchar and, where the device has cl_khr_fp64, PC_HAS_FP64).
// Every conversion rounds once, to nearest even: from f16 and bf16 through
// f32 (exact), from f64 directly (vstore_half_rte of a double, and for
// bf16 a round-to-odd step to f32 first, which makes the second rounding
// exact: f32 keeps more than 2 x 8 + 2 bits).

#pragma OPENCL FP_CONTRACT OFF

#define T_F32 float
#define T_F16 half
#define T_BF16 ushort
#define T_F64 double
#define LD_F32(p, i) ((p)[i])
#define LD_F16(p, i) vload_half((size_t)(i), (p))
#define LD_BF16(p, i) pc_bf16_to_f32((p)[i])
#define LD_F64(p, i) ((p)[i])
#define ST_F32(p, i, v) ((p)[i] = (v))
#define ST_F16(p, i, v) vstore_half_rte((v), (size_t)(i), (p))
#define ST_BF16(p, i, v) ((p)[i] = pc_f32_to_bf16(v))

#define PC_CAST(FROM, TO)                                                         \
    __kernel void pc_cast_##FROM##_##TO(__global const T_##FROM *src, pc_layout sl, \
                                        __global T_##TO *dst, pc_layout dl, long n) { \
        long i = get_global_id(0);                                                \
        if (i >= n) return;                                                       \
        ST_##TO(dst, pc_at(&dl, i), LD_##FROM(src, pc_at(&sl, i)));               \
    }

PC_CAST(F32, F32)
PC_CAST(F32, F16)
PC_CAST(F32, BF16)
PC_CAST(F16, F32)
PC_CAST(F16, F16)
PC_CAST(F16, BF16)
PC_CAST(BF16, F32)
PC_CAST(BF16, F16)
PC_CAST(BF16, BF16)

#ifdef PC_HAS_FP64
// f64 -> bf16: round to odd into f32, then to nearest even into bf16.
inline ushort pc_f64_to_bf16(double d) {
    float f = convert_float_rtz(d);
    if (isnan(d)) return (ushort)0x7fc0;
    if ((double)f != d && !isinf(f)) f = as_float(as_uint(f) | 1u);
    return pc_f32_to_bf16(f);
}
#define ST64_F32(p, i, v) ((p)[i] = convert_float_rte(v))
#define ST64_F16(p, i, v) vstore_half_rte((v), (size_t)(i), (p))
#define ST64_BF16(p, i, v) ((p)[i] = pc_f64_to_bf16(v))
#define ST64_F64(p, i, v) ((p)[i] = (v))

#define PC_CAST64(TO)                                                             \
    __kernel void pc_cast_F64_##TO(__global const double *src, pc_layout sl,      \
                                   __global T_##TO *dst, pc_layout dl, long n) {  \
        long i = get_global_id(0);                                                \
        if (i >= n) return;                                                       \
        ST64_##TO(dst, pc_at(&dl, i), src[pc_at(&sl, i)]);                        \
    }
PC_CAST64(F32)
PC_CAST64(F16)
PC_CAST64(BF16)
PC_CAST64(F64)

#define PC_CAST_TO64(FROM)                                                        \
    __kernel void pc_cast_##FROM##_F64(__global const T_##FROM *src, pc_layout sl, \
                                       __global double *dst, pc_layout dl, long n) { \
        long i = get_global_id(0);                                                \
        if (i >= n) return;                                                       \
        dst[pc_at(&dl, i)] = (double)LD_##FROM(src, pc_at(&sl, i));               \
    }
PC_CAST_TO64(F32)
PC_CAST_TO64(F16)
PC_CAST_TO64(BF16)

// ABI 1.3's convert, between any two dtypes (codes: 0 f32, 1 f16, 2 bf16,
// 3 f64, 4 i32, 5 i64, 6 u8, 7 bool), on byte buffers with each operand's
// layout in its own elements. A float goes through a double (exact), an
// integer through a long (exact); each store rounds once: to a float to
// nearest even (a long to f16 or bf16 through a double rounded to odd),
// a double to an integer toward zero with saturation (NaN to 0), a long to
// a narrower integer by its low bits (two's complement), to bool != 0.
inline double pc_long_to_double_odd(long x) {
    double r = convert_double_rtz(x);
    if (convert_long(r) != x) r = as_double(as_ulong(r) | 1UL);
    return r;
}

// Stores a value read as a long (is_int) or a double as element di of
// dtype dd, with convert's rules.
inline void pc_store_any(__global uchar *dst, long di, int dd, int is_int, long l, double d) {
    switch (dd) {
    case 0:
        ((__global float *)dst)[di] = is_int ? convert_float_rte(l) : convert_float_rte(d);
        break;
    case 1:
        vstore_half_rte(is_int ? pc_long_to_double_odd(l) : d, (size_t)di, (__global half *)dst);
        break;
    case 2:
        ((__global ushort *)dst)[di] = pc_f64_to_bf16(is_int ? pc_long_to_double_odd(l) : d);
        break;
    case 3:
        ((__global double *)dst)[di] = is_int ? convert_double_rte(l) : d;
        break;
    case 4:
        ((__global int *)dst)[di] = is_int ? (int)l : convert_int_sat_rtz(d);
        break;
    case 5:
        ((__global long *)dst)[di] = is_int ? l : convert_long_sat_rtz(d);
        break;
    case 6:
        dst[di] = is_int ? (uchar)l : convert_uchar_sat_rtz(d);
        break;
    default:
        dst[di] = (uchar)(is_int ? l != 0 : d != 0.0);
        break;
    }
}

__kernel void pc_convert(__global const uchar *src, pc_layout sl, int sd, __global uchar *dst,
                         pc_layout dl, int dd, long n) {
    long i = get_global_id(0);
    if (i >= n) return;
    long si = pc_at(&sl, i);
    long di = pc_at(&dl, i);
    int is_int = sd >= 4;
    double d = 0.0;
    long l = 0;
    switch (sd) {
    case 0: d = (double)((__global const float *)src)[si]; break;
    case 1: d = (double)vload_half((size_t)si, (__global const half *)src); break;
    case 2: d = (double)pc_bf16_to_f32(((__global const ushort *)src)[si]); break;
    case 3: d = ((__global const double *)src)[si]; break;
    case 4: l = (long)((__global const int *)src)[si]; break;
    case 5: l = ((__global const long *)src)[si]; break;
    default: l = (long)src[si]; break;
    }
    pc_store_any(dst, di, dd, is_int, l, d);
}

// ABI 1.3's arange: start + i * step in double (FP_CONTRACT is off: a
// product and a sum, each rounded), stored as convert stores a double.
__kernel void pc_arange(__global uchar *dst, pc_layout dl, int dd, double start, double step,
                        long n) {
    long i = get_global_id(0);
    if (i >= n) return;
    double product = (double)i * step;
    pc_store_any(dst, pc_at(&dl, i), dd, 0, 0, start + product);
}
#endif
