//! Implementations under test, besides the reference itself
//! ([`moecheck_reference::implementation::Reference`]).
//!
//! * [`emulate`]: a CPU model of a tiled kernel, with planted bugs (`--inject`). A model,
//!   never a GPU result.
//! * [`route_emulate`]: a CPU model of a routing kernel, with planted routing bugs.
//! * [`moe_emulate`]: a CPU model of a fused MoE-layer kernel, with planted backward bugs.
//! * [`exec`]: any external program, through the case-directory protocol (docs/protocol.md).

pub mod emulate;
pub mod emulate_fp8;
pub mod exec;
pub mod exec_fp8;
pub mod exec_route;
pub mod moe_emulate;
pub mod moe_exec;
pub mod route_emulate;
