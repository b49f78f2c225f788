export PYTHONPATH=. PYTHONUNBUFFERED=1
W=$OUT/lz; mkdir -p $W; nvidia-smi -L > $W/gpus.txt
V=lazy3=scratch/lazy3/flash_fwd_tma.cu,lazy1=scratch/lazy1/flash_fwd_tma.cu
LZ=1 ROUNDS=5 VARIANTS=$V OUT=$W TAG=_bf16 timeout 260 python scratch/fwd_ab.py > $W/lz_bf16.log 2>&1; cut -c1-260 $W/lz_bf16.log
LZ=1 ROUNDS=5 FP16=1 VARIANTS=$V OUT=$W TAG=_fp16 timeout 260 python scratch/fwd_ab.py > $W/lz_fp16.log 2>&1; cut -c1-260 $W/lz_fp16.log
cd $OUT && tar czf lz.tgz lz && rm -rf lz
