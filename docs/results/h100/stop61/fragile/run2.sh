# H200: the MoE suites (issue 14's H200 rows); H100: the pair-at-256-rows A/B
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi -L; git log -1 --format=%h
if nvidia-smi -L | grep -q H200; then
  W=$OUT/h200; mkdir -p $W; nvidia-smi > $W/nvidia-smi.txt
  for s in "gemm --impl ours,cublas,torch-grouped --rounds 5" "seed004" "decode"; do
    set -- $s; t=$(date +%s)
    timeout 200 python -m moe.bench --suite $s --json $W/moe_$1.json > $W/moe_$1.log 2>&1
    echo "$1 rc $? $(( $(date +%s) - t )) s"
  done
  grep -E "^\| gemm" $W/moe_gemm.log | cut -c1-150
  grep -E "layer +\| (ours|torch)" $W/moe_seed004.log | cut -c1-160
  tail -16 $W/moe_decode.log | cut -c1-170
else
  mkdir -p $OUT/s61; python scratch/s61/fragile.py 2>&1 | tee $OUT/s61/fragile.log | grep -v "^  "
fi
