// Stop 57 probe: streaming the touched experts' weight blocks (the decode layer's up items: contiguous blocks of
// BN rows x K) at the rate the skinny items read them (register loads in 64-byte pieces, U chunks, a barrier per
// item) against bulk async copies into a shared-memory ring (mbarriers, one producer thread) and a plain coalesced
// read. Each CTA takes items blockIdx.x, + gridDim.x, ...; item i is block (i % nb) of expert experts[i / nb].
#include <cuda_bf16.h>
#include "tma.cuh"

__device__ __forceinline__ uint4 ld_nc16(const void* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

// as skinny_item with BN = 32 (WN 2 x KS 4 warps, MI 1): lane (g, q) reads rows g, g + 8 of its 16, 16 bytes at
// column 8 q of each 32-column chunk, U chunks in flight, then a barrier at the item's end
template <int U>
__global__ void __launch_bounds__(256, 2) regs_stream(const __nv_bfloat16* __restrict__ w, const int* __restrict__ experts,
                                                      int items, int nb, int N, int K, unsigned* __restrict__ out) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int kg = warp % 4, ng = warp / 4;
    const int chunks = K / 32, c_lo = kg * chunks / 4, c_hi = (kg + 1) * chunks / 4;
    unsigned acc = 0;
    for (int item = blockIdx.x; item < items; item += gridDim.x) {
        const int e = experts[item / nb], n0 = (item % nb) * 32;
        const __nv_bfloat16* r0 = w + ((size_t)e * N + n0 + ng * 16 + g) * K + 8 * q;
        const __nv_bfloat16* r1 = r0 + (size_t)8 * K;
        for (int c0 = c_lo; c0 < c_hi; c0 += U) {
            uint4 v[U][2];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const bool ok = c0 + u < c_hi;
                v[u][0] = ok ? ld_nc16(r0 + (c0 + u) * 32) : make_uint4(0, 0, 0, 0);
                v[u][1] = ok ? ld_nc16(r1 + (c0 + u) * 32) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < U; ++u) acc ^= v[u][0].x ^ v[u][0].w ^ v[u][1].y ^ v[u][1].z;
        }
        __syncthreads();
    }
    if (acc == 0x12345678u) out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

// bulk copies: thread 0 streams each item (contiguous BN x K block) in pieces of STAGE bytes through a ring of S
// stages; warps 1-7 read each stage from shared memory (16 bytes per thread per step) and free it
template <int S, int STAGE>
__global__ void __launch_bounds__(256, 2) bulk_stream(const __nv_bfloat16* __restrict__ w, const int* __restrict__ experts,
                                                      int items, int nb, int N, int K, unsigned* __restrict__ out) {
    extern __shared__ __align__(128) unsigned char ring[];
    __shared__ __align__(8) unsigned long long full[S], empty[S];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const long long item_bytes = 32ll * K * 2;
    const int pieces = (int)(item_bytes / STAGE);
    if (tid == 0) {
        for (int s = 0; s < S; ++s) {
            tma::mbar_init(tma::smem_u32(&full[s]), 1);
            tma::mbar_init(tma::smem_u32(&empty[s]), 7);
        }
        tma::fence_mbar_init();
    }
    __syncthreads();
    const int my_items = items > (int)blockIdx.x ? (items - 1 - blockIdx.x) / gridDim.x + 1 : 0;
    const int total = my_items * pieces;
    unsigned acc = 0;
    if (warp == 0) {
        if (lane == 0) {
            for (int p = 0; p < total; ++p) {
                const int s = p % S, round = p / S;
                if (round > 0) tma::mbar_wait(tma::smem_u32(&empty[s]), (round - 1) & 1);
                const int item = blockIdx.x + (p / pieces) * gridDim.x;
                const int e = experts[item / nb], n0 = (item % nb) * 32;
                const char* src = reinterpret_cast<const char*>(w + ((size_t)e * N + n0) * K) + (size_t)(p % pieces) * STAGE;
                tma::mbar_arrive_expect_tx(tma::smem_u32(&full[s]), STAGE);
                tma::load_1d(tma::smem_u32(ring + s * STAGE), src, STAGE, tma::smem_u32(&full[s]));
            }
        }
    } else {
        for (int p = 0; p < total; ++p) {
            const int s = p % S, round = p / S;
            tma::mbar_wait(tma::smem_u32(&full[s]), round & 1);
            const uint4* st = reinterpret_cast<const uint4*>(ring + s * STAGE);
            for (int i = tid - 32; i < STAGE / 16; i += 224) {
                const uint4 v = st[i];
                acc ^= v.x ^ v.w;
            }
            __syncwarp();
            if (lane == 0) tma::mbar_arrive(tma::smem_u32(&empty[s]));
        }
    }
    if (acc == 0x12345678u) out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

// plain: each item read as one contiguous block, 16 bytes per thread per step, U steps in flight, no barriers
template <int U>
__global__ void __launch_bounds__(256, 2) plain_stream(const __nv_bfloat16* __restrict__ w, const int* __restrict__ experts,
                                                       int items, int nb, int N, int K, unsigned* __restrict__ out) {
    unsigned acc = 0;
    const int vecs = 32 * K / 8;  // 16-byte vectors per item
    for (int item = blockIdx.x; item < items; item += gridDim.x) {
        const int e = experts[item / nb], n0 = (item % nb) * 32;
        const uint4* src = reinterpret_cast<const uint4*>(w + ((size_t)e * N + n0) * K);
        for (int i0 = threadIdx.x; i0 < vecs; i0 += 256 * U) {
            uint4 v[U];
#pragma unroll
            for (int u = 0; u < U; ++u) v[u] = i0 + u * 256 < vecs ? ld_nc16(src + i0 + u * 256) : make_uint4(0, 0, 0, 0);
#pragma unroll
            for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].w;
        }
    }
    if (acc == 0x12345678u) out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}
