export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi -L
python -m pytest -q -x tests/test_grouped_gemm_gpu.py -k "fused_ffn or decode or capturable" > $OUT/tests.log 2>&1; tail -1 $OUT/tests.log
timeout 200 compute-sanitizer --tool memcheck --report-api-errors no python tools/sanitize.py skinny > $OUT/mem_skinny.log 2>&1; tail -1 $OUT/mem_skinny.log
timeout 200 compute-sanitizer --tool racecheck --report-api-errors no python tools/sanitize.py skinny > $OUT/race_skinny.log 2>&1; tail -1 $OUT/race_skinny.log
python tools/layer_ab.py --case E64top8:1 --case E64top8:4 --case seed004:1 --case seed004:4 --variant fused:moe.layer.FUSED_COMBINE=True --variant separate:moe.layer.FUSED_COMBINE=False --rounds 5 --json $OUT/layer_ab_combine.json > $OUT/layer_ab.log 2>&1; tail -6 $OUT/layer_ab.log
python tools/layer_ab.py --case E64top8:1 --case seed004:1 --variant separate:moe.layer.FUSED_COMBINE=False --variant fused:moe.layer.FUSED_COMBINE=True --rounds 5 --json $OUT/layer_ab_combine_r2.json > $OUT/layer_ab_r2.log 2>&1; tail -4 $OUT/layer_ab_r2.log
