"""Partial last m-tiles: does the layer-sized grouped GEMM's time follow the 128-row tiles it computes (ceil) or the
rows it has? Seed 004's b16 x 2048 layer: 65,536 slots over 32 experts (counts drawn like random routing, sd ~44),
the up-projection (K 4096, N 22016, SwiGLU) and the down (K 11008, N 4096). Variants of the group sizes:
equal (2,048 each: no partial tile), routed (the draw), floor (the draw rounded down to multiples of 128: the
routed groups' full tiles only). Held timer and triton do_bench, rounds alternating."""
import json, os, sys
import numpy as np
import cupy
sys.path.insert(0, '.')
from cukernels import dtypes, timing
from moe.grouped_gemm import grouped_gemm
import triton.testing

E, ROWS = 32, 65536
rng = np.random.default_rng(66)
counts = {"equal": np.full(E, ROWS // E)}
counts["routed"] = rng.multinomial(ROWS, [1 / E] * E)
counts["floor"] = (counts["routed"] // 128) * 128
tiles = {k: int(np.sum(-(-v // 128))) for k, v in counts.items()}
print("counts routed:", counts["routed"].tolist())
print("rows:", {k: int(v.sum()) for k, v in counts.items()}, "m-tiles:", tiles)
a_up = dtypes.random((ROWS, 4096), dtypes.from_name("bf16"), seed=1)
b_up = dtypes.random((E, 22016, 4096), dtypes.from_name("bf16"), seed=2, scale=1 / 64)
a_dn = dtypes.random((ROWS, 11008), dtypes.from_name("bf16"), seed=3)
b_dn = dtypes.random((E, 4096, 11008), dtypes.from_name("bf16"), seed=4, scale=1 / 105)
offs = {k: cupy.asarray(np.concatenate([[0], np.cumsum(v)]).astype(np.int32)) for k, v in counts.items()}
fns = {}
for k, o in offs.items():
    fns[("up", k)] = (lambda o=o: grouped_gemm(a_up, b_up, o, epilogue="swiglu"))
    fns[("down", k)] = (lambda o=o: grouped_gemm(a_dn, b_dn, o))
for f in fns.values():
    f(); f()
cupy.cuda.Device().synchronize()
res = {f"{p}/{k}": {"held": [], "do_bench": []} for (p, k) in fns}
for r in range(3):
    order = list(fns)
    order = order[r % len(order):] + order[:r % len(order)]
    for key in order:
        name = f"{key[0]}/{key[1]}"
        res[name]["held"].append(timing.benchmark(fns[key], budget_ms=300).median_ms)
        res[name]["do_bench"].append(triton.testing.do_bench(fns[key], warmup=25, rep=200))
print(f"{'gemm':14s} {'rows':>6s} {'tiles':>6s} {'held ms':>9s} {'do_bench':>9s}  held/equal  tiles/equal  rows/equal")
for p in ("up", "down"):
    eh = np.median(res[f"{p}/equal"]["held"]); ed = np.median(res[f"{p}/equal"]["do_bench"])
    for k in counts:
        h = np.median(res[f"{p}/{k}"]["held"]); d = np.median(res[f"{p}/{k}"]["do_bench"])
        print(f"{p + '/' + k:14s} {int(counts[k].sum()):6d} {tiles[k]:6d} {h:9.3f} {d:9.3f}  {h / eh:10.3f}  {tiles[k] / tiles['equal']:11.3f}  {counts[k].sum() / ROWS:10.3f}  (do_bench {d / ed:.3f})")
json.dump({"counts": {k: v.tolist() for k, v in counts.items()}, "tiles": tiles, "results": res},
          open(os.path.join(os.environ.get("OUT", "."), "waste.json"), "w"), indent=1)
