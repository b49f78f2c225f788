"""E32 random grouped GEMM (moe bench inputs), the tree's kernel (idle warpgroups issue nothing) and the old
(-DGEMM_IDLE_WG=0): two calls each, for ncu. VARIANT=new|old picks one per process."""
import collections, importlib, os, sys
sys.path.insert(0, ".")
import cupy
from moe import bench as mb, suites, launch as ml
gg = importlib.import_module("moe.grouped_gemm")
name = os.environ.get("CASE", "gemm_8192x11008x4096_E32_random")
(case,) = [c for c in mb.cases_for([suites.shape(name)], "bf16") if c.params["kind"] == "gemm"]
inputs = mb.make_inputs(case, 0)
fn = mb._ours(case, inputs)
opts = () if os.environ.get("VARIANT", "new") == "new" else ("-DGEMM_IDLE_WG=0",)
with ml.kernels_built_with(opts):
    gg._GEMM._entries = collections.OrderedDict()
    for _ in range(3):
        fn()
cupy.cuda.Device().synchronize()
print("done", os.environ.get("VARIANT"))
