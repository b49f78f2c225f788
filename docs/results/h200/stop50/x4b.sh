export PYTHONPATH=. PYTHONUNBUFFERED=1
W=$OUT/x4b; mkdir -p $W/moe
nvidia-smi > $W/nvidia-smi.txt; git log -1 --format=%H > $W/tree.txt
moe() {
  export CUDA_VISIBLE_DEVICES=2; M=$W/moe
  for s in gemm seed004 decode; do t=$(date +%s)
    if [ $s = gemm ]; then a="--impl ours,cublas,torch-grouped --rounds 5"; else a=""; fi
    timeout 150 python -m moe.bench --suite $s $a --json $M/moe_$s.json > $M/moe_$s.log 2>&1
    echo "$s rc $? $(( $(date +%s) - t )) s $(nvidia-smi -i 2 --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader)" >> $M/times.txt
  done
}
(CUDA_VISIBLE_DEVICES=0 S4A=1 ROUNDS=7 OUT=$W TAG=_bf16 timeout 250 python scratch/fwd4sm.py > $W/s4a_bf16.log 2>&1) &
(CUDA_VISIBLE_DEVICES=1 S4A=1 FP16=1 ROUNDS=7 OUT=$W TAG=_fp16 timeout 250 python scratch/fwd4sm.py > $W/s4a_fp16.log 2>&1) &
(moe > $W/moe.out 2>&1) &
(export CUDA_VISIBLE_DEVICES=3; for i in 1 2 3; do for dt in fp16 bf16; do timeout 80 python -m attention.bench --suite seed004 --case seed004_a --causal --dtype $dt --impl ours,torch-flash,torch-cudnn --json $W/bench_${dt}_$i.json > $W/bench_${dt}_$i.log 2>&1; done; done) &
wait
cat $W/s4a_bf16.log $W/s4a_fp16.log | cut -c1-220; cat $W/moe/times.txt
python - $W <<'PY'
import json, glob, sys, os
for f in sorted(glob.glob(sys.argv[1] + "/bench_*.json")):
    d = json.load(open(f)); r = {x["impl"]: x for x in d["results"]}
    print(os.path.basename(f), " ".join(f"{k} {v['median_ms']*1e3:.1f}" for k, v in r.items() if v.get("median_ms")), f"x {r['ours']['speedup_vs_best_baseline']:.3f}")
PY
cd $OUT && tar czf x4b.tgz x4b && rm -rf x4b
