// The small kernels of a decoder layer that are not attention or GEMMs: RMSNorm (optionally fused with the
// residual add before it) and rotary position embedding applied in place to q and k.
//
// rms_norm<T, VEC, ADD>
//   One warp per row of x [rows, hidden], WARPS rows per block; VEC elements per 16-byte (or smaller) access.
//   ADD: residual[r] += x[r] first, rounded to T and stored back (the residual stream), and the row normalised
//   is that sum as stored -- what eager code that adds in T and then normalises computes. Without ADD the row
//   normalised is x[r]. out[r] = T(v * rsqrt(mean(v^2) + eps) * weight), the mean of squares in fp32. The row is
//   read twice (the second pass from L1/L2), so no registers are held per element and any row length fits; hidden
//   must be a multiple of VEC (8 for fp16/bf16: whole 16-byte accesses, no tail), which the host enforces
//   (models/norm_rope.py validate_norm).
//
// rms_norm_row<T, VEC, ADD, PER>
//   The same result, one block per row held in registers: thread t owns the VEC-element pieces t + j * blockDim.x
//   (j < PER), so a row is read once with every load of the block in flight at the same time, then reduced through
//   shared memory. For hidden <= 4 * 512 * VEC (the host picks PER = ceil(pieces / 512) and the block size); the
//   warp-per-row kernel above covers longer rows. With few rows (a decode step, 128 tokens) it fills the GPU where
//   a warp per row leaves most SMs idle: 128 rows of 4096 took 11 us as warps, the bytes need ~1.5.
//
// rotary_neox<T>
//   In place on qkv [tokens, row_stride] viewed as [tokens, heads_total, head_dim]: heads [0, rot_heads) (the q
//   and k heads; v follows them and is left alone) are rotated by the position of their token, token % seq (a
//   batch of sequences of seq tokens, each starting at position 0). neox style: element i < half pairs with
//   i + half, (a, b) -> (a cos - b sin, b cos + a sin) with cos/sin[pos, i] from fp32 tables [seq, half] made
//   on the host. One thread per (token, head, pair of i): two adjacent i at a time (half is even).
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include "pdl.cuh"  // each kernel waits for the grid before it first (programmatic dependent launch)

template <typename T> struct Elem;
template <> struct Elem<__half> {
    static __device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
    static __device__ __forceinline__ __half from_f32(float x) { return __float2half_rn(x); }
};
template <> struct Elem<__nv_bfloat16> {
    static __device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
    static __device__ __forceinline__ __nv_bfloat16 from_f32(float x) { return __float2bfloat16_rn(x); }
};

template <typename T, int N> struct alignas(sizeof(T) * N) Pack {
    T v[N];
};

constexpr int NORM_WARPS = 4;  // rows per block (models.norm_rope.NORM_WARPS)

template <typename T, int VEC, bool ADD>
__global__ void __launch_bounds__(NORM_WARPS * 32)
rms_norm(const T* __restrict__ x, T* __restrict__ residual, const T* __restrict__ weight, T* __restrict__ out,
         int rows, int hidden, float eps) {
    using P = Pack<T, VEC>;
    pdl::enter();
    const int lane = threadIdx.x & 31;
    const long long r = (long long)blockIdx.x * NORM_WARPS + (threadIdx.x >> 5);
    if (r >= rows) return;
    const int vecs = hidden / VEC;
    const P* src = reinterpret_cast<const P*>(x + r * hidden);
    P* res = ADD ? reinterpret_cast<P*>(residual + r * hidden) : nullptr;
    float ss = 0.f;
    for (int i = lane; i < vecs; i += 32) {
        P v = src[i];
        if (ADD) {
            const P s = res[i];
#pragma unroll
            for (int j = 0; j < VEC; ++j)
                v.v[j] = Elem<T>::from_f32(Elem<T>::to_f32(s.v[j]) + Elem<T>::to_f32(v.v[j]));
            res[i] = v;
        }
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
            const float f = Elem<T>::to_f32(v.v[j]);
            ss = fmaf(f, f, ss);
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float inv = rsqrtf(ss / (float)hidden + eps);
    const P* again = ADD ? reinterpret_cast<const P*>(res) : src;  // this lane's own writes: visible to it
    const P* w = reinterpret_cast<const P*>(weight);
    P* dst = reinterpret_cast<P*>(out + r * hidden);
    for (int i = lane; i < vecs; i += 32) {
        const P v = again[i], g = w[i];
        P o;
#pragma unroll
        for (int j = 0; j < VEC; ++j)
            o.v[j] = Elem<T>::from_f32(Elem<T>::to_f32(v.v[j]) * inv * Elem<T>::to_f32(g.v[j]));
        dst[i] = o;
    }
}

template <typename T, int VEC, bool ADD, int PER>
__global__ void __launch_bounds__(512)
rms_norm_row(const T* __restrict__ x, T* __restrict__ residual, const T* __restrict__ weight, T* __restrict__ out,
             int hidden, float eps) {
    using P = Pack<T, VEC>;
    __shared__ float partial[32];
    pdl::enter();
    const int tid = threadIdx.x, nt = blockDim.x, vecs = hidden / VEC;
    const long long r = blockIdx.x;
    const P* src = reinterpret_cast<const P*>(x + r * hidden);
    P* res = ADD ? reinterpret_cast<P*>(residual + r * hidden) : nullptr;
    const P* w = reinterpret_cast<const P*>(weight);
    P v[PER], g[PER];
#pragma unroll
    for (int j = 0; j < PER; ++j) {  // every load first: PER (two with ADD) 16-byte loads in flight per thread
        const int i = tid + j * nt;
        if (i < vecs) {
            v[j] = src[i];
            if (ADD) g[j] = res[i];
        }
    }
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        const int i = tid + j * nt;
        if (i < vecs) {
            if (ADD) {
#pragma unroll
                for (int e = 0; e < VEC; ++e)
                    v[j].v[e] = Elem<T>::from_f32(Elem<T>::to_f32(g[j].v[e]) + Elem<T>::to_f32(v[j].v[e]));
                res[i] = v[j];
            }
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                const float f = Elem<T>::to_f32(v[j].v[e]);
                ss = fmaf(f, f, ss);
            }
            g[j] = w[i];  // the gain's load overlaps the reduction
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if ((tid & 31) == 0) partial[tid >> 5] = ss;
    __syncthreads();
    ss = 0.f;
    for (int k = 0; k < (nt >> 5); ++k) ss += partial[k];  // the same order in every thread
    const float inv = rsqrtf(ss / (float)hidden + eps);
    P* dst = reinterpret_cast<P*>(out + r * hidden);
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        const int i = tid + j * nt;
        if (i < vecs) {
            P o;
#pragma unroll
            for (int e = 0; e < VEC; ++e)
                o.v[e] = Elem<T>::from_f32(Elem<T>::to_f32(v[j].v[e]) * inv * Elem<T>::to_f32(g[j].v[e]));
            dst[i] = o;
        }
    }
}

template <typename T>
__global__ void __launch_bounds__(256)
rotary_neox(T* __restrict__ qkv, const float* __restrict__ cos_t, const float* __restrict__ sin_t, int tokens,
            int row_stride, int head_dim, int rot_heads, int seq) {
    pdl::enter();
    const int half = head_dim >> 1, pairs = half >> 1;
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long per_token = (long long)rot_heads * pairs;
    if (idx >= (long long)tokens * per_token) return;
    const long long t = idx / per_token;
    const int rest = (int)(idx - t * per_token);
    const int head = rest / pairs, i = 2 * (rest - head * pairs);
    const int pos = (int)(t % seq);
    T* a = qkv + t * row_stride + (long long)head * head_dim + i;
    T* b = a + half;
    const Pack<T, 2> va = *reinterpret_cast<const Pack<T, 2>*>(a), vb = *reinterpret_cast<const Pack<T, 2>*>(b);
    const float2 c = *reinterpret_cast<const float2*>(cos_t + (long long)pos * half + i);
    const float2 s = *reinterpret_cast<const float2*>(sin_t + (long long)pos * half + i);
    const float a0 = Elem<T>::to_f32(va.v[0]), a1 = Elem<T>::to_f32(va.v[1]);
    const float b0 = Elem<T>::to_f32(vb.v[0]), b1 = Elem<T>::to_f32(vb.v[1]);
    Pack<T, 2> oa, ob;
    oa.v[0] = Elem<T>::from_f32(a0 * c.x - b0 * s.x);
    oa.v[1] = Elem<T>::from_f32(a1 * c.y - b1 * s.y);
    ob.v[0] = Elem<T>::from_f32(b0 * c.x + a0 * s.x);
    ob.v[1] = Elem<T>::from_f32(b1 * c.y + a1 * s.y);
    *reinterpret_cast<Pack<T, 2>*>(a) = oa;
    *reinterpret_cast<Pack<T, 2>*>(b) = ob;
}
