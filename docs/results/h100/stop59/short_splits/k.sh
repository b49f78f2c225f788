#!/bin/bash
export PYTHONPATH=.
python scratch/s59/short_ab.py $OUT/short_ab.json 2>&1 | tee $OUT/short_ab.log
