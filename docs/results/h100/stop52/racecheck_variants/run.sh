export PYTHONPATH=.
W=$OUT/rc; mkdir -p $W
R=$(pwd)
for v in ${RC_VARIANTS:-A B C D}; do
  rm -rf /tmp/v$v; mkdir /tmp/v$v; cp -r attention cukernels moe models tools scratch profiles expected_results pyproject.toml /tmp/v$v/ 2>/dev/null
  [ $v != A ] && cp scratch/rc/$v/flash_bwd_tma.cu /tmp/v$v/attention/kernels/
  (cd /tmp/v$v && PYTHONPATH=. python scratch/rc/drive.py > $W/warm_$v.log 2>&1)
  (cd /tmp/v$v && PYTHONPATH=. timeout 200 compute-sanitizer --tool racecheck --report-api-errors no python scratch/rc/drive.py > $W/race_$v.log 2>&1)
  echo "$v: $(tail -1 $W/race_$v.log) $(grep -c 'Race reported' $W/race_$v.log)"
done
