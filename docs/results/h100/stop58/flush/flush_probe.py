"""How the L2 flush's dirty lines change held times: the engine's flush (a 2 x L2 memset: L2 left full of dirty
lines, written back while the timed kernel reads) against a read flush (a 2 x L2 read: L2 left clean) and both.
Interleaved rounds of cukernels.timing.benchmark with timing.flush_l2 swapped."""
import json, sys
import numpy as np
import cupy
sys.path.insert(0, ".")
from cukernels import timing, device as _device, dtypes

SRC = r'''
extern "C" __global__ void read_flush(const uint4* __restrict__ p, unsigned long long n, unsigned* sink) {
    uint4 a = make_uint4(0u, 0u, 0u, 0u);
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        uint4 v = p[i]; a.x ^= v.x; a.y ^= v.y; a.z ^= v.z; a.w ^= v.w;
    }
    if ((a.x ^ a.y ^ a.z ^ a.w) == 0x9e3779b9u) *sink = 1u;
}
'''
mod = cupy.RawModule(code=SRC)
read_k = mod.get_function("read_flush")
spec = _device.current()
L2 = spec.l2_bytes
rbuf = cupy.ones(2 * L2 // 16 * 4, dtype=cupy.uint32)  # 2 x L2 bytes
sink = cupy.zeros(1, dtype=cupy.uint32)
sms = spec.sm_count
orig_flush = timing.flush_l2

def read_clean():
    read_k((sms * 8,), (256,), (rbuf, np.uint64(rbuf.size // 4), sink))

wbuf = cupy.empty(2 * L2, dtype=cupy.uint8)

def memset():  # the engine's flush before stop 58
    wbuf.fill(0)

def write_then_read():
    memset(); read_clean()

MODES = {"memset (old)": memset, "read": read_clean, "write+read": write_then_read, "engine": orig_flush}

cases = {}
# plain reads of 92 MB and 1 GiB, and the 1 GiB copy
for name, nbytes in (("read 92 MB", 92_274_688), ("read 1 GiB", 1 << 30)):
    b = cupy.ones(nbytes // 4, dtype=cupy.uint32)
    cases[name] = (lambda b=b: read_k((sms * 8,), (256,), (b, np.uint64(b.size // 4), sink)), nbytes)
src_c, dst_c = cupy.ones(1 << 28, dtype=cupy.uint32), cupy.empty(1 << 28, dtype=cupy.uint32)
cases["copy 1 GiB (r+w)"] = (lambda: cupy.copyto(dst_c, src_c), 2 << 30)

# MoE decode layers (the decode suite's inputs)
from moe import bench as moe_bench, suites
for cname in ("decode_E64top8_T1", "decode_E64top8_T4", "decode_seed004_T1"):
    (case,) = moe_bench.cases_for([suites.shape(cname)], "bf16")
    inp = moe_bench.make_inputs(case, 0)
    inp.layer(inp.x)
    cases[cname] = (lambda inp=inp: inp.layer(inp.x), None)

# attention decode, contiguous cache, full lengths
import attention
for B, L in ((8, 32768), (1, 8192), (1, 32768)):
    q = dtypes.random((B, 1, 32, 128), dtypes.BF16, seed=1)
    kc = dtypes.random((B, L, 8, 128), dtypes.BF16, seed=2)
    vc = dtypes.random((B, L, 8, 128), dtypes.BF16, seed=3)
    lens = cupy.full((B,), L, dtype=cupy.int32)
    f = lambda q=q, kc=kc, vc=vc, lens=lens: attention.flash_attention_with_kvcache(q, kc, vc, cache_seqlens=lens,
                                                                                  check_values=False)
    f()
    cases[f"kv decode B{B} L{L} 32/8 d128"] = (f, 2 * B * L * 8 * 128 * 2)

rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
res = {c: {m: [] for m in MODES} for c in cases}
names = list(MODES)
for r in range(rounds):
    for c, (fn, _) in cases.items():
        order = names[r % len(names):] + names[:r % len(names)]
        for m in order:
            timing.flush_l2 = MODES[m]
            try:
                t = timing.benchmark(fn, budget_ms=60, min_samples=10, max_samples=60)
            finally:
                timing.flush_l2 = orig_flush
            res[c][m].append(t.median_ms * 1e3)
    print("round", r, flush=True)
out = []
print(f"{'case':34s} " + " ".join(f"{m:>16s}" for m in names) + "   engine-memset us")
for c, (fn, nb) in cases.items():
    med = {m: float(np.median(res[c][m])) for m in names}
    row = f"{c:34s} " + " ".join(f"{med[m]:13.2f} us" for m in names) + f"   {med['engine'] - med['memset (old)']:+.2f}"
    if nb:
        row += "   GB/s " + " / ".join(f"{nb / med[m] / 1e3:.0f}" for m in names)
    print(row)
    out.append({"case": c, "bytes": nb, "us": res[c], "median_us": med})
json.dump(out, open(sys.argv[1], "w"), indent=1)
