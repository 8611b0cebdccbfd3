// Grouped GEMM: forward, dgrad and wgrad over (lhs, rhs, group offsets), f32 accumulation.
//
// Shapes (row-major): lhs (M, K), rhs (G, K, N), dout (M, N); out (M, N), dlhs (M, K),
// drhs (G, K, N). `offsets` (G + 1 int32, device) are the prefix sums of group_sizes; group g
// owns rows [offsets[g], offsets[g+1]); rows >= offsets[G] are the tail (dropped tokens).
//
//   fwd:   out[r, n]     = sum_k lhs[r, k] * rhs[g, k, n]
//   dgrad: dlhs[r, k]    = sum_n dout[r, n] * rhs[g, k, n]
//   wgrad: drhs[g, k, n] = sum_{r in g} lhs[r, k] * dout[r, n]
//
// Work is split into output tiles by a host-made schedule (src/cuda/plan.rs): `tiles` holds
// `num_tiles` triples {group, row0, rows} (int32, device). For fwd/dgrad, row0/rows are
// absolute output rows inside one group, and group == -1 marks tail rows, which are written
// as exact zeros. For wgrad, row0/rows are K indices of drhs[group]; an empty group has a
// zero-length reduction and gets exact zeros. blockIdx.x is the schedule entry, blockIdx.y
// the column tile. Every output element is written exactly once; nothing else is written.
//
// Two kernels per pass:
// * `tiled`: shared-memory SIMT tiles (64 x 64 x 16, 256 threads, 4 x 4 outputs per
//   thread), fmaf into f32 accumulators, K walked in order. f32, bf16 and f16 inputs.
// * `mma`: tensor cores via `mma.sync.m16n8k16` (sm_80+) for bf16 and f16 inputs, f32
//   accumulators, same 64 x 64 tiles and schedule (128 threads, 2 x 2 warps of 32 x 32).
// Outputs are f32; the host rounds to the declared output dtype.
#include "gemm_tile.cuh"

// ---- tensor-core tile (bf16 / f16) --------------------------------------------------------

MC_DEVICE uint32_t pack2(uint16_t lo, uint16_t hi) { return (uint32_t)lo | ((uint32_t)hi << 16); }

MC_DEVICE float half_to_f32(bool bf16, uint16_t h) { return bf16 ? bf16_to_f32(h) : f16_to_f32(h); }

// d += A (16 x 16) * B (16 x 8) for one warp, fragments as documented at mma_tile.
template <bool BF16>
MC_DEVICE void mma_16816(float* d, const uint32_t* a, const uint32_t* b) {
#if defined(MC_HOST)
    // CPU tests only: the warp-collective instruction emulated through the block barrier
    // (every warp of the block reaches each mma at the same point, as in mma_tile). Each
    // lane publishes its registers; each lane then rebuilds its four outputs from the
    // documented fragment layout.
    static uint32_t ra[GG_MMA_THREADS / 32][32][4];
    static uint32_t rb[GG_MMA_THREADS / 32][32][2];
    const int w = threadIdx.x / 32, l = threadIdx.x % 32;
    for (int i = 0; i < 4; ++i) ra[w][l][i] = a[i];
    for (int i = 0; i < 2; ++i) rb[w][l][i] = b[i];
    __syncthreads();
    const int gid = l / 4, t = l % 4;
    float out[4];
    for (int v = 0; v < 4; ++v) {
        const int row = gid + (v >= 2 ? 8 : 0), col = 2 * t + (v & 1);
        float sum = d[v];
        for (int kk = 0; kk < 16; ++kk) {
            const int la = (row % 8) * 4 + (kk % 8) / 2;  // lane holding A(row, kk)
            const uint32_t wa = ra[w][la][(row >= 8 ? 1 : 0) + (kk >= 8 ? 2 : 0)];
            const int lb = col * 4 + (kk % 8) / 2;  // lane holding B(kk, col)
            const uint32_t wb = rb[w][lb][kk >= 8 ? 1 : 0];
            const uint16_t ha = (uint16_t)((kk & 1) ? (wa >> 16) : (wa & 0xffffu));
            const uint16_t hb = (uint16_t)((kk & 1) ? (wb >> 16) : (wb & 0xffffu));
            sum += half_to_f32(BF16, ha) * half_to_f32(BF16, hb);
        }
        out[v] = sum;
    }
    __syncthreads();
    for (int v = 0; v < 4; ++v) d[v] = out[v];
#elif __CUDA_ARCH__ >= 800
    if (BF16) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
            "{%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
            "{%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
#else
    __trap();
#endif
}

// The tensor-core tile: 128 threads = 4 warps in 2 x 2; warp (wm, wn) owns rows 32 wm ..+32
// and columns 32 wn ..+32: 2 x 4 mma tiles of 16 x 8. Operands are staged in shared memory
// as raw 16-bit values, A as As[r][i] and B as Bs[c][i] (K contiguous), zero-padded.
// Fragment layouts (PTX ISA, mma.m16n8k16 .bf16/.f16): with gid = lane / 4, t = lane % 4,
// A regs {(gid, 2t..2t+1), (gid+8, 2t..), (gid, 2t+8..), (gid+8, 2t+8..)}, B regs
// {(k 2t..2t+1, n gid), (k 2t+8.., n gid)}, C {(gid, 2t), (gid, 2t+1), (gid+8, 2t),
// (gid+8, 2t+1)}; the lower column / k index sits in the low half of each register.
template <bool BF16>
MC_DEVICE void mma_tile(const Problem<LoadBf16, LoadBf16>& p, idx_t col0) {
    __shared__ uint16_t As[GG_BM][GG_BK + 8];
    __shared__ uint16_t Bs[GG_BN][GG_BK + 8];
    const int tid = threadIdx.x;
    const int warp = tid / 32, lane = tid % 32;
    const int wm = warp / 2, wn = warp % 2;
    const int gid = lane / 4, t = lane % 4;
    float acc[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int v = 0; v < 4; ++v) acc[i][j][v] = 0.0f;

    if (!p.zero) {
        for (idx_t k0 = 0; k0 < p.red; k0 += GG_BK) {
            for (int e = tid; e < GG_BM * GG_BK; e += GG_MMA_THREADS) {
                // Consecutive threads walk the operand's contiguous index (coalesced loads):
                // k for a row-major A, rows for a transposed one. Both orders visit each
                // (r, i) of the tile exactly once.
                const bool k_fast = p.a_is == 1;
                const int i = k_fast ? e % GG_BK : e / GG_BM;
                const int r = k_fast ? e / GG_BK : e % GG_BM;
                const idx_t gi = k0 + i;
                As[r][i] = (r < p.rows && gi < p.red) ? p.a[r * p.a_rs + gi * p.a_is] : (uint16_t)0;
            }
            for (int e = tid; e < GG_BK * GG_BN; e += GG_MMA_THREADS) {
                const bool n_fast = p.b_cs == 1;
                const int c = n_fast ? e % GG_BN : e / GG_BK;
                const int i = n_fast ? e / GG_BN : e % GG_BK;
                const idx_t gi = k0 + i, gc = col0 + c;
                Bs[c][i] = (gc < p.cols && gi < p.red) ? p.b[gi * p.b_is + gc * p.b_cs] : (uint16_t)0;
            }
            __syncthreads();
            uint32_t af[2][4], bfr[4][2];
#pragma unroll
            for (int mi = 0; mi < 2; ++mi) {
                const int r = 32 * wm + 16 * mi + gid;
                af[mi][0] = pack2(As[r][2 * t], As[r][2 * t + 1]);
                af[mi][1] = pack2(As[r + 8][2 * t], As[r + 8][2 * t + 1]);
                af[mi][2] = pack2(As[r][2 * t + 8], As[r][2 * t + 9]);
                af[mi][3] = pack2(As[r + 8][2 * t + 8], As[r + 8][2 * t + 9]);
            }
#pragma unroll
            for (int ni = 0; ni < 4; ++ni) {
                const int c = 32 * wn + 8 * ni + gid;
                bfr[ni][0] = pack2(Bs[c][2 * t], Bs[c][2 * t + 1]);
                bfr[ni][1] = pack2(Bs[c][2 * t + 8], Bs[c][2 * t + 9]);
            }
#pragma unroll
            for (int mi = 0; mi < 2; ++mi)
#pragma unroll
                for (int ni = 0; ni < 4; ++ni) mma_16816<BF16>(acc[mi][ni], af[mi], bfr[ni]);
            __syncthreads();
        }
    }
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) {
#pragma unroll
            for (int v = 0; v < 4; ++v) {
                const idx_t r = 32 * wm + 16 * mi + gid + (v >= 2 ? 8 : 0);
                const idx_t c = col0 + 32 * wn + 8 * ni + 2 * t + (v & 1);
                if (r < p.rows && c < p.cols) p.c[r * p.c_rs + c] = p.zero ? 0.0f : acc[mi][ni][v];
            }
        }
    }
}

// ---- entry points -------------------------------------------------------------------------
// Common arguments (all device pointers unless noted):
//   offsets  int32 (G + 1)        prefix sums of group_sizes
//   tiles    int32 (num_tiles, 3) the schedule
//   M, K, N, G                    sizes (host values)

#define GG_TILED(NAME, LOAD)                                                                   \
    extern "C" __global__ void __launch_bounds__(GG_TILED_THREADS)                             \
        grouped_gemm_fwd_tiled_##NAME(const LOAD::T* lhs, const LOAD::T* rhs, float* out,      \
                                      const int* offsets, const int* tiles, int num_tiles,     \
                                      idx_t M, idx_t K, idx_t N, int G) {                      \
        int g; idx_t row0, rows;                                                               \
        if (!tile_entry(tiles, num_tiles, &g, &row0, &rows) || g >= G || row0 + rows > M)      \
            return;                                                                            \
        tiled_tile(fwd_problem<LOAD, LOAD>(lhs, rhs, out, g, row0, rows, K, N),                \
                   (idx_t)blockIdx.y * GG_BN, Identity());                                     \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(GG_TILED_THREADS)                             \
        grouped_gemm_dgrad_tiled_##NAME(const LOAD::T* dout, const LOAD::T* rhs, float* dlhs,  \
                                        const int* offsets, const int* tiles, int num_tiles,   \
                                        idx_t M, idx_t K, idx_t N, int G) {                    \
        int g; idx_t row0, rows;                                                               \
        if (!tile_entry(tiles, num_tiles, &g, &row0, &rows) || g >= G || row0 + rows > M)      \
            return;                                                                            \
        tiled_tile(dgrad_problem<LOAD, LOAD>(dout, rhs, dlhs, g, row0, rows, K, N),            \
                   (idx_t)blockIdx.y * GG_BN, Identity());                                     \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(GG_TILED_THREADS)                             \
        grouped_gemm_wgrad_tiled_##NAME(const LOAD::T* lhs, const LOAD::T* dout, float* drhs,  \
                                        const int* offsets, const int* tiles, int num_tiles,   \
                                        idx_t M, idx_t K, idx_t N, int G) {                    \
        int g; idx_t k0, rows;                                                                 \
        if (!tile_entry(tiles, num_tiles, &g, &k0, &rows) || g < 0 || g >= G || k0 + rows > K) \
            return;                                                                            \
        if (offsets[g + 1] > M) return;                                                        \
        tiled_tile(wgrad_problem<LOAD, LOAD>(lhs, dout, drhs, offsets, g, k0, rows, K, N),     \
                   (idx_t)blockIdx.y * GG_BN, Identity());                                     \
    }

GG_TILED(f32, LoadF32)
GG_TILED(bf16, LoadBf16)
GG_TILED(f16, LoadF16)

// The mma kernels read the raw 16-bit operands, so the loader type only fixes T = uint16_t.
#define GG_MMA(NAME, IS_BF16)                                                                  \
    extern "C" __global__ void __launch_bounds__(GG_MMA_THREADS)                               \
        grouped_gemm_fwd_mma_##NAME(const uint16_t* lhs, const uint16_t* rhs, float* out,      \
                                    const int* offsets, const int* tiles, int num_tiles,       \
                                    idx_t M, idx_t K, idx_t N, int G) {                        \
        int g; idx_t row0, rows;                                                               \
        if (!tile_entry(tiles, num_tiles, &g, &row0, &rows) || g >= G || row0 + rows > M)      \
            return;                                                                            \
        mma_tile<IS_BF16>(fwd_problem<LoadBf16, LoadBf16>(lhs, rhs, out, g, row0, rows, K, N), \
                          (idx_t)blockIdx.y * GG_BN);                                          \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(GG_MMA_THREADS)                               \
        grouped_gemm_dgrad_mma_##NAME(const uint16_t* dout, const uint16_t* rhs, float* dlhs,  \
                                      const int* offsets, const int* tiles, int num_tiles,     \
                                      idx_t M, idx_t K, idx_t N, int G) {                      \
        int g; idx_t row0, rows;                                                               \
        if (!tile_entry(tiles, num_tiles, &g, &row0, &rows) || g >= G || row0 + rows > M)      \
            return;                                                                            \
        mma_tile<IS_BF16>(                                                                     \
            dgrad_problem<LoadBf16, LoadBf16>(dout, rhs, dlhs, g, row0, rows, K, N),           \
            (idx_t)blockIdx.y * GG_BN);                                                        \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(GG_MMA_THREADS)                               \
        grouped_gemm_wgrad_mma_##NAME(const uint16_t* lhs, const uint16_t* dout, float* drhs,  \
                                      const int* offsets, const int* tiles, int num_tiles,     \
                                      idx_t M, idx_t K, idx_t N, int G) {                      \
        int g; idx_t k0, rows;                                                                 \
        if (!tile_entry(tiles, num_tiles, &g, &k0, &rows) || g < 0 || g >= G || k0 + rows > K) \
            return;                                                                            \
        if (offsets[g + 1] > M) return;                                                        \
        mma_tile<IS_BF16>(                                                                     \
            wgrad_problem<LoadBf16, LoadBf16>(lhs, dout, drhs, offsets, g, k0, rows, K, N),    \
            (idx_t)blockIdx.y * GG_BN);                                                        \
    }

GG_MMA(bf16, true)
GG_MMA(f16, false)

// Poison / fill: p[i] = value for i < n (device pointer p, n floats). Grid-stride.
extern "C" __global__ void fill_f32(float* p, idx_t n, float value) {
    for (idx_t i = (idx_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (idx_t)gridDim.x * blockDim.x)
        p[i] = value;
}

// Poison for 16-bit outputs: p[i] = bits for i < n (0xffff is NaN in bf16 and f16).
extern "C" __global__ void fill_u16(uint16_t* p, idx_t n, uint16_t bits) {
    for (idx_t i = (idx_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (idx_t)gridDim.x * blockDim.x)
        p[i] = bits;
}
