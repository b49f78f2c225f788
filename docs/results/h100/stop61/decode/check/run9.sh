export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi -L; mkdir -p $OUT/s61/check
P=contig,p16,p16_old,p256,p256_old
run() { timeout 120 python scratch/s61/paged_probe2.py "$@" 2>&1 | tee -a $OUT/s61/check/probe.log | grep -E "^==|^   [a-z]" | cut -c1-60; }
run 8 32 8 128 1024 $P 1
run 8 16 16 64 1024 $P 4
run 1 16 16 64 32768 contig,p16,p16_old_w8s3,p256,p256_old_w8s3 4
run 8 16 16 64 8192 $P 4
run 1 32 8 128 32768 $P 4
