#!/bin/bash
# stop 59 final: after the review (block_stream.cu through timeline.cuh; SASS byte-identical)
export PYTHONPATH=.
python -m pytest -q -x tests/test_engine_gpu.py tests/test_kvcache_gpu.py > $OUT/tests.log 2>&1; tail -1 $OUT/tests.log
timeout 150 compute-sanitizer --tool memcheck python tools/sanitize.py decode > $OUT/memcheck_decode.log 2>&1; tail -1 $OUT/memcheck_decode.log
