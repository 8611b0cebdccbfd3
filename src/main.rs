//! The `moecheck` command line. See `moecheck --help`.
//!
//! Exit status: 0 pass, 1 a mismatch or failing implementation was found, 2 usage or input
//! error (with a one-line reason on stderr), 3 inconclusive (a bound without teeth; curves
//! that cannot decide).

mod cli;

use std::process::ExitCode;

fn main() -> ExitCode {
    keep_freed_memory();
    match cli::run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("moecheck: error: {}", cli::one_reason(&e));
            ExitCode::from(2)
        }
    }
}

/// Makes glibc's malloc keep the memory it frees for reuse instead of returning it to the
/// kernel: large allocations are served from the heap instead of mappings of their own, the
/// heap is not trimmed below 2 GiB of free memory, and every thread allocates from that one
/// heap (one arena): a worker thread's own arena is a chain of 64 MiB heaps, and glibc unmaps
/// a heap of the chain as soon as it is all free, whatever the trim threshold.
///
/// A large check allocates and frees gigabytes over and over (each shard's case and outputs,
/// each expert's copies). Memory handed back to the kernel is cleared again, page by page,
/// when it is touched next; on the virtual machines we run on that clearing ran at about
/// 0.2 GB/s, longer than the arithmetic. Measured on a 20-expert slice of DeepSeek-V3
/// (`gemm --experts 20 --tokens 320 --topk 8 --hidden 7168 --ffn 2048 --verify fast`, one
/// profiled run each): 19.5 s without it, 14.9 s with it. The memory kept raises peaks a
/// little (2.6 to 3.1 GB on 40 experts in 4 shards); the memory guard's figures
/// (`moecheck::memory`) are measured with it. One arena: on 40 experts of DeepSeek-V3
/// (`--experts 40 --tokens 640`, the same flags), 1.21 M page faults for a 4.1 GB peak
/// (0.7 GB faulted twice) became 1.04 M (none), two runs each.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn keep_freed_memory() {
    // SAFETY: mallopt only sets malloc's parameters; it is called before any other thread
    // exists. A refused setting leaves malloc as it was.
    unsafe {
        libc::mallopt(libc::M_MMAP_MAX, 0);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn keep_freed_memory() {}
