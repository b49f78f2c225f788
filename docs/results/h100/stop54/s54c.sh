# L2 traffic of ours (planner: the pair), the pair forced, and torch._grouped_mm (CUTLASS pair) at E8 equal
# (run with a byte-identical copy of docs/results/h100/stop53/pair_ncu.py under stop54/, since removed)
export PYTHONPATH=.
nvidia-smi -L
timeout 240 ncu -k regex:"moe_grouped_gemm|device_kernel" --launch-skip 3 --launch-count 3 --metrics gpu__time_duration.sum,lts__t_bytes.sum,lts__t_sectors_op_read.sum,lts__t_sectors_op_write.sum,lts__t_sectors_op_atom.sum,lts__t_sectors_op_red.sum,lts__t_sectors_srcunit_tex.sum,lts__t_sectors_srcunit_ltcfabric.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_requests_srcunit_tex.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors_srcunit_tex_lookup_hit.sum,lts__t_sectors_srcunit_tex_lookup_miss.sum python docs/results/h100/stop53/pair_ncu.py > $OUT/pair_l2.log 2>&1
grep -v "^==PROF==" $OUT/pair_l2.log | grep -E "^  void|gpu__time|lts__|dram__" | cut -c1-130
