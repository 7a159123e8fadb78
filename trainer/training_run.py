"""One run of the scheduled training job (job.py has the config, the lock and the checkpoint store).

Read top to bottom: lock, recover, load, make the servers serve the latest checkpoint, select,
update, commit, swap + probe, retire, report. `fault(...)` marks the points the crash tests kill at.
"""

from __future__ import annotations

import json
import logging
import os
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from lightning_otel.collector import connect
from lightning_otel.instrument import schema
from lightning_otel.trainer.diagnostics import diagnose, publish
from lightning_otel.trainer.hotswap import VLLMAdmin, hot_swap, probe_max_diff
from lightning_otel.trainer.config import TrainConfig
from lightning_otel.trainer.job import FAULT_ENV, CheckpointStore, JobFailed, _post_json, fault, run_lock
from lightning_otel.trainer.policy import PolicyTrainer, StepResult
from lightning_otel.trainer.rollout_data import SelectionConfig, select_rollouts

log = logging.getLogger(__name__)
PROBE_TEXT = "What is 2 + 3? Answer with the number."


@dataclass
class RunSummary:
    status: str  # "trained", "nothing to do"
    step: int | None = None
    version: str | None = None
    rollouts: int = 0
    samples: int = 0
    mean_reward: float | None = None
    loss: float | None = None
    swap_seconds: float | None = None
    excluded: dict[str, str] = field(default_factory=dict)


def _weights(checkpoint: Path | None, config: TrainConfig) -> Path:
    """What a server swaps in for this checkpoint: merged model weights, or the LoRA adapter."""
    if checkpoint is None:
        return Path(config.model.base)
    return checkpoint / ("adapter" if config.model.lora_rank else "model")


def _version(checkpoint: Path | None) -> str:
    return json.loads((checkpoint / "state.json").read_text())["version"] if checkpoint is not None else "0"


def _load_trainer(config: TrainConfig, latest: Path | None) -> PolicyTrainer:
    lora = None
    if config.model.lora_rank:
        from peft import LoraConfig

        lora = LoraConfig(r=config.model.lora_rank, lora_alpha=config.model.lora_alpha, init_lora_weights=True,
                          target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])  # fmt: skip
    model_dir = latest / "model" if latest is not None and not config.model.lora_rank else Path(config.model.base)
    trainer = PolicyTrainer(model_dir, config.checkpoints.dir, config.update, lora=lora)
    if latest is not None:
        if config.model.lora_rank:
            from peft import set_peft_model_state_dict
            from safetensors.torch import load_file

            set_peft_model_state_dict(trainer.model, load_file(str(latest / "adapter" / "adapter_model.safetensors")))
        trainer.optimizer.load_state_dict(torch.load(latest / "optimizer.pt", weights_only=True))
        trainer.version = int(_version(latest))
    return trainer


def _probe_ids(config: TrainConfig) -> list[int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(config.model.base)
    text = tokenizer.apply_chat_template([{"role": "user", "content": PROBE_TEXT}], add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def _served_name(config: TrainConfig, version: str) -> str:
    return f"{config.model.served_model_name}@{version}" if config.model.lora_rank and version != "0" else config.model.served_model_name


def _served_versions(config: TrainConfig) -> set[str | None]:
    """The versions the replicas serve now (full weights: vLLM's weight version; LoRA: the adapters loaded)."""
    if config.model.lora_rank:
        versions = set()
        for replica in config.server.replicas:
            with urllib.request.urlopen(replica.rstrip("/").removesuffix("/v1") + "/v1/models", timeout=30) as reply:  # noqa: S310
                names = [m["id"] for m in json.loads(reply.read())["data"]]
            prefix = config.model.served_model_name + "@"
            loaded = [n[len(prefix) :] for n in names if n.startswith(prefix)]
            versions.add(max(loaded, key=int) if loaded else "0")
        return versions
    return {VLLMAdmin(replica).weight_version() for replica in config.server.replicas}


def _swap(config: TrainConfig, weights: Path, version: str, rollback: Path) -> float:
    """Swap every replica to `weights` (through the gateway when there is one); returns seconds."""
    began = time.perf_counter()
    if config.server.gateway:
        mode = "lora" if config.model.lora_rank else "full"
        body = ({"mode": "lora", "adapter_path": str(weights), "version": version, "model": config.model.served_model_name}
                if mode == "lora" else
                {"mode": "full", "weights_path": str(weights), "version": version, "rollback_path": str(rollback)})  # fmt: skip
        _post_json(config.server.gateway.rstrip("/") + "/admin/swap", body, config.server.admin_token)
    else:
        for replica in config.server.replicas:
            admin = VLLMAdmin(replica)
            if config.model.lora_rank:
                admin.load_lora(_served_name(config, version), weights)
            else:
                hot_swap(admin, weights, version, rollback)
    return time.perf_counter() - began


def _probe(config: TrainConfig, trainer: PolicyTrainer, version: str) -> None:
    ids = _probe_ids(config)
    for replica in config.server.replicas:
        diff = probe_max_diff(VLLMAdmin(replica), _served_name(config, version), trainer.model, ids)
        if not diff <= config.server.probe_tolerance:
            raise JobFailed(f"{replica} serves logprobs {diff:.2e} away from the trainer's for version {version}")


def _write_checkpoint(tmp: Path, trainer: PolicyTrainer, result: StepResult, config: TrainConfig) -> None:
    if config.model.lora_rank:
        trainer.model.save_pretrained(tmp / "adapter", safe_serialization=True)
    else:
        trainer.model.save_pretrained(tmp / "model", safe_serialization=True)
    torch.save(trainer.optimizer.state_dict(), tmp / "optimizer.pt")
    ids = [r.rollout_id for r in result.selection.rollouts]
    pq.write_table(pa.table({"rollout_id": pa.array(ids, pa.string())}), tmp / "rollouts.parquet")
    state = {"step": trainer.version, "version": str(trainer.version), "rollouts": len(ids), "created": time.time()}
    (tmp / "state.json").write_text(json.dumps(state))


def _report(config: TrainConfig, trainer: PolicyTrainer, result: StepResult, swap_seconds: float) -> None:
    """A train_step span and the merge diagnostics, into the same store as the traces."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from lightning_otel.instrument.configure import _endpoint

    provider = TracerProvider(resource=Resource.create({schema.SERVICE_NAME: "lightning-trainer"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=_endpoint(config.store.otlp_endpoint), timeout=5)))
    tracer = provider.get_tracer("lightning_otel.trainer")
    records = diagnose(result.batch)
    metrics = result.metrics
    attributes = {
        schema.TRAIN_STEP: trainer.version, schema.TRAIN_VERSION: str(trainer.version),
        schema.TRAIN_ROLLOUTS: len(result.selection.rollouts), schema.TRAIN_SAMPLES: len(result.batch.samples),
        schema.TRAIN_MEAN_REWARD: result.mean_reward, schema.TRAIN_LOSS: metrics["loss"],
        schema.TRAIN_CLIP_FRACTION: metrics["clip_fraction"], schema.TRAIN_ENTROPY: metrics["entropy"],
        schema.TRAIN_KL: metrics["kl"], schema.TRAIN_GRAD_NORM: metrics["grad_norm"], schema.TRAIN_SWAP_SECONDS: swap_seconds,
        schema.TRAIN_MERGE_RATE: sum(r.merged for r in records) / len(records) if records else 1.0,
    }  # fmt: skip
    tracer.start_span(schema.SPAN_TRAIN_STEP, attributes=attributes).end()
    publish(records, tracer)
    provider.shutdown()


def _corrupt(weights: Path) -> None:
    from safetensors.torch import load_file, save_file

    for path in weights.glob("*.safetensors"):
        tensors = {name: tensor + 0.5 * torch.randn_like(tensor) for name, tensor in load_file(str(path)).items()}
        save_file(tensors, str(path), metadata={"format": "pt"})


def run_once(config: TrainConfig) -> RunSummary:
    state_dir = Path(config.checkpoints.dir)
    with run_lock(state_dir):
        store = CheckpointStore(state_dir)
        store.recover()
        latest = store.latest()
        previous = store.committed()[-2] if len(store.committed()) > 1 else None
        trainer = _load_trainer(config, latest)
        if latest is not None and _served_versions(config) != {_version(latest)}:
            log.info("servers do not serve checkpoint %s yet: swapping it in", latest.name)  # a crash after commit
            _swap(config, _weights(latest, config), _version(latest), _weights(previous, config))
            _probe(config, trainer, _version(latest))
        store.retire(config.checkpoints.keep)  # also finishes what a crash after a swap left undone

        conn = connect(config.store.data_dir)
        conn.register("lightning_trained", store.trained_ids())
        selection = select_rollouts(conn, config=SelectionConfig(
            where=f"({config.selection.where}) AND end_time < now() - to_seconds({float(config.selection.min_age_s)})",
            reward=config.selection.reward, limit=config.selection.max_rollouts, exclude="lightning_trained",
            only_rewarded=True,
        ))  # fmt: skip
        fault("after_load")
        if len(selection.rollouts) < config.selection.min_rollouts:
            return RunSummary("nothing to do", excluded=selection.excluded)

        result = trainer.train_on(selection, config.selection.max_staleness)
        fault("mid_step")
        checkpoint = store.commit(trainer.version, lambda tmp: _write_checkpoint(tmp, trainer, result, config))
        fault("after_checkpoint")
        if os.environ.get(FAULT_ENV) == "corrupt_checkpoint":
            _corrupt(_weights(checkpoint, config))  # tests: a loadable checkpoint with the wrong weights
        version = str(trainer.version)
        try:
            swap_seconds = _swap(config, _weights(checkpoint, config), version, _weights(latest, config))
            _probe(config, trainer, version)
        except Exception as failure:
            # Put the previous weights back, forget this step: its rollouts return to the pool.
            store.reject(checkpoint)
            try:
                _swap(config, _weights(latest, config), _version(latest), _weights(latest, config))
            except Exception as rollback_failure:  # noqa: BLE001 - report both
                raise JobFailed(f"{failure}; and restoring version {_version(latest)} failed: {rollback_failure}") from failure
            raise JobFailed(f"{failure}; servers restored to version {_version(latest)}") from failure
        fault("after_swap")
        store.retire(config.checkpoints.keep)
        _report(config, trainer, result, swap_seconds)
        return RunSummary("trained", trainer.version, version, len(selection.rollouts), len(result.batch.samples),
                          result.mean_reward, result.metrics["loss"], swap_seconds, selection.excluded)  # fmt: skip
