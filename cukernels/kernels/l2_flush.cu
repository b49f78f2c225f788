// Evicts the L2 cache between timed samples by reading a buffer twice its size (cukernels/timing.py flush_l2).
// A read leaves L2 full of clean lines of this buffer; a memset (the timer's first flush) left it full of dirty
// ones, whose write-back then ran inside the next timed kernel and cost a kernel streaming >= 50 MB 4-11 us of
// someone else's DRAM traffic on an H100 (docs/perf/engine.md, stop 58). Nothing is written: the XOR of what was
// read goes to `sink` only if it equals a constant no real buffer is made to hit, which keeps the loads alive.
extern "C" __global__ void l2_flush_read(const uint4* __restrict__ buf, unsigned long long n, unsigned* sink) {
    uint4 a = make_uint4(0u, 0u, 0u, 0u);
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n; i += stride) {
        const uint4 v = buf[i];
        a.x ^= v.x, a.y ^= v.y, a.z ^= v.z, a.w ^= v.w;
    }
    if ((a.x ^ a.y ^ a.z ^ a.w) == 0x9e3779b9u) *sink = a.x;
}
