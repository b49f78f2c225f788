export PYTHONPATH=.
mkdir -p $OUT/w
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/w/gpu.txt
for dt in fp16 bf16; do
  for c in --no-causal --causal; do
    timeout 200 python -m attention.bench --suite default --case hb125m --case qwen --case seed004_b --backward $c --sweep --dtype $dt > $OUT/w/sweep_${dt}$c.log 2>&1
  done
done
grep -hE "Bwd|sweep|config|x heur|fastest" $OUT/w/*.log | head -60 | cut -c1-220
cd $OUT && tar czf w.tgz w && rm -rf w
