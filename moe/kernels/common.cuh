// Shared helpers of the MoE kernels: element conversion for the three storage types, packed 16-byte vectors,
// the order-preserving key used by top-k, and warp reductions (redux.sync on sm_80+, butterflies before).
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>

// ---------------------------------------------------------------- elements

template <typename T> struct Elem;
template <> struct Elem<float> {
    static __device__ __forceinline__ float to_f32(float x) { return x; }
    static __device__ __forceinline__ float from_f32(float x) { return x; }
};
template <> struct Elem<__half> {
    static __device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
    static __device__ __forceinline__ __half from_f32(float x) { return __float2half_rn(x); }
};
template <> struct Elem<__nv_bfloat16> {
    static __device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
    static __device__ __forceinline__ __nv_bfloat16 from_f32(float x) { return __float2bfloat16_rn(x); }
};

// N elements of T moved as one access (16 bytes when N * sizeof(T) == 16).
template <typename T, int N> struct alignas(sizeof(T) * N) Pack {
    T v[N];
};

// ---------------------------------------------------------------- ordering

// An unsigned key whose order is the float order: -0.0 is folded onto +0.0 (they compare equal as floats) and
// NaN maps to 0, below -inf, so NaN logits are chosen last. Keys of real values are >= 0x007FFFFF.
__device__ __forceinline__ unsigned order_key(float x) {
    if (x != x) return 0u;
    unsigned b = __float_as_uint(x);
    if (b == 0x80000000u) b = 0u;
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ float key_value(unsigned k) {
    if (k == 0u) return __int_as_float(0x7fc00000);
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// ---------------------------------------------------------------- warp reductions

__device__ __forceinline__ unsigned warp_max_u32(unsigned v) {
#if __CUDA_ARCH__ >= 800
    return __reduce_max_sync(0xffffffffu, v);
#else
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
#endif
}

// Butterfly sum: every lane gets the same bits (same association on every lane), so results are reproducible.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
