export PYTHONPATH=. PYTHONUNBUFFERED=1
W=$OUT/bimodal; mkdir -p $W; nvidia-smi -L > $W/gpus.txt
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,power.limit,temperature.gpu,temperature.memory --format=csv > $W/gpu_start.txt
for i in 1 2 3 4; do for dt in fp16 bf16; do
  timeout 80 python -m attention.bench --suite seed004 --case seed004_a --causal --dtype $dt --impl ours,torch-flash,torch-cudnn --json $W/bench_${dt}_$i.json > $W/bench_${dt}_$i.log 2>&1
  nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu,temperature.memory --format=csv,noheader >> $W/clk.txt
done; done
N=10 FP16=1 OUT=$W TAG=_fp16 timeout 150 python scratch/addr.py > $W/addr_fp16.log 2>&1
N=10 OUT=$W TAG=_bf16 timeout 150 python scratch/addr.py > $W/addr_bf16.log 2>&1
python - $W <<'PY'
import json, glob, sys, os
for f in sorted(glob.glob(sys.argv[1] + "/bench_*.json")):
    d = json.load(open(f)); r = {x["impl"]: x for x in d["results"]}
    print(os.path.basename(f), " ".join(f"{k} {v['median_ms']*1e3:.1f}" for k, v in r.items() if v.get("median_ms")), f"x {r['ours']['speedup_vs_best_baseline']:.3f}", r['ours']['clocks'].get('temperature_max_c'))
PY
cut -c1-200 $W/addr_fp16.log $W/addr_bf16.log
cd $OUT && tar czf bimodal.tgz bimodal && rm -rf bimodal
