export PYTHONPATH=.
nvidia-smi -L
for r in 1 2; do
timeout 120 python -m moe.bench --suite gemm --impl ours,cublas,torch-grouped --rounds 5 --json $OUT/gemm$r.json > $OUT/gemm$r.log 2>&1; grep -E "^\| gemm" $OUT/gemm$r.log | cut -c1-130
done
timeout 300 python -m moe.bench --suite seed004 --json $OUT/seed004.json > $OUT/seed004.log 2>&1; grep -E "layer +\| (ours|torch)" $OUT/seed004.log | cut -c1-140
