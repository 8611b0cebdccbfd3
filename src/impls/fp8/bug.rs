//! The defects that can be planted in the FP8 CPU model ([`super::emulate::EmulateFp8`],
//! `--inject fp8-…`): each a realistic FP8 kernel bug that `moecheck selftest`'s FP8 section
//! checks some FP8 property catches.

use crate::impls::PlantedBug;

/// A defect that can be injected into [`super::emulate::EmulateFp8`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fp8Bug {
    /// `scale_inv` is stored compacted over non-empty groups but read by group index (TE
    /// v2.8's grouped FFI layout): every group after an empty one gets a later group's scale.
    ScaleInvNotAdvanced,
    /// Each scope's amax is taken from the next scope (the last keeps its own).
    AmaxFromNeighbour,
    /// `scale = amax / fp8_max`.
    InvertedScale,
    /// No guard for `amax = 0`: `scale = fp8_max / 0 = inf`, and `0 · inf = NaN`.
    ZeroAmaxInfScale,
    /// The FP8 cast truncates toward zero instead of rounding to nearest even.
    Truncation,
    /// `dout` is quantised to E4M3 (with E4M3's max) instead of the recipe's format.
    E4m3Gradients,
    /// The column-wise copies for wgrad are re-quantised with their own per-column scale.
    ColwiseOwnScale,
    /// Block scopes: the column-wise copy's blocks along M do not restart at each group's
    /// first row (tiles from row 0 of the tensor, so a block holds two experts' tokens).
    BlockCrossesGroup,
    /// Block scopes: the row-wise `lhs`/`dout` scale grid `(rows, blocks)` is stored
    /// row-major but read column-major (DeepGEMM's TMA-aligned layout assumed).
    BlockScalesTransposed,
    /// Block scopes: the power-of-two (E8M0) scale rounded the wrong way (MX floor: the
    /// exponent of `amax` rounded up; rceil and DeepGEMM's ue8m0: rounded down).
    E8m0WrongRounding,
    /// Block scopes: the K tail block (K not a multiple of the block) is scaled with the
    /// previous block's scale (`K / block` scale blocks instead of `ceil`).
    KTailPreviousScale,
    /// Block scopes: wgrad reads the row-wise copies (blocks along K/N) instead of the
    /// column-wise ones (blocks along M).
    WgradRowwiseCopy,
}

impl Fp8Bug {
    /// Whether the bug acts only under block scopes (`block:RxC`, `mx:N`): a case with one
    /// scale per scope runs the correct model.
    pub fn needs_block_scopes(self) -> bool {
        matches!(
            self,
            Fp8Bug::BlockCrossesGroup
                | Fp8Bug::BlockScalesTransposed
                | Fp8Bug::E8m0WrongRounding
                | Fp8Bug::KTailPreviousScale
                | Fp8Bug::WgradRowwiseCopy
        )
    }
}

impl PlantedBug for Fp8Bug {
    const ALL: &'static [Fp8Bug] = &[
        Fp8Bug::ScaleInvNotAdvanced,
        Fp8Bug::AmaxFromNeighbour,
        Fp8Bug::InvertedScale,
        Fp8Bug::ZeroAmaxInfScale,
        Fp8Bug::Truncation,
        Fp8Bug::E4m3Gradients,
        Fp8Bug::ColwiseOwnScale,
        Fp8Bug::BlockCrossesGroup,
        Fp8Bug::BlockScalesTransposed,
        Fp8Bug::E8m0WrongRounding,
        Fp8Bug::KTailPreviousScale,
        Fp8Bug::WgradRowwiseCopy,
    ];

    fn name(self) -> &'static str {
        match self {
            Fp8Bug::ScaleInvNotAdvanced => "fp8-scale-inv-not-advanced",
            Fp8Bug::AmaxFromNeighbour => "fp8-amax-from-neighbour",
            Fp8Bug::InvertedScale => "fp8-inverted-scale",
            Fp8Bug::ZeroAmaxInfScale => "fp8-zero-amax-inf-scale",
            Fp8Bug::Truncation => "fp8-truncation",
            Fp8Bug::E4m3Gradients => "fp8-e4m3-gradients",
            Fp8Bug::ColwiseOwnScale => "fp8-colwise-own-scale",
            Fp8Bug::BlockCrossesGroup => "fp8-block-crosses-group",
            Fp8Bug::BlockScalesTransposed => "fp8-block-scales-transposed",
            Fp8Bug::E8m0WrongRounding => "fp8-e8m0-wrong-rounding",
            Fp8Bug::KTailPreviousScale => "fp8-k-tail-previous-scale",
            Fp8Bug::WgradRowwiseCopy => "fp8-wgrad-rowwise-copy",
        }
    }

    fn description(self) -> &'static str {
        match self {
            Fp8Bug::ScaleInvNotAdvanced => {
                "scale_inv compacted over non-empty groups, read by group index"
            }
            Fp8Bug::AmaxFromNeighbour => "each group's amax is taken from the next group",
            Fp8Bug::InvertedScale => "scale = amax / fp8_max",
            Fp8Bug::ZeroAmaxInfScale => "amax = 0 gives scale = inf and NaN",
            Fp8Bug::Truncation => "FP8 cast truncates instead of rounding to nearest even",
            Fp8Bug::E4m3Gradients => "dout quantised to E4M3 instead of E5M2",
            Fp8Bug::ColwiseOwnScale => "column-wise copies quantised with their own scales",
            Fp8Bug::BlockCrossesGroup => {
                "column-wise scale blocks along M cross group boundaries (block scopes)"
            }
            Fp8Bug::BlockScalesTransposed => {
                "row-wise block scale grid read column-major (block scopes)"
            }
            Fp8Bug::E8m0WrongRounding => "E8M0 / power-of-two block scale rounded the wrong way",
            Fp8Bug::KTailPreviousScale => "K tail block scaled with the previous block's scale",
            Fp8Bug::WgradRowwiseCopy => "wgrad reads the row-wise copies (block scopes)",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::impls::parse_bug;

    #[test]
    fn bug_names_round_trip() {
        for &b in Fp8Bug::ALL {
            assert_eq!(parse_bug::<Fp8Bug>(b.name()), Ok(b));
        }
        assert!(parse_bug::<Fp8Bug>("nope")
            .unwrap_err()
            .contains("fp8-truncation"));
    }
}
