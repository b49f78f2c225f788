#!/bin/bash
export PYTHONPATH=.
O=$OUT/ag; mkdir -p $O
timeout 200 python scratch/s58/ag_parts.py $O/ag_parts.json 21 > $O/ag_parts.log 2>&1
echo "rc=$?"; cat $O/ag_parts.log | tail -16
