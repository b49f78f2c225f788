export PYTHONPATH=.
nvidia-smi -L
nvidia-smi --query-gpu=power.limit,clocks.max.sm --format=csv
echo "== pair power"; SECS=3 COOL=2 timeout 200 python scratch/pair_power.py 2>&1 | grep -v Warn | tee $OUT/pair_power.log
N=docs/perf/next
rm -rf /tmp/vK; mkdir /tmp/vK; cp -r attention cukernels moe models tools profiles expected_results pyproject.toml tests $N /tmp/vK/
(cd /tmp/vK && patch -p1 -s < next/gemm_ksplit_per_thread_release.patch)
echo "== ksplit perf more rounds"
for r in 1 2 3 4; do python $N/gemm_ksplit_perf.py tree 2>&1 | grep -v Warn; (cd /tmp/vK && python next/gemm_ksplit_perf.py var 2>&1 | grep -v Warn); done | tee $OUT/ksplit_more.log
