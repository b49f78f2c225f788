// Flash attention forward (FlashAttention-2 scheme) on mma.sync tensor cores, sm_80+.
//
// Layout: q [batch, seq_q, heads, HEAD_DIM], k/v [batch, seq_kv, kv_heads, HEAD_DIM], any strides on the first
// three dimensions (in elements, multiples of 8, head_dim contiguous); o is contiguous [batch, seq_q, heads,
// HEAD_DIM]; lse is float32 [batch, heads, seq_q] (natural log). kv head = head / kv_group (GQA/MQA without
// repeating K/V).
//
// Grid: (ceil(seq_q / BLOCK_M), heads, batch), the query tiles in reverse order so that the tiles with the most
// work under a causal mask start first. Block: WARPS warps; warp w owns query rows [16w, 16w + 16) of the tile.
//
// Per CTA: Q (BLOCK_M x HEAD_DIM) is copied once to shared memory, then (HEAD_DIM <= 128) into registers as
// mma A fragments; for HEAD_DIM 256 it stays in shared memory and is re-read with ldmatrix (registers go to O).
// K and V tiles (BLOCK_N x HEAD_DIM each) stream through a STAGES-deep cp.async ring: while tile j is consumed,
// tiles j+1 .. j+STAGES-1 are in flight. All tiles use the XOR swizzle of common.cuh (conflict-free ldmatrix).
// Per KV tile and warp: S = Q K^T (m16n8k16, fp32), online softmax in registers in log2 space
// (p = 2^(s * scale * log2 e - m)), P rounded to T and fed straight back as the A operand of O += P V
// (V fragments via ldmatrix.trans). At the end O / l goes through shared memory to 16-byte global stores.
//
// Masks (MASK bit flags): MASK_WINDOW covers causal (right = 0) and sliding windows in kv coordinates
// (query i sits at i + seq_kv - seq_q); MASK_SEGMENTS keeps pairs with equal segment ids. The range of KV tiles a
// query tile can see is computed up front and tiles outside it are never loaded; with segment ids a tile whose
// [min, max] id range (from the tile_id_range pre-pass) misses the query tile's is skipped too. Element masks
// run only on tiles that need them (window edges, the ragged last tile, mixed segments): the full-tile path is
// a separate template instance of the tile step with no mask code.
//
// MASK_VARLEN (common.cuh): packed sequences, q [total_q, heads, HEAD_DIM] and k/v [total_kv, kv_heads, HEAD_DIM]
// (batch strides unused), q_ids / kv_ids carrying cu_seqlens_q / cu_seqlens_k ([batch + 1]), seq_q / seq_kv
// the totals and `batch` the sequence count; grid (total query tiles of all sequences (an upper bound), heads,
// 1); o [total_q, heads, HEAD_DIM], lse [heads, total_q]; masks as above within each sequence (causal
// bottom-right per sequence). Not combined with MASK_SEGMENTS.
#include "common.cuh"

namespace attn {
constexpr int MASK_WINDOW = 1;
constexpr int MASK_SEGMENTS = 2;
}  // namespace attn

using namespace attn;

// Per (batch, tile): the min and max segment id over the tile's valid rows. One thread per tile.
extern "C" __global__ void tile_id_range(const int* __restrict__ ids, int2* __restrict__ out, int seq, int tile,
                                         int n_tiles, int batch) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_tiles * batch) return;
    const int b = i / n_tiles, t = i % n_tiles;
    const int* row = ids + (long long)b * seq;
    const int lo = t * tile, hi = min(seq, lo + tile);
    int mn = row[lo], mx = row[lo];
    for (int j = lo + 1; j < hi; ++j) {
        mn = min(mn, row[j]);
        mx = max(mx, row[j]);
    }
    out[i] = make_int2(mn, mx);
}

template <typename T, int HEAD_DIM, int BLOCK_M, int BLOCK_N, int WARPS, int STAGES, int MASK>
__global__ void __launch_bounds__(WARPS * 32, 1)
flash_fwd(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ o,
          float* __restrict__ lse, const int* __restrict__ q_ids, const int* __restrict__ kv_ids,
          const int2* __restrict__ q_tile_ids, const int2* __restrict__ kv_tile_ids, long long q_sb, long long q_ss,
          long long q_sh, long long k_sb, long long k_ss, long long k_sh, long long v_sb, long long v_ss,
          long long v_sh, int seq_q, int seq_kv, int heads, int kv_group, int window_left, int window_right,
          float scale_log2, int batch) {
    constexpr int THREADS = WARPS * 32;
    constexpr int CHUNKS = HEAD_DIM / 8;  // 16-byte chunks per row
    constexpr int NT = BLOCK_N / 8;       // 8-column tiles of S
    constexpr int DT = HEAD_DIM / 8;      // 8-column tiles of O
    constexpr int KSTEPS = HEAD_DIM / 16;
    constexpr int MW = BLOCK_M / (16 * WARPS);  // 16-row MMA tiles per warp (1 or 2)
    constexpr bool Q_IN_REGS = HEAD_DIM * MW <= 128;
    constexpr bool WINDOW = (MASK & MASK_WINDOW) != 0;
    constexpr bool SEGMENTS = (MASK & MASK_SEGMENTS) != 0;
    constexpr bool VARLEN = (MASK & MASK_VARLEN) != 0;
    static_assert(BLOCK_M == 16 * WARPS * MW && (MW == 1 || MW == 2), "each warp owns 16 or 32 query rows");
    static_assert(BLOCK_N % 16 == 0 && HEAD_DIM % 64 == 0, "tile shape");
    static_assert((BLOCK_N * CHUNKS) % THREADS == 0 && (BLOCK_M * CHUNKS) % THREADS == 0, "copy split");
    static_assert(STAGES >= 2, "the ring needs at least two stages");

    extern __shared__ __align__(128) unsigned char smem_raw[];
    T* sQ = reinterpret_cast<T*>(smem_raw);
    T* sK = sQ + BLOCK_M * HEAD_DIM;
    T* sV = sK + STAGES * BLOCK_N * HEAD_DIM;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;  // mma fragment row group / column pair
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
    const int shift = seq_kv - seq_q;  // query i sits at kv position i + shift

    const T* qb = q + b * q_sb + head * q_sh;
    const T* kb = k + b * k_sb + (head / kv_group) * k_sh;
    const T* vb = v + b * v_sb + (head / kv_group) * v_sh;

    // ---- the KV tiles this query tile can see
    const KvTileRange<BLOCK_N, WINDOW, SEGMENTS> tiles(m0, m_last, seq_q, seq_kv, window_left, window_right, q_tile_ids,
                                                       kv_tile_ids, b, m_block, gridDim.x);
    const int nb_min = tiles.nb_min, nb_max = tiles.nb_max;
    auto next_visible = [&](int nb) { return tiles.next_visible(nb); };
    auto needs_mask = [&](int nb) { return tiles.needs_mask(nb); };

    // ---- copies (global -> swizzled shared), rows past the end zero-filled
    auto load_rows = [&](T* dst, const T* src, long long stride, int row0, int rows_valid, auto rows_c) {
        constexpr int ROWS = decltype(rows_c)::value;
#pragma unroll
        for (int it = 0; it < ROWS * CHUNKS / THREADS; ++it) {
            const int i = it * THREADS + tid;
            const int row = i / CHUNKS, ch = i % CHUNKS;
            const bool ok = row0 + row < rows_valid;
            const T* from = src + (ok ? (row0 + row) * stride : 0) + ch * 8;
            cp_async16(smem_addr(dst + swizzled<HEAD_DIM>(row, ch)), from, ok);
        }
    };
    auto load_kv = [&](int nb, int stage) {
        load_rows(sK + stage * BLOCK_N * HEAD_DIM, kb, k_ss, nb * BLOCK_N, seq_kv, Int<BLOCK_N>{});
        load_rows(sV + stage * BLOCK_N * HEAD_DIM, vb, v_ss, nb * BLOCK_N, seq_kv, Int<BLOCK_N>{});
    };

    load_rows(sQ, qb, q_ss, m0, seq_q, Int<BLOCK_M>{});
    cp_async_commit();

    int load_nb = next_visible(nb_min);
    int load_stage = 0;
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (load_nb < nb_max) {
            load_kv(load_nb, load_stage);
            load_nb = next_visible(load_nb + 1);
        }
        cp_async_commit();
        load_stage = load_stage + 1 == STAGES ? 0 : load_stage + 1;
    }

    // ---- per-lane ldmatrix addresses (shared-space bytes): common.cuh's ldmatrix_lane_offsets
    constexpr int ROW_BYTES = HEAD_DIM * 2;
    const int warp_row = warp * 16 * MW;
    unsigned q_off[4], k_off[4], v_off[4];
    ldmatrix_lane_offsets<HEAD_DIM>(sQ, warp_row, sK, sV, 0, lane, q_off, k_off, v_off);
    auto q_addr = [&](int mi, int kk) { return q_off[kk & 3] + mi * 16 * ROW_BYTES + (kk >> 2) * 128; };

    unsigned qf[Q_IN_REGS ? MW : 1][Q_IN_REGS ? KSTEPS : 1][4];
    if constexpr (Q_IN_REGS) {
        cp_async_wait<STAGES - 1>();
        __syncthreads();
#pragma unroll
        for (int mi = 0; mi < MW; ++mi)
#pragma unroll
            for (int kk = 0; kk < KSTEPS; ++kk)
                ldmatrix_x4(q_addr(mi, kk), qf[mi][kk][0], qf[mi][kk][1], qf[mi][kk][2], qf[mi][kk][3]);
    }

    // ---- per-thread softmax state: rows g and g + 8 of each of the warp's MW 16-row tiles
    float o_acc[MW][DT][4];
    float row_max[MW][2], row_sum[MW][2];
    int qid[MW][2];
#pragma unroll
    for (int mi = 0; mi < MW; ++mi) {
#pragma unroll
        for (int i = 0; i < DT; ++i) o_acc[mi][i][0] = o_acc[mi][i][1] = o_acc[mi][i][2] = o_acc[mi][i][3] = 0.f;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            row_max[mi][h] = neg_inf();
            row_sum[mi][h] = 0.f;
            const int row = m0 + warp_row + mi * 16 + g + 8 * h;
            qid[mi][h] = 0;
            if constexpr (SEGMENTS) qid[mi][h] = row < seq_q ? q_ids[(long long)b * seq_q + row] : 0;
        }
    }

    // One KV tile: S = Q K^T, (mask), online softmax, O += P V.
    auto tile_step = [&](int nb, int stage, auto masked_c) {
        constexpr bool MASKED = decltype(masked_c)::value;
        const unsigned stage_bytes = stage * (BLOCK_N * ROW_BYTES);

        float s[MW][NT][4];
#pragma unroll
        for (int mi = 0; mi < MW; ++mi)
#pragma unroll
            for (int i = 0; i < NT; ++i) s[mi][i][0] = s[mi][i][1] = s[mi][i][2] = s[mi][i][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < KSTEPS; ++kk) {
            unsigned a[MW][4];
#pragma unroll
            for (int mi = 0; mi < MW; ++mi) {
                if constexpr (Q_IN_REGS) {
                    a[mi][0] = qf[mi][kk][0]; a[mi][1] = qf[mi][kk][1]; a[mi][2] = qf[mi][kk][2]; a[mi][3] = qf[mi][kk][3];
                } else {
                    ldmatrix_x4(q_addr(mi, kk), a[mi][0], a[mi][1], a[mi][2], a[mi][3]);
                }
            }
#pragma unroll
            for (int np = 0; np < NT / 2; ++np) {
                unsigned b0, b1, b2, b3;
                ldmatrix_x4(k_off[kk & 3] + stage_bytes + np * 16 * ROW_BYTES + (kk >> 2) * 128, b0, b1, b2, b3);
#pragma unroll
                for (int mi = 0; mi < MW; ++mi) {
                    mma16816<T>(s[mi][2 * np], a[mi], b0, b1);
                    mma16816<T>(s[mi][2 * np + 1], a[mi], b2, b3);
                }
            }
        }

        if constexpr (MASKED) {
#pragma unroll
            for (int mi = 0; mi < MW; ++mi)
                mask_scores<NT, WINDOW, SEGMENTS>(s[mi], nb * BLOCK_N, m0 + warp_row + mi * 16 + g + shift, seq_kv,
                                                  window_left, window_right, kv_ids + (long long)b * seq_kv, qid[mi], t);
        }

#pragma unroll
        for (int mi = 0; mi < MW; ++mi)
            online_softmax<NT, DT, MASKED>(s[mi], o_acc[mi], row_max[mi], row_sum[mi], scale_log2);

        // O += P V: the S accumulators of column tiles 2j, 2j+1 are exactly the A fragment of k-step j
#pragma unroll
        for (int kj = 0; kj < BLOCK_N / 16; ++kj) {
            unsigned a[MW][4];
#pragma unroll
            for (int mi = 0; mi < MW; ++mi) pack_a_fragment<T>(s[mi][2 * kj], s[mi][2 * kj + 1], a[mi]);
#pragma unroll
            for (int dp = 0; dp < DT / 2; ++dp) {
                unsigned b0, b1, b2, b3;
                ldmatrix_x4_trans(v_off[dp & 3] + stage_bytes + kj * 16 * ROW_BYTES + (dp >> 2) * 128, b0, b1, b2, b3);
#pragma unroll
                for (int mi = 0; mi < MW; ++mi) {
                    mma16816<T>(o_acc[mi][2 * dp], a[mi], b0, b1);
                    mma16816<T>(o_acc[mi][2 * dp + 1], a[mi], b2, b3);
                }
            }
        }
    };

    int nb = next_visible(nb_min);
    int stage = 0;
    while (nb < nb_max) {
        cp_async_wait<STAGES - 2>();  // tile nb has landed (for this thread) ...
        __syncthreads();              // ... for every thread, and every warp is done with the stage refilled next
        if (load_nb < nb_max) {
            load_kv(load_nb, load_stage);
            load_nb = next_visible(load_nb + 1);
        }
        cp_async_commit();
        load_stage = load_stage + 1 == STAGES ? 0 : load_stage + 1;

        if (needs_mask(nb))
            tile_step(nb, stage, Bool<true>{});
        else
            tile_step(nb, stage, Bool<false>{});
        nb = next_visible(nb + 1);
        stage = stage + 1 == STAGES ? 0 : stage + 1;
    }
    // Every thread's copies must have landed before O overwrites the Q rows: a CTA whose rows see no key never
    // enters the loop, and its Q copies (issued by all threads, into every warp's rows) may still be in flight.
    cp_async_wait<0>();
    __syncthreads();

    // ---- epilogue: O / l through this warp's own Q rows in shared memory, then 16-byte stores; LSE
    T* sO = sQ;
    constexpr float LN2 = 0.6931471805599453f;
#pragma unroll
    for (int mi = 0; mi < MW; ++mi) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float l = quad_sum(row_sum[mi][h]);
            const float inv = l > 0.f ? 1.f / l : 0.f;
            const int r = warp_row + mi * 16 + g + 8 * h;
#pragma unroll
            for (int dt = 0; dt < DT; ++dt)
                *reinterpret_cast<unsigned*>(sO + swizzled<HEAD_DIM>(r, dt) + 2 * t) =
                    pack2<T>(o_acc[mi][dt][2 * h] * inv, o_acc[mi][dt][2 * h + 1] * inv);
            if (t == 0 && m0 + r < seq_q)
                lse_row[m0 + r] = l > 0.f ? (row_max[mi][h] * scale_log2 + log2f(l)) * LN2 : neg_inf();
        }
    }
    __syncwarp();
#pragma unroll
    for (int it = 0; it < 16 * MW * CHUNKS / 32; ++it) {
        const int i = it * 32 + lane;
        const int r = i / CHUNKS, ch = i % CHUNKS;
        const int grow = m0 + warp_row + r;
        if (grow < seq_q) {
            T* dst = o + (((long long)b * seq_q + grow) * heads + head) * HEAD_DIM + ch * 8;
            *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(sO + swizzled<HEAD_DIM>(warp_row + r, ch));
        }
    }
}
