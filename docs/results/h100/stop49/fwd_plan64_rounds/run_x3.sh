export PYTHONPATH=. PYTHONUNBUFFERED=1; W=$OUT/w; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader > $W/gpu.txt; cat $W/gpu.txt
ROUNDS3=1 ROUNDS=5 TAG=_x3_bf16 timeout 240 python scratch/fwd4sm.py > $W/x3_bf16.log 2>&1; cat $W/x3_bf16.log
ROUNDS3=1 FP16=1 ROUNDS=3 TAG=_x3_fp16 timeout 200 python scratch/fwd4sm.py > $W/x3_fp16.log 2>&1; cat $W/x3_fp16.log
mv $OUT/fwd4sm_x3_*.json $W/; cd $OUT && tar czf w.tgz w && rm -rf w
