#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "wgmma.cuh"
// A test kernel for the offline compile's performance notes: a loop of wgmma with one group in flight over several
// work items. ZERO: each item zeroes its accumulators with ordinary instructions, which ptxas answers by serialising
// every wgmma (note C7515); otherwise each item's first wgmma starts the sums (accumulate = 0), and it pipelines.
template <bool ZERO>
__global__ void __launch_bounds__(128, 1) pipeline(float* out, int items, int steps) {
    __shared__ __align__(1024) unsigned char s[2 * 64 * 64 * 2];
    const unsigned a = (unsigned)__cvta_generic_to_shared(s), b = a + 64 * 64 * 2;
    const unsigned long long da = wgmma::desc_k_major(a), db = wgmma::desc_k_major(b);
    float d[32];
    float sum = 0.f;
    for (int item = 0; item < items; ++item) {
        if constexpr (ZERO)
#pragma unroll
            for (int i = 0; i < 32; ++i) d[i] = 0.f;
        for (int k = 0; k < steps; ++k) {
            wgmma::fence();
            if constexpr (ZERO) wgmma::mma_ss<__half, 64>(d, da, db);
            else wgmma::mma_ss<__half, 64>(d, da, db, k > 0);
            wgmma::commit();
            wgmma::wait<1>();
        }
        wgmma::wait<0>();
#pragma unroll
        for (int i = 0; i < 32; ++i) sum += d[i];
    }
    out[threadIdx.x] = sum;
}
