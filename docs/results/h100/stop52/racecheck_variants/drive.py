"""Racecheck driver: the TMA backward once per head dim (default plan), small problems."""
import sys
sys.path.insert(0, "tools")
import cupy
from sanitize import _ATTENTION_SHAPES, _attention_inputs
from attention import flash_attention, flash_attention_backward
for d, dt, kw in _ATTENTION_SHAPES:
    q, k, v, do, ids = _attention_inputs(d, dt, 400, 450)
    o, lse = flash_attention(q, k, v, return_lse=True, **kw)
    flash_attention_backward(do, q, k, v, o, lse, **kw)
cupy.cuda.Device().synchronize()
print("drive ran")
