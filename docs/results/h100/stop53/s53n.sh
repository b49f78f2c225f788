export PYTHONPATH=.
nvidia-smi -L
echo "== quick GEMM tests (relaxed.cluster arrive)"; timeout 150 python -m pytest -q -x tests/test_grouped_gemm_gpu.py -k "pair or split_k or persistent_many or dense_offsets" 2>&1 | tail -1
if ! nvidia-smi -L | grep -q H200; then echo "not an H200: no MoE suites"; exit 0; fi
timeout 100 python -m moe.bench --suite gemm --impl ours,cublas,torch-grouped --rounds 5 --json $OUT/gemm.json > $OUT/gemm.log 2>&1; grep -E "^\| gemm" $OUT/gemm.log | cut -c1-100
timeout 200 python -m moe.bench --suite seed004 --case layer --impl ours,torch-loop,torch-grouped --json $OUT/layer.json > $OUT/layer.log 2>&1; grep -E "layer +\| (ours|torch)" $OUT/layer.log | cut -c1-120
