#!/bin/bash
export PYTHONPATH=.
M=gpu__time_duration.sum,lts__t_bytes.sum,lts__t_sectors_srcunit_tex.sum,lts__t_sectors_srcunit_ltcfabric.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_write.sum,dram__bytes_read.sum,dram__bytes_write.sum,smsp__inst_executed.sum,smsp__inst_executed_op_global_ld.sum,sm__ctas_launched.sum,l1tex__m_xbar2l1tex_read_bytes.sum,smsp__inst_executed_pipe_uniform.sum
for v in new old; do
  VARIANT=$v timeout 200 ncu --kernel-name regex:moe_grouped_gemm_tma --launch-skip 1 --launch-count 1 --metrics $M python scratch/s64/ncu_idle.py > $OUT/ncu2_$v.log 2>&1
  echo "== $v"; grep -E "^ +(gpu|lts|dram|smsp|sm__|l1tex)" $OUT/ncu2_$v.log
done
