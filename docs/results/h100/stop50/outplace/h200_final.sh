export PYTHONPATH=. PYTHONUNBUFFERED=1
W=$OUT/final; mkdir -p $W; nvidia-smi -L > $W/gpus.txt; git log -1 --format=%H > $W/tree.txt
S4AONLY=1 FP16=1 ROUNDS=5 VARIANTS=c1=scratch/copy1/flash_fwd_tma.cu,c2=scratch/copy2/flash_fwd_tma.cu,c3=scratch/copy3/flash_fwd_tma.cu OUT=$W TAG=_copies timeout 150 python scratch/fwd_ab.py > $W/copies.log 2>&1; cut -c1-300 $W/copies.log
FP16=1 OUT=$W TAG=_fp16 timeout 120 python scratch/outplace.py > $W/outplace_fp16.log 2>&1; cut -c1-160 $W/outplace_fp16.log
bash scratch/status.sh fwd 2>&1 | tail -10
for i in 1 2 3; do for dt in fp16 bf16; do
  timeout 80 python -m attention.bench --suite seed004 --case seed004_a --causal --dtype $dt --impl ours,torch-flash,torch-cudnn --json $W/bench_${dt}_$i.json > $W/bench_${dt}_$i.log 2>&1
done; done
python - $W <<'PY'
import json, glob, sys, os
for f in sorted(glob.glob(sys.argv[1] + "/bench_*.json")):
    d = json.load(open(f)); r = {x["impl"]: x for x in d["results"]}
    print(os.path.basename(f), " ".join(f"{k} {v['median_ms']*1e3:.1f}" for k, v in r.items() if v.get("median_ms")), f"x {r['ours']['speedup_vs_best_baseline']:.3f}")
PY
cd $OUT && tar czf final.tgz final && rm -rf final
