"""Stop 64: what the B1 L1k paged calls' gap to the contiguous call is made of. Each call is preceded by one tiny
kernel that reads a few ints: a dummy buffer of the table's size (contiguous, paged "cold": the block table as the held timer leaves it,
flushed from L2) or, for paged "warm", the block table itself (so it sits in L2, as in a model's later layers,
which read the same table). Held timer (L2 flushed before each sample), ROUNDS rotated rounds, median us."""
import os, sys
sys.path.insert(0, ".")
import cupy, numpy as np
from cukernels import bench as cb, dtypes, timing
from attention import decode_bench as db
from attention.kvcache import flash_attention_with_kvcache

ROUNDS = int(os.environ.get("ROUNDS", "5"))
touch = cupy.RawKernel(r'''
extern "C" __global__ void touch(const int* p, int n, const int* p2, int n2, int* sink) {
    int s = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += __ldcg(p + i);
    for (int i = threadIdx.x; i < n2; i += blockDim.x) s += __ldcg(p2 + i);
    if (s == 0x7fffffff) *sink = s;
}''', "touch")
sink = cupy.zeros(1, cupy.int32)
print(cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), flush=True)
rows = []
for heads, kvh, d in ((32, 8, 128), (32, 32, 128), (16, 16, 64)):
    for sq in (1, 4):
        case = cb.Case(name=f"b1_L1k_{heads}-{kvh}_d{d}_q{sq}", params=dict(batch=1, length=1024, heads=heads,
                       kv_heads=kvh, head_dim=d, seq_q=sq), dtype="bf16")
        inp = db.make_inputs(case, 0)
        q, lens = inp["q"], inp["lens"]
        calls = {}
        other = cupy.ones(1, cupy.int32)  # a length-sized dummy
        def mk(k, v, table, buf, buf2):
            n, n2 = int(buf.size), int(buf2.size)
            def f():
                touch((1,), (256,), (buf, np.int32(n), buf2, np.int32(n2), sink))
                return flash_attention_with_kvcache(q, k, v, cache_seqlens=lens, block_table=table, check_values=False)
            return f
        calls["contiguous"] = mk(inp["k"], inp["v"], None, cupy.ones(64, cupy.int32), other)
        calls["contiguous len"] = mk(inp["k"], inp["v"], None, cupy.ones(64, cupy.int32), lens)
        ref = calls["contiguous"]()[0].copy()
        for page in (16, 256):
            k, v, table = db._paged(inp, page, seed=page)
            calls[f"p{page} cold"] = mk(k, v, table, cupy.ones_like(table), other)  # buffers of their sizes
            calls[f"p{page} warm"] = mk(k, v, table, table, other)
            calls[f"p{page} warm+len"] = mk(k, v, table, table, lens)
            diff = float(cupy.abs(dtypes.to_float32(calls[f"p{page} warm"]()[0]) - dtypes.to_float32(ref)).max())
            assert diff < 2e-2, (case.name, page, diff)
        names = list(calls)
        med = {n: [] for n in names}
        for r in range(ROUNDS):
            k0 = r % len(names)
            for n in names[k0:] + names[:k0]:
                med[n].append(timing.benchmark(calls[n], budget_ms=150, min_samples=10).median_ms * 1e3)
        m = {n: float(np.median(med[n])) for n in names}
        c, cl = m["contiguous"], m["contiguous len"]
        line = f"{case.name:22s} contiguous {c:6.2f} (len warm {cl:6.2f}) us"
        for page in (16, 256):
            cold, warm, both = m[f"p{page} cold"], m[f"p{page} warm"], m[f"p{page} warm+len"]
            line += (f" | p{page} cold +{cold - c:5.2f} table warm +{warm - c:5.2f} table+len warm +{both - cl:5.2f}"
                     f" (x{both / cl:.3f})")
        print(line, flush=True)
        rows.append({"case": case.name, "median_us": m, "rounds_us": med})
import json
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "table_warm.json"), "w"), indent=1)
