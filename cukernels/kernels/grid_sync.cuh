// Counters that CTAs of one grid wait on: the persistent MoE kernels' per-expert and router counts
// (moe/kernels/grouped_gemm.cu) and the one-launch attention backward's grid-wide barrier
// (attention/kernels/flash_bwd_tma.cu). Only for grids whose CTAs are all resident at once (planned from the
// driver's occupancy query): a CTA that waits on one not yet scheduled would wait forever.
#pragma once

// wait_count: one thread spins until the counter at p reaches target. An acquire load: what the counting
// threads wrote before their fence and atomic add is visible to this CTA after its next barrier.
__device__ __forceinline__ void wait_count(const int* p, int target) {
    int done;
    do {
        asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(done) : "l"(p) : "memory");
    } while (done < target);
}
