// Helpers for the backward kernels, on top of common.cuh (which the forward owns): a swizzle that also covers
// 32-column tiles (the P / dS tiles when a query tile has 32 rows), per-lane ldmatrix addresses for the four
// ways an mma.sync m16n8k16 operand is read from a swizzled tile, and unpacking of T pairs to fp32.
#pragma once

#include "common.cuh"

namespace attn {

// Element offset of 16-byte chunk `chunk` of row `row` in a swizzled ROWS x COLS tile. COLS >= 64: common.cuh's
// XOR with row & 7. COLS == 32 (4 chunks per row, two rows per 128-byte line): chunk ^ ((row >> 1) & 3), so the
// 8 consecutive rows an ldmatrix phase reads still land in 8 different 16-byte bank groups.
template <int COLS>
__device__ __forceinline__ int swz(int row, int chunk) {
    if constexpr (COLS >= 64) {
        return swizzled<COLS>(row, chunk);
    } else {
        static_assert(COLS == 32, "tiles of 32 or a multiple of 64 columns");
        return row * 32 + ((chunk ^ ((row >> 1) & 3)) << 3);
    }
}

// Shared-space byte address that this lane passes to ldmatrix_x4 for one 16x16 operand block.
//   A  : A[m][k] stored row-major [m][COLS]      -> a0..a3 of mma's A      (ldmatrix)
//   At : A[m][k] stored transposed [k][COLS=m]   -> a0..a3                 (ldmatrix.trans)
//   B  : B[k][n] stored as rows of n: [n][COLS=k] -> b0,b1 of n-tile 0, b0,b1 of n-tile 1 (ldmatrix)
//   Bt : B[k][n] stored row-major [k][COLS=n]    -> same order             (ldmatrix.trans)
template <int COLS>
__device__ __forceinline__ unsigned addr_A(unsigned base, int m0, int k0) {
    const int lane = threadIdx.x & 31;
    return base + 2 * swz<COLS>(m0 + (lane & 7) + ((lane >> 3) & 1) * 8, (k0 >> 3) + (lane >> 4));
}
template <int COLS>
__device__ __forceinline__ unsigned addr_At(unsigned base, int m0, int k0) {
    const int lane = threadIdx.x & 31;
    return base + 2 * swz<COLS>(k0 + (lane & 7) + (lane >> 4) * 8, (m0 >> 3) + ((lane >> 3) & 1));
}
template <int COLS>
__device__ __forceinline__ unsigned addr_B(unsigned base, int n0, int k0) {
    const int lane = threadIdx.x & 31;
    return base + 2 * swz<COLS>(n0 + (lane & 7) + (lane >> 4) * 8, (k0 >> 3) + ((lane >> 3) & 1));
}
template <int COLS>
__device__ __forceinline__ unsigned addr_Bt(unsigned base, int k0, int n0) {
    const int lane = threadIdx.x & 31;
    return base + 2 * swz<COLS>(k0 + (lane & 7) + ((lane >> 3) & 1) * 8, (n0 >> 3) + (lane >> 4));
}

// A packed pair of T (low half first) as two floats.
template <typename T>
__device__ __forceinline__ float2 unpack2(unsigned u) {
    if constexpr (same_type<T, __half>::value) {
        return __half22float2(*reinterpret_cast<__half2*>(&u));
    } else {
        return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&u));
    }
}

__device__ __forceinline__ float pos_inf() { return __int_as_float(0x7f800000); }

// The preprocess's per-row math (flash_bwd_preprocess, and flash_bwd_tma's backward_prologue, which must give the
// same bits): acc plus the fp32 products of 8 columns of o and dO (one 16-byte load of each), in pairs; and the
// row's lse in log2 units, +inf for a row that saw no key (lse = -inf).
template <typename T>
__device__ __forceinline__ float dot8(uint4 a, uint4 d, float acc) {
    const unsigned av[4] = {a.x, a.y, a.z, a.w}, dv[4] = {d.x, d.y, d.z, d.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const float2 x = unpack2<T>(av[j]), y = unpack2<T>(dv[j]);
        acc = fmaf(x.x, y.x, fmaf(x.y, y.y, acc));
    }
    return acc;
}
__device__ __forceinline__ float lse_to_lse2(float lse) {
    constexpr float LOG2E = 1.4426950408889634f;
    return lse == neg_inf() ? pos_inf() : lse * LOG2E;
}

// The (KV tile, kv head) of this dK/dV CTA, grid (KV tiles, kv heads, batch): consecutive CTAs walk the kv
// heads before the KV tiles, so under a causal mask the heaviest CTAs (tile 0 sees every query tile) start in
// the first wave for every head instead of one head's light tiles filling it (longest job first).
__device__ __forceinline__ void kv_block_coords(int& nb, int& kvh) {
    const int lin = blockIdx.y * gridDim.x + blockIdx.x;
    nb = lin / gridDim.y;
    kvh = lin % gridDim.y;
}

// The same order within chunks of `chunk` kv heads (the last chunk may be smaller): all KV tiles of the chunk's
// heads, heaviest first, before the next chunk's. chunk = kv_heads is the order above; smaller chunks keep the
// heads that run at once (and the dQ rows they add into) fewer, so they stay in L2.
__device__ __forceinline__ void kv_block_coords(int& nb, int& kvh, int chunk) {
    const int lin = blockIdx.y * gridDim.x + blockIdx.x;
    const int first = lin / (chunk * gridDim.x) * chunk;  // the chunk's first kv head
    const int heads = min(chunk, (int)gridDim.y - first);
    const int r = lin - first * gridDim.x;
    nb = r / heads;
    kvh = first + r % heads;
}

// MASK_VARLEN: the lse2 / D rows of sequence b start at align4(cu[b]) + b * VARLEN_PAD (16-byte aligned for the
// cp.async loads of 4 floats), each sequence followed by padding rows (D = 0, lse2 = +inf) up to the next one's
// start, at least VARLEN_PAD - 3 of them, so a query tile's loads (block_m <= 128 rows) never reach the next
// sequence's rows. The arrays are [heads, align4(total_q) + batch * VARLEN_PAD].
constexpr int VARLEN_PAD = 132;

__device__ __forceinline__ long long varlen_pad_start(int start, int b) {
    return ((start + 3) & ~3) + (long long)b * VARLEN_PAD;
}

constexpr int BWD_MASK_WINDOW = 1;  // same bits as the forward's MASK_WINDOW / MASK_SEGMENTS
constexpr int BWD_MASK_SEGMENTS = 2;

// For the KV tile [n0, n0 + BLOCK_N) of one dK/dV CTA: the (q head in the GQA group, query tile) pairs it walks,
// numbered head-major (it = head_in_group * n_m + query tile - mb_min), limited to the query tiles the
// causal/window bounds leave (query i sees kv j when j - shift - right <= i <= j - shift + left),
// `next_visible` skipping tiles whose segment-id range (tile_id_range pre-pass, built with this kernel's own
// tile sizes) cannot meet the KV tile's, and `needs_mask` telling the tiles that need element masks. The
// backward counterpart of common.cuh's KvTileRange; used by both dK/dV kernels.
template <int BLOCK_M, int BLOCK_N, bool WINDOW, bool SEGMENTS>
struct QTileRange {
    int mb_min, n_m, total, n_q_tiles;
    int n0, seq_q, seq_kv, shift, window_left, window_right;
    int2 kv_range;
    const int2* q_ranges;  // [n_q_tiles] of this batch element

    __device__ __forceinline__ QTileRange(int n0_, int seq_q_, int seq_kv_, int window_left_, int window_right_,
                                          const int2* q_tile_ids, const int2* kv_tile_ids, int b, int nb,
                                          int n_kv_tiles, int kv_group)
        : n0(n0_), seq_q(seq_q_), seq_kv(seq_kv_), shift(seq_kv_ - seq_q_), window_left(window_left_),
          window_right(window_right_), kv_range(make_int2(0, 0)), q_ranges(nullptr) {
        n_q_tiles = (seq_q + BLOCK_M - 1) / BLOCK_M;
        const int n_last = min(n0 + BLOCK_N, seq_kv) - 1;
        int i_lo = 0, i_hi = seq_q - 1;
        if constexpr (WINDOW) {
            i_lo = max(0, n0 - shift - window_right);
            i_hi = min(seq_q - 1, n_last - shift + window_left);
        }
        mb_min = i_lo / BLOCK_M;
        n_m = i_hi >= i_lo ? i_hi / BLOCK_M + 1 - mb_min : 0;
        total = n_m * kv_group;
        if constexpr (SEGMENTS) {
            kv_range = kv_tile_ids[b * n_kv_tiles + nb];
            q_ranges = q_tile_ids + b * n_q_tiles;
        }
    }

    __device__ __forceinline__ int head_in_group(int it) const { return it / n_m; }
    // rot: the query tile a CTA starts at (then wrapping around), so CTAs of one head that run at once add into
    // different dQ rows (the TMA kernel sets it; 0 keeps the plain order)
    int rot = 0;
    __device__ __forceinline__ int m_block(int it) const {
        const int i = it % n_m + rot;
        return mb_min + (i < n_m ? i : i - n_m);
    }

    __device__ __forceinline__ int next_visible(int it) const {
        if constexpr (SEGMENTS) {
            while (it < total) {
                const int2 r = q_ranges[m_block(it)];
                if (r.x <= kv_range.y && kv_range.x <= r.y) break;
                ++it;
            }
        }
        return it;
    }

    __device__ __forceinline__ bool needs_mask(int mb) const {
        const int m0 = mb * BLOCK_M, m_last = min(m0 + BLOCK_M, seq_q) - 1;
        bool mask = n0 + BLOCK_N > seq_kv;
        if constexpr (WINDOW) {
            mask |= n0 + BLOCK_N - 1 > m0 + shift + window_right;
            mask |= n0 < m_last + shift - window_left;
        }
        if constexpr (SEGMENTS) {
            const int2 r = q_ranges[mb];
            mask |= !(r.x == r.y && kv_range.x == kv_range.y && r.x == kv_range.x);
        }
        return mask;
    }
};

// Element masks of a transposed score tile S^T (rows = kv positions, columns = queries), in the m16n8 C layout
// of one warp's 16 rows: acc[nt][e] is kv row kv_row + 8 (e / 2), query column q0 + 8 nt + 2 t + e % 2.
// Entries whose kv row is past seq_kv, outside the query's window [at - left, at + right] (at = query + shift),
// or of another segment become -inf. Query columns past seq_q need no mask (their lse2 is +inf, so P = 0).
// kvid: the segment ids of kv rows kv_row and kv_row + 8; q_ids: this batch element's query ids.
template <int NT, bool WINDOW, bool SEGMENTS>
__device__ __forceinline__ void mask_scores_t(float (&acc)[NT][4], int q0, int kv_row, int seq_q, int seq_kv,
                                              int shift, int window_left, int window_right,
                                              const int* __restrict__ q_ids, const int (&kvid)[2], int t) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int col = q0 + nt * 8 + 2 * t + (e & 1);
            const int row = kv_row + 8 * (e >> 1);
            bool ok = row < seq_kv;
            if constexpr (WINDOW) {
                const int at = col + shift;
                ok = ok && row >= at - window_left && row <= at + window_right;
            }
            if constexpr (SEGMENTS) ok = ok && __ldg(q_ids + min(col, seq_q - 1)) == kvid[e >> 1];
            if (!ok) acc[nt][e] = neg_inf();
        }
}

}  // namespace attn
