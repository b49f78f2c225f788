// Flash attention backward (FlashAttention-2 scheme) on mma.sync tensor cores, sm_80+.
//
// Layouts as in the forward: q, dout [batch, seq_q, heads, HEAD_DIM], k, v [batch, seq_kv, kv_heads, HEAD_DIM]
// (any strides on the first three dimensions, multiples of 8 elements, head_dim contiguous); dq, dk, dv are
// contiguous; kv head = head / kv_group.
//
// 1. flash_bwd_preprocess: per (b, h, i) D_i = rowsum(dO * O) in fp32 and lse2_i = lse_i * log2(e) (+inf for a
//    row with no visible key, so that its P = 2^(s - lse2) is 0), written to [batch, heads, seq_pad] arrays whose
//    padding rows (i >= seq_q) hold D = 0, lse2 = +inf; zeroes the fp32 dQ accumulator row (and the n_counters
//    arrival counters of flash_bwd_tma's dQ conversion).
// 2. flash_bwd_dkdv: grid (KV tiles, kv_heads, batch). One CTA keeps a BLOCK_N-row K and V tile in shared memory
//    and loops over the q heads of its GQA group and, per head, over the BLOCK_M-row query tiles that can see
//    the KV tile (window/causal range, then segment-id tile ranges); Q, dO, lse2 and D stream through a
//    STAGES-deep cp.async ring. Per query tile (S^T is [BLOCK_N kv rows x BLOCK_M q columns]):
//      phase A  warp (wr, wc) computes rows [16 wr, +16) x columns [wc * MQ, +MQ) of S^T = K Q^T and
//               dP^T = V dO^T, P^T = 2^(S^T scale log2e - lse2), dS^T = P^T (dP^T - D); both rounded to T into
//               shared memory (swizzled [kv][q] tiles).
//      phase B  the same warp accumulates rows [16 wr, +16) x head-dim columns [wc * DC, +DC) of
//               dV += P^T dO and dK += dS^T Q (fp32 registers, A operands from shared memory, B via
//               ldmatrix.trans).
//      phase C  (DQ) dQ_tile = dS K with warps over (16-row query groups x head-dim slices), added with fp32
//               atomics into the [batch, seq_q, heads, HEAD_DIM] accumulator.
//    dK (times softmax scale) and dV are written once, in T, summed over the GQA group already: no workspace.
//    Element masks run only on tiles that need them (kv boundary, window edges, mixed segments); query rows
//    past seq_q need none (zero Q/dO, lse2 = +inf gives P = 0).
// 3a. flash_bwd_dq_convert: dq = T(scale * accumulator). (Small problems on sm_90a: flash_bwd_tma converts dQ in
//    its grid and, where the grid fits the SMs, does step 1 in a prologue: the backward in one launch.)
// 3b. deterministic mode: flash_bwd_dkdv<..., DQ = false> and flash_bwd_dq, one CTA per (query tile, head,
//    batch) looping over the visible KV tiles (forward-like; recomputes S and dP) and writing dq directly: no
//    atomics anywhere, so results are bit-identical run to run.
// 4.  MASK_VARLEN (common.cuh, bwd_common.cuh): packed sequences as in the forward; every kernel maps its tile to a
//   sequence and runs as for batch element 0; lse2 / D are [heads, align4(total_q) + batch * VARLEN_PAD]
//   with the padding after each sequence, and preprocess<..., VARLEN = true> takes cu_seqlens_q.
#include "bwd_common.cuh"

using namespace attn;

template <typename T, int HEAD_DIM, bool VARLEN = false>
__global__ void flash_bwd_preprocess(const T* __restrict__ o, const T* __restrict__ dout, const float* __restrict__ lse,
                                     float* __restrict__ lse2, float* __restrict__ dsum, float* __restrict__ dq_accum,
                                     long long o_sb, long long o_ss, long long o_sh, long long do_sb, long long do_ss,
                                     long long do_sh, int batch, int seq_q, int seq_pad, int heads,
                                     const int* __restrict__ cu_q, int* __restrict__ counters, int n_counters) {
    const int lane = threadIdx.x & 31;
    const long long row = (long long)blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
    // the dK/dV kernel's arrival counters (flash_bwd_tma's dQ conversion), zeroed before it runs
    if ((long long)blockIdx.x * blockDim.x + threadIdx.x < n_counters) counters[blockIdx.x * blockDim.x + threadIdx.x] = 0;
    const int h = row % heads;
    // the row's lse2 / D index, its row in o and dout (offsets), in lse, and in the dQ accumulator; or padding
    long long at, o_off, do_off, lse_at, q_row;
    bool pad;
    if constexpr (VARLEN) {  // [heads, seq_pad], seq_pad = align4(total_q) + batch * VARLEN_PAD; seq_q = total_q
        if (row >= (long long)seq_pad * heads) return;
        const int ip = row / heads;  // padded row: its sequence is the last whose padded start is <= ip
        int lo = 0, hi = batch - 1;
        while (lo < hi) {
            const int mid = (lo + hi + 1) >> 1;
            if (varlen_pad_start(__ldg(cu_q + mid), mid) <= ip) lo = mid; else hi = mid - 1;
        }
        const VarlenSeq sq = varlen_seq(cu_q, lo, seq_q);
        const long long i = ip - varlen_pad_start(sq.start, lo);
        pad = i < 0 || i >= sq.len;
        q_row = sq.start + i;
        at = (long long)h * seq_pad + ip;
        o_off = q_row * o_ss;
        do_off = q_row * do_ss;
        lse_at = (long long)h * seq_q + q_row;
    } else {
        if (row >= (long long)batch * seq_pad * heads) return;
        const int i = (row / heads) % seq_pad;
        const int b = row / ((long long)heads * seq_pad);
        pad = i >= seq_q;
        q_row = (long long)b * seq_q + i;
        at = ((long long)b * heads + h) * seq_pad + i;
        o_off = b * o_sb + i * o_ss;
        do_off = b * do_sb + i * do_ss;
        lse_at = ((long long)b * heads + h) * seq_q + i;
    }
    if (pad) {
        if (lane == 0) {
            dsum[at] = 0.f;
            lse2[at] = pos_inf();
        }
        return;
    }
    const T* orow = o + o_off + h * o_sh;
    const T* drow = dout + do_off + h * do_sh;
    float acc = 0.f;
    for (int c = lane; c < HEAD_DIM / 8; c += 32)
        acc = dot8<T>(*reinterpret_cast<const uint4*>(orow + c * 8), *reinterpret_cast<const uint4*>(drow + c * 8),
                      acc);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) {
        dsum[at] = acc;
        lse2[at] = lse_to_lse2(lse[lse_at]);
    }
    if (dq_accum != nullptr) {
        float4* dst = reinterpret_cast<float4*>(dq_accum + (q_row * heads + h) * HEAD_DIM);
        for (int c = lane; c < HEAD_DIM / 4; c += 32) dst[c] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
}

template <typename T>
__global__ void flash_bwd_dq_convert(const float* __restrict__ acc, T* __restrict__ dq, long long n_quads,
                                     float scale) {
    // four values per thread and iteration: 16-byte loads (read once: streaming), 8-byte stores
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n_quads; i += step) {
        const float4 x = __ldcs(reinterpret_cast<const float4*>(acc) + i);
        reinterpret_cast<uint2*>(dq)[i] =
            make_uint2(pack2<T>(x.x * scale, x.y * scale), pack2<T>(x.z * scale, x.w * scale));
    }
}

// ROWS rows of HEAD_DIM elements (row stride `stride`) -> swizzled shared tile; rows >= rows_valid zero-filled.
template <int ROWS, int HEAD_DIM, int THREADS, typename T>
__device__ __forceinline__ void load_tile(T* dst, const T* src, long long stride, int row0, int rows_valid) {
    constexpr int CHUNKS = HEAD_DIM / 8;
#pragma unroll
    for (int i = threadIdx.x; i < ROWS * CHUNKS; i += THREADS) {
        const int row = i / CHUNKS, ch = i % CHUNKS;
        const bool ok = row0 + row < rows_valid;
        cp_async16(smem_addr(dst + swz<HEAD_DIM>(row, ch)), src + (ok ? (row0 + row) * stride : 0) + ch * 8, ok);
    }
}

template <typename T, int HEAD_DIM, int BLOCK_M, int BLOCK_N, int WARPS, int STAGES, int MASK, bool DQ>
__global__ void __launch_bounds__(WARPS * 32, 1)
flash_bwd_dkdv(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ dout,
               const float* __restrict__ lse2, const float* __restrict__ dsum, float* __restrict__ dq_accum,
               T* __restrict__ dk, T* __restrict__ dv, const int* __restrict__ q_ids, const int* __restrict__ kv_ids,
               const int2* __restrict__ q_tile_ids, const int2* __restrict__ kv_tile_ids, long long q_sb,
               long long q_ss, long long q_sh, long long k_sb, long long k_ss, long long k_sh, long long v_sb,
               long long v_ss, long long v_sh, long long do_sb, long long do_ss, long long do_sh, int seq_q,
               int seq_kv, int seq_pad, int heads, int kv_group, int window_left, int window_right, float scale_log2,
               float scale, int batch) {
    constexpr int THREADS = WARPS * 32;
    constexpr int WN = BLOCK_N / 16;  // 16-row kv groups
    constexpr int WC = WARPS / WN;    // warps per kv group (split q columns in phase A, head-dim in phase B)
    constexpr int MQ = BLOCK_M / WC;  // q columns per warp, phase A
    constexpr int DC = HEAD_DIM / WC; // head-dim columns per warp, phase B
    constexpr int QG = BLOCK_M / 16;  // 16-row query groups, phase C
    constexpr int RQ = QG < WARPS ? QG : WARPS;
    constexpr int CQ = WARPS / RQ;
    constexpr int DQC = HEAD_DIM / CQ;
    constexpr bool WINDOW = (MASK & BWD_MASK_WINDOW) != 0;
    constexpr bool SEGMENTS = (MASK & BWD_MASK_SEGMENTS) != 0;
    constexpr bool VARLEN = (MASK & MASK_VARLEN) != 0;
    static_assert(BLOCK_N % 16 == 0 && WARPS % WN == 0 && WC >= 1, "warps must cover the kv rows in 16-row groups");
    static_assert(MQ % 16 == 0 && DC % 16 == 0, "per-warp slices of 16 columns");
    static_assert(WARPS % RQ == 0 && QG % RQ == 0 && DQC % 32 == 0, "phase C warp grid");
    static_assert(BLOCK_M == 32 || BLOCK_M % 64 == 0, "P/dS tile swizzle");

    extern __shared__ __align__(128) unsigned char smem_raw[];
    T* sK = reinterpret_cast<T*>(smem_raw);
    T* sV = sK + BLOCK_N * HEAD_DIM;
    T* sQ = sV + BLOCK_N * HEAD_DIM;
    T* sdO = sQ + STAGES * BLOCK_M * HEAD_DIM;
    T* sP = sdO + STAGES * BLOCK_M * HEAD_DIM;
    T* sdS = sP + BLOCK_N * BLOCK_M;
    float* sL = reinterpret_cast<float*>(sdS + BLOCK_N * BLOCK_M);
    float* sD = sL + STAGES * BLOCK_M;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int wr = warp % WN, wc = warp / WN;
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

    // ---- the (head in group, query tile) pairs that can see this KV tile
    const QTileRange<BLOCK_M, BLOCK_N, WINDOW, SEGMENTS> tiles(n0, seq_q, seq_kv, window_left, window_right, q_tile_ids,
                                                               kv_tile_ids, b, nb, gridDim.x, kv_group);
    const int mb_min = tiles.mb_min, n_m = tiles.n_m, total = tiles.total;
    auto next_visible = [&](int it) { return tiles.next_visible(it); };
    auto needs_mask = [&](int mb) { return tiles.needs_mask(mb); };

    // ---- K, V once; Q, dO, lse2, D per (head, query tile) through the ring
    load_tile<BLOCK_N, HEAD_DIM, THREADS>(sK, k + b * k_sb + kvh * k_sh, k_ss, n0, seq_kv);
    load_tile<BLOCK_N, HEAD_DIM, THREADS>(sV, v + b * v_sb + kvh * v_sh, v_ss, n0, seq_kv);
    cp_async_commit();

    auto load_q = [&](int it, int stage) {
        const int h = kvh * kv_group + it / n_m;
        const int m0 = (mb_min + it % n_m) * BLOCK_M;
        load_tile<BLOCK_M, HEAD_DIM, THREADS>(sQ + stage * BLOCK_M * HEAD_DIM, q + b * q_sb + h * q_sh, q_ss, m0, seq_q);
        load_tile<BLOCK_M, HEAD_DIM, THREADS>(sdO + stage * BLOCK_M * HEAD_DIM, dout + b * do_sb + h * do_sh, do_ss, m0,
                                              seq_q);
        const long long row = ((long long)b * heads + h) * seq_pad + m0;  // seq_pad >= m0 + BLOCK_M
        for (int i = tid; i < 2 * (BLOCK_M / 4); i += THREADS) {
            const int which = i / (BLOCK_M / 4), c = i % (BLOCK_M / 4);
            float* dst = (which ? sD : sL) + stage * BLOCK_M + 4 * c;
            cp_async16(smem_addr(dst), (which ? dsum : lse2) + row + 4 * c, true);
        }
    };

    int load_it = next_visible(0);
    int load_stage = 0;
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (load_it < total) {
            load_q(load_it, load_stage);
            load_it = next_visible(load_it + 1);
        }
        cp_async_commit();
        load_stage = load_stage + 1 == STAGES ? 0 : load_stage + 1;
    }

    // kv ids of this thread's two S^T rows
    const int kv_row0 = n0 + 16 * wr + g, kv_row1 = kv_row0 + 8;
    int kvid[2] = {0, 0};
    if constexpr (SEGMENTS) {
        kvid[0] = kv_ids[(long long)b * seq_kv + min(kv_row0, seq_kv - 1)];
        kvid[1] = kv_ids[(long long)b * seq_kv + min(kv_row1, seq_kv - 1)];
    }

    const unsigned sK_a = smem_addr(sK), sV_a = smem_addr(sV), sP_a = smem_addr(sP), sdS_a = smem_addr(sdS);
    const int qc0 = wc * MQ, dc0 = wc * DC;

    float dv_acc[DC / 8][4], dk_acc[DC / 8][4];
#pragma unroll
    for (int i = 0; i < DC / 8; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) dv_acc[i][e] = dk_acc[i][e] = 0.f;

    auto tile_step = [&](int it, int stage, auto masked_c) {
        constexpr bool MASKED = decltype(masked_c)::value;
        const int h = kvh * kv_group + it / n_m;
        const int m0 = (mb_min + it % n_m) * BLOCK_M;
        const unsigned sQ_a = smem_addr(sQ + stage * BLOCK_M * HEAD_DIM);
        const unsigned sdO_a = smem_addr(sdO + stage * BLOCK_M * HEAD_DIM);
        const float* lrow = sL + stage * BLOCK_M;
        const float* drow = sD + stage * BLOCK_M;

        // phase A: S^T = K Q^T and dP^T = V dO^T for rows [16 wr, +16), columns [qc0, +MQ)
        float s[MQ / 8][4], dp[MQ / 8][4];
#pragma unroll
        for (int i = 0; i < MQ / 8; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[i][e] = dp[i][e] = 0.f;
#pragma unroll 4
        for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
            unsigned ak[4], av[4];
            ldmatrix_x4(addr_A<HEAD_DIM>(sK_a, 16 * wr, 16 * kk), ak[0], ak[1], ak[2], ak[3]);
            ldmatrix_x4(addr_A<HEAD_DIM>(sV_a, 16 * wr, 16 * kk), av[0], av[1], av[2], av[3]);
#pragma unroll
            for (int np = 0; np < MQ / 16; ++np) {
                unsigned b0, b1, b2, b3;
                ldmatrix_x4(addr_B<HEAD_DIM>(sQ_a, qc0 + 16 * np, 16 * kk), b0, b1, b2, b3);
                mma16816<T>(s[2 * np], ak, b0, b1);
                mma16816<T>(s[2 * np + 1], ak, b2, b3);
                ldmatrix_x4(addr_B<HEAD_DIM>(sdO_a, qc0 + 16 * np, 16 * kk), b0, b1, b2, b3);
                mma16816<T>(dp[2 * np], av, b0, b1);
                mma16816<T>(dp[2 * np + 1], av, b2, b3);
            }
        }
        if constexpr (MASKED)
            mask_scores_t<MQ / 8, WINDOW, SEGMENTS>(s, m0 + qc0, kv_row0, seq_q, seq_kv, shift, window_left,
                                                     window_right, q_ids + (long long)b * seq_q, kvid, t);
#pragma unroll
        for (int nt = 0; nt < MQ / 8; ++nt) {
            const int c = qc0 + nt * 8 + 2 * t;
            const float2 l = *reinterpret_cast<const float2*>(lrow + c);
            const float2 d = *reinterpret_cast<const float2*>(drow + c);
            const float p0 = exp2_approx(fmaf(s[nt][0], scale_log2, -l.x));
            const float p1 = exp2_approx(fmaf(s[nt][1], scale_log2, -l.y));
            const float p2 = exp2_approx(fmaf(s[nt][2], scale_log2, -l.x));
            const float p3 = exp2_approx(fmaf(s[nt][3], scale_log2, -l.y));
            const int r = 16 * wr + g, ch = c >> 3, off = c & 7;
            *reinterpret_cast<unsigned*>(sP + swz<BLOCK_M>(r, ch) + off) = pack2<T>(p0, p1);
            *reinterpret_cast<unsigned*>(sP + swz<BLOCK_M>(r + 8, ch) + off) = pack2<T>(p2, p3);
            *reinterpret_cast<unsigned*>(sdS + swz<BLOCK_M>(r, ch) + off) =
                pack2<T>(p0 * (dp[nt][0] - d.x), p1 * (dp[nt][1] - d.y));
            *reinterpret_cast<unsigned*>(sdS + swz<BLOCK_M>(r + 8, ch) + off) =
                pack2<T>(p2 * (dp[nt][2] - d.x), p3 * (dp[nt][3] - d.y));
        }
        __syncthreads();

        // phase B: dV += P^T dO, dK += dS^T Q for rows [16 wr, +16), head-dim columns [dc0, +DC)
#pragma unroll 1
        for (int kq = 0; kq < BLOCK_M / 16; ++kq) {
            unsigned ap[4], as[4];
            ldmatrix_x4(addr_A<BLOCK_M>(sP_a, 16 * wr, 16 * kq), ap[0], ap[1], ap[2], ap[3]);
            ldmatrix_x4(addr_A<BLOCK_M>(sdS_a, 16 * wr, 16 * kq), as[0], as[1], as[2], as[3]);
#pragma unroll
            for (int dd = 0; dd < DC / 16; ++dd) {
                unsigned b0, b1, b2, b3;
                ldmatrix_x4_trans(addr_Bt<HEAD_DIM>(sdO_a, 16 * kq, dc0 + 16 * dd), b0, b1, b2, b3);
                mma16816<T>(dv_acc[2 * dd], ap, b0, b1);
                mma16816<T>(dv_acc[2 * dd + 1], ap, b2, b3);
                ldmatrix_x4_trans(addr_Bt<HEAD_DIM>(sQ_a, 16 * kq, dc0 + 16 * dd), b0, b1, b2, b3);
                mma16816<T>(dk_acc[2 * dd], as, b0, b1);
                mma16816<T>(dk_acc[2 * dd + 1], as, b2, b3);
            }
        }

        // phase C: dQ[m0 + 16 rg, +16][dq0, +DQC) += dS K, fp32 atomics; 32 head-dim columns at a time so that
        // only 16 more accumulators are live next to dK and dV
        if constexpr (DQ) {
            const int dq0 = (warp / RQ) * DQC;
#pragma unroll 1
            for (int rg = warp % RQ; rg < QG; rg += RQ) {
                const int r0 = m0 + 16 * rg + g, r1 = r0 + 8;
                float* base0 = dq_accum + (((long long)b * seq_q + r0) * heads + h) * HEAD_DIM + dq0 + 2 * t;
                float* base1 = base0 + 8LL * heads * HEAD_DIM;
#pragma unroll 1
                for (int dc = 0; dc < DQC; dc += 32) {
                    float acc[4][4];
#pragma unroll
                    for (int i = 0; i < 4; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
#pragma unroll 1
                    for (int kn = 0; kn < BLOCK_N / 16; ++kn) {
                        unsigned a[4], b0, b1, b2, b3;
                        ldmatrix_x4_trans(addr_At<BLOCK_M>(sdS_a, 16 * rg, 16 * kn), a[0], a[1], a[2], a[3]);
                        ldmatrix_x4_trans(addr_Bt<HEAD_DIM>(sK_a, 16 * kn, dq0 + dc), b0, b1, b2, b3);
                        mma16816<T>(acc[0], a, b0, b1);
                        mma16816<T>(acc[1], a, b2, b3);
                        ldmatrix_x4_trans(addr_Bt<HEAD_DIM>(sK_a, 16 * kn, dq0 + dc + 16), b0, b1, b2, b3);
                        mma16816<T>(acc[2], a, b0, b1);
                        mma16816<T>(acc[3], a, b2, b3);
                    }
#pragma unroll
                    for (int dt = 0; dt < 4; ++dt) {
                        if (r0 < seq_q) {
                            atomicAdd(base0 + dc + dt * 8, acc[dt][0]);
                            atomicAdd(base0 + dc + dt * 8 + 1, acc[dt][1]);
                        }
                        if (r1 < seq_q) {
                            atomicAdd(base1 + dc + dt * 8, acc[dt][2]);
                            atomicAdd(base1 + dc + dt * 8 + 1, acc[dt][3]);
                        }
                    }
                }
            }
        }
    };

    int it = next_visible(0);
    int stage = 0;
    while (it < total) {
        __syncthreads();  // every warp is done with the stage refilled next and with sP / sdS
        if (load_it < total) {
            load_q(load_it, load_stage);
            load_it = next_visible(load_it + 1);
        }
        cp_async_commit();
        load_stage = load_stage + 1 == STAGES ? 0 : load_stage + 1;
        cp_async_wait<STAGES - 1>();  // this thread's copies of tile `it` (and K, V) have landed ...
        __syncthreads();              // ... and everyone's
        if (needs_mask(mb_min + it % n_m))
            tile_step(it, stage, Bool<true>{});
        else
            tile_step(it, stage, Bool<false>{});
        it = next_visible(it + 1);
        stage = stage + 1 == STAGES ? 0 : stage + 1;
    }
    cp_async_wait<0>();

    // ---- dK (times the softmax scale) and dV, summed over the group already, straight from registers
    T* dv_row0 = dv + (((long long)b * seq_kv + kv_row0) * kv_heads + kvh) * HEAD_DIM + dc0 + 2 * t;
    T* dk_row0 = dk + (((long long)b * seq_kv + kv_row0) * kv_heads + kvh) * HEAD_DIM + dc0 + 2 * t;
    const long long step8 = 8LL * kv_heads * HEAD_DIM;
#pragma unroll
    for (int dt = 0; dt < DC / 8; ++dt) {
        if (kv_row0 < seq_kv) {
            *reinterpret_cast<unsigned*>(dv_row0 + dt * 8) = pack2<T>(dv_acc[dt][0], dv_acc[dt][1]);
            *reinterpret_cast<unsigned*>(dk_row0 + dt * 8) = pack2<T>(dk_acc[dt][0] * scale, dk_acc[dt][1] * scale);
        }
        if (kv_row1 < seq_kv) {
            *reinterpret_cast<unsigned*>(dv_row0 + step8 + dt * 8) = pack2<T>(dv_acc[dt][2], dv_acc[dt][3]);
            *reinterpret_cast<unsigned*>(dk_row0 + step8 + dt * 8) =
                pack2<T>(dk_acc[dt][2] * scale, dk_acc[dt][3] * scale);
        }
    }
}

// Deterministic dQ: grid (query tiles, heads, batch), warp w owns query rows [16 w, +16) of the tile; K and V
// tiles stream through a two-stage ring over the KV tiles this query tile can see (as in the forward).
template <typename T, int HEAD_DIM, int BLOCK_M, int BLOCK_N, int WARPS, int MASK>
__global__ void __launch_bounds__(WARPS * 32, 1)
flash_bwd_dq(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ dout,
             const float* __restrict__ lse2, const float* __restrict__ dsum, T* __restrict__ dq,
             const int* __restrict__ q_ids, const int* __restrict__ kv_ids, const int2* __restrict__ q_tile_ids,
             const int2* __restrict__ kv_tile_ids, long long q_sb, long long q_ss, long long q_sh, long long k_sb,
             long long k_ss, long long k_sh, long long v_sb, long long v_ss, long long v_sh, long long do_sb,
             long long do_ss, long long do_sh, int seq_q, int seq_kv, int seq_pad, int heads, int kv_group,
             int window_left, int window_right, float scale_log2, float scale, int batch) {
    constexpr int THREADS = WARPS * 32;
    constexpr int NT = BLOCK_N / 8;
    constexpr int DT = HEAD_DIM / 8;
    constexpr bool WINDOW = (MASK & BWD_MASK_WINDOW) != 0;
    constexpr bool SEGMENTS = (MASK & BWD_MASK_SEGMENTS) != 0;
    constexpr bool VARLEN = (MASK & MASK_VARLEN) != 0;
    static_assert(BLOCK_M == 16 * WARPS && BLOCK_N % 16 == 0, "each warp owns 16 query rows");

    extern __shared__ __align__(128) unsigned char smem_raw[];
    T* sQ = reinterpret_cast<T*>(smem_raw);
    T* sdO = sQ + BLOCK_M * HEAD_DIM;
    T* sK = sdO + BLOCK_M * HEAD_DIM;
    T* sV = sK + 2 * BLOCK_N * HEAD_DIM;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    int m_block = gridDim.x - 1 - blockIdx.x;
    int b = blockIdx.z, q_first = 0;
    const int head = blockIdx.y;
    if constexpr (VARLEN) {  // grid.x: every sequence's query tiles; q_ids / kv_ids carry the cu_seqlens
        int tile;
        if (!varlen_tile<BLOCK_M>(q_ids, batch, seq_q, blockIdx.x, b, tile)) return;
        const VarlenSeq sq = varlen_seq(q_ids, b, seq_q), sk = varlen_seq(kv_ids, b, seq_kv);
        seq_q = sq.len;
        seq_kv = sk.len;
        m_block = (seq_q + BLOCK_M - 1) / BLOCK_M - 1 - tile;
        q += (long long)sq.start * q_ss;
        dout += (long long)sq.start * do_ss;
        k += (long long)sk.start * k_ss;
        v += (long long)sk.start * v_ss;
        q_first = sq.start;  // dq rows (an offset: one register where a moved pointer takes two)
        lse2 += varlen_pad_start(sq.start, b);
        dsum += varlen_pad_start(sq.start, b);
        b = 0;
    }
    const int m0 = m_block * BLOCK_M;
    const int m_last = min(m0 + BLOCK_M, seq_q) - 1;
    const int shift = seq_kv - seq_q;
    const T* kb = k + b * k_sb + (head / kv_group) * k_sh;
    const T* vb = v + b * v_sb + (head / kv_group) * v_sh;

    // ---- the KV tiles this query tile can see
    const KvTileRange<BLOCK_N, WINDOW, SEGMENTS> tiles(m0, m_last, seq_q, seq_kv, window_left, window_right, q_tile_ids,
                                                       kv_tile_ids, b, m_block, gridDim.x);
    const int nb_min = tiles.nb_min, nb_max = tiles.nb_max;
    auto next_visible = [&](int nb) { return tiles.next_visible(nb); };
    auto needs_mask = [&](int nb) { return tiles.needs_mask(nb); };

    load_tile<BLOCK_M, HEAD_DIM, THREADS>(sQ, q + b * q_sb + head * q_sh, q_ss, m0, seq_q);
    load_tile<BLOCK_M, HEAD_DIM, THREADS>(sdO, dout + b * do_sb + head * do_sh, do_ss, m0, seq_q);
    cp_async_commit();
    auto load_kv = [&](int nb, int stage) {
        load_tile<BLOCK_N, HEAD_DIM, THREADS>(sK + stage * BLOCK_N * HEAD_DIM, kb, k_ss, nb * BLOCK_N, seq_kv);
        load_tile<BLOCK_N, HEAD_DIM, THREADS>(sV + stage * BLOCK_N * HEAD_DIM, vb, v_ss, nb * BLOCK_N, seq_kv);
    };
    int load_nb = next_visible(nb_min);
    if (load_nb < nb_max) {
        load_kv(load_nb, 0);
        load_nb = next_visible(load_nb + 1);
    }
    cp_async_commit();

    const int row0 = m0 + 16 * warp + g, row1 = row0 + 8;
    const long long lrow = ((long long)b * heads + head) * seq_pad;
    const float l0 = lse2[lrow + row0], l1 = lse2[lrow + row1];  // padded: rows past seq_q hold +inf
    const float d0 = dsum[lrow + row0], d1 = dsum[lrow + row1];
    const bool store0 = row0 < seq_q, store1 = row1 < seq_q;  // predicates: seq_q need not stay in a register
    int qid0 = 0, qid1 = 0;
    if constexpr (SEGMENTS) {
        qid0 = q_ids[(long long)b * seq_q + min(row0, seq_q - 1)];
        qid1 = q_ids[(long long)b * seq_q + min(row1, seq_q - 1)];
    }
    const unsigned sQ_a = smem_addr(sQ), sdO_a = smem_addr(sdO);

    float acc[DT][4];
#pragma unroll
    for (int i = 0; i < DT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;

    auto tile_step = [&](int nb, int stage, auto masked_c) {
        constexpr bool MASKED = decltype(masked_c)::value;
        const unsigned sK_a = smem_addr(sK + stage * BLOCK_N * HEAD_DIM);
        const unsigned sV_a = smem_addr(sV + stage * BLOCK_N * HEAD_DIM);
        float s[NT][4], dp[NT][4];
#pragma unroll
        for (int i = 0; i < NT; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[i][e] = dp[i][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
            unsigned aq[4], ad[4];
            ldmatrix_x4(addr_A<HEAD_DIM>(sQ_a, 16 * warp, 16 * kk), aq[0], aq[1], aq[2], aq[3]);
            ldmatrix_x4(addr_A<HEAD_DIM>(sdO_a, 16 * warp, 16 * kk), ad[0], ad[1], ad[2], ad[3]);
#pragma unroll
            for (int np = 0; np < NT / 2; ++np) {
                unsigned b0, b1, b2, b3;
                ldmatrix_x4(addr_B<HEAD_DIM>(sK_a, 16 * np, 16 * kk), b0, b1, b2, b3);
                mma16816<T>(s[2 * np], aq, b0, b1);
                mma16816<T>(s[2 * np + 1], aq, b2, b3);
                ldmatrix_x4(addr_B<HEAD_DIM>(sV_a, 16 * np, 16 * kk), b0, b1, b2, b3);
                mma16816<T>(dp[2 * np], ad, b0, b1);
                mma16816<T>(dp[2 * np + 1], ad, b2, b3);
            }
        }
        if constexpr (MASKED) {
            const int n0 = nb * BLOCK_N;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int col = n0 + nt * 8 + 2 * t + (e & 1);
                    bool ok = col < seq_kv;
                    if constexpr (WINDOW) {
                        const int at = (e < 2 ? row0 : row1) + shift;
                        ok = ok && col >= at - window_left && col <= at + window_right;
                    }
                    if constexpr (SEGMENTS) {
                        ok = ok && __ldg(kv_ids + (long long)b * seq_kv + min(col, seq_kv - 1)) == (e < 2 ? qid0 : qid1);
                    }
                    if (!ok) s[nt][e] = neg_inf();
                }
            }
        }
        // dS = P (dP - D), fed straight back as the A operand of dQ += dS K
#pragma unroll
        for (int kj = 0; kj < BLOCK_N / 16; ++kj) {
            float ds[2][4];
#pragma unroll
            for (int h2 = 0; h2 < 2; ++h2) {
                const int nt = 2 * kj + h2;
                ds[h2][0] = exp2_approx(fmaf(s[nt][0], scale_log2, -l0)) * (dp[nt][0] - d0);
                ds[h2][1] = exp2_approx(fmaf(s[nt][1], scale_log2, -l0)) * (dp[nt][1] - d0);
                ds[h2][2] = exp2_approx(fmaf(s[nt][2], scale_log2, -l1)) * (dp[nt][2] - d1);
                ds[h2][3] = exp2_approx(fmaf(s[nt][3], scale_log2, -l1)) * (dp[nt][3] - d1);
            }
            unsigned a[4];
            a[0] = pack2<T>(ds[0][0], ds[0][1]);
            a[1] = pack2<T>(ds[0][2], ds[0][3]);
            a[2] = pack2<T>(ds[1][0], ds[1][1]);
            a[3] = pack2<T>(ds[1][2], ds[1][3]);
#pragma unroll
            for (int dd = 0; dd < DT / 2; ++dd) {
                unsigned b0, b1, b2, b3;
                ldmatrix_x4_trans(addr_Bt<HEAD_DIM>(sK_a, 16 * kj, 16 * dd), b0, b1, b2, b3);
                mma16816<T>(acc[2 * dd], a, b0, b1);
                mma16816<T>(acc[2 * dd + 1], a, b2, b3);
            }
        }
    };

    int nb = next_visible(nb_min);
    int stage = 0;
    while (nb < nb_max) {
        cp_async_wait<0>();
        __syncthreads();
        if (load_nb < nb_max) {
            load_kv(load_nb, stage ^ 1);
            load_nb = next_visible(load_nb + 1);
        }
        cp_async_commit();
        if (needs_mask(nb))
            tile_step(nb, stage, Bool<true>{});
        else
            tile_step(nb, stage, Bool<false>{});
        nb = next_visible(nb + 1);
        stage ^= 1;
    }
    cp_async_wait<0>();

    T* out0 = dq + (((long long)b * seq_q + q_first + row0) * heads + head) * HEAD_DIM + 2 * t;
    T* out1 = out0 + 8LL * heads * HEAD_DIM;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
        if (store0) *reinterpret_cast<unsigned*>(out0 + dt * 8) = pack2<T>(acc[dt][0] * scale, acc[dt][1] * scale);
        if (store1) *reinterpret_cast<unsigned*>(out1 + dt * 8) = pack2<T>(acc[dt][2] * scale, acc[dt][3] * scale);
    }
}
