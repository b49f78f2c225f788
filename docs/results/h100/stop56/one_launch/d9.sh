export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi -L
python -m pytest -q -x tests/test_attention_bwd_gpu.py tests/test_call_path_gpu.py tests/test_varlen_gpu.py > $OUT/tests.log 2>&1; tail -2 $OUT/tests.log
timeout 200 compute-sanitizer --tool memcheck --report-api-errors no python tools/sanitize.py tma-backward > $OUT/mem_attn.log 2>&1; tail -1 $OUT/mem_attn.log
timeout 200 compute-sanitizer --tool racecheck --report-api-errors no python tools/sanitize.py tma-backward > $OUT/race_attn.log 2>&1; tail -1 $OUT/race_attn.log
