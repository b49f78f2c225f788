#!/bin/bash
export PYTHONPATH=.
O=$OUT/status; mkdir -p $O
nvidia-smi -L | tee $O/gpu.txt
t0=$(date +%s)
timeout 240 python -m pytest -q tests/test_models_gpu.py tests/test_moe_experts_gpu.py tests/test_kvcache_gpu.py > $O/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $O/tests.log
timeout 150 python -m moe.bench --suite seed004 --json $O/moe_seed004.json > $O/moe_seed004.log 2>&1
echo "seed004 rc=$? $(( $(date +%s) - t0 ))s"
timeout 200 python -m moe.bench --suite gemm --impl ours,cublas,torch-grouped --rounds 5 --json $O/moe_gemm.json > $O/moe_gemm.log 2>&1
echo "gemm rc=$? $(( $(date +%s) - t0 ))s"
