//! The plot's header: a legend entry per curve (a colour swatch and `BASE file`/`TEST file`)
//! and the verdict, laid out from measured text so that they cannot collide.
//!
//! The verdict is placed first, at the right end of the header band; the entries share what
//! is left of it, less a gap: both on one line when they fit, otherwise one above the other,
//! each file name shortened in the middle (`torchtitan_llama3…reference.log`) to fit the
//! width left. Nothing else is drawn in the band, which ends above the top panel's title.

use std::path::Path;

use super::shape::{Anchor, Colour, Rect, Shape};
use super::text::{advance, bounds, elide, SIZE_TEXT, SIZE_VERDICT};
use crate::report::{CurvesReport, Verdict};

/// The header band: from the image's top to just above the top panel's title.
pub(super) struct Band {
    pub(super) left: f64,
    pub(super) right: f64,
    /// Baselines of the two rows (entries stacked) and the middle one (a single row).
    pub(super) rows: [f64; 2],
}

/// Swatch size and the gaps around it and between the entries and the verdict.
const SWATCH: (f64, f64) = (16.0, 4.0);
const SWATCH_GAP: f64 = 6.0;
const GAP: f64 = 24.0;

fn file_name(p: &str) -> &str {
    Path::new(p)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or(p)
}

/// One entry: a swatch whose left is at `x`, then `label` at `SIZE_TEXT`, on baseline `y`.
fn entry(out: &mut Vec<Shape>, x: f64, y: f64, colour: Colour, label: String) {
    out.push(Shape::Rect {
        x,
        y: y - 4.0 - SWATCH.1,
        w: SWATCH.0,
        h: SWATCH.1,
        fill: colour,
    });
    out.push(Shape::Text {
        x: x + SWATCH.0 + SWATCH_GAP,
        y,
        text: label,
        colour: Colour::Black,
        anchor: Anchor::Start,
        size: SIZE_TEXT,
    });
}

/// Pushes the legend and the verdict of `r` into `out`; returns the verdict's box.
pub(super) fn legend(r: &CurvesReport, band: &Band, out: &mut Vec<Shape>) -> Rect {
    let mid = 0.5 * (band.rows[0] + band.rows[1]);
    let verdict = r.verdict.label();
    let vbox = bounds(band.right, mid, verdict, Anchor::End, SIZE_VERDICT);
    out.push(Shape::Text {
        x: band.right,
        y: mid,
        text: verdict.to_string(),
        colour: match r.verdict {
            Verdict::Pass => Colour::Pass,
            Verdict::Fail => Colour::Fail,
            Verdict::Inconclusive => Colour::Black,
        },
        anchor: Anchor::End,
        size: SIZE_VERDICT,
    });
    // Text may start this far right of an entry's left edge and must end before the verdict
    // (its box can overhang its advance by a pixel: keep one more).
    let text_left = band.left + SWATCH.0 + SWATCH_GAP;
    let room = vbox.x0 - GAP - text_left - 1.0;
    let entries = [
        ("BASE ", file_name(&r.base.path), Colour::Base),
        ("TEST ", file_name(&r.test.path), Colour::Test),
    ];
    let whole: Vec<String> = entries.iter().map(|e| format!("{}{}", e.0, e.1)).collect();
    let one_line =
        advance(&whole[0], SIZE_TEXT) + GAP + SWATCH.0 + SWATCH_GAP + advance(&whole[1], SIZE_TEXT);
    if one_line <= room {
        let second = text_left + advance(&whole[0], SIZE_TEXT) + GAP;
        let [a, b] = [whole[0].clone(), whole[1].clone()];
        entry(out, band.left, mid, entries[0].2, a);
        entry(out, second, mid, entries[1].2, b);
    } else {
        for ((prefix, name, colour), y) in entries.into_iter().zip(band.rows) {
            let name = elide(name, SIZE_TEXT, room - advance(prefix, SIZE_TEXT));
            entry(out, band.left, y, colour, format!("{prefix}{name}"));
        }
    }
    vbox
}
