//! Every operation moecheck checks, in one list: `moecheck check` reads a case directory as
//! the first operation that claims it, and `moecheck selftest` runs a section for each one
//! that has a CPU model. Adding an operation to moecheck adds one line here.

use std::ops::ControlFlow;

use moecheck_properties::PropertyOp;
use moecheck_reference::fp8::Fp8Gemm;
use moecheck_reference::gemm::Gemm;
use moecheck_reference::moe::MoeLayer;
use moecheck_reference::protocol::Protocol;
use moecheck_reference::report::Reported;
use moecheck_reference::routing::Route;

use crate::backends::Backends;
use crate::contract::Contracted;
use crate::protocol::CaseHeader;

/// What an operation implements to take part in every command.
pub trait Operation: Protocol + Reported + PropertyOp + Backends + Contracted {}
impl<O: Protocol + Reported + PropertyOp + Backends + Contracted> Operation for O {}

/// Something done for each operation in turn.
pub trait Visit {
    /// Called with each operation and its title (`grouped gemm`, `fp8`, ...); `Break` stops
    /// the walk.
    fn visit<O: Operation>(&mut self, title: &'static str) -> ControlFlow<()>;
}

/// Visits every operation, in this order.
pub fn each(v: &mut impl Visit) {
    let _ = (|| {
        v.visit::<Gemm>("grouped gemm")?;
        v.visit::<Fp8Gemm>("fp8")?;
        v.visit::<Route>("routing")?;
        v.visit::<MoeLayer>("moe layer")
    })();
}

/// The operations' names (`gemm`, `fp8`, `route`, `moe`), in [`each`]'s order.
pub fn names() -> Vec<&'static str> {
    struct Names(Vec<&'static str>);
    impl Visit for Names {
        fn visit<O: Operation>(&mut self, _: &'static str) -> ControlFlow<()> {
            self.0.push(O::NAME);
            ControlFlow::Continue(())
        }
    }
    let mut n = Names(Vec::new());
    each(&mut n);
    n.0
}

/// The marker keys of the operations whose `case.json` says `op` (`fp8` for the FP8 grouped
/// GEMM among the `grouped_gemm` cases).
fn markers(op: &str) -> Vec<&'static str> {
    struct Markers<'a>(&'a str, Vec<&'static str>);
    impl Visit for Markers<'_> {
        fn visit<O: Operation>(&mut self, _: &'static str) -> ControlFlow<()> {
            if O::PROTOCOL_OP == self.0 {
                self.1.extend(O::MARKER);
            }
            ControlFlow::Continue(())
        }
    }
    let mut m = Markers(op, Vec::new());
    each(&mut m);
    m.1
}

/// Whether `O` reads the case `header` describes: its `op`, and its marker key; an operation
/// without a marker reads only cases that carry no other operation's marker.
pub fn reads<O: Protocol>(header: &CaseHeader) -> bool {
    let has = |k: &str| header.keys.iter().any(|x| x == k);
    header.op == O::PROTOCOL_OP
        && match O::MARKER {
            Some(k) => has(k),
            None => !markers(&header.op).into_iter().any(has),
        }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(op: &str, keys: &[&str]) -> CaseHeader {
        CaseHeader {
            protocol: 1,
            op: op.into(),
            keys: keys.iter().map(|k| k.to_string()).collect(),
            declared: Default::default(),
        }
    }

    #[test]
    fn each_case_is_read_by_exactly_one_operation() {
        let gemm = header("grouped_gemm", &["protocol", "op", "passes"]);
        let fp8 = header("grouped_gemm", &["protocol", "op", "passes", "fp8"]);
        assert!(reads::<Gemm>(&gemm) && !reads::<Fp8Gemm>(&gemm));
        assert!(reads::<Fp8Gemm>(&fp8) && !reads::<Gemm>(&fp8));
        assert!(reads::<Route>(&header("route", &[])) && !reads::<Gemm>(&header("route", &[])));
        assert!(reads::<MoeLayer>(&header("moe_layer", &[])));
        assert!(!reads::<MoeLayer>(&header("moe", &[])));
    }
}
