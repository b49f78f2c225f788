// The special registers the kernels' timeline probes read (tools/fwd_timeline.py, tools/decode_timeline.py; only
// builds with FWD_TIMELINE / DECODE_TIMELINE defined call them): the global timer in ns and the SM a CTA runs on.
// The timer's stream hold (block_stream.cu) reads the global timer for its time-out.
#pragma once

__device__ __forceinline__ unsigned long long global_timer_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ unsigned sm_id() {
    unsigned s;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
    return s;
}
