//! The reference crate's error type.

/// Everything the reference refuses to compute, with the domain reason.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// An array does not have the shape the operation needs.
    #[error("{op}: {what} has shape {got:?}, expected {expected:?}")]
    ShapeMismatch {
        op: &'static str,
        what: &'static str,
        expected: Vec<usize>,
        got: Vec<usize>,
    },
    /// `sum(group_sizes)` is larger than the number of rows `M`.
    #[error("group sizes sum to {sum}, more than the {m} rows of lhs")]
    GroupSizesExceedRows { sum: usize, m: usize },
    /// A group size is negative (only reachable from signed inputs such as .npy files).
    #[error("group {group} has negative size {size}")]
    NegativeGroupSize { group: usize, size: i64 },
    /// An input value is NaN or infinite where finite data is required.
    #[error("{what} holds a non-finite value {value} at index {index:?}")]
    NonFinite {
        what: &'static str,
        index: Vec<usize>,
        value: f64,
    },
    /// An input value is not exactly representable in the declared input format.
    #[error("{what}[{index:?}] = {value:e} is not representable in {format}")]
    NotRepresentable {
        what: &'static str,
        index: Vec<usize>,
        value: f64,
        format: &'static str,
    },
    /// A pass was asked for without the operand it needs (e.g. dgrad without dout).
    #[error("pass {pass} needs {what}, which the case does not have")]
    MissingOperand {
        pass: &'static str,
        what: &'static str,
    },
    /// A routing parameter or input that the routing reference refuses; `what` names the
    /// parameter as `case.json` spells it (`topk`, `topk_groups`, `seq_len`, …) or the input
    /// (`logits`, `bias`). The CLI turns a parameter into its flag.
    #[error("{what}: {reason}")]
    InvalidRouting { what: &'static str, reason: String },
    /// An FP8 recipe that cannot be applied (a non-FP8 format, a scope that does not fit);
    /// `reason` is [`crate::fp8::RecipeError`]'s line.
    #[error("invalid FP8 recipe: {reason}")]
    InvalidRecipe { reason: String },
    /// An MoE-layer input or parameter the layer reference refuses; `what` names it.
    #[error("{what}: {reason}")]
    InvalidMoe { what: &'static str, reason: String },
}
