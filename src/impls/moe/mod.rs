//! The MoE layer's implementations besides `reference` and `exec:`: its CPU model
//! ([`emulate`]). There is no GPU implementation of the whole layer.

pub mod emulate;

use moecheck_reference::moe::MoeLayer;
use moecheck_reference::op::Implementation;

use crate::registry::Backends;

impl Backends for MoeLayer {
    type Bug = emulate::MoeBug;
    const DECLARES: &'static str = "compute and output formats";

    fn emulate(bug: Option<emulate::MoeBug>) -> Option<Box<dyn Implementation<MoeLayer>>> {
        Some(Box::new(emulate::MoeEmulate::with_bug(bug)))
    }
}
