# usage: bash scratch/status.sh bwd|fwd   (results under $OUT/<gpu>_<mode>.tgz)
export PYTHONPATH=. PYTHONUNBUFFERED=1
MODE=$1
G=$(nvidia-smi -i ${CUDA_VISIBLE_DEVICES:-0} --query-gpu=name --format=csv,noheader | head -1)
case "$G" in *H200*) g=h200;; *) g=h100;; esac
W=$OUT/${g}_$MODE; mkdir -p $W
nvidia-smi -i ${CUDA_VISIBLE_DEVICES:-0} --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu,driver_version --format=csv > $W/gpu.txt
git log -1 --format=%H >> $W/gpu.txt 2>/dev/null
echo "GPU $G"
run() {  # name timeout args...
  n=$1; t=$2; shift 2; s=$(date +%s)
  timeout $t python -m attention.bench "$@" --impl ours,torch-flash,torch-cudnn --json $W/$n.json > $W/$n.log 2>&1
  echo "$n rc $? $(( $(date +%s) - s )) s $(nvidia-smi -i ${CUDA_VISIBLE_DEVICES:-0} --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader)" | tee -a $W/times.txt
}
if [ $MODE = bwd ]; then
  for dt in bf16 fp16; do for c in --no-causal ""; do
    run bwd_${dt}${c} 140 --backward --suite default --dtype $dt $c
  done; done
  run bwd_seed004_causal 100 --backward --suite seed004 --causal
else
  for dt in bf16 fp16; do for c in --causal --no-causal ""; do
    run fwd_default_${dt}${c} 90 --suite default --dtype $dt $c
  done
    for c in --causal --no-causal; do run fwd_quick_${dt}${c} 60 --suite quick --dtype $dt $c; done
  done
fi
python - $W <<'PY'
import json, glob, sys, os
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    try: d = json.load(open(f))
    except Exception as e: print(os.path.basename(f), "unreadable", e); continue
    rows = d.get("results", d if isinstance(d, list) else [])
    out = []
    for r in rows:
        if r.get("impl") == "ours":
            x = r.get("speedup_vs_best_baseline")
            out.append(f"{r.get('case')}:{x:.3f}" if x else f"{r.get('case')}:{r.get('status')}")
    print(os.path.basename(f), " ".join(map(str, out))[:400])
PY
cd $OUT && tar czf ${g}_$MODE.tgz ${g}_$MODE && rm -rf ${g}_$MODE
