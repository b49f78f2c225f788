#!/bin/bash
# stop 67 call 11: the B-multicast pair on 256-row groups (E32 equal; the planner keeps one CTA below 1,024 rows a group)
export PYTHONPATH=.
nvidia-smi -L | tee $OUT/gpu.txt
timeout 560 python tools/gemm_ab.py --case E32_equal --case E32_random --case E8_random --variant tree \
  --variant pair:config=TMA_PAIR --baseline --rounds 5 --sustained 3 --json $OUT/pair_ab.json > $OUT/pair_ab.log 2>&1
echo "rc $?"; sed -n '/^| case/,$p' $OUT/pair_ab.log; grep -i "Traceback\|Error" $OUT/pair_ab.log | head -5
