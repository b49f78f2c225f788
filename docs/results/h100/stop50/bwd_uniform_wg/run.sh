export PYTHONPATH=.
W=$OUT/w; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv > $W/gpu.txt
CASES=hd256,hd256:nocausal,quick_d256:causal,quick_d256:nocausal VARIANTS=old=.,n3=scratch/newk3,n4=scratch/newk4 timeout 250 python scratch/bwd_ab.py > $W/ab256.log 2>&1; cut -c1-200 $W/ab256.log
CASES=llama8b_long,hb125m:nocausal,qwen,seed004_b16_s2048_h16_d64,seed004_b16_s2048_h16_d64:causal VARIANTS=old=.,n4=scratch/newk4 timeout 250 python scratch/bwd_ab.py > $W/ab128.log 2>&1; cut -c1-200 $W/ab128.log
cd $OUT && tar czf w.tgz w && rm -rf w
