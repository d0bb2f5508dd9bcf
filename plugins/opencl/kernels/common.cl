// Shared by every program of the OpenCL plugin: the storage type of the
// program's dtype, loads and stores in the compute type, bf16 conversions,
// and strided addressing.
//
// A program is built for one flavour, chosen by a -D option:
//   PC_F32, PC_F64         S = float / double, A (compute) = S
//   PC_F16                 S = half (only through vload_half/vstore_half,
//                          so cl_khr_fp16 is not needed), A = float
//   PC_BF16                S = ushort (the bf16 bits), A = float
//   PC_BITS=uchar|ushort|uint|ulong   copies and fills by element width
// PC_WG is the work-group size row kernels are written for (a power of
// two, at most the device's limit).

#if defined(PC_F64) || defined(PC_HAS_FP64)
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif

// A tensor view: the element offset of element (0, ..., 0) in its buffer,
// and up to 8 dimensions (outer first) with strides in elements (any sign).
typedef struct {
    long offset;
    long shape[8];
    long stride[8];
    int ndim;
    int pad;
} pc_layout;

// The buffer index of the i-th element in row-major order.
inline long pc_at(const pc_layout *l, long i) {
    long off = l->offset;
    for (int d = l->ndim - 1; d > 0; --d) {
        long e = l->shape[d];
        long q = i / e;
        off += (i - q * e) * l->stride[d];
        i = q;
    }
    if (l->ndim > 0) off += i * l->stride[0];
    return off;
}

inline float pc_bf16_to_f32(ushort h) { return as_float(((uint)h) << 16); }

// Round to nearest even; NaN stays NaN (quiet).
inline ushort pc_f32_to_bf16(float f) {
    uint u = as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (ushort)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (ushort)(u >> 16);
}

#if defined(PC_F32)
typedef float S;
typedef float A;
#define LD(p, i) ((p)[i])
#define ST(p, i, v) ((p)[i] = (v))
#elif defined(PC_F64)
typedef double S;
typedef double A;
#define LD(p, i) ((p)[i])
#define ST(p, i, v) ((p)[i] = (v))
#elif defined(PC_F16)
typedef half S;
typedef float A;
#define LD(p, i) vload_half((size_t)(i), (p))
#define ST(p, i, v) vstore_half_rte((float)(v), (size_t)(i), (p))
#elif defined(PC_BF16)
typedef ushort S;
typedef float A;
#define LD(p, i) pc_bf16_to_f32((p)[i])
#define ST(p, i, v) ((p)[i] = pc_f32_to_bf16((float)(v)))
#elif defined(PC_BITS)
typedef PC_BITS S;
#else
#error "build with one of PC_F32, PC_F64, PC_F16, PC_BF16, PC_BITS"
#endif

#if defined(PC_F64)
#define A_MAX DBL_MAX
#define A_INF ((double)INFINITY)
#else
#define A_MAX FLT_MAX
#define A_INF INFINITY
#endif
