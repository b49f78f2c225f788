#!/bin/bash
export PYTHONPATH=.
O=$OUT/ag2; mkdir -p $O
timeout 250 python scratch/s58/ag_parts2.py $O/ag_parts2.json 21 > $O/ag_parts2.log 2>&1
echo "rc=$?"; cat $O/ag_parts2.log | tail -20
