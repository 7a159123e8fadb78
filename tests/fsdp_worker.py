"""Run by torch.distributed.run in test_fsdp.py: the sharded side. Each case of test_fsdp.CASES is one
FSDP step of a PolicyTrainer with sharding = "fsdp"; rank 0 saves what the test compares with the
unsharded step (full gradients, weights and AdamW moments, gathered), each rank's local bytes and
forward passes, and the results of resuming from a sharded and from an unsharded checkpoint.

    torchrun --nproc-per-node 2 tests/fsdp_worker.py MODEL REFERENCE UNSHARDED_CHECKPOINT OUT
"""

import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent / "trainer"))  # test_update, test_fsdp
from test_fsdp import CASES, case_selection, dtype, selection, update_config
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
from torchrun_helpers import die_with_parent
from transformers import AutoModelForCausalLM

from lightning_otel.trainer.policy import PolicyTrainer
from lightning_otel.trainer.sharding import full_state_dict, local_bytes, shard_model

model_dir, reference_dir, unsharded_checkpoint, out = (Path(a) for a in sys.argv[1:5])
die_with_parent()  # a timed-out test kills torchrun: the ranks go with it
dist.init_process_group("gloo")
rank = dist.get_rank()
FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def everyone(value) -> list:
    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def trainer_for(case: str, weights: Path, workdir: Path) -> PolicyTrainer:
    config = update_config(case, sharding="fsdp")
    trainer = PolicyTrainer(weights, workdir, config, device="cpu", dtype=dtype(case))
    if trainer.reference is not None:
        reference = AutoModelForCausalLM.from_pretrained(reference_dir, dtype=dtype(case)).requires_grad_(False)
        trainer.reference = shard_model(reference, torch.device("cpu")).eval()
    return trainer


results = {"resumed": {}}
for case in CASES:
    trainer = trainer_for(case, model_dir, out / "state" if case == "sorted" else out / f"state-{case}")
    passes = [0]
    trainer.model.register_forward_pre_hook(lambda *_: passes.__setitem__(0, passes[0] + 1))
    result = trainer.train_on(case_selection(case))
    metrics = result.metrics
    grads = {name: p.grad.full_tensor() for name, p in trainer.model.named_parameters()}
    params = full_state_dict(trainer.model)
    moments = get_optimizer_state_dict(trainer.model, trainer.optimizer, options=FULL)
    held = everyone(local_bytes(trainer.model, trainer.optimizer))
    passes = everyone(passes[0])
    if rank == 0:
        optimizer = {
            name: {k: v for k, v in state.items() if k in ("exp_avg", "exp_avg_sq")}
            for name, state in moments["state"].items()
        }
        results[case] = {"metrics": metrics, "grads": grads, "params": params, "optimizer": optimizer}
        results[case]["at_fault"] = result.at_fault
        results[case]["passes"] = passes
    if case == "sorted":
        results["bytes"] = held
        results["full_bytes"] = {
            "parameters": sum(t.numel() * t.element_size() for t in params.values()) if rank == 0 else None,
        }
        checkpoint = trainer.save_weights().parent  # every rank: gathered weights, sharded optimizer
        for name, source in (("fsdp_from_fsdp", checkpoint), ("fsdp_from_unsharded", unsharded_checkpoint)):
            resumed = trainer_for("sorted", source / "model", out / f"resume-{name}")
            resumed.load_optimizer(source)
            resumed.version = 1
            resumed.train_on(selection(2))
            results["resumed"][name] = full_state_dict(resumed.model)
if rank == 0:
    total = results["full_bytes"]["parameters"]
    results["full_bytes"] = {"parameters": total, "gradients": total, "optimizer": 2 * total}
    torch.save(results, out / "results.pt")
# Leave together: a rank that exits (closing its gloo connections) while the other still runs can make
# the other's transport fail mid-teardown (tests/torchrun_helpers.py).
dist.barrier()
dist.destroy_process_group()
