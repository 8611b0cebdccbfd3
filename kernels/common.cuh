// Shared helpers for moecheck's CUDA kernels.
//
// The kernels are compiled at run time by NVRTC (src/cuda/), for the device's own arch, and in
// CI for sm_80, sm_89 and sm_90 (tests/nvrtc_compile.rs). They include no CUDA headers: bf16,
// f16 and FP8 values travel as raw bits (uint16_t / uint8_t) and are converted here, with
// the rounding written out, so that NVRTC needs no include path on any machine.
//
// Conventions of every kernel in kernels/:
// * Row-major arrays; element offsets are 64-bit (`idx_t`): G*K*N exceeds 2^31 at
//   DeepSeek-V3 sizes (256 * 7168 * 2048).
// * Every global read and write is bounds-checked against the sizes passed in; the host never
//   issues a launch with a zero-sized grid.
// * The same sources compile as host C++ with `-DMC_HOST` and tests/host_kernels/shim.hpp
//   (threads for a block, a barrier for __syncthreads): the CPU tests run the real kernel code.
//   Only the inline-PTX parts (mma.sync, cvt.f16) are replaced or left out there.
// * `extern "C"` entry points are named `op_dtype` (e.g. `grouped_gemm_fwd_tiled_bf16`) by the
//   macros at the end of each .cu file; the Rust side builds the same name with
//   `kernel_name(op, dtype)`.
#pragma once

typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef int int32_t;
typedef long long idx_t;

#define MC_DEVICE __device__ __forceinline__

// ---- bf16 / f16 <-> f32 ------------------------------------------------------------------

// bf16 bits -> f32: exact (bf16 is the top half of an f32).
MC_DEVICE float bf16_to_f32(uint16_t b) { return __uint_as_float(((uint32_t)b) << 16); }

// f16 bits -> f32: exact, via the hardware conversion on the GPU; in software when the
// kernels are compiled as host C++ for the CPU tests (MC_HOST, tests/host_kernels/).
MC_DEVICE float f16_to_f32(uint16_t h) {
#ifndef MC_HOST
    float f;
    asm("{ cvt.f32.f16 %0, %1; }" : "=f"(f) : "h"(h));
    return f;
#else
    const uint32_t sign = (uint32_t)(h >> 15) << 31;
    const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return __uint_as_float(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
        const float v = (float)m * __uint_as_float(103u << 23);  // m * 2^-24, exact
        return sign ? -v : v;
    }
    return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
#endif
}

// Input element loaders, one per storage type. `T` is the storage type of the operand.
struct LoadF32 {
    typedef float T;
    static MC_DEVICE float get(const float* p, idx_t i) { return p[i]; }
};
struct LoadBf16 {
    typedef uint16_t T;
    static MC_DEVICE float get(const uint16_t* p, idx_t i) { return bf16_to_f32(p[i]); }
};
struct LoadF16 {
    typedef uint16_t T;
    static MC_DEVICE float get(const uint16_t* p, idx_t i) { return f16_to_f32(p[i]); }
};

// ---- FP8 (OCP E4M3 "fn" and E5M2) ---------------------------------------------------------

// Decodes an FP8 byte with `MB` mantissa bits and exponent bias `BIAS` to f32 (exact).
// E4M3 (MB=3, BIAS=7): S.1111.111 is NaN, no infinities. E5M2 (MB=2, BIAS=15): exponent 31
// is inf (mantissa 0) or NaN.
template <int MB, int BIAS, bool HAS_INF>
MC_DEVICE float fp8_decode(uint8_t q) {
    const int EB = 7 - MB;
    const uint32_t sign = (q >> 7) & 1u;
    const uint32_t e = (q >> MB) & ((1u << EB) - 1u);
    const uint32_t m = q & ((1u << MB) - 1u);
    float v;
    if (HAS_INF && e == (1u << EB) - 1u) {
        v = (m == 0) ? __int_as_float(0x7f800000) : __int_as_float(0x7fc00000);
    } else if (!HAS_INF && e == (1u << EB) - 1u && m == (1u << MB) - 1u) {
        v = __int_as_float(0x7fc00000);
    } else if (e == 0) {
        // Subnormal: m * 2^(1 - BIAS - MB), exact in f32.
        v = (float)m * __int_as_float((uint32_t)(127 + 1 - BIAS - MB) << 23);
    } else {
        // Normal: rebias the exponent into f32.
        v = __uint_as_float(((e + 127u - BIAS) << 23) | (m << (23 - MB)));
    }
    return sign ? -v : v;
}
MC_DEVICE float e4m3_to_f32(uint8_t q) { return fp8_decode<3, 7, false>(q); }
MC_DEVICE float e5m2_to_f32(uint8_t q) { return fp8_decode<2, 15, true>(q); }

// Saturating round-to-nearest-even cast f32 -> FP8 (what `cvt.rn.satfinite` and Transformer
// Engine's casts do): round first, then clamp the magnitude to the format's max; +-inf becomes
// +-max; NaN becomes the format's NaN (E4M3 0x7f, E5M2 0x7e) with the input's sign.
// Written in integer arithmetic so it is the same on every arch (sm_80 has no FP8 cvt).
template <int MB, int BIAS, bool HAS_INF>
MC_DEVICE uint8_t fp8_encode_sat(float x) {
    const int EB = 7 - MB;
    const uint32_t bits = __float_as_uint(x);
    const uint8_t sign = (uint8_t)((bits >> 24) & 0x80u);
    const uint32_t abs_bits = bits & 0x7fffffffu;
    // Largest finite encoding (magnitude): E4M3 0x7e (448), E5M2 0x7b (57344).
    const uint8_t max_code = HAS_INF ? (uint8_t)((((1u << EB) - 2u) << MB) | ((1u << MB) - 1u))
                                     : (uint8_t)((((1u << EB) - 1u) << MB) | ((1u << MB) - 2u));
    if (abs_bits > 0x7f800000u) {  // NaN
        return sign | (HAS_INF ? (uint8_t)0x7e : (uint8_t)0x7f);
    }
    if (abs_bits == 0x7f800000u) {  // inf saturates
        return sign | max_code;
    }
    const int fexp = (int)(abs_bits >> 23);  // biased f32 exponent, 0 for f32 subnormals
    // f32 subnormals are far below half the smallest FP8 subnormal: they round to zero.
    if (fexp == 0) return sign;
    const uint32_t mant = (abs_bits & 0x7fffffu) | 0x800000u;  // 24-bit significand
    const int e = fexp - 127;                                 // unbiased exponent
    const int emin = 1 - BIAS;
    // Number of low significand bits dropped: normal results keep MB fraction bits; results
    // below 2^emin keep fewer (gradual underflow).
    int shift = 23 - MB;
    if (e < emin) shift += emin - e;
    uint32_t q;  // magnitude in units of the FP8 ulp at exponent max(e, emin)
    if (shift > 25) {
        q = 0;  // below half the smallest subnormal (the significand is < 2^24)
    } else {
        const uint32_t kept = mant >> shift;
        const uint32_t rem = mant & ((1u << shift) - 1u);
        const uint32_t half = 1u << (shift - 1);
        q = kept + ((rem > half || (rem == half && (kept & 1u))) ? 1u : 0u);
    }
    // Assemble: for e >= emin the code is ((e + BIAS) << MB) + (q - 2^MB), and a carry out of
    // the mantissa correctly bumps the exponent; for e < emin the code is q itself (a
    // subnormal, or the smallest normal after a carry).
    uint32_t code;
    if (e < emin) {
        code = q;
    } else {
        code = ((uint32_t)(e + BIAS) << MB) + (q - (1u << MB));
    }
    if (code > max_code) code = max_code;  // saturate (also catches e beyond the format)
    return sign | (uint8_t)code;
}
MC_DEVICE uint8_t f32_to_e4m3_sat(float x) { return fp8_encode_sat<3, 7, false>(x); }
MC_DEVICE uint8_t f32_to_e5m2_sat(float x) { return fp8_encode_sat<2, 15, true>(x); }

struct LoadE4m3 {
    typedef uint8_t T;
    static MC_DEVICE float get(const uint8_t* p, idx_t i) { return e4m3_to_f32(p[i]); }
};
struct LoadE5m2 {
    typedef uint8_t T;
    static MC_DEVICE float get(const uint8_t* p, idx_t i) { return e5m2_to_f32(p[i]); }
};

// ---- small helpers ------------------------------------------------------------------------

MC_DEVICE idx_t mc_min(idx_t a, idx_t b) { return a < b ? a : b; }

// The NaN bit pattern written by the poison kernels.
#define MC_NAN_F32 __int_as_float(0x7fc00000)
