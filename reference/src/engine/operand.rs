//! The element types [`super::kernel`] reads its right operand in.

/// What the kernel's right operand may be held in: f64, or f32 or bf16 (the case's stored
/// inputs), read where it lies and widened in registers. Widening is exact, so the sums are
/// the same bits as for the operand widened to f64 beforehand; without the copy, an expert's
/// weight is read once, at a half (f32) or a quarter (bf16) of the bytes.
pub trait Operand: Copy + Send + Sync + 'static {
    /// The value as f64 (exactly).
    fn wide(self) -> f64;

    /// `|x|` rounded up to bf16 (the smallest bf16 at or above it), as its 16 bits in the low
    /// half: what the bf16 magnitudes multiply (`up`; the AMX path packs `b` with it, from
    /// where it lies). Exact for a bf16.
    fn up_bf16(self) -> u32;
}
impl Operand for f32 {
    #[inline(always)]
    fn wide(self) -> f64 {
        f64::from(self)
    }

    /// The low 16 bits carried into the top 16 (an f32's bits order as its magnitudes do).
    #[inline(always)]
    fn up_bf16(self) -> u32 {
        ((self.to_bits() & 0x7fff_ffff) + 0xffff) >> 16
    }
}
impl Operand for f64 {
    #[inline(always)]
    fn wide(self) -> f64 {
        self
    }

    #[inline(always)]
    fn up_bf16(self) -> u32 {
        up(self)
    }
}

/// `|x|` rounded up to bf16, as its 16 bits in the low half: to f32 upwards, then the low 16
/// bits carried into the top 16. A NaN gives bits above `0x7f80`; an infinity, or a value past
/// bf16's largest, `0x7f80`.
#[inline(always)]
pub(super) fn up(x: f64) -> u32 {
    let x = x.abs();
    let f = x as f32; // to nearest
    let f = if f64::from(f) < x {
        f32::from_bits(f.to_bits() + 1)
    } else {
        f
    };
    (f.to_bits() + 0xffff) >> 16
}

impl Operand for half::bf16 {
    /// The bits shifted into an f32's upper half (a bf16 is the top half of an f32): exact,
    /// branch-free and vectorised, where `half`'s conversion checks for NaN value by value.
    #[inline(always)]
    fn wide(self) -> f64 {
        // A bf16 is an f32's upper half: exact.
        f64::from(f32::from_bits(u32::from(self.to_bits()) << 16))
    }

    /// The sign bit cleared.
    #[inline(always)]
    fn up_bf16(self) -> u32 {
        u32::from(self.to_bits() & 0x7fff)
    }
}
