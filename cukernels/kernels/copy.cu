// Device-to-device copy: the bandwidth ceiling the engine checks its compile path and timer against.
// Layout: flat arrays of 16-byte vectors (uint4); one thread moves UNROLL vectors, loads issued before stores,
// the grid sized to the data. Measured on an H200 (2026-11-22): plain 16-byte loads/stores with UNROLL 1-2 and
// a data-sized grid reach 4.22 TB/s, as cudaMemcpy does; a persistent grid-stride loop and .cs / L1::no_allocate
// streaming hints were 3-12 % slower.

template <int UNROLL>
__global__ void __launch_bounds__(256) copy_vec16(const uint4* __restrict__ src, uint4* __restrict__ dst, long long n_vec) {
    const long long base = (long long)blockIdx.x * blockDim.x * UNROLL + threadIdx.x;
    uint4 v[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        const long long i = base + (long long)u * blockDim.x;
        if (i < n_vec) v[u] = src[i];
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        const long long i = base + (long long)u * blockDim.x;
        if (i < n_vec) dst[i] = v[u];
    }
}
