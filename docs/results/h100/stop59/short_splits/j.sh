#!/bin/bash
export PYTHONPATH=.
PROBE=l1k python scratch/s59/splits_probe.py $OUT/splits_l1k.json 2>&1 | tee $OUT/splits_l1k.log
