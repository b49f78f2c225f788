export PYTHONPATH=. PYTHONUNBUFFERED=1; W=$OUT/w; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader > $W/gpu.txt; cat $W/gpu.txt
SMOKE=1 timeout 90 python scratch/fwd4sm.py > $W/smoke.log 2>&1 || { cat $W/smoke.log; cd $OUT && tar czf w.tgz w; exit 1; }
cat $W/smoke.log
timeout 240 python -m pytest -q -x tests/test_attention_gpu.py -k "tma" > $W/tests.log 2>&1; tail -3 $W/tests.log
ROUNDS=5 timeout 200 python scratch/fwd4sm.py > $W/bf16.log 2>&1; cat $W/bf16.log
FP16=1 CAUSAL=0 ROUNDS=3 TAG=_fp16 timeout 90 python scratch/fwd4sm.py > $W/fp16.log 2>&1; cat $W/fp16.log
cd $OUT && tar czf w.tgz w && rm -rf w
