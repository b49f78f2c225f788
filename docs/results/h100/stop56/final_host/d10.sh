export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi -L
python tools/call_overhead.py --rounds 21 --json $OUT/call_overhead.json > $OUT/call_overhead.log 2>&1; cat $OUT/call_overhead.log
python scratch/bwd_launches_ab.py 41 > $OUT/ab.log 2>&1; tail -7 $OUT/ab.log
python scratch/chain_probe.py 21 > $OUT/chain.log 2>&1; tail -20 $OUT/chain.log
