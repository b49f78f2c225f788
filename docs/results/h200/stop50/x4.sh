# one H200 per job: attention forward status twice (GPUs 0 and 3), forward+backward status (GPU 1), MoE suites (GPU 2)
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=scratch/status.sh
mkdir -p $OUT/run2 $OUT/moe
nvidia-smi > $OUT/nvidia-smi.txt
moe() {
  export CUDA_VISIBLE_DEVICES=2; M=$OUT/moe
  nvidia-smi -i 2 --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu,driver_version --format=csv > $M/gpu.txt
  git log -1 --format=%H >> $M/gpu.txt
  for s in gemm seed004 decode; do t=$(date +%s)
    if [ $s = gemm ]; then a="--impl ours,cublas,torch-grouped --rounds 5"; else a=""; fi
    timeout 200 python -m moe.bench --suite $s $a --json $M/moe_$s.json > $M/moe_$s.log 2>&1
    echo "$s rc $? $(( $(date +%s) - t )) s $(nvidia-smi -i 2 --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader)" >> $M/times.txt
  done
}
(CUDA_VISIBLE_DEVICES=0 bash $S fwd > $OUT/fwd.out 2>&1) &
(CUDA_VISIBLE_DEVICES=1 bash $S bwd > $OUT/bwd.out 2>&1) &
(moe > $OUT/moe.out 2>&1) &
(sleep 20; CUDA_VISIBLE_DEVICES=3 OUT=$OUT/run2 bash $S fwd > $OUT/fwd2.out 2>&1) &
wait
tail -11 $OUT/fwd.out; echo ---; tail -11 $OUT/fwd2.out; echo ---; tail -6 $OUT/bwd.out; cat $OUT/moe/times.txt
