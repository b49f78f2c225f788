export PYTHONPATH=.
nvidia-smi -L
echo "== dense A/B (held calls)"; timeout 150 python scratch/dense_ab.py 2>&1 | grep -v Warn | tee $OUT/dense_ab2.log
for r in 1 2; do
echo "== layer new $r"; timeout 200 python -m moe.bench --suite seed004 --case layer --impl ours,torch-loop,torch-grouped --json $OUT/layer_new$r.json > $OUT/layer_new$r.log 2>&1; grep -E "layer +\| (ours|torch)" $OUT/layer_new$r.log | cut -c1-140
echo "== layer old $r"; (cd scratch/headtree && timeout 200 python -m moe.bench --suite seed004 --case layer --impl ours,torch-loop --json $OUT/layer_old$r.json > $OUT/layer_old$r.log 2>&1); grep -E "layer +\| (ours|torch)" $OUT/layer_old$r.log | cut -c1-140
done
