export PYTHONPATH=. PYTHONUNBUFFERED=1; W=$OUT/w; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader > $W/gpu.txt; cat $W/gpu.txt
C4=1 SMOKE=1 timeout 90 python scratch/fwd4sm.py > $W/smoke.log 2>&1 || { cat $W/smoke.log; cd $OUT && tar czf w.tgz w; exit 1; }
cat $W/smoke.log
C4=1 ROUNDS=5 TAG=_c4_bf16 timeout 300 python scratch/fwd4sm.py > $W/c4_bf16.log 2>&1; cat $W/c4_bf16.log
C4=1 FP16=1 CAUSAL=0 ROUNDS=3 TAG=_c4_fp16 timeout 150 python scratch/fwd4sm.py > $W/c4_fp16.log 2>&1; cat $W/c4_fp16.log
mv $OUT/fwd4sm_c4_*.json $W/; cd $OUT && tar czf w.tgz w && rm -rf w
