//! The instruction-set paths of the f64 kernel ([`super::kernel`]), chosen at run time.

/// The instruction-set paths of the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// Plain Rust, separate multiply and add; runs everywhere.
    Portable,
    /// x86-64 AVX2 with FMA.
    Avx2,
    /// x86-64 AVX-512F with FMA.
    Avx512,
    /// [`Isa::Avx512`] for the values; beside them, in the same register tile, the magnitudes
    /// summed in f32 from operands rounded up to bf16: a certified upper bound a little above
    /// `Σ|a|·|b|` (see `engine/bf16mag.rs`), not its f64 sums, at about half their cost.
    Avx512F32Mag,
    /// [`Isa::Avx512`] for the values (its values-only register tile); the magnitudes by AMX
    /// BF16 tiles, the same certified upper bound as [`Isa::Avx512F32Mag`]'s (see
    /// `engine/amx.rs`) at a few percent of the values' cost.
    Amx,
}

impl Isa {
    /// The widest path this CPU supports.
    pub fn detect() -> Isa {
        *Isa::available().last().unwrap_or(&Isa::Portable)
    }

    /// Every path this CPU can run, narrowest first (the tests run each of them).
    pub fn available() -> Vec<Isa> {
        #[allow(unused_mut)]
        let mut paths = vec![Isa::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("avx2") && has!("fma") {
                paths.push(Isa::Avx2);
                if has!("avx512f") {
                    paths.push(Isa::Avx512);
                    paths.push(Isa::Avx512F32Mag);
                    if has!("avx512bf16") && super::amx::available() {
                        paths.push(Isa::Amx);
                    }
                }
            }
        }
        paths
    }
}
