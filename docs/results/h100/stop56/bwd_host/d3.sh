export PYTHONPATH=.
nvidia-smi -L
python -m pytest -q -x tests/test_call_path_gpu.py tests/test_attention_bwd_gpu.py tests/test_varlen_gpu.py 2>&1 | tail -3
python tools/call_overhead.py --rounds 11 --json $OUT/call_overhead.json 2>&1 | tail -25
