# stop 55, v4.8 (unsplit items first): GPU tests, then the decode suite with both torch baselines
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi -L
W=$OUT/s55q; mkdir -p $W
echo "== moe + models + gemm + experts GPU tests"; timeout 290 python -m pytest -q -x tests/test_moe_gpu.py tests/test_models_gpu.py tests/test_grouped_gemm_gpu.py tests/test_moe_experts_gpu.py > $W/tests.log 2>&1; tail -1 $W/tests.log
echo "== decode suite"; t=$(date +%s); timeout 270 python -m moe.bench --suite decode --json $W/moe_decode.json > $W/moe_decode.log 2>&1; echo "rc $? $(( $(date +%s) - t )) s"
tail -22 $W/moe_decode.log | cut -c1-200
