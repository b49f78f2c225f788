// Tensor-core building blocks for sm_80+: cp.async 16-byte copies with zero fill, ldmatrix, mma.sync m16n8k16
// (fp16 or bf16 in, fp32 accumulate), and the XOR swizzle of a shared-memory tile whose rows are BK halves.
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace mma {

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, bypassing L1; src_bytes = 0 writes zeros (rows or columns past the edge).
__device__ __forceinline__ void cp_async_16(unsigned dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
// cp_async_16 with an L2 eviction-priority policy (createpolicy): rows read again by later tiles
__device__ __forceinline__ void cp_async_16_hint(unsigned dst, const void* src, int src_bytes,
                                                 unsigned long long policy) {
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes), "l"(policy));
}
__device__ __forceinline__ unsigned long long l2_evict_last_policy() {
    unsigned long long p;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(p));
    return p;
}
// an arrival on the mbarrier at ``mbar`` once every cp.async this thread issued so far has landed (noinc: the
// barrier's expected count includes this arrival)
__device__ __forceinline__ void cp_async_arrive_noinc(unsigned mbar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(mbar) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// D = A * B + D for one 16x8x16 tile: A row-major (4 regs), B "col" i.e. N x K rows (2 regs), D fp32 (4 regs).
template <typename T> __device__ __forceinline__ void mma_16816(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]);

template <> __device__ __forceinline__ void mma_16816<__half>(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a tile of rows of BK 2-byte elements. The chunk index is
// XORed with bits of the row so that the 8 rows one ldmatrix phase reads (same logical chunk, consecutive
// rows) land in 8 different 16-byte bank groups: BK = 64 (128-byte rows): chunk ^ (row % 8); BK = 32 (64-byte
// rows, two per 128-byte line): chunk ^ ((row / 2) % 4).
template <int BK> __device__ __forceinline__ int swizzle(int row, int chunk) {
    static_assert(BK == 32 || BK == 64, "BK must be 32 or 64");
    if constexpr (BK == 64) return row * 128 + ((chunk ^ (row & 7)) << 4);
    else return row * 64 + ((chunk ^ ((row >> 1) & 3)) << 4);
}

template <typename T> struct Convert;
template <> struct Convert<__half> {
    static __device__ __forceinline__ __half from(float x) { return __float2half_rn(x); }
    static __device__ __forceinline__ unsigned pack(float lo, float hi) {
        __half2 h = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<unsigned*>(&h);
    }
};
template <> struct Convert<__nv_bfloat16> {
    static __device__ __forceinline__ __nv_bfloat16 from(float x) { return __float2bfloat16_rn(x); }
    static __device__ __forceinline__ unsigned pack(float lo, float hi) {
        __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<unsigned*>(&h);
    }
};

}  // namespace mma
