#!/bin/bash
export PYTHONPATH=.
timeout 200 python scratch/s60/called_probe2.py > $OUT/called_probe2.log 2>&1; echo rc=$?
cat $OUT/called_probe2.log
