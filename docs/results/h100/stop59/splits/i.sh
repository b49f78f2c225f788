#!/bin/bash
export PYTHONPATH=.
PROBE=b1long python scratch/s59/splits_probe.py $OUT/splits_b1long.json 2>&1 | tee $OUT/splits_b1long.log
