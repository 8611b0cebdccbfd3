//! How an FP8 recipe names block scopes and which recipes with block scopes are checked:
//! `ScopeKind::Block`'s strings (`block:1x128/deepgemm`, `mx:32/floor`; `case.json` and the
//! command line), the block lengths along each pass's contraction, and the refusals
//! ([`Fp8Recipe::block_refusal`]). What a block scope means is [`super::block_scope`]'s.

use super::accum::AccumModel;
use super::block_scope::BlockScope;
use super::case::{Fp8Recipe, ScalingKind, ScopeKind};
use crate::gemm::Pass;

impl ScopeKind {
    /// `tensor`, `group`, `expert`, or a block scope's [`BlockScope`] form.
    pub fn name(&self) -> String {
        match self {
            ScopeKind::Tensor => "tensor".into(),
            ScopeKind::Group => "group".into(),
            ScopeKind::Expert => "expert".into(),
            ScopeKind::Block(b) => b.to_string(),
        }
    }

    /// The inverse of [`ScopeKind::name`] (a block scope without `/recipe` takes its kind's
    /// default).
    pub fn parse(s: &str) -> Result<ScopeKind, String> {
        match s {
            "tensor" => Ok(ScopeKind::Tensor),
            "group" => Ok(ScopeKind::Group),
            "expert" => Ok(ScopeKind::Expert),
            _ if s.starts_with("block:") || s.starts_with("mx:") => {
                BlockScope::parse(s).map(ScopeKind::Block)
            }
            _ => Err(format!(
                "unknown scope '{s}' (expected tensor, group, expert, block:RxC or mx:N)"
            )),
        }
    }

    /// The block scope, if this is one.
    pub fn block(&self) -> Option<BlockScope> {
        match self {
            ScopeKind::Block(b) => Some(*b),
            _ => None,
        }
    }
}

impl TryFrom<String> for ScopeKind {
    type Error = String;
    fn try_from(s: String) -> Result<ScopeKind, String> {
        ScopeKind::parse(&s)
    }
}

impl From<ScopeKind> for String {
    fn from(s: ScopeKind) -> String {
        s.name()
    }
}

impl Fp8Recipe {
    /// Whether some operand has a block scope (the recipe is checked by
    /// [`super::block_gemm`]).
    pub fn has_block_scope(&self) -> bool {
        [self.lhs.scope, self.rhs.scope, self.dout.scope]
            .iter()
            .any(|s| s.block().is_some())
    }

    /// The block lengths along the contraction of `pass`: (left operand, right operand), `None`
    /// for an operand whose scale is constant along it (module docs' table).
    pub fn contraction_blocks(&self, pass: Pass) -> (Option<usize>, Option<usize>) {
        let len = |rhs_fwd: bool, s: ScopeKind| s.block().map(|b| b.contraction_len(rhs_fwd));
        match pass {
            Pass::Fwd => (len(false, self.lhs.scope), len(true, self.rhs.scope)),
            Pass::Dgrad => (len(false, self.dout.scope), len(false, self.rhs.scope)),
            Pass::Wgrad => (len(false, self.lhs.scope), len(false, self.dout.scope)),
        }
    }

    /// Why a recipe with block scopes cannot be checked yet: the flag and a reason, or `None`.
    /// Block scales come from the tensor being quantised (no delayed scaling), their casts
    /// saturate as their recipes do, and the bound of fast accumulation with per-block
    /// scaling is not derived yet.
    pub fn block_refusal(&self) -> Option<(&'static str, String)> {
        if !self.has_block_scope() {
            return None;
        }
        if self.accumulation != AccumModel::Exact {
            return Some((
                "--accum",
                format!(
                    "{} with block scopes is not modelled yet (declare --accum exact)",
                    self.accumulation
                ),
            ));
        }
        if matches!(self.scaling, ScalingKind::Delayed { .. }) {
            return Some((
                "--scaling",
                "delayed scaling has no block scopes (a block's scale comes from its own amax)"
                    .into(),
            ));
        }
        if !self.saturate {
            return Some((
                "--no-saturate",
                "block scopes cast as their recipes do (MX saturates; DeepGEMM's scaled values never pass the maximum)".into(),
            ));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scope_names_round_trip() {
        for s in [
            "tensor",
            "group",
            "expert",
            "block:1x128/deepgemm",
            "block:128x128/deepgemm-ue8m0",
            "block:3x5/deepgemm-reciprocal",
            "mx:32/floor",
            "mx:4/rceil",
        ] {
            assert_eq!(ScopeKind::parse(s).unwrap().name(), s);
        }
        assert_eq!(
            ScopeKind::parse("mx:32").unwrap().name(),
            "mx:32/floor",
            "the default MX rounding is the specification's"
        );
        assert_eq!(
            ScopeKind::parse("block:1x128").unwrap().name(),
            "block:1x128/deepgemm"
        );
        for bad in [
            "block:1",
            "block:0x4",
            "mx:0",
            "mx:32/deepgemm",
            "block:1x4/rceil",
            "rows",
        ] {
            assert!(ScopeKind::parse(bad).is_err(), "{bad}");
        }
        // case.json's strings (serde goes through these), the old scopes as before.
        assert_eq!(String::from(ScopeKind::Group), "group");
        let b = ScopeKind::try_from("mx:32/rceil".to_string()).unwrap();
        assert_eq!(b.block().unwrap().cols, 32);
    }

    #[test]
    fn contraction_blocks_follow_the_table() {
        let mut r = Fp8Recipe::default();
        r.lhs.scope = ScopeKind::parse("block:1x128").unwrap();
        r.rhs.scope = ScopeKind::parse("block:64x32").unwrap();
        assert_eq!(r.contraction_blocks(Pass::Fwd), (Some(128), Some(64)));
        assert_eq!(r.contraction_blocks(Pass::Dgrad), (None, Some(32)));
        assert_eq!(r.contraction_blocks(Pass::Wgrad), (Some(128), None));
        r.rhs.scope = ScopeKind::parse("mx:32").unwrap();
        assert_eq!(r.contraction_blocks(Pass::Fwd), (Some(128), Some(32)));
        assert_eq!(r.contraction_blocks(Pass::Dgrad), (None, Some(32)));
        assert!(r.block_refusal().is_none());
        r.accumulation = AccumModel::Fast;
        assert_eq!(r.block_refusal().unwrap().0, "--accum");
        assert!(Fp8Recipe::default().block_refusal().is_none());
    }
}
