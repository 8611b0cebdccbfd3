//! The shape of the tree, checked so it stays as docs/architecture.md describes it:
//! no source file over 500 lines, and no import circle between files.
//!
//! An import is any `crate::a::b` or `super::a` path in a file (in a `use` or inline). It is
//! resolved to the deepest file module it names (`crate::gemm::compare::X` is
//! `gemm/compare.rs`). Facades — `lib.rs`, `main.rs` and `mod.rs` — are left out of the
//! circle check: they declare and re-export their children, so a path into one does not say
//! which file it reaches; every other pair of files must not import each other, directly or
//! round a longer loop.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The source roots and the crate each belongs to.
const ROOTS: [&str; 4] = ["src", "reference/src", "properties/src", "curves/src"];

/// Longest file allowed, in lines.
const MAX_LINES: usize = 500;

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The module path of `file` under `root` (`gemm/compare.rs` -> `["gemm", "compare"]`).
fn module_of(root: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(root).expect("under its root");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|c| c.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().expect("a file name");
    match last.as_str() {
        "lib.rs" | "main.rs" | "mod.rs" => {}
        name => parts.push(name.trim_end_matches(".rs").to_string()),
    }
    parts
}

fn is_facade(file: &Path) -> bool {
    matches!(
        file.file_name().and_then(|n| n.to_str()),
        Some("lib.rs" | "main.rs" | "mod.rs")
    )
}

/// Every `crate::…` and `super::…` path in `text`, as segments (`use a::{b, c}` groups are
/// cut at the brace: the prefix before it is enough to find the file).
fn paths(text: &str) -> Vec<(bool, Vec<String>)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        for (start, is_crate) in code
            .match_indices("crate::")
            .map(|(i, _)| (i, true))
            .chain(code.match_indices("super::").map(|(i, _)| (i, false)))
        {
            if start > 0 {
                let before = code.as_bytes()[start - 1];
                if before.is_ascii_alphanumeric() || before == b'_' || (is_crate && before == b':')
                {
                    continue;
                }
            }
            let rest = &code[start..];
            let segs: Vec<String> = rest
                .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .next()
                .unwrap_or("")
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect();
            out.push((is_crate, segs));
        }
    }
    out
}

#[test]
fn no_source_file_is_over_500_lines() {
    let mut long = Vec::new();
    for root in ROOTS {
        let mut files = Vec::new();
        rust_files(&workspace().join(root), &mut files);
        for f in files {
            let n = std::fs::read_to_string(&f).unwrap().lines().count();
            if n > MAX_LINES {
                long.push(format!("{} ({n} lines)", f.display()));
            }
        }
    }
    assert!(
        long.is_empty(),
        "files over {MAX_LINES} lines:\n{}",
        long.join("\n")
    );
}

/// The files among `files` (path and text, all under `root`) that import themselves round a
/// circle.
fn circles_in(root: &Path, files: &[(PathBuf, String)]) -> Vec<PathBuf> {
    let by_module: BTreeMap<Vec<String>, &PathBuf> =
        files.iter().map(|(f, _)| (module_of(root, f), f)).collect();
    let mut edges: BTreeMap<&PathBuf, BTreeSet<&PathBuf>> = BTreeMap::new();
    for (f, text) in files {
        let here = module_of(root, f);
        for (is_crate, segs) in paths(text) {
            // `super` of `a/b.rs` (module a::b) and of `a/b/mod.rs` (module a::b) is `a`.
            let mut full: Vec<String> = if is_crate {
                Vec::new()
            } else {
                here[..here.len().saturating_sub(1)].to_vec()
            };
            for s in segs.iter().skip(1) {
                if s == "super" {
                    full.pop();
                } else {
                    full.push(s.clone());
                }
            }
            // The deepest prefix that is a file module.
            let target = (0..=full.len())
                .rev()
                .find_map(|n| by_module.get(&full[..n]).copied());
            if let Some(t) = target {
                if t != f && !is_facade(t) && !is_facade(f) {
                    edges.entry(f).or_default().insert(t);
                }
            }
        }
    }
    let mut circles = Vec::new();
    for (&start, next) in &edges {
        let mut seen = BTreeSet::new();
        let mut stack: Vec<&PathBuf> = next.iter().copied().collect();
        while let Some(n) = stack.pop() {
            if n == start {
                circles.push(start.clone());
                break;
            }
            if seen.insert(n) {
                stack.extend(edges.get(n).into_iter().flatten().copied());
            }
        }
    }
    circles
}

#[test]
fn no_import_circle_between_files() {
    let mut circles = Vec::new();
    for root in ROOTS {
        let root = workspace().join(root);
        let mut files = Vec::new();
        rust_files(&root, &mut files);
        let files: Vec<(PathBuf, String)> = files
            .into_iter()
            .map(|f| {
                let text = std::fs::read_to_string(&f).unwrap();
                (f, text)
            })
            .collect();
        circles.extend(circles_in(&root, &files));
    }
    let names: Vec<String> = circles
        .iter()
        .map(|f| {
            f.strip_prefix(workspace())
                .unwrap_or(f)
                .display()
                .to_string()
        })
        .collect();
    assert!(
        names.is_empty(),
        "files that import themselves round a circle:\n{}",
        names.join("\n")
    );
}

/// The checker can fail: sibling files that import each other (directly, and round a loop of
/// three) are found, and a one-way import is not a circle.
#[test]
fn the_circle_check_sees_planted_circles() {
    let root = PathBuf::from("/r");
    let file = |name: &str, text: &str| (root.join(name), text.to_string());
    let two = [
        file("lib.rs", "pub mod a;\npub mod b;"),
        file("a.rs", "use super::b::Thing;"),
        file("b.rs", "fn f() { crate::a::g(); }"),
    ];
    assert_eq!(circles_in(&root, &two).len(), 2);
    let three = [
        file("x/mod.rs", "pub mod p; pub mod q; pub mod s;"),
        file("x/p.rs", "use super::q::Q;"),
        file("x/q.rs", "use crate::x::s::S;"),
        file("x/s.rs", "use super::super::x::p::P;"),
    ];
    assert_eq!(circles_in(&root, &three).len(), 3);
    let one_way = [
        file("a.rs", "use super::b::Thing;"),
        file("b.rs", "// use crate::a::g;\nlet s = 1;"),
    ];
    assert!(circles_in(&root, &one_way).is_empty());
}
