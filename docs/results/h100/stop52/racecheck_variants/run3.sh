export PYTHONPATH=.
nvidia-smi -L
RC_VARIANTS="H" bash scratch/rc/run.sh
VARIANTS=old=.,F=scratch/rc/Fk,H=scratch/rc/Hk CASES=seed004_b16_s2048_h16_d64,hb125m,hb125m:nocausal,hd256,qwen:nocausal,seed004_b16_s2048_h16_d64:causal ROUNDS=5 NPROF=8 DTYPES=bf16 timeout 400 python scratch/rc/bwd_prof_ab.py 2>&1 | tee $OUT/ab3.log | grep -v Warn | cut -c1-240 | tail -12
