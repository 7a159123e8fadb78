#!/usr/bin/env bash
# One prepared run on a lent GPU (about 6 minutes on one H200): training throughput, MFU and peak
# memory per GPU for the Qwen2.5-0.5B and -1.5B shapes, unsharded (bf16 weights) and sharded with the
# trainer's FSDP2 (float32 master weights, bf16 compute: sharding.py) across every visible GPU.
# torch and transformers only. Results go to $OUT (or ./gpu-results).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-./gpu-results}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$out/gpu.txt"
python -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$out/gpu.txt"
gpus=$(nvidia-smi -L | wc -l)
for shape in 0.5b 1.5b; do
  timeout 150 python bench/gpu_train.py --shape "$shape" --seconds 60 | tee "$out/train-$shape.json"
done
# Sharded: on one GPU still FSDP2 (a mesh of one), to see its own cost beside the plain run; on N
# GPUs each holds 1/N of the state, and tokens/s is the sum over ranks.
for shape in 0.5b 1.5b; do
  timeout 180 python -m torch.distributed.run --nproc-per-node "$gpus" bench/gpu_train.py --shape "$shape" \
    --seconds 60 --fsdp | tee "$out/train-fsdp-$shape.json"
done
