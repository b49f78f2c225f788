export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi -L
t=$(date +%s)
python -m pytest -q -x tests/test_grouped_gemm_gpu.py tests/test_moe_gpu.py tests/test_moe_experts_gpu.py tests/test_models_gpu.py > $OUT/tests.log 2>&1; tail -2 $OUT/tests.log; echo "tests $(( $(date +%s) - t )) s"
python -m pytest -q -x tests/test_call_path_gpu.py -k "layer" > $OUT/tests_cp.log 2>&1; tail -1 $OUT/tests_cp.log
timeout 200 compute-sanitizer --tool memcheck --report-api-errors no python tools/sanitize.py skinny > $OUT/mem_skinny.log 2>&1; tail -1 $OUT/mem_skinny.log
timeout 200 compute-sanitizer --tool racecheck --report-api-errors no python tools/sanitize.py skinny > $OUT/race_skinny.log 2>&1; tail -1 $OUT/race_skinny.log
t=$(date +%s)
python tools/layer_ab.py --case E64top8:1 --case E64top8:4 --case seed004:1 --case seed004:4 --variant fused:moe.layer.FUSED_COMBINE=True --variant separate:moe.layer.FUSED_COMBINE=False --rounds 5 --json $OUT/layer_ab_combine.json > $OUT/layer_ab.log 2>&1; tail -12 $OUT/layer_ab.log; echo "ab $(( $(date +%s) - t )) s"
