#!/bin/bash
export PYTHONPATH=.
python scratch/s59/mt_probe.py $OUT/mt_probe.json 25 2>&1 | tee $OUT/mt_probe.log
