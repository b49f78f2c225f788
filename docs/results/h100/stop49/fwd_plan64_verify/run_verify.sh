export PYTHONPATH=. PYTHONUNBUFFERED=1; W=$OUT/w; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader > $W/gpu.txt; cat $W/gpu.txt
VERIFY=1 ROUNDS=5 TAG=_verify_bf16 timeout 200 python scratch/fwd4sm.py > $W/verify_bf16.log 2>&1; cat $W/verify_bf16.log
VERIFY=1 FP16=1 ROUNDS=3 TAG=_verify_fp16 timeout 150 python scratch/fwd4sm.py > $W/verify_fp16.log 2>&1; cat $W/verify_fp16.log
mv $OUT/fwd4sm_verify_*.json $W/; cd $OUT && tar czf w.tgz w && rm -rf w
