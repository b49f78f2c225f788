#!/bin/bash
export PYTHONPATH=.
O=$OUT/ag_pdl; mkdir -p $O
timeout 250 python scratch/s58/ag_pdl.py $O/ag_pdl.json 31 > $O/ag_pdl.log 2>&1
echo "rc=$?"; cat $O/ag_pdl.log | tail -10
