#!/bin/bash
export PYTHONPATH=.
python scratch/s59/splits_probe.py $OUT/splits_probe.json 2>&1 | tee $OUT/splits_probe.log
