//! The grouped GEMM's implementations besides `reference` and `exec:`: its CPU model
//! ([`emulate`]) and, with the `cuda` feature, our kernels and cuBLAS ([`crate::cuda`]).

pub(crate) mod blocked;
pub mod emulate;
pub mod fast;
mod simd;

use moecheck_reference::format::Format;
use moecheck_reference::gemm::{Accumulator, Gemm, Precision};
use moecheck_reference::op::Implementation;

use crate::registry::{Backends, Declared};

impl Backends for Gemm {
    type Bug = emulate::Bug;
    const DECLARES: &'static str = "accumulator";
    const DECLARATION_FLAGS: &'static [&'static str] = &["--acc", "--acc-block"];
    const NOT_DECLARED_BY: &'static str =
        "a grouped GEMM declares its accumulator (--acc, --acc-block); its output format is the case's";

    fn declaration(d: &Declared) -> Result<Accumulator, String> {
        if d.acc_block == Some(0) {
            return Err("--acc-block 0: a K block holds at least one product".into());
        }
        Ok(Accumulator {
            format: d.acc.unwrap_or(Format::F32),
            block: d.acc_block,
        })
    }

    fn declared(p: &Precision) -> Declared {
        Declared {
            acc: Some(p.accumulator.format),
            acc_block: p.accumulator.block,
            ..Declared::default()
        }
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
