export PYTHONPATH=.
nvidia-smi -L
echo "== gemm + moe GPU tests"; timeout 260 python -m pytest -q -x tests/test_grouped_gemm_gpu.py tests/test_moe_gpu.py 2>&1 | tail -1
echo "== models GPU tests"; timeout 150 python -m pytest -q -x tests/test_models_gpu.py 2>&1 | tail -1
echo "== dense A/B"; timeout 200 python scratch/dense_ab.py 2>&1 | grep -v Warn | tee $OUT/dense_ab.log
