// The tensor-map path end to end on a 2-byte [rows, cols] matrix (sm_90a): the host encoding (cukernels/tma.py),
// the grid-constant parameter, an mbarrier that counts the load's bytes, a TMA load, and a TMA store. One CTA per
// BOX_R x BOX_C box; thread 0 issues the copies.
//
// tma_copy_tiles: src -> shared (TMA load) -> dst (TMA store), and, when `plain` is not null and the maps are not
// swizzled, every thread also copies the shared tile to `plain` with ordinary stores (what the threads see after
// the barrier is what the load wrote). Out-of-bounds parts of edge boxes: loaded as zeros, not stored.
#include "tma.cuh"

template <int BOX_C, int BOX_R>
__global__ void __launch_bounds__(128)
tma_copy_tiles(const __grid_constant__ tma::TensorMap src, const __grid_constant__ tma::TensorMap dst,
               unsigned short* __restrict__ plain, int rows, int cols) {
    constexpr int BYTES = BOX_C * BOX_R * 2;
    __shared__ alignas(1024) unsigned short tile[BOX_R * BOX_C];
    __shared__ alignas(8) unsigned long long bar_mem;
    const unsigned bar = tma::smem_u32(&bar_mem), dst_smem = tma::smem_u32(tile);
    const int x = blockIdx.x * BOX_C, y = blockIdx.y * BOX_R;

    if (threadIdx.x == 0) {
        tma::prefetch_map(src);
        tma::mbar_init(bar, 1);
        tma::fence_mbar_init();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        tma::mbar_arrive_expect_tx(bar, BYTES);
        tma::load_2d(dst_smem, src, bar, x, y);
    }
    tma::mbar_wait(bar, 0);

    if (plain != nullptr) {
        for (int i = threadIdx.x; i < BOX_R * BOX_C; i += blockDim.x) {
            const int r = y + i / BOX_C, c = x + i % BOX_C;
            if (r < rows && c < cols) plain[(long long)r * cols + c] = tile[i];
        }
    }
    if (threadIdx.x == 0) {
        tma::store_2d(dst, dst_smem, x, y);
        tma::store_commit();
        tma::store_wait_read();
    }
}
