import sys
sys.path.insert(0, "tools")
import attention.decode_configs as d
d.TMA_LOADS = True
import sanitize
sanitize.decode_cases()
import cupy
cupy.cuda.runtime.deviceSynchronize()
print("sanitize decode (TMA) ran")
