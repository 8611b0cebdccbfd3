// Compiles the CUDA kernels in kernels/ as host C++ (g++ -std=c++20 -DMC_HOST), so that the CPU
// tests (tests/host_kernels/) execute the very kernel source the GPU will run.
//
// A launch starts one std::thread per thread of a block; together they run the blocks one
// after another. `__syncthreads()` is a std::barrier over them, and so is the end of each
// block (so no thread starts the next block, reusing the `__shared__` arrays, which are
// function statics here, while another is still in the current one). This is exact for
// kernels that reach `__syncthreads` uniformly, which CUDA requires anyway; threads that
// return early without one simply wait at the block end. One launch at a time (a mutex):
// tests may call in parallel.
#pragma once
#include <barrier>
#include <mutex>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#define __device__
#define __forceinline__ inline
#define __global__
#define __launch_bounds__(...)
#define __shared__ static

struct mc_dim3 {
    unsigned x = 1, y = 1, z = 1;
};
inline mc_dim3 blockDim, gridDim;
inline thread_local mc_dim3 blockIdx, threadIdx;
inline std::mutex mc_launch_lock;
inline std::barrier<>* mc_barrier = nullptr;

inline void __syncthreads() { mc_barrier->arrive_and_wait(); }
inline void __trap() { std::abort(); }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __frcp_rn(float a) { return 1.0f / a; }

// Runs `f` as a kernel over `grid` blocks of `block` threads.
template <class F>
void mc_launch(mc_dim3 grid, mc_dim3 block, F f) {
    std::lock_guard<std::mutex> guard(mc_launch_lock);
    gridDim = grid;
    blockDim = block;
    const unsigned n = block.x * block.y * block.z;
    std::barrier<> bar(n);
    mc_barrier = &bar;
    std::vector<std::thread> threads;
    threads.reserve(n);
    for (unsigned t = 0; t < n; ++t)
        threads.emplace_back([&, t] {
            threadIdx = mc_dim3{t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
            for (unsigned bz = 0; bz < grid.z; ++bz)
                for (unsigned by = 0; by < grid.y; ++by)
                    for (unsigned bx = 0; bx < grid.x; ++bx) {
                        blockIdx = mc_dim3{bx, by, bz};
                        f();
                        bar.arrive_and_wait();  // the block ends for everyone
                    }
        });
    for (auto& th : threads) th.join();
    mc_barrier = nullptr;
}
