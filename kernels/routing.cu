// Routing (issue 3's reference, reference/src/routing): scores, group-limited top-k, capacity
// dropping (position policy), and permute / unpermute producing group_sizes.
//
// Shapes (row-major, device): logits / scores (T, E) f32; bias (E,) f32 or null; indices
// (T, K) int32; weights (T, K) f32; kept (T, K) uint8; group_sizes (E,) int32; positions
// (T*K,) int32. Assignment a = t*K + k ("token-major, slot-minor", the order that decides
// capacity dropping and the order of the stable sort by expert).
//
// Ties are broken toward the lower index, always: every selection scans indices upward and
// replaces the current best only on a strictly greater value.
// One thread per token / per expert: simple and deterministic, not fast (routing is O(T*E)).
#include "common.cuh"

#define RT_THREADS 128
#define RT_MAX_K 64
#define RT_MAX_GROUPS 64
#define RT_NEG_INF __int_as_float(0xff800000)

// scores[t, e] from logits: kind 0 softmax over all E; 1 sigmoid; 2 copy (topk-softmax selects
// on logits and normalises the k selected in routing_topk). f32 math (expf, IEEE division).
extern "C" __global__ void routing_scores(const float* logits, int T, int E, int kind,
                                          float* scores) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= T) return;
    const float* x = logits + (idx_t)t * E;
    float* s = scores + (idx_t)t * E;
    if (kind == 0) {
        float m = RT_NEG_INF;
        for (int e = 0; e < E; ++e) m = fmaxf(m, x[e]);
        float sum = 0.0f;
        for (int e = 0; e < E; ++e) sum += expf(x[e] - m);
        for (int e = 0; e < E; ++e) s[e] = expf(x[e] - m) / sum;
    } else if (kind == 1) {
        for (int e = 0; e < E; ++e) s[e] = 1.0f / (1.0f + expf(-x[e]));
    } else {
        for (int e = 0; e < E; ++e) s[e] = x[e];
    }
}

// Group-limited top-k with lower-index tie-break.
//   sel[e] = scores[t, e] + (bias ? bias[e] : 0)          (selection only)
//   n_groups > 1: group score = sum of its top-2 sel values (top-1 when a group has one expert);
//   the best topk_groups groups are kept, the other experts cannot be chosen.
//   indices[t, j] = j-th best allowed expert by sel (j < K).
//   weights[t, j] = scores[t, indices[t, j]] (pre-bias), then
//     softmax_selected: exp(w_j - max) / sum over the k selected (topk-softmax),
//     norm: w_j / (sum_j w_j + 1e-20),
//     times scaling.
// Requires K <= RT_MAX_K, n_groups <= RT_MAX_GROUPS, n_groups divides E (checked on the host).
extern "C" __global__ void routing_topk(const float* scores, const float* bias, int T, int E,
                                        int K, int n_groups, int topk_groups,
                                        int softmax_selected, int norm, float scaling,
                                        int* indices, float* weights) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= T || K > RT_MAX_K || n_groups > RT_MAX_GROUPS || n_groups < 1) return;
    const float* s = scores + (idx_t)t * E;
    const int per_group = E / n_groups;
    bool group_ok[RT_MAX_GROUPS];
    for (int g = 0; g < n_groups; ++g) group_ok[g] = (n_groups == 1);
    if (n_groups > 1) {
        float gscore[RT_MAX_GROUPS];
        for (int g = 0; g < n_groups; ++g) {
            float b1 = RT_NEG_INF, b2 = RT_NEG_INF;
            for (int e = g * per_group; e < (g + 1) * per_group; ++e) {
                const float v = s[e] + (bias ? bias[e] : 0.0f);
                if (v > b1) { b2 = b1; b1 = v; } else if (v > b2) { b2 = v; }
            }
            gscore[g] = per_group >= 2 ? b1 + b2 : b1;
        }
        for (int j = 0; j < topk_groups && j < n_groups; ++j) {
            int best = -1;
            for (int g = 0; g < n_groups; ++g)
                if (!group_ok[g] && (best < 0 || gscore[g] > gscore[best])) best = g;
            if (best >= 0) group_ok[best] = true;
        }
    }
    int* idx = indices + (idx_t)t * K;
    float* w = weights + (idx_t)t * K;
    for (int j = 0; j < K; ++j) {
        int best = -1;
        float bestv = RT_NEG_INF;
        for (int e = 0; e < E; ++e) {
            if (!group_ok[e / per_group]) continue;
            bool taken = false;
            for (int i = 0; i < j; ++i) taken = taken || (idx[i] == e);
            if (taken) continue;
            const float v = s[e] + (bias ? bias[e] : 0.0f);
            if (best < 0 || v > bestv) { best = e; bestv = v; }
        }
        idx[j] = best;  // -1 only if fewer than K experts are allowed (the host rejects that)
        w[j] = best >= 0 ? s[best] : 0.0f;
    }
    if (softmax_selected) {
        float m = RT_NEG_INF;
        for (int j = 0; j < K; ++j) m = fmaxf(m, w[j]);
        float sum = 0.0f;
        for (int j = 0; j < K; ++j) sum += expf(w[j] - m);
        for (int j = 0; j < K; ++j) w[j] = expf(w[j] - m) / sum;
    }
    if (norm) {
        float sum = 0.0f;
        for (int j = 0; j < K; ++j) sum += w[j];
        for (int j = 0; j < K; ++j) w[j] = w[j] / (sum + 1e-20f);
    }
    for (int j = 0; j < K; ++j) w[j] = w[j] * scaling;
}

// Capacity dropping, position policy: one thread per (sequence, expert) = (blockIdx.y,
// thread x). Assignments of sequence q (tokens [q*S, min((q+1)*S, T))) to expert e are kept
// in token-major, slot-minor order while fewer than `capacity` are kept. Writes kept[a] for
// every assignment a whose expert is e (each assignment has exactly one expert, so each byte
// is written by exactly one thread).
extern "C" __global__ void routing_capacity_position(const int* indices, int T, int K, int E,
                                                     int S, int capacity, uint8_t* kept) {
    const int e = blockIdx.x * blockDim.x + threadIdx.x;
    const int q = blockIdx.y;
    if (e >= E || S < 1) return;
    const idx_t t0 = (idx_t)q * S;
    const idx_t t1 = mc_min(t0 + S, (idx_t)T);
    int count = 0;
    for (idx_t t = t0; t < t1; ++t)
        for (int k = 0; k < K; ++k) {
            const idx_t a = t * K + k;
            if (indices[a] == e) {
                kept[a] = count < capacity ? 1 : 0;
                ++count;
            }
        }
}

// group_sizes[e] = number of kept assignments to expert e. One thread per expert.
extern "C" __global__ void routing_group_sizes(const int* indices, const uint8_t* kept,
                                               idx_t assignments, int E, int* group_sizes) {
    const int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= E) return;
    int n = 0;
    for (idx_t a = 0; a < assignments; ++a) n += (indices[a] == e && kept[a]) ? 1 : 0;
    group_sizes[e] = n;
}

// Stable sort of assignments by expert: positions[a] = offsets[e] + (number of kept
// assignments to e before a) for kept a; dropped assignments go to the tail in assignment
// order: offsets[E] + (number of dropped before a). `offsets` (E + 1, int32) are the prefix
// sums of group_sizes. Threads 0..E-1 place expert e's assignments, thread E the dropped ones.
extern "C" __global__ void routing_permute_index(const int* indices, const uint8_t* kept,
                                                 idx_t assignments, int E, const int* offsets,
                                                 int* positions) {
    const int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e > E) return;
    int next = offsets[e];
    for (idx_t a = 0; a < assignments; ++a) {
        const bool mine = (e == E) ? !kept[a] : (kept[a] && indices[a] == e);
        if (mine) positions[a] = next++;
    }
}

// Permute: xp[positions[t*K + k], h] = x[t, h] for every assignment (kept rows first, grouped
// by expert; dropped rows in the tail). x (T, H), xp (T*K, H).
extern "C" __global__ void routing_gather_rows_f32(const float* x, const int* positions, int T,
                                                   int K, idx_t H, float* xp) {
    const idx_t total = (idx_t)T * K * H;
    for (idx_t i = (idx_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (idx_t)gridDim.x * blockDim.x) {
        const idx_t a = i / H, h = i % H;
        const idx_t t = a / K;
        const idx_t p = positions[a];
        if (p >= 0 && p < (idx_t)T * K) xp[p * H + h] = x[t * H + h];
    }
}

// Unpermute and combine in f32: out[t, h] = sum_{k kept} weights[t, k] * y[positions[t*K+k], h],
// k ascending; dropped assignments contribute nothing (their rows of y are not read).
extern "C" __global__ void routing_combine_f32(const float* y, const int* positions,
                                               const float* weights, const uint8_t* kept, int T,
                                               int K, idx_t H, float* out) {
    const idx_t total = (idx_t)T * H;
    for (idx_t i = (idx_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (idx_t)gridDim.x * blockDim.x) {
        const idx_t t = i / H, h = i % H;
        float acc = 0.0f;
        for (int k = 0; k < K; ++k) {
            const idx_t a = t * K + k;
            if (kept[a]) acc = fmaf(weights[a], y[(idx_t)positions[a] * H + h], acc);
        }
        out[i] = acc;
    }
}
