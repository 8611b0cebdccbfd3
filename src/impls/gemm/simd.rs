//! The f32 vectors [`super::blocked`]'s micro-kernel is written with: AVX-512F and AVX2 + FMA
//! through `std::arch` (the compiler, left to vectorise plain arrays here, kept some of the
//! partial sums in memory and ran at half the speed), and a portable unfused fallback.

/// A vector of f32 lanes. Every method is `unsafe`: the CPU must have the vector's features.
pub(super) trait Simd: Copy {
    const LANES: usize;
    unsafe fn zero() -> Self;
    unsafe fn splat(x: f32) -> Self;
    /// Reads `LANES` values from `p`.
    unsafe fn load(p: *const f32) -> Self;
    /// Writes `LANES` values to `p`.
    unsafe fn store(self, p: *mut f32);
    /// `a·b + c`, fused where the vector has FMA.
    unsafe fn mul_add(a: Self, b: Self, c: Self) -> Self;
    unsafe fn add(self, o: Self) -> Self;
}

/// The portable fallback: eight lanes, a rounded product then a rounded addition.
#[derive(Clone, Copy)]
pub(super) struct Plain([f32; 8]);

impl Simd for Plain {
    const LANES: usize = 8;
    unsafe fn zero() -> Self {
        Plain([0.0; 8])
    }
    unsafe fn splat(x: f32) -> Self {
        Plain([x; 8])
    }
    unsafe fn load(p: *const f32) -> Self {
        // SAFETY: the caller's `p` points at 8 values.
        Plain(unsafe { std::ptr::read_unaligned(p as *const [f32; 8]) })
    }
    unsafe fn store(self, p: *mut f32) {
        // SAFETY: the caller's `p` points at room for 8 values.
        unsafe { std::ptr::write_unaligned(p as *mut [f32; 8], self.0) }
    }
    unsafe fn mul_add(a: Self, b: Self, c: Self) -> Self {
        Plain(std::array::from_fn(|i| c.0[i] + a.0[i] * b.0[i]))
    }
    unsafe fn add(self, o: Self) -> Self {
        Plain(std::array::from_fn(|i| self.0[i] + o.0[i]))
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod x86 {
    use super::Simd;
    use std::arch::x86_64::*;

    /// A vector type over one `std::arch` register type, its lane count, the features its
    /// intrinsics need, and the intrinsics of each [`Simd`] method.
    macro_rules! vector {
        ($name:ident($reg:ty), $lanes:literal, $features:literal,
         $zero:ident, $splat:ident, $load:ident, $store:ident, $fma:ident, $add:ident) => {
            #[derive(Clone, Copy)]
            pub(in crate::impls::gemm) struct $name($reg);

            impl Simd for $name {
                const LANES: usize = $lanes;
                #[inline]
                #[target_feature(enable = $features)]
                unsafe fn zero() -> Self {
                    $name($zero())
                }
                #[inline]
                #[target_feature(enable = $features)]
                unsafe fn splat(x: f32) -> Self {
                    $name($splat(x))
                }
                #[inline]
                #[target_feature(enable = $features)]
                unsafe fn load(p: *const f32) -> Self {
                    // SAFETY: the caller's `p` points at LANES values.
                    $name(unsafe { $load(p) })
                }
                #[inline]
                #[target_feature(enable = $features)]
                unsafe fn store(self, p: *mut f32) {
                    // SAFETY: the caller's `p` points at room for LANES values.
                    unsafe { $store(p, self.0) }
                }
                #[inline]
                #[target_feature(enable = $features)]
                unsafe fn mul_add(a: Self, b: Self, c: Self) -> Self {
                    $name($fma(a.0, b.0, c.0))
                }
                #[inline]
                #[target_feature(enable = $features)]
                unsafe fn add(self, o: Self) -> Self {
                    $name($add(self.0, o.0))
                }
            }
        };
    }

    vector!(
        Avx512(__m512),
        16,
        "avx512f",
        _mm512_setzero_ps,
        _mm512_set1_ps,
        _mm512_loadu_ps,
        _mm512_storeu_ps,
        _mm512_fmadd_ps,
        _mm512_add_ps
    );
    vector!(
        Avx2(__m256),
        8,
        "avx2,fma",
        _mm256_setzero_ps,
        _mm256_set1_ps,
        _mm256_loadu_ps,
        _mm256_storeu_ps,
        _mm256_fmadd_ps,
        _mm256_add_ps
    );
}
