// Grouped expert GEMM: out[rows of group e] = epilogue(a[rows of group e] @ b[e]^T), fp32 accumulate.
//
// Layout. a [rows, K] row-major, rows in expert order: group e is rows [offsets[e], offsets[e+1]).
// b [experts, N, K] row-major (K contiguous, torch Linear's [out, in] per expert): both operands are K-major,
// which is mma.sync's row.col form, so both are loaded with plain (non-transposing) ldmatrix.
// out [rows, N_out] row-major, N_out = N / 2 for SwiGLU, else N.
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
// Rows past the group's end, columns past N and k past K are zero-filled by cp.async (src-size 0).
// WARPS_M x WARPS_N warps; each warp owns a (BM / WARPS_M) x (BN / WARPS_N) accumulator tile in registers and
// per 16-wide k step loads its A fragments (ldmatrix.x4, 16 x 16) and B fragments (ldmatrix.x4, two 8 x 16)
// and issues (WM / 16) x (WN / 8) mma.sync.m16n8k16.
//
// Epilogue. EPI 0: none; 1: SwiGLU, b's rows are interleaved gate/up (row 2j gate j, row 2j + 1 up j), so the
// thread holding accumulator columns (2j, 2j + 1) writes silu(gate) * up to output column j; 2: GELU (erf).
// row_scale (float32 per row, may be null) multiplies the result. Results are staged through shared memory
// (reusing the pipeline buffers) and written with 16-byte stores. TO = float (plain GEMM only, e.g. router logits):
// fp32 results go straight from registers, 8 bytes per lane, 32 contiguous bytes per 4-lane group.
#include "mma.cuh"

constexpr int EPI_NONE = 0, EPI_SWIGLU = 1, EPI_GELU = 2;
constexpr int GROUP_M = 8;

template <int EPI> __device__ __forceinline__ float activate(float x) {
    if constexpr (EPI == EPI_GELU) return 0.5f * x * (1.f + erff(x * 0.70710678118654752f));
    else return x;
}

// Which (expert, m-tile, n-tile) CTA `tile` owns. The tiles are numbered expert by expert (ceil(count_e / BM) *
// n_tiles for expert e); warp 0 scans 32 experts per step (shuffle prefix sum of the tile counts and a ballot).
// Inside an expert, GROUP_M m-tiles share a column sweep so that CTAs resident together reuse rows through L2.
// Returns false for CTAs past the last tile (the grid is an upper bound). All threads must call it.
template <int BM>
__device__ __forceinline__ bool find_work_item(int tile, const int* __restrict__ offsets, int experts, int n_tiles,
                                               int* s_work, int& e, int& m_tile, int& n_tile) {
    const int lane = threadIdx.x & 31;
    if (threadIdx.x < 32) {
        if (lane == 0) s_work[0] = -1;
        __syncwarp();
        int base = 0;
        for (int e0 = 0; e0 < experts; e0 += 32) {
            const int ex = e0 + lane;
            const int count = ex < experts ? offsets[ex + 1] - offsets[ex] : 0;
            const int m_tiles = (count + BM - 1) / BM;
            const int t = m_tiles * n_tiles;
            int incl = t;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const int v = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += v;
            }
            const int start = base + incl - t;
            const bool mine = t > 0 && tile >= start && tile < start + t;
            if (mine) s_work[0] = ex, s_work[1] = tile - start, s_work[2] = m_tiles;
            if (__any_sync(0xffffffffu, mine)) break;
            base += __shfl_sync(0xffffffffu, incl, 31);
        }
    }
    __syncthreads();
    e = s_work[0];
    if (e < 0) return false;
    const int local = s_work[1], m_tiles = s_work[2];
    const int per_group = GROUP_M * n_tiles;
    const int first_m = local / per_group * GROUP_M;
    const int group_m = min(m_tiles - first_m, GROUP_M);
    m_tile = first_m + (local % per_group) % group_m;
    n_tile = (local % per_group) / group_m;
    return true;
}

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
        // fp32 output (no activation): each 4-lane group writes 32 contiguous bytes of a row, full sectors
        static_assert(EPI == EPI_NONE, "fp32 output is for the plain GEMM");
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
                    if (col < N)
                        *reinterpret_cast<float2*>(out + (size_t)(row0 + r) * N + col) =
                            make_float2(acc[i][j][2 * h] * scale, acc[i][j][2 * h + 1] * scale);
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
                    const float silu = v0 / (1.f + __expf(-v0));
                    c_tile[r * C_STRIDE + col / 2] = mma::Convert<T>::from(silu * v1 * scale);
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
    constexpr int CH = BK / 8;  // 16-byte chunks per tile row
    constexpr int A_BYTES = BM * BK * 2, STAGE_BYTES = (BM + BN) * BK * 2;
    constexpr int RSTEP = THREADS / CH;  // tile rows covered by one pass of all threads
    constexpr int A_ITERS = BM / RSTEP, B_ITERS = BN / RSTEP;
    static_assert(WM % 16 == 0 && WN % 16 == 0, "warp tile must be a multiple of 16 x 16");
    static_assert(BM % RSTEP == 0 && BN % RSTEP == 0, "tile rows must be a multiple of the rows per pass");
    constexpr int BN_OUT = EPI == EPI_SWIGLU ? BN / 2 : BN;
    constexpr int C_STRIDE = BN_OUT + 8;  // elements; +16 bytes per row spreads the fragment stores over banks
    static_assert(BM * C_STRIDE * 2 <= STAGES * STAGE_BYTES, "epilogue staging must fit in the pipeline buffers");

    // all shared memory is dynamic (the default 48 KiB limit counts static bytes too): the pipeline, then the
    // work item (expert, tile index inside the expert, m-tiles of the expert)
    extern __shared__ __align__(128) unsigned char smem[];
    int* s_work = reinterpret_cast<int*>(smem + STAGES * STAGE_BYTES);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int n_tiles = (N + BN - 1) / BN;

    int e, m_tile, n_tile;
    if (!find_work_item<BM>(blockIdx.x, offsets, experts, n_tiles, s_work, e, m_tile, n_tile)) return;
    const int row0 = offsets[e] + m_tile * BM;
    const int rows_here = min(BM, offsets[e + 1] - row0);
    const int n0 = n_tile * BN;
    const int k_tiles = (K + BK - 1) / BK;

    // ---- this thread's cp.async sources: chunk c of rows r0, r0 + RSTEP, ...
    const int c = tid % CH, r0 = tid / CH;
    const T* a_src = a + (size_t)(row0 + r0) * K + c * 8;
    const T* b_src = b + ((size_t)e * N + n0 + r0) * K + c * 8;
    const size_t step = (size_t)RSTEP * K;
    const unsigned smem0 = mma::smem_addr(smem);

    auto load_stage = [&](int slot, int kt) {
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
    };

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

template <typename T>
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], unsigned long long desc_a, unsigned long long desc_b);

template <> __device__ __forceinline__ void wgmma_m64n256k16<__half>(float (&d)[128], unsigned long long desc_a,
                                                                    unsigned long long desc_b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
        "%128, %129, 1, 1, 1, 0, 0;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
          "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
          "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
          "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
          "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
          "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
          "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "l"(desc_a), "l"(desc_b));
}

template <> __device__ __forceinline__ void wgmma_m64n256k16<__nv_bfloat16>(float (&d)[128], unsigned long long desc_a,
                                                                    unsigned long long desc_b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
        "%128, %129, 1, 1, 1, 0, 0;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
          "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
          "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
          "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
          "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
          "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
          "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "l"(desc_a), "l"(desc_b));
}

__device__ __forceinline__ unsigned long long wgmma_desc(unsigned smem_byte_addr) {
    // K-major, 128-byte swizzle: start >> 4 in bits 0-13, leading offset 1 (unused with this swizzle) in 16-29,
    // stride between 8-row atoms 1024 B >> 4 in 32-45, layout type 1 (SWIZZLE_128B) in bits 62-63
    return (unsigned long long)((smem_byte_addr & 0x3FFFF) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

template <typename T, typename TO, int BM, int STAGES, int EPI>
__global__ void __launch_bounds__(BM * 2, 1)
moe_grouped_gemm_wgmma(const T* __restrict__ a, const T* __restrict__ b, TO* __restrict__ out,
                       const int* __restrict__ offsets, const float* __restrict__ row_scale, int experts, int N, int K) {
    constexpr int BN = 256, BK = 64;
    constexpr int THREADS = BM * 2;  // one warpgroup (128 threads) per 64 rows
    constexpr int CH = BK / 8;
    constexpr int A_BYTES = BM * BK * 2, STAGE_BYTES = (BM + BN) * BK * 2;
    constexpr int RSTEP = THREADS / CH;
    constexpr int A_ITERS = BM / RSTEP, B_ITERS = BN / RSTEP;
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
    int e, m_tile, n_tile;
    if (!find_work_item<BM>(blockIdx.x, offsets, experts, n_tiles, s_work, e, m_tile, n_tile)) return;
    const int row0 = offsets[e] + m_tile * BM;
    const int rows_here = min(BM, offsets[e + 1] - row0);
    const int n0 = n_tile * BN;
    const int k_tiles = (K + BK - 1) / BK;

    const int c = tid % CH, r0 = tid / CH;
    const T* a_src = a + (size_t)(row0 + r0) * K + c * 8;
    const T* b_src = b + ((size_t)e * N + n0 + r0) * K + c * 8;
    const size_t step = (size_t)RSTEP * K;
    const unsigned smem0 = mma::smem_addr(smem);

    auto load_stage = [&](int slot, int kt) {
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
    };

    float acc[1][32][4];
    float(&d)[128] = reinterpret_cast<float(&)[128]>(acc);
#pragma unroll
    for (int i = 0; i < 128; ++i) d[i] = 0.f;

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < k_tiles) load_stage(s, s);
        mma::cp_async_commit();
    }

    const int wg = warp / 4;
    for (int kt = 0; kt < k_tiles; ++kt) {
        mma::cp_async_wait<STAGES - 2>();
        fence_proxy_async();  // cp.async wrote through the generic proxy; wgmma reads through the async proxy
        __syncthreads();
        const unsigned sa = smem0 + (kt % STAGES) * STAGE_BYTES + wg * 64 * BK * 2, sb = smem0 + (kt % STAGES) * STAGE_BYTES + A_BYTES;
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < BK / 16; ++ks) wgmma_m64n256k16<T>(d, wgmma_desc(sa + ks * 32), wgmma_desc(sb + ks * 32));
        wgmma_commit();
        wgmma_wait<1>();  // tile kt - 1 is done: its stage may be refilled
        __syncthreads();
        const int next = kt + STAGES - 1;
        if (next < k_tiles) load_stage(next % STAGES, next);
        mma::cp_async_commit();
    }
    wgmma_wait<0>();
    mma::cp_async_wait<0>();
    __syncthreads();  // the pipeline buffers become the output staging tile

    store_tile<T, TO, BM, BN, 16, BN, 1, 32, EPI, THREADS>(acc, smem, out, row_scale, row0, rows_here, n_tile, N,
                                                           warp, 0);
}
