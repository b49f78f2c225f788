// MoE dispatch: the stable counting-sort scatter of token slots into expert order, the gather of token rows in
// that order, and the weighted combine of expert outputs back to tokens.
//
// A slot is token * top_k + k. Rows in expert order: expert e owns rows [row_off[e], row_off[e] + counts[e]),
// its slots in increasing slot order; row_off is the exclusive scan of counts, each count rounded up to a
// multiple of block_m (block_m = 1: no padding). Rows that hold no slot (padding, and the tail up to the
// worst-case capacity) hold -1.
//
// moe_permute_scatter<WARPS>
//   Block b owns the slots of tokens [b * block_tokens, (b + 1) * block_tokens) -- the same blocks as
//   moe_route, whose finishing kernel left blk_base[b][e] (slots of expert e in blocks < b). Warp 0 scans the
//   counts into row offsets (every block, MAX_EXPERTS values; block 0 also writes them out). The block's slots
//   are cut into one contiguous run per warp; a shared histogram per warp and a scan over warps give each warp
//   its starting row per expert; each warp then walks its run 32 slots at a time, and __match_any_sync
//   ranks the lanes holding the same expert in lane order. Nothing depends on timing: the result is the
//   stable order. With row_weight (else null), row_weight[r] = weights[sorted_slots[r]]: the routing weight of
//   each row, for the down projection's row scale.
//
// moe_gather<V>
//   out[r, :] = x[sorted_slots[r] / top_k, :] (zeros for -1 rows). V is the access unit (16, 4 or 2 bytes).
//   blockDim (TX, TY): TY rows per block, TX threads along a row.
//
// moe_combine<T, VEC, MAX_K>
//   out[t, :] = sum_k weights[t, k] * expert_out[inverse[t, k], :] (weights null: 1), in fp32, k in order: no atomics, so the
//   result is deterministic. VEC elements per access (16 bytes when the row allows it, else 1); top_k <= MAX_K
//   (2, 4 or 8: the loads of all k are held in registers at once, so the bound sets the register budget).
//   blockDim (TX, TY): TY tokens per block, TX threads along a row.
#include "common.cuh"
#include "pdl.cuh"  // each kernel waits for the grid before it first (programmatic dependent launch)

constexpr int MAX_EXPERTS = 512;  // moe.configs.MAX_EXPERTS (ScatterConfig.smem_bytes counts these arrays)

template <int WARPS>
__global__ void __launch_bounds__(WARPS * 32)
moe_permute_scatter(const int* __restrict__ topk_ids, int tokens, int top_k, int experts, int block_tokens,
                    const int* __restrict__ counts, const int* __restrict__ blk_base, int block_m, int capacity,
                    int* __restrict__ sorted_slots, int* __restrict__ inverse, int* __restrict__ offsets,
                    int* __restrict__ row_offsets, const float* __restrict__ weights, float* __restrict__ row_weight) {
    __shared__ int s_row_off[MAX_EXPERTS + 1];
    __shared__ int s_count[MAX_EXPERTS];
    __shared__ int s_run[WARPS][MAX_EXPERTS];

    pdl::enter();
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int tid = threadIdx.x;

    for (int i = tid; i < WARPS * MAX_EXPERTS; i += WARPS * 32) (&s_run[0][0])[i] = 0;
    if (warp == 0) {
        // lane l scans experts [PER l, PER (l + 1)) locally, then a warp scan of the lane totals. The counts
        // wait in s_count (0 past the experts) and the padded counts in s_row_off until the offsets overwrite
        // them, not in 2 * PER registers that every thread of the block would pay for
        constexpr int PER = MAX_EXPERTS / 32;
        int run = 0, prun = 0;
#pragma unroll
        for (int j = 0; j < PER; ++j) {
            const int e = lane * PER + j;
            const int c = (e < experts) ? counts[e] : 0, p = (c + block_m - 1) / block_m * block_m;
            s_count[e] = c, s_row_off[e] = p;
            run += c, prun += p;
        }
        int incl = run, pincl = prun;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int a = __shfl_up_sync(0xffffffffu, incl, o), pa = __shfl_up_sync(0xffffffffu, pincl, o);
            if (lane >= o) incl += a, pincl += pa;
        }
        int off = incl - run, poff = pincl - prun;
#pragma unroll
        for (int j = 0; j < PER; ++j) {
            const int e = lane * PER + j;
            const int c = s_count[e], p = s_row_off[e];
            if (e <= experts) {
                s_row_off[e] = poff;
                if (blockIdx.x == 0) offsets[e] = off, row_offsets[e] = poff;
            }
            off += c, poff += p;
        }
        if (lane == 31 && experts == MAX_EXPERTS) {
            s_row_off[MAX_EXPERTS] = poff;
            if (blockIdx.x == 0) offsets[MAX_EXPERTS] = off, row_offsets[MAX_EXPERTS] = poff;
        }
    }
    __syncthreads();

    // rows with no slot: each expert's padding (experts spread over blocks), then the tail of the capacity
    for (int e = blockIdx.x; e < experts; e += gridDim.x)
        for (int r = s_row_off[e] + s_count[e] + tid; r < s_row_off[e + 1]; r += WARPS * 32) sorted_slots[r] = -1;
    for (int r = s_row_off[experts] + blockIdx.x * WARPS * 32 + tid; r < capacity; r += gridDim.x * WARPS * 32)
        sorted_slots[r] = -1;

    // this warp's run of slots
    const int first = blockIdx.x * block_tokens * top_k;
    const int last = min(first + block_tokens * top_k, tokens * top_k);
    const int per_warp = ((last - first + WARPS - 1) / WARPS + 31) / 32 * 32;
    const int begin = min(first + warp * per_warp, last), end = min(begin + per_warp, last);

    for (int s = begin + lane; s < end; s += 32) atomicAdd(&s_run[warp][topk_ids[s]], 1);
    __syncthreads();
    for (int e = tid; e < experts; e += WARPS * 32) {
        int run = s_row_off[e] + blk_base[(long long)blockIdx.x * experts + e];
#pragma unroll
        for (int w = 0; w < WARPS; ++w) {
            const int v = s_run[w][e];
            s_run[w][e] = run;
            run += v;
        }
    }
    __syncthreads();

    const unsigned lower = (1u << lane) - 1u;
    for (int base = begin; base < end; base += 32) {
        const int s = base + lane;
        const bool valid = s < end;
        const int e = valid ? topk_ids[s] : -1;
        const unsigned peers = __match_any_sync(0xffffffffu, e);
        const int rank = __popc(peers & lower);
        const int start = valid ? s_run[warp][e] : 0;
        __syncwarp();
        if (valid && rank == 0) s_run[warp][e] = start + __popc(peers);
        __syncwarp();
        if (valid) {
            sorted_slots[start + rank] = s;
            inverse[s] = start + rank;
            if (row_weight != nullptr) row_weight[start + rank] = weights[s];
        }
    }
}

template <typename V>
__global__ void __launch_bounds__(256)
moe_gather(const V* __restrict__ x, const int* __restrict__ sorted_slots, int rows, int top_k, int row_vecs,
           V* __restrict__ out) {
    constexpr int UNROLL = 4;
    pdl::enter();
    const long long r = (long long)blockIdx.x * blockDim.y + threadIdx.y;
    if (r >= rows) return;
    const int slot = sorted_slots[r];
    V* dst = out + r * row_vecs;
    if (slot < 0) {
        for (int i = threadIdx.x; i < row_vecs; i += blockDim.x) dst[i] = V{};
        return;
    }
    const V* src = x + (long long)(slot / top_k) * row_vecs;
    for (int i0 = threadIdx.x; i0 < row_vecs; i0 += blockDim.x * UNROLL) {
        V v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int i = i0 + u * blockDim.x;
            if (i < row_vecs) v[u] = src[i];
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int i = i0 + u * blockDim.x;
            if (i < row_vecs) dst[i] = v[u];
        }
    }
}

template <typename T, int VEC, int MAX_K>
__global__ void __launch_bounds__(256)
moe_combine(const T* __restrict__ expert_out, const int* __restrict__ inverse, const float* __restrict__ weights,
            int tokens, int top_k, int hidden, T* __restrict__ out) {
    constexpr int UNROLL = MAX_K <= 2 ? 2 : 1;  // 4 to 8 independent loads in flight per thread
    using P = Pack<T, VEC>;
    pdl::enter();
    const long long t = (long long)blockIdx.x * blockDim.y + threadIdx.y;
    if (t >= tokens) return;
    int row[MAX_K];
    float w[MAX_K];
#pragma unroll
    for (int k = 0; k < MAX_K; ++k) {
        row[k] = k < top_k ? __ldg(inverse + t * top_k + k) : 0;
        w[k] = k < top_k ? (weights != nullptr ? __ldg(weights + t * top_k + k) : 1.f) : 0.f;
    }
    const int vecs = hidden / VEC;
    P* dst = reinterpret_cast<P*>(out + t * hidden);
    // UNROLL row positions per thread, their K loads all issued before the first multiply
    for (int i0 = threadIdx.x; i0 < vecs; i0 += blockDim.x * UNROLL) {
        P v[UNROLL][MAX_K];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int i = i0 + u * blockDim.x;
#pragma unroll
            for (int k = 0; k < MAX_K; ++k)
                if (k < top_k && i < vecs) v[u][k] = reinterpret_cast<const P*>(expert_out + (long long)row[k] * hidden)[i];
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int i = i0 + u * blockDim.x;
            if (i >= vecs) break;
            float acc[VEC];
#pragma unroll
            for (int j = 0; j < VEC; ++j) acc[j] = 0.f;
#pragma unroll
            for (int k = 0; k < MAX_K; ++k)
                if (k < top_k)
#pragma unroll
                    for (int j = 0; j < VEC; ++j) acc[j] = fmaf(w[k], Elem<T>::to_f32(v[u][k].v[j]), acc[j]);
            P o;
#pragma unroll
            for (int j = 0; j < VEC; ++j) o.v[j] = Elem<T>::from_f32(acc[j]);
            dst[i] = o;
        }
    }
}
