"""SASS of the backward's preprocess / prologue instances (addresses stripped), for before/after comparison."""
import subprocess, sys, re, os
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
SETS = [("attention/kernels/flash_bwd.cu", e, a) for a in ("sm_90a", "sm_80") for e in (
    "flash_bwd_preprocess<__nv_bfloat16,64,false>", "flash_bwd_preprocess<__half,128,true>",
    "flash_bwd_preprocess<__nv_bfloat16,256,false>")] + [
    ("attention/kernels/flash_bwd_tma.cu", e, "sm_90a") for e in (
    "flash_bwd_tma<__nv_bfloat16,64,128,2,1,true>", "flash_bwd_tma<__half,128,64,3,0,true>",
    "flash_bwd_tma<__nv_bfloat16,64,128,2,3,false>")]
for i, (src, expr, arch) in enumerate(SETS):
    r = subprocess.run([sys.executable, "tools/sass.py", src, "--expr", expr, "--arch", arch], capture_output=True,
                       text=True, env=dict(os.environ, PYTHONPATH="."))
    if r.returncode:
        print("FAIL", expr, arch, r.stderr[-500:]); continue
    body = "\n".join(re.sub(r"^0x[0-9a-f]+\s+", "", l) for l in r.stdout.splitlines())
    open(f"{out}/{i:02d}.sass", "w").write(body)
    print(i, arch, expr, len(body.splitlines()))
