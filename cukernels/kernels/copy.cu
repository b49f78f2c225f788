// Device-to-device copy: the bandwidth ceiling the engine measures its timer and compile path against.
// Layout: flat arrays of 16-byte vectors (uint4). Each thread moves UNROLL vectors per grid-stride step, all loads
// issued before the first store so that UNROLL independent 16-byte requests are in flight per thread.
#include "engine_common.cuh"

template <int UNROLL>
__global__ void __launch_bounds__(256) copy_vec16(const uint4* __restrict__ src, uint4* __restrict__ dst, long long n_vec) {
    const long long stride = (long long)gridDim.x * blockDim.x * UNROLL;
    for (long long base = (long long)blockIdx.x * blockDim.x * UNROLL + threadIdx.x; base < n_vec; base += stride) {
        uint4 v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const long long i = base + (long long)u * blockDim.x;
            if (i < n_vec) v[u] = ldg_stream(src + i);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const long long i = base + (long long)u * blockDim.x;
            if (i < n_vec) stg_stream(dst + i, v[u]);
        }
    }
}
