"""Run by torch.distributed.run in test_update.py: one data-parallel update with gloo; rank 0 saves
the updated parameters so the test can compare them with a single-process update."""

import sys

import torch
import torch.distributed as dist
from test_update import one_update
from transformers import AutoModelForCausalLM

model_dir, out = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo")
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
one_update(model)
if dist.get_rank() == 0:
    torch.save(torch.cat([p.detach().flatten() for p in model.parameters()]), out)
dist.destroy_process_group()
