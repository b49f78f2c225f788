export PYTHONPATH=. PYTHONUNBUFFERED=1
W=$OUT/lz2; mkdir -p $W; nvidia-smi -L > $W/gpus.txt
V=lazy3=scratch/lazy3/flash_fwd_tma.cu,lazy1=scratch/lazy1/flash_fwd_tma.cu
LZ2=1 ROUNDS=7 VARIANTS=$V OUT=$W TAG=_bf16 timeout 280 python scratch/fwd_ab.py > $W/lz2_bf16.log 2>&1; cut -c1-260 $W/lz2_bf16.log
LZ2=1 ROUNDS=7 FP16=1 VARIANTS=$V OUT=$W TAG=_fp16 timeout 280 python scratch/fwd_ab.py > $W/lz2_fp16.log 2>&1; cut -c1-260 $W/lz2_fp16.log
cd $OUT && tar czf lz2.tgz lz2 && rm -rf lz2
