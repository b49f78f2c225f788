export PYTHONPATH=. PYTHONUNBUFFERED=1; W=$OUT/w; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader > $W/gpu.txt; cat $W/gpu.txt
Q128=1 ROUNDS=5 OUT=$W timeout 200 python scratch/fwd_ab.py > $W/ab_bf16.log 2>&1; cut -c1-230 $W/ab_bf16.log
timeout 330 python -m pytest -q -x tests/test_attention_gpu.py tests/test_tma_gpu.py > $W/tests.log 2>&1; echo "tests rc $?" >> $W/tests.log; tail -2 $W/tests.log
cd $OUT && tar czf w.tgz w && rm -rf w
