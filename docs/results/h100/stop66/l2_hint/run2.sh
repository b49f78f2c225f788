#!/bin/bash
# stop 66 run 2: the decode layer's timeline (E64 top-8 T1 / T4, seed 004 T1) and, where the card is an H200, the MoE decode suite
export PYTHONPATH=.
nvidia-smi -L | tee $OUT/gpu.txt
timeout 200 python tools/decode_timeline.py --case E64top8:1 --case E64top8:4 --case seed004:1 --calls 9 --json $OUT/timeline.json > $OUT/timeline.log 2>&1
echo "timeline rc $?"; cat $OUT/timeline.log | tail -60
if nvidia-smi -L | grep -q H200; then
  timeout 250 python -m moe.bench --suite decode --json $OUT/moe_decode_h200.json > $OUT/moe_decode_h200.txt 2>&1
  echo "moe decode rc $?"; grep -A14 "^decode layers" $OUT/moe_decode_h200.txt
fi
