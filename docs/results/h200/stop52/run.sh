G=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$G" in *H200*) echo "got $G";; *) echo "not h200: $G"; exit 0;; esac
nvidia-smi -L
export PYTHONPATH=.
bash scratch/status.sh fwd 2>&1 | tail -14
bash scratch/status.sh bwd 2>&1 | tail -8
