export PYTHONPATH=. PYTHONUNBUFFERED=1; W=$OUT/w; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader > $W/gpu.txt; cat $W/gpu.txt
C4=1 SMOKE=1 timeout 90 python scratch/fwd4sm.py > $W/smoke.log 2>&1 || { cat $W/smoke.log; cd $OUT && tar czf w.tgz w; exit 1; }
C4PLAN=1 ROUNDS=5 TAG=_c4p_bf16 timeout 200 python scratch/fwd4sm.py > $W/c4p_bf16.log 2>&1; cat $W/c4p_bf16.log
C4PLAN=1 FP16=1 ROUNDS=3 TAG=_c4p_fp16 timeout 120 python scratch/fwd4sm.py > $W/c4p_fp16.log 2>&1; cat $W/c4p_fp16.log
mv $OUT/fwd4sm_c4p_*.json $W/
timeout 220 python -m pytest -q -x tests/test_attention_gpu.py tests/test_tma_gpu.py tests/test_varlen_gpu.py > $W/tests.log 2>&1; echo "tests rc $?" >> $W/tests.log; tail -3 $W/tests.log
cd $OUT && tar czf w.tgz w && rm -rf w
