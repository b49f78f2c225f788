#!/bin/bash
# stop 62: the decode suite's B1 and B8 rows under the timer's two fixed sample orders (hold-flush: every launch
# queued before the flush runs; flush-sync: every launch submitted after the flush), one process each
export PYTHONPATH=.
nvidia-smi -L | tee $OUT/gpu.txt
for order in hold-flush flush-sync; do
  python - "$order" > $OUT/decode_$order.txt 2>&1 <<'PY'
import sys, runpy
from cukernels import timing
timing.SAMPLE_ORDER = sys.argv[1]
import os
sys.argv = ["attention.bench", "--suite", "decode", "--case", "b1_", "--case", "b8_", "--budget-ms", "100",
            "--rounds", "2", "--json", os.environ["OUT"] + f"/decode_{sys.argv[1]}.json"]
runpy.run_module("attention.bench", run_name="__main__")
PY
  echo "== $order rc $?"; grep -c "^| decode" $OUT/decode_$order.txt
done
