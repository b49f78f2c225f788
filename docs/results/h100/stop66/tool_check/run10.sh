#!/bin/bash
# stop 66 review: the two MoE tools after the shared layer_case helper
export PYTHONPATH=.
nvidia-smi -L
timeout 150 python tools/decode_timeline.py --case E64top8:4 --calls 3 > $OUT/timeline.log 2>&1; echo "timeline rc $?"; grep "layer:" $OUT/timeline.log
timeout 200 python tools/layer_ab.py --case E64top8:4 --case seed004_b4x512 --variant tree --variant nohint:-DSKINNY_L2_PREFETCH=0 --rounds 1 > $OUT/layer_ab.log 2>&1; echo "layer_ab rc $?"; grep "^|" $OUT/layer_ab.log
