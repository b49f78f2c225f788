export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi -L; mkdir -p $OUT/s61/block
t=$(date +%s); timeout 200 python -m pytest -q -x tests/test_kvcache_gpu.py > $OUT/s61/block/tests.log 2>&1; echo "tests rc $? $(( $(date +%s) - t )) s"; tail -2 $OUT/s61/block/tests.log
for L in 8192 32768 131072; do timeout 150 python scratch/s61/paged_probe.py $L 2>&1 | tee $OUT/s61/block/time_L$L.log | grep -v "^   \[" ; done
