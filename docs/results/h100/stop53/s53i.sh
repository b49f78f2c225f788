export PYTHONPATH=.; nvidia-smi -L; SECS=3 timeout 400 python scratch/pair_skew.py 2>&1 | grep -v Warn | tee $OUT/pair_skew.log
