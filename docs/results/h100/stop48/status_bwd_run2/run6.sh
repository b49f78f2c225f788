export PYTHONPATH=.
W=$OUT/w; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv > $W/gpu.txt
for dt in bf16 fp16; do
  for c in --no-causal ""; do
    s=$(date +%s)
    timeout 140 python -m attention.bench --backward --suite default --impl ours,torch-flash,torch-cudnn --dtype $dt $c --json $W/bwd_${dt}${c}.json > $W/bwd_${dt}${c}.log 2>&1
    echo "$dt $c rc $? $(( $(date +%s) - s )) s" >> $W/times.txt
    nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader >> $W/times.txt
  done
done
timeout 100 python -m attention.bench --backward --suite seed004 --impl ours,torch-flash,torch-cudnn --causal --json $W/bwd_seed004_causal.json > $W/bwd_seed004_causal.log 2>&1
cat $W/times.txt
cd $OUT && tar czf w.tgz w && rm -rf w
