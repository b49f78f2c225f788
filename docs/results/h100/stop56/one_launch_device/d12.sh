export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi -L
python -m pytest -q -x tests/test_attention_bwd_gpu.py -k "one_and_two or kept_workspace or tma_kernel_every or torch_autograd or against_reference" > $OUT/tests.log 2>&1; tail -1 $OUT/tests.log
python scratch/bwd_device.py > $OUT/bwd_device.log 2>&1; cat $OUT/bwd_device.log
python scratch/bwd_launches_ab.py 31 > $OUT/ab.log 2>&1; tail -7 $OUT/ab.log
timeout 200 compute-sanitizer --tool memcheck --report-api-errors no python tools/sanitize.py tma-backward > $OUT/mem_attn.log 2>&1; tail -1 $OUT/mem_attn.log
