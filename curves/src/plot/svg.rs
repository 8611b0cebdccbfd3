//! The scene as SVG 1.1 text. Text is drawn by the viewer in DejaVu Sans (the plot's embedded
//! font) or, where the viewer lacks it, a similar sans-serif stretched to the measured width.

use std::fmt::Write as _;

use super::shape::{Anchor, Shape};
use super::text::advance;

/// The fonts asked of the viewer, in order.
const FAMILY: &str = "DejaVu Sans, Verdana, sans-serif";

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

pub fn render(scene: &[Shape], width: u32, height: u32) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}">"#
    );
    for shape in scene {
        let _ = match shape {
            Shape::Rect { x, y, w, h, fill } => writeln!(
                s,
                r#"<rect x="{x:.1}" y="{y:.1}" width="{w:.1}" height="{h:.1}" fill="{}"/>"#,
                fill.hex()
            ),
            Shape::Line {
                x1,
                y1,
                x2,
                y2,
                colour,
                width,
            } => writeln!(
                s,
                r#"<line x1="{x1:.1}" y1="{y1:.1}" x2="{x2:.1}" y2="{y2:.1}" stroke="{}" stroke-width="{width}"/>"#,
                colour.hex()
            ),
            Shape::Polyline {
                points,
                colour,
                width,
            } => {
                let pts: Vec<String> = points
                    .iter()
                    .map(|(x, y)| format!("{x:.1},{y:.1}"))
                    .collect();
                writeln!(
                    s,
                    r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="{width}" stroke-linejoin="round"/>"#,
                    pts.join(" "),
                    colour.hex()
                )
            }
            Shape::Dot { x, y, r, colour } => {
                writeln!(
                    s,
                    r#"<circle cx="{x:.1}" cy="{y:.1}" r="{r}" fill="{}"/>"#,
                    colour.hex()
                )
            }
            Shape::Text {
                x,
                y,
                text,
                colour,
                anchor,
                size,
            } => {
                let a = match anchor {
                    Anchor::Start => "start",
                    Anchor::Middle => "middle",
                    Anchor::End => "end",
                };
                // textLength: whatever font the viewer substitutes is fitted to the advance the
                // layout measured with the embedded one, so the boxes hold in SVG too.
                writeln!(
                    s,
                    r#"<text x="{x:.1}" y="{y:.1}" font-family="{FAMILY}" font-size="{size}" textLength="{:.1}" lengthAdjust="spacingAndGlyphs" text-anchor="{a}" fill="{}">{}</text>"#,
                    advance(text, *size),
                    colour.hex(),
                    escape(text)
                )
            }
        };
    }
    s.push_str("</svg>\n");
    s
}
