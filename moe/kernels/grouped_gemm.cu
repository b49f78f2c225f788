// Grouped expert GEMM: out[rows of group e] = epilogue(a[rows of group e] @ b[e]^T), fp32 accumulate.
//
// Layout. a [rows, K] row-major, rows in expert order: group e is rows [offsets[e], offsets[e+1]).
// b [experts, N, K] row-major (K contiguous, torch Linear's [out, in] per expert): both operands are K-major,
// which is mma.sync's row.col form, so both are loaded with plain (non-transposing) ldmatrix.
// out [rows, N_out] row-major, N_out = N / 2 for SwiGLU, else N. K is a multiple of 8 (16-byte cp.async chunks
// of every row); N is any N >= 1 for fp32 outputs, a multiple of 8 (SwiGLU: 16) for 16-bit outputs, whose rows
// are written in 16-byte stores (grouped_gemm.py's validate holds the host side to this).
//
// Work items. A CTA computes one BM x BN tile of one expert. The tiles are numbered expert by expert
// (ceil(count_e / BM) * ceil(N / BN) tiles for expert e); the grid is an upper bound (host side: rows / BM +
// experts m-tiles), and warp 0 of each CTA finds its expert from the offsets (32 experts per step: a shuffle scan
// of the tile counts and a ballot), so the schedule needs no host round trip and CTAs past the end exit. Inside
// an expert, GROUP_M m-tiles share a column sweep (grouped rasterisation) so that CTAs resident together reuse
// the same rows of a and of b through L2.
//
// Main loop. STAGES-deep cp.async pipeline of (A: BM x BK, B: BN x BK) tiles in dynamic shared memory, rows of
// BK halves XOR-swizzled (mma.cuh) so that cp.async stores and ldmatrix loads are free of bank conflicts.
// Rows of a past the group's end, rows of b[e] past N (any N: the check is per row) and k past K are
// zero-filled by cp.async (src-size 0), never read.
// WARPS_M x WARPS_N warps; each warp owns a (BM / WARPS_M) x (BN / WARPS_N) accumulator tile in registers and
// per 16-wide k step loads its A fragments (ldmatrix.x4, 16 x 16) and B fragments (ldmatrix.x4, two 8 x 16)
// and issues (WM / 16) x (WN / 8) mma.sync.m16n8k16.
//
// Epilogue. EPI 0: none; 1: SwiGLU, b's rows are interleaved gate/up (row 2j gate j, row 2j + 1 up j), so the
// thread holding accumulator columns (2j, 2j + 1) writes silu(gate) * up to output column j; 2: GELU (erf).
// row_scale (float32 per row, may be null) multiplies the result. Results are staged through shared memory
// (reusing the pipeline buffers) and written with 16-byte stores. TO = float (plain GEMM only, e.g. router logits):
// fp32 results go straight from registers, 8 bytes per lane (4 when N is odd), each column guarded against N.
#include "mma.cuh"
#include "wgmma.cuh"
#include "tma.cuh"
#include "pdl.cuh"
#include "grid_sync.cuh"  // wait_count: the fused kernels' counters
#include "topk.cuh"  // the decode layer kernel's routing (moe_route's, per token)

constexpr int EPI_NONE = 0, EPI_SWIGLU = 1, EPI_GELU = 2;
// Rotary embedding (neox) on the leading output columns, tma tiles only: head dims 64, 128, 256.
constexpr int EPI_ROPE_64 = 3, EPI_ROPE_128 = 4, EPI_ROPE_256 = 5;
__host__ __device__ constexpr int rope_dim(int epi) {
    return epi == EPI_ROPE_64 ? 64 : epi == EPI_ROPE_128 ? 128 : epi == EPI_ROPE_256 ? 256 : 0;
}
constexpr int GROUP_M = 8;

// silu(x) = x / (1 + e^-x) with the fast division (rcp.approx, 2 ulp; 0 where e^-x overflows, as the true value
// rounds): the IEEE division's correction steps made SwiGLU epilogues 3-4 % of the time of a K = 2048 tile.
__device__ __forceinline__ float silu(float x) { return __fdividef(x, 1.f + __expf(-x)); }

// out[0:8] += v (eight 16-bit values) as one 16-byte reduction in L2 (sm_90: red.add.noftz on vectors of
// bf16x2 / f16x2, rounded to nearest)
template <typename T> __device__ __forceinline__ void red_add_16B(T* out, uint4 v);
template <> __device__ __forceinline__ void red_add_16B<__nv_bfloat16>(__nv_bfloat16* out, uint4 v) {
    asm volatile("red.global.add.noftz.v4.bf16x2 [%0], {%1, %2, %3, %4};\n" ::"l"(out), "r"(v.x), "r"(v.y), "r"(v.z),
                 "r"(v.w) : "memory");
}
template <> __device__ __forceinline__ void red_add_16B<__half>(__half* out, uint4 v) {
    asm volatile("red.global.add.noftz.v4.f16x2 [%0], {%1, %2, %3, %4};\n" ::"l"(out), "r"(v.x), "r"(v.y), "r"(v.z),
                 "r"(v.w) : "memory");
}

template <int EPI> __device__ __forceinline__ float activate(float x) {
    if constexpr (EPI == EPI_GELU) return 0.5f * x * (1.f + erff(x * 0.70710678118654752f));
    else return x;
}

// A group of `count` rows in pairs (clusters of two along M, 256 rows): its last pair is cut into tail items
// (pair_item) when it would hold at most 128 rows, ceil(n_tiles / 2) of them in place of n_tiles pairs.
__device__ __forceinline__ bool pair_tail(int count) {
    const int rem = count % 256;
    return rem != 0 && rem <= 128;
}
// The work items of such a group: a pair per (m-pair, n-tile), less the tail's saving.
__device__ __forceinline__ int pair_units(int count, int n_tiles) {
    return (count + 255) / 256 * n_tiles - (pair_tail(count) ? n_tiles / 2 : 0);
}

// Which expert work item `tile` falls in, computed by one whole warp (every lane gets the answer): the expert e,
// the tile's index inside the expert and the expert's m-tile count. The tiles are numbered expert by expert
// (ceil(count_e / BM) * n_tiles for expert e); the warp scans 32 experts per step (shuffle prefix sum of the tile
// counts and a ballot). Returns false for tiles past the last one. TAIL (the pairs of clusters along M, BM = 256):
// a group whose last pair holds at most 128 rows has ceil(n_tiles / 2) tail items there instead (pair_tail).
template <int BM, bool TAIL = false>
__device__ __forceinline__ bool scan_tile(int tile, const int* __restrict__ offsets, int experts, int n_tiles,
                                          int& e, int& local, int& m_tiles) {
    static_assert(!TAIL || BM == 256, "tail items are the pairs'");
    const int lane = threadIdx.x & 31;
    int base = 0;
    for (int e0 = 0; e0 < experts; e0 += 32) {
        const int ex = e0 + lane;
        const int count = ex < experts ? offsets[ex + 1] - offsets[ex] : 0;
        const int mt = (count + BM - 1) / BM;
        const int t = TAIL ? pair_units(count, n_tiles) : mt * n_tiles;
        int incl = t;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int v = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += v;
        }
        const int start = base + incl - t;
        const unsigned hit = __ballot_sync(0xffffffffu, t > 0 && tile >= start && tile < start + t);
        if (hit) {
            const int src = __ffs(hit) - 1;
            e = e0 + src;
            local = __shfl_sync(0xffffffffu, tile - start, src);
            m_tiles = __shfl_sync(0xffffffffu, mt, src);
            return true;
        }
        base += __shfl_sync(0xffffffffu, incl, 31);
    }
    return false;
}

// The (m-tile, n-tile) of tile `local` of an expert with m_tiles m-tiles: GROUP_M m-tiles share a column sweep,
// so that CTAs resident together reuse the same rows of a and of b through L2.
__device__ __forceinline__ void raster(int local, int m_tiles, int n_tiles, int& m_tile, int& n_tile) {
    const int per_group = GROUP_M * n_tiles;
    const int first_m = local / per_group * GROUP_M;
    const int group_m = min(m_tiles - first_m, GROUP_M);
    m_tile = first_m + (local % per_group) % group_m;
    n_tile = (local % per_group) / group_m;
}

// A pair (cluster of two CTAs along M, 2 x 128 rows) whose second CTA would lie past its group's end computes for
// nothing; such a group's last pair is cut into tail items instead: both CTAs take the group's last 128-row m-tile,
// CTA r its n-tile 2 j + r, each loading its own B (no multicast). `local` of a group of m_pairs pairs (the last a
// tail when `tail`): the (pair, n-tile) of a whole pair, or with `tail` left true the tail's pair and n-tile 2 j.
__device__ __forceinline__ void pair_item(int local, int m_pairs, int n_tiles, bool& tail, int& mp, int& n_tile) {
    const int m_whole = m_pairs - tail, whole = m_whole * n_tiles;
    if (local < whole) {
        tail = false;
        raster(local, m_whole, n_tiles, mp, n_tile);
    } else {
        mp = m_pairs - 1;
        n_tile = 2 * (local - whole);
    }
}

// scan_tile + pair_item for one warp (clusters of two along M).
__device__ __forceinline__ bool locate_pair(int tile, const int* __restrict__ offsets, int experts, int n_tiles,
                                            int& e, int& mp, int& n_tile, bool& tail) {
    int local, m_pairs;
    if (!scan_tile<256, true>(tile, offsets, experts, n_tiles, e, local, m_pairs)) return false;
    tail = pair_tail(offsets[e + 1] - offsets[e]);
    pair_item(local, m_pairs, n_tiles, tail, mp, n_tile);
    return true;
}

// scan_tile + raster for one warp.
template <int BM>
__device__ __forceinline__ bool locate_tile(int tile, const int* __restrict__ offsets, int experts, int n_tiles,
                                            int& e, int& m_tile, int& n_tile) {
    int local, m_tiles;
    if (!scan_tile<BM>(tile, offsets, experts, n_tiles, e, local, m_tiles)) return false;
    raster(local, m_tiles, n_tiles, m_tile, n_tile);
    return true;
}

// The work item of a whole CTA: warp 0 scans and shares (expert, local tile, m-tiles) through shared memory.
// Returns false for CTAs past the last tile (the grid is an upper bound). All threads must call it.
template <int BM>
__device__ __forceinline__ bool find_work_item(int tile, const int* __restrict__ offsets, int experts, int n_tiles,
                                               int* s_work, int& e, int& m_tile, int& n_tile) {
    if (threadIdx.x < 32) {
        int local, m_tiles;
        const bool found = scan_tile<BM>(tile, offsets, experts, n_tiles, e, local, m_tiles);
        if (threadIdx.x == 0) s_work[0] = found ? e : -1, s_work[1] = local, s_work[2] = m_tiles;
    }
    __syncthreads();
    e = s_work[0];
    if (e < 0) return false;
    raster(s_work[1], s_work[2], n_tiles, m_tile, n_tile);
    return true;
}

// The cp.async loads of a work item's k tiles, shared by the mma.sync and wgmma kernels: a stage holds A (the item's
// BM rows of a) and then B (expert e's BN rows of b from column n0, stored [N][K]), both BK wide, K-major, 16-byte
// chunks in the XOR swizzle (mma::swizzle; for wgmma it is the 128-byte-swizzle K-major layout). Thread t copies chunk
// t % (BK / 8) of tile rows t / (BK / 8) + j * RSTEP; rows past the item (A) or past N (B) and chunks past K are
// zero-filled (a 0-byte copy from the operand's base).
template <typename T, int BM, int BN, int BK, int THREADS>
struct StageLoader {
    static constexpr int CH = BK / 8, RSTEP = THREADS / CH, A_BYTES = BM * BK * 2, STAGE_BYTES = (BM + BN) * BK * 2;
    static constexpr int A_ITERS = BM / RSTEP, B_ITERS = BN / RSTEP;
    static_assert(BM % RSTEP == 0 && BN % RSTEP == 0, "tile rows must be a multiple of the rows per pass");
    const T* __restrict__ a;
    const T* __restrict__ b;
    int c, r0;
    const T* __restrict__ a_src;
    const T* __restrict__ b_src;
    size_t step;
    unsigned smem0;
    int rows_here, n0, N, K;

    __device__ __forceinline__ StageLoader(const T* __restrict__ a_, const T* __restrict__ b_, unsigned smem0_,
                                           int row0, int rows_here_, int e, int n0_, int N_, int K_, int tid)
        : a(a_), b(b_), c(tid % CH), r0(tid / CH), a_src(a_ + (size_t)(row0 + tid / CH) * K_ + (tid % CH) * 8),
          b_src(b_ + ((size_t)e * N_ + n0_ + tid / CH) * K_ + (tid % CH) * 8), step((size_t)RSTEP * K_),
          smem0(smem0_), rows_here(rows_here_), n0(n0_), N(N_), K(K_) {}

    // k tile kt into stage slot `slot`
    __device__ __forceinline__ void operator()(int slot, int kt) const {
        const bool k_ok = kt * BK + c * 8 < K;
        const unsigned sa = smem0 + slot * STAGE_BYTES, sb = sa + A_BYTES;
#pragma unroll
        for (int j = 0; j < A_ITERS; ++j) {
            const bool ok = k_ok && r0 + j * RSTEP < rows_here;
            mma::cp_async_16(sa + mma::swizzle<BK>(r0 + j * RSTEP, c), ok ? a_src + j * step + kt * BK : a, ok ? 16 : 0);
        }
#pragma unroll
        for (int j = 0; j < B_ITERS; ++j) {
            const bool ok = k_ok && n0 + r0 + j * RSTEP < N;
            mma::cp_async_16(sb + mma::swizzle<BK>(r0 + j * RSTEP, c), ok ? b_src + j * step + kt * BK : b, ok ? 16 : 0);
        }
    }
};

// Epilogue: accumulator fragments in the m16n8 C layout (rows wm * WM + i * 16 + lane / 4 (+ 8), columns
// wn * WN + j * 8 + 2 * (lane % 4) (+ 1)) -> activation, row scale, conversion -> out. Low-precision outputs are
// staged through shared memory (the pipeline buffers, free by now) and written with 16-byte stores; fp32 outputs
// (plain GEMM only) go straight from registers, 32 contiguous bytes per 4-lane group.
template <typename T, typename TO, int BM, int BN, int WM, int WN, int MI, int NI, int EPI, int THREADS>
__device__ __forceinline__ void store_tile(const float (&acc)[MI][NI][4], unsigned char* smem, TO* __restrict__ out,
                                           const float* __restrict__ row_scale, int row0, int rows_here, int n_tile,
                                           int N, int wm, int wn) {
    const int tid = threadIdx.x, lane = tid & 31;
    const int n0 = n_tile * BN;
    constexpr int BN_OUT = EPI == EPI_SWIGLU ? BN / 2 : BN;
    constexpr int C_STRIDE = BN_OUT + 8;  // elements; +16 bytes per row spreads the fragment stores over banks
    if constexpr (sizeof(TO) == 4) {
        // fp32 output (no activation, any N >= 1): each 4-lane group writes 32 contiguous bytes of a row, full
        // sectors. A column pair (col, col + 1), col even, is one 8-byte store when N is even (aligned, and
        // col < N implies col + 1 < N); with N odd, rows start at odd elements: two guarded 4-byte stores.
        static_assert(EPI == EPI_NONE, "fp32 output is for the plain GEMM");
        const bool pairs = (N & 1) == 0;
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = wm * WM + i * 16 + (lane >> 2) + h * 8;
                if (r >= rows_here) continue;
                const float scale = row_scale != nullptr ? row_scale[row0 + r] : 1.f;
#pragma unroll
                for (int j = 0; j < NI; ++j) {
                    const int col = n0 + wn * WN + j * 8 + 2 * (lane & 3);
                    if (col >= N) continue;
                    float* dst = out + (size_t)(row0 + r) * N + col;
                    const float v0 = acc[i][j][2 * h] * scale, v1 = acc[i][j][2 * h + 1] * scale;
                    if (pairs) {
                        *reinterpret_cast<float2*>(dst) = make_float2(v0, v1);
                    } else {
                        dst[0] = v0;
                        if (col + 1 < N) dst[1] = v1;
                    }
                }
            }
        return;
    } else {
    // fragments -> shared (activation, row scale, conversion) -> 16-byte stores
    T* c_tile = reinterpret_cast<T*>(smem);
#pragma unroll
    for (int i = 0; i < MI; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = wm * WM + i * 16 + (lane >> 2) + h * 8;
            const float scale = (row_scale != nullptr && r < rows_here) ? row_scale[row0 + r] : 1.f;
#pragma unroll
            for (int j = 0; j < NI; ++j) {
                const int col = wn * WN + j * 8 + 2 * (lane & 3);
                const float v0 = acc[i][j][2 * h], v1 = acc[i][j][2 * h + 1];
                if constexpr (EPI == EPI_SWIGLU) {
                    c_tile[r * C_STRIDE + col / 2] = mma::Convert<T>::from(silu(v0) * v1 * scale);
                } else {
                    *reinterpret_cast<unsigned*>(c_tile + r * C_STRIDE + col) =
                        mma::Convert<T>::pack(activate<EPI>(v0) * scale, activate<EPI>(v1) * scale);
                }
            }
        }
    }
    __syncthreads();
    constexpr int OCH = BN_OUT / 8;
    const int n_out = EPI == EPI_SWIGLU ? N / 2 : N;
    const int n_out0 = n_tile * BN_OUT;
    for (int idx = tid; idx < BM * OCH; idx += THREADS) {
        const int r = idx / OCH, oc = idx % OCH;
        if (r < rows_here && n_out0 + oc * 8 < n_out)
            *reinterpret_cast<uint4*>(out + (size_t)(row0 + r) * n_out + n_out0 + oc * 8) =
                *reinterpret_cast<const uint4*>(c_tile + r * C_STRIDE + oc * 8);
    }
    }
}

template <typename T, typename TO, int BM, int BN, int BK, int WARPS_M, int WARPS_N, int STAGES, int EPI, int MIN_BLOCKS>
__global__ void __launch_bounds__(WARPS_M * WARPS_N * 32, MIN_BLOCKS)
moe_grouped_gemm(const T* __restrict__ a, const T* __restrict__ b, TO* __restrict__ out,
                 const int* __restrict__ offsets, const float* __restrict__ row_scale, int experts, int N, int K) {
    constexpr int THREADS = WARPS_M * WARPS_N * 32;
    constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N;
    constexpr int MI = WM / 16, NI = WN / 8;
    constexpr int A_BYTES = BM * BK * 2, STAGE_BYTES = (BM + BN) * BK * 2;  // a stage: A, then B (StageLoader)
    static_assert(WM % 16 == 0 && WN % 16 == 0, "warp tile must be a multiple of 16 x 16");
    constexpr int BN_OUT = EPI == EPI_SWIGLU ? BN / 2 : BN;
    constexpr int C_STRIDE = BN_OUT + 8;  // elements; +16 bytes per row spreads the fragment stores over banks
    static_assert(BM * C_STRIDE * 2 <= STAGES * STAGE_BYTES, "epilogue staging must fit in the pipeline buffers");

    // all shared memory is dynamic (the default 48 KiB limit counts static bytes too): the pipeline, then the
    // work item (expert, tile index inside the expert, m-tiles of the expert)
    extern __shared__ __align__(128) unsigned char smem[];
    int* s_work = reinterpret_cast<int*>(smem + STAGES * STAGE_BYTES);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int n_tiles = (N + BN - 1) / BN;

    pdl::enter();  // one tile per CTA: the next kernel may be scheduled at once
    int e, m_tile, n_tile;
    if (!find_work_item<BM>(blockIdx.x, offsets, experts, n_tiles, s_work, e, m_tile, n_tile)) return;
    const int row0 = offsets[e] + m_tile * BM;
    const int rows_here = min(BM, offsets[e + 1] - row0);
    const int n0 = n_tile * BN;
    const int k_tiles = (K + BK - 1) / BK;

    const unsigned smem0 = mma::smem_addr(smem);
    const StageLoader<T, BM, BN, BK, THREADS> load_stage(a, b, smem0, row0, rows_here, e, n0, N, K, tid);

    float acc[MI][NI][4];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.f;

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < k_tiles) load_stage(s, s);
        mma::cp_async_commit();
    }

    const int wm = warp / WARPS_N, wn = warp % WARPS_N;
    // ldmatrix row/chunk of this lane: A x4 = (rows 0-7, k lo), (rows 8-15, k lo), (rows 0-7, k hi), (8-15, hi);
    // B x4 = (n 0-7, k lo), (n 0-7, k hi), (n 8-15, k lo), (n 8-15, k hi)
    const int a_row = wm * WM + (lane & 15), a_chunk = lane >> 4;
    const int b_row = wn * WN + ((lane >> 4) << 3) + (lane & 7), b_chunk = (lane >> 3) & 1;

    for (int kt = 0; kt < k_tiles; ++kt) {
        mma::cp_async_wait<STAGES - 2>();
        __syncthreads();  // stage kt landed for every thread; every warp is done with stage kt - 1
        const int next = kt + STAGES - 1;
        if (next < k_tiles) load_stage(next % STAGES, next);
        mma::cp_async_commit();

        const unsigned sa = smem0 + (kt % STAGES) * STAGE_BYTES, sb = sa + A_BYTES;
#pragma unroll
        for (int ks = 0; ks < BK / 16; ++ks) {
            unsigned af[MI][4], bf[NI][2];
#pragma unroll
            for (int i = 0; i < MI; ++i) mma::ldmatrix_x4(af[i], sa + mma::swizzle<BK>(a_row + i * 16, ks * 2 + a_chunk));
#pragma unroll
            for (int p = 0; p < NI / 2; ++p) {
                unsigned r[4];
                mma::ldmatrix_x4(r, sb + mma::swizzle<BK>(b_row + p * 16, ks * 2 + b_chunk));
                bf[2 * p][0] = r[0], bf[2 * p][1] = r[1], bf[2 * p + 1][0] = r[2], bf[2 * p + 1][1] = r[3];
            }
#pragma unroll
            for (int i = 0; i < MI; ++i)
#pragma unroll
                for (int j = 0; j < NI; ++j) mma::mma_16816<T>(acc[i][j], af[i], bf[j]);
        }
    }
    mma::cp_async_wait<0>();
    __syncthreads();  // the pipeline buffers become the output staging tile

    // ---- epilogue
    store_tile<T, TO, BM, BN, WM, WN, MI, NI, EPI, THREADS>(acc, smem, out, row_scale, row0, rows_here, n_tile, N,
                                                            warp / WARPS_N, warp % WARPS_N);
}

// ================================================================ Hopper path (sm_90a): wgmma
//
// moe_grouped_gemm_wgmma: the same work items, loads and epilogue as above, but the CTA tile BM x 256 is computed
// by BM / 64 warpgroups with wgmma.mma_async m64n256k16 reading both operands straight from shared memory (no
// ldmatrix, no register fragments for A or B). The cp.async tiles with 128-byte rows (BK = 64) and the XOR swizzle
// chunk ^ (row % 8) are exactly wgmma's 128-byte-swizzle K-major layout (8-row atoms of 1024 bytes), so one matrix
// descriptor per operand and stage describes them: start address, stride between 8-row atoms 1024 B, swizzle mode
// 128B; the k16 steps inside a 64-wide k tile advance the start address by 32 bytes. Each stage is 1024-aligned.
//
// Pipeline, per k tile kt: wait for stage kt (cp.async), make it visible to the async proxy (fence.proxy.async),
// barrier; issue 4 wgmma (k16 steps) on it and commit; wait until this warpgroup's wgmma of tile kt - 1 finished
// (wait_group 1) and barrier, so that stage (kt - 1) % STAGES is free; refill it with tile kt + STAGES - 1.
// The tensor cores work on tile kt while the loads for later tiles are in flight.
//
// Accumulators: thread t of warpgroup g holds rows 64g + 16 (t / 32) + (t % 32) / 4 (+ 8), columns 8j + 2 (t % 4)
// (+ 1), j = 0..31: the m16n8 C layout with WM = 16, WN = 256, which store_tile takes as is.

template <typename T, typename TO, int BM, int STAGES, int EPI>
__global__ void __launch_bounds__(BM * 2, 1)
moe_grouped_gemm_wgmma(const T* __restrict__ a, const T* __restrict__ b, TO* __restrict__ out,
                       const int* __restrict__ offsets, const float* __restrict__ row_scale, int experts, int N, int K) {
    constexpr int BN = 256, BK = 64;
    constexpr int THREADS = BM * 2;  // one warpgroup (128 threads) per 64 rows
    constexpr int A_BYTES = BM * BK * 2, STAGE_BYTES = (BM + BN) * BK * 2;  // a stage: A, then B (StageLoader)
    static_assert(BM == 64 || BM == 128, "one or two consumer warpgroups");
    static_assert(A_BYTES % 1024 == 0 && STAGE_BYTES % 1024 == 0, "stages and operands must stay 1024-aligned");
    static_assert(BM * (BN + 8) * 2 <= STAGES * STAGE_BYTES, "epilogue staging must fit in the pipeline buffers");

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    // the dynamic window is aligned up to 1024 bytes by hand (smem_bytes() reserves the slack)
    const unsigned raw0 = mma::smem_addr(smem_raw);
    unsigned char* smem = smem_raw + (((raw0 + 1023) & ~1023u) - raw0);
    int* s_work = reinterpret_cast<int*>(smem + STAGES * STAGE_BYTES);

    const int tid = threadIdx.x, warp = tid >> 5;
    const int n_tiles = (N + BN - 1) / BN;
    pdl::enter();  // one tile per CTA: the next kernel may be scheduled at once
    int e, m_tile, n_tile;
    if (!find_work_item<BM>(blockIdx.x, offsets, experts, n_tiles, s_work, e, m_tile, n_tile)) return;
    const int row0 = offsets[e] + m_tile * BM;
    const int rows_here = min(BM, offsets[e + 1] - row0);
    const int n0 = n_tile * BN;
    const int k_tiles = (K + BK - 1) / BK;

    const unsigned smem0 = mma::smem_addr(smem);
    const StageLoader<T, BM, BN, BK, THREADS> load_stage(a, b, smem0, row0, rows_here, e, n0, N, K, tid);

    float acc[1][32][4];
    float(&d)[128] = reinterpret_cast<float(&)[128]>(acc);
#pragma unroll
    for (int i = 0; i < 128; ++i) d[i] = 0.f;

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < k_tiles) load_stage(s, s);
        mma::cp_async_commit();
    }

    const int wg = wgmma::warpgroup();  // warp-uniform to the compiler: the wgmma descriptors in uniform registers
    for (int kt = 0; kt < k_tiles; ++kt) {
        mma::cp_async_wait<STAGES - 2>();
        wgmma::fence_proxy_async();  // cp.async wrote through the generic proxy; wgmma reads through the async proxy
        __syncthreads();
        const unsigned sa = smem0 + (kt % STAGES) * STAGE_BYTES + wg * 64 * BK * 2, sb = smem0 + (kt % STAGES) * STAGE_BYTES + A_BYTES;
        wgmma::fence();
#pragma unroll
        for (int ks = 0; ks < BK / 16; ++ks)
            wgmma::mma_ss<T, 256>(d, wgmma::desc_k_major(sa + ks * 32), wgmma::desc_k_major(sb + ks * 32));
        wgmma::commit();
        wgmma::wait<1>();  // tile kt - 1 is done: its stage may be refilled
        __syncthreads();
        const int next = kt + STAGES - 1;
        if (next < k_tiles) load_stage(next % STAGES, next);
        mma::cp_async_commit();
    }
    wgmma::wait<0>();
    mma::cp_async_wait<0>();
    __syncthreads();  // the pipeline buffers become the output staging tile

    store_tile<T, TO, BM, BN, 16, BN, 1, 32, EPI, THREADS>(acc, smem, out, row_scale, row0, rows_here, n_tile, N,
                                                           warp, 0);
}

// ================================================================ Hopper path (sm_90a): TMA, warp-specialised
//
// moe_grouped_gemm_tma (and _pair, clusters of 2): persistent, warp-specialised. 384 threads = three warpgroups:
//   warpgroup 0, the producer: hands registers back (setmaxnreg 40); lane 0 of its warp 0 issues the TMA loads of
//     each stage (A: 64 x 128 box of the [rows, K] map, B: 64 x BN box of the [experts * N, K] map, both with the
//     128-byte swizzle, so the stage is already wgmma's K-major layout) after waiting until the consumers freed it
//     (empty barrier) and announcing its bytes on the stage's full barrier;
//   warpgroups 1 and 2, the consumers (setmaxnreg 232): each owns 64 rows of the 128 x BN tile (BN 256 or 128);
//     or one consumer warpgroup (CW = 1, 256 threads, no register hand-over) owning a 64 x BN tile (BN 128 or 64):
//     the narrow tiles of a 128-token GEMM, whose weights then stream through two to four times the SMs. A
//     consumer waits on the full barrier, issues 4 wgmma m64nBNk16 per stage, keeps one wgmma group in flight, and
//     releases the previous stage (one arrival per consumer warpgroup in each CTA of the cluster: the empty
//     barriers count CW CM).
// Work: the CTA takes work items blockIdx.x, blockIdx.x + gridDim.x, ... (grid = the SM count, or fewer items);
// offsets == nullptr is one group of all `rows` rows (a dense GEMM): the items follow from `rows`, no offsets read;
// item u is split u % splits of tile u / splits (splits = 1 but where the planner splits K, see below); every
// warp that needs the work item finds it with locate_tile (no shared state, no __syncthreads after the start), so
// the producer runs ahead into the next tile while the consumers write the last one. The stage ring and its
// phases continue across tiles (iteration counter it: stage it % STAGES, phase (it / STAGES) & 1).
// Rows of A past the group's end (the next group's rows, or zeros past the tensor) and rows of B past N (the next
// expert's, or zeros) are multiplied but never stored; k past K is zero-filled by TMA.
// Clusters (CM = 2): the CTAs of a cluster take m-tiles 2i and 2i + 1 of one expert and one n-tile (work items
// of 256 rows; a group whose last pair would hold at most 128 rows ends in tail items instead, both CTAs on its
// last m-tile and n-tiles 2j, 2j + 1, each loading its own B: pair_item).
// Each loads its own A and half of B (128 rows), multicast into both CTAs, so B crosses L2 once per pair: 32 KiB
// of L2 reads per CTA and stage instead of 48. A stage may be refilled only when the consumers of both CTAs have
// freed it: the empty barriers count 2 CM arrivals, each consumer warpgroup arriving in its own CTA and the peer.
// The CTAs meet at a cluster barrier after the barrier inits and before exiting (no remote arrival may reach an
// exited CTA), so no warp returns early.
// Epilogue: each consumer warpgroup stages 64 rows x 128 output columns at a time in its own 16 KiB of shared
// memory (two 64-column blocks with the 128-byte swizzle: conflict-free fragment writes and 16-byte reads, and the
// layout of a 64 x 64 box of out_map). A slab of 64 rows inside its group leaves by TMA store (thread 0 of the
// warpgroup issues one box per block; the copy engine clips at N), so the consumers go on to the next tile while
// the engine writes; before a buffer is written again its last stores must have read it (wait_group.read). A
// group's last, partial slab is written by the 128 threads in 16-byte row stores guarded by the group's row count
// (a box would overwrite the next group's rows). Plain: BN / 128 passes of 128 columns; SwiGLU: one pass (BN
// columns of b -> BN / 2 outputs). row_scale multiplies each row.
// With splits > 1 the consumers write their fp32 sums instead (no epilogue) and moe_splitk_reduce finishes.
// Clusters along K (CK = 2-4, 128-column tiles): the CK CTAs of a cluster take the same tile, CTA r the k range
// [r K_t / CK, (r + 1) K_t / CK), and add their sums through distributed shared memory, so a split costs neither
// a second launch nor a trip of fp32 sums through global memory. Each consumer warpgroup writes its 64 x 128
// fp32 sums into its own 32 KiB buffer (16-byte chunks XOR-swizzled by row: conflict-free fragment writes and
// row reads) and every thread of it fences at cluster scope and arrives on the `ready` barrier of its counterpart
// warpgroup in every CTA of the cluster; then warpgroup g of CTA r adds rows [r 64 / CK, (r + 1) 64 / CK) of the CK
// buffers g in rank order (deterministic), applies the epilogue and row scale and stores them, and every thread
// fences and arrives on every counterpart's `freed` barrier, which a warpgroup waits on before it writes its buffer
// for the next tile (the barriers count CK x 128 arrivals; their phases count the tiles). Each thread releases its
// own accesses, so compute-sanitizer's racecheck sees the ordering (one thread's release after a named barrier it
// reports as a hazard; docs/perf/grouped_gemm.md v7.1, v7.2: one fence per thread, then relaxed arrivals).
// GATHER (the MoE layer's up-projection, moe_grouped_gemm_tma_gather): A's rows are token rows fetched through
// an index, row r of the groups = x[index[r] / divisor] (no gathered copy of the activations): the producer
// warpgroup's 128 threads copy each stage's A tile with cp.async (16-byte chunks, chunk c of row r at c ^ (r % 8):
// the layout TMA's 128-byte swizzle gives); each thread's copies arrive on the stage's full barrier when they land
// (cp.async.mbarrier.arrive.noinc: the producer never waits on its own copies, so B's TMA loads keep the whole
// pipeline's lead), which counts 1 + 128 arrivals and B's bytes. The consumers fence the proxies after the wait
// (fence.proxy.async: generic-proxy writes, wgmma reads through the async proxy). The token rows are read with an
// L2 evict-last policy: every n-tile of a group reads them again, and without it the weights streaming through L2
// evict them (the memory-bound up-projection at 2,048 tokens moved 7.5 GB instead of 6.0: 0.82x the layer with
// the gather launch; with it 1.00x, docs/perf/grouped_gemm.md "v7.3").
template <typename T, int STAGES, int EPI, int CM, int BN, int CK = 1, int CW = 2, bool GATHER = false,
          bool SCATTER = false>
__device__ __forceinline__ void grouped_gemm_tma(const tma::TensorMap& a_map, const tma::TensorMap& b_map,
                                                 const tma::TensorMap& out_map, T* __restrict__ out,
                                                 const int* __restrict__ offsets, const float* __restrict__ row_scale,
                                                 int experts, int N, int K, float* __restrict__ partial, int splits,
                                                 int rows, const float* __restrict__ rope_cos = nullptr,
                                                 const float* __restrict__ rope_sin = nullptr, int rope_seq = 1,
                                                 int rope_cols = 0, const T* __restrict__ gx = nullptr,
                                                 const int* __restrict__ gindex = nullptr, int gdiv = 1) {
    constexpr int BM = 64 * CW, BK = 64;  // CW consumer warpgroups, 64 rows each
    static_assert(CW == 1 || CW == 2, "one or two consumer warpgroups");
    static_assert(BN == 64 || BN == 128 || BN == 256, "64, 128 or 256 columns per tile");
    static_assert(CW == 2 || BN <= 128, "64-row tiles take 64 or 128 columns");
    static_assert(CM == 1 || BN == 256, "clusters share 256-column tiles");
    constexpr int A_BYTES = BM * BK * 2, B_BYTES = BN * BK * 2, STAGE_BYTES = A_BYTES + B_BYTES;
    // per consumer warpgroup: the staging of 64 x 128 outputs, or with CK > 1 its 64 x 128 fp32 sums
    constexpr int EPI_BYTES = CK > 1 ? 64 * 128 * 4 : 64 * 128 * 2;
    constexpr int HD = rope_dim(EPI);  // rotary: the head dim (0: none)
    static_assert(EPI == EPI_NONE || EPI == EPI_SWIGLU || HD > 0, "plain, SwiGLU or rotary epilogue");
    static_assert(HD == 0 || (CM == 1 && CK == 1 && BN % HD == 0), "rotary: whole heads in a tile, no clusters");
    static_assert(CM == 1 || CM == 2, "clusters of 1 or 2 CTAs along M");
    static_assert(!GATHER || (CW == 2 && CK == 1 && HD == 0 && STAGES >= 2),
                  "the fused gather: 128-row tiles, no split, no rotary");
    static_assert(CK == 1 || (CM == 1 && BN <= 128 && CK <= 4), "clusters along K: 2-4 CTAs, 64/128-column tiles");
    static_assert(!SCATTER || (!GATHER && EPI == EPI_NONE && CW == 2 && BN == 256 && CK == 1),
                  "the fused combine: plain 128 x 256 tiles, no gather, no split");
    constexpr int CS = CM * CK;  // CTAs per cluster

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const unsigned raw0 = tma::smem_u32(smem_raw);
    const unsigned smem0 = (raw0 + 1023) & ~1023u;  // stages and staging buffers on the 1024-byte swizzle atom
    const unsigned epi0 = smem0 + STAGES * STAGE_BYTES;
    const unsigned full0 = epi0 + CW * EPI_BYTES, empty0 = full0 + 8 * STAGES;
    const unsigned ready0 = empty0 + 8 * STAGES, freed0 = ready0 + 16;  // CK > 1: per consumer warpgroup

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int wg = wgmma::warpgroup();  // warp-uniform to the compiler: the wgmma descriptors in uniform registers
    const int rank = CS > 1 ? (int)tma::cluster_rank() : 0;
    const int mrank = CM > 1 ? rank : 0;  // the CTA's m-tile in its pair
    // the work items: tiles, or with splits > 1 (no cluster along K) tile u / splits, split u % splits
    const int ksplits = CK > 1 ? CK : splits;
    auto item_tile = [&](int unit) { return CK > 1 ? unit : unit / splits; };
    auto item_split = [&](int unit) { return CK > 1 ? rank : unit % splits; };
    const int n_tiles = (N + BN - 1) / BN;
    const int k_tiles = (K + BK - 1) / BK;
    // One group of all rows (offsets == nullptr, the dense GEMM of a model's projections): the tiles follow from
    // `rows` alone, no offsets read before the first load. Otherwise group e is rows [offsets[e], offsets[e + 1]).
    const bool dense = offsets == nullptr;
    auto group_lo = [&](int e) { return dense ? 0 : offsets[e]; };
    auto group_hi = [&](int e) { return dense ? rows : offsets[e + 1]; };
    // a whole warp calls it (locate_tile); `tail`: a pair's tail item (pair_item), CM = 2 only
    auto locate = [&](int tile, int& e, int& mp, int& n_tile, bool& tail) {
        tail = false;
        if (!dense) {
            if constexpr (CM > 1) return locate_pair(tile, offsets, experts, n_tiles, e, mp, n_tile, tail);
            else return locate_tile<BM>(tile, offsets, experts, n_tiles, e, mp, n_tile);
        }
        const int m_tiles = (rows + BM * CM - 1) / (BM * CM);
        e = 0;
        if constexpr (CM > 1) {
            tail = pair_tail(rows);
            if (tile >= pair_units(rows, n_tiles)) return false;
            pair_item(tile, m_tiles, n_tiles, tail, mp, n_tile);
            return true;
        }
        if (tile >= m_tiles * n_tiles) return false;
        raster(tile, m_tiles, n_tiles, mp, n_tile);
        return true;
    };
    if (tid == 0) {
        if constexpr (!GATHER) tma::prefetch_map(a_map);
        tma::prefetch_map(b_map);
        tma::prefetch_map(out_map);
        for (int s = 0; s < STAGES; ++s) {
            tma::mbar_init(full0 + 8 * s, GATHER ? 1 + 128 : 1);
            tma::mbar_init(empty0 + 8 * s, CW * CM);
        }
        if constexpr (CK > 1)
            for (int g = 0; g < CW; ++g) {
                tma::mbar_init(ready0 + 8 * g, CK * 128);
                tma::mbar_init(freed0 + 8 * g, CK * 128);
            }
        tma::fence_mbar_init();
    }
    if constexpr (CS > 1) tma::cluster_sync();  // the peers' barriers are initialised before any remote use
    else __syncthreads();
    pdl::wait();  // set up: from here on the previous kernel's outputs are read and ours written
    // The next kernel may be scheduled once every CTA starts its last work item (pdl.cuh): a CTA with one item (a
    // small GEMM) lets it in at once, a persistent CTA of a large one only for its last tile. Triggered at the
    // start, the next kernel slowed the large GEMMs by ~16 % (H100, large model b8: 358 -> 400 ms).
    bool triggered = false;
    auto trigger_if_last = [&](int unit) {  // a whole warp calls it (locate_tile)
        int e2, m2, n2;
        bool t2;
        if (!triggered && !locate(item_tile(unit + gridDim.x / CS), e2, m2, n2, t2)) {
            pdl::launch_dependents();
            triggered = true;
        }
    };

    // a unit's first row of A and of B's rows (e * N + column): in a tail item both CTAs load the same rows of A and
    // each its own n-tile of B, whole
    auto a_row0 = [&](int e, int mp, bool tail) { return group_lo(e) + (mp * CM + (tail ? 0 : mrank)) * BM; };
    auto b_row0 = [&](int e, int n_tile, bool tail) { return e * N + (n_tile + (tail ? rank : 0)) * BN; };

    // B's k-tile kt of n-tile rows [brow0, brow0 + BN) into stage buffer sa: in a pair, this CTA's half into both
    // CTAs (multicast), or in a tail item its own n-tile, whole, in the map's two boxes
    auto load_b = [&](unsigned sa, unsigned full, int kt, int brow0, bool tail) {
        if constexpr (CM > 1) {
            if (!tail)
                tma::load_2d_multicast(sa + A_BYTES + rank * (B_BYTES / CM), b_map, full, kt * BK,
                                       brow0 + rank * (BN / CM), (1u << CM) - 1);
            else
                for (int h = 0; h < CM; ++h)
                    tma::load_2d(sa + A_BYTES + h * (B_BYTES / CM), b_map, full, kt * BK, brow0 + h * (BN / CM));
        } else {
            tma::load_2d(sa + A_BYTES, b_map, full, kt * BK, brow0);
        }
    };

    if (wg == 0) {  // ---------------------------------------------------------------- producer
        // one consumer warpgroup has registers enough; the gathering producer keeps 8 rows' tokens
        if constexpr (CW == 2) ws::regs_dec<GATHER ? 56 : 40>();
        if constexpr (GATHER) {  // every producer thread: 8 chunks of A per stage (see GATHER above)
            int it = 0, e, mp, n_tile;
            bool tail;
            for (int unit = blockIdx.x / CS;
                 locate(item_tile(unit), e, mp, n_tile, tail);
                 unit += gridDim.x / CS) {
                trigger_if_last(unit);
                const int row0 = a_row0(e, mp, tail), brow0 = b_row0(e, n_tile, tail);
                // lane l of warp w copies chunk l % 8 of rows 32 w + 4 i + l / 8, i < 8: a warp reads four whole
                // 128-byte row pieces per instruction (full sectors) and each 8-lane phase writes one row's 8
                // chunks (no bank conflict); token -1: a row past the group (zeros, never stored)
                const int ch = lane & 7, r_lo = 32 * warp + (lane >> 3);
                const unsigned long long keep = mma::l2_evict_last_policy();  // x's rows: read by every n-tile
                int tok[8];
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    const int r = row0 + r_lo + 4 * i;
                    tok[i] = r < group_hi(e) ? gindex[r] / gdiv : -1;
                }
                for (int kt = 0; kt < k_tiles; ++kt, ++it) {
                    const int s = it % STAGES;
                    const unsigned full = full0 + 8 * s, sa = smem0 + s * STAGE_BYTES;
                    tma::mbar_wait(empty0 + 8 * s, ((it / STAGES) & 1) ^ 1);
                    if (tid == 0) {
                        tma::mbar_arrive_expect_tx(full, B_BYTES);
                        load_b(sa, full, kt, brow0, tail);
                    }
                    const int col = kt * BK + 8 * ch;
#pragma unroll
                    for (int i = 0; i < 8; ++i) {
                        const int r = r_lo + 4 * i;
                        const bool in = tok[i] >= 0 && col < K;
                        mma::cp_async_16_hint(sa + r * 128 + ((ch ^ (r & 7)) << 4),
                                              in ? gx + (size_t)tok[i] * K + col : gx, in ? 16 : 0, keep);
                    }
                    mma::cp_async_arrive_noinc(full);  // arrives once this thread's copies are in
                }
            }
            // no cp.async.wait_group here: no group is committed (the copies arrive on the full barriers, which
            // the consumers wait on)
        } else if (warp == 0) {
            int it = 0, e, mp, n_tile;
            bool tail;
            for (int unit = blockIdx.x / CS;
                 locate(item_tile(unit), e, mp, n_tile, tail);
                 unit += gridDim.x / CS) {
                trigger_if_last(unit);
                const int row0 = a_row0(e, mp, tail), brow0 = b_row0(e, n_tile, tail);
                const int ks = item_split(unit), kt_lo = ks * k_tiles / ksplits;
                const int kt_hi = (ks + 1) * k_tiles / ksplits;
                if (lane == 0) {
                    for (int kt = kt_lo; kt < kt_hi; ++kt, ++it) {
                        const int s = it % STAGES;
                        const unsigned full = full0 + 8 * s, sa = smem0 + s * STAGE_BYTES;
                        tma::mbar_wait(empty0 + 8 * s, ((it / STAGES) & 1) ^ 1);
                        tma::mbar_arrive_expect_tx(full, STAGE_BYTES);
                        tma::load_2d(sa, a_map, full, kt * BK, row0);
                        load_b(sa, full, kt, brow0, tail);
                    }
                }
                __syncwarp();
            }
        }
    } else {
        // -------------------------------------------------------------------- consumers
        if constexpr (CW == 2) ws::regs_inc<GATHER ? 224 : 232>();
        const int g = wg - 1;            // which 64 rows of the tile
        const int tg = tid - 128 * wg;   // thread index in the warpgroup
        const unsigned ebuf = epi0 + g * EPI_BYTES;
        float d[BN / 2];
        int it = 0, e, mp, n_tile;
        bool tail;
        // the previous stage is free: one arrival per consumer warpgroup in this CTA and in the peer (the peer's
        // without a cluster-scope release: its reads are done, and release.cluster costs a MEMBAR.ALL.GPU per stage)
        auto release = [&](int stage) {
            if (tg == 0) tma::mbar_arrive(empty0 + 8 * stage);
            if constexpr (CM > 1)
                if (tg == 32) tma::mbar_arrive_remote(empty0 + 8 * stage, rank ^ 1);
        };
        int summed = 0;  // CK > 1: tiles this warpgroup added through the cluster (the barriers' phase)
        for (int unit = blockIdx.x / CS;
             locate(item_tile(unit), e, mp, n_tile, tail);
             unit += gridDim.x / CS) {
            trigger_if_last(unit);
            const int m_tile = mp * CM + (tail ? 0 : mrank);  // a tail item: the same rows, n-tile 2 j + rank
            if (tail) n_tile += rank;
            const int ks = item_split(unit), kt_lo = ks * k_tiles / ksplits, kt_hi = (ks + 1) * k_tiles / ksplits;
            for (int kt = kt_lo; kt < kt_hi; ++kt, ++it) {
                const int s = it % STAGES;
                tma::mbar_wait(full0 + 8 * s, (it / STAGES) & 1);
                if constexpr (GATHER) wgmma::fence_proxy_async();  // A came through the generic proxy
                const unsigned sa = smem0 + s * STAGE_BYTES + g * (64 * BK * 2), sb = smem0 + s * STAGE_BYTES + A_BYTES;
                const unsigned long long da = wgmma::desc_k_major(sa), db = wgmma::desc_k_major(sb);
                wgmma::fence();
                // the work item's first product starts the sums (no zeroing of d between wgmma: ptxas would
                // serialise every wgmma of the loop, C7515)
#pragma unroll
                for (int k16 = 0; k16 < BK / 16; ++k16)
                    wgmma::mma_ss<T, BN>(d, wgmma::advance(da, k16 * 32), wgmma::advance(db, k16 * 32),
                                         kt > kt_lo || k16 > 0);
                wgmma::commit();
                wgmma::wait<1>();  // the previous stage's wgmma are done: release it
                if (kt > kt_lo) release((it - 1) % STAGES);
            }
            wgmma::wait<0>();
            release((it - 1) % STAGES);
// GEMM_PROBE_EPI (a probe, never defined in the engine's builds; wrong outputs): 1 no epilogue (the products' time
// alone), 2 no TMA stores of the staged tile, 3 no staging writes (the TMA stores send what the buffer holds)
#if defined(GEMM_PROBE_EPI) && GEMM_PROBE_EPI == 1
            if (d[0] != 12345.f) continue;  // reads the sums so the products stay
#endif

            // ---- epilogue: fragments -> swizzled staging (activation, row scale, conversion) -> 16-byte row stores
            const int row0 = group_lo(e) + m_tile * BM + 64 * g;
            const int rows_here = min(64, group_hi(e) - row0);
            if (rows_here <= 0 || n_tile >= n_tiles) continue;  // the whole warpgroup takes the same branch
            const int r_frag = 16 * (warp & 3) + (lane >> 2), q = lane & 3;
            if constexpr (CK > 1) {  // the cluster adds the CK sums of the tile through distributed shared memory
                // byte address of fp32 (r, c) in a warpgroup's sums: 512-byte rows of 16-byte chunks, chunk ^ 2 (r % 8)
                auto sums_at = [&](int r, int c) {
                    return ebuf + r * 512 + ((((c >> 2) ^ ((r & 7) << 1))) << 4) + (c & 3) * 4;
                };
                const unsigned ready = ready0 + 8 * g, freed = freed0 + 8 * g;
                tma::mbar_wait_cluster(freed, (summed & 1) ^ 1);  // every reader is done with the last tile's
#pragma unroll
                for (int j = 0; j < BN / 8; ++j)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int r = r_frag + 8 * h;
                        asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(sums_at(r, 8 * j + 2 * q)),
                                     "f"(d[4 * j + 2 * h]), "f"(d[4 * j + 2 * h + 1]) : "memory");
                    }
                tma::fence_cluster();  // my sums before my arrivals (one fence, not a release per arrival)
#pragma unroll
                for (int s = 0; s < CK; ++s) tma::mbar_arrive_remote(ready, s);  // my sums are in: every reader
                tma::mbar_wait_cluster(ready, summed & 1);         // ... and wait for the peers'
                // rows [r_lo, r_hi) of the tile are this warpgroup's: CPR chunks of 4 sums per row, ITERS per
                // thread; every chunk's CK loads are issued before any is added (the remote loads' latency
                // overlaps), then added in rank order
                constexpr int CPR = BN / 4;
                constexpr int ITERS = ((64 + CK - 1) / CK * CPR + 127) / 128;
                const int r_lo = rank * 64 / CK, r_hi = min((rank + 1) * 64 / CK, rows_here);
                const int n_out = EPI == EPI_SWIGLU ? N / 2 : N;
                float4 v[ITERS][CK];
                bool live[ITERS];
#pragma unroll
                for (int i = 0; i < ITERS; ++i) {
                    const int idx = tg + 128 * i, r = r_lo + idx / CPR, c = 4 * (idx % CPR);
                    live[i] = r < r_hi && n_tile * BN + c < N;
                    if (live[i])
#pragma unroll
                        for (int s = 0; s < CK; ++s) v[i][s] = tma::ld_cluster_f4(sums_at(r, c), s);
                }
#pragma unroll
                for (int i = 0; i < ITERS; ++i) {
                    if (!live[i]) continue;
                    const int idx = tg + 128 * i, r = r_lo + idx / CPR, c = 4 * (idx % CPR);
                    float4 t = v[i][0];
#pragma unroll
                    for (int s = 1; s < CK; ++s) {
                        t.x += v[i][s].x; t.y += v[i][s].y; t.z += v[i][s].z; t.w += v[i][s].w;
                    }
                    const float sc = row_scale != nullptr ? row_scale[row0 + r] : 1.f;
                    T* dst = out + (size_t)(row0 + r) * n_out;
                    if constexpr (EPI == EPI_SWIGLU) {
                        *reinterpret_cast<unsigned*>(dst + n_tile * (BN / 2) + c / 2) =
                            mma::Convert<T>::pack(silu(t.x) * t.y * sc, silu(t.z) * t.w * sc);
                    } else {
                        uint2 pk;
                        pk.x = mma::Convert<T>::pack(t.x * sc, t.y * sc);
                        pk.y = mma::Convert<T>::pack(t.z * sc, t.w * sc);
                        *reinterpret_cast<uint2*>(dst + n_tile * BN + c) = pk;
                    }
                }
                tma::fence_cluster();
#pragma unroll
                for (int s = 0; s < CK; ++s) tma::mbar_arrive_remote(freed, s);  // my reads of every buffer are done
                ++summed;
                continue;
            }
            if (splits > 1) {  // split K: this split's fp32 sums, straight from the fragments (moe_splitk_reduce)
                float* dst = partial + ((size_t)ks * rows + row0) * N + n_tile * BN + 2 * q;
#pragma unroll
                for (int j = 0; j < BN / 8; ++j)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int r = r_frag + 8 * h;
                        if (r < rows_here && n_tile * BN + 8 * j < N)
                            *reinterpret_cast<float2*>(dst + (size_t)r * N + 8 * j) =
                                make_float2(d[4 * j + 2 * h], d[4 * j + 2 * h + 1]);
                    }
                continue;
            }
            if constexpr (HD > 0) {
                // Rotary (neox) on columns [0, rope_cols): element i < HD / 2 of a head pairs with i + HD / 2, which
                // this thread holds in fragment j + HD / 16 (a tile holds whole heads); the row's position is
                // row % rope_seq (sequences of rope_seq rows), cos / sin from fp32 tables [rope_seq, HD / 2]. A
                // thread's elements are i = 8 t + 2 q (t < HD / 16) of every head in the tile, so it loads cos / sin
                // once per (t, row) for all heads, in batches of 8 t (4 beside the 256-column tile's accumulators)
                // issued before any is used (one L2 round trip per batch; the loads are in bounds whatever
                // rope_cols says).
                constexpr int BATCH = BN > 128 ? 4 : 8;
                constexpr int T = HD / 16, TB = T < BATCH ? T : BATCH, HEADS = BN / HD;
                int pos[2];
#pragma unroll
                for (int h = 0; h < 2; ++h) pos[h] = (row0 + r_frag + 8 * h) % rope_seq;
#pragma unroll
                for (int t0 = 0; t0 < T; t0 += TB) {
                    float2 c[TB][2], sn[TB][2];
#pragma unroll
                    for (int tb = 0; tb < TB; ++tb)
#pragma unroll
                        for (int h = 0; h < 2; ++h) {
                            const size_t at = (size_t)pos[h] * (HD / 2) + 8 * (t0 + tb) + 2 * q;
                            c[tb][h] = __ldg(reinterpret_cast<const float2*>(rope_cos + at));
                            sn[tb][h] = __ldg(reinterpret_cast<const float2*>(rope_sin + at));
                        }
#pragma unroll
                    for (int hh = 0; hh < HEADS; ++hh) {
                        if (n_tile * BN + hh * HD >= rope_cols) continue;  // v (or past the rotated heads)
#pragma unroll
                        for (int tb = 0; tb < TB; ++tb) {
                            const int j = hh * (HD / 8) + t0 + tb, jp = j + T;
#pragma unroll
                            for (int h = 0; h < 2; ++h) {
                                const float a0 = d[4 * j + 2 * h], a1 = d[4 * j + 2 * h + 1];
                                const float b0 = d[4 * jp + 2 * h], b1 = d[4 * jp + 2 * h + 1];
                                d[4 * j + 2 * h] = a0 * c[tb][h].x - b0 * sn[tb][h].x;
                                d[4 * j + 2 * h + 1] = a1 * c[tb][h].y - b1 * sn[tb][h].y;
                                d[4 * jp + 2 * h] = b0 * c[tb][h].x + a0 * sn[tb][h].x;
                                d[4 * jp + 2 * h + 1] = b1 * c[tb][h].y + a1 * sn[tb][h].y;
                            }
                        }
                    }
                }
            }
            const int n_out = EPI == EPI_SWIGLU ? N / 2 : N;
            float scale[2];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = r_frag + 8 * h;
                scale[h] = (row_scale != nullptr && r < rows_here) ? row_scale[row0 + r] : 1.f;
            }
            // byte address of element (r, c) of the staging tile: 64-column blocks of 128-byte rows, 128-byte swizzle
            auto staged = [&](int r, int c) {
                return ebuf + (c >> 6) * 8192 + r * 128 + ((((c & 63) >> 3) ^ (r & 7)) << 4) + (c & 7) * 2;
            };
            // passes of at most 128 output columns: SwiGLU one (BN / 2 outputs), plain BN / 128 (or one)
            constexpr int PASSES = EPI == EPI_SWIGLU || BN < 128 ? 1 : BN / 128;
            constexpr int FRAGS = BN / 8 / PASSES;             // 8-column fragments per pass
            constexpr int PASS_COLS = EPI == EPI_SWIGLU ? BN / 2 : BN / PASSES;  // output columns per pass
            constexpr int CHUNKS = PASS_COLS / 8;              // 16-byte chunks per staged row
            // whole 64-row slabs leave by TMA store (clipped at N) in 64-column boxes; a 32-column pass (SwiGLU
            // on a 64-column tile) by row stores; SCATTER: every row added to its token's row of out (below)
            const bool whole = !SCATTER && rows_here == 64 && PASS_COLS >= 64;
            constexpr int ROW_ITERS = (64 * CHUNKS + 127) / 128;  // 16-byte chunks per thread and pass
            static_assert(!SCATTER || 128 % CHUNKS == 0, "a thread's chunks lie in the same rows in every pass");
            int token[SCATTER ? ROW_ITERS : 1];  // SCATTER: the token of each row this thread adds (read once)
            if constexpr (SCATTER) {
#pragma unroll
                for (int i = 0; i < ROW_ITERS; ++i) {
                    const int r = (tg + 128 * i) / CHUNKS;
                    token[i] = r < rows_here ? __ldg(gindex + row0 + r) / gdiv : 0;
                }
            }
#pragma unroll
            for (int p = 0; p < PASSES; ++p) {
                if (tg == 0) tma::store_wait_read();  // the last stores from this buffer have read it
                ws::bar_sync(1 + g, 128);  // ... and the last pass's reads of the staging buffer are done
#pragma unroll
                for (int jj = 0; jj < FRAGS; ++jj) {
                    const int j = p * FRAGS + jj;
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int r = r_frag + 8 * h;
                        const float v0 = d[4 * j + 2 * h], v1 = d[4 * j + 2 * h + 1];
#if defined(GEMM_PROBE_EPI) && GEMM_PROBE_EPI == 3
                        if (v0 != 12345.f) continue;
#endif
                        if constexpr (EPI == EPI_SWIGLU) {
                            const int c = 4 * j + q;  // output column in the tile's 128
                            const unsigned addr = staged(r, c);
                            const T v = mma::Convert<T>::from(silu(v0) * v1 * scale[h]);
                            const unsigned short bits = *reinterpret_cast<const unsigned short*>(&v);
                            asm volatile("st.shared.b16 [%0], %1;\n" ::"r"(addr), "h"(bits));
                        } else {
                            const int c = 8 * jj + 2 * q;  // column in this pass's 128
                            const unsigned addr = staged(r, c);
                            const unsigned v = mma::Convert<T>::pack(v0 * scale[h], v1 * scale[h]);
                            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v));
                        }
                    }
                }
                const int col0 = EPI == EPI_SWIGLU ? n_tile * (BN / 2) : n_tile * BN + p * 128;
                if (whole) {  // the copy engine writes the two 64-column blocks; the consumers go on at once
                    tma::fence_proxy_async_shared();  // this thread's staging writes, before the engine reads them
                    ws::bar_sync(1 + g, 128);
#if defined(GEMM_PROBE_EPI) && GEMM_PROBE_EPI == 2
                    if (tg == 0 && d[0] == 12345.f) {
#else
                    if (tg == 0) {
#endif
#pragma unroll
                        for (int b = 0; b < PASS_COLS / 64; ++b)
                            tma::store_2d(out_map, ebuf + b * 8192, col0 + 64 * b, row0);
                        tma::store_commit();
                    }
                    continue;
                }
                ws::bar_sync(1 + g, 128);
#pragma unroll
                for (int i = 0; i < ROW_ITERS; ++i) {
                    const int idx = tg + 128 * i, r = idx / CHUNKS, ch = idx % CHUNKS;
                    if (r < rows_here && col0 + ch * 8 < n_out) {
                        const unsigned addr = staged(r, ch * 8);
                        uint4 v;
                        asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
                        if constexpr (SCATTER)
                            red_add_16B<T>(out + (size_t)token[i] * n_out + col0 + ch * 8, v);
                        else
                            *reinterpret_cast<uint4*>(out + (size_t)(row0 + r) * n_out + col0 + ch * 8) = v;
                    }
                }
            }
        }
    }
    if (wg > 0 && threadIdx.x % 128 == 0) tma::store_wait_all();  // the staging buffers outlive their stores
    if constexpr (CS > 1) tma::cluster_sync();  // no remote arrival or read may reach an exited CTA
}

// The kernels: one CTA per work item, or clusters of two along M (the cluster shape is a compile-time attribute
// of the pair kernel only; a single-CTA kernel carries none).
// BM 128 (two consumer warpgroups, 384 threads) or 64 (one, 256 threads: the narrow tiles of 128-token GEMMs,
// which put twice the CTAs on a weight-streaming problem).
template <typename T, int STAGES, int EPI, int BN, int BM = 128>
__global__ void __launch_bounds__(128 + 2 * BM, 1)
moe_grouped_gemm_tma(const __grid_constant__ tma::TensorMap a_map, const __grid_constant__ tma::TensorMap b_map,
                     const __grid_constant__ tma::TensorMap out_map, T* __restrict__ out,
                     const int* __restrict__ offsets, const float* __restrict__ row_scale, int experts, int N, int K,
                     float* __restrict__ partial, int splits, int rows, const float* __restrict__ rope_cos,
                     const float* __restrict__ rope_sin, int rope_seq, int rope_cols) {
    grouped_gemm_tma<T, STAGES, EPI, 1, BN, 1, BM / 64>(a_map, b_map, out_map, out, offsets, row_scale, experts, N,
                                                         K, partial, splits, rows, rope_cos, rope_sin, rope_seq,
                                                         rope_cols);
}

// The MoE layer's up-projection with the token gather fused into A's loads (GATHER in grouped_gemm_tma): row r of
// the groups is x[index[r] / divisor]; 128 x 256 tiles alone or in pairs (CM = 2). a's tensor map is not used.
template <typename T, int STAGES, int EPI>
__global__ void __launch_bounds__(384, 1)
moe_grouped_gemm_tma_gather(const __grid_constant__ tma::TensorMap b_map,
                            const __grid_constant__ tma::TensorMap out_map, T* __restrict__ out,
                            const int* __restrict__ offsets, const float* __restrict__ row_scale, int experts, int N,
                            int K, int rows, const T* __restrict__ x, const int* __restrict__ index, int divisor) {
    grouped_gemm_tma<T, STAGES, EPI, 1, 256, 1, 2, true>(b_map, b_map, out_map, out, offsets, row_scale, experts, N,
                                                         K, nullptr, 1, rows, nullptr, nullptr, 1, 0, x, index,
                                                         divisor);
}

template <typename T, int STAGES, int EPI>
__global__ void __launch_bounds__(384, 1) CLUSTER_OF(2)
moe_grouped_gemm_tma_pair_gather(const __grid_constant__ tma::TensorMap b_map,
                                 const __grid_constant__ tma::TensorMap out_map, T* __restrict__ out,
                                 const int* __restrict__ offsets, const float* __restrict__ row_scale, int experts,
                                 int N, int K, int rows, const T* __restrict__ x, const int* __restrict__ index,
                                 int divisor) {
    grouped_gemm_tma<T, STAGES, EPI, 2, 256, 1, 2, true>(b_map, b_map, out_map, out, offsets, row_scale, experts, N,
                                                         K, nullptr, 1, rows, nullptr, nullptr, 1, 0, x, index,
                                                         divisor);
}

// The MoE layer's down-projection with the combine fused (SCATTER in grouped_gemm_tma; pairs only: on the single
// 128 x 256 tile at 128 rows per expert the reductions cost the layer 1.5-1.9 %, docs/perf/grouped_gemm.md
// "v7.4"): row r of the groups is added to row index[r] / divisor of out [tokens, N] (zeroed before the launch)
// by 16-byte reductions (red.add.noftz on bf16x2 / f16x2), and never stored as expert-ordered rows (nothing goes
// through out_map: a's map fills its slot). With at most two rows per token this is deterministic and bitwise
// equal to moe_combine's fp32 sum of the two rounded rows: the first reduction adds a row to zero, which is exact,
// and the second rounds the exact sum of two 16-bit values once, whichever comes first (a sum of two 16-bit floats
// rounded through fp32 first is the same: 24 >= 2 p + 2 bits, so the double rounding is innocuous). More rows per
// token would depend on the order: the layer keeps the combine launch there.
template <typename T, int STAGES, int EPI>
__global__ void __launch_bounds__(384, 1) CLUSTER_OF(2)
moe_grouped_gemm_tma_pair_scatter(const __grid_constant__ tma::TensorMap a_map,
                                  const __grid_constant__ tma::TensorMap b_map, T* __restrict__ out,
                                  const int* __restrict__ offsets, const float* __restrict__ row_scale, int experts,
                                  int N, int K, int rows, const int* __restrict__ index, int divisor) {
    grouped_gemm_tma<T, STAGES, EPI, 2, 256, 1, 2, false, true>(a_map, b_map, a_map, out, offsets, row_scale, experts,
                                                                N, K, nullptr, 1, rows, nullptr, nullptr, 1, 0,
                                                                nullptr, index, divisor);
}

template <typename T, int STAGES, int EPI>
__global__ void __launch_bounds__(384, 1) CLUSTER_OF(2)
moe_grouped_gemm_tma_pair(const __grid_constant__ tma::TensorMap a_map, const __grid_constant__ tma::TensorMap b_map,
                          const __grid_constant__ tma::TensorMap out_map, T* __restrict__ out,
                          const int* __restrict__ offsets, const float* __restrict__ row_scale, int experts, int N,
                          int K, float* __restrict__ partial, int splits, int rows) {
    grouped_gemm_tma<T, STAGES, EPI, 2, 256>(a_map, b_map, out_map, out, offsets, row_scale, experts, N, K, partial, 1,
                                             rows);
}

// Clusters of CK CTAs splitting each BM x BN tile's K range (128 x 128, or 64 x 64 / 64 x 128), their sums added
// through distributed shared memory (no partial sums in global memory, no reduce launch; out_map and partial are
// not used).
template <typename T, int STAGES, int EPI, int CK, int BN = 128, int BM = 128>
__global__ void __launch_bounds__(128 + 2 * BM, 1) CLUSTER_OF(CK)
moe_grouped_gemm_tma_ksplit(const __grid_constant__ tma::TensorMap a_map,
                            const __grid_constant__ tma::TensorMap b_map,
                            const __grid_constant__ tma::TensorMap out_map, T* __restrict__ out,
                            const int* __restrict__ offsets, const float* __restrict__ row_scale, int experts, int N,
                            int K, float* __restrict__ partial, int splits, int rows) {
    grouped_gemm_tma<T, STAGES, EPI, 1, BN, CK, BM / 64>(a_map, b_map, out_map, out, offsets, row_scale, experts, N,
                                                         K, partial, 1, rows);
}

// Split K (moe_grouped_gemm_tma with splits > 1): split s of a tile summed k tiles [s K_t / S, (s + 1) K_t / S)
// into partial[s][row][column] (fp32, [splits, rows, N]); this kernel adds the S sums of each output element in
// split order (deterministic), applies the epilogue and the row scale, and writes 8 outputs per thread and row in
// 16-byte stores. Rows outside [offsets[0], offsets[experts]) were not computed and are not written.
template <typename T, int EPI>
__global__ void __launch_bounds__(256)
moe_splitk_reduce(const float* __restrict__ partial, T* __restrict__ out, const int* __restrict__ offsets,
                  const float* __restrict__ row_scale, int experts, int N, int splits, int rows) {
    static_assert(EPI == EPI_NONE || EPI == EPI_SWIGLU, "plain or SwiGLU epilogue");
    constexpr int IN = EPI == EPI_SWIGLU ? 16 : 8;  // partial columns per 8 outputs
    pdl::enter();
    const int lo = offsets != nullptr ? offsets[0] : 0, hi = offsets != nullptr ? offsets[experts] : rows;  // null: dense
    const int n_out = EPI == EPI_SWIGLU ? N / 2 : N, chunks = n_out / 8;
    const size_t split_stride = (size_t)rows * N;
    const int c = blockIdx.x * blockDim.x + threadIdx.x;  // grid: x over a row's chunks, y strides the rows
    if (c >= chunks) return;
    const int c8 = 8 * c;
    for (int r = lo + blockIdx.y; r < hi; r += gridDim.y) {
        const float* src = partial + (size_t)r * N + (size_t)c8 * (IN / 8);
        float v[IN];
#pragma unroll
        for (int x = 0; x < IN; ++x) v[x] = 0.f;
        for (int s = 0; s < splits; ++s, src += split_stride) {
#pragma unroll
            for (int x = 0; x < IN / 4; ++x) {
                const float4 f = __ldcs(reinterpret_cast<const float4*>(src) + x);
                v[4 * x] += f.x; v[4 * x + 1] += f.y; v[4 * x + 2] += f.z; v[4 * x + 3] += f.w;
            }
        }
        const float scale = row_scale != nullptr ? row_scale[r] : 1.f;
        float o[8];
#pragma unroll
        for (int x = 0; x < 8; ++x) {
            if constexpr (EPI == EPI_SWIGLU) {
                const float gate = v[2 * x], up = v[2 * x + 1];
                o[x] = silu(gate) * up * scale;
            } else {
                o[x] = v[x] * scale;
            }
        }
        uint4 packed;
        packed.x = mma::Convert<T>::pack(o[0], o[1]);
        packed.y = mma::Convert<T>::pack(o[2], o[3]);
        packed.z = mma::Convert<T>::pack(o[4], o[5]);
        packed.w = mma::Convert<T>::pack(o[6], o[7]);
        *reinterpret_cast<uint4*>(out + (size_t)r * n_out + c8) = packed;
    }
}

// ---------------------------------------------------------------- skinny tiles (decode-sized groups)
//
// A group of a few rows (a decode step: 1-16 rows per expert) makes the GEMM a stream over the expert's weights:
// the bytes of b[e] are the cost, the FLOPs are not. These CTAs cut the work along N and K instead of M and
// compute the product transposed, out[rows, n]^T = b[e][n, :] . a[rows, :]^T: b's rows are mma's M (16 per warp
// tile, MI tiles per warp) and the group's rows its N (8 per n8 tile, BM / 8 tiles per pass), so one row per
// expert wastes 7/8 of an n8 tile instead of 127/128 of an m128 tile. Each lane reads b straight from global
// memory into its A fragments with 16-byte loads (no shared memory, no ldmatrix): lane (g, q) = (lane / 4,
// lane % 4) reads k = 32c + 8q .. 32c + 8q + 7 of weight rows g and g + 8, the eight k values its two
// m16n8k16 steps over chunk c need, in a permuted order; a's fragment (row g of the n8 tile) is read with the
// same permutation, and a dot product does not depend on the order of k.
//
// Work: items (slot, n-block), slot the index of a non-empty group, BN = 16 * MI * WN weight rows per item.
// The CTAs are persistent (the grid is what fits on the GPU at once): warp 0 lists the non-empty groups in
// shared memory once (a ballot scan of the offsets), then every CTA strides over the items, so the expert
// lookup and the CTA start-up are paid once per CTA, not once per item. A CTA's WN x KS warps split an item's
// rows WN ways and K KS ways (chunks of 32); the KS partial sums meet in shared memory ([KS][BM][BN + 4] fp32)
// in a fixed order (deterministic), where the epilogue (activation, SwiGLU pairs, row scale) reads them and
// writes out row by row. Groups of more than BM rows take several passes over the same weights (from L2). U
// chunks of loads are issued before their MMAs.
//
// a_index (may be null) fuses the token gather: row r of the groups reads a[a_index[r] / a_div] (the layer's
// sorted slots over top_k), so a is x itself and no gathered copy is written.
//
// early > 0: early_counts holds the groups' row counts (the routing's), written at least two launches back (the
// layer: routing -> permutation -> up-projection -> down-projection), so final before this grid's pdl::wait
// (pdl.cuh: a grid starts only after the one before it has passed its own wait). The CTA then lists the non-empty
// groups from them and asks L2 for the first `early` bytes of its items' weights (one bulk prefetch per item, at
// most four: an item's rows are contiguous) before the wait, so a programmatic launch streams weights while the
// previous grid finishes instead of after it. Everything else (offsets, a, a_index, row_scale) is read after it.
constexpr int SKINNY_MAX_GROUPS = 512;  // = configs.MAX_EXPERTS: the list of non-empty groups in shared memory

// The weight loads ask L2 to fetch 256 bytes from DRAM on a miss (`.L2::256B`): a warp's load reads 64 bytes of
// each of 8 or 16 weight rows and its next chunks read the next 64-byte pieces of the same rows, so without the hint
// each row's 128-byte lines reach DRAM in pieces (H100: decode layers 1-4 % faster, outputs bitwise equal;
// docs/perf/grouped_gemm.md, v4.11). SKINNY_L2_PREFETCH (0 / 64 / 128 / 256) sets it for A/B builds.
#ifndef SKINNY_L2_PREFETCH
#define SKINNY_L2_PREFETCH 256
#endif
#if SKINNY_L2_PREFETCH == 256
#define SKINNY_LD_HINT ".L2::256B"
#elif SKINNY_L2_PREFETCH == 128
#define SKINNY_LD_HINT ".L2::128B"
#elif SKINNY_L2_PREFETCH == 64
#define SKINNY_LD_HINT ".L2::64B"
#elif SKINNY_L2_PREFETCH == 0
#define SKINNY_LD_HINT ""
#else
#error "SKINNY_L2_PREFETCH: 0, 64, 128 or 256"
#endif
__device__ __forceinline__ uint4 ld_stream_16(const void* p) {  // read once: no L1 allocation
    uint4 v;
    asm("ld.global.nc.L1::no_allocate" SKINNY_LD_HINT ".v4.u32 {%0, %1, %2, %3}, [%4];\n"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

__device__ __forceinline__ unsigned u4_at(const uint4& v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// One item of the skinny tiles: weight rows [nb BN, nb BN + BN) of group e against the group's rows, in passes of
// BM rows; the CTA's KS warps along K meet in `partial` ([KS][BM][BN + 4] fp32); ends with __syncthreads.
// FRESH_A: a was written by this grid (the fused FFN's h), so it is read through L2 (ld.global.cg), not the
// read-only path.
template <typename T, typename TO, int BM, int MI, int WN, int KS, int U, int EPI, bool FRESH_A>
__device__ __forceinline__ void skinny_item(const T* __restrict__ a, const T* __restrict__ b, TO* __restrict__ out,
                                            const int* __restrict__ offsets, const float* __restrict__ row_scale,
                                            int e, int nb, int N, int K, const int* __restrict__ a_index, int a_div,
                                            float* __restrict__ partial) {
    static_assert(BM % 8 == 0 && BM <= 64, "BM: whole n8 tiles, at most 64 rows per pass");
    static_assert(EPI != EPI_SWIGLU || sizeof(TO) == sizeof(T), "SwiGLU writes the input dtype");
    constexpr int NT = BM / 8, BN = 16 * MI * WN, THREADS = WN * KS * 32, STRIDE = BN + 4;
    constexpr int BN_OUT = EPI == EPI_SWIGLU ? BN / 2 : BN;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int kg = warp % KS, ng = warp / KS;
    const int chunks = (K + 31) / 32;
    const int c_lo = kg * chunks / KS, c_hi = (kg + 1) * chunks / KS;
    const int n_out_total = EPI == EPI_SWIGLU ? N / 2 : N;
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    float* mine = partial + kg * BM * STRIDE;
    const T* wrow[MI][2];
    bool wok[MI][2];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int n = nb * BN + ng * 16 * MI + i * 16 + g + 8 * h;
            wok[i][h] = n < N;
            wrow[i][h] = b + ((size_t)e * N + min(n, N - 1)) * K + 8 * q;
        }
    const int row0 = offsets[e], count = offsets[e + 1] - row0;
    for (int p0 = 0; p0 < count; p0 += BM) {
        const int nt = min(NT, (count - p0 + 7) / 8);
        const T* xrow[NT];
        bool xok[NT];
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const int r = p0 + j * 8 + g;
            xok[j] = r < count;
            const int src = !xok[j] ? row0 : a_index != nullptr ? a_index[row0 + r] / a_div : row0 + r;
            xrow[j] = a + (size_t)src * K + 8 * q;
        }
        float acc[MI][NT][4];
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
            for (int j = 0; j < NT; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;

        for (int c0 = c_lo; c0 < c_hi; c0 += U) {
            uint4 w[U][MI][2], x[U][NT];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int k = (c0 + u) * 32;
                const bool ok = c0 + u < c_hi && k + 8 * q < K;
#pragma unroll
                for (int i = 0; i < MI; ++i)
#pragma unroll
                    for (int h = 0; h < 2; ++h)
                        w[u][i][h] = ok && wok[i][h] ? ld_stream_16(wrow[i][h] + k) : zero;
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int k = (c0 + u) * 32;
                const bool ok = c0 + u < c_hi && k + 8 * q < K;
#pragma unroll
                for (int j = 0; j < NT; ++j)
                    if (j < nt)
                        x[u][j] = !(ok && xok[j]) ? zero
                                  : FRESH_A ? __ldcg(reinterpret_cast<const uint4*>(xrow[j] + k))
                                            : __ldg(reinterpret_cast<const uint4*>(xrow[j] + k));
            }
#pragma unroll
            for (int u = 0; u < U; ++u)
#pragma unroll
                for (int s = 0; s < 2; ++s)
#pragma unroll
                    for (int i = 0; i < MI; ++i) {
                        const unsigned fa[4] = {u4_at(w[u][i][0], 2 * s), u4_at(w[u][i][1], 2 * s),
                                                u4_at(w[u][i][0], 2 * s + 1), u4_at(w[u][i][1], 2 * s + 1)};
#pragma unroll
                        for (int j = 0; j < NT; ++j)
                            if (j < nt) {
                                const unsigned fb[2] = {u4_at(x[u][j], 2 * s), u4_at(x[u][j], 2 * s + 1)};
                                mma::mma_16816<T>(acc[i][j], fa, fb);
                            }
                    }
        }
        // C fragment: weight rows (g, g + 8) of tile i, group rows (2q, 2q + 1) of n8 tile j
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
            for (int j = 0; j < NT; ++j)
                if (j < nt) {
                    const int n = ng * 16 * MI + i * 16 + g, t = j * 8 + 2 * q;
                    mine[t * STRIDE + n] = acc[i][j][0];
                    mine[(t + 1) * STRIDE + n] = acc[i][j][1];
                    mine[t * STRIDE + n + 8] = acc[i][j][2];
                    mine[(t + 1) * STRIDE + n + 8] = acc[i][j][3];
                }
        __syncthreads();
        const int rows_here = min(BM, count - p0);
        for (int idx = threadIdx.x; idx < rows_here * BN_OUT; idx += THREADS) {
            const int t = idx / BN_OUT, c = idx % BN_OUT;
            const int col = nb * BN_OUT + c;
            if (col >= n_out_total) continue;
            const int r = row0 + p0 + t;
            float v;
            if constexpr (EPI == EPI_SWIGLU) {
                float gate = 0.f, up = 0.f;
#pragma unroll
                for (int s = 0; s < KS; ++s) {
                    gate += partial[(s * BM + t) * STRIDE + 2 * c];
                    up += partial[(s * BM + t) * STRIDE + 2 * c + 1];
                }
                v = silu(gate) * up;
            } else {
                v = 0.f;
#pragma unroll
                for (int s = 0; s < KS; ++s) v += partial[(s * BM + t) * STRIDE + c];
                v = activate<EPI>(v);
            }
            if (row_scale != nullptr) v *= row_scale[r];
            if constexpr (sizeof(TO) == 4) out[(size_t)r * n_out_total + col] = v;
            else out[(size_t)r * n_out_total + col] = mma::Convert<TO>::from(v);
        }
        __syncthreads();
    }
}

// The first `early` bytes of the weights of a CTA's items (blockIdx.x + i * gridDim.x, i < 4), asked of L2 with
// one bulk prefetch per item (an item's BN rows are contiguous): b is never written by a kernel, so before the
// programmatic wait. `items` counts items of n_blocks weight blocks per listed group.
template <typename T, int BN>
__device__ __forceinline__ void skinny_prefetch(const T* __restrict__ b, const int* __restrict__ groups, int items,
                                                int n_blocks, int N, int K, long long early) {
    const long long item_bytes = (long long)BN * K * sizeof(T), left = early - threadIdx.x * item_bytes;
    if (threadIdx.x < 4 && left >= 16) {
        const int item = blockIdx.x + threadIdx.x * gridDim.x;
        if (item < items) {
            const int e = groups[item / n_blocks], n0 = (item % n_blocks) * BN;
            const long long whole = (long long)min(BN, N - n0) * K * sizeof(T);
            tma::prefetch_l2(b + ((size_t)e * N + n0) * K, (unsigned)(min(whole, left) & ~15ll));
        }
    }
}

// The non-empty groups (counts[e] > 0 when counts is given, else offsets[e + 1] > offsets[e]) listed in shared
// memory by warp 0; returns their number to every thread.
__device__ __forceinline__ int skinny_list_groups(const int* __restrict__ counts, const int* __restrict__ offsets,
                                                  int experts, int* groups, int* group_count) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (warp == 0) {
        int seen = 0;
        for (int e0 = 0; e0 < experts; e0 += 32) {
            const int ex = e0 + lane;
            const bool has = ex < experts && (counts != nullptr ? counts[ex] > 0 : offsets[ex + 1] > offsets[ex]);
            const unsigned m = __ballot_sync(0xffffffffu, has);
            if (has) groups[seen + __popc(m & ((1u << lane) - 1u))] = ex;
            seen += __popc(m);
        }
        if (lane == 0) *group_count = seen;
    }
    __syncthreads();
    return *group_count;
}

template <typename T, typename TO, int BM, int MI, int WN, int KS, int U, int EPI>
__global__ void __launch_bounds__(WN * KS * 32)
moe_grouped_gemm_skinny(const T* __restrict__ a, const T* __restrict__ b, TO* __restrict__ out,
                        const int* __restrict__ offsets, const float* __restrict__ row_scale, int experts, int N,
                        int K, const int* __restrict__ a_index, int a_div,
                        const int* __restrict__ early_counts, int early) {
    constexpr int BN = 16 * MI * WN;
    extern __shared__ float partial[];  // [KS][BM][BN + 4], then the non-empty groups and their count
    int* groups = reinterpret_cast<int*>(partial + KS * BM * (BN + 4));

    if (early == 0) pdl::enter();  // decode-sized GEMMs are one wave of CTAs (the grid is what fits at once)
    const int listed = skinny_list_groups(early > 0 ? early_counts : nullptr, offsets, experts, groups,
                                          groups + SKINNY_MAX_GROUPS);
    const int n_blocks = (N + BN - 1) / BN;
    const int items = listed * n_blocks;
    if (early > 0) {  // the first items' weights into L2, then the wait
        skinny_prefetch<T, BN>(b, groups, items, n_blocks, N, K, early);
        pdl::enter();
    }
    for (int item = blockIdx.x; item < items; item += gridDim.x)
        skinny_item<T, TO, BM, MI, WN, KS, U, EPI, false>(a, b, out, offsets, row_scale, groups[item / n_blocks],
                                                          item % n_blocks, N, K, a_index, a_div, partial);
}

// DECODE_TIMELINE=N (a probe, tools/decode_timeline.py; never defined in the engine's builds, whose SASS it leaves
// untouched): thread 0 of each of the first N CTAs of moe_decode_skinny writes global-timer stamps into
// decode_timeline[cta][slot] (the host zeroes it first): 0 start, 1 past pdl::enter, 2 its router items done,
// 3 past the router barrier, 4 routing done (before the prefetch), 5 its up items done, 6 its first down item past
// its wait, 7 its down items done, 8 exit; 9 the SM, 10 its up items, 11 its down items; within the routing: 12 the
// counts zeroed, 13 the tokens' choices made, 14 the offsets scanned, 15 the slots sorted.
#ifdef DECODE_TIMELINE
#include "timeline.cuh"
__device__ unsigned long long decode_timeline[DECODE_TIMELINE][16];
#define DECODE_STAMP(slot, value)                                                         \
    do {                                                                                  \
        if (threadIdx.x == 0 && blockIdx.x < DECODE_TIMELINE) decode_timeline[blockIdx.x][slot] = (value); \
    } while (0)
#define DECODE_NOW() global_timer_ns()
#else
#define DECODE_STAMP(slot, value) \
    do {                          \
    } while (0)
#define DECODE_NOW() 0ull
#endif

// ---------------------------------------------------------------- the decode-sized expert FFN in one launch
//
// moe_ffn_skinny: the up-projection (SwiGLU, token rows gathered through a_index) and the down-projection (row
// scale) of a decode-sized layer as one persistent grid of skinny items: the up items of every listed group
// first, then the down items, the CTAs taking them in order (ffn_items). A down item of group slot s needs every
// up item of s (h's rows of the group, all columns): the CTA that finishes an up item publishes it (fence, then
// an atomic add on sync[s]), and a down item waits until sync[s] counts all of s's up items (an acquire load),
// then reads h through L2 (a down item's weights asked of L2 before that wait measured no gain: not done). No
// deadlock: the grid is what fits at once (all CTAs resident), items are handed out in increasing order, and
// every up item comes before every down item, so the lowest unfinished item never waits. The down items'
// completions count in sync[SKINNY_MAX_GROUPS + s]; the last of a slot sets both counters back to zero, so the
// next launch finds them zeroed (the caller zeroes the buffer once). Saves the second launch and its ramp: the
// down items of the first groups stream while the up items of the last ones finish. (wait_count: grid_sync.cuh.)

// The fused FFN's counters (moe.grouped_gemm.SkinnyFFN.SYNC_BYTES): per group slot its up items stored, per group
// slot its down items past their wait, the ticket and its CTA count, the decode kernel's router barrier; then
// per down column block its items stored (the combine's).
constexpr int SKINNY_COLS = 2 * SKINNY_MAX_GROUPS + 16, SKINNY_MAX_COLS = 1024, SKINNY_MAX_TOP_K = 8;

// Two 16-bit elements (low half first) as floats, exactly.
template <typename T> __device__ __forceinline__ float2 unpack2(unsigned u);
template <> __device__ __forceinline__ float2 unpack2<__nv_bfloat16>(unsigned u) {
    return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
}
template <> __device__ __forceinline__ float2 unpack2<__half>(unsigned u) {
    return __half22float2(*reinterpret_cast<const __half2*>(&u));
}

// The layer's combine over columns [c0, c0 + BN) of every token, in the grid that wrote them: out[t, c] = the
// sum over k, in order, of y[inv[t top_k + k], c], in fp32 from zero with unit weights (y's rows carry the routing
// weights already): moe_combine's arithmetic, so the same bits. 4 columns per thread, up to 4 of its 8-byte
// loads in flight at once (y through L2: other CTAs of this grid wrote it); hidden and c0 are multiples of 8.
// (16-byte loads, or all top_k in flight, cost decode instances 8-76 bytes of spills at the 128-register bound.)
template <typename T, int BN>
__device__ __forceinline__ void combine_columns(const T* __restrict__ y, T* __restrict__ out, const int* inv,
                                                int tokens, int top_k, int hidden, int c0) {
    constexpr int V = BN / 4;
    for (int idx = threadIdx.x; idx < tokens * V; idx += blockDim.x) {
        const int t = idx / V, col = c0 + 4 * (idx % V);
        if (col >= hidden) continue;
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        for (int k0 = 0; k0 < top_k; k0 += 4) {  // 4 loads in flight (8 cost sm_80 instances spills)
            uint2 v[4];
#pragma unroll
            for (int k = 0; k < 4; ++k)
                if (k0 + k < top_k)
                    v[k] = __ldcg(reinterpret_cast<const uint2*>(y + (size_t)inv[t * top_k + k0 + k] * hidden + col));
#pragma unroll
            for (int k = 0; k < 4; ++k)
                if (k0 + k < top_k) {
                    const float2 a = unpack2<T>(v[k].x), b = unpack2<T>(v[k].y);
                    acc[0] = fmaf(1.f, a.x, acc[0]);
                    acc[1] = fmaf(1.f, a.y, acc[1]);
                    acc[2] = fmaf(1.f, b.x, acc[2]);
                    acc[3] = fmaf(1.f, b.y, acc[3]);
                }
        }
        *reinterpret_cast<uint2*>(out + (size_t)t * hidden + col) =
            make_uint2(mma::Convert<T>::pack(acc[0], acc[1]), mma::Convert<T>::pack(acc[2], acc[3]));
    }
}

// ffn_items: the up items, then the down items, of a fused FFN over `listed` group slots (shared by moe_ffn_skinny
// and moe_decode_skinny); sync as described above. The up items go by a fixed stride (CTA c takes c, c + grid, ...),
// the down items by ticket (the next unclaimed one, from a counter at sync[2 * SKINNY_MAX_GROUPS]): a CTA that got
// fewer up items takes more down items, where a fixed stride over both kinds (up items carry more weight bytes) left
// some SMs ~8 % more bytes than others (E64 top-8 T1), and the first down items a CTA takes are those of the first
// slots, whose up items went first (H100, E64 top-8: T1 -3 %, T4 -5 % against the fixed stride; tickets for the up
// items too were level at T1 and between the two at T4). Down items are handed out in increasing order, after every
// up item has its CTA, so the no-deadlock argument holds. offsets, row_weight and a_index may point to shared
// memory. With `out` (not null) the grid also runs the layer's combine: a down item's CTA counts it stored in its
// column block's counter (sync[SKINNY_COLS + nb], after a fence), and the CTA that stores a block's last item
// (one per listed slot) combines that block's columns of every token (combine_columns, `inv` mapping a token's
// k-th slot to its row: global or shared memory) and sets the counter back to zero. Saves the combine's launch
// and the grid boundary before it.
template <typename T, int BM, int MI1, int WN1, int KS1, int MI2, int WN2, int KS2, int U>
__device__ __forceinline__ void ffn_items(const T* __restrict__ x, const T* __restrict__ w_up, T* __restrict__ h,
                                          const T* __restrict__ w_down, T* __restrict__ y,
                                          const int* __restrict__ offsets, const float* __restrict__ row_weight,
                                          const int* __restrict__ a_index, int a_div, const int* __restrict__ groups,
                                          int listed, int n_up, int hidden, int inter, int* __restrict__ sync,
                                          float* __restrict__ partial, T* __restrict__ out, const int* inv,
                                          int tokens, int top_k) {
    constexpr int BN1 = 16 * MI1 * WN1, BN2 = 16 * MI2 * WN2;
    const int nb1 = (n_up + BN1 - 1) / BN1, nb2 = (hidden + BN2 - 1) / BN2;
    const int items1 = listed * nb1, items = items1 + listed * nb2;
#ifdef DECODE_TIMELINE
    unsigned long long n_up_items = 0, n_down_items = 0;
#endif
    for (int item = blockIdx.x; item < items1; item += gridDim.x) {
        const int slot = item / nb1;
        skinny_item<T, T, BM, MI1, WN1, KS1, U, EPI_SWIGLU, false>(x, w_up, h, offsets, nullptr, groups[slot],
                                                                  item % nb1, n_up, hidden, a_index, a_div, partial);
#ifdef DECODE_TIMELINE
        ++n_up_items;
#endif
        if (threadIdx.x == 0) {  // h's columns of this item are stored (the item ended with __syncthreads)
            __threadfence();
            atomicAdd(sync + slot, 1);
        }
    }
    // the down items by ticket: a CTA asks for its next one when an item starts and reads it after the item's
    // closing barrier (two slots: the one written next turn was read before this turn's barriers)
    int* ticket = sync + 2 * SKINNY_MAX_GROUPS;  // [0] down items handed out, [1] CTAs done
    __shared__ int s_next[2], s_combine;  // s_combine: the column block this CTA combines next (-1: none)
    DECODE_STAMP(5, DECODE_NOW());
    if (threadIdx.x == 0) s_next[0] = items1 + atomicAdd(ticket, 1);
    if (threadIdx.x == 32) s_combine = -1;
    __syncthreads();
    int turn = 0;
    for (int item = s_next[0]; item < items; turn ^= 1) {
        if (threadIdx.x == 0) s_next[turn ^ 1] = items1 + atomicAdd(ticket, 1);
        const int j = item - items1, slot = j / nb2, nb = j % nb2;
        if (threadIdx.x == 0) wait_count(sync + slot, nb1);
#ifdef DECODE_TIMELINE
        if (n_down_items++ == 0) DECODE_STAMP(6, DECODE_NOW());
#endif
        __syncthreads();
        if (out != nullptr && s_combine >= 0)  // the block the last item completed (its count was read meanwhile)
            combine_columns<T, BN2>(y, out, inv, tokens, top_k, hidden, s_combine * BN2);
        skinny_item<T, T, BM, MI2, WN2, KS2, U, EPI_NONE, true>(h, w_down, y, offsets, row_weight, groups[slot], nb,
                                                               hidden, inter, nullptr, 1, partial);
        if (threadIdx.x == 0 && atomicAdd(sync + SKINNY_MAX_GROUPS + slot, 1) == nb2 - 1) {
            sync[slot] = 0;  // every down item of the slot is past its wait: both counters back to zero
            sync[SKINNY_MAX_GROUPS + slot] = 0;
        }
        // y's columns of this item are stored (the item ended with __syncthreads): counted by a thread of the
        // second warp, whose fence and atomic overlap thread 0's ticket and wait; read after the next barrier
        if (out != nullptr && threadIdx.x == 32) {
            __threadfence();
            const bool last = atomicAdd(sync + SKINNY_COLS + nb, 1) == listed - 1;
            if (last) {  // every listed slot's item of column block nb is stored: this CTA combines it
                __threadfence();
                sync[SKINNY_COLS + nb] = 0;
            }
            s_combine = last ? nb : -1;
        }
        item = s_next[turn ^ 1];
    }
    DECODE_STAMP(7, DECODE_NOW());
    if (out != nullptr) {
        __syncthreads();
        if (s_combine >= 0) combine_columns<T, BN2>(y, out, inv, tokens, top_k, hidden, s_combine * BN2);
    }
#ifdef DECODE_TIMELINE
    DECODE_STAMP(10, n_up_items);
    DECODE_STAMP(11, n_down_items);
#endif
    // the last CTA out sets the ticket and its own count back to zero (every CTA has taken its last ticket), and
    // moe_decode_skinny's router barrier count (every CTA passed its wait before its first item)
    if (threadIdx.x == 0 && atomicAdd(ticket + 1, 1) == gridDim.x - 1) ticket[0] = ticket[1] = ticket[2] = 0;
    DECODE_STAMP(8, DECODE_NOW());
}

template <typename T, int BM, int MI1, int WN1, int KS1, int MI2, int WN2, int KS2, int U>
__global__ void __launch_bounds__(256)
moe_ffn_skinny(const T* __restrict__ x, const T* __restrict__ w_up, T* __restrict__ h, const T* __restrict__ w_down,
               T* __restrict__ y, const int* __restrict__ offsets, const float* __restrict__ row_weight,
               int experts, int n_up, int hidden, int inter, const int* __restrict__ a_index, int a_div,
               const int* __restrict__ early_counts, int early, int* __restrict__ sync, T* __restrict__ out,
               const int* __restrict__ inverse, int tokens) {
    static_assert(WN1 * KS1 == 8 && WN2 * KS2 == 8, "8 warps in both phases");
    constexpr int BN1 = 16 * MI1 * WN1, BN2 = 16 * MI2 * WN2;
    constexpr int P1 = KS1 * BM * (BN1 + 4), P2 = KS2 * BM * (BN2 + 4), PMAX = P1 > P2 ? P1 : P2;
    extern __shared__ float partial[];  // the larger phase's [KS][BM][BN + 4], then the groups and their count
    int* groups = reinterpret_cast<int*>(partial + PMAX);

    if (early == 0) pdl::enter();
    const int listed = skinny_list_groups(early > 0 ? early_counts : nullptr, offsets, experts, groups,
                                          groups + SKINNY_MAX_GROUPS);
    if (early > 0) {
        const int nb1 = (n_up + BN1 - 1) / BN1;
        skinny_prefetch<T, BN1>(w_up, groups, listed * nb1, nb1, n_up, hidden, early);
        pdl::enter();
    }
    ffn_items<T, BM, MI1, WN1, KS1, MI2, WN2, KS2, U>(x, w_up, h, w_down, y, offsets, row_weight, a_index, a_div,
                                                      groups, listed, n_up, hidden, inter, sync, partial, out, inverse,
                                                      tokens, a_div);
}

// ---------------------------------------------------------------- a decode-sized MoE layer in one launch
//
// moe_decode_skinny: the router GEMM, the routing and both expert GEMMs of a layer whose tokens route to fewer
// rows than there are experts, as one persistent grid (all CTAs resident: the grid is what fits at once).
//   1. The CTAs stride over the nbr skinny items of the router logits (fp32 [tokens, experts], the router
//      GemmCall's tile, so the logits are its bits; each item's weight rows asked of L2 whole at the start), each
//      counted in sync[2 * SKINNY_MAX_GROUPS + 2] when stored.
//   2. Every CTA waits for that count (an acquire load), reads the logits through L2 and routes every token the
//      way moe_route does (select_top_k, softmax over the chosen k): one warp per token. From the choices it
//      builds, in shared memory, what the permutation would write (a stable counting sort: the row offsets per
//      expert, the sorted slots, each row's routing weight; up to 32 slots, the same by warp 0 in registers:
//      shuffles and a match instead of counts, scans and barriers); CTA 0 also writes inverse (slot -> row) for
//      the combine. The count is set back to zero by the grid's last CTA out (ffn_items), not by an atomic
//      answered right after the wait. (H100, stop 57: E64 top-8 T1 -1.0 us held, seed 004 T1 / T4 -0.6 us.)
//   3. The FFN items (ffn_items, as moe_ffn_skinny) over the touched experts, their first weights asked of L2
//      first (skinny_prefetch).
// Replaces three launches (router GEMM, routing, permutation) and the round trips between them; the routing's
// statistics (counts, shares, losses), which the layer's forward does not return, are not written.
template <typename T, int EPL, int BMR, int MIR, int WNR, int KSR, int BM, int MI1, int WN1, int KS1, int MI2,
          int WN2, int KS2, int U>
__global__ void __launch_bounds__(256)
moe_decode_skinny(const T* __restrict__ x, const T* __restrict__ w_router, float* __restrict__ logits,
                  const T* __restrict__ w_up, T* __restrict__ h, const T* __restrict__ w_down, T* __restrict__ y,
                  int* __restrict__ inverse, int tokens, int experts, int top_k, int n_up, int hidden, int inter,
                  int early, int* __restrict__ sync, T* __restrict__ out) {
    static_assert(WNR * KSR == 8 && WN1 * KS1 == 8 && WN2 * KS2 == 8, "8 warps in every phase");
    constexpr int MAX_E = 32 * EPL;
    constexpr int BNR = 16 * MIR * WNR, BN1 = 16 * MI1 * WN1, BN2 = 16 * MI2 * WN2;
    constexpr int PR = KSR * BMR * (BNR + 4), P1 = KS1 * BM * (BN1 + 4), P2 = KS2 * BM * (BN2 + 4);
    constexpr int P12 = P1 > P2 ? P1 : P2, PMAX = PR > P12 ? PR : P12;
    // shared: partial sums [PMAX], the group list and its count, row offsets [experts + 1] (router: {0, tokens}),
    // per slot its expert and weight, per row its slot and weight, per slot its row; slots = tokens * top_k <
    // experts <= 512
    extern __shared__ float partial[];
    int* groups = reinterpret_cast<int*>(partial + PMAX);
    int* s_off = groups + SKINNY_MAX_GROUPS + 1;
    int* s_cnt = s_off + SKINNY_MAX_GROUPS + 1;
    int* s_exp = s_cnt + SKINNY_MAX_GROUPS;
    float* s_wt = reinterpret_cast<float*>(s_exp + SKINNY_MAX_GROUPS);
    int* s_slot = reinterpret_cast<int*>(s_wt + SKINNY_MAX_GROUPS);
    float* s_rw = reinterpret_cast<float*>(s_slot + SKINNY_MAX_GROUPS);
    int* s_inv = reinterpret_cast<int*>(s_rw + SKINNY_MAX_GROUPS);  // per slot its row (inverse, for the combine)
    int* barrier = sync + 2 * SKINNY_MAX_GROUPS + 2;  // router items done (ffn_items' ticket[2])
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int slots = tokens * top_k;

    DECODE_STAMP(0, DECODE_NOW());
    pdl::enter();  // x may be the previous kernel's output
    DECODE_STAMP(1, DECODE_NOW());
#ifdef DECODE_TIMELINE
    DECODE_STAMP(9, sm_id() + 1ull);
#endif
    const int nbr = (experts + BNR - 1) / BNR;
    // a router item's weight rows (contiguous; never written by a kernel) asked of L2 whole, so the loads of its
    // second round of chunks find them there
    if (tid == 0)
        for (int item = blockIdx.x; item < nbr; item += gridDim.x)
            tma::prefetch_l2(w_router + (size_t)item * BNR * hidden,
                             (unsigned)(min(BNR, experts - item * BNR) * hidden * (int)sizeof(T)));
    if (tid == 0) s_off[0] = 0, s_off[1] = tokens;
    __syncthreads();
    for (int item = blockIdx.x; item < nbr; item += gridDim.x) {
        skinny_item<T, float, BMR, MIR, WNR, KSR, U, EPI_NONE, false>(x, w_router, logits, s_off, nullptr, 0, item,
                                                                      experts, hidden, nullptr, 1, partial);
        if (tid == 0) {  // this item's logits are stored (the item ended with __syncthreads)
            __threadfence();
            atomicAdd(barrier, 1);
        }
    }
    DECODE_STAMP(2, DECODE_NOW());
    // few slots: warp 0 sorts them in registers (below), no counts
    const bool few = slots <= 32;
    if (tid == 0) {  // (the count is set back to zero by the grid's last CTA out: ffn_items)
        wait_count(barrier, nbr);
        DECODE_STAMP(3, DECODE_NOW());
    }
    if (!few)
        for (int e = tid; e < experts; e += blockDim.x) s_cnt[e] = 0;
    __syncthreads();
    DECODE_STAMP(12, DECODE_NOW());

    for (int t = warp; t < tokens; t += blockDim.x / 32) {  // moe_route's choice and weight (softmax, renormalised)
        float v[EPL];
#pragma unroll
        for (int j = 0; j < EPL; ++j) {
            const int e = lane + 32 * j;
            v[j] = e < experts ? __ldcg(logits + (size_t)t * experts + e) : __int_as_float(0xff800000);
        }
        unsigned taken;
        float xmax, sel_sum, my_v;
        int my_e;
        select_top_k<EPL, MAX_E>(v, experts, top_k, 0, lane, taken, xmax, sel_sum, my_e, my_v);
        if (lane < top_k) {
            s_exp[t * top_k + lane] = my_e;
            s_wt[t * top_k + lane] = expf(my_v - xmax) / sel_sum;
            if (!few) atomicAdd(s_cnt + my_e, 1);
        }
    }
    int listed;
    if (few) {  // the same rows, offsets and group list as the counting sort below, by warp 0 in registers
        if (tokens > 1) __syncthreads();  // (uniform) the other warps' tokens
        DECODE_STAMP(13, DECODE_NOW());
        if (warp == 0) {
            __syncwarp();
            const bool live = lane < slots;
            const int e = live ? s_exp[lane] : 0x7fffffff;
            const float wt = live ? s_wt[lane] : 0.f;
            int less = 0, rank = 0;  // slots of a lower expert; lower slots of this expert
            for (int u = 0; u < slots; ++u) {
                const int eu = __shfl_sync(0xffffffffu, e, u);
                less += eu < e;
                rank += u < lane && eu == e;
            }
            const bool first = live && rank == 0;  // the lowest slot of its expert
            const unsigned firsts = __ballot_sync(0xffffffffu, first);
            const int count = __popc(__match_any_sync(0xffffffffu, e) & __ballot_sync(0xffffffffu, live));
            int below = 0;  // listed experts lower than this one: its group's index
            for (int u = 0; u < slots; ++u) below += ((firsts >> u) & 1u) && __shfl_sync(0xffffffffu, e, u) < e;
            if (live) {
                const int r = less + rank;
                s_slot[r] = lane;
                s_rw[r] = wt;
                s_inv[lane] = r;
                if (blockIdx.x == 0) inverse[lane] = r;
            }
            if (first) {  // (the next expert's first slot, if listed, writes the same offset)
                groups[below] = e;
                s_off[e] = less;
                s_off[e + 1] = less + count;
            }
            if (lane == 0) groups[SKINNY_MAX_GROUPS] = __popc(firsts);
        }
        __syncthreads();
        listed = groups[SKINNY_MAX_GROUPS];
    } else {
        __syncthreads();
        DECODE_STAMP(13, DECODE_NOW());
        if (warp == 0) {  // exclusive scan of the counts: lane l holds experts [PER l, PER (l + 1))
            constexpr int PER = SKINNY_MAX_GROUPS / 32;
            int run = 0;
    #pragma unroll
            for (int j = 0; j < PER; ++j) run += lane * PER + j < experts ? s_cnt[lane * PER + j] : 0;
            int incl = run;
    #pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const int a = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += a;
            }
            int off = incl - run;
    #pragma unroll
            for (int j = 0; j < PER; ++j) {
                const int e = lane * PER + j;
                if (e <= experts) s_off[e] = off;
                off += e < experts ? s_cnt[e] : 0;
            }
            if (lane == 31 && experts == SKINNY_MAX_GROUPS) s_off[SKINNY_MAX_GROUPS] = off;
        }
        __syncthreads();
        DECODE_STAMP(14, DECODE_NOW());
        for (int s = tid; s < slots; s += blockDim.x) {  // stable: a slot's row follows the lower slots of its expert
            const int e = s_exp[s];
            int rank = 0;
            for (int u = 0; u < s; ++u) rank += s_exp[u] == e;
            const int r = s_off[e] + rank;
            s_slot[r] = s;
            s_rw[r] = s_wt[s];
            s_inv[s] = r;
            if (blockIdx.x == 0) inverse[s] = r;
        }
        DECODE_STAMP(15, DECODE_NOW());
        listed = skinny_list_groups(s_cnt, s_off, experts, groups, groups + SKINNY_MAX_GROUPS);
    }
    const int nb1 = (n_up + BN1 - 1) / BN1;
    DECODE_STAMP(4, DECODE_NOW());
    skinny_prefetch<T, BN1>(w_up, groups, listed * nb1, nb1, n_up, hidden, early);
    ffn_items<T, BM, MI1, WN1, KS1, MI2, WN2, KS2, U>(x, w_up, h, w_down, y, s_off, s_rw, s_slot, top_k, groups,
                                                      listed, n_up, hidden, inter, sync, partial, out, s_inv, tokens,
                                                      top_k);
}
