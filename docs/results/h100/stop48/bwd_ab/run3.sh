export PYTHONPATH=.
W=$OUT/w; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv > $W/gpu.txt
VARIANTS=old=scratch/oldbwd/attention/kernels,new=.,old3=scratch/oldbwd/attention/kernels@3,new3=.@3 timeout 300 python scratch/bwd_ab.py > $W/ab.log 2>&1; cat $W/ab.log | cut -c1-200
cd $OUT && tar czf w.tgz w && rm -rf w
