#!/bin/bash
export PYTHONPATH=.
O=$OUT/tiles2; mkdir -p $O
timeout 500 python tools/layer_ab.py --case E64top8:1 --case E64top8:4 --case seed004:1 --case seed004:4 \
  --variant base --variant up16:up=8/16/8 --variant up16dn16:up=8/16/8,down=8/16/8 --rounds 7 \
  --json $O/layer_ab.json > $O/layer_ab.log 2>&1
echo "rc=$?"; tail -6 $O/layer_ab.log
python3 -c "
import json
for l in open('$O/layer_ab.log'):
    if l.startswith('{'):
        d=json.loads(l); print(d['case'], {k: v['up'][19:40] + ' / ' + v['down'][19:40] for k, v in d['plans'].items()}, d['rel_l2_vs_base'])
"
