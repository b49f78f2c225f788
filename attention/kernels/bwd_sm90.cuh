// The per-step products of the Hopper dK/dV kernels in which each warpgroup owns 64 KV rows
// (flash_bwd_dkdv_wgmma in flash_bwd_sm90.cu, fed by cp.async; flash_bwd_tma, fed by TMA from a producer warp);
// the head-dim-256 pair kernel calls issue_dkdv, store_ds_t and issue_dq on its head-dim halves.
// Tiles are in shared memory as 64-element blocks of 128-byte rows with the 128-byte swizzle (wgmma.cuh): K and V
// of BLOCK_N rows, Q and dO of BLOCK_M rows, dS^T of BLOCK_N rows x BLOCK_M columns. For one warpgroup and one
// (q head, query tile), with S^T and dP^T [64 kv rows x BLOCK_M queries] in the m64nBLOCK_M accumulator layout:
//   issue_sdp   S^T = K_w Q^T and dP^T = V_w dO^T, two wgmma groups (not waited for); issue_one_t: one of them
//               (FRESH: the first k-step's product starts the sums instead of zeroed registers, for a caller that
//               issues it while other groups are in flight: zeroing there makes ptxas serialise wgmma, C7515)
//   form_p      after wait<1>: P^T = 2^(S^T scale log2e - lse2[query]) in place, and rounded to T
//   form_ds     after wait<0>: dS^T = P^T (dP^T - D[query]) rounded to T
//   issue_dkdv  dV += P^T dO, dK += dS^T Q (A from registers, dO and Q MN-major), one group (mma_rs_group:
//               one of the two, for a caller that fences and commits)
//   store_ds_t  dS^T into the shared dS^T tile (the dQ product's A operand); load_ds_t back into registers
//   hand_p, take_p, form_ds_handed: the pair kernels' fp32 P^T hand-off between their warpgroups
//   issue_dq    a 64 x DQ_N slice of dQ_tile = dS K (both operands MN-major), one group
//   store_dkdv  dK * scale and dV from the accumulators to global memory at the end
#pragma once

#include "bwd_common.cuh"
#include "sm90_common.cuh"

namespace attn {

// acc += A_w B^T over the head dim, one wgmma group (not committed here): A = K or V (BLOCK_N rows), B = Q or dO
// (N query rows), both K-major. FRESH: acc = A_w B^T (the first k-step does not add).
template <typename T, int HEAD_DIM, int BLOCK_M, int BLOCK_N, int N, bool FRESH = false>
__device__ __forceinline__ void mma_t_group(float (&acc)[N / 2], unsigned long long a_desc,
                                            unsigned long long b_desc) {
#pragma unroll
    for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
        const unsigned long long a = wgmma::advance(a_desc, (kk >> 2) * (BLOCK_N * 128) + (kk & 3) * 32);
        const unsigned long long b = wgmma::advance(b_desc, (kk >> 2) * (BLOCK_M * 128) + (kk & 3) * 32);
        if constexpr (FRESH)
            wgmma::mma_ss<T, N>(acc, a, b, kk != 0);
        else
            wgmma::mma_ss<T, N>(acc, a, b);
    }
}

template <typename T, int HEAD_DIM, int BLOCK_M, int BLOCK_N>
__device__ __forceinline__ void issue_sdp(float (&s)[BLOCK_M / 2], float (&dp)[BLOCK_M / 2], unsigned k_wg,
                                          unsigned v_wg, unsigned q_st, unsigned do_st) {
#pragma unroll
    for (int i = 0; i < BLOCK_M / 2; ++i) s[i] = dp[i] = 0.f;
    wgmma::fence_operands(s);
    wgmma::fence_operands(dp);
    // one descriptor per operand, advanced by constants per k-step (registers: see wgmma::advance)
    const unsigned long long k_desc = wgmma::desc_k_major(k_wg), v_desc = wgmma::desc_k_major(v_wg);
    const unsigned long long q_desc = wgmma::desc_k_major(q_st), do_desc = wgmma::desc_k_major(do_st);
    wgmma::fence();
    mma_t_group<T, HEAD_DIM, BLOCK_M, BLOCK_N, BLOCK_M>(s, k_desc, q_desc);
    wgmma::commit();
    mma_t_group<T, HEAD_DIM, BLOCK_M, BLOCK_N, BLOCK_M>(dp, v_desc, do_desc);
    wgmma::commit();
}

// One of issue_sdp's products, one group: S^T = K_w Q^T (a_wg = K, b_st = Q) or dP^T = V_w dO^T (V, dO).
template <typename T, int HEAD_DIM, int BLOCK_M, int BLOCK_N, bool FRESH = false>
__device__ __forceinline__ void issue_one_t(float (&acc)[BLOCK_M / 2], unsigned a_wg, unsigned b_st) {
    if constexpr (!FRESH) {
#pragma unroll
        for (int i = 0; i < BLOCK_M / 2; ++i) acc[i] = 0.f;
    }
    wgmma::fence_operands(acc);
    const unsigned long long a_desc = wgmma::desc_k_major(a_wg), b_desc = wgmma::desc_k_major(b_st);
    wgmma::fence();
    mma_t_group<T, HEAD_DIM, BLOCK_M, BLOCK_N, BLOCK_M, FRESH>(acc, a_desc, b_desc);
    wgmma::commit();
}

// lrow: the step's BLOCK_M lse2 values (log2 units; +inf for rows with no visible key or past the sequence).
template <typename T, int MT>
__device__ __forceinline__ void form_p(float (&s)[MT][4], unsigned (&p_pk)[MT][2], const float* lrow,
                                       float scale_log2, int t) {
#pragma unroll
    for (int j = 0; j < MT; ++j) {
        const float2 l = *reinterpret_cast<const float2*>(lrow + 8 * j + 2 * t);
        s[j][0] = exp2_approx(fmaf(s[j][0], scale_log2, -l.x));
        s[j][1] = exp2_approx(fmaf(s[j][1], scale_log2, -l.y));
        s[j][2] = exp2_approx(fmaf(s[j][2], scale_log2, -l.x));
        s[j][3] = exp2_approx(fmaf(s[j][3], scale_log2, -l.y));
        p_pk[j][0] = pack2<T>(s[j][0], s[j][1]);
        p_pk[j][1] = pack2<T>(s[j][2], s[j][3]);
    }
}

// drow: the step's BLOCK_M values of D = rowsum(dO * O) (0 past the sequence).
template <typename T, int MT>
__device__ __forceinline__ void form_ds(const float (&p)[MT][4], const float (&dp)[MT][4], unsigned (&ds_pk)[MT][2],
                                        const float* drow, int t) {
#pragma unroll
    for (int j = 0; j < MT; ++j) {
        const float2 d = *reinterpret_cast<const float2*>(drow + 8 * j + 2 * t);
        ds_pk[j][0] = pack2<T>(p[j][0] * (dp[j][0] - d.x), p[j][1] * (dp[j][1] - d.y));
        ds_pk[j][1] = pack2<T>(p[j][2] * (dp[j][2] - d.x), p[j][3] * (dp[j][3] - d.y));
    }
}

// The head-dim-256 pair kernels' fp32 P^T hand-off from warpgroup 0 (which computed it) to warpgroup 1 (which
// holds dP^T in the same accumulator layout): ``hand`` is this thread's slot of a [MT][4][128 threads] float array
// in shared memory, the same slot for the handing and the taking thread (tid % 128).
template <int MT>
__device__ __forceinline__ void hand_p(float* hand, const float (&p)[MT][4]) {
#pragma unroll
    for (int j = 0; j < MT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) hand[(4 * j + e) * 128] = p[j][e];
}

// Warpgroup 1: P^T from the hand-off rounded to T (the dV product's A).
template <typename T, int MT>
__device__ __forceinline__ void take_p(const float* hand, unsigned (&p_pk)[MT][2]) {
#pragma unroll
    for (int j = 0; j < MT; ++j) {
        p_pk[j][0] = pack2<T>(hand[(4 * j) * 128], hand[(4 * j + 1) * 128]);
        p_pk[j][1] = pack2<T>(hand[(4 * j + 2) * 128], hand[(4 * j + 3) * 128]);
    }
}

// Warpgroup 1: form_ds with P^T read from the hand-off (not held in registers beside dP^T).
template <typename T, int MT>
__device__ __forceinline__ void form_ds_handed(const float* hand, const float (&dp)[MT][4],
                                               unsigned (&ds_pk)[MT][2], const float* drow, int t) {
#pragma unroll
    for (int j = 0; j < MT; ++j) {
        const float2 d = *reinterpret_cast<const float2*>(drow + 8 * j + 2 * t);
        ds_pk[j][0] = pack2<T>(hand[(4 * j) * 128] * (dp[j][0] - d.x), hand[(4 * j + 1) * 128] * (dp[j][1] - d.y));
        ds_pk[j][1] = pack2<T>(hand[(4 * j + 2) * 128] * (dp[j][2] - d.x), hand[(4 * j + 3) * 128] * (dp[j][3] - d.y));
    }
}

// acc += A B over the BLOCK_M queries with A = P^T or dS^T from registers (accumulator layout of S^T) and B = dO
// or Q (MN-major), no fence or commit: dV += P^T dO (p_pk, do_st) or dK += dS^T Q (ds_pk, q_st).
template <typename T, int HEAD_DIM, int BLOCK_M>
__device__ __forceinline__ void mma_rs_group(float (&acc)[HEAD_DIM / 2], const unsigned (&a_pk)[BLOCK_M / 8][2],
                                             unsigned b_st) {
    const unsigned long long b_desc = wgmma::desc_mn_major(b_st, BLOCK_M * 128);
#pragma unroll
    for (int kq = 0; kq < BLOCK_M / 16; ++kq) {
        const unsigned a[4] = {a_pk[2 * kq][0], a_pk[2 * kq][1], a_pk[2 * kq + 1][0], a_pk[2 * kq + 1][1]};
        wgmma::mma_rs_bt<T, HEAD_DIM>(acc, a, wgmma::advance(b_desc, kq * 16 * 128));
    }
}

template <typename T, int HEAD_DIM, int BLOCK_M>
__device__ __forceinline__ void issue_dkdv(float (&dv)[HEAD_DIM / 2], float (&dk)[HEAD_DIM / 2],
                                           const unsigned (&p_pk)[BLOCK_M / 8][2],
                                           const unsigned (&ds_pk)[BLOCK_M / 8][2], unsigned q_st, unsigned do_st) {
    wgmma::fence();
    mma_rs_group<T, HEAD_DIM, BLOCK_M>(dv, p_pk, do_st);
    mma_rs_group<T, HEAD_DIM, BLOCK_M>(dk, ds_pk, q_st);
    wgmma::commit();
}

// This thread's dS^T values (kv rows row and row + 8 of the BLOCK_N-row tile) -> the tile at ds_base (generic
// address); the caller fences (wgmma::fence_proxy_async) and synchronises before wgmma reads it.
template <int BLOCK_N, int MT>
__device__ __forceinline__ void store_ds_t(unsigned char* ds_base, const unsigned (&ds_pk)[MT][2], int row, int t) {
#pragma unroll
    for (int j = 0; j < MT; ++j) {
        *reinterpret_cast<unsigned*>(ds_base + wgmma::blocked_offset<BLOCK_N>(row, j) + 4 * t) = ds_pk[j][0];
        *reinterpret_cast<unsigned*>(ds_base + wgmma::blocked_offset<BLOCK_N>(row + 8, j) + 4 * t) = ds_pk[j][1];
    }
}

// store_ds_t's inverse: this thread's dS^T values back from the tile (another warpgroup stored them).
template <int BLOCK_N, int MT>
__device__ __forceinline__ void load_ds_t(const unsigned char* ds_base, unsigned (&ds_pk)[MT][2], int row, int t) {
#pragma unroll
    for (int j = 0; j < MT; ++j) {
        ds_pk[j][0] = *reinterpret_cast<const unsigned*>(ds_base + wgmma::blocked_offset<BLOCK_N>(row, j) + 4 * t);
        ds_pk[j][1] = *reinterpret_cast<const unsigned*>(ds_base + wgmma::blocked_offset<BLOCK_N>(row + 8, j) + 4 * t);
    }
}

// dQ[64 queries, DQ_N columns] = dS K over the BLOCK_N kv rows: ds_rows = the dS^T tile at its first query
// column of the slice (a 64-column block), k_cols = K at the slice's first head-dim block; zeroed first.
template <typename T, int BLOCK_N, int DQ_N>
__device__ __forceinline__ void issue_dq(float (&dq)[DQ_N / 2], unsigned ds_rows, unsigned k_cols) {
#pragma unroll
    for (int i = 0; i < DQ_N / 2; ++i) dq[i] = 0.f;
    wgmma::fence_operands(dq);
    const unsigned long long ds_desc = wgmma::desc_mn_major(ds_rows, BLOCK_N * 128);
    const unsigned long long kt_desc = wgmma::desc_mn_major(k_cols, BLOCK_N * 128);
    wgmma::fence();
#pragma unroll
    for (int kn = 0; kn < BLOCK_N / 16; ++kn)
        wgmma::mma_ss_tt<T, DQ_N>(dq, wgmma::advance(ds_desc, kn * 16 * 128), wgmma::advance(kt_desc, kn * 16 * 128));
    wgmma::commit();
}

// Two fp32 adds into global memory (the dQ accumulator), no return value.
__device__ __forceinline__ void red_add_v2(float* addr, float a, float b) {
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(addr), "f"(a), "f"(b) : "memory");
}

// dV and dK * scale (accumulators of NT 8-column tiles, rows kv_row and kv_row + 8, columns 8 j + 2 t (+1)
// from the given row pointers) rounded to T; rows past seq_kv are not written.
template <typename T, int NT>
__device__ __forceinline__ void store_dkdv(const float (&dv_acc)[NT * 4], const float (&dk_acc)[NT * 4], T* dv_row,
                                           T* dk_row, long long step8, int kv_row, int seq_kv, float scale) {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            if (kv_row + 8 * h < seq_kv) {
                *reinterpret_cast<unsigned*>(dv_row + h * step8 + 8 * j) =
                    pack2<T>(dv_acc[4 * j + 2 * h], dv_acc[4 * j + 2 * h + 1]);
                *reinterpret_cast<unsigned*>(dk_row + h * step8 + 8 * j) =
                    pack2<T>(dk_acc[4 * j + 2 * h] * scale, dk_acc[4 * j + 2 * h + 1] * scale);
            }
        }
    }
}

}  // namespace attn
