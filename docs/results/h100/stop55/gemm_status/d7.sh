# stop 55: an H200 -> #14's MoE suites on this tree (docs/results/h200/stop54/h200.sh); an H100 -> the gemm suite
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi -L
if nvidia-smi -L | grep -q H200; then bash docs/results/h200/stop54/h200.sh; exit 0; fi
W=$OUT/s55k; mkdir -p $W
t=$(date +%s); timeout 200 python -m moe.bench --suite gemm --impl ours,cublas,torch-grouped --rounds 5 --json $W/moe_gemm.json > $W/moe_gemm.log 2>&1; echo "gemm rc $? $(( $(date +%s) - t )) s"
grep -E "^\| gemm" $W/moe_gemm.log | cut -c1-150
