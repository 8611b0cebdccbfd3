//! The grouped GEMM's implementations besides `reference` and `exec:`: its CPU model
//! ([`emulate`]) and, with the `cuda` feature, our kernels and cuBLAS ([`crate::cuda`]).

pub(crate) mod blocked;
pub mod emulate;
mod simd;

use moecheck_reference::format::Format;
use moecheck_reference::gemm::{
    Accumulator, Gemm, GemmDeclaration, GroupedGemmCase, Precision, Verify,
};
use moecheck_reference::op::Implementation;

use crate::backends::{Backends, Declared};

impl Backends for Gemm {
    type Bug = emulate::Bug;
    const DECLARES: &'static str = "accumulator and output format";
    const DECLARATION_FLAGS: &'static [&'static str] = &["--acc", "--acc-block", "--out-dtype"];
    const NOT_DECLARED_BY: &'static str =
        "a grouped GEMM declares its accumulator (--acc, --acc-block) and, where it is not the case's, its output format (--out-dtype)";

    fn declaration(d: &Declared) -> Result<GemmDeclaration, String> {
        if d.acc_block == Some(0) {
            return Err("--acc-block 0: a K block holds at least one product".into());
        }
        Ok(GemmDeclaration {
            accumulator: Accumulator {
                format: d.acc.unwrap_or(Format::F32),
                block: d.acc_block,
            },
            output: d.out_dtype,
        })
    }

    /// The output format only where it is not the case's (cuBLAS's grouped GEMM writing
    /// bf16 for an f32 case).
    fn declared(case: &GroupedGemmCase, p: &Precision) -> Declared {
        Declared {
            acc: Some(p.accumulator.format),
            acc_block: p.accumulator.block,
            out_dtype: (p.output != case.out_dtype).then_some(p.output),
            ..Declared::default()
        }
    }

    /// Full (the default) or fast verification.
    fn check_mode(verify: Option<Verify>) -> Result<Verify, String> {
        Ok(verify.unwrap_or_default())
    }

    fn emulate(bug: Option<emulate::Bug>) -> Option<Box<dyn Implementation<Gemm>>> {
        Some(Box::new(emulate::Emulate::with_bug(bug)))
    }
    fn gpu_names() -> &'static [&'static str] {
        &crate::cuda::IMPL_NAMES
    }
    fn gpu(name: &str) -> Option<Box<dyn Implementation<Gemm>>> {
        crate::cuda::build(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::declaration;
    use moecheck_reference::gemm::TailContract;
    use moecheck_reference::op::Op;

    /// What a dump records of an implementation's precision declares that precision again
    /// (`moecheck check` reproduces the run), and names the output format only where it is
    /// not the case's: cuBLAS's grouped GEMM writes bf16 for an f32 case.
    #[test]
    fn the_recorded_declaration_declares_the_precision_again() {
        let case = GroupedGemmCase {
            lhs: ndarray::Array2::zeros((2, 3)),
            rhs: ndarray::Array3::<f32>::zeros((1, 3, 4)).into(),
            group_sizes: vec![2],
            dout: None,
            dtype: Format::Bf16,
            out_dtype: Format::F32,
            tail: TailContract::Zero,
        };
        for (acc, block, output) in [
            (Format::F32, None, Format::F32),
            (Format::F32, None, Format::Bf16),
            (Format::Bf16, Some(16), Format::F16),
            (Format::F64, None, Format::F64),
        ] {
            let p = Precision {
                input: case.dtype,
                accumulator: Accumulator { format: acc, block },
                output,
            };
            let d = <Gemm as Backends>::declared(&case, &p);
            assert_eq!(d.out_dtype, (output != case.out_dtype).then_some(output));
            let again = declaration::<Gemm>(&d).unwrap();
            assert_eq!(Gemm::declared_precision(&case, &again), p, "{d:?}");
        }
    }
}
