// MoE routing: scoring, top-k and the per-block partial sums of the statistics, in one pass over the logits;
// then a small finishing kernel that turns the partials into counts, losses and the per-block prefix that the
// stable permutation needs.
//
// moe_route<T, EPL, WARPS>
//   logits [tokens, experts] row-major (T = float, __half or __nv_bfloat16). experts <= 32 * EPL, EPL in
//   1, 2, 4, 8, 16 (up to 512 experts; the planner takes the smallest EPL that holds the experts).
//   Block b owns tokens [b * block_tokens, (b + 1) * block_tokens); its warps take them round-robin, one token
//   per warp at a time, the next token's logits prefetched while the current one is processed.
//   Lane l holds experts l, l + 32, ..., l + 32 (EPL - 1): the row is read with coalesced loads.
//   Top-k: k rounds of a warp-wide maximum of (order_key(logit), MAX_E - expert), so equal logits go to the
//   lower expert index; selection is on the logits themselves (softmax and sigmoid are monotonic; ranking the
//   fp32 logits avoids ties that rounding of the scores would create). NaN ranks below -inf.
//   Scoring 0 = softmax: weight = softmax prob, renormalised over the chosen k when asked.
//   Scoring 1 = sigmoid (DeepSeek-V3): weight = sigmoid(logit), renormalised to sum 1 when asked; the
//   "probability" entering the load-balance statistics is the sigmoid score normalised over all experts.
//   Outputs: weights/ids [tokens, top_k]; per block: counts and probability sums per expert, sum of lse^2.
//   Every sum has a fixed order (per lane in token order, then over warps in warp order): results are
//   bitwise reproducible.
//
//   FINISH (one block, tokens <= block_tokens: decode-sized batches): the block writes what moe_route_finish
//   would (counts, mean probabilities, shares, blk_base = 0, the three scalars) instead of its partials, so the
//   routing is one launch.
//
// moe_route_finish
//   grid ceil(experts / 32) blocks of 32 x 32 threads; x = expert, y = a group of consecutive blocks.
//   Reduces the per-block partials per expert (fixed order), writes counts, mean probabilities, usage shares
//   and blk_base[b][e] = tokens of expert e routed by blocks < b (the stable scatter's starting rank).
//   The last block to finish (a ticket zeroed by moe_route) computes aux_loss, z_loss and the usage CV.
#include "common.cuh"
#include "topk.cuh"
#include "pdl.cuh"  // each kernel waits for the grid before it first (programmatic dependent launch)

template <typename T, int EPL, int WARPS, bool FINISH = false>
__global__ void __launch_bounds__(WARPS * 32)
moe_route(const T* __restrict__ logits, int tokens, int experts, int top_k, int block_tokens, int scoring,
          int renormalize, float* __restrict__ weights, int* __restrict__ topk_ids, int* __restrict__ blk_counts,
          float* __restrict__ blk_probsum, float* __restrict__ blk_zsum, unsigned* __restrict__ ticket,
          int* __restrict__ blk_base, int* __restrict__ counts, float* __restrict__ mean_prob,
          float* __restrict__ share, float* __restrict__ scalars) {
    constexpr int MAX_E = 32 * EPL;
    static_assert(EPL <= 32, "a lane's chosen experts are one bit each of a 32-bit mask");
    __shared__ float s_prob[WARPS][MAX_E];
    __shared__ int s_count[WARPS][MAX_E];
    __shared__ float s_z[WARPS];

    pdl::enter();
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    if (blockIdx.x == 0 && threadIdx.x == 0) *ticket = 0u;

    float psum[EPL];
    int count[EPL];
#pragma unroll
    for (int j = 0; j < EPL; ++j) {
        psum[j] = 0.f;
        count[j] = 0;
    }
    float zsum = 0.f;

    const int first = blockIdx.x * block_tokens;
    const int last = min(first + block_tokens, tokens);
    float x[EPL], next[EPL];
    int t = first + warp;
    if (t < last) load_row<T, EPL>(logits, t, experts, lane, x);

    for (; t < last; t += WARPS) {
        if (t + WARPS < last) load_row<T, EPL>(logits, t + WARPS, experts, lane, next);

        unsigned taken;
        float xmax, sel_sum, my_v;
        int my_e;
        select_top_k<EPL, MAX_E>(x, experts, top_k, scoring, lane, taken, xmax, sel_sum, my_e, my_v);
#pragma unroll
        for (int j = 0; j < EPL; ++j) count[j] += (taken >> j) & 1u;

        // softmax denominator (needed by both scorings for the z-loss)
        float ex[EPL], s = 0.f;
#pragma unroll
        for (int j = 0; j < EPL; ++j) {
            ex[j] = (lane + 32 * j < experts) ? expf(x[j] - xmax) : 0.f;
            s += ex[j];
        }
        s = warp_sum(s);
        const float lse = xmax + logf(s);
        if (lane == 0) zsum += lse * lse;

        float w;
        if (scoring == 0) {
            const float inv = 1.f / s;
#pragma unroll
            for (int j = 0; j < EPL; ++j) psum[j] += ex[j] * inv;
            w = expf(my_v - xmax) / (renormalize ? sel_sum : s);
        } else {
            float sg[EPL], ssum = 0.f;
#pragma unroll
            for (int j = 0; j < EPL; ++j) {
                sg[j] = (lane + 32 * j < experts) ? 1.f / (1.f + expf(-x[j])) : 0.f;
                ssum += sg[j];
            }
            const float inv = 1.f / warp_sum(ssum);
#pragma unroll
            for (int j = 0; j < EPL; ++j) psum[j] += sg[j] * inv;
            w = 1.f / (1.f + expf(-my_v));
            if (renormalize) w /= sel_sum;
        }
        if (lane < top_k) {
            weights[(long long)t * top_k + lane] = w;
            topk_ids[(long long)t * top_k + lane] = my_e;
        }
#pragma unroll
        for (int j = 0; j < EPL; ++j) x[j] = next[j];
    }

#pragma unroll
    for (int j = 0; j < EPL; ++j) {
        s_prob[warp][lane + 32 * j] = psum[j];
        s_count[warp][lane + 32 * j] = count[j];
    }
    if (lane == 0) s_z[warp] = zsum;
    __syncthreads();
    // FINISH: the totals are this block's; aux_loss and the count variance summed per thread, then over the block
    const float slots = float(tokens) * float(top_k), mean = slots / float(experts);
    float aux = 0.f, var = 0.f;
    for (int e = threadIdx.x; e < experts; e += WARPS * 32) {
        float p = 0.f;
        int c = 0;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) p += s_prob[w][e], c += s_count[w][e];
        if constexpr (FINISH) {
            const float mp = p / float(tokens), sh = float(c) / slots;
            counts[e] = c;
            blk_base[e] = 0;
            mean_prob[e] = mp;
            share[e] = sh;
            aux += sh * mp;
            var += (float(c) - mean) * (float(c) - mean);
        } else {
            blk_probsum[(long long)blockIdx.x * experts + e] = p;
            blk_counts[(long long)blockIdx.x * experts + e] = c;
        }
    }
    if constexpr (FINISH) {
        __shared__ float s_red[2][WARPS];
        aux = warp_sum(aux), var = warp_sum(var);
        if (lane == 0) s_red[0][warp] = aux, s_red[1][warp] = var;
        __syncthreads();
        if (threadIdx.x == 0) {
            float z = 0.f;
            aux = 0.f, var = 0.f;
#pragma unroll
            for (int w = 0; w < WARPS; ++w) z += s_z[w], aux += s_red[0][w], var += s_red[1][w];
            scalars[0] = float(experts) * aux;
            scalars[1] = z / float(tokens);
            scalars[2] = sqrtf(var / float(experts)) / mean;
        }
    } else if (threadIdx.x == 0) {
        float z = 0.f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) z += s_z[w];
        blk_zsum[blockIdx.x] = z;
    }
}

// scalars: [0] aux_loss, [1] z_loss, [2] usage CV (std / mean of the counts)
__global__ void __launch_bounds__(1024)
moe_route_finish(const int* __restrict__ blk_counts, const float* __restrict__ blk_probsum,
                 const float* __restrict__ blk_zsum, int nblk, int tokens, int experts, int top_k,
                 int* __restrict__ blk_base, int* __restrict__ counts, float* __restrict__ mean_prob,
                 float* __restrict__ share, float* __restrict__ scalars, unsigned* __restrict__ ticket) {
    __shared__ int s_count[32][33];
    __shared__ float s_prob[32][33];
    __shared__ float s_red[3][32];
    __shared__ bool s_last;

    pdl::enter();
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int e = blockIdx.x * 32 + tx;
    const int chunk = (nblk + 31) / 32;
    const int b0 = min(ty * chunk, nblk), b1 = min(b0 + chunk, nblk);
    int c = 0;
    float p = 0.f;
    if (e < experts)
        for (int b = b0; b < b1; ++b) {
            c += blk_counts[(long long)b * experts + e];
            p += blk_probsum[(long long)b * experts + e];
        }
    s_count[ty][tx] = c;
    s_prob[ty][tx] = p;
    __syncthreads();
    if (ty == 0 && e < experts) {
        int run = 0;
        float ps = 0.f;
        for (int g = 0; g < 32; ++g) {
            const int v = s_count[g][tx];
            s_count[g][tx] = run;
            run += v;
            ps += s_prob[g][tx];
        }
        counts[e] = run;
        mean_prob[e] = ps / float(tokens);
        share[e] = float(run) / (float(tokens) * float(top_k));
    }
    __syncthreads();
    if (e < experts) {
        int run = s_count[ty][tx];
        for (int b = b0; b < b1; ++b) {
            const long long i = (long long)b * experts + e;
            const int v = blk_counts[i];
            blk_base[i] = run;
            run += v;
        }
    }

    // the last block of the grid computes the scalars from every expert's totals
    __threadfence();
    __syncthreads();
    const int tid = ty * 32 + tx;
    if (tid == 0) s_last = atomicAdd(ticket, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    const float slots = float(tokens) * float(top_k);
    const float mean = slots / float(experts);
    float aux = 0.f, z = 0.f, var = 0.f;
    for (int i = tid; i < experts; i += 1024) {
        const float ci = float(__ldcg(counts + i));
        aux += (ci / slots) * __ldcg(mean_prob + i);
        var += (ci - mean) * (ci - mean);
    }
    for (int b = tid; b < nblk; b += 1024) z += blk_zsum[b];
    aux = warp_sum(aux), z = warp_sum(z), var = warp_sum(var);
    if (tx == 0) s_red[0][ty] = aux, s_red[1][ty] = z, s_red[2][ty] = var;
    __syncthreads();
    if (ty == 0) {
        aux = warp_sum(s_red[0][tx]), z = warp_sum(s_red[1][tx]), var = warp_sum(s_red[2][tx]);
        if (tx == 0) {
            scalars[0] = float(experts) * aux;
            scalars[1] = z / float(tokens);
            scalars[2] = sqrtf(var / float(experts)) / mean;
        }
    }
}
