//! Which narrower format an implementation's outputs look rounded to, when it did not say:
//! the evidence behind the `--out-dtype` hint ([`super::PassReport::looks_like`]).

use crate::format::Format;

/// Formats narrower than f32 that an implementation may have written without declaring
/// them: [`super::PassReport::looks_like`].
const NARROW: [Format; 2] = [Format::Bf16, Format::F16];

/// Whether every non-zero finite output seen is exactly a value of each [`NARROW`] format,
/// and whether every reference value is too (then outputs fitting says nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fit {
    got: [bool; 2],
    want: [bool; 2],
    nonzero: usize,
}

/// [`Fit::ALL`]: what a report read back from JSON holds (the evidence is not written).
impl Default for Fit {
    fn default() -> Fit {
        Fit::ALL
    }
}

impl Fit {
    /// The identity of [`Fit::and`].
    pub(crate) const ALL: Fit = Fit {
        got: [true; 2],
        want: [true; 2],
        nonzero: 0,
    };

    /// Tracks only the formats narrower than `out`: nothing to round for a bf16 output.
    pub(super) fn for_output(out: Format) -> Fit {
        let u = out.info().unit_roundoff();
        let narrower = NARROW.map(|f| f.info().unit_roundoff() > u);
        Fit {
            got: narrower,
            want: [true; 2],
            nonzero: 0,
        }
    }

    /// Whether the outputs still fit some format: once they fit none, [`Fit::push`] only
    /// counts non-zero outputs, which [`Fit::count`] takes for a whole row.
    pub(super) fn looking(&self) -> bool {
        self.got.iter().any(|&g| g)
    }

    /// [`Fit::push`] for outputs of which `nonzero` are finite and not zero, once
    /// [`Fit::looking`] is false.
    pub(super) fn count(&mut self, nonzero: usize) {
        self.nonzero += nonzero;
    }

    #[inline]
    pub(super) fn push(&mut self, got: f64, want: f64) {
        let fits = |x: f64, f: Format| {
            !x.is_finite()
                || x == 0.0
                || crate::format::round_to(x, f, crate::format::Overflow::Ieee) == x
        };
        if got.is_finite() && got != 0.0 {
            self.nonzero += 1;
        }
        for (i, f) in NARROW.into_iter().enumerate() {
            // Once the outputs do not fit, the reference need not be looked at either.
            self.got[i] = self.got[i] && fits(got, f);
            self.want[i] = self.got[i] && self.want[i] && fits(want, f);
        }
    }

    /// [`Fit::push`] of any number (at least one) of elements whose `got` and `want` are ±0:
    /// zeros fit every format, so only the rule that `want` is looked at where `got` fits
    /// applies.
    pub(super) fn push_zeros(&mut self) {
        for i in 0..NARROW.len() {
            self.want[i] = self.got[i] && self.want[i];
        }
    }

    pub(crate) fn and(self, o: Fit) -> Fit {
        let both = |a: [bool; 2], b: [bool; 2]| [a[0] && b[0], a[1] && b[1]];
        Fit {
            got: both(self.got, o.got),
            want: both(self.want, o.want),
            nonzero: self.nonzero + o.nonzero,
        }
    }

    /// The narrowest format every output fits but the reference does not, when narrower
    /// than `declared` and seen on at least 16 values (fewer could fit by chance).
    pub(crate) fn narrower_than(self, declared: Format) -> Option<Format> {
        let u = declared.info().unit_roundoff();
        if self.nonzero < 16 {
            return None;
        }
        (0..NARROW.len())
            .find(|&i| self.got[i] && !self.want[i] && NARROW[i].info().unit_roundoff() > u)
            .map(|i| NARROW[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Zeros in one step are zeros pushed one by one (±0 on either side), from the state of
    /// every output format and after values that do and do not fit bf16 and f16.
    #[test]
    fn push_zeros_is_push_of_zeros() {
        let starts = [Format::F64, Format::F32, Format::F16, Format::Bf16];
        let before: [&[(f64, f64)]; 3] = [&[], &[(1.5, 1.5)], &[(1.0 + 2f64.powi(-9), 1.0)]];
        for out in starts {
            for pushed in before {
                let mut one = Fit::for_output(out);
                for &(g, w) in pushed {
                    one.push(g, w);
                }
                let mut zeros = one;
                for (g, w) in [(0.0, -0.0), (-0.0, 0.0), (0.0, 0.0)] {
                    one.push(g, w);
                }
                zeros.push_zeros();
                assert_eq!(one, zeros, "{out} after {pushed:?}");
            }
        }
    }
}
