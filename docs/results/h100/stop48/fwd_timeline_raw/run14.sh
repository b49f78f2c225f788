export PYTHONPATH=.
W=$OUT/w; mkdir -p $W
timeout 60 python scratch/tl_raw.py 16,2048,16,16,64 1 $W/tl_seed004a_causal.npy > $W/tl.log 2>&1
timeout 60 python scratch/tl_raw.py 16,2048,16,16,64 0 $W/tl_seed004a_full.npy >> $W/tl.log 2>&1
timeout 60 python scratch/tl_raw.py 4,1024,8,8,64 0 $W/tl_quick_d64.npy >> $W/tl.log 2>&1
cat $W/tl.log | grep -v Warn
cd $OUT && tar czf w.tgz w && rm -rf w
