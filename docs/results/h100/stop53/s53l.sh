export PYTHONPATH=.
nvidia-smi -L
echo "== moe + models GPU tests"; timeout 250 python -m pytest -q -x tests/test_moe_gpu.py tests/test_models_gpu.py tests/test_grouped_gemm_gpu.py -k "not every_config and not split_k" 2>&1 | tail -1
for r in 1 2; do echo "== gemm suite $r"; timeout 100 python -m moe.bench --suite gemm --impl ours,cublas,torch-grouped --rounds 5 --json $OUT/gemm$r.json > $OUT/gemm$r.log 2>&1; grep -E "^\| gemm" $OUT/gemm$r.log | cut -c1-100; done
