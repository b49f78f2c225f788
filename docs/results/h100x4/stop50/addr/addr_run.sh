export PYTHONPATH=. PYTHONUNBUFFERED=1
W=$OUT/addr; mkdir -p $W; nvidia-smi -L > $W/gpus.txt
for g in 0 1 2 3; do
  case $g in 0) e="SEED=1";; 1) e="SEED=1 FP16=1";; 2) e="SEED=2";; 3) e="SEED=2 FP16=1";; esac
  (env CUDA_VISIBLE_DEVICES=$g $e N=8 OUT=$W TAG=_g$g timeout 200 python scratch/addr.py > $W/g$g.log 2>&1) &
done
wait
for g in 0 1 2 3; do echo "== gpu $g"; cat $W/g$g.log | cut -c1-200; done
cd $OUT && tar czf addr.tgz addr && rm -rf addr
