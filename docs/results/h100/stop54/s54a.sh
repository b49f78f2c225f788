export PYTHONPATH=.
nvidia-smi -L
echo "== moe + models + gemm GPU tests"; timeout 300 python -m pytest -q -x tests/test_moe_gpu.py tests/test_models_gpu.py tests/test_grouped_gemm_gpu.py tests/test_moe_experts_gpu.py 2>&1 | tail -1
for tool in racecheck memcheck; do echo "== $tool gemm"; timeout 200 compute-sanitizer --tool $tool --report-api-errors no python tools/sanitize.py gemm > $OUT/${tool}_gemm.log 2>&1; tail -2 $OUT/${tool}_gemm.log; done
