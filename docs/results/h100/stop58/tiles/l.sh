#!/bin/bash
export PYTHONPATH=.
O=$OUT/tiles; mkdir -p $O
timeout 500 python tools/layer_ab.py --case seed004:1 --case seed004:4 --case E64top8:1 \
  --variant base --variant up32:up=8/16/4 --variant up16:up=8/16/8 --variant up128:up=8/32/2 --rounds 5 \
  --json $O/layer_ab.json > $O/layer_ab.log 2>&1
echo "rc=$?"; tail -6 $O/layer_ab.log
