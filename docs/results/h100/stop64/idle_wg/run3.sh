#!/bin/bash
export PYTHONPATH=.
s=$(date +%s); timeout 500 python scratch/s64/idle_ab.py > $OUT/idle_ab.log 2>&1; echo "ab rc $? $(( $(date +%s) - s )) s"; cat $OUT/idle_ab.log
