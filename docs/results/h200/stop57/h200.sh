# one H200 (kind nvidia-h200): the MoE suites on this tree, in turn; runs nothing unless the card is an H200
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi -L
nvidia-smi -L | grep -q H200 || { echo "not an H200: nothing run"; exit 0; }
W=$OUT/moe; mkdir -p $W
nvidia-smi > $W/nvidia-smi.txt; git log -1 --format=%H > $W/tree.txt
job() {  # suite extra-args tag
  t=$(date +%s)
  timeout 150 python -m moe.bench --suite $1 $2 --json $W/moe_$1$3.json > $W/moe_$1$3.log 2>&1
  echo "$1$3 rc $? $(( $(date +%s) - t )) s $(nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader)" >> $W/times.txt
}
job gemm "--impl ours,cublas,torch-grouped --rounds 5"
job seed004 "--case layer --impl ours,torch-loop,torch-grouped" _layer
job decode ""
cat $W/times.txt
grep -E "^\| gemm" $W/moe_gemm.log | cut -c1-110
grep -E "layer +\| (ours|torch)" $W/moe_seed004_layer.log | cut -c1-160
tail -16 $W/moe_decode.log | cut -c1-170
