// FP8 current-tensor scaling (the recipe of reference/src/fp8, after Transformer Engine's
// `compute_scale_from_amax` and its cast kernels) and the FP8 grouped GEMM.
//
// Scopes: a scope is a contiguous element range [bounds[s], bounds[s+1]) of a row-major array
// (`bounds`: int64, scopes + 1 entries, device). Whole tensor: {0, numel}; per group of rows:
// offsets[g] * cols; per expert of (G, K, N) weights: g * K * N.
//
//   amax[s]      = max |x| over scope s, NaN-propagating (one NaN makes amax NaN, hence
//                  scale 1: the reference's decision, reference/src/fp8; TE's C++ amax uses
//                  fmaxf, which drops NaN); an empty scope gives 0
//   scale[s]     = fp8_max / amax[s] in f32 (round to nearest); 1 if amax <= 0 or not finite;
//                  FLT_MAX if the quotient overflows (TE's C++ clamp)
//   scale_inv[s] = 1 / scale[s], correctly rounded (__frcp_rn)
//   q[i]         = sat_rne_fp8(x[i] * scale[s]), the product rounded to f32 first
//   dequant[i]   = decode(q[i]) * scale_inv[s]
//
// The column-wise copy (used by wgrad) is the per-group transpose of the same bytes, sharing
// scale_inv: group g of a (rows, cols) array occupies bytes [off_g*cols, off_{g+1}*cols) in
// both copies, row-wise as (size_g, cols) and column-wise as (cols, size_g).
//
// FP8 grouped GEMM: out = ((sum_i qa_i * qb_i) * sinv_a[g]) * sinv_b[g], each product exact in
// f32 (FP8 significands have at most 4 bits), summed with fmaf in f32 in order of i, output f32.
//   fwd   lhs E4M3 row-wise (M, K), per-group sinv  x rhs E4M3 (G, K, N), per-expert sinv
//   dgrad dout E5M2 row-wise (M, N), per-group sinv x rhs E4M3, per-expert sinv
//   wgrad lhs E4M3 column-wise x dout E5M2 column-wise, both per-group sinv
// Scales are indexed by group/expert id g (length G), never compacted over non-empty groups.
// Tail rows and empty groups are exact zeros (no scale is read for them).
// Fallback, documented: this kernel decodes FP8 to f32 and uses the SIMT tile on every arch;
// it models exact-f32 accumulation, not Hopper's FP8 tensor-core "fast accumulation".
#include "gemm_tile.cuh"

#define FP8_THREADS 256
#define F32_MAX __int_as_float(0x7f7fffff)

MC_DEVICE bool f32_is_finite(float x) {
    return (__float_as_uint(x) & 0x7f800000u) != 0x7f800000u;
}

// max(a, b) that propagates NaN (fmaxf would drop it).
MC_DEVICE float nan_max(float a, float b) {
    if (a != a) return a;
    if (b != b) return b;
    return fmaxf(a, b);
}

// amax: one block per scope (blockIdx.x = s), FP8_THREADS threads.
extern "C" __global__ void __launch_bounds__(FP8_THREADS)
    fp8_amax_f32(const float* x, const idx_t* bounds, int scopes, float* amax) {
    __shared__ float red[FP8_THREADS];
    const int s = blockIdx.x;
    if (s >= scopes) return;
    const idx_t lo = bounds[s], hi = bounds[s + 1];
    float m = 0.0f;
    for (idx_t i = lo + threadIdx.x; i < hi; i += FP8_THREADS) m = nan_max(m, fabsf(x[i]));
    red[threadIdx.x] = m;
    __syncthreads();
    for (int w = FP8_THREADS / 2; w > 0; w /= 2) {
        if ((int)threadIdx.x < w) red[threadIdx.x] = nan_max(red[threadIdx.x], red[threadIdx.x + w]);
        __syncthreads();
    }
    if (threadIdx.x == 0) amax[s] = red[0];
}

// scale / scale_inv from amax, n entries, fp8_max = 448 (E4M3) or 57344 (E5M2).
extern "C" __global__ void fp8_scale_f32(const float* amax, int n, float fp8_max, float* scale,
                                         float* scale_inv) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float a = amax[i];
    float s;
    if (!(a > 0.0f) || !f32_is_finite(a)) {
        s = 1.0f;
    } else {
        s = __fdiv_rn(fp8_max, a);
        if (!f32_is_finite(s)) s = F32_MAX;
    }
    scale[i] = s;
    scale_inv[i] = __frcp_rn(s);
}

// Casts and decodes: blockIdx.y = scope, grid-stride over the scope's elements in x.
#define FP8_CAST(NAME, ENC, DEC)                                                               \
    extern "C" __global__ void fp8_cast_##NAME(const float* x, const idx_t* bounds, int scopes, \
                                                const float* scale, uint8_t* q) {              \
        const int s = blockIdx.y;                                                              \
        if (s >= scopes) return;                                                               \
        const float sc = scale[s];                                                             \
        for (idx_t i = bounds[s] + (idx_t)blockIdx.x * blockDim.x + threadIdx.x;               \
             i < bounds[s + 1]; i += (idx_t)gridDim.x * blockDim.x)                            \
            q[i] = ENC(__fmul_rn(x[i], sc));                                                   \
    }                                                                                          \
    extern "C" __global__ void fp8_decode_##NAME(const uint8_t* q, const idx_t* bounds,         \
                                                  int scopes, const float* scale_inv,          \
                                                  float* out) {                                \
        const int s = blockIdx.y;                                                              \
        if (s >= scopes) return;                                                               \
        const float si = scale_inv[s];                                                         \
        for (idx_t i = bounds[s] + (idx_t)blockIdx.x * blockDim.x + threadIdx.x;               \
             i < bounds[s + 1]; i += (idx_t)gridDim.x * blockDim.x)                            \
            out[i] = __fmul_rn(DEC(q[i]), si);                                                 \
    }

FP8_CAST(e4m3, f32_to_e4m3_sat, e4m3_to_f32)
FP8_CAST(e5m2, f32_to_e5m2_sat, e5m2_to_f32)

// Column-wise copy: for each group g (rows [offsets[g], offsets[g+1]) of a (rows, cols) byte
// array q), qt[off_g*cols + c*size_g + (r - off_g)] = q[r*cols + c]. Grid-stride over the
// offsets[groups] * cols used bytes; tail bytes are not touched.
extern "C" __global__ void fp8_transpose_groups_u8(const uint8_t* q, idx_t cols,
                                                   const int* offsets, int groups, uint8_t* qt) {
    const idx_t used = (idx_t)offsets[groups] * cols;
    for (idx_t i = (idx_t)blockIdx.x * blockDim.x + threadIdx.x; i < used;
         i += (idx_t)gridDim.x * blockDim.x) {
        const idx_t r = i / cols, c = i % cols;
        // The group of row r: the last g with offsets[g] <= r (binary search; empty groups
        // share an offset with their successor, and the search skips them).
        int lo = 0, hi = groups;  // invariant: offsets[lo] <= r < offsets[hi]
        while (hi - lo > 1) {
            const int mid = (lo + hi) / 2;
            if (offsets[mid] <= r) lo = mid; else hi = mid;
        }
        const idx_t off = offsets[lo], size = (idx_t)offsets[lo + 1] - off;
        qt[off * cols + c * size + (r - off)] = q[i];
    }
}

// Scales applied after the f32 sum; exact zero for an empty reduction.
struct ScaleEpi {
    float sa, sb;
    MC_DEVICE float operator()(float acc, idx_t red) const {
        return red == 0 ? 0.0f : __fmul_rn(__fmul_rn(acc, sa), sb);
    }
};

// wgrad operands from the column-wise copies: A(k, j) = lhs_col[lo*K + k*s + j],
// B(j, n) = dout_col[lo*N + n*s + j], s = size_g.
MC_DEVICE Problem<LoadE4m3, LoadE5m2> wgrad_colwise_problem(const uint8_t* lhs_col,
                                                          const uint8_t* dout_col, float* drhs,
                                                          const int* offsets, int g, idx_t k0,
                                                          idx_t rows, idx_t K, idx_t N) {
    const idx_t lo = offsets[g], s = (idx_t)offsets[g + 1] - lo;
    Problem<LoadE4m3, LoadE5m2> p;
    p.a = lhs_col + lo * K + k0 * s; p.a_rs = s; p.a_is = 1;
    p.b = dout_col + lo * N; p.b_is = 1; p.b_cs = s;
    p.c = drhs + (idx_t)g * K * N + k0 * N; p.c_rs = N;
    p.rows = rows; p.cols = N; p.red = s; p.zero = false;
    return p;
}

// Common arguments as in grouped_gemm.cu: offsets int32 (G+1), tiles int32 (num_tiles, 3),
// sizes M, K, N, G; sinv_* f32 (G,) device arrays.
extern "C" __global__ void __launch_bounds__(GG_TILED_THREADS) fp8_grouped_gemm_fwd_e4m3_e4m3(
    const uint8_t* lhs, const uint8_t* rhs, const float* sinv_lhs, const float* sinv_rhs,
    float* out, const int* offsets, const int* tiles, int num_tiles, idx_t M, idx_t K, idx_t N,
    int G) {
    int g; idx_t row0, rows;
    if (!tile_entry(tiles, num_tiles, &g, &row0, &rows) || g >= G || row0 + rows > M) return;
    ScaleEpi epi;
    epi.sa = g < 0 ? 0.0f : sinv_lhs[g];
    epi.sb = g < 0 ? 0.0f : sinv_rhs[g];
    tiled_tile(fwd_problem<LoadE4m3, LoadE4m3>(lhs, rhs, out, g, row0, rows, K, N),
               (idx_t)blockIdx.y * GG_BN, epi);
}

extern "C" __global__ void __launch_bounds__(GG_TILED_THREADS) fp8_grouped_gemm_dgrad_e5m2_e4m3(
    const uint8_t* dout, const uint8_t* rhs, const float* sinv_dout, const float* sinv_rhs,
    float* dlhs, const int* offsets, const int* tiles, int num_tiles, idx_t M, idx_t K, idx_t N,
    int G) {
    int g; idx_t row0, rows;
    if (!tile_entry(tiles, num_tiles, &g, &row0, &rows) || g >= G || row0 + rows > M) return;
    ScaleEpi epi;
    epi.sa = g < 0 ? 0.0f : sinv_dout[g];
    epi.sb = g < 0 ? 0.0f : sinv_rhs[g];
    tiled_tile(dgrad_problem<LoadE5m2, LoadE4m3>(dout, rhs, dlhs, g, row0, rows, K, N),
               (idx_t)blockIdx.y * GG_BN, epi);
}

extern "C" __global__ void __launch_bounds__(GG_TILED_THREADS) fp8_grouped_gemm_wgrad_e4m3_e5m2(
    const uint8_t* lhs_col, const uint8_t* dout_col, const float* sinv_lhs, const float* sinv_dout,
    float* drhs, const int* offsets, const int* tiles, int num_tiles, idx_t M, idx_t K, idx_t N,
    int G) {
    int g; idx_t k0, rows;
    if (!tile_entry(tiles, num_tiles, &g, &k0, &rows) || g < 0 || g >= G || k0 + rows > K) return;
    if (offsets[g + 1] > M) return;
    ScaleEpi epi;
    epi.sa = sinv_lhs[g];
    epi.sb = sinv_dout[g];
    tiled_tile(wgrad_colwise_problem(lhs_col, dout_col, drhs, offsets, g, k0, rows, K, N),
               (idx_t)blockIdx.y * GG_BN, epi);
}
