# stop 56 final: on an H200 the MoE suites (stop 54's h200.sh); on an H100 the MoE GPU tests and the decode suite
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi -L
if nvidia-smi -L | grep -q H200; then bash docs/results/h200/stop54/h200.sh; exit 0; fi
W=$OUT/s56; mkdir -p $W
echo "== moe + models + gemm + experts GPU tests"; t=$(date +%s); timeout 290 python -m pytest -q -x tests/test_moe_gpu.py tests/test_models_gpu.py tests/test_grouped_gemm_gpu.py tests/test_moe_experts_gpu.py > $W/tests.log 2>&1; tail -1 $W/tests.log; echo "$(( $(date +%s) - t )) s"
echo "== decode suite"; t=$(date +%s); timeout 270 python -m moe.bench --suite decode --json $W/moe_decode.json > $W/moe_decode.log 2>&1; echo "rc $? $(( $(date +%s) - t )) s"
tail -22 $W/moe_decode.log | cut -c1-200
