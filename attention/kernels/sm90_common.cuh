// Shared by the Hopper (wgmma) attention kernels: copies of head-dim rows into the blocked, 128-byte-swizzled
// shared-memory layout that wgmma reads (cukernels/kernels/wgmma.cuh).
#pragma once

#include "common.cuh"
#include "wgmma.cuh"

namespace attn {

// ROWS rows of HEAD_DIM elements starting at row0 of src (row stride `stride` elements) -> the tile at shared
// byte address dst, stored as HEAD_DIM / 64 blocks of ROWS 128-byte rows; rows at or past rows_valid are
// zero-filled (not read). All THREADS threads of the block take part; one cp.async group is left open.
template <int ROWS, int HEAD_DIM, int THREADS, typename T>
__device__ __forceinline__ void load_rows_blocked(unsigned dst, const T* src, long long stride, int row0,
                                                  int rows_valid) {
    constexpr int CHUNKS = HEAD_DIM / 8;             // 16-byte chunks per row
    constexpr int ROWS_PER_PASS = THREADS / CHUNKS;  // rows one pass of all threads covers
    static_assert(THREADS % CHUNKS == 0 && ROWS_PER_PASS % 8 == 0 && ROWS % ROWS_PER_PASS == 0, "copy split");
    // a thread keeps its chunk and its row modulo 8 in every pass, so its swizzled offset moves by a constant
    // per pass: one base address and one pointer, not a hoisted address per pass (registers)
    const int r = threadIdx.x / CHUNKS, ch = threadIdx.x % CHUNKS;
    const unsigned d = dst + wgmma::blocked_offset<ROWS>(r, ch);
    const T* s = src + (row0 + r) * stride + ch * 8;
#pragma unroll
    for (int pass = 0; pass < ROWS / ROWS_PER_PASS; ++pass) {
        const bool ok = row0 + r + pass * ROWS_PER_PASS < rows_valid;
        cp_async16(d + pass * ROWS_PER_PASS * 128, ok ? s : src, ok);
        s += ROWS_PER_PASS * stride;
    }
}

// S = Q K^T for one warpgroup of a forward kernel: its 64 rows of the BLOCK_M-row Q tile (q_wg: the rows' start
// inside the first 64-column block) against the BLOCK_N-row K tile at k_st, both blocked with the 128-byte
// swizzle; the first k-step starts the sum (the accumulate predicate off: no zeroing of S, which ptxas did as 64
// register moves per K/V tile in the persistent tile's loop, stop 49); one wgmma group is committed and not waited
// for.
template <typename T, int HEAD_DIM, int BLOCK_M, int BLOCK_N>
__device__ __forceinline__ void issue_qk(float (&s)[BLOCK_N / 2], unsigned q_wg, unsigned k_st) {
    wgmma::fence();
    const unsigned q_lo = wgmma::desc_lo_k_major(q_wg), k_lo = wgmma::desc_lo_k_major(k_st);
#pragma unroll
    for (int kk = 0; kk < HEAD_DIM / 16; ++kk)
        wgmma::mma_ss<T, BLOCK_N>(s, wgmma::desc_of(q_lo + (((kk >> 2) * (BLOCK_M * 128) + (kk & 3) * 32) >> 4)),
                                  wgmma::desc_of(k_lo + (((kk >> 2) * (BLOCK_N * 128) + (kk & 3) * 32) >> 4)),
                                  kk > 0);
    wgmma::commit();
}

// The cp.async ring every Hopper attention kernel walks: a CTA's steps (KV tiles of a query tile in the forward,
// (q head, query tile) pairs of a KV tile in the backward) in the order first, next(first), ... up to `end`
// (next skips the steps whose tiles are invisible), STAGES - 1 steps' copies ahead. load(i, stage) issues step
// i's copies (the first cp.async group also carries whatever the kernel issued before); per step the driver
// waits for its stage, publishes it to the async proxy (wgmma reads it; cp.async wrote through the generic one)
// and to every thread, refills the stage the previous step freed, and runs step(i, stage, Bool<masked>) with
// element masks only where needs_mask(i) says the tile needs them. Returns with every copy landed.
template <int STAGES, typename Next, typename NeedsMask, typename Load, typename Step>
__device__ __forceinline__ void run_ring(int first, int end, const Next& next, const NeedsMask& needs_mask,
                                         const Load& load, Step&& step) {
    int load_i = first, load_stage = 0;
    auto issue = [&]() {
        if (load_i < end) {
            load(load_i, load_stage);
            load_i = next(load_i);
        }
        cp_async_commit();
        load_stage = load_stage + 1 == STAGES ? 0 : load_stage + 1;
    };
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) issue();
    int stage = 0;
    for (int i = first; i < end; i = next(i)) {
        cp_async_wait<STAGES - 2>();
        wgmma::fence_proxy_async();
        __syncthreads();  // step i landed for all; every thread is done with the stage refilled next
        issue();
        if (needs_mask(i))
            step(i, stage, Bool<true>{});
        else
            step(i, stage, Bool<false>{});
        stage = stage + 1 == STAGES ? 0 : stage + 1;
    }
    cp_async_wait<0>();
}

}  // namespace attn
