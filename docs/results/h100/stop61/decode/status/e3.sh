# stop 61: the final rule - decode suite b1 and b8, the paged / contiguous summary
export PYTHONPATH=.
O=$OUT/decode_status2; mkdir -p $O
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $O/gpu.txt; cat $O/gpu.txt
for b in b1 b8; do
t=$(date +%s); timeout 280 python -m attention.bench --suite decode --case ${b}_ --budget-ms 100 --rounds 2 --json $O/attn_decode_$b.json > $O/attn_decode_$b.log 2>&1; echo "$b suite rc $? $(( $(date +%s) - t )) s"
done
python scratch/s61/summary.py $O | grep -E "MISS|within"
