//! Finding and loading the CUDA libraries without the user exporting anything.
//!
//! cudarc (with `dynamic-loading`) opens `libcuda`, `libnvrtc` and `libcublas` by their bare
//! names and **panics** when none loads. So before anything of cudarc is touched, we look for
//! each library ourselves and, when found outside the loader's path, `dlopen` it by absolute
//! path with `RTLD_GLOBAL`. glibc then satisfies cudarc's later `dlopen("libnvrtc.so.13")` with
//! the already-loaded object (matched by soname). A library that is found nowhere is reported
//! as absent, never loaded, so cudarc's panic is unreachable.
//!
//! Search order for each library: `MOECHECK_CUDA_LIB_DIRS` (colon-separated), the loader's own
//! path (`LD_LIBRARY_PATH`, ldconfig), the CUDA toolkit directories (`$CUDA_HOME`,
//! `/usr/local/cuda*`), then the PyPI wheels (`nvidia-cuda-nvrtc`, `nvidia-cublas`) found by
//! asking `python3` where the `nvidia` namespace package lives.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The CUDA major version the kernels and cudarc bindings are built for (`cuda-13000`).
pub const CUDA_MAJOR: u32 = 13;

/// A library this crate can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lib {
    /// The driver (`libcuda.so.1`), installed with the NVIDIA driver.
    Cuda,
    /// The run-time compiler (`libnvrtc.so.13`, needs `libnvrtc-builtins.so.13.*` beside it).
    Nvrtc,
    /// cuBLAS (`libcublas.so.13`, needs `libcublasLt.so.13`).
    Cublas,
}

impl Lib {
    pub const ALL: [Lib; 3] = [Lib::Cuda, Lib::Nvrtc, Lib::Cublas];

    pub fn name(self) -> &'static str {
        match self {
            Lib::Cuda => "libcuda",
            Lib::Nvrtc => "libnvrtc",
            Lib::Cublas => "libcublas",
        }
    }

    /// The file names tried, in order (the main library last: its dependencies load first).
    fn file_names(self) -> Vec<String> {
        match self {
            Lib::Cuda => vec!["libcuda.so.1".into(), "libcuda.so".into()],
            Lib::Nvrtc => vec![format!("libnvrtc.so.{CUDA_MAJOR}")],
            Lib::Cublas => vec![format!("libcublas.so.{CUDA_MAJOR}")],
        }
    }

    /// Libraries in the same directory that must be loaded first (prefixes; any version).
    fn companions(self) -> Vec<String> {
        match self {
            Lib::Cuda => vec![],
            Lib::Nvrtc => vec![format!("libnvrtc-builtins.so.{CUDA_MAJOR}")],
            Lib::Cublas => vec![format!("libcublasLt.so.{CUDA_MAJOR}")],
        }
    }
}

/// Where a library was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// Loadable by its bare name (on the loader's path).
    OnLoaderPath(String),
    /// Loaded by absolute path.
    At(PathBuf),
    /// Not found; the text says where we looked.
    Missing(String),
}

impl Found {
    pub fn is_present(&self) -> bool {
        !matches!(self, Found::Missing(_))
    }
    /// One word or path for reports.
    pub fn describe(&self) -> String {
        match self {
            Found::OnLoaderPath(n) => n.clone(),
            Found::At(p) => p.display().to_string(),
            Found::Missing(_) => "not found".into(),
        }
    }
}

/// Directories to search besides the loader's path, in order.
pub fn search_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Ok(v) = std::env::var("MOECHECK_CUDA_LIB_DIRS") {
        dirs.extend(v.split(':').filter(|s| !s.is_empty()).map(PathBuf::from));
    }
    let mut homes: Vec<PathBuf> = Vec::new();
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Ok(v) = std::env::var(var) {
            homes.push(PathBuf::from(v));
        }
    }
    homes.push(PathBuf::from("/usr/local/cuda"));
    if let Ok(rd) = std::fs::read_dir("/usr/local") {
        let mut versioned: Vec<PathBuf> = rd
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&format!("cuda-{CUDA_MAJOR}")))
            })
            .collect();
        versioned.sort();
        versioned.reverse();
        homes.extend(versioned);
    }
    for h in homes {
        dirs.push(h.join("lib64"));
        dirs.push(h.join("lib"));
        dirs.push(h.join("targets/x86_64-linux/lib"));
        dirs.push(h.join("targets/sbsa-linux/lib"));
    }
    dirs.push(PathBuf::from("/usr/lib/x86_64-linux-gnu"));
    dirs.push(PathBuf::from("/usr/lib64"));
    for p in python_nvidia_dirs() {
        for sub in [
            "cu13/lib",
            "cuda_nvrtc/lib",
            "cublas/lib",
            "cuda_runtime/lib",
        ] {
            dirs.push(p.join(sub));
        }
    }
    dirs
}

/// The `nvidia` namespace package directories of the PyPI CUDA wheels, asked of `python3`
/// (empty when there is no python3 or no wheel). Cached.
pub fn python_nvidia_dirs() -> Vec<PathBuf> {
    static DIRS: OnceLock<Vec<PathBuf>> = OnceLock::new();
    DIRS.get_or_init(|| {
        let out = std::process::Command::new("python3")
            .args([
                "-c",
                "import nvidia, os; print(os.pathsep.join(list(nvidia.__path__)))",
            ])
            .stderr(std::process::Stdio::null())
            .output();
        match out {
            Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout)
                .trim()
                .split(':')
                .filter(|s| !s.is_empty())
                .map(PathBuf::from)
                .collect(),
            _ => Vec::new(),
        }
    })
    .clone()
}

/// Header directories for NVRTC's `--include-path` (not needed by our kernels, which include
/// no CUDA headers; kept for reports).
pub fn find_in_dirs(dirs: &[PathBuf], file: &str) -> Option<PathBuf> {
    dirs.iter().map(|d| d.join(file)).find(|p| p.is_file())
}

/// The first file in `dir` whose name starts with `prefix`.
fn find_prefixed(dir: &Path, prefix: &str) -> Option<PathBuf> {
    let mut hits: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix) && !n.contains(".alt."))
        })
        .collect();
    hits.sort();
    hits.into_iter().next()
}

#[cfg(feature = "cuda")]
fn dlopen_global(path: &std::ffi::OsStr) -> bool {
    use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
    // SAFETY: loading a shared library runs its initialisers; these are NVIDIA's CUDA
    // libraries, loaded once and never unloaded (the handle is leaked on purpose so that the
    // symbols cudarc resolves later stay valid).
    match unsafe { Library::open(Some(path), RTLD_NOW | RTLD_GLOBAL) } {
        Ok(lib) => {
            std::mem::forget(lib);
            true
        }
        Err(_) => false,
    }
}

#[cfg(not(feature = "cuda"))]
fn dlopen_global(_path: &std::ffi::OsStr) -> bool {
    false
}

fn locate_and_load(lib: Lib) -> Found {
    // 1. The loader's own path.
    for name in lib.file_names() {
        if dlopen_global(std::ffi::OsStr::new(&name)) {
            return Found::OnLoaderPath(name);
        }
    }
    // 2. Known directories, by absolute path, companions first.
    let dirs = search_dirs();
    for dir in &dirs {
        for name in lib.file_names() {
            let p = dir.join(&name);
            if !p.is_file() {
                continue;
            }
            for c in lib.companions() {
                if let Some(cp) = find_prefixed(dir, &c) {
                    dlopen_global(cp.as_os_str());
                }
            }
            if dlopen_global(p.as_os_str()) {
                return Found::At(p);
            }
        }
    }
    Found::Missing(format!(
        "{} not on the loader path nor in {} searched directories",
        lib.file_names().join(" / "),
        dirs.len()
    ))
}

/// Finds and loads `lib` once per process; later calls return the first answer.
pub fn ensure(lib: Lib) -> Found {
    static CUDA: OnceLock<Found> = OnceLock::new();
    static NVRTC: OnceLock<Found> = OnceLock::new();
    static CUBLAS: OnceLock<Found> = OnceLock::new();
    let cell = match lib {
        Lib::Cuda => &CUDA,
        Lib::Nvrtc => &NVRTC,
        Lib::Cublas => &CUBLAS,
    };
    cell.get_or_init(|| locate_and_load(lib)).clone()
}
