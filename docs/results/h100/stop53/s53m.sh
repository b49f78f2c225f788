export PYTHONPATH=.
nvidia-smi -L
C="--case medium_b8_s1024 --case large_b4_s512 --case medium-moe_b8_s1024 --no-compile --no-graph"
for r in 1 2; do
echo "== new $r"; timeout 120 python -m models.bench $C --out $OUT/models_new$r.json > $OUT/models_new$r.log 2>&1; grep -E "^\| (medium|large)" $OUT/models_new$r.log | cut -c1-110
echo "== old $r"; (cd scratch/headtree && timeout 120 python -m models.bench $C --out $OUT/models_old$r.json > $OUT/models_old$r.log 2>&1); grep -E "^\| (medium|large)" $OUT/models_old$r.log | cut -c1-110
done
