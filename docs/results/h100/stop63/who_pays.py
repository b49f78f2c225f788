"""Stop 63: which kernels pay the ~0.7 us of a launch queued behind the running flush (hold-flush) against one
submitted after it (flush-sync)? Stop 62: ours (decode) and a plain CuPy RawKernel pay, cuDNN's does not.
Here, on the same 33.5 MB (B8 L1k h16-16 d64 q1 decode's K/V bytes): ours, cuDNN (SDPA), the plain read through
CuPy, the same cubin loaded and launched through cuda-bindings (cuModuleLoadData / cuLaunchKernel), a triton
kernel reading the same bytes, and torch's own sum over them. 7 rotated rounds, 80 ms a timer call."""
import sys, types, ctypes
import numpy as np
import cupy, torch
import triton, triton.language as tl
from attention import decode_bench as db
from cukernels import timing, compile as ccompile
from pathlib import Path

args = types.SimpleNamespace(dtype="bf16")
case = {c.name: c for c in db.cases("decode", args)}["decode_b8_L1k_h16-16_d64_q1"]
inputs = db.make_inputs(case, 0)
impls = {i.name: i for i in db.impls(args)}
ours = impls["ours"].prepare(case, inputs)
cudnn = impls["torch-cudnn"].prepare(case, inputs)

src = r'''
extern "C" __global__ void stream_read(const uint4* __restrict__ x, unsigned long long per_cta, unsigned* sink) {
    const uint4* p = x + blockIdx.x * per_cta;
    uint4 a = make_uint4(0, 0, 0, 0);
    #pragma unroll 8
    for (unsigned long long i = threadIdx.x; i < per_cta; i += blockDim.x) {
        const uint4 v = p[i];
        a.x ^= v.x; a.y ^= v.y; a.z ^= v.z; a.w ^= v.w;
    }
    if ((a.x ^ a.y ^ a.z ^ a.w) == 0x9e3779b9u) *sink = a.x;
}'''
kern = cupy.RawKernel(src, "stream_read")
NB = 128 * 256 * 1024
buf = cupy.asarray(np.random.default_rng(0).integers(0, 2**31, size=NB // 4, dtype=np.uint32))
sink = cupy.zeros(1, dtype=cupy.uint32)
per_cta = np.uint64(256 * 1024 // 16)
plain = lambda: kern((128,), (128,), (buf, per_cta, sink))

# the same kernel through cuda-bindings: its own module load and launch call
from cuda.bindings import driver
p = Path(__file__).with_name("stream_read.cu")
p.write_text(src)
cub = ccompile.cubin(p, "stream_read", "sm_90a")
err, mod = driver.cuModuleLoadData(cub)
assert err == 0, err
err, func = driver.cuModuleGetFunction(mod, b"stream_read")
assert err == 0, err
kp = ((int(buf.data.ptr), int(per_cta), int(sink.data.ptr)), (ctypes.c_void_p, ctypes.c_uint64, ctypes.c_void_p))
def bindings_launch():
    (e,) = driver.cuLaunchKernel(func, 128, 1, 1, 128, 1, 1, 0, driver.CUstream(cupy.cuda.get_current_stream().ptr), kp, 0)
    assert e == 0, e

@triton.jit
def tread(x_ptr, sink_ptr, per_prog, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for i in range(0, per_prog, BLOCK):
        offs = pid * per_prog + i + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs)
    s = tl.sum(acc, axis=0)
    if s == 123456789:
        tl.store(sink_ptr, s)

tbuf = torch.as_tensor(buf, device="cuda").view(torch.int32)
tsink = torch.zeros(1, dtype=torch.int32, device="cuda")
per_prog = 256 * 1024 // 4
trit = lambda: tread[(128,)](tbuf, tsink, per_prog, BLOCK=2048, num_warps=4)
tsum = lambda: torch.sum(tbuf)

noop_k = cupy.RawKernel(r'''
extern "C" __global__ void noop(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}''', "noop")
noop = lambda ns: noop_k((1,), (32,), (np.uint64(ns),))
def after_noop(f, ns):
    def g():
        noop(ns)
        f()
    return g
fns = {"ours": ours, "cudnn": cudnn, "plain-cupy": plain, "plain-bindings": bindings_launch, "triton": trit,
       "torch-sum": tsum}
if len(sys.argv) > 2:  # the second form: a 1-CTA kernel of 0 / 2 / 5 us before the call, inside the events
    fns = {"ours": ours, "cudnn": cudnn, "triton": trit}
    for ns in (0, 2000, 5000):
        fns[f"noop{ns // 1000}"] = (lambda ns: lambda: noop(ns))(ns)
        for n in ("ours", "cudnn", "triton"):
            fns[f"noop{ns // 1000}+{n}"] = after_noop(fns[n], ns)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        cudnn()
        torch.cuda.synchronize()
    print("cuDNN call's device work:", [(e.name, round(e.device_time, 2)) for e in prof.events()
                                        if e.device_time > 0], flush=True)
for f in fns.values():
    f()
cupy.cuda.Device().synchronize()
torch.cuda.synchronize()
combos = [(n, o) for n in fns for o in ("hold-flush", "flush-sync")]
res = {c: [] for c in combos}
R = int(sys.argv[1]) if len(sys.argv) > 1 else 7
for r in range(R):
    k = r * 5 % len(combos)
    for c in combos[k:] + combos[:k]:
        timing.SAMPLE_ORDER = c[1]
        try:
            res[c].append(timing.benchmark(fns[c[0]], budget_ms=80).median_ms * 1e3)
        finally:
            timing.SAMPLE_ORDER = "flush-sync"
print(f"== {torch.cuda.get_device_name()}: held us, median of {R} rotated rounds (hold-flush, flush-sync, difference)")
for n in fns:
    a, b = np.median(res[(n, "hold-flush")]), np.median(res[(n, "flush-sync")])
    print(f"   {n:15s} {a:8.2f} {b:8.2f} {a - b:+6.2f}   {[round(x, 2) for x in res[(n, 'hold-flush')]]} "
          f"{[round(x, 2) for x in res[(n, 'flush-sync')]]}", flush=True)
