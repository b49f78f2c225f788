#!/bin/bash
# stop 67 call 9: tools/gemm_ab.py and tools/layer_ab.py after their shared helpers (ab_variants.compare_outputs /
# time_rounds), on the final kernels (the 64-column passes reverted; the epilogue probe builds)
export PYTHONPATH=.
nvidia-smi -L | tee $OUT/gpu.txt
timeout 250 python tools/gemm_ab.py --case E32_equal --case 8192x4096x4096/8 --variant tree --variant noepi:-DGEMM_PROBE_EPI=1 \
  --variant pair:config=TMA_PAIR --baseline --rounds 2 --json $OUT/gemm_ab.json > $OUT/gemm_ab.log 2>&1; echo "gemm_ab rc $?"
sed -n '/^| case/,$p' $OUT/gemm_ab.log; grep -i "Traceback\|Error" $OUT/gemm_ab.log | head -5
timeout 200 python tools/layer_ab.py --case E64top8:1 --case seed004:4 --variant tree \
  --variant nofuse:moe.layer.FUSED_DECODE=False --rounds 2 --json $OUT/layer_ab.json > $OUT/layer_ab.log 2>&1; echo "layer_ab rc $?"
sed -n '/^| case/,$p' $OUT/layer_ab.log; grep -i "Traceback\|Error" $OUT/layer_ab.log | head -5
python - <<'PY'
import json, os
for r in json.load(open(os.environ["OUT"] + "/layer_ab.json")):
    print(r["case"], r["bitwise_vs_tree"], r["same_over_calls"], {k: round(v, 6) for k, v in r["rel_l2_vs_tree"].items()})
PY
