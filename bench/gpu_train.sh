#!/usr/bin/env bash
# One prepared run on a lent GPU (under 8 minutes on one H200): training throughput and MFU for the
# Qwen2.5-0.5B and -1.5B shapes. torch and transformers only. Results go to $OUT (or ./gpu-results).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-./gpu-results}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$out/gpu.txt"
python -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$out/gpu.txt"
for shape in 0.5b 1.5b; do
  timeout 200 python bench/gpu_train.py --shape "$shape" --seconds 90 | tee "$out/train-$shape.json"
done
