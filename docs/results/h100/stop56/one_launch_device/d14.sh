export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi -L
python -m pytest -q -x tests/test_attention_bwd_gpu.py tests/test_call_path_gpu.py > $OUT/tests.log 2>&1; tail -1 $OUT/tests.log
python scratch/bwd_device.py > $OUT/bwd_device.log 2>&1; cat $OUT/bwd_device.log
timeout 150 compute-sanitizer --tool memcheck --report-api-errors no python tools/sanitize.py tma-backward > $OUT/mem_attn.log 2>&1; tail -1 $OUT/mem_attn.log
