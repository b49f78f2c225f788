M=sm__inst_executed.sum,sm__cycles_elapsed.avg,smsp__inst_executed_pipe_fma.sum,smsp__inst_executed_pipe_alu.sum,smsp__inst_executed_pipe_xu.sum,smsp__inst_executed_pipe_fp16.sum,smsp__inst_executed_pipe_uniform.sum,smsp__inst_executed_op_shared_ld.sum,smsp__inst_executed_op_shared_st.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed,dram__bytes.sum,lts__t_bytes.sum,smsp__inst_executed_op_branch.sum,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__thread_inst_executed.sum
timeout 240 ncu --metrics $M --launch-skip 4 --launch-count 2 -k regex:"flash_fwd_tma|cudnn" --csv python docs/results/h100/stop51/power/ncu_fwd.py > $OUT/ncu_fwd.csv 2> $OUT/ncu_fwd.err
echo rc $?
python3 - $OUT/ncu_fwd.csv <<'PY'
import csv, sys, collections
rows = list(csv.reader(open(sys.argv[1])))
hdr = None; data = collections.OrderedDict()
for r in rows:
    if r and r[0] == "ID": hdr = r; continue
    if hdr and len(r) == len(hdr):
        d = dict(zip(hdr, r)); key = (d["ID"], d["Kernel Name"][:40])
        data.setdefault(key, {})[d["Metric Name"]] = d["Metric Value"]
for (i, name), m in data.items():
    print(i, name)
    for k, v in m.items(): print(f"    {k:70s} {v}")
PY
