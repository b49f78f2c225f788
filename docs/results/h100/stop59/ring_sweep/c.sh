#!/bin/bash
export PYTHONPATH=.
python scratch/s59/paged_sweep.py --rounds 3 --json $OUT/paged_sweep.json 2>&1 | tee $OUT/paged_sweep.log
