"""The seed004 layer at T tokens, called three times (the last under ncu's range)."""
import sys
import cupy
from moe import bench as mb, suites
name = sys.argv[1] if len(sys.argv) > 1 else "seed004_b16x2048"
(case,) = [c for c in mb.cases_for(suites.suite("seed004"), "bf16") if c.name == f"{name} layer"]
inp = mb.make_inputs(case, 0)
for _ in range(3):
    inp.layer(inp.x)
cupy.cuda.Device().synchronize()
print("done")
