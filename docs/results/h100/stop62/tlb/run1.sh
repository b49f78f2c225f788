#!/bin/bash
# stop 62, device call 1: the paged TLB-warm A/B, the B8 L1k d64 bimodality probe; on an H200 the MoE suites too
export PYTHONPATH=.
nvidia-smi -L | tee $OUT/gpu.txt
P=scratch/s62/tlb_probe.py
V=contig,p16,p16_tlb,p256,p256_tlb
for shape in "1 32 8 128 1024" "1 32 32 128 1024" "1 16 16 64 1024" "8 16 16 64 1024" "8 32 8 128 1024"; do
  python $P $shape $V 2>&1 | tee -a $OUT/tlb.log
done
python $P 1 16 16 64 32768 contig,p16,p16_tlb 2>&1 | tee -a $OUT/tlb.log
python $P 1 16 16 64 8192 contig,p16,p16_tlb 2>&1 | tee -a $OUT/tlb.log
python scratch/s62/bimodal.py > $OUT/bimodal.log 2>&1
if nvidia-smi -L | grep -q H200; then
  mkdir -p $OUT/h200
  python -m moe.bench --suite gemm --impl ours,cublas,torch-grouped --rounds 5 --json $OUT/h200/moe_gemm.json > $OUT/h200/moe_gemm.txt 2>&1
  python -m moe.bench --suite seed004 --json $OUT/h200/moe_seed004.json > $OUT/h200/moe_seed004.txt 2>&1
  python -m moe.bench --suite decode --json $OUT/h200/moe_decode.json > $OUT/h200/moe_decode.txt 2>&1
fi
grep "==\|   " $OUT/tlb.log | grep -v "max|diff" ; tail -3 $OUT/bimodal.log
