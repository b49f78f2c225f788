export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi -L
python -m pytest -q -x tests/test_attention_bwd_gpu.py -k "dq_converted or tma_kernel_every or against_reference or kept_workspace" > $OUT/tests_bwd.log 2>&1; tail -2 $OUT/tests_bwd.log
python -m pytest -q -x tests/test_call_path_gpu.py > $OUT/tests_cp.log 2>&1; tail -1 $OUT/tests_cp.log
timeout 250 compute-sanitizer --tool memcheck --report-api-errors no python tools/sanitize.py tma-backward > $OUT/mem_attn.log 2>&1; tail -1 $OUT/mem_attn.log
python tools/call_overhead.py --rounds 11 --json $OUT/call_overhead.json > $OUT/call_overhead.log 2>&1; head -13 $OUT/call_overhead.log
