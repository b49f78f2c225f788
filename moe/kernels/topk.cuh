// Top-k selection of one row of router logits by one warp: what moe_route (route.cu) runs per token and the
// decode layer's one-launch kernel (grouped_gemm.cu, moe_decode_skinny) runs per token of its batch, so both
// choose the same experts with the same weights, bit for bit.
#pragma once
#include "common.cuh"

template <typename T, int EPL>
__device__ __forceinline__ void load_row(const T* __restrict__ logits, long long token, int experts, int lane,
                                         float (&x)[EPL]) {
    const T* row = logits + token * experts;
#pragma unroll
    for (int j = 0; j < EPL; ++j) {
        const int e = lane + 32 * j;
        x[j] = (e < experts) ? Elem<T>::to_f32(row[e]) : __int_as_float(0xff800000);  // -inf
    }
}

// This lane's best (key, MAX_E - expert) among its experts not yet taken; (0, 0) when none is left.
template <int EPL, int MAX_E>
__device__ __forceinline__ void lane_head(const unsigned (&khi)[EPL], unsigned taken, int lane, int experts,
                                          unsigned& hh, unsigned& hl) {
    hh = 0u, hl = 0u;
#pragma unroll
    for (int j = 0; j < EPL; ++j) {
        const int e = lane + 32 * j;
        const bool live = e < experts && !((taken >> j) & 1u);
        // strict >: among equal keys the lower j (lower expert) stays
        if (live && (hl == 0u || khi[j] > hh)) hh = khi[j], hl = unsigned(MAX_E - e);
    }
}

// Top-k of one row held as lane l: experts l, l + 32, ... (x, -inf past the experts): k rounds of a warp-wide
// maximum of (order_key(logit), MAX_E - expert), so equal logits go to the lower expert index. Lane r < top_k
// gets the r-th choice (my_e, its logit my_v); every lane gets xmax (the largest logit), sel_sum (the chosen
// experts' exp(v - xmax) for softmax scoring, their sigmoids for scoring 1, summed in choice order) and taken
// (bit j: its expert l + 32 j was chosen).
template <int EPL, int MAX_E>
__device__ __forceinline__ void select_top_k(const float (&x)[EPL], int experts, int top_k, int scoring, int lane,
                                             unsigned& taken, float& xmax, float& sel_sum, int& my_e, float& my_v) {
    // keys: (order_key, MAX_E - expert); padding lanes and chosen experts count as (0, 0) and never win.
    // Chosen experts are a bit mask (no dynamically indexed register arrays: they would go to local memory).
    unsigned khi[EPL];
    taken = 0u;
#pragma unroll
    for (int j = 0; j < EPL; ++j) khi[j] = (lane + 32 * j < experts) ? order_key(x[j]) : 0u;
    unsigned hh, hl;
    lane_head<EPL, MAX_E>(khi, taken, lane, experts, hh, hl);

    xmax = 0.f, sel_sum = 0.f, my_v = 0.f;
    my_e = 0;
    for (int r = 0; r < top_k; ++r) {
        const unsigned m = warp_max_u32(hh);
        const unsigned c = warp_max_u32(hh == m ? hl : 0u);
        const int e = MAX_E - int(c);
        const float v = key_value(m);
        if (r == 0) xmax = v;
        sel_sum += scoring == 0 ? expf(v - xmax) : 1.f / (1.f + expf(-v));
        if (lane == r) my_e = e, my_v = v;
        if (lane == (e & 31)) {
            taken |= 1u << (e >> 5);
            lane_head<EPL, MAX_E>(khi, taken, lane, experts, hh, hl);
        }
    }
}
