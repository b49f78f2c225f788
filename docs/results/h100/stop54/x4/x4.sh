# one card per job (kind nvidia-h200-x4; four H100s came): the MoE suites on this tree
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi -L
# (on H100s: the same suites, status of this tree)
W=$OUT/moe; mkdir -p $W
nvidia-smi > $W/nvidia-smi.txt; git log -1 --format=%H > $W/tree.txt
job() {  # GPU suite extra-args
  export CUDA_VISIBLE_DEVICES=$1; t=$(date +%s)
  timeout 290 python -m moe.bench --suite $2 $3 --json $W/moe_$2$4.json > $W/moe_$2$4.log 2>&1
  echo "$2$4 gpu $1 rc $? $(( $(date +%s) - t )) s $(nvidia-smi -i $1 --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader)" >> $W/times.txt
}
job 0 gemm "--impl ours,cublas,torch-grouped --rounds 5" &
job 1 seed004 "" &
job 2 decode "" &
job 3 seed004 "--case layer --impl ours,torch-loop,torch-grouped" _layer &
wait
cat $W/times.txt
grep -E "^\| gemm" $W/moe_gemm.log | cut -c1-110
grep -E "layer +\| (ours|torch)" $W/moe_seed004.log $W/moe_seed004_layer.log | cut -c1-160
tail -25 $W/moe_decode.log | cut -c1-170
