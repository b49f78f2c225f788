export PYTHONPATH=.
W=$OUT/w; mkdir -p $W
nvidia-smi --query-gpu=name --format=csv,noheader > $W/gpu.txt
OUT=$W ROUNDS=5 timeout 280 python scratch/fwd_ab.py > $W/fwd_ab_bf16.log 2>&1; cut -c1-200 $W/fwd_ab_bf16.log
OUT=$W ROUNDS=3 FP16=1 TAG=_fp16 ONLY=64 timeout 100 python scratch/fwd_ab.py > $W/fwd_ab_fp16.log 2>&1; cut -c1-200 $W/fwd_ab_fp16.log
cd $OUT && tar czf w.tgz w && rm -rf w
