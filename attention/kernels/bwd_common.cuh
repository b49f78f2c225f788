// Helpers for the backward kernels, on top of common.cuh (which the forward owns): a swizzle that also covers
// 32-column tiles (the P / dS tiles when a query tile has 32 rows), per-lane ldmatrix addresses for the four
// ways an mma.sync m16n8k16 operand is read from a swizzled tile, and unpacking of T pairs to fp32.
#pragma once

#include "common.cuh"

namespace attn {

// Element offset of 16-byte chunk `chunk` of row `row` in a swizzled ROWS x COLS tile. COLS >= 64: common.cuh's
// XOR with row & 7. COLS == 32 (4 chunks per row, two rows per 128-byte line): chunk ^ ((row >> 1) & 3), so the
// 8 consecutive rows an ldmatrix phase reads still land in 8 different 16-byte bank groups.
template <int COLS>
__device__ __forceinline__ int swz(int row, int chunk) {
    if constexpr (COLS >= 64) {
        return swizzled<COLS>(row, chunk);
    } else {
        static_assert(COLS == 32, "tiles of 32 or a multiple of 64 columns");
        return row * 32 + ((chunk ^ ((row >> 1) & 3)) << 3);
    }
}

// Shared-space byte address that this lane passes to ldmatrix_x4 for one 16x16 operand block.
//   A  : A[m][k] stored row-major [m][COLS]      -> a0..a3 of mma's A      (ldmatrix)
//   At : A[m][k] stored transposed [k][COLS=m]   -> a0..a3                 (ldmatrix.trans)
//   B  : B[k][n] stored as rows of n: [n][COLS=k] -> b0,b1 of n-tile 0, b0,b1 of n-tile 1 (ldmatrix)
//   Bt : B[k][n] stored row-major [k][COLS=n]    -> same order             (ldmatrix.trans)
template <int COLS>
__device__ __forceinline__ unsigned addr_A(unsigned base, int m0, int k0) {
    const int lane = threadIdx.x & 31;
    return base + 2 * swz<COLS>(m0 + (lane & 7) + ((lane >> 3) & 1) * 8, (k0 >> 3) + (lane >> 4));
}
template <int COLS>
__device__ __forceinline__ unsigned addr_At(unsigned base, int m0, int k0) {
    const int lane = threadIdx.x & 31;
    return base + 2 * swz<COLS>(k0 + (lane & 7) + (lane >> 4) * 8, (m0 >> 3) + ((lane >> 3) & 1));
}
template <int COLS>
__device__ __forceinline__ unsigned addr_B(unsigned base, int n0, int k0) {
    const int lane = threadIdx.x & 31;
    return base + 2 * swz<COLS>(n0 + (lane & 7) + (lane >> 4) * 8, (k0 >> 3) + ((lane >> 3) & 1));
}
template <int COLS>
__device__ __forceinline__ unsigned addr_Bt(unsigned base, int k0, int n0) {
    const int lane = threadIdx.x & 31;
    return base + 2 * swz<COLS>(k0 + (lane & 7) + ((lane >> 3) & 1) * 8, (n0 >> 3) + (lane >> 4));
}

// A packed pair of T (low half first) as two floats.
template <typename T>
__device__ __forceinline__ float2 unpack2(unsigned u) {
    if constexpr (same_type<T, __half>::value) {
        return __half22float2(*reinterpret_cast<__half2*>(&u));
    } else {
        return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&u));
    }
}

__device__ __forceinline__ float pos_inf() { return __int_as_float(0x7f800000); }

}  // namespace attn
