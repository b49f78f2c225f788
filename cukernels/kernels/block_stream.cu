// Holds a stream until the host has enqueued the work to be timed (nvbench's "blocking kernel" idea): the timer
// launches it, records the start event, enqueues the work and the end event, then releases it by writing the
// flag in mapped host memory. The events then bracket device time alone, whatever the host took to launch the
// work. If the timed work waits for the device itself (a host synchronisation inside it), the flag never
// comes: the kernel gives up after timeout_ns and says so in state[1], and the timer stops blocking.
// state: mapped host memory, state[0] = the last ticket released (host), state[1] = timed out (device writes 1).
// Tickets increase, so a holding kernel still waiting from the previous sample is never re-armed by the next.
// settle_ns: the least time the kernel holds the stream, from its own start (in the timer's default sample order
// a launch the host makes once it has seen the L2 flush end; in "flush-hold", the flush's end itself), so the timed
// work starts at least that long after the flush whatever the host took to enqueue it. A probe knob (timing.HOLD_SETTLE_NS, 0 by default): on an H200 idle time after the flush slowed
// short decode kernels, ours and cuDNN's alike (docs/perf/engine.md, stop 62).

#include "timeline.cuh"  // global_timer_ns

extern "C" __global__ void block_stream(volatile int* state, int ticket, unsigned long long timeout_ns,
                                        unsigned long long settle_ns) {
    const unsigned long long t0 = global_timer_ns();
    while (state[0] < ticket) {
        if (global_timer_ns() - t0 > timeout_ns) {
            state[1] = 1;
            return;
        }
    }
    while (global_timer_ns() - t0 < settle_ns) {
    }
}
