"""Stop 63: the offline-compile test that fails on the device machines (empty ptxas log under NVRTC 13.0)."""
import ctypes, os
from cupy_backends.cuda.libs import nvrtc
from cupy.cuda import nvrtc as cnvrtc
from cukernels import compile as cc, timing
print("nvrtc", cnvrtc.getVersion())
try:
    import cuda.pathfinder as pf
    print("pathfinder nvrtc", pf.load_nvidia_dynamic_lib("nvrtc"))
except Exception as e:
    print("pathfinder", e)
with open("/proc/self/maps") as f:
    print(sorted({l.split()[-1] for l in f if "nvrtc" in l}))
print("ctypes lib", cc._libnvrtc())
for arch in ("sm_80", "sm_90a", "sm_80", "sm_86", "sm_90a", "sm_100a", "sm_120a"):
    prog = nvrtc.createProgram(timing._SOURCE.read_text(), "block_stream.cu", [], [])
    nvrtc.addNameExpression(prog, "block_stream")
    opts = list(cc._options(timing._SOURCE, arch, ())) + ["--ptxas-options=-v"]
    try:
        nvrtc.compileProgram(prog, opts)
        log = nvrtc.getProgramLog(prog)
        print(arch, "log chars", len(log), repr(log[:200]))
    except Exception as e:
        print(arch, "error", e)
    nvrtc.destroyProgram(prog)
