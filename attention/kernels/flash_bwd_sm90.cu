// Flash attention backward dK/dV (+ dQ) kernel on Hopper warpgroup MMA (sm_90a only). The scheme of
// flash_bwd.cu's flash_bwd_dkdv (FlashAttention-2: one CTA per KV tile walking the query tiles that see it,
// dK/dV in registers, dQ by fp32 atomics) with every product on wgmma. The preprocess, dQ conversion and the
// deterministic dQ kernel stay in flash_bwd.cu; layouts and arguments are those of flash_bwd_dkdv.
//
// Grid: (ceil(seq_kv / BLOCK_N), kv_heads, batch). Block: WGS warpgroups; warpgroup w owns kv rows
// [64 w, 64 w + 64) of the BLOCK_N = 64 WGS tile, so every per-row quantity stays inside one warpgroup.
//
// Shared memory (1024-byte aligned, each tile stored as 64-element blocks of 128-byte rows with the 128-byte
// swizzle of wgmma.cuh): K, V (BLOCK_N x HEAD_DIM), STAGES x Q and dO (BLOCK_M x HEAD_DIM) and lse2, D
// (BLOCK_M floats) streamed by cp.async, and with DQ the dS^T tile (BLOCK_N x BLOCK_M).
//
// Per (q head, query tile), warpgroup w, S^T and dP^T are [64 kv rows x BLOCK_M queries]:
//   S^T  = K_w Q^T     wgmma m64n{BLOCK_M}, K and Q both K-major (head_dim contiguous) in shared memory;
//   dP^T = V_w dO^T    the same with V and dO;
//   P^T  = 2^(S^T scale log2e - lse2[query]), dS^T = P^T (dP^T - D[query]) in registers (per-column lse2 and D
//          read from shared memory);
//   dV  += P^T dO      wgmma m64n{HEAD_DIM}, A = P^T from registers (the accumulator of columns 16 j .. 16 j + 15
//                      is the A fragment of k-step j, as the forward's P), B = dO MN-major (rows = queries);
//   dK  += dS^T Q      the same with dS^T and Q;
//   DQ: dS^T (rounded to T) goes to shared memory; after a block barrier each warpgroup computes a 64 x DQ_N
//       slice of dQ_tile = dS K (wgmma with both operands MN-major: A = dS^T [kv][query], B = K [kv][head_dim])
//       and adds it into the fp32 accumulator with vector reductions (red.global.add.v2.f32).
// dK (times the softmax scale) and dV, summed over the GQA group already, are written once at the end.
#include "bwd_sm90.cuh"

using namespace attn;

// The Q / dO / lse2 / D ring of a dK/dV CTA: operator()(it, stage) loads step `it` (its q head of the group and
// query tile, from `tiles`) into ring stage `stage`: Q and dO rows [m0, m0 + BLOCK_M) blocked and swizzled (rows
// past seq_q zero-filled) and the BLOCK_M lse2 / D values (padded arrays: always in bounds).
template <int BLOCK_M, int HEAD_DIM, int THREADS, typename T, typename Tiles>
struct QStepLoader {
    const Tiles& tiles;
    unsigned sQ, sdO;      // stage 0 of each ring
    float *sL, *sD;
    const T *q0, *do0;     // the group's first q head of this batch element
    const float *l0, *d0;  // its lse2 / D rows
    long long q_sh, q_ss, do_sh, do_ss;
    int seq_q, seq_pad;

    __device__ __forceinline__ void operator()(int it, int stage) const {
        constexpr int Q_BYTES = BLOCK_M * HEAD_DIM * 2;
        const int hg = tiles.head_in_group(it);
        const int m0 = tiles.m_block(it) * BLOCK_M;
        load_rows_blocked<BLOCK_M, HEAD_DIM, THREADS>(sQ + stage * Q_BYTES, q0 + hg * q_sh, q_ss, m0, seq_q);
        load_rows_blocked<BLOCK_M, HEAD_DIM, THREADS>(sdO + stage * Q_BYTES, do0 + hg * do_sh, do_ss, m0, seq_q);
        const long long row = (long long)hg * seq_pad + m0;
        for (int i = threadIdx.x; i < 2 * (BLOCK_M / 4); i += THREADS) {
            const int which = i / (BLOCK_M / 4), c = i % (BLOCK_M / 4);
            cp_async16(smem_addr((which ? sD : sL) + stage * BLOCK_M + 4 * c), (which ? d0 : l0) + row + 4 * c, true);
        }
    }
};

template <typename T, int HEAD_DIM, int BLOCK_M, int WGS, int STAGES, int MASK, bool DQ>
__global__ void __launch_bounds__(WGS * 128, 1)
flash_bwd_dkdv_wgmma(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                     const T* __restrict__ dout, const float* __restrict__ lse2, const float* __restrict__ dsum,
                     float* __restrict__ dq_accum, T* __restrict__ dk, T* __restrict__ dv,
                     const int* __restrict__ q_ids, const int* __restrict__ kv_ids,
                     const int2* __restrict__ q_tile_ids, const int2* __restrict__ kv_tile_ids, long long q_sb,
                     long long q_ss, long long q_sh, long long k_sb, long long k_ss, long long k_sh, long long v_sb,
                     long long v_ss, long long v_sh, long long do_sb, long long do_ss, long long do_sh, int seq_q,
                     int seq_kv, int seq_pad, int heads, int kv_group, int window_left, int window_right,
                     float scale_log2, float scale, int batch) {
    constexpr int BLOCK_N = 64 * WGS;
    constexpr int THREADS = 128 * WGS;
    constexpr int MT = BLOCK_M / 8;   // 8-column (query) tiles of S^T
    constexpr int DT = HEAD_DIM / 8;  // 8-column tiles of dK / dV
    constexpr int DQ_ROW_BLOCKS = BLOCK_M / 64;             // 64-query row blocks of the dQ tile ...
    constexpr int DQ_N = HEAD_DIM * DQ_ROW_BLOCKS / WGS;    // ... and the head-dim slice each warpgroup takes
    constexpr bool WINDOW = (MASK & BWD_MASK_WINDOW) != 0;
    constexpr bool SEGMENTS = (MASK & BWD_MASK_SEGMENTS) != 0;
    constexpr bool VARLEN = (MASK & MASK_VARLEN) != 0;
    constexpr int KV_BYTES = BLOCK_N * HEAD_DIM * 2, Q_BYTES = BLOCK_M * HEAD_DIM * 2;
    static_assert(HEAD_DIM == 64 || HEAD_DIM == 128, "dK and dV accumulate in registers: head_dim 64 or 128");
    static_assert(BLOCK_M == 64 || BLOCK_M == 128, "query tiles of 64 or 128 rows (a wgmma N)");
    static_assert(WGS % DQ_ROW_BLOCKS == 0 && (DQ_N == 64 || DQ_N == 128), "dQ split over the warpgroups");

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const unsigned raw0 = smem_addr(smem_raw);
    unsigned char* smem = smem_raw + (((raw0 + 1023) & ~1023u) - raw0);  // smem_bytes() reserves the slack
    const unsigned sK = smem_addr(smem), sV = sK + KV_BYTES, sQ = sV + KV_BYTES, sdO = sQ + STAGES * Q_BYTES;
    const unsigned sdS = sdO + STAGES * Q_BYTES;
    float* sL = reinterpret_cast<float*>(smem + 2 * KV_BYTES + 2 * STAGES * Q_BYTES + (DQ ? BLOCK_N * BLOCK_M * 2 : 0));
    float* sD = sL + STAGES * BLOCK_M;

    // (wgmma::warpgroup() for wg: 28-216 B spilled at 255 registers with segment masks, docs/perf/attention.md v3.8)
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
    const int g = lane >> 2, t = lane & 3;
    int b = blockIdx.z;
    int nb, kvh;
    kv_block_coords(nb, kvh);
    const int kv_heads = gridDim.y;
    if constexpr (VARLEN) {  // grid.x: every sequence's KV tiles; q_ids / kv_ids carry the cu_seqlens
        int tile;
        if (!varlen_tile<BLOCK_N>(kv_ids, batch, seq_kv, nb, b, tile)) return;
        const VarlenSeq sq = varlen_seq(q_ids, b, seq_q), sk = varlen_seq(kv_ids, b, seq_kv);
        nb = tile;
        seq_q = sq.len;
        seq_kv = sk.len;
        q += (long long)sq.start * q_ss;
        dout += (long long)sq.start * do_ss;
        k += (long long)sk.start * k_ss;
        v += (long long)sk.start * v_ss;
        if constexpr (DQ) dq_accum += (long long)sq.start * heads * HEAD_DIM;
        dk += (long long)sk.start * kv_heads * HEAD_DIM;
        dv += (long long)sk.start * kv_heads * HEAD_DIM;
        lse2 += varlen_pad_start(sq.start, b);  // seq_pad: the padded total, the head stride
        dsum += varlen_pad_start(sq.start, b);
        b = 0;
    }
    const int n0 = nb * BLOCK_N;
    const int shift = seq_kv - seq_q;

    const QTileRange<BLOCK_M, BLOCK_N, WINDOW, SEGMENTS> tiles(n0, seq_q, seq_kv, window_left, window_right, q_tile_ids,
                                                               kv_tile_ids, b, nb, gridDim.x, kv_group);

    // ---- K, V once; Q, dO, lse2, D per (head, query tile) through the ring
    load_rows_blocked<BLOCK_N, HEAD_DIM, THREADS>(sK, k + b * k_sb + kvh * k_sh, k_ss, n0, seq_kv);
    load_rows_blocked<BLOCK_N, HEAD_DIM, THREADS>(sV, v + b * v_sb + kvh * v_sh, v_ss, n0, seq_kv);
    const int h0 = kvh * kv_group;  // the group's first q head
    const QStepLoader<BLOCK_M, HEAD_DIM, THREADS, T, decltype(tiles)> load_q{
        tiles, sQ, sdO, sL, sD, q + b * q_sb + h0 * q_sh, dout + b * do_sb + h0 * do_sh,
        lse2 + ((long long)b * heads + h0) * seq_pad, dsum + ((long long)b * heads + h0) * seq_pad,
        q_sh, q_ss, do_sh, do_ss, seq_q, seq_pad};

    // kv rows of this thread: kv_row and kv_row + 8 (the accumulator rows g, g + 8 of the warp's 16)
    const int wrow = 64 * wg + 16 * (warp & 3);
    const int kv_row = n0 + wrow + g;
    int kvid[2] = {0, 0};
    if constexpr (SEGMENTS) {
        kvid[0] = kv_ids[(long long)b * seq_kv + min(kv_row, seq_kv - 1)];
        kvid[1] = kv_ids[(long long)b * seq_kv + min(kv_row + 8, seq_kv - 1)];
    }
    const unsigned k_wg = sK + wg * 64 * 128, v_wg = sV + wg * 64 * 128;  // this warpgroup's 64 rows per block

    float dv_acc[DT * 4], dk_acc[DT * 4];
#pragma unroll
    for (int i = 0; i < DT * 4; ++i) dv_acc[i] = dk_acc[i] = 0.f;

    auto tile_step = [&](int it, int stage, auto masked_c) {
        constexpr bool MASKED = decltype(masked_c)::value;
        const int h = kvh * kv_group + tiles.head_in_group(it);
        const int m0 = tiles.m_block(it) * BLOCK_M;
        const unsigned q_st = sQ + stage * Q_BYTES, do_st = sdO + stage * Q_BYTES;

        // S^T and dP^T, two commit groups so that P^T is computed while dP^T is still on the tensor cores
        float s[MT][4], dp[MT][4];
        float(&s_flat)[MT * 4] = reinterpret_cast<float(&)[MT * 4]>(s);
        float(&dp_flat)[MT * 4] = reinterpret_cast<float(&)[MT * 4]>(dp);
        issue_sdp<T, HEAD_DIM, BLOCK_M, BLOCK_N>(s_flat, dp_flat, k_wg, v_wg, q_st, do_st);
        wgmma::wait<1>();
        if constexpr (MASKED)
            mask_scores_t<MT, WINDOW, SEGMENTS>(s, m0, kv_row, seq_q, seq_kv, shift, window_left, window_right,
                                                q_ids + (long long)b * seq_q, kvid, t);
        unsigned p_pk[MT][2], ds_pk[MT][2];  // P^T, dS^T rounded to T: rows g and g + 8, columns 8 j + 2 t (+1)
        form_p<T, MT>(s, p_pk, sL + stage * BLOCK_M, scale_log2, t);
        wgmma::wait<0>();
        form_ds<T, MT>(s, dp, ds_pk, sD + stage * BLOCK_M, t);
        issue_dkdv<T, HEAD_DIM, BLOCK_M>(dv_acc, dk_acc, p_pk, ds_pk, q_st, do_st);

        if constexpr (DQ) {
            // dS^T -> shared memory ([kv][query], blocked and swizzled like the other tiles)
            store_ds_t<BLOCK_N, MT>(smem + (sdS - sK), ds_pk, wrow + g, t);
            wgmma::fence_proxy_async();
            __syncthreads();  // all of dS^T is in place

            // dQ slice: query rows [64 rw, +64) of the tile, head-dim columns [DQ_N cw, +DQ_N); k = kv rows
            const int rw = wg % DQ_ROW_BLOCKS, cw = wg / DQ_ROW_BLOCKS;
            float dq[DQ_N / 2];
            issue_dq<T, BLOCK_N, DQ_N>(dq, sdS + rw * (BLOCK_N * 128), sK + (cw * DQ_N / 64) * (BLOCK_N * 128));
            wgmma::wait<0>();

            const int r0 = m0 + 64 * rw + 16 * (warp & 3) + g;
            float* base = dq_accum + (((long long)b * seq_q + r0) * heads + h) * HEAD_DIM + cw * DQ_N + 2 * t;
            const long long step8 = 8LL * heads * HEAD_DIM;
#pragma unroll
            for (int j = 0; j < DQ_N / 8; ++j) {
                if (r0 < seq_q) red_add_v2(base + 8 * j, dq[4 * j], dq[4 * j + 1]);
                if (r0 + 8 < seq_q) red_add_v2(base + step8 + 8 * j, dq[4 * j + 2], dq[4 * j + 3]);
            }
        } else {
            wgmma::wait<0>();
        }
    };

    run_ring<STAGES>(
        tiles.next_visible(0), tiles.total, [&](int it) { return tiles.next_visible(it + 1); },
        [&](int it) { return tiles.needs_mask(tiles.m_block(it)); }, load_q, tile_step);

    // ---- dK (times the softmax scale) and dV, summed over the group already, straight from registers
    const long long out = (((long long)b * seq_kv + kv_row) * kv_heads + kvh) * HEAD_DIM + 2 * t;
    store_dkdv<T, DT>(dv_acc, dk_acc, dv + out, dk + out, 8LL * kv_heads * HEAD_DIM, kv_row, seq_kv, scale);
}

// Head dim 256: dK and dV of 64 kv rows (2 x 64 x 256 fp32) do not fit one warpgroup's registers, so a CTA of
// two warpgroups shares one 64-row KV tile and splits the work by role and by head-dim half:
//   warpgroup 0 computes S^T = K Q^T, masks it and forms P^T (fp32), which it hands to warpgroup 1 through
//   shared memory (each thread's accumulators in its own slots: the two warpgroups' threads hold the same
//   accumulator positions); warpgroup 1 computes dP^T = V dO^T at the same time, then dS^T = P^T (dP^T - D),
//   which it stores (rounded to T) as the dS^T tile that warpgroup 0 reads back and the dQ product uses;
//   warpgroup w accumulates dV[:, 128 w, +128) += P^T dO[:, half w] and dK[:, half w] += dS^T Q[:, half w]
//   (128 + 128 accumulators) and, with DQ, the dQ columns [128 w, +128) of the tile in two 64-column passes.
// Shared memory: K, V (64 x 256), STAGES x Q, dO (BLOCK_M x 256), dS^T (64 x BLOCK_M), the P^T hand-off
// (64 x BLOCK_M fp32), lse2 and D.
template <typename T, int HEAD_DIM, int BLOCK_M, int STAGES, int MASK, bool DQ>
__global__ void __launch_bounds__(256, 1)
flash_bwd_dkdv_wgmma_pair(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                          const T* __restrict__ dout, const float* __restrict__ lse2, const float* __restrict__ dsum,
                          float* __restrict__ dq_accum, T* __restrict__ dk, T* __restrict__ dv,
                          const int* __restrict__ q_ids, const int* __restrict__ kv_ids,
                          const int2* __restrict__ q_tile_ids, const int2* __restrict__ kv_tile_ids, long long q_sb,
                          long long q_ss, long long q_sh, long long k_sb, long long k_ss, long long k_sh,
                          long long v_sb, long long v_ss, long long v_sh, long long do_sb, long long do_ss,
                          long long do_sh, int seq_q, int seq_kv, int seq_pad, int heads, int kv_group,
                          int window_left, int window_right, float scale_log2, float scale, int batch) {
    constexpr int BLOCK_N = 64;
    constexpr int THREADS = 256;
    constexpr int MT = BLOCK_M / 8;        // 8-column (query) tiles of S^T
    constexpr int HALF = HEAD_DIM / 2;     // head-dim columns of dK / dV / dQ per warpgroup
    constexpr int HT = HALF / 8;
    constexpr bool WINDOW = (MASK & BWD_MASK_WINDOW) != 0;
    constexpr bool SEGMENTS = (MASK & BWD_MASK_SEGMENTS) != 0;
    constexpr bool VARLEN = (MASK & MASK_VARLEN) != 0;
    constexpr int KV_BYTES = BLOCK_N * HEAD_DIM * 2, Q_BYTES = BLOCK_M * HEAD_DIM * 2;
    static_assert(HEAD_DIM == 256 && BLOCK_M == 64, "the pair kernel serves head dim 256 with 64-row query tiles");

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const unsigned raw0 = smem_addr(smem_raw);
    unsigned char* smem = smem_raw + (((raw0 + 1023) & ~1023u) - raw0);  // smem_bytes() reserves the slack
    const unsigned sK = smem_addr(smem), sV = sK + KV_BYTES, sQ = sV + KV_BYTES, sdO = sQ + STAGES * Q_BYTES;
    const unsigned sdS = sdO + STAGES * Q_BYTES;
    unsigned char* ds_base = smem + (sdS - sK);
    float* sP = reinterpret_cast<float*>(ds_base + BLOCK_N * BLOCK_M * 2);  // [MT * 4][128] hand-off slots
    float* sL = sP + MT * 4 * 128;
    float* sD = sL + STAGES * BLOCK_M;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2, wtid = tid & 127;
    const int g = lane >> 2, t = lane & 3;
    int b = blockIdx.z;
    int nb, kvh;
    kv_block_coords(nb, kvh);
    const int kv_heads = gridDim.y;
    if constexpr (VARLEN) {  // grid.x: every sequence's KV tiles; q_ids / kv_ids carry the cu_seqlens
        int tile;
        if (!varlen_tile<BLOCK_N>(kv_ids, batch, seq_kv, nb, b, tile)) return;
        const VarlenSeq sq = varlen_seq(q_ids, b, seq_q), sk = varlen_seq(kv_ids, b, seq_kv);
        nb = tile;
        seq_q = sq.len;
        seq_kv = sk.len;
        q += (long long)sq.start * q_ss;
        dout += (long long)sq.start * do_ss;
        k += (long long)sk.start * k_ss;
        v += (long long)sk.start * v_ss;
        if constexpr (DQ) dq_accum += (long long)sq.start * heads * HEAD_DIM;
        dk += (long long)sk.start * kv_heads * HEAD_DIM;
        dv += (long long)sk.start * kv_heads * HEAD_DIM;
        lse2 += varlen_pad_start(sq.start, b);  // seq_pad: the padded total, the head stride
        dsum += varlen_pad_start(sq.start, b);
        b = 0;
    }
    const int n0 = nb * BLOCK_N;
    const int shift = seq_kv - seq_q;

    const QTileRange<BLOCK_M, BLOCK_N, WINDOW, SEGMENTS> tiles(n0, seq_q, seq_kv, window_left, window_right, q_tile_ids,
                                                               kv_tile_ids, b, nb, gridDim.x, kv_group);

    load_rows_blocked<BLOCK_N, HEAD_DIM, THREADS>(sK, k + b * k_sb + kvh * k_sh, k_ss, n0, seq_kv);
    load_rows_blocked<BLOCK_N, HEAD_DIM, THREADS>(sV, v + b * v_sb + kvh * v_sh, v_ss, n0, seq_kv);
    const int h0 = kvh * kv_group;  // the group's first q head
    const QStepLoader<BLOCK_M, HEAD_DIM, THREADS, T, decltype(tiles)> load_q{
        tiles, sQ, sdO, sL, sD, q + b * q_sb + h0 * q_sh, dout + b * do_sb + h0 * do_sh,
        lse2 + ((long long)b * heads + h0) * seq_pad, dsum + ((long long)b * heads + h0) * seq_pad,
        q_sh, q_ss, do_sh, do_ss, seq_q, seq_pad};

    const int wrow = 16 * (warp & 3);  // both warpgroups: kv rows wrow + g, wrow + g + 8 of the tile
    const int kv_row = n0 + wrow + g;
    int kvid[2] = {0, 0};
    if constexpr (SEGMENTS) {
        kvid[0] = kv_ids[(long long)b * seq_kv + min(kv_row, seq_kv - 1)];
        kvid[1] = kv_ids[(long long)b * seq_kv + min(kv_row + 8, seq_kv - 1)];
    }

    float dv_acc[HT * 4], dk_acc[HT * 4];
#pragma unroll
    for (int i = 0; i < HT * 4; ++i) dv_acc[i] = dk_acc[i] = 0.f;

    auto tile_step = [&](int it, int stage, auto masked_c) {
        constexpr bool MASKED = decltype(masked_c)::value;
        const int h = kvh * kv_group + tiles.head_in_group(it);
        const int m0 = tiles.m_block(it) * BLOCK_M;
        const unsigned q_st = sQ + stage * Q_BYTES, do_st = sdO + stage * Q_BYTES;

        // warpgroup 0: S^T = K Q^T; warpgroup 1: dP^T = V dO^T
        float acc[MT][4];
        float(&acc_flat)[MT * 4] = reinterpret_cast<float(&)[MT * 4]>(acc);
        issue_one_t<T, HEAD_DIM, BLOCK_M, BLOCK_N>(acc_flat, wg == 0 ? sK : sV, wg == 0 ? q_st : do_st);
        wgmma::wait<0>();

        unsigned p_pk[MT][2], ds_pk[MT][2];
        float* hand = sP + wtid;
        if (wg == 0) {
            if constexpr (MASKED)
                mask_scores_t<MT, WINDOW, SEGMENTS>(acc, m0, kv_row, seq_q, seq_kv, shift, window_left, window_right,
                                                    q_ids + (long long)b * seq_q, kvid, t);
            form_p<T, MT>(acc, p_pk, sL + stage * BLOCK_M, scale_log2, t);
            hand_p<MT>(hand, acc);
        }
        __syncthreads();  // P^T handed over
        if (wg == 1) {
            take_p<T, MT>(hand, p_pk);
            form_ds_handed<T, MT>(hand, acc, ds_pk, sD + stage * BLOCK_M, t);
            store_ds_t<BLOCK_N, MT>(ds_base, ds_pk, wrow + g, t);
        }
        wgmma::fence_proxy_async();
        __syncthreads();  // dS^T in place
        if (wg == 0) load_ds_t<BLOCK_N, MT>(ds_base, ds_pk, wrow + g, t);

        // this warpgroup's head-dim half: dV += P^T dO, dK += dS^T Q
        const unsigned half_off = wg * (HALF / 64) * (BLOCK_M * 128);
        issue_dkdv<T, HALF, BLOCK_M>(dv_acc, dk_acc, p_pk, ds_pk, q_st + half_off, do_st + half_off);

        if constexpr (DQ) {
            wgmma::wait<0>();  // P^T / dS^T registers free before the dQ accumulators go live (no spills)
            // dQ columns [HALF w + DQ_N c, +DQ_N) of the 64-query tile = dS K: A = dS^T, B = K, both MN-major
            constexpr int DQ_N = 32;  // 16 accumulators: with 128 of dK and dV live, wider passes spill
            const int r0 = m0 + wrow + g;
            const long long step8 = 8LL * heads * HEAD_DIM;
#pragma unroll 1
            for (int c = 0; c < HALF / DQ_N; ++c) {
                const int col0 = wg * HALF + c * DQ_N;  // head-dim column of this pass
                float dq[DQ_N / 2];
                issue_dq<T, BLOCK_N, DQ_N>(dq, sdS, sK + (col0 / 64) * (BLOCK_N * 128) + (col0 % 64) * 2);
                wgmma::wait<0>();
                float* base = dq_accum + (((long long)b * seq_q + r0) * heads + h) * HEAD_DIM + col0 + 2 * t;
#pragma unroll
                for (int j = 0; j < DQ_N / 8; ++j) {
                    if (r0 < seq_q) red_add_v2(base + 8 * j, dq[4 * j], dq[4 * j + 1]);
                    if (r0 + 8 < seq_q) red_add_v2(base + step8 + 8 * j, dq[4 * j + 2], dq[4 * j + 3]);
                }
            }
        } else {
            wgmma::wait<0>();
        }
    };

    run_ring<STAGES>(
        tiles.next_visible(0), tiles.total, [&](int it) { return tiles.next_visible(it + 1); },
        [&](int it) { return tiles.needs_mask(tiles.m_block(it)); }, load_q, tile_step);

    const long long out = (((long long)b * seq_kv + kv_row) * kv_heads + kvh) * HEAD_DIM + wg * HALF + 2 * t;
    store_dkdv<T, HT>(dv_acc, dk_acc, dv + out, dk + out, 8LL * kv_heads * HEAD_DIM, kv_row, seq_kv, scale);
}
