//! An FP8 grouped-GEMM case: float32 inputs, the recipe every implementation must follow
//! (per operand its format and scaling scope, saturation, the declared accumulation model,
//! current or delayed scaling) and, for delayed scaling, the scales to use.
//!
//! [`Fp8Recipe::validate`] refuses a recipe that cannot be applied with a structured
//! [`RecipeError`] (which operand, which field, why), so that `case.json` readers and the
//! command line each name the setting in their own words.

use serde::{Deserialize, Serialize};

use super::accum::AccumModel;
use super::block_scope::BlockScope;
use super::scaling::{AmaxAlgo, Scope};
use crate::format::{Format, Overflow};
use crate::gemm::{GroupedGemmCase, Passes};
use crate::Error;

/// Which values of an operand share one scale. In `case.json` a string: `tensor`, `group`,
/// `expert`, `block:RxC/recipe` or `mx:S/rounding` ([`super::block_scope`]). Its `Debug`
/// form (reports) is `Tensor`, `Group`, `Expert` or the block scope's string.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum ScopeKind {
    /// One scale for the operand (the rows in groups, for `lhs`/`dout`).
    Tensor,
    /// One scale per group of rows (`lhs`, `dout`).
    Group,
    /// One scale per expert weight (`rhs`).
    Expert,
    /// One scale per block of each copy ([`super::block_scope`]): `1 × C` for `lhs`/`dout`,
    /// any `R × C` or `mx:S` for `rhs`.
    Block(BlockScope),
}

impl std::fmt::Debug for ScopeKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ScopeKind::Tensor => f.write_str("Tensor"),
            ScopeKind::Group => f.write_str("Group"),
            ScopeKind::Expert => f.write_str("Expert"),
            ScopeKind::Block(b) => write!(f, "{b}"),
        }
    }
}

/// The format and scaling scope of one operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperandRecipe {
    pub format: Format,
    pub scope: ScopeKind,
}

/// Current or delayed scaling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum ScalingKind {
    /// `scale` from the amax of the tensor being quantised.
    Current,
    /// `scale` from an amax history before the step; the case carries the resulting scales.
    Delayed {
        history_len: usize,
        algo: AmaxAlgo,
        margin: i32,
    },
}

/// Everything an FP8 grouped-GEMM implementation must follow (`case.json`'s `fp8` object).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fp8Recipe {
    pub lhs: OperandRecipe,
    pub rhs: OperandRecipe,
    pub dout: OperandRecipe,
    /// `true`: casts saturate to ±max (`satfinite`); `false`: IEEE casts (ml_dtypes).
    pub saturate: bool,
    /// The accumulation model the implementation declares (the bound is derived from it).
    pub accumulation: AccumModel,
    pub scaling: ScalingKind,
}

impl Default for Fp8Recipe {
    /// TE's HYBRID current scaling: E4M3 per-group lhs, E4M3 per-expert rhs, E5M2 per-group
    /// dout, saturating, exact f32 accumulation.
    fn default() -> Self {
        Fp8Recipe {
            lhs: OperandRecipe {
                format: Format::E4m3,
                scope: ScopeKind::Group,
            },
            rhs: OperandRecipe {
                format: Format::E4m3,
                scope: ScopeKind::Expert,
            },
            dout: OperandRecipe {
                format: Format::E5m2,
                scope: ScopeKind::Group,
            },
            saturate: true,
            accumulation: AccumModel::Exact,
            scaling: ScalingKind::Current,
        }
    }
}

impl Fp8Recipe {
    pub fn overflow(&self) -> Overflow {
        if self.saturate {
            Overflow::Saturate
        } else {
            Overflow::Ieee
        }
    }

    /// Checks that formats are FP8 and scopes fit their operand (every format first, then
    /// every scope); the error says which operand, which field and why.
    pub fn validate(&self) -> Result<(), RecipeError> {
        let operands = [
            (Operand::Lhs, self.lhs),
            (Operand::Rhs, self.rhs),
            (Operand::Dout, self.dout),
        ];
        for (operand, op) in operands {
            if !matches!(op.format, Format::E4m3 | Format::E5m2) {
                return Err(RecipeError {
                    operand,
                    problem: RecipeProblem::NotFp8(op.format),
                });
            }
        }
        for (operand, op) in operands {
            let fits = match op.scope {
                ScopeKind::Tensor => true,
                ScopeKind::Group => operand != Operand::Rhs,
                ScopeKind::Expert => operand == Operand::Rhs,
                ScopeKind::Block(b) => operand == Operand::Rhs || b.rows == 1,
            };
            if !fits {
                return Err(RecipeError {
                    operand,
                    problem: RecipeProblem::ScopeDoesNotApply(op.scope),
                });
            }
        }
        Ok(())
    }
}

/// One operand of the FP8 grouped GEMM, as `case.json`'s `fp8` object names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operand {
    Lhs,
    Rhs,
    Dout,
}

impl Operand {
    /// `lhs`, `rhs`, `dout`.
    pub fn name(self) -> &'static str {
        match self {
            Operand::Lhs => "lhs",
            Operand::Rhs => "rhs",
            Operand::Dout => "dout",
        }
    }
}

/// What is wrong with one operand's recipe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecipeProblem {
    /// Its `format` is not an FP8 format.
    NotFp8(Format),
    /// Its `scope` does not fit the operand (lhs/dout: tensor, group, `block:1xC` or `mx:S`;
    /// rhs: tensor, expert, `block:RxC` or `mx:S`).
    ScopeDoesNotApply(ScopeKind),
}

impl RecipeProblem {
    /// The field of [`OperandRecipe`] at fault: `format` or `scope`.
    pub fn field(self) -> &'static str {
        match self {
            RecipeProblem::NotFp8(_) => "format",
            RecipeProblem::ScopeDoesNotApply(_) => "scope",
        }
    }
}

/// An [`Fp8Recipe`] that cannot be applied: which operand, which field, why. Displayed with
/// `case.json`'s names (`fp8.rhs.scope Group does not apply ...`); a command line names its
/// own flag from the parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("fp8.{}.{} {}", operand.name(), problem.field(), self.why())]
pub struct RecipeError {
    pub operand: Operand,
    pub problem: RecipeProblem,
}

impl RecipeError {
    /// The value and why it does not fit, without the field's name.
    pub fn why(&self) -> String {
        match self.problem {
            RecipeProblem::NotFp8(f) => format!("{f} is not e4m3 or e5m2"),
            RecipeProblem::ScopeDoesNotApply(s @ ScopeKind::Block(_)) => {
                format!("{s:?} does not apply (lhs/dout block scopes are 1xC: block:1xC or mx:S)")
            }
            RecipeProblem::ScopeDoesNotApply(s) => {
                format!("{s:?} does not apply (lhs/dout: tensor or group; rhs: tensor or expert)")
            }
        }
    }
}

/// Scales given to the implementation (delayed scaling), one per scope of each operand.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GivenScales {
    pub lhs: Vec<f32>,
    pub rhs: Vec<f32>,
    pub dout: Vec<f32>,
}

/// An FP8 grouped-GEMM case: float32 high-precision inputs (`gemm.dtype` is f32), the recipe,
/// and for delayed scaling the scales to use.
#[derive(Debug, Clone, PartialEq)]
pub struct Fp8GemmCase {
    pub gemm: GroupedGemmCase,
    pub recipe: Fp8Recipe,
    pub given_scales: Option<GivenScales>,
}

impl Fp8GemmCase {
    /// The scaling scope of a row operand (`lhs`, `dout`).
    pub fn row_scope(&self, kind: ScopeKind) -> Scope {
        match kind {
            ScopeKind::Group => Scope::Rows(self.gemm.group_sizes.clone()),
            _ => Scope::Rows(vec![self.gemm.rows_used()]),
        }
    }

    /// The scaling scope of `rhs` viewed as `(G·K, N)`.
    pub fn rhs_scope(&self) -> Scope {
        let (g, k) = (self.gemm.groups(), self.gemm.k());
        match self.recipe.rhs.scope {
            ScopeKind::Expert => Scope::Rows(vec![k; g]),
            _ => Scope::Tensor,
        }
    }

    /// Validates the float32 inputs (finite, shapes) and the recipe (block scopes: also
    /// [`Fp8Recipe::block_refusal`]).
    pub fn validate(&self, passes: Passes) -> Result<(), Error> {
        self.gemm.validate(passes)?;
        self.recipe.validate().map_err(|e| Error::InvalidRecipe {
            reason: e.to_string(),
        })?;
        match self.recipe.block_refusal() {
            Some((flag, why)) => Err(Error::InvalidRecipe {
                reason: format!("fp8 block scopes ({flag}): {why}"),
            }),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recipe_validation_names_the_field() {
        let mut r = Fp8Recipe::default();
        r.rhs.scope = ScopeKind::Group;
        let e = r.validate().unwrap_err();
        assert_eq!(
            (e.operand, e.problem),
            (
                Operand::Rhs,
                RecipeProblem::ScopeDoesNotApply(ScopeKind::Group)
            )
        );
        assert!(e.to_string().starts_with("fp8.rhs.scope Group"), "{e}");
        let mut r = Fp8Recipe::default();
        r.dout.format = Format::Bf16;
        let e = r.validate().unwrap_err();
        assert_eq!(e.problem, RecipeProblem::NotFp8(Format::Bf16));
        assert_eq!(e.to_string(), "fp8.dout.format bf16 is not e4m3 or e5m2");
    }
}
