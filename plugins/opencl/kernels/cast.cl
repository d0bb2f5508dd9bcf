// Conversions between the floating dtypes (a program of its own, built
// with PC_BITS=uchar and, where the device has cl_khr_fp64, PC_HAS_FP64).
// Every conversion rounds once, to nearest even: from f16 and bf16 through
// f32 (exact), from f64 directly (vstore_half_rte of a double, and for
// bf16 a round-to-odd step to f32 first, which makes the second rounding
// exact: f32 keeps more than 2 x 8 + 2 bits).

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
#endif
