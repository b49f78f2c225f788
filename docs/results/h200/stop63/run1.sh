#!/bin/bash
export PYTHONPATH=.
nvidia-smi -L | tee $OUT/gpu.txt
python scratch/s63/nvrtc_probe.py > $OUT/nvrtc_probe.log 2>&1
python -m pytest -q -p no:cacheprovider tests/test_engine_cpu.py -k every_profile > $OUT/every_profile.log 2>&1
python -m pytest -q -p no:cacheprovider tests/test_engine_cpu.py -k "every_profile and sm_80" --collect-only -q 2>&1 | tail -3 >> $OUT/every_profile.log
python scratch/s63/who_pays.py 7 > $OUT/who_pays.log 2>&1
tail -5 $OUT/every_profile.log; tail -25 $OUT/nvrtc_probe.log | cut -c1-200; cat $OUT/who_pays.log | tail -12
