// Host entry points over the kernels compiled as C++ (see shim.hpp). Each `mc_*` function
// launches kernels exactly as src/cuda/ does on the GPU (same grids, same arguments).
#define MC_HOST 1
#include "shim.hpp"
#include "../../kernels/grouped_gemm.cu"
#include "../../kernels/fp8.cu"
#include "../../kernels/routing.cu"

extern "C" {

// pass 0 fwd / 1 dgrad / 2 wgrad; dtype 0 f32 / 1 bf16 / 2 f16. a, b, out as in
// grouped_gemm.cu; tiles from plan_tiles; grid (gx, gy).
int mc_grouped_gemm_tiled(int pass, int dtype, const void* a, const void* b, float* out,
                          const int* offsets, const int* tiles, int num_tiles, long long M,
                          long long K, long long N, int G, unsigned gx, unsigned gy) {
#define MC_CASE(PASS_ID, DT_ID, FN, T)                                                        \
    if (pass == PASS_ID && dtype == DT_ID) {                                                 \
        mc_launch(mc_dim3{gx, gy, 1}, mc_dim3{GG_TILED_THREADS, 1, 1}, [&] {                 \
            FN((const T*)a, (const T*)b, out, offsets, tiles, num_tiles, M, K, N, G);        \
        });                                                                                  \
        return 0;                                                                            \
    }
    MC_CASE(0, 0, grouped_gemm_fwd_tiled_f32, float)
    MC_CASE(0, 1, grouped_gemm_fwd_tiled_bf16, uint16_t)
    MC_CASE(0, 2, grouped_gemm_fwd_tiled_f16, uint16_t)
    MC_CASE(1, 0, grouped_gemm_dgrad_tiled_f32, float)
    MC_CASE(1, 1, grouped_gemm_dgrad_tiled_bf16, uint16_t)
    MC_CASE(1, 2, grouped_gemm_dgrad_tiled_f16, uint16_t)
    MC_CASE(2, 0, grouped_gemm_wgrad_tiled_f32, float)
    MC_CASE(2, 1, grouped_gemm_wgrad_tiled_bf16, uint16_t)
    MC_CASE(2, 2, grouped_gemm_wgrad_tiled_f16, uint16_t)
#undef MC_CASE
    return -1;
}

// The tensor-core kernels with the emulated mma (dtype 1 bf16 / 2 f16), 128 threads.
int mc_grouped_gemm_mma(int pass, int dtype, const void* a, const void* b, float* out,
                        const int* offsets, const int* tiles, int num_tiles, long long M,
                        long long K, long long N, int G, unsigned gx, unsigned gy) {
#define MC_CASE(PASS_ID, DT_ID, FN)                                                           \
    if (pass == PASS_ID && dtype == DT_ID) {                                                 \
        mc_launch(mc_dim3{gx, gy, 1}, mc_dim3{GG_MMA_THREADS, 1, 1}, [&] {                   \
            FN((const uint16_t*)a, (const uint16_t*)b, out, offsets, tiles, num_tiles, M, K, \
               N, G);                                                                        \
        });                                                                                  \
        return 0;                                                                            \
    }
    MC_CASE(0, 1, grouped_gemm_fwd_mma_bf16)
    MC_CASE(0, 2, grouped_gemm_fwd_mma_f16)
    MC_CASE(1, 1, grouped_gemm_dgrad_mma_bf16)
    MC_CASE(1, 2, grouped_gemm_dgrad_mma_f16)
    MC_CASE(2, 1, grouped_gemm_wgrad_mma_bf16)
    MC_CASE(2, 2, grouped_gemm_wgrad_mma_f16)
#undef MC_CASE
    return -1;
}

void mc_fill_f32(float* p, long long n, float value, unsigned blocks) {
    mc_launch(mc_dim3{blocks, 1, 1}, mc_dim3{256, 1, 1}, [&] { fill_f32(p, n, value); });
}

// fmt 0 E4M3, 1 E5M2.
unsigned char mc_encode(int fmt, float x) { return fmt == 0 ? f32_to_e4m3_sat(x) : f32_to_e5m2_sat(x); }
float mc_decode(int fmt, unsigned char q) { return fmt == 0 ? e4m3_to_f32(q) : e5m2_to_f32(q); }

// The recipe over scopes, launched as src/cuda/fp8.rs does.
void mc_fp8_quantize(int fmt, const float* x, const long long* bounds, int scopes, float* amax,
                     float* scale, float* scale_inv, unsigned char* q, unsigned cast_blocks) {
    mc_launch(mc_dim3{(unsigned)scopes, 1, 1}, mc_dim3{FP8_THREADS, 1, 1},
              [&] { fp8_amax_f32(x, bounds, scopes, amax); });
    const float fmax = fmt == 0 ? 448.0f : 57344.0f;
    mc_launch(mc_dim3{((unsigned)scopes + 255) / 256, 1, 1}, mc_dim3{256, 1, 1},
              [&] { fp8_scale_f32(amax, scopes, fmax, scale, scale_inv); });
    if (cast_blocks > 0)
        mc_launch(mc_dim3{cast_blocks, (unsigned)scopes, 1}, mc_dim3{256, 1, 1}, [&] {
            if (fmt == 0) fp8_cast_e4m3(x, bounds, scopes, scale, q);
            else fp8_cast_e5m2(x, bounds, scopes, scale, q);
        });
}

void mc_fp8_transpose(const unsigned char* q, long long cols, const int* offsets, int groups,
                      unsigned char* qt, unsigned blocks) {
    mc_launch(mc_dim3{blocks, 1, 1}, mc_dim3{256, 1, 1},
              [&] { fp8_transpose_groups_u8(q, cols, offsets, groups, qt); });
}

// pass 0 fwd (lhs E4M3, rhs E4M3), 1 dgrad (dout E5M2, rhs E4M3), 2 wgrad (lhs_col E4M3,
// dout_col E5M2).
void mc_fp8_gemm(int pass, const unsigned char* a, const unsigned char* b, const float* sa,
                 const float* sb, float* out, const int* offsets, const int* tiles, int num_tiles,
                 long long M, long long K, long long N, int G, unsigned gx, unsigned gy) {
    mc_launch(mc_dim3{gx, gy, 1}, mc_dim3{GG_TILED_THREADS, 1, 1}, [&] {
        if (pass == 0)
            fp8_grouped_gemm_fwd_e4m3_e4m3(a, b, sa, sb, out, offsets, tiles, num_tiles, M, K, N, G);
        else if (pass == 1)
            fp8_grouped_gemm_dgrad_e5m2_e4m3(a, b, sa, sb, out, offsets, tiles, num_tiles, M, K, N, G);
        else
            fp8_grouped_gemm_wgrad_e4m3_e5m2(a, b, sa, sb, out, offsets, tiles, num_tiles, M, K, N, G);
    });
}

// Routing: selection, capacity and permutation, launched with RT_THREADS-thread blocks.
void mc_routing(const float* scores, const float* bias, int T, int E, int K, int n_groups,
                int topk_groups, int S, int capacity, int* indices, float* weights,
                unsigned char* kept, int* group_sizes, int* offsets, int* positions) {
    const unsigned tb = ((unsigned)T + RT_THREADS - 1) / RT_THREADS;
    const unsigned eb = ((unsigned)E + RT_THREADS - 1) / RT_THREADS;
    const unsigned eb1 = ((unsigned)E + 1 + RT_THREADS - 1) / RT_THREADS;
    const unsigned seqs = S > 0 ? ((unsigned)T + S - 1) / S : 0;
    const long long TK = (long long)T * K;
    mc_launch(mc_dim3{tb, 1, 1}, mc_dim3{RT_THREADS, 1, 1}, [&] {
        routing_topk(scores, bias, T, E, K, n_groups, topk_groups, 0, 0, 1.0f, indices, weights);
    });
    mc_launch(mc_dim3{eb, seqs, 1}, mc_dim3{RT_THREADS, 1, 1},
              [&] { routing_capacity_position(indices, T, K, E, S, capacity, kept); });
    mc_launch(mc_dim3{eb, 1, 1}, mc_dim3{RT_THREADS, 1, 1},
              [&] { routing_group_sizes(indices, kept, TK, E, group_sizes); });
    offsets[0] = 0;
    for (int e = 0; e < E; ++e) offsets[e + 1] = offsets[e] + group_sizes[e];
    mc_launch(mc_dim3{eb1, 1, 1}, mc_dim3{RT_THREADS, 1, 1},
              [&] { routing_permute_index(indices, kept, TK, E, offsets, positions); });
}

}  // extern "C"
