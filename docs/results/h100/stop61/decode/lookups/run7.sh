export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi -L; mkdir -p $OUT/s61/block2
D64=contig,p16,p16_w4s4,p16_old,p256,p256_w4s4,p256_old
P=contig,p16,p16_old,p256,p256_old
run() { timeout 120 python scratch/s61/paged_probe2.py "$@" 2>&1 | tee -a $OUT/s61/block2/probe.log | grep -E "^==|^   [a-z]" | cut -c1-60; }
run 1 16 16 64 8192 $D64
run 1 16 16 64 32768 $D64
run 8 16 16 64 8192 $D64
run 8 16 16 64 32768 $D64
run 1 16 16 64 1024 $P
run 8 16 16 64 1024 $P
run 1 32 8 128 8192 $P
run 8 32 8 128 32768 $P
run 1 32 8 128 1024 $P
run 8 32 32 128 8192 $P
run 64 16 16 64 8192 $P
