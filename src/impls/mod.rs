//! Implementations under test, besides the reference itself
//! ([`moecheck_reference::implementation::Reference`]).
//!
//! * [`emulate`]: a CPU model of a tiled kernel, with planted bugs (`--inject`). A model,
//!   never a GPU result.
//! * [`exec`]: any external program, through the case-directory protocol (docs/protocol.md).

pub mod emulate;
pub mod exec;
pub mod moe_emulate;
