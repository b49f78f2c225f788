export PYTHONPATH=.
nvidia-smi -L
timeout 300 ncu -k regex:"moe_grouped_gemm|device_kernel" --launch-skip 3 --launch-count 3 --section WarpStateStats --section SourceCounters --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__pcsamp_sample_count" --print-details all python scratch/pair_ncu.py > $OUT/pair_stall.log 2>&1
grep -v "^==PROF==" $OUT/pair_stall.log | grep -E "^  void|stalled_[a-z_]+_per_issue_active.ratio +[0-9.]+" | awk '{ if ($0 ~ /void/) print substr($0,1,60); else if ($NF+0 > 0.3) print }'
