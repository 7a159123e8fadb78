"""Run by torch.distributed.run in test_update.py: one data-parallel update with gloo; rank 0 saves
the updated parameters and the step's metrics so the test can compare them with a single-process
update. An optional third argument is max_grad_norm (default inf: no clip).

    torchrun --nproc-per-node 2 tests/dist_update_worker.py MODEL OUT [MAX_GRAD_NORM]
"""

import math
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent / "trainer"))  # test_update, test_fsdp
from test_update import one_update
from torchrun_helpers import die_with_parent
from transformers import AutoModelForCausalLM

model_dir, out = sys.argv[1], sys.argv[2]
max_grad_norm = float(sys.argv[3]) if len(sys.argv) > 3 else math.inf
die_with_parent()  # a timed-out test kills torchrun: the ranks go with it
dist.init_process_group("gloo")
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
metrics = one_update(model, max_grad_norm)
if dist.get_rank() == 0:
    torch.save({"params": torch.cat([p.detach().flatten() for p in model.parameters()]), "metrics": metrics}, out)
dist.barrier()  # leave together (tests/torchrun_helpers.py)
dist.destroy_process_group()
