#!/bin/bash
# stop 67 call 2 (a request naming nvidia-h200-x2): on H200s the MoE suites on GPU 0 (issue 14's H200 lines);
# on H100s the bench's retaken host times checked on a decode-suite subset
export PYTHONPATH=. CUDA_VISIBLE_DEVICES=0
nvidia-smi -L | tee $OUT/gpu.txt
if nvidia-smi -L | grep -q H200; then
  timeout 100 python tools/decode_timeline.py --case E64top8:1 --case seed004:1 --calls 9 --json $OUT/timeline.json > $OUT/timeline.log 2>&1
  echo "timeline rc $?"; grep "layer:\|routed\|up items done\|down items done\|exit" $OUT/timeline.log
  timeout 130 python -m moe.bench --suite decode --json $OUT/moe_decode.json > $OUT/moe_decode.txt 2>&1; echo "moe decode rc $?"
  grep -A14 "^decode layers" $OUT/moe_decode.txt
  timeout 180 python -m moe.bench --suite gemm --impl ours,cublas,torch-grouped --rounds 5 --json $OUT/moe_gemm.json > $OUT/moe_gemm.txt 2>&1; echo "gemm rc $?"
  timeout 170 python -m moe.bench --suite seed004 --json $OUT/moe_seed004.json > $OUT/moe_seed004.txt 2>&1; echo "seed004 rc $?"
  python scratch/s67/summary_moe.py
else
  timeout 300 python -m attention.bench --suite decode --case b8_L1k --case b1_L1k_h32-32_d128_q4 --case b1_L8k_h32-8_d128_q4 --budget-ms 100 --rounds 2 --json $OUT/attn_decode_check.json > $OUT/attn_decode_check.txt 2>&1
  echo "check rc $?"
  python - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/attn_decode_check.json"))
for r in d["results"]:
    if r.get("host_us") is not None:
        print(f"{r['case'][7:]:28s} {r['impl']:14s} called {r['as_called_ms']*1e3:7.1f} host {r['host_us']:7.1f} takes {r.get('user_times_takes')}")
PY
fi
