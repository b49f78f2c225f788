export PYTHONPATH=.
nvidia-smi -L
rm -rf /tmp/vK; mkdir /tmp/vK; cp -r attention cukernels moe models tools scratch profiles expected_results pyproject.toml tests /tmp/vK/
cp scratch/ks/grouped_gemm.cu /tmp/vK/moe/kernels/
(cd /tmp/vK && timeout 120 compute-sanitizer --tool racecheck --report-api-errors no python tools/sanitize.py gemm > $OUT/race_ks.log 2>&1; grep "sanitize:" $OUT/race_ks.log; tail -1 $OUT/race_ks.log)
(cd /tmp/vK && timeout 100 python -m pytest -q -x tests/test_grouped_gemm_gpu.py -k "split_k or every_config or persistent_many or dense_offsets" 2>&1 | tail -1)
for r in 1 2; do python scratch/ks/perf.py tree; (cd /tmp/vK && python scratch/ks/perf.py var); done
