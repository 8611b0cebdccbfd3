//! What a grouped-GEMM implementation declares about the cases it runs ([`GemmDomain`]): the
//! conventions that change the case (its tail rule, outputs in its input dtype) and the domain
//! it supports (dtypes, passes, shapes). A campaign draws only cases inside it
//! ([`GemmDomain::fit`]) and reports which edge classes its cases exercised ([`edges`]).

use moecheck_reference::format::Format;
use moecheck_reference::gemm::{Pass, Passes, TailContract};

use super::strategies::{exp_range_for, int_max_for, GemmArgs};
use crate::coverage::{dtype_declared, edges_hit};

/// A grouped GEMM's declared contract. The default declares nothing: every drawn case, tail
/// rows exactly 0, each case's own output format, every pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GemmDomain {
    /// The tail rule of every case (`tail`): [`TailContract::Ignored`] for a kernel that
    /// never writes rows past `sum(group_sizes)`.
    pub tail: TailContract,
    /// Outputs in the input dtype (`out_dtype: input`, torch's `grouped_mm`): cases are drawn
    /// with their output format equal to their input format.
    pub out_is_input: bool,
    /// The input dtypes it runs (`None`: every drawn one).
    pub dtypes: Option<Vec<Format>>,
    /// The passes it implements.
    pub passes: Passes,
    /// Smallest `K` and `N` it runs (1 for a kernel that refuses empty dimensions).
    pub k_min: usize,
    pub n_min: usize,
    /// `K`, `N` and `M` (rows, tail included) are rounded up to these multiples.
    pub k_multiple: usize,
    pub n_multiple: usize,
    pub m_multiple: usize,
    /// Most experts (`None`: no limit).
    pub max_experts: Option<usize>,
}

impl Default for GemmDomain {
    fn default() -> Self {
        GemmDomain {
            tail: TailContract::Zero,
            out_is_input: false,
            dtypes: None,
            passes: Passes::ALL,
            k_min: 0,
            n_min: 0,
            k_multiple: 1,
            n_multiple: 1,
            m_multiple: 1,
            max_experts: None,
        }
    }
}

/// `x` rounded up to a multiple of `m` (`m >= 1`).
fn round_up(x: usize, m: usize) -> usize {
    x.div_ceil(m.max(1)) * m.max(1)
}

impl GemmDomain {
    /// `args` inside this domain, or why it is outside. Conventions are applied, `K`, `N`
    /// and `M` rounded up to their multiples (extra rows are tail rows); a dtype, a `K` or
    /// `N` below the minimum, or too many experts put a case outside.
    pub fn fit(&self, args: &GemmArgs) -> Result<GemmArgs, String> {
        let mut a = args.clone();
        dtype_declared(a.dtype, &self.dtypes)?;
        if let Some(max) = self.max_experts {
            if a.group_sizes.len() > max {
                return Err(format!(
                    "{} experts (declared maximum {max})",
                    a.group_sizes.len()
                ));
            }
        }
        if a.k < self.k_min {
            return Err(format!("K = {} (declared minimum {})", a.k, self.k_min));
        }
        if a.n < self.n_min {
            return Err(format!("N = {} (declared minimum {})", a.n, self.n_min));
        }
        a.k = round_up(a.k, self.k_multiple);
        a.n = round_up(a.n, self.n_multiple);
        let used: usize = a.group_sizes.iter().sum();
        a.tail_rows = round_up(used + a.tail_rows, self.m_multiple) - used;
        if self.out_is_input && a.out_dtype != a.dtype {
            a.out_dtype = a.dtype;
            // The drawn values were sized for a wider output: keep every sum finite in it.
            a.int_max = a.int_max.min(int_max_for(a.dtype, a.out_dtype));
            let range = exp_range_for(a.dtype, a.out_dtype, i32::MAX);
            let clamp = |e: i32| e.clamp(*range.start(), *range.end());
            a.lhs_exp = clamp(a.lhs_exp);
            a.dout_exp = clamp(a.dout_exp);
            a.expert_exp.iter_mut().for_each(|e| *e = clamp(*e));
        }
        a.tail = self.tail;
        a.passes = self.passes;
        Ok(a)
    }

    /// Why the property `name` does not apply here.
    pub fn relaxed(&self, name: &str) -> Option<String> {
        let needs = |pass: Pass| {
            (!self.passes.contains(pass)).then(|| {
                format!(
                    "needs the {} pass; the implementation declares passes {}",
                    pass.name(),
                    self.passes
                )
            })
        };
        match name {
            "fwd-matches-reference" => needs(Pass::Fwd),
            "dgrad-matches-reference" => needs(Pass::Dgrad),
            "wgrad-matches-reference" | "empty-expert-wgrad-zero" => needs(Pass::Wgrad),
            "tail-contract" if self.tail == TailContract::Ignored && !self.passes.wgrad => Some(
                "under tail ignored only drhs's independence of tail dout is checked, and the implementation declares no wgrad pass".into(),
            ),
            _ => None,
        }
    }
}

/// The grouped GEMM's edge classes, in report order.
const N_EDGES: usize = 11;

/// The edge classes, in report order.
pub const EDGES: &[&str; N_EDGES] = &[
    "k-zero",
    "n-zero",
    "empty-expert",
    "all-experts-empty",
    "tail-rows",
    "one-row-group",
    "tile-edge-group",
    "dtype-bf16",
    "dtype-f16",
    "dtype-f32",
    "out-narrower-than-f32",
];

/// The edge classes `a` exercises.
pub fn edges(a: &GemmArgs) -> Vec<&'static str> {
    let sizes = &a.group_sizes;
    let conditions = [
        a.k == 0,
        a.n == 0,
        sizes.contains(&0),
        sizes.iter().all(|&s| s == 0),
        a.tail_rows > 0,
        sizes.contains(&1),
        sizes.iter().any(|s| matches!(s, 63..=65 | 127..=129)),
        a.dtype == Format::Bf16,
        a.dtype == Format::F16,
        a.dtype == Format::F32,
        matches!(a.out_dtype, Format::Bf16 | Format::F16),
    ];
    edges_hit(EDGES, conditions)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::strategies::{case_args, Require};
    use proptest::strategy::{Strategy, ValueTree};
    use proptest::test_runner::TestRunner;

    fn drawn(n: usize) -> Vec<GemmArgs> {
        let mut runner = TestRunner::deterministic();
        let s = case_args(Require::default());
        (0..n)
            .map(|_| s.new_tree(&mut runner).unwrap().current())
            .collect()
    }

    /// Everything fitted is inside the domain and keeps its layout's meaning; what is
    /// outside says why.
    #[test]
    fn fitted_cases_are_inside_the_domain() {
        let d = GemmDomain {
            tail: TailContract::Ignored,
            out_is_input: true,
            dtypes: Some(vec![Format::Bf16, Format::F16]),
            passes: Passes::FWD,
            k_min: 1,
            n_min: 1,
            k_multiple: 8,
            n_multiple: 4,
            m_multiple: 16,
            max_experts: Some(6),
        };
        let (mut inside, mut outside) = (0, 0);
        for a in drawn(400) {
            match d.fit(&a) {
                Ok(f) => {
                    inside += 1;
                    assert!(f.dtype != Format::F32 && f.out_dtype == f.dtype, "{f:?}");
                    assert!(f.k >= 8 && f.k % 8 == 0 && f.n % 4 == 0 && f.m() % 16 == 0);
                    assert!(f.k >= a.k && f.group_sizes == a.group_sizes);
                    assert_eq!((f.tail, f.passes), (TailContract::Ignored, Passes::FWD));
                    assert!(f.group_sizes.len() <= 6);
                    // The case it builds is valid (values representable, sums finite).
                    let case = f.build();
                    let verdict = moecheck_reference::op::verify::<moecheck_reference::gemm::Gemm>(
                        &moecheck_reference::op::Reference,
                        &case,
                        f.passes,
                    )
                    .verdict;
                    if let Some(e) = verdict.failure() {
                        panic!("{f:?}: {e}");
                    }
                }
                Err(why) => {
                    outside += 1;
                    assert!(
                        why.starts_with("dtype f32")
                            || why.contains("declared minimum")
                            || why.contains("declared maximum"),
                        "{why}"
                    );
                }
            }
        }
        assert!(
            inside > 100 && outside > 50,
            "{inside} inside, {outside} outside"
        );
        assert_eq!(
            GemmDomain::default().fit(&drawn(1)[0]),
            Ok(drawn(1)[0].clone())
        );
    }

    #[test]
    fn properties_a_declaration_relaxes() {
        let fwd_only = GemmDomain {
            passes: Passes::FWD,
            tail: TailContract::Ignored,
            ..GemmDomain::default()
        };
        for name in [
            "dgrad-matches-reference",
            "wgrad-matches-reference",
            "empty-expert-wgrad-zero",
            "tail-contract",
        ] {
            assert!(fwd_only.relaxed(name).is_some(), "{name}");
        }
        assert_eq!(fwd_only.relaxed("fwd-matches-reference"), None);
        assert_eq!(fwd_only.relaxed("k-zero"), None);
        assert_eq!(GemmDomain::default().relaxed("tail-contract"), None);
    }

    #[test]
    fn edge_classes_of_a_case() {
        let mut a = drawn(1)[0].clone();
        a.k = 0;
        a.n = 3;
        a.group_sizes = vec![0, 1, 128];
        a.tail_rows = 2;
        a.dtype = Format::F16;
        a.out_dtype = Format::F32;
        assert_eq!(
            edges(&a),
            [
                "k-zero",
                "empty-expert",
                "tail-rows",
                "one-row-group",
                "tile-edge-group",
                "dtype-f16"
            ]
        );
    }
}
