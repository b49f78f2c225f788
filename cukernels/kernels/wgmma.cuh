// Hopper warpgroup MMA (sm_90a) for every op package: matrix descriptors, ordering fences, and (wgmma_ops.cuh,
// generated) the mma_async wrappers. Compiled only into sm_90a instances: the planners pick wgmma tiles on
// sm_90a alone.
//
// Shared-memory operand layout: 128-byte swizzle. A tile is stored as blocks of 64 16-bit elements per row
// (128-byte rows); within a block, 16-byte chunk c of row r sits at chunk c ^ (r % 8), and 8 consecutive rows
// form a 1024-byte atom (so every block must start 1024-byte aligned). A K-major operand (rows = M or N, the
// 64 elements = K) steps through K by advancing the start address 32 bytes per k16 step inside a block; an
// MN-major operand (rows = K, the 64 elements = M or N) steps through K by 16 rows = 2048 bytes.
#pragma once

#include "wgmma_ops.cuh"

namespace wgmma {

// byte offset of 16-byte chunk `chunk` of row `row` in a ROWS-row tile stored as 64-element blocks
template <int ROWS>
__device__ __forceinline__ int blocked_offset(int row, int chunk) {
    return (chunk >> 3) * (ROWS * 128) + row * 128 + (((chunk & 7) ^ (row & 7)) << 4);
}

// A descriptor as its low word (start address >> 4 in bits 0-13, leading offset in bits 16-29) beside a constant
// high word (stride between 8-row atoms 1024 B in bits 32-45, layout type SWIZZLE_128B in bits 62-63). A loop that
// adds each k-step's offset (bytes >> 4) to one low word issues one 32-bit add per operand per wgmma; rebuilding a
// descriptor from its address per k-step, or a 64-bit add, takes three to six uniform-datapath instructions (the
// forward's consumers issued ~7 per wgmma: 16 % of their instructions, docs/perf/attention.md v3.8). The start
// field cannot carry into the leading offset: shared memory lies below 256 KiB, so start + offset stays under 2^14.
constexpr unsigned DESC_HI = 64u | (1u << 30);
__device__ __forceinline__ unsigned long long desc_of(unsigned lo) {
    return ((unsigned long long)DESC_HI << 32) | lo;
}

// K-major, 128-byte swizzle: the leading offset is unused by this layout (1)
__device__ __forceinline__ unsigned desc_lo_k_major(unsigned smem_byte_addr) {
    return ((smem_byte_addr & 0x3FFFF) >> 4) | (1u << 16);
}
__device__ __forceinline__ unsigned long long desc_k_major(unsigned smem_byte_addr) {
    return desc_of(desc_lo_k_major(smem_byte_addr));
}

// MN-major, 128-byte swizzle: leading offset = bytes between consecutive 64-element blocks along M/N,
// stride offset = bytes between consecutive 8-row atoms along K (1024)
__device__ __forceinline__ unsigned desc_lo_mn_major(unsigned smem_byte_addr, unsigned block_bytes) {
    return ((smem_byte_addr & 0x3FFFF) >> 4) | ((block_bytes >> 4) << 16);
}
__device__ __forceinline__ unsigned long long desc_mn_major(unsigned smem_byte_addr, unsigned block_bytes) {
    return desc_of(desc_lo_mn_major(smem_byte_addr, block_bytes));
}

// The descriptor of the tile `bytes` further on, for kernels that keep 64-bit descriptors: a 32-bit add on the low
// word (no carry to propagate, as above: the compiler then keeps the high word as it is).
__device__ __forceinline__ unsigned long long advance(unsigned long long desc, unsigned bytes) {
    return (desc & 0xFFFFFFFF00000000ull) | (unsigned)((unsigned)desc + (bytes >> 4));
}

// The calling thread's warpgroup (threadIdx.x / 128) as a value the compiler knows to be the same in every lane of
// the warp (a broadcast from lane 0): what is computed from it (shared-memory offsets, wgmma descriptors) can live
// in uniform registers, where threadIdx.x / 128 leaves them in per-thread registers moved by R2UR before each wgmma.
__device__ __forceinline__ int warpgroup() {
    return __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) >> 7, 0);
}

__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Pins registers that an in-flight wgmma reads or accumulates into: the compiler sees each as read and written
// here, so no computation on them moves across this point (call it after wait<>() before touching accumulators
// of a group issued earlier, and before issuing a group on registers just computed).
template <int N>
__device__ __forceinline__ void fence_operands(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_operands(unsigned (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+r"(d[i])::"memory");
}

// shared memory written through the generic proxy (st.shared, cp.async) before wgmma reads it
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

}  // namespace wgmma
