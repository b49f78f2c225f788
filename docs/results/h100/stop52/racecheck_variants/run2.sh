export PYTHONPATH=.
nvidia-smi -L
RC_VARIANTS="E F" bash scratch/rc/run.sh
VARIANTS=old=.,B=scratch/rc/Bk,E=scratch/rc/Ek,F=scratch/rc/Fk CASES=seed004_b16_s2048_h16_d64,hb125m,hd256,llama8b_long,qwen:nocausal ROUNDS=5 NPROF=8 DTYPES=bf16 timeout 400 python scratch/rc/bwd_prof_ab.py 2>&1 | tee $OUT/ab2.log | grep -v Warn | cut -c1-240 | tail -12
