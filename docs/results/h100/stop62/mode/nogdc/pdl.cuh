// PROBE COPY (stop 62): griddepcontrol compiled out
// Programmatic dependent launch (sm_90+): the device side of cukernels.launch's `pdl=True` launchers.
//
// A kernel launched with the programmatic-stream-serialization attribute may start while the grid before it on
// the stream is still running. pdl::wait() returns once that grid has completed and its writes are visible; every
// thread calls it before its first global load of anything a previous kernel may have written and before its
// first global store (the previous grid may still read memory this one overwrites). Before it a kernel may only
// set itself up: shared memory, mbarriers, tensor-map prefetch (kernel parameters), register reallocation.
// pdl::launch_dependents() lets the next pdl kernel be scheduled once every CTA of this grid has called it (or
// exited); never before this grid's own wait, so at most two grids overlap. Small kernels and one-wave grids call
// both at once (enter(): the norms, rotary, MoE routing / dispatch, the skinny, mma.sync and wgmma GEMM tiles, the
// KV-cache decode);
// the persistent tma GEMM calls it at each CTA's last work item. Both are no-ops when the kernel was
// launched without the attribute, and compile to nothing before sm_90.
#pragma once

namespace pdl {

__device__ __forceinline__ void wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    /* probe: no griddepcontrol.wait */
#endif
}

__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    /* probe: no launch_dependents */
#endif
}

// both, at the point where a kernel's setup is done
__device__ __forceinline__ void enter() {
    wait();
    launch_dependents();
}

}  // namespace pdl
