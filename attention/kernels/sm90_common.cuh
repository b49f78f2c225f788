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
    constexpr int CHUNKS = HEAD_DIM / 8;  // 16-byte chunks per row
    static_assert((ROWS * CHUNKS) % THREADS == 0, "copy split");
#pragma unroll
    for (int it = 0; it < ROWS * CHUNKS / THREADS; ++it) {
        const int i = it * THREADS + threadIdx.x;
        const int row = i / CHUNKS, ch = i % CHUNKS;
        const bool ok = row0 + row < rows_valid;
        cp_async16(dst + wgmma::blocked_offset<ROWS>(row, ch), src + (ok ? (row0 + row) * stride : 0) + ch * 8, ok);
    }
}

}  // namespace attn
