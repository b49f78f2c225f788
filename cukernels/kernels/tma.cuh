// Hopper (sm_90a) tensor memory accelerator and mbarriers for every op package: bulk tensor copies described by
// a tensor map (encoded on the host by cukernels/tma.py, passed as a `const __grid_constant__ TensorMap`
// parameter), and the shared-memory barriers that count their bytes.
//
// Pattern: one thread initialises an mbarrier (arrival count 1) and fences the init; per stage, one thread
// arrives with the stage's expected byte count and issues the loads that complete on that barrier; consumers
// wait on the barrier's phase parity (0, 1, 0, ... per reuse). A TMA store reads shared memory through the async
// proxy, so threads that wrote it fence first (fence_proxy_async_shared) and one thread issues the store and waits
// for its reads before the buffer is reused.
#pragma once

// A kernel's compile-time cluster shape along x (`__cluster_dims__`), empty before sm_90: the attribute does not
// compile there, even on a template no one instantiates.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define CLUSTER_OF(n)
#else
#define CLUSTER_OF(n) __cluster_dims__(n, 1, 1)
#endif

namespace tma {

// The 128-byte CUtensorMap, opaque: what cuTensorMapEncodeTiled wrote, passed by value in the parameter space.
struct alignas(64) TensorMap {
    unsigned long long opaque[16];
};

__device__ __forceinline__ unsigned long long map_addr(const TensorMap& map) {
    return reinterpret_cast<unsigned long long>(&map);
}

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Pull the descriptor into the TMA unit's cache ahead of the first copy (one thread).
__device__ __forceinline__ void prefetch_map(const TensorMap& map) {
    asm volatile("prefetch.tensormap [%0];" ::"l"(map_addr(map)) : "memory");
}

// Ask L2 for `bytes` contiguous bytes at global address p (16-byte aligned, a multiple of 16): one bulk
// prefetch by the copy engine, no registers or shared memory held. A no-op before sm_90.
__device__ __forceinline__ void prefetch_l2(const void* p, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#else
    (void)p, (void)bytes;
#endif
}

// ---------------------------------------------------------------- mbarriers (64-bit, in shared memory)

__device__ __forceinline__ void mbar_init(unsigned bar, unsigned arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(arrivals) : "memory");
}

// Makes barrier inits visible to the async proxy (the TMA unit) before any copy signals them.
__device__ __forceinline__ void fence_mbar_init() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// One arrival that also announces `bytes` of transactions the phase must see before it completes.
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

// Spins until the phase with parity `phase` has completed.
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned phase) {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "wait_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra wait_%=;\n"
        "}\n" ::"r"(bar),
        "r"(phase)
        : "memory");
}

// ---------------------------------------------------------------- bulk tensor copies

// The box at element coordinates (x innermost, y) of the map -> shared memory at dst; completes `bar`'s
// transaction count with the box's bytes (out-of-bounds elements are zero-filled and still counted).
__device__ __forceinline__ void load_2d(unsigned dst, const TensorMap& map, unsigned bar, int x, int y) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];"
        ::"r"(dst), "l"(map_addr(map)), "r"(bar), "r"(x), "r"(y)
        : "memory");
}

__device__ __forceinline__ void load_3d(unsigned dst, const TensorMap& map, unsigned bar, int x, int y, int z) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], "
        "[%2];" ::"r"(dst), "l"(map_addr(map)), "r"(bar), "r"(x), "r"(y), "r"(z)
        : "memory");
}

// The box at (x, y, z, w) of a rank-4 map (e.g. [batch, seq, heads, head_dim] seen as (head_dim, seq, heads,
// batch)) -> shared memory at dst, as load_2d.
__device__ __forceinline__ void load_4d(unsigned dst, const TensorMap& map, unsigned bar, int x, int y, int z,
                                        int w) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, "
        "%6}], [%2];" ::"r"(dst), "l"(map_addr(map)), "r"(bar), "r"(x), "r"(y), "r"(z), "r"(w)
        : "memory");
}

// `bytes` contiguous bytes of global memory at src -> shared memory at dst (no tensor map: both 16-byte aligned,
// bytes a multiple of 16); completes `bar`'s transaction count with them.
__device__ __forceinline__ void load_1d(unsigned dst, const void* src, unsigned bytes, unsigned bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}

// The box at (x, y) -> shared memory at dst in every CTA of the cluster named in `mask` (bit r: rank r), at the
// same offset; each destination CTA's barrier at `bar`'s offset counts the box's bytes.
__device__ __forceinline__ void load_2d_multicast(unsigned dst, const TensorMap& map, unsigned bar, int x, int y,
                                                  unsigned short mask) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster "
        "[%0], [%1, {%3, %4}], [%2], %5;" ::"r"(dst), "l"(map_addr(map)), "r"(bar), "r"(x), "r"(y), "h"(mask)
        : "memory");
}

// ---------------------------------------------------------------- clusters

__device__ __forceinline__ unsigned cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}

// Every thread of every CTA of the cluster (all must call it; none may have exited).
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// One arrival on the mbarrier of cluster CTA `rank`, relaxed at cluster scope: it orders nothing itself. For a
// consumer freeing a stage whose reads have completed (their values are in registers, e.g. after a wgmma wait),
// which the peer's producer then refills by TMA; or after the caller's own fence.acq_rel.cluster, which makes fence
// + arrive the memory model's release pattern (the split-K sums). An arrive with release.cluster costs a
// MEMBAR.ALL.GPU before every arrival on sm_90 (a 28 % loss in the grouped GEMM's pair, docs/perf/grouped_gemm.md
// v7.2); this one none (the SASS of the default arrive, release at CTA scope, which CUTLASS's cluster barrier uses).
__device__ __forceinline__ void mbar_arrive_remote(unsigned bar, unsigned rank) {
    asm volatile(
        "{\n"
        ".reg .b32 remote;\n"
        "mapa.shared::cluster.u32 remote, %0, %1;\n"
        "mbarrier.arrive.relaxed.cluster.shared::cluster.b64 _, [remote];\n"
        "}\n" ::"r"(bar), "r"(rank)
        : "memory");
}

// Spins until the phase with parity `phase` has completed, acquiring at cluster scope: what the threads that
// arrived from the cluster wrote before their fence.acq_rel.cluster and arrival (mbar_arrive_remote) is visible
// afterwards.
__device__ __forceinline__ void mbar_wait_cluster(unsigned bar, unsigned phase) {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "wait_%=:\n"
        "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra wait_%=;\n"
        "}\n" ::"r"(bar),
        "r"(phase)
        : "memory");
}

// Orders this thread's earlier memory accesses before its later ones as seen from the whole cluster.
__device__ __forceinline__ void fence_cluster() { asm volatile("fence.acq_rel.cluster;" ::: "memory"); }

// 4 bytes at the offset `addr` of the shared memory of cluster CTA `rank` (distributed shared memory).
__device__ __forceinline__ float ld_cluster_f32(unsigned addr, unsigned rank) {
    float v;
    asm volatile(
        "{\n"
        ".reg .b32 remote;\n"
        "mapa.shared::cluster.u32 remote, %1, %2;\n"
        "ld.shared::cluster.f32 %0, [remote];\n"
        "}\n"
        : "=f"(v)
        : "r"(addr), "r"(rank)
        : "memory");
    return v;
}

// 16 bytes at the offset `addr` of the shared memory of cluster CTA `rank` (distributed shared memory).
__device__ __forceinline__ float4 ld_cluster_f4(unsigned addr, unsigned rank) {
    float4 v;
    asm volatile(
        "{\n"
        ".reg .b32 remote;\n"
        "mapa.shared::cluster.u32 remote, %4, %5;\n"
        "ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [remote];\n"
        "}\n"
        : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
        : "r"(addr), "r"(rank)
        : "memory");
    return v;
}

// Shared memory at src -> the box at (x, y) of the map (elements outside the tensor are not written).
__device__ __forceinline__ void store_2d(const TensorMap& map, unsigned src, int x, int y) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];"
                 ::"l"(map_addr(map)), "r"(src), "r"(x), "r"(y)
                 : "memory");
}

// Shared memory at src, laid out as the map's box, added element-wise into the box at (x, y, z, w) of a rank-4
// fp32 map (elements outside the tensor are skipped); one bulk group per store_commit, as store_2d.
__device__ __forceinline__ void reduce_add_4d(const TensorMap& map, unsigned src, int x, int y, int z, int w) {
    asm volatile("cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];"
                 ::"l"(map_addr(map)), "r"(src), "r"(x), "r"(y), "r"(z), "r"(w)
                 : "memory");
}

__device__ __forceinline__ void store_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }

// Waits until the committed stores have read their shared memory (it may be reused after this).
__device__ __forceinline__ void store_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }

// Waits until the committed stores have completed (their writes are done, not only their reads).
__device__ __forceinline__ void store_wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }

// Orders this thread's generic-proxy shared-memory writes before async-proxy reads (a TMA store, wgmma).
__device__ __forceinline__ void fence_proxy_async_shared() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

}  // namespace tma

// ---------------------------------------------------------------- warp specialisation helpers

namespace ws {

// Hand registers back to (DEC) or take them from (INC) the SM's pool for the calling warpgroup: every thread of
// the warpgroup executes it. REGS is a multiple of 8 in 24..256.
template <int REGS> __device__ __forceinline__ void regs_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS));
}
template <int REGS> __device__ __forceinline__ void regs_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS));
}

// Named barrier `id` (1..15; 0 is __syncthreads) over `threads` threads (a multiple of 32).
__device__ __forceinline__ void bar_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Arrive on named barrier `id` without waiting (the barrier completes when `threads` threads arrived or synced):
// one warpgroup signals another that waits with bar_sync.
__device__ __forceinline__ void bar_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace ws
