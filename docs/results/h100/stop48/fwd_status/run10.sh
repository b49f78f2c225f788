export PYTHONPATH=.
W=$OUT/w; mkdir -p $W
nvidia-smi --query-gpu=name --format=csv,noheader > $W/gpu.txt
for dt in bf16 fp16; do
  timeout 80 python -m attention.bench --suite seed004 --causal --impl ours,torch-flash,torch-cudnn --dtype $dt --json $W/fwd_seed004_causal_$dt.json > $W/fwd_seed004_causal_$dt.log 2>&1
  for c in --causal --no-causal; do
    timeout 80 python -m attention.bench --suite quick $c --impl ours,torch-flash,torch-cudnn --dtype $dt --json $W/fwd_quick_${dt}$c.json > $W/fwd_quick_${dt}$c.log 2>&1
  done
done
cd $OUT && tar czf w.tgz w && rm -rf w
