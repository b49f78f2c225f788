export PYTHONPATH=.
W=$OUT/w; mkdir -p $W
nvidia-smi --query-gpu=name --format=csv,noheader > $W/gpu.txt
OUT=$W SMOKE=1 ROUNDS=1 timeout 60 python scratch/fwd2sm.py > $W/smoke.log 2>&1; echo "smoke rc $?"; tail -3 $W/smoke.log | cut -c1-300
if grep -q "planned" $W/smoke.log; then
OUT=$W timeout 200 python scratch/fwd2sm.py > $W/fwd2sm_bf16.log 2>&1; tail -12 $W/fwd2sm_bf16.log | cut -c1-330
fi
cd $OUT && tar czf w.tgz w && rm -rf w
