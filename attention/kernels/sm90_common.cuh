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

}  // namespace attn
