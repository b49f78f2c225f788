export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi -L; git log -1 --format=%h; mkdir -p $OUT/s61
t=$(date +%s)
timeout 240 python -m pytest -q -x tests/test_grouped_gemm_gpu.py tests/test_moe_gpu.py > $OUT/s61/tests.log 2>&1
echo "tests rc $? $(( $(date +%s) - t )) s"; tail -3 $OUT/s61/tests.log
timeout 330 python scratch/s61/skip_ab.py 2>&1 | tee $OUT/s61/skip_ab.log | grep -v "^    "
