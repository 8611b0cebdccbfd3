//! The MoE layer's implementations besides `reference` and `exec:`: its CPU model
//! ([`emulate`]). There is no GPU implementation of the whole layer.

pub mod emulate;

use moecheck_reference::format::Format;
use moecheck_reference::moe::{LayerFormats, LayerPrecision, MoeCase, MoeLayer};
use moecheck_reference::op::Implementation;

use crate::backends::{Backends, Declared};

impl Backends for MoeLayer {
    type Bug = emulate::MoeBug;
    const DECLARES: &'static str = "compute, router and output formats";
    const DECLARATION_FLAGS: &'static [&'static str] =
        &["--compute", "--out-dtype", "--router-compute"];
    const NOT_DECLARED_BY: &'static str =
        "the MoE layer declares its compute, router and output formats (--compute, --router-compute, --out-dtype)";

    fn declaration(d: &Declared) -> Result<LayerFormats, String> {
        Ok(LayerFormats {
            compute: d.compute.unwrap_or(Format::F32),
            router: d.router_compute,
            output: d.out_dtype.unwrap_or(Format::F32),
        })
    }

    fn declared(_: &MoeCase, p: &LayerPrecision) -> Declared {
        Declared {
            compute: Some(p.compute),
            out_dtype: Some(p.output),
            router_compute: p.router,
            ..Declared::default()
        }
    }

    fn emulate(bug: Option<emulate::MoeBug>) -> Option<Box<dyn Implementation<MoeLayer>>> {
        Some(Box::new(emulate::MoeEmulate::with_bug(bug)))
    }
}
