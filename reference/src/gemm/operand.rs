//! The element types [`super::kernel`] reads its right operand in.

/// What the kernel's right operand may be held in: f64, or f32 or bf16 (the case's stored
/// inputs), read where it lies and widened in registers. Widening is exact, so the sums are
/// the same bits as for the operand widened to f64 beforehand; without the copy, an expert's
/// weight is read once, at a half (f32) or a quarter (bf16) of the bytes.
pub trait Operand: Copy + Send + Sync + 'static {
    /// The value as f64 (exactly).
    fn wide(self) -> f64;
}
impl Operand for f32 {
    #[inline(always)]
    fn wide(self) -> f64 {
        f64::from(self)
    }
}
impl Operand for f64 {
    #[inline(always)]
    fn wide(self) -> f64 {
        self
    }
}

impl Operand for half::bf16 {
    /// The bits shifted into an f32's upper half (a bf16 is the top half of an f32): exact,
    /// branch-free and vectorised, where `half`'s conversion checks for NaN value by value.
    #[inline(always)]
    fn wide(self) -> f64 {
        f64::from(super::weights::bf16_to_f32(self))
    }
}
