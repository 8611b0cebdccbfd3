// The tile machinery shared by the grouped GEMM kernels (grouped_gemm.cu) and the FP8
// grouped GEMM (fp8.cu): per-tile sub-problems, the schedule entry, and the SIMT tile.
#pragma once
#include "common.cuh"

#define GG_BM 64
#define GG_BN 64
#define GG_BK 16
#define GG_TILED_THREADS 256
#define GG_MMA_THREADS 128

// One tile's sub-problem: C(r, c) = sum_i A(r, i) * B(i, c) for r < rows, c < cols,
// i < red, with A(r, i) = a[r * a_rs + i * a_is], B(i, c) = b[i * b_is + c * b_cs],
// C(r, c) = c[r * c_rs + c]. `zero`: write zeros (a tail tile).
template <class LA, class LB>
struct Problem {
    const typename LA::T* a;
    idx_t a_rs, a_is;
    const typename LB::T* b;
    idx_t b_is, b_cs;
    float* c;
    idx_t c_rs;
    idx_t rows, cols, red;
    bool zero;
};

// The three passes as sub-problems of one schedule entry. M, K, N as above.
template <class LA, class LB>
MC_DEVICE Problem<LA, LB> fwd_problem(const typename LA::T* lhs, const typename LB::T* rhs,
                                      float* out, int g, idx_t row0, idx_t rows, idx_t K,
                                      idx_t N) {
    Problem<LA, LB> p;
    p.a = lhs + row0 * K; p.a_rs = K; p.a_is = 1;
    p.b = rhs + (g < 0 ? 0 : (idx_t)g * K * N); p.b_is = N; p.b_cs = 1;
    p.c = out + row0 * N; p.c_rs = N;
    p.rows = rows; p.cols = N; p.red = K; p.zero = g < 0;
    return p;
}
template <class LA, class LB>
MC_DEVICE Problem<LA, LB> dgrad_problem(const typename LA::T* dout, const typename LB::T* rhs,
                                        float* dlhs, int g, idx_t row0, idx_t rows, idx_t K,
                                        idx_t N) {
    Problem<LA, LB> p;
    p.a = dout + row0 * N; p.a_rs = N; p.a_is = 1;
    p.b = rhs + (g < 0 ? 0 : (idx_t)g * K * N); p.b_is = 1; p.b_cs = N;
    p.c = dlhs + row0 * K; p.c_rs = K;
    p.rows = rows; p.cols = K; p.red = N; p.zero = g < 0;
    return p;
}
// wgrad from row-major lhs/dout (the reduction runs down the group's rows).
template <class LA, class LB>
MC_DEVICE Problem<LA, LB> wgrad_problem(const typename LA::T* lhs, const typename LB::T* dout,
                                        float* drhs, const int* offsets, int g, idx_t k0,
                                        idx_t rows, idx_t K, idx_t N) {
    const idx_t lo = offsets[g], hi = offsets[g + 1];
    Problem<LA, LB> p;
    p.a = lhs + lo * K + k0; p.a_rs = 1; p.a_is = K;
    p.b = dout + lo * N; p.b_is = N; p.b_cs = 1;
    p.c = drhs + (idx_t)g * K * N + k0 * N; p.c_rs = N;
    p.rows = rows; p.cols = N; p.red = hi - lo; p.zero = false;
    return p;
}

// The SIMT tile: 256 threads as 16 x 16; thread (ty, tx) owns rows ty + 16 i and columns
// tx + 16 j (i, j < 4) of the 64 x 64 tile starting at column col0. The result of each output
// is `epilogue(acc)`.
template <class LA, class LB, class Epi>
MC_DEVICE void tiled_tile(const Problem<LA, LB>& p, idx_t col0, Epi epilogue) {
    __shared__ float As[GG_BK][GG_BM + 1];
    __shared__ float Bs[GG_BK][GG_BN + 1];
    const int tid = threadIdx.x;
    const int tx = tid % 16, ty = tid / 16;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

    if (!p.zero) {
        for (idx_t k0 = 0; k0 < p.red; k0 += GG_BK) {
#ifdef MC_PLANT_SKIP_PARTIAL_K  // never defined on the GPU: tests/host_kernels/harness.rs plants it
            if (k0 + GG_BK > p.red) break;
#endif
            for (int e = tid; e < GG_BM * GG_BK; e += GG_TILED_THREADS) {
                // Consecutive threads walk the operand's contiguous index (coalesced loads):
                // k for a row-major A, rows for a transposed one. Both orders visit each
                // (r, i) of the tile exactly once.
                const bool k_fast = p.a_is == 1;
                const int i = k_fast ? e % GG_BK : e / GG_BM;
                const int r = k_fast ? e / GG_BK : e % GG_BM;
                const idx_t gi = k0 + i;
                As[i][r] = (r < p.rows && gi < p.red) ? LA::get(p.a, r * p.a_rs + gi * p.a_is)
                                                      : 0.0f;
            }
            for (int e = tid; e < GG_BK * GG_BN; e += GG_TILED_THREADS) {
                const bool n_fast = p.b_cs == 1;
                const int c = n_fast ? e % GG_BN : e / GG_BK;
                const int i = n_fast ? e / GG_BN : e % GG_BK;
                const idx_t gi = k0 + i, gc = col0 + c;
                Bs[i][c] = (gc < p.cols && gi < p.red) ? LB::get(p.b, gi * p.b_is + gc * p.b_cs)
                                                       : 0.0f;
            }
            __syncthreads();
#pragma unroll
            for (int i = 0; i < GG_BK; ++i) {
#pragma unroll
                for (int a = 0; a < 4; ++a) {
                    const float av = As[i][ty + 16 * a];
#pragma unroll
                    for (int b = 0; b < 4; ++b) acc[a][b] = fmaf(av, Bs[i][tx + 16 * b], acc[a][b]);
                }
            }
            __syncthreads();
        }
    }
#pragma unroll
    for (int a = 0; a < 4; ++a) {
        const idx_t r = ty + 16 * a;
#pragma unroll
        for (int b = 0; b < 4; ++b) {
            const idx_t c = col0 + tx + 16 * b;
            if (r < p.rows && c < p.cols) {
                p.c[r * p.c_rs + c] = p.zero ? 0.0f : epilogue(acc[a][b], p.red);
            }
        }
    }
}

struct Identity {
    MC_DEVICE float operator()(float x, idx_t) const { return x; }
};

// Reads schedule entry blockIdx.x; false when out of range (never, with a correct grid).
MC_DEVICE bool tile_entry(const int* tiles, int num_tiles, int* g, idx_t* row0, idx_t* rows) {
    const int t = blockIdx.x;
    if (t >= num_tiles) return false;
    *g = tiles[3 * t];
    *row0 = tiles[3 * t + 1];
    *rows = tiles[3 * t + 2];
    return *row0 >= 0 && *rows >= 1 && *rows <= GG_BM;
}

