export PYTHONPATH=.
nvidia-smi -L
nvidia-smi --query-gpu=power.limit,clocks.max.sm --format=csv
echo "== ksplit patch"; (timeout 330 bash docs/perf/next/gemm_ksplit_run.sh) 2>&1 | grep -v Warn | tee $OUT/ksplit.log | tail -12
echo "== bwd pair tests"; timeout 200 python -m pytest -q -x tests/test_attention_bwd_gpu.py -k "256" 2>&1 | tail -2
echo "== bwd pair A/B"; VARIANTS=old=scratch/oldbwd/attention/kernels,new=. CASES=hd256,hd256:nocausal,quick_d256 ROUNDS=5 NPROF=8 DTYPES=bf16,fp16 timeout 200 python docs/results/h100/stop51/bwd_prof_ab.py 2>&1 | grep -v Warn | tee $OUT/bwd_ab.log | tail -14
