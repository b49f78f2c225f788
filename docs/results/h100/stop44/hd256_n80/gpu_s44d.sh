#!/bin/bash
# stop 44: head dim 256 with 80-key stages: GPU tests, sanitizer, bench rows
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 330 python -m pytest -q -x tests/test_attention_gpu.py tests/test_varlen_gpu.py 2>&1 | tail -4 | tee $OUT/tests.log
timeout 120 compute-sanitizer --tool memcheck python tools/sanitize.py tma 2>&1 | tail -3 | tee $OUT/memcheck.log
timeout 200 compute-sanitizer --tool racecheck python tools/sanitize.py tma 2>&1 | tail -3 | tee $OUT/racecheck.log
for dt in bf16 fp16; do
  for c in --causal --no-causal; do
    timeout 100 python -m attention.bench --case hd256 --dtype $dt $c --impl ours,torch-flash,torch-cudnn --json $OUT/hd256_${dt}${c}.json > $OUT/hd256_${dt}${c}.log 2>&1
    timeout 100 python -m attention.bench --suite quick --case d256 --dtype $dt $c --impl ours,torch-flash,torch-cudnn --json $OUT/quick256_${dt}${c}.json > $OUT/quick256_${dt}${c}.log 2>&1
  done
done
timeout 150 python -m attention.bench --case hd256 --backward --impl ours,torch-flash,torch-cudnn --json $OUT/hd256_bwd.json > $OUT/hd256_bwd.log 2>&1
python - <<'PY'
import json, glob, os
for f in sorted(glob.glob(os.environ["OUT"] + "/*.json")):
    d = json.load(open(f)); rows = d["results"] if isinstance(d, dict) else d
    for r in rows:
        if r["impl"] == "ours":
            print(os.path.basename(f), r["case"], r["median_ms"], "x best", r.get("speedup_vs_best_baseline"), r.get("best_baseline"), "tflops", r.get("tflops"), "as called", r.get("as_called_ms"), r["status"])
PY
