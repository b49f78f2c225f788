export PYTHONPATH=. PYTHONUNBUFFERED=1; W=$OUT/w; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader > $W/gpu.txt; cat $W/gpu.txt
C4WIDE=1 ROUNDS=5 TAG=_c4w_bf16 timeout 330 python scratch/fwd4sm.py > $W/c4w_bf16.log 2>&1; cat $W/c4w_bf16.log
C4WIDE=1 FP16=1 CAUSAL=0 ROUNDS=3 TAG=_c4w_fp16 timeout 200 python scratch/fwd4sm.py > $W/c4w_fp16.log 2>&1; cat $W/c4w_fp16.log
mv $OUT/fwd4sm_c4w_*.json $W/; cd $OUT && tar czf w.tgz w && rm -rf w
