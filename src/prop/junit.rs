//! `moecheck prop --junit FILE`: the campaign as JUnit XML, one `<testcase>` per property in
//! one `<testsuite name="moecheck prop OP">`, a `<failure>` with the reason and the reproduce
//! line for each failed property (`type="inconclusive"` for an inconclusive one), `<skipped>`
//! with the reason for one that checked nothing (not applicable, not run, skipped), and each
//! property's applied, refused and out-of-domain cases in its `<system-out>`, so CI systems
//! show it natively. Written as every user-named file is (`crate::user_file`).

use std::fmt::Write as _;

use super::report::{PropReport, PropertyVerdict};

/// `s` escaped for an XML 1.0 attribute value: the five markup characters as entities,
/// tab/newline/carriage return as character references (an attribute keeps them only so),
/// and the control characters XML 1.0 cannot hold as U+FFFD.
pub fn escape(s: &str) -> String {
    escape_with(s, true)
}

/// `s` escaped for XML 1.0 element text: as [`escape`], but tabs and newlines stay as they
/// are.
pub fn escape_text(s: &str) -> String {
    escape_with(s, false)
}

fn escape_with(s: &str, attribute: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\t' | '\n' if !attribute => out.push(c),
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' => out.push_str("&#9;"),
            '\n' => out.push_str("&#10;"),
            '\r' => out.push_str("&#13;"),
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

/// The JUnit XML document of `report`.
pub fn document(report: &PropReport) -> String {
    let total: f64 = report.properties.iter().map(|p| p.seconds).sum();
    let failures = report
        .properties
        .iter()
        .filter(|p| p.failed() || p.verdict == PropertyVerdict::Inconclusive)
        .count();
    let skipped = report
        .properties
        .iter()
        .filter(|p| p.checked_nothing())
        .count();
    let tests = report.properties.len();
    let suite = escape(&format!("moecheck prop {}", report.op));
    let class = escape(&format!("moecheck.prop.{}", report.op));
    let mut s = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        s,
        "<testsuites name=\"moecheck prop\" tests=\"{tests}\" failures=\"{failures}\" errors=\"0\" time=\"{total:.3}\">"
    );
    let _ = writeln!(
        s,
        "  <testsuite name=\"{suite}\" tests=\"{tests}\" failures=\"{failures}\" errors=\"0\" skipped=\"{skipped}\" time=\"{total:.3}\">"
    );
    let _ = writeln!(s, "    <properties>");
    for (name, value) in [
        ("impl", report.implementation.clone()),
        ("cases", report.cases.to_string()),
        ("seed", report.seed.to_string()),
        ("unexercised", report.unexercised.join(", ")),
    ] {
        let _ = writeln!(
            s,
            "      <property name=\"{name}\" value=\"{}\"/>",
            escape(&value)
        );
    }
    let _ = writeln!(s, "    </properties>");
    for p in &report.properties {
        let _ = write!(
            s,
            "    <testcase name=\"{}\" classname=\"{class}\" time=\"{:.3}\"",
            escape(&p.name),
            p.seconds
        );
        let out = format!(
            "      <system-out>{} applied, {} refused, {} outside the domain, {} inconclusive; exercised: {}</system-out>\n",
            p.cases,
            p.refused,
            p.outside,
            p.inconclusive,
            escape_text(&p.exercised.join(", "))
        );
        if p.checked_nothing() {
            let why = p.reason.as_deref().unwrap_or("not applicable");
            let _ = writeln!(
                s,
                ">\n      <skipped message=\"{}: {}\"/>\n{out}    </testcase>",
                p.verdict.shout().to_lowercase(),
                escape(why)
            );
            continue;
        }
        let kind = match p.verdict {
            PropertyVerdict::Fail => "property",
            PropertyVerdict::Inconclusive => "inconclusive",
            _ => {
                let _ = write!(s, ">\n{out}    </testcase>\n");
                continue;
            }
        };
        let reason = p.reason.as_deref().unwrap_or("failed");
        let mut body = format!("{}\n{reason}\n", p.description);
        for (label, value) in [
            ("shrunk to", &p.arguments),
            ("minimal case", &p.minimal_case),
            ("reproduce", &p.reproduce),
        ] {
            if let Some(v) = value {
                let _ = writeln!(body, "{label}: {v}");
            }
        }
        let _ = writeln!(
            s,
            ">\n      <failure message=\"{}\" type=\"{kind}\">{}</failure>\n{out}    </testcase>",
            escape(reason),
            escape_text(&body)
        );
    }
    s.push_str("  </testsuite>\n</testsuites>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prop::report::{PropertyResult, PropertyVerdict};

    #[test]
    fn escapes_markup_and_control_characters() {
        assert_eq!(
            escape("a<b & \"c\" 'd'>\n\te\u{1}"),
            "a&lt;b &amp; &quot;c&quot; &apos;d&apos;&gt;&#10;&#9;e\u{FFFD}"
        );
        assert_eq!(escape("plain ü"), "plain ü");
        assert_eq!(escape_text("a\n\tb\r<"), "a\n\tb&#13;&lt;");
    }

    fn result(name: &str, reason: Option<&str>) -> PropertyResult {
        PropertyResult {
            cases: 3,
            refused: 2,
            verdict: if reason.is_some() {
                PropertyVerdict::Fail
            } else {
                PropertyVerdict::Pass
            },
            reason: reason.map(String::from),
            arguments: reason.map(|_| "Args { k: 0 }".into()),
            minimal_case: reason.map(|_| "out/gemm-x-seed-0".into()),
            reproduce: reason.map(|_| "moecheck check 'out/a b'".into()),
            seconds: 0.25,
            ..PropertyResult::new(name, "checks <things> & more")
        }
    }

    #[test]
    fn one_testcase_per_property_and_a_failure_where_one_failed() {
        let skipped = PropertyResult {
            verdict: PropertyVerdict::Skipped,
            reason: Some("exec:a does not expose <its operands>".into()),
            cases: 0,
            ..result("internal", None)
        };
        let not_run = PropertyResult {
            verdict: PropertyVerdict::NotRun,
            reason: Some("every case refused".into()),
            cases: 0,
            ..result("k-zero", None)
        };
        let inconclusive = PropertyResult {
            verdict: PropertyVerdict::Inconclusive,
            reason: Some("inconclusive: bound admits zeros".into()),
            ..result("loose", None)
        };
        let properties = vec![
            result("fine", None),
            result("broken", Some("out[0, 0] = 1e0 < \"want\" 0")),
            skipped,
            not_run,
            inconclusive,
        ];
        let mut report = PropReport {
            verdict: moecheck_reference::op::VerdictKind::Pass,
            op: "gemm".into(),
            implementation: "exec:a && b".into(),
            is_model: false,
            cases: 3,
            seed: 1,
            max_shrink: 256,
            contract: Vec::new(),
            strict: false,
            unexercised: vec!["k-zero".into()],
            properties,
        };
        report.verdict = report.verdict_of();
        let xml = document(&report);
        assert_eq!(xml.matches("<testcase ").count(), 5, "{xml}");
        assert_eq!(xml.matches("<failure ").count(), 2, "{xml}");
        assert!(xml.contains("type=\"inconclusive\""), "{xml}");
        assert!(xml.contains(
            "<testsuite name=\"moecheck prop gemm\" tests=\"5\" failures=\"2\" errors=\"0\" skipped=\"2\""
        ));
        assert!(
            xml.contains(
                "<skipped message=\"skipped: exec:a does not expose &lt;its operands&gt;\"/>"
            ),
            "{xml}"
        );
        assert!(
            xml.contains("<skipped message=\"not run: every case refused\"/>"),
            "{xml}"
        );
        assert!(
            xml.contains("<system-out>3 applied, 2 refused, 0 outside the domain"),
            "{xml}"
        );
        assert!(
            xml.contains("name=\"unexercised\" value=\"k-zero\""),
            "{xml}"
        );
        assert!(xml.contains("value=\"exec:a &amp;&amp; b\""), "{xml}");
        assert!(xml.contains("message=\"out[0, 0] = 1e0 &lt; &quot;want&quot; 0\""));
        assert!(xml.contains("reproduce: moecheck check &apos;out/a b&apos;"));
    }
}
