// Flash attention forward on Hopper warpgroup MMA (sm_90a only): the FlashAttention-2 algorithm of
// flash_fwd.cu with both matrix products on wgmma, which reads its operands from shared memory in the tensor
// cores' own pipeline instead of through ldmatrix and per-warp mma.sync.
//
// Layout and arguments: as flash_fwd (q/k/v [batch, seq, heads, HEAD_DIM] with strided first dimensions, o
// contiguous, lse float32 [batch, heads, seq_q], kv head = head / kv_group, the same MASK bits and tile-range
// logic, MASK_VARLEN included).
//
// Grid: (ceil(seq_q / BLOCK_M), heads, batch), query tiles in reverse order. Block: WGS warpgroups of 128
// threads; warpgroup w owns query rows [64 w, 64 w + 64) of the BLOCK_M = 64 WGS tile.
//
// Shared memory (1024-byte aligned): Q (BLOCK_M x HEAD_DIM), then STAGES x K and STAGES x V tiles (BLOCK_N x
// HEAD_DIM), each stored as HEAD_DIM / 64 blocks of 128-byte rows with the 128-byte swizzle (wgmma.cuh), filled
// by cp.async (rows past the end zero-filled).
//
// Per KV tile and warpgroup:
//   S = Q K^T   wgmma m64n{BLOCK_N}k16, both operands K-major in shared memory (HEAD_DIM / 16 steps);
//   online softmax on the S accumulators in registers (exp2 with the scale folded in log2 space), exactly as
//   flash_fwd: the accumulator layout per warp is the m16n8 C layout, rows g and g + 8 of the warp's 16;
//   O += P V    wgmma m64n{HEAD_DIM}k16 with P from registers (the S accumulators of columns 16 j .. 16 j + 15,
//   rounded to T, are the A fragment of k-step j) and V in shared memory MN-major (rows = keys = the k
//   dimension, 64-element blocks = head_dim).
// The next K/V tiles stream in (cp.async, STAGES deep) while the tensor cores work on this one.
#include "sm90_common.cuh"

using namespace attn;

template <typename T, int HEAD_DIM, int BLOCK_N, int WGS, int STAGES, int MASK>
__global__ void __launch_bounds__(WGS * 128, 1)
flash_fwd_wgmma(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ o,
                float* __restrict__ lse, const int* __restrict__ q_ids, const int* __restrict__ kv_ids,
                const int2* __restrict__ q_tile_ids, const int2* __restrict__ kv_tile_ids, long long q_sb,
                long long q_ss, long long q_sh, long long k_sb, long long k_ss, long long k_sh, long long v_sb,
                long long v_ss, long long v_sh, int seq_q, int seq_kv, int heads, int kv_group, int window_left,
                int window_right, float scale_log2, int batch) {
    constexpr int BLOCK_M = 64 * WGS;
    constexpr int THREADS = 128 * WGS;
    constexpr int CHUNKS = HEAD_DIM / 8;  // 16-byte chunks per row
    constexpr int NT = BLOCK_N / 8;       // 8-column tiles of S
    constexpr int DT = HEAD_DIM / 8;      // 8-column tiles of O
    constexpr bool WINDOW = (MASK & 1) != 0;
    constexpr bool SEGMENTS = (MASK & 2) != 0;
    constexpr bool VARLEN = (MASK & MASK_VARLEN) != 0;
    constexpr int Q_BYTES = BLOCK_M * HEAD_DIM * 2, KV_BYTES = BLOCK_N * HEAD_DIM * 2;
    static_assert(HEAD_DIM % 64 == 0 && (BLOCK_N == 64 || BLOCK_N == 128 || BLOCK_N == 256), "wgmma shapes");
    static_assert(HEAD_DIM <= 256, "O accumulates in one m64n{HEAD_DIM} wgmma");
    static_assert((BLOCK_N * CHUNKS) % THREADS == 0 && (BLOCK_M * CHUNKS) % THREADS == 0, "copy split");

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const unsigned raw0 = smem_addr(smem_raw);
    unsigned char* smem = smem_raw + (((raw0 + 1023) & ~1023u) - raw0);  // smem_bytes() reserves the slack
    const unsigned sQ = smem_addr(smem), sK = sQ + Q_BYTES, sV = sK + STAGES * KV_BYTES;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wg = wgmma::warpgroup();  // warp-uniform to the compiler: Q's descriptors in uniform registers
    const int g = lane >> 2, t = lane & 3;
    int m_block = gridDim.x - 1 - blockIdx.x;
    int b = blockIdx.z;
    const int head = blockIdx.y;
    float* lse_row = lse + ((long long)b * heads + head) * seq_q;
    if constexpr (VARLEN)  // grid.x: every sequence's query tiles; q_ids / kv_ids carry the cu_seqlens
        if (!varlen_enter_query_tile<BLOCK_M, HEAD_DIM>(q_ids, kv_ids, batch, heads, head, b, m_block, seq_q, seq_kv,
                                                         q, k, v, o, lse_row, lse, q_ss, k_ss, v_ss))
            return;
    const int m0 = m_block * BLOCK_M;
    const int m_last = min(m0 + BLOCK_M, seq_q) - 1;
    const int shift = seq_kv - seq_q;

    const T* qb = q + b * q_sb + head * q_sh;
    const T* kb = k + b * k_sb + (head / kv_group) * k_sh;
    const T* vb = v + b * v_sb + (head / kv_group) * v_sh;

    // ---- the KV tiles this query tile can see
    const KvTileRange<BLOCK_N, WINDOW, SEGMENTS> tiles(m0, m_last, seq_q, seq_kv, window_left, window_right, q_tile_ids,
                                                       kv_tile_ids, b, m_block, gridDim.x);

    // ---- copies into the blocked, swizzled layout; rows past the end zero-filled
    auto load_kv = [&](int nb, int stage) {
        load_rows_blocked<BLOCK_N, HEAD_DIM, THREADS>(sK + stage * KV_BYTES, kb, k_ss, nb * BLOCK_N, seq_kv);
        load_rows_blocked<BLOCK_N, HEAD_DIM, THREADS>(sV + stage * KV_BYTES, vb, v_ss, nb * BLOCK_N, seq_kv);
    };

    load_rows_blocked<BLOCK_M, HEAD_DIM, THREADS>(sQ, qb, q_ss, m0, seq_q);

    // ---- softmax state for rows g and g + 8 of this warp's 16 (CTA rows 16 warp + g (+ 8))
    const int warp_row = warp * 16;
    float o_acc[DT][4];
    float(&o_flat)[DT * 4] = reinterpret_cast<float(&)[DT * 4]>(o_acc);  // the wgmma operand view
    float row_max[2], row_sum[2];
    int qid[2];
    init_rows<DT, SEGMENTS>(o_acc, row_max, row_sum, qid, m0 + warp_row + g, seq_q, q_ids + (long long)b * seq_q);
    const unsigned q_wg = sQ + wg * 64 * 128;  // this warpgroup's 64 rows inside each 64-column block of Q

    auto tile_step = [&](int nb, int stage, auto masked_c) {
        constexpr bool MASKED = decltype(masked_c)::value;
        const unsigned k_st = sK + stage * KV_BYTES, v_st = sV + stage * KV_BYTES;

        float s[NT][4];
        float(&s_flat)[NT * 4] = reinterpret_cast<float(&)[NT * 4]>(s);
        issue_qk<T, HEAD_DIM, BLOCK_M, BLOCK_N>(s_flat, q_wg, k_st);
        wgmma::wait<0>();

        if constexpr (MASKED)
            mask_scores<NT, WINDOW, SEGMENTS>(s, nb * BLOCK_N, m0 + warp_row + g + shift, seq_kv, window_left,
                                              window_right, kv_ids + (long long)b * seq_kv, qid, t);
        online_softmax<NT, DT, MASKED>(s, o_acc, row_max, row_sum, scale_log2);

        const unsigned v_lo = wgmma::desc_lo_mn_major(v_st, BLOCK_N * 128);
        wgmma::fence();
#pragma unroll
        for (int kj = 0; kj < BLOCK_N / 16; ++kj) {
            const unsigned a[4] = {pack2<T>(s[2 * kj][0], s[2 * kj][1]), pack2<T>(s[2 * kj][2], s[2 * kj][3]),
                                   pack2<T>(s[2 * kj + 1][0], s[2 * kj + 1][1]),
                                   pack2<T>(s[2 * kj + 1][2], s[2 * kj + 1][3])};
            wgmma::mma_rs_bt<T, HEAD_DIM>(o_flat, a, wgmma::desc_of(v_lo + kj * 128));  // 16 rows of 128 B
        }
        wgmma::commit();
        wgmma::wait<0>();
    };

    run_ring<STAGES>(
        tiles.next_visible(tiles.nb_min), tiles.nb_max, [&](int nb) { return tiles.next_visible(nb + 1); },
        [&](int nb) { return tiles.needs_mask(nb); }, load_kv, tile_step);  // Q travels in the first group
    __syncthreads();  // all copies landed and all wgmma reads of Q are done: Q's space takes O

    // ---- epilogue: O / l staged row-major (swizzled, common.cuh) in Q's space, then 16-byte stores; LSE
    T* sO = reinterpret_cast<T*>(smem);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float inv;
        const float row_lse = finish_row(row_sum[h], row_max[h], scale_log2, inv);
        const int r = warp_row + g + 8 * h;
#pragma unroll
        for (int dt = 0; dt < DT; ++dt)
            *reinterpret_cast<unsigned*>(sO + swizzled<HEAD_DIM>(r, dt) + 2 * t) =
                pack2<T>(o_acc[dt][2 * h] * inv, o_acc[dt][2 * h + 1] * inv);
        if (t == 0 && m0 + r < seq_q)
            lse_row[m0 + r] = row_lse;
    }
    __syncwarp();
#pragma unroll
    for (int it = 0; it < 16 * CHUNKS / 32; ++it) {
        const int i = it * 32 + lane;
        const int r = i / CHUNKS, ch = i % CHUNKS;
        const int grow = m0 + warp_row + r;
        if (grow < seq_q) {
            T* dst = o + (((long long)b * seq_q + grow) * heads + head) * HEAD_DIM + ch * 8;
            *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(sO + swizzled<HEAD_DIM>(warp_row + r, ch));
        }
    }
}
