//! The CUDA kernels of kernels/ executed on the CPU: the same source compiled as host C++
//! (shim.hpp beside this file: threads for a block, a barrier for `__syncthreads`), launched
//! with the grids and arguments src/cuda/ computes. This is a model of the GPU run (the
//! tensor-core path and the GPU's compiler are not exercised), never a GPU result; what it
//! checks without a GPU is the kernels' indexing, tiling, tails, empty groups, FP8 bit
//! patterns and routing rules.
//!
//! Needs a C++20 compiler (`$CXX`, else `g++`/`c++`). Without one the tests fail, unless
//! `MOECHECK_SKIP_HOST_CXX=1` (then one SKIPPED line).
//!
//! One test binary (`cargo test --test host_kernels`), one module per kernel family:
//! - `harness`: builds and loads the library (driver.cpp), the skip rule, symbol lookup;
//! - `grouped_gemm`: the tiled and mma grouped GEMM kernels under every GEMM property, and a
//!   planted kernel bug that must be caught;
//! - `fp8`: the casts, the recipe (amax, scale, cast) per scope, the column-wise copy and the
//!   FP8 grouped GEMM passes;
//! - `routing`: group-limited top-k, capacity, group sizes and the permutation.
#![cfg(feature = "cuda")]

mod fp8;
mod grouped_gemm;
mod harness;
mod routing;
