export PYTHONPATH=.
W=$OUT/w; mkdir -p $W
nvidia-smi -L
for t in tma attention backward decode; do
  s=$(date +%s); timeout 150 compute-sanitizer --tool racecheck --report-api-errors no python tools/sanitize.py $t > $W/racecheck_$t.log 2>&1; echo "racecheck $t $(( $(date +%s) - s )) s: $(grep 'sanitize:' $W/racecheck_$t.log) $(tail -1 $W/racecheck_$t.log)"
done
bash scratch/status.sh bwd 2>&1 | tail -8
