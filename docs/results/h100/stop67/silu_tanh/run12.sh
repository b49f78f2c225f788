#!/bin/bash
# stop 67 call 12: SwiGLU's silu by one tanh.approx (GEMM_SILU_TANH=1) against the tree's ex2 + rcp: the layer-sized up GEMM
# (tools/gemm_ab.py, at the cap too) and the seed 004 layers (tools/layer_ab.py)
export PYTHONPATH=.
nvidia-smi -L | tee $OUT/gpu.txt
timeout 250 python tools/gemm_ab.py --case 65536x22016x4096/32:swiglu --case 16384x22016x4096/32:swiglu --variant tree \
  --variant tanh:-DGEMM_SILU_TANH=1 --rounds 5 --sustained 3 --json $OUT/silu_gemm.json > $OUT/silu_gemm.log 2>&1
echo "gemm rc $?"; sed -n '/^| case/,$p' $OUT/silu_gemm.log; grep -i "Traceback\|Error" $OUT/silu_gemm.log | head -5
python - <<'PY'
import json, os
for r in json.load(open(os.environ["OUT"] + "/silu_gemm.json")):
    print(r["case"], "rel_l2", r["rel_l2_vs_tree"])
PY
timeout 300 python tools/layer_ab.py --case seed004_b16x2048 --case seed004_b4x512 --case E64top8:4 --variant tree \
  --variant tanh:-DGEMM_SILU_TANH=1 --rounds 3 --json $OUT/silu_layer.json > $OUT/silu_layer.log 2>&1; echo "layer rc $?"
sed -n '/^| case/,$p' $OUT/silu_layer.log; grep -i "Traceback\|Error" $OUT/silu_layer.log | head -5
python - <<'PY'
import json, os
for r in json.load(open(os.environ["OUT"] + "/silu_layer.json")):
    print(r["case"], "rel_l2", r["rel_l2_vs_tree"], r["same_over_calls"])
PY
