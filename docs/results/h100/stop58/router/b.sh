#!/bin/bash
export PYTHONPATH=.
O=$OUT/router_tl; mkdir -p $O
t0=$(date +%s)
python tools/decode_timeline.py --case E64top8:1 --case seed004:1 --calls 7 --json $O/tl_new.json > $O/tl_new.log 2>&1
echo "tl new rc=$? $(( $(date +%s) - t0 ))s"
python tools/decode_timeline.py --case E64top8:1 --case seed004:1 --calls 7 --define=-DDECODE_ROUTER_ITEMS=1 --json $O/tl_items.json > $O/tl_items.log 2>&1
echo "tl items rc=$? $(( $(date +%s) - t0 ))s"
cat $O/tl_new.log $O/tl_items.log | grep -v "^ *up items per\|first down\|down items\|up items done"
