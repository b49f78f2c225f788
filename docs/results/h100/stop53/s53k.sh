export PYTHONPATH=.
nvidia-smi -L
echo "== pair skew"; SECS=3 timeout 250 python scratch/pair_skew.py 2>&1 | grep -v Warn | tee $OUT/pair_skew_tail.log
echo "== layer new"; timeout 150 python -m moe.bench --suite seed004 --case layer --impl ours,torch-loop,torch-grouped --json $OUT/layer_new.json > $OUT/layer_new.log 2>&1; grep -E "layer +\| (ours|torch)" $OUT/layer_new.log | cut -c1-120
echo "== gemm suite"; timeout 100 python -m moe.bench --suite gemm --impl ours,cublas,torch-grouped --rounds 5 --json $OUT/gemm.json > $OUT/gemm.log 2>&1; grep -E "^\| gemm" $OUT/gemm.log | cut -c1-120
