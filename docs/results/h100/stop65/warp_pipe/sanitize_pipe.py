import sys
sys.path.insert(0, "tools")
import attention.decode_configs as d
d.WARP_PIPE = True
import sanitize, cupy
sanitize.decode_cases()
cupy.cuda.runtime.deviceSynchronize()
print("sanitize decode (warp pipe) ran")
