//! The shared part of the host-kernel tests: builds driver.cpp (which includes the kernels of
//! kernels/) into a shared library with the host C++20 compiler, loads it once per variant,
//! looks up its `mc_*` entry points, and decides when to skip.
//!
//! Why the families are modules of one test binary rather than one binary each: building the
//! library is a whole-source `g++ -O2` of every kernel (about 11 s wall on a 2-core machine),
//! and a build lives as long as its process (a `OnceLock`). One binary per family would build
//! it three times per `cargo test`, and three at once under a parallel runner such as
//! nextest. A cache of the `.so` in the target dir keyed by a hash of the sources, defines and
//! compiler would avoid that, but needs hashing, invalidation and an atomic publish between
//! concurrent processes, for nothing the tests need. So there is one binary
//! (tests/host_kernels/main.rs), one build of the plain library shared by every family, and
//! one of the planted variant for the test that needs it.

use std::path::PathBuf;
use std::sync::{Once, OnceLock};

/// The environment variable that turns a missing C++20 compiler into a skip.
const SKIP_VAR: &str = "MOECHECK_SKIP_HOST_CXX";

/// True when `MOECHECK_SKIP_HOST_CXX=1`: the calling test returns at once. The first call
/// that skips prints the one SKIPPED line of the binary.
pub fn skip() -> bool {
    static SAID: Once = Once::new();
    let skip = std::env::var(SKIP_VAR).is_ok_and(|v| v == "1");
    if skip {
        SAID.call_once(|| println!("host kernels: SKIPPED — {SKIP_VAR}=1"));
    }
    skip
}

/// Compiles driver.cpp (with the kernels) with `defines` into a fresh library in the temp
/// dir (named by `tag` and this process), loads it and removes the file. Tries `$CXX`, then `g++`, then `c++`.
///
/// Panics, with every compiler's error, when none of them builds it.
fn build(tag: &str, defines: &[&str]) -> libloading::Library {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let src = root.join("tests/host_kernels/driver.cpp");
    let out = std::env::temp_dir().join(format!(
        "moecheck-host-kernels-{tag}-{}.so",
        std::process::id()
    ));
    let compilers: Vec<String> = std::env::var("CXX")
        .ok()
        .into_iter()
        .chain(["g++".to_string(), "c++".to_string()])
        .collect();
    let mut errors = Vec::new();
    for cxx in &compilers {
        let r = std::process::Command::new(cxx)
            .args([
                "-std=c++20",
                "-O2",
                "-ffp-contract=off",
                "-fPIC",
                "-shared",
                "-pthread",
            ])
            .args(["-Wall", "-Wno-unknown-pragmas", "-Werror"])
            .args(defines.iter().map(|d| format!("-D{d}")))
            .arg("-o")
            .arg(&out)
            .arg(&src)
            .output();
        match r {
            Ok(o) if o.status.success() => {
                // SAFETY: our own freshly built library; its initialisers are trivial.
                let lib = unsafe { libloading::Library::new(&out) };
                // Loaded (mapped), the file is no longer needed: nothing stays in $TMPDIR.
                let _ = std::fs::remove_file(&out);
                return lib.expect("load the host kernels");
            }
            Ok(o) => errors.push(format!("{cxx}: {}", String::from_utf8_lossy(&o.stderr))),
            Err(e) => errors.push(format!("{cxx}: {e}")),
        }
    }
    panic!(
        "cannot build the host kernels (need a C++20 compiler, or {SKIP_VAR}=1):\n{}",
        errors.join("\n")
    );
}

/// The kernels as written (built on first use).
pub fn library() -> &'static libloading::Library {
    static LIB: OnceLock<libloading::Library> = OnceLock::new();
    LIB.get_or_init(|| build("plain", &[]))
}

/// The kernels with a planted bug: the last partial K block is skipped
/// (`MC_PLANT_SKIP_PARTIAL_K`, kernels/gemm_tile.cuh).
pub fn planted_library() -> &'static libloading::Library {
    static LIB: OnceLock<libloading::Library> = OnceLock::new();
    LIB.get_or_init(|| build("planted", &["MC_PLANT_SKIP_PARTIAL_K"]))
}

/// The entry point `$name` of driver.cpp as the function pointer type `$ty`, from `$lib`
/// (the plain [`library`] when not given). `$ty` must be the C signature in driver.cpp;
/// each family's file keeps those types beside a comment naming the function.
macro_rules! sym {
    ($name:literal, $ty:ty) => {
        $crate::harness::sym!($crate::harness::library(), $name, $ty)
    };
    ($lib:expr, $name:literal, $ty:ty) => {{
        // SAFETY: the symbol is defined in driver.cpp with exactly this C signature.
        let s: libloading::Symbol<$ty> = unsafe { $lib.get($name.as_bytes()) }.expect($name);
        *s
    }};
}
pub(crate) use sym;
