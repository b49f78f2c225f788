export PYTHONPATH=.
nvidia-smi -L
RC_VARIANTS="I" bash scratch/rc/run.sh
VARIANTS=old=.,H=scratch/rc/Hk,I=scratch/rc/Ik,old2=. CASES=qwen:nocausal,hd256,seed004_b16_s2048_h16_d64,llama8b_long,hb125m:nocausal ROUNDS=7 NPROF=8 DTYPES=bf16 timeout 450 python scratch/rc/bwd_prof_ab.py 2>&1 | tee $OUT/ab4.log | grep -v Warn | cut -c1-260 | tail -12
