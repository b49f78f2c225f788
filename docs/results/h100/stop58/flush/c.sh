#!/bin/bash
export PYTHONPATH=.
O=$OUT/flush; mkdir -p $O
nvidia-smi -L
python scratch/s58/flush_probe.py $O/flush_probe.json 5 2>&1 | tee $O/flush_probe.log | tail -14
