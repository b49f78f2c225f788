// Flash attention backward dK/dV (+ dQ) on Hopper the warp-specialised way (sm_90a only): the products of
// flash_bwd_dkdv_wgmma (flash_bwd_sm90.cu, bwd_sm90.cuh) fed by the tensor memory accelerator from a producer warp,
// and dQ added by TMA reductions from shared memory instead of per-thread atomics. Head dims 64 and 128.
//
// Layout and arguments as flash_bwd_dkdv_wgmma, except that q, k, v, dO arrive as tensor maps (rank 4, (head_dim,
// seq, heads, batch) innermost first, boxes of 64 columns x BLOCK_M (q, dO) or BLOCK_N (k, v) rows, 128-byte
// swizzle: one copy fills one 64-column block of the blocked layout wgmma reads), and the fp32 dQ accumulator
// ([batch, seq_q, heads, head_dim], zeroed by the preprocess) as a map with boxes of 32 columns x 64 rows and the
// 128-byte swizzle. A packed batch (MASK_VARLEN) has maps over the packed rows (batch 1) and the kernel adds the
// sequence's first row to the row coordinates; query rows past the sequence's end inside the packed tensor belong
// to the next sequence: their lse2 (+inf, the padding of bwd_common.cuh) makes P and dS zero, so they add nothing
// to dK and dV and zeros to dQ.
//
// Grid: (KV tiles, kv heads, batch) as flash_bwd_dkdv_wgmma (kv_block_coords: heaviest tiles first).
// Block: 384 threads = three warpgroups; BLOCK_N = 128 KV rows.
//   warpgroup 0, the producer (setmaxnreg 24): lane 0 of warp 0 loads K and V once (kv_bar), then for each step
//     (q head of the GQA group, query tile: QTileRange) waits until ring stage j % STAGES is free (empty: every
//     consumer thread is done with its lse2 / D and all eight consumer warps with Q, dO; init_ring) and loads Q,
//     dO (tensor maps) and the step's lse2 and D (bulk copies of BLOCK_M floats: the padded arrays are 16-byte
//     aligned at every tile) on full[stage].
//   warpgroups 1 and 2, the consumers (setmaxnreg 240): consumer c owns KV rows [64 c, 64 c + 64). Per step:
//     S^T, dP^T (two wgmma groups); masks and P^T under dP^T; dS^T; dV += P^T dO and dK += dS^T Q issued; dS^T
//     stored into one of two shared tiles (by step parity, so a consumer that runs ahead never overwrites a tile
//     the other still multiplies) and, after a named barrier of both consumers, dQ_tile = dS K: consumer c
//     takes a 64 x DQ_N slice; once dK/dV are done it issues the next step's S^T (which runs under what follows),
//     waits for the slice, frees the stage, puts the slice into its own staging boxes (the map's swizzled box
//     layout: conflict-free float2 stores) and one thread adds them into the accumulator with
//     cp.reduce.async.bulk.tensor (rows outside the tensor are skipped); the boxes are reused only after that
//     thread saw the previous reduction read them. (The loop's iterations start after dP^T's wait, so no wgmma
//     group is in flight across its back edge: see the consumer loop.)
// dK (times the softmax scale) and dV, summed over the group already, go out through the emptied Q/dO ring
// (store_dkdv_staged: whole 128-byte lines instead of 16-byte pieces of eight rows per store).
// Small problems (attention/backward.py: DQ_CONVERT_IN_GRID_BYTES, ONE_LAUNCH): the last CTA of each (batch, kv
// head) converts that group's dQ rows (convert_dq), and where the grid fits the SMs the preprocess runs first in
// this grid (backward_prologue, behind a grid-wide barrier): the backward in one launch.
//
// Shared memory (1024-byte aligned): K, V (BLOCK_N x HEAD_DIM), STAGES x Q, STAGES x dO (BLOCK_M x HEAD_DIM), with
// DQ two dS^T tiles (BLOCK_N x BLOCK_M) and the dQ staging boxes (BLOCK_M x HEAD_DIM fp32), then STAGES x lse2 and
// D (BLOCK_M floats), then the barriers: kv_bar, full[STAGES], empty[STAGES].
#include "bwd_sm90.cuh"
#include "tma.cuh"
#include "grid_sync.cuh"  // wait_count: the one-launch prologue's grid-wide barrier

using namespace attn;

// Thread 0, before the CTA's first __syncthreads: the tensor maps prefetched (dQ's with DQ), then the ring's
// barriers: K/V's (one arrival plus bytes), and per stage `full` (the loads landed) and `empty` (EMPTY_ARRIVALS).
// A stage is free when each of the 256 consumer threads has arrived once after its last read of the stage's lse2 /
// D (ld.shared: each reading thread releases its own reads; compute-sanitizer's racecheck reports a warp's reads
// released by lane 0 alone after __syncwarp as races with the next bulk copy) and lane 0 of each of the eight
// consumer warps once more after the warp's products that read Q and dO have completed. The per-thread arrivals
// come early in the step, between the warp's own products (level with one arrival per warp, docs/perf/attention.md).
constexpr int EMPTY_ARRIVALS = 8 * 32 + 8;
template <bool DQ>
__device__ __forceinline__ void init_ring(const tma::TensorMap& q_map, const tma::TensorMap& k_map,
                                          const tma::TensorMap& v_map, const tma::TensorMap& do_map,
                                          const tma::TensorMap& dq_map, unsigned kv_bar, unsigned full,
                                          unsigned empty, int stages) {
    tma::prefetch_map(q_map);
    tma::prefetch_map(k_map);
    tma::prefetch_map(v_map);
    tma::prefetch_map(do_map);
    if constexpr (DQ) tma::prefetch_map(dq_map);
    tma::mbar_init(kv_bar, 1);
    for (int s = 0; s < stages; ++s) {
        tma::mbar_init(full + 8 * s, 1);
        tma::mbar_init(empty + 8 * s, EMPTY_ARRIVALS);
    }
    tma::fence_mbar_init();
}

// A warpgroup's 64 x DQ_N slice of dQ (wgmma accumulator layout: rows r and r + 8, columns 8 jn + 2 t (+1),
// r % 8 = lane / 4) into staging boxes of 64 rows x 32 fp32 columns in the dQ map's 128-byte-swizzled box layout
// (16-byte chunk k of row r at k ^ (r % 8)); box c holds columns [32 c, +32). A store's 32 lanes are served as
// two half-warps of 16: were every lane to store its 8-column group jn at once, the four rows of a half-warp
// would fill only 4 of the 8 chunks (two passes each). So at store i a lane stores group i ^ v, v = the Gray code
// of r % 4 (0, 1, 3, 2): the half-warp's rows then cover all 8 chunks, one pass. The registers of group i ^ v are
// picked by two conditional swaps (bit 0, then bit 1 of v), no local memory.
template <int DQ_N>
__device__ __forceinline__ void stage_dq(unsigned boxes, const float (&dq)[DQ_N / 2], int r, int t) {
    constexpr int DQ_BOX = 64 * 32 * 4;
    const int v = (r & 3) ^ ((r >> 1) & 1);
#pragma unroll
    for (int c = 0; c < DQ_N / 32; ++c) {
        float x[4][4];  // [group jn of the box][2 hh + e]
#pragma unroll
        for (int jn = 0; jn < 4; ++jn)
#pragma unroll
            for (int e = 0; e < 4; ++e) x[jn][e] = dq[16 * c + 4 * jn + e];
#pragma unroll
        for (int bit = 1; bit <= 2; bit <<= 1) {
            const bool swap = (v & bit) != 0;
#pragma unroll
            for (int jn = 0; jn < 4; ++jn) {
                if (jn & bit) continue;
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float lo = x[jn][e], hi = x[jn | bit][e];
                    x[jn][e] = swap ? hi : lo;
                    x[jn | bit][e] = swap ? lo : hi;
                }
            }
        }
        const unsigned box = boxes + c * DQ_BOX, in = (t & 1) * 8;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const unsigned ch = 2 * (i ^ v) + (t >> 1);
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                const unsigned addr = box + wgmma::blocked_offset<64>(r + 8 * hh, ch) + in;
                asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(x[i][2 * hh]),
                             "f"(x[i][2 * hh + 1]));
            }
        }
    }
}

// store_dkdv through shared memory: one warpgroup's 64 kv rows [row0, row0 + 64) of dV and dK * scale (the
// accumulators of store_dkdv: rows 16 (warp % 4) + g (+ 8), columns 8 j + 2 t (+1)), rounded to T, into `stage`
// (dV, then dK, each 64 rows x NT 16-byte chunks laid out as wgmma::blocked_offset<64>: blocks of 8 chunks per
// row, chunk k of row r at k ^ (r % 8), so a store's eight rows hit eight bank groups), then, after the
// warpgroup's named barrier `bar`, copied out in 16-byte chunks, a row's NT chunks by consecutive threads
// (whole 128-byte lines instead of the 16-byte pieces of eight rows per store instruction of store_dkdv). `rows`:
// the element stride between kv rows; rows past seq_kv are not written. The caller makes sure nothing else reads
// or writes `stage` (the emptied Q/dO ring after both consumers' last products) and that the warpgroup's threads
// do not reuse it after this returns.
template <typename T, int NT>
__device__ __forceinline__ void store_dkdv_staged(const float (&dv_acc)[NT * 4], const float (&dk_acc)[NT * 4],
                                                  unsigned char* stage, T* dv_block, T* dk_block, long long rows,
                                                  int row0, int seq_kv, float scale, int warp4, int lane, int tg,
                                                  int bar) {
    constexpr int TILE = 64 * NT * 16;  // bytes of one tensor's 64 rows
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = 16 * warp4 + g + 8 * h;
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const int at = wgmma::blocked_offset<64>(r, j) + 4 * t;
            *reinterpret_cast<unsigned*>(stage + at) = pack2<T>(dv_acc[4 * j + 2 * h], dv_acc[4 * j + 2 * h + 1]);
            *reinterpret_cast<unsigned*>(stage + TILE + at) =
                pack2<T>(dk_acc[4 * j + 2 * h] * scale, dk_acc[4 * j + 2 * h + 1] * scale);
        }
    }
    ws::bar_sync(bar, 128);
#pragma unroll
    for (int i = 0; i < 64 * NT / 128; ++i) {
        const int c = tg + 128 * i, r = c / NT, k = c % NT;
        if (row0 + r < seq_kv) {
            const int at = wgmma::blocked_offset<64>(r, k);
            const long long off = (long long)(row0 + r) * rows + 8 * k;
            *reinterpret_cast<uint4*>(dv_block + off) = *reinterpret_cast<const uint4*>(stage + at);
            *reinterpret_cast<uint4*>(dk_block + off) = *reinterpret_cast<const uint4*>(stage + TILE + at);
        }
    }
}

// dQ = T(scale * accumulator) in the dK/dV grid (dq_out not null; dense batches): the consumers of every CTA of
// (batch b, kv head kvh), once their own reductions have completed (tg 0 of each consumer waited for them: the
// writes are visible to it; a proxy fence hands them to generic loads, a fence orders them before the count),
// count the CTA in counters[b kv_heads + kvh] (zeroed by the preprocess or the prologue); the CTA that completes the
// count (every KV tile of the group has added its dQ rows) converts the group's rows [b, :, kvh group .. + group, :]
// as flash_bwd_dq_convert does (the same bits), 256 consumer threads with 8 float4 loads each in flight; `s_last`
// is a shared int no other thread uses by then (no static shared memory: the largest tiles fill the opt-in limit).
// Saves the conversion's launch where the group's rows are few (backward.DQ_CONVERT_IN_GRID_BYTES: a small
// problem's backward is host time).
template <typename T, int HEAD_DIM>
__device__ __forceinline__ void convert_dq(const float* __restrict__ dq_accum, T* __restrict__ dq_out,
                                           int* __restrict__ counters, int b, int kvh, int kv_heads, int kv_group,
                                           int seq_q, int heads, float scale, int ct, int tg, int* s_last) {
    if (tg == 0) {
        asm volatile("fence.proxy.async.global;" ::: "memory");
        __threadfence();
    }
    ws::bar_sync(1, 256);
    if (ct == 0) {
        const bool last = atomicAdd(counters + b * kv_heads + kvh, 1) == (int)gridDim.x - 1;
        if (last) {
            __threadfence();
            asm volatile("fence.proxy.async.global;" ::: "memory");
        }
        *s_last = last;
    }
    ws::bar_sync(1, 256);
    if (!*s_last) return;
    const int quads = kv_group * HEAD_DIM / 4;  // a query row's float4s of the group's heads
    const long long first = ((long long)b * seq_q * heads + (long long)kvh * kv_group) * (HEAD_DIM / 4);
    const float4* acc = reinterpret_cast<const float4*>(dq_accum);
    uint2* out = reinterpret_cast<uint2*>(dq_out);
    const long long n = (long long)seq_q * quads, row = (long long)heads * HEAD_DIM / 4;
    constexpr int U = 8;  // loads in flight per thread
    for (long long i0 = ct; i0 < n; i0 += 256 * U) {
        float4 x[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const long long i = i0 + 256 * u;
            if (i < n) x[u] = __ldcg(acc + first + (i / quads) * row + i % quads);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const long long i = i0 + 256 * u;
            if (i < n)
                out[first + (i / quads) * row + i % quads] =
                    make_uint2(pack2<T>(x[u].x * scale, x[u].y * scale), pack2<T>(x[u].z * scale, x[u].w * scale));
        }
    }
}

// The preprocess in the dK/dV grid (grid_sync not null: dense batches whose CTAs are all resident at once, as
// BackwardCall plans it, with dQ converted in the grid): the grid's warps take the query rows in turn (as
// flash_bwd_preprocess: D, lse2, the row's dQ accumulator zeroed), its threads the padding rows of lse2 / D, and they
// zero the conversion's counters; then every CTA waits for every other. The generic stores are handed to the
// async proxy (the producers' TMA loads of lse2 / D and the consumers' TMA reductions read them) before a CTA
// counts itself in grid_sync[0] (fence, atomic add); thread 0 waits until all CTAs have (an acquire load), and the
// last CTA past the wait (grid_sync[1]) sets both counters back to zero for the next launch (the host zeroes them
// in a new workspace). Replaces the preprocess launch where a backward's cost is the host's.
template <typename T, int HEAD_DIM>
__device__ __forceinline__ void backward_prologue(const T* __restrict__ o, const T* __restrict__ dout,
                                                  const float* __restrict__ lse, float* lse2, float* dsum,
                                                  float* dq_accum, int* counters, long long o_sb, long long o_ss,
                                                  long long o_sh, long long do_sb, long long do_ss, long long do_sh,
                                                  int batch, int seq_q, int seq_pad, int heads, int* grid_sync) {
    // lanes per row (16 bytes each), rows per warp; U: backward.PROLOGUE_ROWS_IN_FLIGHT
    constexpr int LPR = HEAD_DIM / 8, RPW = 32 / LPR, U = 4;
    const int ctas = gridDim.x * gridDim.y * gridDim.z;
    const int cta = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const int lane = threadIdx.x & 31, sub = lane / LPR, c = lane % LPR;
    const long long nwarps = (long long)ctas * (blockDim.x / 32), rows = (long long)batch * heads * seq_q;
    // a warp takes RPW query rows at a time, U times over before it waits on any load: latency-bound otherwise (the
    // dK/dV grid of a small problem is a few CTAs). Per row as flash_bwd_preprocess: each lane's fp32 dot of its 8
    // columns, then a butterfly over the row's LPR lanes (the same sums: the preprocess's 32-lane butterfly adds
    // the idle lanes' zeros first)
    for (long long r0 = ((long long)cta * (blockDim.x / 32) + (threadIdx.x >> 5)) * RPW; r0 < rows;
         r0 += nwarps * RPW * U) {
        uint4 a[U], d[U];
        float l[U];
        long long at[U], acc_at[U];
        bool live[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const long long row = r0 + u * nwarps * RPW + sub;  // (b, i, h) over the query rows
            live[u] = row < rows;
            const int h = live[u] ? row % heads : 0, i = live[u] ? (row / heads) % seq_q : 0;
            const long long b = live[u] ? row / ((long long)heads * seq_q) : 0;
            at[u] = (b * heads + h) * seq_pad + i;
            acc_at[u] = ((b * seq_q + i) * heads + h) * HEAD_DIM;
            if (live[u]) {
                a[u] = *reinterpret_cast<const uint4*>(o + b * o_sb + i * o_ss + h * o_sh + 8 * c);
                d[u] = *reinterpret_cast<const uint4*>(dout + b * do_sb + i * do_ss + h * do_sh + 8 * c);
                l[u] = lse[(b * heads + h) * seq_q + i];
            } else {
                a[u] = d[u] = make_uint4(0u, 0u, 0u, 0u);
                l[u] = 0.f;
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            float acc = dot8<T>(a[u], d[u], 0.f);
#pragma unroll
            for (int off = LPR / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
            if (live[u]) {
                if (c == 0) {
                    dsum[at[u]] = acc;
                    lse2[at[u]] = lse_to_lse2(l[u]);
                }
                float4* dst = reinterpret_cast<float4*>(dq_accum + acc_at[u]);  // two float4 per lane
                dst[c] = dst[c + LPR] = make_float4(0.f, 0.f, 0.f, 0.f);
            }
        }
    }
    // the padding rows (seq_q <= i < seq_pad): D = 0, lse2 = +inf, one thread each
    const int tail = seq_pad - seq_q;
    for (long long p = (long long)cta * blockDim.x + threadIdx.x; p < (long long)batch * heads * tail;
         p += (long long)ctas * blockDim.x) {
        const long long h = p % heads, i = seq_q + (p / heads) % tail, b = p / ((long long)heads * tail);
        dsum[(b * heads + h) * seq_pad + i] = 0.f;
        lse2[(b * heads + h) * seq_pad + i] = pos_inf();
    }
    for (int c = cta * blockDim.x + threadIdx.x; c < (int)(gridDim.y * gridDim.z); c += ctas * blockDim.x)
        counters[c] = 0;
    asm volatile("fence.proxy.async.global;" ::: "memory");
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        atomicAdd(grid_sync, 1);
        wait_count(grid_sync, ctas);
        if (atomicAdd(grid_sync + 1, 1) == ctas - 1) grid_sync[0] = grid_sync[1] = 0;  // every CTA is past it
        asm volatile("fence.proxy.async.global;" ::: "memory");
    }
    __syncthreads();
}

template <typename T, int HEAD_DIM, int BLOCK_M, int STAGES, int MASK, bool DQ>
__global__ void __launch_bounds__(384, 1)
flash_bwd_tma(const __grid_constant__ tma::TensorMap q_map, const __grid_constant__ tma::TensorMap k_map,
              const __grid_constant__ tma::TensorMap v_map, const __grid_constant__ tma::TensorMap do_map,
              const __grid_constant__ tma::TensorMap dq_map, float* __restrict__ lse2,
              float* __restrict__ dsum, T* __restrict__ dk, T* __restrict__ dv, const int* __restrict__ q_ids,
              const int* __restrict__ kv_ids, const int2* __restrict__ q_tile_ids,
              const int2* __restrict__ kv_tile_ids, int seq_q, int seq_kv, int seq_pad, int heads, int kv_group,
              int window_left, int window_right, float scale_log2, float scale, int batch, int head_chunk,
              float* __restrict__ dq_accum, T* __restrict__ dq_out, int* __restrict__ counters,
              const T* __restrict__ o, const T* __restrict__ dout, const float* __restrict__ lse, long long o_sb,
              long long o_ss, long long o_sh, long long do_sb, long long do_ss, long long do_sh,
              int* __restrict__ grid_sync) {
    constexpr int BLOCK_N = 128;
    constexpr int MT = BLOCK_M / 8;                      // 8-column (query) tiles of S^T
    constexpr int DT = HEAD_DIM / 8;                     // 8-column tiles of dK / dV
    constexpr int BLOCKS = HEAD_DIM / 64;                // 64-column blocks of a row
    constexpr int DQ_ROW_BLOCKS = BLOCK_M / 64;          // 64-query row blocks of the dQ tile ...
    constexpr int DQ_N = HEAD_DIM * DQ_ROW_BLOCKS / 2;   // ... and the head-dim slice each consumer takes
    constexpr int DQ_BOX = 64 * 32 * 4;                  // one staging box: 64 rows x 32 fp32 columns
    constexpr bool WINDOW = (MASK & BWD_MASK_WINDOW) != 0;
    constexpr bool SEGMENTS = (MASK & BWD_MASK_SEGMENTS) != 0;
    constexpr bool VARLEN = (MASK & MASK_VARLEN) != 0;
    constexpr int KV_BYTES = BLOCK_N * HEAD_DIM * 2, Q_BYTES = BLOCK_M * HEAD_DIM * 2, DS_BYTES = BLOCK_N * BLOCK_M * 2;
    static_assert(HEAD_DIM == 64 || HEAD_DIM == 128, "dK and dV accumulate in registers: head_dim 64 or 128");
    static_assert(BLOCK_M == 64 || BLOCK_M == 128, "query tiles of 64 or 128 rows (a wgmma N)");
    static_assert(2 % DQ_ROW_BLOCKS == 0 && DQ_N % 32 == 0, "dQ split over the two consumers in 32-column boxes");
    // the emptied Q/dO ring (4 STAGES BLOCK_M HEAD_DIM bytes) holds both consumers' dK and dV (2 x 256 HEAD_DIM)
    static_assert(STAGES * BLOCK_M >= 128, "the Q/dO ring too small for store_dkdv_staged");

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const unsigned raw0 = smem_addr(smem_raw);
    const unsigned sK = (raw0 + 1023) & ~1023u;  // smem_bytes() reserves the slack
    unsigned char* smem = smem_raw + (sK - raw0);
    const unsigned sV = sK + KV_BYTES, sQ = sV + KV_BYTES, sdO = sQ + STAGES * Q_BYTES, sdS = sdO + STAGES * Q_BYTES;
    const unsigned sdQ = sdS + (DQ ? 2 * DS_BYTES : 0);
    const unsigned sL = sdQ + (DQ ? BLOCK_M * HEAD_DIM * 4 : 0), sD = sL + STAGES * BLOCK_M * 4;
    const unsigned kv_bar = sD + STAGES * BLOCK_M * 4, full = kv_bar + 8, empty = full + 8 * STAGES;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wg = wgmma::warpgroup();  // warp-uniform to the compiler: K's and V's descriptors in uniform registers
    if (tid == 0) init_ring<DQ>(q_map, k_map, v_map, do_map, dq_map, kv_bar, full, empty, STAGES);
    __syncthreads();
    if constexpr (DQ && !VARLEN)
        if (grid_sync != nullptr)  // the backward in one launch: the preprocess first, by the whole grid
            backward_prologue<T, HEAD_DIM>(o, dout, lse, lse2, dsum, dq_accum, counters, o_sb, o_ss, o_sh, do_sb,
                                           do_ss, do_sh, batch, seq_q, seq_pad, heads, grid_sync);

    // ---- the KV tile, its sequence (packed batches): each role works them out after taking its registers
    int b = blockIdx.z;
    int nb, kvh;
    kv_block_coords(nb, kvh, head_chunk);
    const int kv_heads = gridDim.y;
    int q_row0 = 0, kv_row0 = 0;  // a packed sequence's first rows in the maps
    auto enter = [&]() {  // false: a packed batch's grid runs past its last tile (every thread of the CTA alike)
        if constexpr (VARLEN) {
            int tile;
            if (!varlen_tile<BLOCK_N>(kv_ids, batch, seq_kv, nb, b, tile)) return false;
            const VarlenSeq sq = varlen_seq(q_ids, b, seq_q), sk = varlen_seq(kv_ids, b, seq_kv);
            nb = tile;
            q_row0 = sq.start;
            kv_row0 = sk.start;
            seq_q = sq.len;
            seq_kv = sk.len;
            dk += (long long)sk.start * kv_heads * HEAD_DIM;
            dv += (long long)sk.start * kv_heads * HEAD_DIM;
            lse2 += varlen_pad_start(sq.start, b);  // seq_pad: the padded total, the head stride
            dsum += varlen_pad_start(sq.start, b);
            b = 0;
        }
        return true;
    };
    auto q_tiles = [&]() {
        QTileRange<BLOCK_M, BLOCK_N, WINDOW, SEGMENTS> r(nb * BLOCK_N, seq_q, seq_kv, window_left, window_right,
                                                         q_tile_ids, kv_tile_ids, b, nb, gridDim.x, kv_group);
        // the KV tiles of one head run at about the same time: each starts at another query tile, so their dQ
        // reductions go to different rows instead of queueing on the same ones
        r.rot = r.n_m > 0 ? nb % r.n_m : 0;
        return r;
    };
    const int h0 = kvh * kv_group;  // the group's first q head

    if (wg == 0) {  // ---------------------------------------------------------------- producer
        ws::regs_dec<24>();
        if (warp != 0 || !enter()) return;
        if (lane == 0) {
            const int n0 = nb * BLOCK_N;
            tma::mbar_arrive_expect_tx(kv_bar, 2 * KV_BYTES);
#pragma unroll
            for (int c = 0; c < BLOCKS; ++c) {
                tma::load_4d(sK + c * (BLOCK_N * 128), k_map, kv_bar, 64 * c, kv_row0 + n0, kvh, b);
                tma::load_4d(sV + c * (BLOCK_N * 128), v_map, kv_bar, 64 * c, kv_row0 + n0, kvh, b);
            }
            const auto tiles = q_tiles();
            int j = 0;
            for (int it = tiles.next_visible(0); it < tiles.total; it = tiles.next_visible(it + 1), ++j) {
                const int s = j % STAGES;
                const int h = h0 + tiles.head_in_group(it), m0 = tiles.m_block(it) * BLOCK_M;
                tma::mbar_wait(empty + 8 * s, ((j / STAGES) & 1) ^ 1);
                tma::mbar_arrive_expect_tx(full + 8 * s, 2 * Q_BYTES + 2 * BLOCK_M * 4);
#pragma unroll
                for (int c = 0; c < BLOCKS; ++c) {
                    tma::load_4d(sQ + s * Q_BYTES + c * (BLOCK_M * 128), q_map, full + 8 * s, 64 * c, q_row0 + m0, h, b);
                    tma::load_4d(sdO + s * Q_BYTES + c * (BLOCK_M * 128), do_map, full + 8 * s, 64 * c, q_row0 + m0,
                                 h, b);
                }
                const long long row = ((long long)b * heads + h) * seq_pad + m0;
                tma::load_1d(sL + s * BLOCK_M * 4, lse2 + row, BLOCK_M * 4, full + 8 * s);
                tma::load_1d(sD + s * BLOCK_M * 4, dsum + row, BLOCK_M * 4, full + 8 * s);
            }
        }
        return;
    }

    // -------------------------------------------------------------------- consumers
    ws::regs_inc<240>();
    if (!enter()) return;
    const auto tiles = q_tiles();
    const int n0 = nb * BLOCK_N;
    const int shift = seq_kv - seq_q;
    const int cw = wg - 1, tg = tid - 128 * wg;
    const int g = lane >> 2, t = lane & 3;
    const int wrow = 64 * cw + 16 * (warp & 3);  // this warp's 16 kv rows in the tile
    const int kv_row = n0 + wrow + g;            // this thread's: kv_row and kv_row + 8
    int kvid[2] = {0, 0};
    if constexpr (SEGMENTS) {
        kvid[0] = kv_ids[(long long)b * seq_kv + min(kv_row, seq_kv - 1)];
        kvid[1] = kv_ids[(long long)b * seq_kv + min(kv_row + 8, seq_kv - 1)];
    }
    const unsigned k_wg = sK + cw * 64 * 128, v_wg = sV + cw * 64 * 128;  // this consumer's 64 rows per block
    const float* lse_s = reinterpret_cast<const float*>(smem + (sL - sK));
    const float* d_s = reinterpret_cast<const float*>(smem + (sD - sK));
    // dQ slice of this consumer: query rows [64 rw, +64) of the tile, head-dim columns [DQ_N cq, +DQ_N)
    const int rw = cw % DQ_ROW_BLOCKS, cq = cw / DQ_ROW_BLOCKS;
    const unsigned dq_boxes = sdQ + cw * (DQ_N / 32) * DQ_BOX;

    float dv_acc[DT * 4], dk_acc[DT * 4];
#pragma unroll
    for (int i = 0; i < DT * 4; ++i) dv_acc[i] = dk_acc[i] = 0.f;

    auto release = [&](int stage) {  // this warp's products that read the stage's Q and dO are done
        __syncwarp();
        if (lane == 0) tma::mbar_arrive(empty + 8 * stage);
    };

    tma::mbar_wait(kv_bar, 0);  // always: the CTA may not exit with K's and V's copies in flight
    // Software-pipelined by one product: S^T of step j + 1 is issued before step j's dQ slice is staged and
    // reduced, so the tensor cores run it under the staging; then dP^T of step j + 1, under which its P^T is
    // formed. A step's iteration starts where no wgmma is in flight (dP^T waited for): with a group in flight
    // across the loop's back edge ptxas serialises every wgmma of the kernel (a wait after each, no warning).
    // EARLY_S off (128-row query tiles with a window and segment ids or a packed batch: 8-40 B spilled with it),
    // S^T is issued with dP^T, after the staging.
    constexpr bool EARLY_S = !(BLOCK_M == 128 && WINDOW && (SEGMENTS || VARLEN));
    float s[MT][4], dp[MT][4];
    float(&s_flat)[MT * 4] = reinterpret_cast<float(&)[MT * 4]>(s);
    float(&dp_flat)[MT * 4] = reinterpret_cast<float(&)[MT * 4]>(dp);
    unsigned p_pk[MT][2], ds_pk[MT][2];  // P^T, dS^T rounded to T: rows g and g + 8, columns 8 j + 2 t (+1)
    // the first half of step jj (tile itt): S^T (unless in flight already) and dP^T, masks, P^T, dS^T
    auto first_half = [&](int jj, int itt, bool s_in_flight) {
        const int sj = jj % STAGES, mbj = tiles.m_block(itt);
        if (!s_in_flight) {
            tma::mbar_wait(full + 8 * sj, (jj / STAGES) & 1);
            issue_one_t<T, HEAD_DIM, BLOCK_M, BLOCK_N, true>(s_flat, k_wg, sQ + sj * Q_BYTES);
        }
        issue_one_t<T, HEAD_DIM, BLOCK_M, BLOCK_N, true>(dp_flat, v_wg, sdO + sj * Q_BYTES);
        wgmma::wait<1>();
        wgmma::fence_operands(s_flat);
        if (tiles.needs_mask(mbj))
            mask_scores_t<MT, WINDOW, SEGMENTS>(s, mbj * BLOCK_M, kv_row, seq_q, seq_kv, shift, window_left,
                                                window_right, q_ids + (long long)b * seq_q, kvid, t);
        form_p<T, MT>(s, p_pk, lse_s + sj * BLOCK_M, scale_log2, t);
        wgmma::wait<0>();
        wgmma::fence_operands(dp_flat);
        form_ds<T, MT>(s, dp, ds_pk, d_s + sj * BLOCK_M, t);
        tma::mbar_arrive(empty + 8 * sj);  // every thread: its reads of this stage's lse2 / D are done
    };
    int it = tiles.next_visible(0);
    if (it < tiles.total) first_half(0, it, false);
    for (int j = 0; it < tiles.total; ++j) {
        const int st = j % STAGES;
        const int h = h0 + tiles.head_in_group(it), m0 = tiles.m_block(it) * BLOCK_M;
        const unsigned q_st = sQ + st * Q_BYTES, do_st = sdO + st * Q_BYTES;
        const int next = tiles.next_visible(it + 1);
        const bool more = next < tiles.total;
        wgmma::fence_operands(dv_acc);
        wgmma::fence_operands(dk_acc);
        issue_dkdv<T, HEAD_DIM, BLOCK_M>(dv_acc, dk_acc, p_pk, ds_pk, q_st, do_st);
        float dq[DQ ? DQ_N / 2 : 1];
        if constexpr (DQ) {
            const unsigned ds_tile = sdS + (j & 1) * DS_BYTES;
            store_ds_t<BLOCK_N, MT>(smem + (ds_tile - sK), ds_pk, wrow + g, t);
            wgmma::fence_proxy_async();
            ws::bar_sync(1, 256);  // both consumers' dS^T rows in place
            issue_dq<T, BLOCK_N, DQ_N>(dq, ds_tile + rw * (BLOCK_N * 128),
                                        sK + (cq * DQ_N / 64) * (BLOCK_N * 128) + (cq * DQ_N % 64) * 2);
        }
        // the rest of the step once its products are done: the stage freed, and the dQ slice into this consumer's
        // staging boxes (box c: columns [32 c, +32) of the slice, 128-byte rows, 16-byte chunk k of row r at
        // k ^ (r % 8)) once the previous reduction has read them, then added by one thread
        auto finish = [&]() {
            if constexpr (DQ) wgmma::fence_operands(dq);
            wgmma::fence_operands(dv_acc);
            wgmma::fence_operands(dk_acc);
            release(st);  // Q, dO, lse2, D of this stage are no longer read
            if constexpr (DQ) {
                if (tg == 0) tma::store_wait_read();
                ws::bar_sync(2 + cw, 128);
                stage_dq<DQ_N>(dq_boxes, dq, 16 * (warp & 3) + g, t);
                tma::fence_proxy_async_shared();
                ws::bar_sync(2 + cw, 128);
                if (tg == 0) {
#pragma unroll
                    for (int c = 0; c < DQ_N / 32; ++c)
                        tma::reduce_add_4d(dq_map, dq_boxes + c * DQ_BOX, cq * DQ_N + 32 * c, q_row0 + m0 + 64 * rw,
                                           h, b);
                    tma::store_commit();
                }
            }
        };
        // One branch issues, waits for and consumes the next S^T (ptxas serialises every wgmma when a group is
        // issued under one condition and waited for under another, even the same one).
        if (EARLY_S && more) {
            // the next step's S^T once its stage has landed (with dQ, after the dK/dV group: the P^T and dS^T
            // registers it reads are free then, which S^T needs); everything but S^T waited for
            if constexpr (DQ) {
                wgmma::wait<1>();
                wgmma::fence_operands(dv_acc);
                wgmma::fence_operands(dk_acc);
            }
            const int s1 = (j + 1) % STAGES;
            tma::mbar_wait(full + 8 * s1, ((j + 1) / STAGES) & 1);
            issue_one_t<T, HEAD_DIM, BLOCK_M, BLOCK_N, true>(s_flat, k_wg, sQ + s1 * Q_BYTES);
            wgmma::wait<1>();
            finish();
            first_half(j + 1, next, true);
        } else {
            wgmma::wait<0>();
            finish();
            if (more) first_half(j + 1, next, false);
        }
        it = next;
    }
    // dK and dV out through the Q/dO ring, empty once both consumers' last products are done (every stage the
    // producer filled has been waited for): consumer c's 2 x 64 rows x HEAD_DIM values from byte c x 4 x 64 x
    // HEAD_DIM of it
    ws::bar_sync(1, 256);
    const long long block = ((long long)b * seq_kv * kv_heads + kvh) * HEAD_DIM;
    store_dkdv_staged<T, DT>(dv_acc, dk_acc, smem + (sQ - sK) + cw * 4 * 64 * HEAD_DIM, dv + block, dk + block,
                             (long long)kv_heads * HEAD_DIM, n0 + 64 * cw, seq_kv, scale, warp & 3, lane, tg, 2 + cw);
    if constexpr (DQ) {
        if (tg == 0) tma::store_wait_all();  // the staging boxes stay valid until the last reduction is done
        if (dq_out != nullptr)  // the flag in the lse2 ring: every step's lse2 is read (the barrier above)
            convert_dq<T, HEAD_DIM>(dq_accum, dq_out, counters, b, kvh, kv_heads, kv_group, seq_q, heads, scale,
                                    tid - 128, tg, reinterpret_cast<int*>(smem + (sL - sK)));
    }
}

// Head dim 256 (flash_bwd_tma_pair). Two dK and dV accumulators of 64 x 256 fp32 do not fit one warpgroup, so
// two consumer warpgroups of a 384-thread CTA share one 64-row KV tile and split the work twice:
//   by product for S^T and dP^T: warpgroup 0 computes S^T = K Q^T over the whole 64-row query tile (one m64n64
//     product), its masks and P^T in fp32, which it hands over through shared memory (in its accumulator layout,
//     thread by thread); warpgroup 1 computes dP^T = V dO^T and, from the P^T handed over, dS^T, which it stores
//     (rounded to T) into the shared dS^T tile for warpgroup 0 and the dQ product. Each of K and V is read once
//     per step (a split by query columns had both warpgroups read both: 64 KB more shared-memory reads a step,
//     on a kernel that shared-memory bandwidth bounds);
//   by head-dim halves for dV += P^T dO, dK += dS^T Q (each warpgroup accumulates columns [128 w, +128) of both,
//     A from registers) and for dQ = dS K (the dS^T tile and K from shared memory, 32-column passes through the
//     warpgroup's fp32 staging box added into the accumulator by cp.reduce.async.bulk.tensor, as flash_bwd_tma).
// A third warpgroup, the producer (setmaxnreg 24; the consumers take 240), loads K and V once and refills each ring
// stage (Q, dO by tensor maps, lse2 and D by bulk copies) once the consumers have freed it (init_ring), STAGES steps
// ahead of them (thread 0 did this between its own products before: -4 % on the kernel at head dim 256). The P^T
// hand-off goes through the two staging boxes: warpgroup 0 writes it once both warpgroups' last reductions of the
// previous step have read their box (named barrier 1), warpgroup 1 reads it after barrier 2 and publishes dS^T with
// barrier 5; a warpgroup stages dQ into its box only after barrier 5.
// Both warpgroups sync on each barrier (the waiting side waits there anyway; compute-sanitizer's racecheck
// reports a producer's bar.arrive as no ordering).
//
// Shared memory (1024-byte aligned): K, V (64 x 256), STAGES x Q, STAGES x dO (64 x 256), dS^T (64 x 64), two
// fp32 dQ staging boxes (64 rows x 32 columns; together the fp32 P^T hand-off), STAGES x lse2 and D, the
// barriers kv_bar, full[], empty[].
template <typename T, int HEAD_DIM, int BLOCK_M, int STAGES, int MASK, bool DQ>
__global__ void __launch_bounds__(384, 1)
flash_bwd_tma_pair(const __grid_constant__ tma::TensorMap q_map, const __grid_constant__ tma::TensorMap k_map,
                   const __grid_constant__ tma::TensorMap v_map, const __grid_constant__ tma::TensorMap do_map,
                   const __grid_constant__ tma::TensorMap dq_map, const float* __restrict__ lse2,
                   const float* __restrict__ dsum, T* __restrict__ dk, T* __restrict__ dv,
                   const int* __restrict__ q_ids, const int* __restrict__ kv_ids, const int2* __restrict__ q_tile_ids,
                   const int2* __restrict__ kv_tile_ids, int seq_q, int seq_kv, int seq_pad, int heads, int kv_group,
                   int window_left, int window_right, float scale_log2, float scale, int batch, int head_chunk) {
    constexpr int BLOCK_N = 64;
    constexpr int MT = BLOCK_M / 8;     // 8-column tiles of S^T / dP^T
    constexpr int HALF = HEAD_DIM / 2;  // head-dim columns of dK / dV / dQ per warpgroup
    constexpr int HT = HALF / 8;
    constexpr int BLOCKS = HEAD_DIM / 64;
    constexpr int DQ_N = 32;  // one staging box per pass: 16 accumulators
    constexpr int DQ_BOX = 64 * 32 * 4;
    constexpr bool WINDOW = (MASK & BWD_MASK_WINDOW) != 0;
    constexpr bool SEGMENTS = (MASK & BWD_MASK_SEGMENTS) != 0;
    constexpr bool VARLEN = (MASK & MASK_VARLEN) != 0;
    constexpr int KV_BYTES = BLOCK_N * HEAD_DIM * 2, Q_BYTES = BLOCK_M * HEAD_DIM * 2, DS_BYTES = BLOCK_N * BLOCK_M * 2;
    static_assert(HEAD_DIM == 256 && BLOCK_M == 64, "the pair kernel serves head dim 256 with 64-row query tiles");

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const unsigned raw0 = smem_addr(smem_raw);
    const unsigned sK = (raw0 + 1023) & ~1023u;  // smem_bytes() reserves the slack
    unsigned char* smem = smem_raw + (sK - raw0);
    const unsigned sV = sK + KV_BYTES, sQ = sV + KV_BYTES, sdO = sQ + STAGES * Q_BYTES, sdS = sdO + STAGES * Q_BYTES;
    const unsigned sBox = sdS + DS_BYTES, sL = sBox + 2 * DQ_BOX, sD = sL + STAGES * BLOCK_M * 4;
    const unsigned kv_bar = sD + STAGES * BLOCK_M * 4, full = kv_bar + 8, empty = full + 8 * STAGES;
    unsigned char* ds_base = smem + (sdS - sK);
    const float* lse_s = reinterpret_cast<const float*>(smem + (sL - sK));
    const float* d_s = reinterpret_cast<const float*>(smem + (sD - sK));

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, tg = tid & 127;
    const int wg = warp >> 2;  // (wgmma::warpgroup() here: 4-8 B spilled with segments + window at head dim 256)
    const int g = lane >> 2, t = lane & 3;
    if (tid == 0) init_ring<DQ>(q_map, k_map, v_map, do_map, dq_map, kv_bar, full, empty, STAGES);
    __syncthreads();

    int b = blockIdx.z;
    int nb, kvh;
    kv_block_coords(nb, kvh, head_chunk);
    const int kv_heads = gridDim.y;
    int q_row0 = 0, kv_row0 = 0;  // a packed sequence's first rows in the maps
    if constexpr (VARLEN) {
        int tile;
        if (!varlen_tile<BLOCK_N>(kv_ids, batch, seq_kv, nb, b, tile)) return;
        const VarlenSeq sq = varlen_seq(q_ids, b, seq_q), sk = varlen_seq(kv_ids, b, seq_kv);
        nb = tile;
        q_row0 = sq.start;
        kv_row0 = sk.start;
        seq_q = sq.len;
        seq_kv = sk.len;
        dk += (long long)sk.start * kv_heads * HEAD_DIM;
        dv += (long long)sk.start * kv_heads * HEAD_DIM;
        lse2 += varlen_pad_start(sq.start, b);  // seq_pad: the padded total, the head stride
        dsum += varlen_pad_start(sq.start, b);
        b = 0;
    }
    const int n0 = nb * BLOCK_N;
    const int shift = seq_kv - seq_q;
    QTileRange<BLOCK_M, BLOCK_N, WINDOW, SEGMENTS> tiles(n0, seq_q, seq_kv, window_left, window_right, q_tile_ids,
                                                         kv_tile_ids, b, nb, gridDim.x, kv_group);
    tiles.rot = tiles.n_m > 0 ? nb % tiles.n_m : 0;  // as flash_bwd_tma: CTAs of one head start at other rows
    const int h0 = kvh * kv_group;  // the group's first q head

    // the producer fills the ring: step `it` (the jj-th visible one) into stage jj % STAGES once its last use is over
    auto load_step = [&](int it, int jj) {
        const int s = jj % STAGES;
        const int h = h0 + tiles.head_in_group(it), m0 = tiles.m_block(it) * BLOCK_M;
        tma::mbar_wait(empty + 8 * s, ((jj / STAGES) & 1) ^ 1);
        tma::mbar_arrive_expect_tx(full + 8 * s, 2 * Q_BYTES + 2 * BLOCK_M * 4);
#pragma unroll
        for (int c = 0; c < BLOCKS; ++c) {
            tma::load_4d(sQ + s * Q_BYTES + c * (BLOCK_M * 128), q_map, full + 8 * s, 64 * c, q_row0 + m0, h, b);
            tma::load_4d(sdO + s * Q_BYTES + c * (BLOCK_M * 128), do_map, full + 8 * s, 64 * c, q_row0 + m0, h, b);
        }
        const long long row = ((long long)b * heads + h) * seq_pad + m0;
        tma::load_1d(sL + s * BLOCK_M * 4, lse2 + row, BLOCK_M * 4, full + 8 * s);
        tma::load_1d(sD + s * BLOCK_M * 4, dsum + row, BLOCK_M * 4, full + 8 * s);
    };
    if (wg == 2) {  // the producer warpgroup: lane 0 of its first warp loads K and V once, then fills the ring
        ws::regs_dec<24>();
        if (tid == 256) {
            tma::mbar_arrive_expect_tx(kv_bar, 2 * KV_BYTES);
#pragma unroll
            for (int c = 0; c < BLOCKS; ++c) {
                tma::load_4d(sK + c * (BLOCK_N * 128), k_map, kv_bar, 64 * c, kv_row0 + n0, kvh, b);
                tma::load_4d(sV + c * (BLOCK_N * 128), v_map, kv_bar, 64 * c, kv_row0 + n0, kvh, b);
            }
            int jj = 0;
            for (int it = tiles.next_visible(0); it < tiles.total; it = tiles.next_visible(it + 1), ++jj)
                load_step(it, jj);
        }
        return;
    }
    // the consumers: 2 x 128 x 240 + 128 x 24 = 64,512 = 384 x 168, the registers the CTA was launched with; an
    // increase waits for registers the CTA's own warps gave back (a build with the producer at 32 hung here)
    ws::regs_inc<240>();

    const int wrow = 16 * (warp & 3);  // both warpgroups: kv rows wrow + g, wrow + g + 8 of the tile
    const int kv_row = n0 + wrow + g;
    int kvid[2] = {0, 0};
    if constexpr (SEGMENTS) {
        kvid[0] = kv_ids[(long long)b * seq_kv + min(kv_row, seq_kv - 1)];
        kvid[1] = kv_ids[(long long)b * seq_kv + min(kv_row + 8, seq_kv - 1)];
    }
    const unsigned box = sBox + wg * DQ_BOX;
    float dv_acc[HT * 4], dk_acc[HT * 4];
#pragma unroll
    for (int i = 0; i < HT * 4; ++i) dv_acc[i] = dk_acc[i] = 0.f;

    tma::mbar_wait(kv_bar, 0);  // always: the CTA may not exit with K's and V's copies in flight
    int j = 0;
    for (int it = tiles.next_visible(0); it < tiles.total; it = tiles.next_visible(it + 1), ++j) {
        const int st = j % STAGES;
        const int h = h0 + tiles.head_in_group(it), mb = tiles.m_block(it), m0 = mb * BLOCK_M;
        const unsigned q_st = sQ + st * Q_BYTES, do_st = sdO + st * Q_BYTES;
        tma::mbar_wait(full + 8 * st, (j / STAGES) & 1);

        // S^T = K Q^T on warpgroup 0, dP^T = V dO^T on warpgroup 1, each over all BLOCK_M queries (K and V are
        // read from shared memory once per step, not once per warpgroup)
        float acc[MT][4];
        float(&acc_flat)[BLOCK_M / 2] = reinterpret_cast<float(&)[BLOCK_M / 2]>(acc);
        issue_one_t<T, HEAD_DIM, BLOCK_M, BLOCK_N>(acc_flat, wg == 0 ? sK : sV, wg == 0 ? q_st : do_st);
        if constexpr (DQ) {
            if (tg == 0) tma::store_wait_read();  // the previous step's last reduction has read this box
        }
        wgmma::wait<0>();
        wgmma::fence_operands(acc_flat);
        unsigned p_pk[MT][2], ds_pk[MT][2];
        float* hand = reinterpret_cast<float*>(smem + (sBox - sK)) + tg;  // fp32 P^T [MT][4][128 threads]
        // this warpgroup's head-dim half of dV += P^T dO and dK += dS^T Q over all BLOCK_M queries: the dV group
        // goes out as soon as P^T is in registers, so it runs while dS^T is formed and handed over
        const unsigned half_off = wg * (HALF / 64) * (BLOCK_M * 128);
        wgmma::fence_operands(dv_acc);
        wgmma::fence_operands(dk_acc);
        if (wg == 0) {
            if (tiles.needs_mask(mb))
                mask_scores_t<MT, WINDOW, SEGMENTS>(acc, m0, kv_row, seq_q, seq_kv, shift, window_left, window_right,
                                                    q_ids + (long long)b * seq_q, kvid, t);
            form_p<T, MT>(acc, p_pk, lse_s + st * BLOCK_M, scale_log2, t);
            tma::mbar_arrive(empty + 8 * st);  // every thread of warpgroup 0: its reads of lse2 are done
            wgmma::fence();
            mma_rs_group<T, HALF, BLOCK_M>(dv_acc, p_pk, do_st + half_off);
            wgmma::commit();
            ws::bar_sync(1, 256);  // warpgroup 1 is done with the boxes (the previous step's dQ) and its reads
            hand_p<MT>(hand, acc);
            ws::bar_sync(2, 256);  // P^T handed over
            ws::bar_sync(5, 256);  // dS^T in its tile
            load_ds_t<BLOCK_N, MT>(ds_base, ds_pk, wrow + g, t);
        } else {
            ws::bar_sync(1, 256);
            ws::bar_sync(2, 256);
            take_p<T, MT>(hand, p_pk);
            wgmma::fence();
            mma_rs_group<T, HALF, BLOCK_M>(dv_acc, p_pk, do_st + half_off);
            wgmma::commit();
            form_ds_handed<T, MT>(hand, acc, ds_pk, d_s + st * BLOCK_M, t);
            tma::mbar_arrive(empty + 8 * st);  // every thread of warpgroup 1: its reads of D are done
            store_ds_t<BLOCK_N, MT>(ds_base, ds_pk, wrow + g, t);
            wgmma::fence_proxy_async();  // dS^T is the dQ product's operand
            ws::bar_sync(5, 256);
        }
        wgmma::fence();
        mma_rs_group<T, HALF, BLOCK_M>(dk_acc, ds_pk, q_st + half_off);
        wgmma::commit();
        wgmma::wait<0>();  // P^T / dS^T registers free before the dQ accumulators go live; Q, dO read
        wgmma::fence_operands(dv_acc);
        wgmma::fence_operands(dk_acc);
        __syncwarp();
        if (lane == 0) tma::mbar_arrive(empty + 8 * st);  // this warp's products that read Q, dO are done

        if constexpr (DQ) {
            // dQ columns [HALF wg + DQ_N c, +DQ_N) of the query tile = dS K (A = dS^T, B = K, both MN-major),
            // through this warpgroup's staging box (chunk k of row r at k ^ (r % 8), as flash_bwd_tma)
#pragma unroll 1
            for (int c = 0; c < HALF / DQ_N; ++c) {
                const int col0 = wg * HALF + c * DQ_N;
                float dq[DQ_N / 2];
                issue_dq<T, BLOCK_N, DQ_N>(dq, sdS, sK + (col0 / 64) * (BLOCK_N * 128) + (col0 % 64) * 2);
                if (tg == 0) tma::store_wait_read();  // the previous pass's reduction has read the box
                wgmma::wait<0>();
                wgmma::fence_operands(dq);
                ws::bar_sync(3 + wg, 128);
                stage_dq<DQ_N>(box, dq, wrow + g, t);
                tma::fence_proxy_async_shared();
                ws::bar_sync(3 + wg, 128);
                if (tg == 0) {
                    tma::reduce_add_4d(dq_map, box, col0, q_row0 + m0, h, b);
                    tma::store_commit();
                }
            }
        }
    }
    // dK and dV out through the Q/dO ring as flash_bwd_tma's, once both warpgroups' last products are done:
    // warpgroup w's 2 x 64 rows x HALF columns from byte w x 4 x 64 x HALF of it
    ws::bar_sync(6, 256);
    {
        const long long block = ((long long)b * seq_kv * kv_heads + kvh) * HEAD_DIM + wg * HALF;
        store_dkdv_staged<T, HT>(dv_acc, dk_acc, smem + (sQ - sK) + wg * 4 * 64 * HALF, dv + block, dk + block,
                                 (long long)kv_heads * HEAD_DIM, n0, seq_kv, scale, warp & 3, lane, tg, 3 + wg);
    }
    if constexpr (DQ) {
        if (tg == 0) tma::store_wait_all();  // the staging box stays valid until the last reduction is done
    }
}
