//! Text in the plot: DejaVu Sans (a subset embedded from `curves/assets/`, Bitstream Vera
//! licence, see `LICENSE-DejaVu.txt` there), measured and rasterised with `ab_glyph` — the
//! TrueType engine of the `plotters` crate's `ab_glyph` feature, used directly so that the box
//! the layout reserves for a text is computed from the very glyphs the rasteriser draws.
//!
//! Sizes are em sizes in pixels, as SVG's `font-size`. A text is placed by its baseline: its
//! box spans the font's ascent above the baseline and its descent below, and horizontally the
//! union of its advance widths and its glyphs' ink (a glyph may overhang its advance by a
//! pixel). A character the font lacks is measured and drawn as `?`.

use std::sync::OnceLock;

use ab_glyph::{Font, FontRef, Glyph, PxScale, ScaleFont};

use super::shape::{Anchor, Rect, Shape};

/// Em sizes in pixels: ordinary text (ticks, labels, the legend), panel titles, the verdict.
pub const SIZE_TEXT: f64 = 12.0;
pub const SIZE_TITLE: f64 = 15.0;
pub const SIZE_VERDICT: f64 = 20.0;

/// The embedded font file.
pub const FONT: &[u8] = include_bytes!("../../assets/DejaVuSans-subset.ttf");

fn font() -> &'static FontRef<'static> {
    static F: OnceLock<FontRef<'static>> = OnceLock::new();
    F.get_or_init(|| FontRef::try_from_slice(FONT).expect("the embedded font parses"))
}

/// ab_glyph scales by the font's height (ascent − descent); `size` is the em size.
fn scale(size: f64) -> PxScale {
    let f = font();
    let em = f.units_per_em().unwrap_or(2048.0);
    PxScale::from((size as f32) * f.height_unscaled() / em)
}

/// The glyphs of `text` at `size`, laid out along a baseline through the origin.
fn glyphs(text: &str, size: f64) -> (Vec<Glyph>, f64) {
    let f = font().as_scaled(scale(size));
    let missing = f.glyph_id('?');
    let mut x = 0f32;
    let mut prev = None;
    let mut out = Vec::with_capacity(text.len());
    for c in text.chars() {
        let mut id = f.glyph_id(c);
        if id.0 == 0 {
            id = missing;
        }
        if let Some(p) = prev {
            x += f.kern(p, id);
        }
        out.push(id.with_scale_and_position(f.scale(), ab_glyph::point(x, 0.0)));
        x += f.h_advance(id);
        prev = Some(id);
    }
    (out, x as f64)
}

/// The box of `text` at `size` relative to its baseline-left origin (y down).
pub fn extent(text: &str, size: f64) -> Rect {
    let f = font().as_scaled(scale(size));
    let (gs, advance) = glyphs(text, size);
    let mut r = Rect {
        x0: 0.0,
        y0: -(f.ascent() as f64),
        x1: advance,
        y1: -(f.descent() as f64),
    };
    for g in gs {
        if let Some(o) = font().outline_glyph(g) {
            let b = o.px_bounds();
            r.x0 = r.x0.min(b.min.x as f64);
            r.x1 = r.x1.max(b.max.x as f64);
            r.y0 = r.y0.min(b.min.y as f64);
            r.y1 = r.y1.max(b.max.y as f64);
        }
    }
    r
}

/// The advance width of `text` at `size` (what SVG's `textLength` is set to).
pub fn advance(text: &str, size: f64) -> f64 {
    glyphs(text, size).1
}

/// Where `anchor` puts the origin of a text of advance `width` drawn at `x`.
pub fn origin_x(x: f64, width: f64, anchor: Anchor) -> f64 {
    match anchor {
        Anchor::Start => x,
        Anchor::Middle => x - width / 2.0,
        Anchor::End => x - width,
    }
}

/// The box `text` covers when drawn with its `anchor` at `(x, y)` (y the baseline).
pub fn bounds(x: f64, y: f64, text: &str, anchor: Anchor, size: f64) -> Rect {
    let e = extent(text, size);
    let ox = origin_x(x, advance(text, size), anchor);
    Rect {
        x0: ox + e.x0,
        y0: y + e.y0,
        x1: ox + e.x1,
        y1: y + e.y1,
    }
}

/// The box a [`Shape::Text`] covers; `None` for other shapes.
pub fn box_of(shape: &Shape) -> Option<Rect> {
    match shape {
        Shape::Text {
            x,
            y,
            text,
            anchor,
            size,
            ..
        } => Some(bounds(*x, *y, text, *anchor, *size)),
        _ => None,
    }
}

/// Calls `pixel(x, y, coverage)` for every pixel the glyphs of `text` cover, drawn with its
/// `anchor` at `(x, y)`; coverage is in `(0, 1]`.
pub fn rasterise(
    (x, y): (f64, f64),
    text: &str,
    anchor: Anchor,
    size: f64,
    mut pixel: impl FnMut(i64, i64, f32),
) {
    let (gs, width) = glyphs(text, size);
    let ox = origin_x(x, width, anchor);
    for mut g in gs {
        g.position.x += ox as f32;
        g.position.y += y as f32;
        if let Some(o) = font().outline_glyph(g) {
            let b = o.px_bounds();
            o.draw(|gx, gy, c| {
                if c > 0.0 {
                    pixel(b.min.x as i64 + gx as i64, b.min.y as i64 + gy as i64, c);
                }
            });
        }
    }
}

/// `text` shortened in the middle with `…` so that its advance at `size` is at most `width`
/// (its start and end — a run's name and a file's extension — are kept). Unchanged when it
/// fits; `…` alone when nothing else does.
pub fn elide(text: &str, size: f64, width: f64) -> String {
    if advance(text, size) <= width {
        return text.to_string();
    }
    let chars: Vec<char> = text.chars().collect();
    let cut = |keep: usize| -> String {
        let head = keep.div_ceil(2);
        let tail = keep / 2;
        let mut s: String = chars[..head].iter().collect();
        s.push('…');
        s.extend(&chars[chars.len() - tail..]);
        s
    };
    // The longest `keep` that fits: widths grow with `keep`, so bisect.
    let (mut lo, mut hi) = (0usize, chars.len() - 1);
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if advance(&cut(mid), size) <= width {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    cut(lo)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_font_measures_text() {
        let a = advance("BASE", 12.0);
        assert!((25.0..40.0).contains(&a), "{a}");
        assert!(
            advance("WWWW", 12.0) > advance("iiii", 12.0),
            "proportional"
        );
        assert!((advance("x", 24.0) - 2.0 * advance("x", 12.0)).abs() < 1e-3);
        // A character outside the subset is a `?`.
        assert_eq!(advance("\u{4e2d}", 12.0), advance("?", 12.0));
    }

    /// Every pixel the rasteriser inks lies inside the box the layout reserves.
    #[test]
    fn drawn_pixels_lie_inside_the_measured_box() {
        let all: String = (' '..='~').chain('\u{a0}'..='\u{ff}').collect();
        for (text, anchor, size) in [
            (all.as_str(), Anchor::Start, 12.0),
            ("gjpqy_|Å", Anchor::Middle, 17.0),
            ("−0.25 δ σ … ≈", Anchor::End, 9.5),
        ] {
            let (x, y) = (400.3, 200.7);
            let b = bounds(x, y, text, anchor, size);
            let mut n = 0;
            rasterise((x, y), text, anchor, size, |px, py, _| {
                n += 1;
                let (px, py) = (px as f64, py as f64);
                assert!(
                    px >= b.x0.floor() && px + 1.0 <= b.x1.ceil() + 1.0,
                    "{text}: x {px} outside {b:?}"
                );
                assert!(
                    py >= b.y0.floor() && py + 1.0 <= b.y1.ceil() + 1.0,
                    "{text}: y {py} outside {b:?}"
                );
            });
            assert!(n > 0);
        }
    }

    #[test]
    fn long_names_are_elided_in_the_middle_to_fit() {
        let name = "torchtitan_llama3_8b_fsdp2_tp2_float8_rowwise_reference_loss_curve.log";
        let w = 200.0;
        let e = elide(name, 12.0, w);
        assert!(advance(&e, 12.0) <= w, "{e}");
        assert!(e.starts_with("torchtitan") && e.ends_with(".log") && e.contains('…'));
        assert_eq!(elide("short.log", 12.0, w), "short.log");
        assert_eq!(elide(name, 12.0, 1.0), "…");
    }
}
