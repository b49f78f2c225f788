#!/bin/bash
export PYTHONPATH=.
python scratch/s59/paged_ab.py --rounds 5 --plan-ab --variants 0,1 --json $OUT/paged_ab.json 2>&1 | tee $OUT/paged_ab.log
