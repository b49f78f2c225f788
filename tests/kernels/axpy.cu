// Test kernel for the engine: y = a * x + y, templated on the element type and the items per thread.
#include <cuda_fp16.h>
#include <cuda_bf16.h>

template <typename T> __device__ __forceinline__ float to_f(T v) { return static_cast<float>(v); }
template <typename T> __device__ __forceinline__ T from_f(float v) { return static_cast<T>(v); }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

template <typename T, int ITEMS>
__global__ void axpy(const T* __restrict__ x, T* __restrict__ y, float a, int n) {
    extern __shared__ float scratch[];  // exercises dynamic shared memory above 48 KB
    const int base = (blockIdx.x * blockDim.x + threadIdx.x) * ITEMS;
    scratch[threadIdx.x] = a;
    __syncthreads();
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
        const int j = base + i;
        if (j < n) y[j] = from_f<T>(scratch[threadIdx.x] * to_f(x[j]) + to_f(y[j]));
    }
}
