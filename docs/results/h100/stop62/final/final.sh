#!/bin/bash
export PYTHONPATH=.
nvidia-smi -L
python -m pytest -q tests/test_grouped_gemm_gpu.py -k "layer_tma" tests/test_engine_gpu.py 2>&1 | tail -2
cat > /tmp/hold_small.py <<'PY'
import cupy
from cukernels import timing
x = cupy.zeros(1 << 10, dtype=cupy.float32)
for order in timing.SAMPLE_ORDERS:
    timing.SAMPLE_ORDER, timing.HOLD_SETTLE_NS = order, 20_000
    t = timing.benchmark(lambda: x.fill(1.0), budget_ms=5, min_samples=3, max_samples=6)
    print(order, t.clocks["held"], round(t.median_ms * 1e3, 2), "us")
PY
for tool in memcheck racecheck; do compute-sanitizer --tool $tool python /tmp/hold_small.py 2>&1 | tail -5; done
