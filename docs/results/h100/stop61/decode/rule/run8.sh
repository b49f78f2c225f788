export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi -L; mkdir -p $OUT/s61/rule
V=contig,p16_w8s3,p16_w4s4,p256_w8s3,p256_w4s4
run() { timeout 120 python scratch/s61/paged_probe2.py "$@" 2>&1 | tee -a $OUT/s61/rule/probe.log | grep -E "^==|^   [a-z]" | cut -c1-60; }
for i in 1 2; do
run 1 16 16 64 8192 $V
run 1 16 16 64 32768 $V
run 1 16 16 64 131072 $V
done
run 4 16 16 64 32768 $V
run 2 16 16 64 32768 $V
