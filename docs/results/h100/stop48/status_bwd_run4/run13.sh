export PYTHONPATH=.
W=$OUT/w; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $W/gpu.txt
for dt in fp16 bf16; do
  timeout 100 python -m attention.bench --backward --suite default --impl ours,torch-flash,torch-cudnn --dtype $dt --no-causal --json $W/bwd_${dt}--no-causal.json > $W/bwd_${dt}--no-causal.log 2>&1
done
cat $W/gpu.txt
cd $OUT && tar czf w.tgz w && rm -rf w
