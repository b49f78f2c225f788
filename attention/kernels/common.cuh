// Building blocks shared by the attention kernels (forward now, backward later): element-type traits,
// cp.async copies, swizzled shared-memory addressing, ldmatrix, mma.sync m16n8k16 and ex2.approx.
// Everything here needs sm_80+ (cp.async, m16n8k16 with bf16).
#pragma once

#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace attn {

template <typename A, typename B> struct same_type { static constexpr bool value = false; };
template <typename A> struct same_type<A, A> { static constexpr bool value = true; };

// Compile-time constants passed as values (generic lambdas take them as `auto` and read ::value).
template <int N> struct Int { static constexpr int value = N; };
template <bool B> struct Bool { static constexpr bool value = B; };

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000u); }

// ---------------------------------------------------------------- element types

// Two fp32 values rounded to a packed pair of T (fp16 or bf16), low half first: the register layout that
// mma.sync's A/B operands use.
template <typename T>
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
    unsigned out;
    if constexpr (same_type<T, __half>::value) {
        __half2 h = __floats2half2_rn(lo, hi);
        out = *reinterpret_cast<unsigned*>(&h);
    } else {
        __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
        out = *reinterpret_cast<unsigned*>(&h);
    }
    return out;
}

// ---------------------------------------------------------------- math

// 2^x with the hardware approximation (ex2.approx.ftz): exp2(-inf) = +0, which masked scores rely on.
__device__ __forceinline__ float exp2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// ---------------------------------------------------------------- shared memory layout

// A tile of ROWS x COLS 16-bit elements, rows of COLS*2 bytes split in 16-byte chunks. Chunk c of row r is
// stored at chunk position c ^ (r & 7): the 8 rows an ldmatrix phase reads (same logical chunk, consecutive
// rows) land in 8 different 16-byte bank groups, and so do the 8 rows a warp's cp.async writes.
// COLS must be a multiple of 64 (at least 8 chunks per row) for the XOR to stay inside the row.
template <int COLS>
__device__ __forceinline__ int swizzled(int row, int chunk) {
    static_assert(COLS % 64 == 0, "swizzle needs rows of at least 8 chunks of 16 bytes");
    return row * COLS + ((chunk ^ (row & 7)) << 3);  // element offset
}

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// ---------------------------------------------------------------- cp.async (global -> shared, bypassing L1)

// 16 bytes; when !valid the destination is zero-filled and the source is not read.
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, bool valid) {
    int src_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// ---------------------------------------------------------------- ldmatrix

__device__ __forceinline__ void ldmatrix_x4(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2,
                                                  unsigned& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

// ---------------------------------------------------------------- mma.sync m16n8k16, fp32 accumulate

// d += a * b. a: 4 registers (16x16, row-major fragment), b: 2 registers (16x8, column-major), d: 4 floats.
template <typename T>
__device__ __forceinline__ void mma16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    if constexpr (same_type<T, __half>::value) {
        asm(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}

// ---------------------------------------------------------------- mma.sync operands from swizzled tiles

// Per-lane ldmatrix addresses (shared-space bytes) for one m16n8k16 step over swizzled HEAD_DIM-wide tiles:
// Q as A (x4: rows 0-7 / 8-15 x k lo / hi) from row q_row0, K as B (x4: n 0-7 / 8-15 x k lo / hi) and V as
// transposed B (x4: kv 0-7 / 8-15 x d lo / hi) from row kv_row0. Chunk c of a row sits at c ^ (row & 7); the
// rows a lane addresses differ by multiples of 8 and logical chunk 2kk + h = 8(kk / 4) + (2(kk % 4) + h), so only
// kk % 4 changes the XOR: four base offsets per lane and operand, the rest is an immediate offset
// ((kk / 4) * 128 bytes, plus whole rows).
template <int HEAD_DIM, typename T>
__device__ __forceinline__ void ldmatrix_lane_offsets(const T* sQ, int q_row0, const T* sK, const T* sV, int kv_row0,
                                                      int lane, unsigned (&q_off)[4], unsigned (&k_off)[4],
                                                      unsigned (&v_off)[4]) {
    const int qa_row = q_row0 + (lane & 7) + ((lane >> 3) & 1) * 8, qa_ch = lane >> 4;
    const int kb_row = kv_row0 + (lane & 7) + (lane >> 4) * 8, kb_ch = (lane >> 3) & 1;
    const int vb_row = kv_row0 + (lane & 7) + ((lane >> 3) & 1) * 8, vb_ch = lane >> 4;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        q_off[i] = smem_addr(sQ) + 2 * swizzled<HEAD_DIM>(qa_row, 2 * i + qa_ch);
        k_off[i] = smem_addr(sK) + 2 * swizzled<HEAD_DIM>(kb_row, 2 * i + kb_ch);
        v_off[i] = smem_addr(sV) + 2 * swizzled<HEAD_DIM>(vb_row, 2 * i + vb_ch);
    }
}

// The accumulators of S column tiles 2j and 2j + 1 (m16n8 C layout) are exactly the A fragment of k-step j:
// P (or dS) rounded to T and fed straight back into the next mma.
template <typename T>
__device__ __forceinline__ void pack_a_fragment(const float (&lo)[4], const float (&hi)[4], unsigned (&a)[4]) {
    a[0] = pack2<T>(lo[0], lo[1]);
    a[1] = pack2<T>(lo[2], lo[3]);
    a[2] = pack2<T>(hi[0], hi[1]);
    a[3] = pack2<T>(hi[2], hi[3]);
}

// ---------------------------------------------------------------- one S tile: masks and online softmax

// S accumulators of one warp's 16-row slice in the m16n8 C layout: acc[nt][e] is row g + 8 (e / 2), column
// 8 nt + 2 t + e % 2 of the tile (g = lane / 4, t = lane % 4), as both mma.sync and wgmma leave them.

// Element masks: columns past seq_kv, outside the window [at - left, at + right] (at = kv position of the row),
// or of another segment become -inf. q_at: kv position of row g; qid: the segment ids of rows g and g + 8.
template <int NT, bool WINDOW, bool SEGMENTS>
__device__ __forceinline__ void mask_scores(float (&acc)[NT][4], int n0, int q_at, int seq_kv, int window_left,
                                            int window_right, const int* __restrict__ kv_ids, const int (&qid)[2],
                                            int t) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int col = n0 + nt * 8 + 2 * t + (e & 1);
            bool ok = col < seq_kv;
            if constexpr (WINDOW) {
                const int at = q_at + 8 * (e >> 1);
                ok = ok && col >= at - window_left && col <= at + window_right;
            }
            if constexpr (SEGMENTS) ok = ok && __ldg(kv_ids + min(col, seq_kv - 1)) == qid[e >> 1];
            if (!ok) acc[nt][e] = neg_inf();
        }
}

// Online softmax of rows g and g + 8: the running max stays in raw score units, the exponentials are taken in
// log2 units with the scale folded in (p = 2^(s * scale_log2 - max * scale_log2)), written over S in place; the
// factor by which the O accumulators must be rescaled, 2^((old max - new max) * scale_log2), is returned in
// alpha (softmax_update) or applied at once (online_softmax); row sums stay thread-partial (the quad reduction
// happens once, at the end). A row with nothing visible yet keeps max -inf and subtracts 0 instead, so exp2
// gives 0, not NaN. The split lets a kernel compute this tile's P while the previous P @ V still accumulates.
//
// LAZY (FlashAttention-4's conditional rescaling): a row whose max grew by at most LAZY_RESCALE_LOG2 (in log2 units)
// keeps its old max as the reference, so alpha is exactly 1 and the caller may skip rescaling O; its exponentials
// are then at most 2^LAZY_RESCALE_LOG2, which the fp32 sums and the 16-bit P hold with the same relative precision.
// The LSE (finish_row) uses the reference max the sums were taken against, so it stays exact.
constexpr float LAZY_RESCALE_LOG2 = 8.f;

template <int NT, bool MASKED, bool LAZY = false>
__device__ __forceinline__ void softmax_update(float (&s)[NT][4], float (&row_max)[2], float (&row_sum)[2],
                                               float scale_log2, float (&alpha)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float mx = row_max[h];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * h], s[nt][2 * h + 1]));
        mx = quad_max(mx);
        // (false for a row with nothing visible so far, max -inf: the difference is +inf or NaN)
        const bool keep = LAZY && (mx - row_max[h]) * scale_log2 <= LAZY_RESCALE_LOG2;
        if (keep) mx = row_max[h];
        const float base = (MASKED && mx == neg_inf()) ? 0.f : mx * scale_log2;
        alpha[h] = keep ? 1.f : exp2_approx(row_max[h] * scale_log2 - base);
        row_max[h] = mx;
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            s[nt][2 * h] = exp2_approx(fmaf(s[nt][2 * h], scale_log2, -base));
            s[nt][2 * h + 1] = exp2_approx(fmaf(s[nt][2 * h + 1], scale_log2, -base));
            sum += s[nt][2 * h] + s[nt][2 * h + 1];
        }
        row_sum[h] = fmaf(row_sum[h], alpha[h], sum);
    }
}

template <int DT>
__device__ __forceinline__ void rescale_rows(float (&o)[DT][4], const float (&alpha)[2]) {
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
        o[dt][0] *= alpha[0];
        o[dt][1] *= alpha[0];
        o[dt][2] *= alpha[1];
        o[dt][3] *= alpha[1];
    }
}

// The starting state of rows g and g + 8 of a warp's 16 (query rows row_g and row_g + 8): O zero, max -inf, sums
// zero, and the rows' segment ids (ids_b: this batch element's query ids; 0 past seq_q or without segments).
template <int DT, bool SEGMENTS>
__device__ __forceinline__ void init_rows(float (&o)[DT][4], float (&row_max)[2], float (&row_sum)[2], int (&qid)[2],
                                          int row_g, int seq_q, const int* __restrict__ ids_b) {
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        row_max[h] = neg_inf();
        row_sum[h] = 0.f;
        const int row = row_g + 8 * h;
        qid[h] = 0;
        if constexpr (SEGMENTS) qid[h] = row < seq_q ? ids_b[row] : 0;
    }
}

// The end of a row: its sum over the quad (the partial sums of online_softmax), 1 / sum in inv (0 for a row that saw
// no key, whose output is then zeros) and the row's LSE in natural log (-inf for such a row).
__device__ __forceinline__ float finish_row(float partial_sum, float row_max, float scale_log2, float& inv) {
    constexpr float LN2 = 0.6931471805599453f;
    const float l = quad_sum(partial_sum);
    inv = l > 0.f ? 1.f / l : 0.f;
    return l > 0.f ? (row_max * scale_log2 + log2f(l)) * LN2 : neg_inf();
}

template <int NT, int DT, bool MASKED>
__device__ __forceinline__ void online_softmax(float (&s)[NT][4], float (&o)[DT][4], float (&row_max)[2],
                                               float (&row_sum)[2], float scale_log2) {
    float alpha[2];
    softmax_update<NT, MASKED>(s, row_max, row_sum, scale_log2, alpha);
    rescale_rows<DT>(o, alpha);
}

// ---------------------------------------------------------------- packed variable-length batches

// MASK_VARLEN (a kernel template bit, beside the forward's MASK_WINDOW = 1 and MASK_SEGMENTS = 2): the batch is
// packed, sequence b holding rows [cu[b], cu[b + 1]) of [total, heads, head_dim] tensors (cu_seqlens, int32
// [batch + 1]), and one grid dimension runs over every sequence's tiles in order, so no CTA works on padding.
// A kernel maps its tile, moves its q/k/v/output pointers to the sequence's first row, takes the sequence's
// lengths as seq_q / seq_kv and then runs as for batch element 0.
constexpr int MASK_VARLEN = 4;

struct VarlenSeq {
    int start, len;
};

// Sequence b's rows, clamped to [0, total): invalid cu_seqlens (decreasing, past the packed rows) never reach
// outside the tensors (they give empty or shortened sequences).
__device__ __forceinline__ VarlenSeq varlen_seq(const int* __restrict__ cu, int b, int total) {
    const int start = min(max(__ldg(cu + b), 0), total);
    return {start, min(max(__ldg(cu + b + 1), start), total) - start};
}

// Tile t of all sequences' tiles of BLOCK rows (sequence 0's first; rows clamped to [0, total)) -> (b, tile
// within sequence b); false when t is past the last tile. A warp-wide scan over 32 sequences per step: every lane
// of the warp must call it.
template <int BLOCK>
__device__ __forceinline__ bool varlen_tile(const int* __restrict__ cu, int batch, int total, int t, int& b,
                                            int& tile) {
    const int lane = threadIdx.x & 31;
    int base = 0;  // tiles of the sequences before this step's 32
    for (int c = 0; c < batch; c += 32) {
        const int n = c + lane < batch ? (varlen_seq(cu, c + lane, total).len + BLOCK - 1) / BLOCK : 0;
        int incl = n;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, incl, off);
            if (lane >= off) incl += y;
        }
        const unsigned hit = __ballot_sync(0xffffffffu, t < base + incl);
        if (hit) {
            const int l = __ffs(hit) - 1;
            b = c + l;
            tile = t - base - __shfl_sync(0xffffffffu, incl - n, l);
            return true;
        }
        base += __shfl_sync(0xffffffffu, incl, 31);
    }
    return false;
}

// The MASK_VARLEN prologue of a forward-like CTA (one query tile, walking KV tiles): query tile blockIdx.x of all
// sequences' BLOCK_M-row tiles -> its sequence; q, k, v and o move to the sequence's first rows, lse_row to its
// row of lse [heads, total_q], seq_q / seq_kv become its lengths, m_block its tile (a sequence's last, under a
// causal mask the heaviest, first) and b 0. False past the last tile: the CTA has no work.
template <int BLOCK_M, int HEAD_DIM, typename T>
__device__ __forceinline__ bool varlen_enter_query_tile(const int* __restrict__ cu_q, const int* __restrict__ cu_kv,
                                                        int batch, int heads, int head, int& b, int& m_block,
                                                        int& seq_q, int& seq_kv, const T* __restrict__& q,
                                                        const T* __restrict__& k, const T* __restrict__& v,
                                                        T* __restrict__& o, float*& lse_row,
                                                        float* __restrict__ lse, long long q_ss, long long k_ss,
                                                        long long v_ss) {
    int tile;
    if (!varlen_tile<BLOCK_M>(cu_q, batch, seq_q, blockIdx.x, b, tile)) return false;
    const VarlenSeq sq = varlen_seq(cu_q, b, seq_q), sk = varlen_seq(cu_kv, b, seq_kv);
    lse_row = lse + (long long)head * seq_q + sq.start;
    seq_q = sq.len;
    seq_kv = sk.len;
    m_block = (seq_q + BLOCK_M - 1) / BLOCK_M - 1 - tile;
    q += (long long)sq.start * q_ss;
    k += (long long)sk.start * k_ss;
    v += (long long)sk.start * v_ss;
    o += (long long)sq.start * heads * HEAD_DIM;
    b = 0;
    return true;
}

// ---------------------------------------------------------------- which KV tiles a query tile sees

// For the query tile of rows [m0, m_last] (query i sits at kv position i + seq_kv - seq_q): the KV tiles
// [nb_min, nb_max) that the causal/window bounds leave, `next_visible` skipping tiles whose segment-id range
// (tile_id_range pre-pass) cannot meet the query tile's, and `needs_mask`: whether a tile needs element masks
// (ragged end, window edges, mixed segments) or can take the mask-free path. Shared by the forward kernels and
// the backward's dQ kernel, which all walk KV tiles for one query tile.
template <int BLOCK_N, bool WINDOW, bool SEGMENTS>
struct KvTileRange {
    int nb_min, nb_max;
    int m0, m_last, shift, seq_kv, window_left, window_right;
    int2 q_range;
    const int2* kv_ranges;  // [n_kv_tiles] of this batch element

    __device__ __forceinline__ KvTileRange(int m0_, int m_last_, int seq_q, int seq_kv_, int window_left_,
                                           int window_right_, const int2* q_tile_ids, const int2* kv_tile_ids,
                                           int b, int m_block, int m_tiles)
        : m0(m0_), m_last(m_last_), shift(seq_kv_ - seq_q), seq_kv(seq_kv_), window_left(window_left_),
          window_right(window_right_), q_range(make_int2(0, 0)), kv_ranges(nullptr) {
        int n_lo = 0, n_hi = seq_kv;
        if constexpr (WINDOW) {
            n_lo = max(0, m0 + shift - window_left);
            n_hi = min(seq_kv, m_last + shift + window_right + 1);
        }
        nb_min = n_lo / BLOCK_N;
        nb_max = n_hi > n_lo ? (n_hi + BLOCK_N - 1) / BLOCK_N : nb_min;
        if constexpr (SEGMENTS) {
            q_range = q_tile_ids[b * m_tiles + m_block];
            kv_ranges = kv_tile_ids + b * ((seq_kv + BLOCK_N - 1) / BLOCK_N);
        }
    }

    __device__ __forceinline__ int next_visible(int nb) const {
        if constexpr (SEGMENTS) {
            while (nb < nb_max) {
                const int2 r = kv_ranges[nb];
                if (r.x <= q_range.y && q_range.x <= r.y) break;
                ++nb;
            }
        }
        return nb;
    }

    __device__ __forceinline__ bool needs_mask(int nb) const {
        const int n0 = nb * BLOCK_N;
        bool mask = n0 + BLOCK_N > seq_kv;
        if constexpr (WINDOW) {
            mask |= n0 + BLOCK_N - 1 > m0 + shift + window_right;
            mask |= n0 < m_last + shift - window_left;
        }
        if constexpr (SEGMENTS) {
            const int2 r = kv_ranges[nb];
            mask |= !(q_range.x == q_range.y && r.x == r.y && r.x == q_range.x);
        }
        return mask;
    }
};

}  // namespace attn
