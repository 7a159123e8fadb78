"""Training configuration: the update's options and the scheduled job's sections, with TOML and
command-line loading. No third-party imports: `lightning-otel train --help` works without torch."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from lightning_otel.core.flags import setting
from lightning_otel.core.otlp import ENDPOINT_HELP


@dataclass
class UpdateConfig:
    learning_rate: float = 1e-4
    warmup_steps: int = 0  # the learning rate rises linearly to learning_rate over the first N steps
    eps_low: float = 0.2
    eps_high: float = 0.28
    log_ratio_clamp: float = 20.0  # |logp_theta - logp_old| clamped before exp (verl's 20); inf: off
    dual_clip: float = 3.0  # A < 0: the loss is at most c * |A| (verl's clip_ratio_c = 3); inf: off
    behaviour_logprob_floor: float = -50.0  # lower behaviour logprobs are masked out of the loss (input_hygiene.py)
    scale_by_std: bool = True  # z-score advantages within a task (False: mean-only, Dr. GRPO)
    advantage_level: str = "rollout"  # or "sample" (ablation)
    normalization: str = "rollout"  # "rollout" | "sample" | "batch_token" | "fixed_length"
    fixed_length: int | None = None  # L for fixed_length, a constant (TRL: max_completion_length); required there
    tis_cap: float | None = None  # truncated importance sampling against the trainer's own old logprobs
    kl_coef: float = 0.0  # weight of the k3 KL to a frozen reference model
    layout: str = "shared_prefix"  # "sorted" | "packed" | "shared_prefix" (layout.py)
    pack_length: int | None = None  # tokens per packed / shared-prefix row
    micro_batch_size: int = 4  # rows per forward/backward (shared-prefix rows hold a whole task group)
    max_grad_norm: float = 1.0
    sharding: str = "none"  # "fsdp": parameters, gradients and AdamW state sharded across torchrun ranks (FSDP2)
    mixed_precision: str = "auto"  # fsdp: "auto" (bf16 compute on GPU), "bfloat16" or "none" (sharding.py)
    activation_checkpointing: bool = False  # recompute each decoder layer's activations in the backward pass


@dataclass
class StoreSection:
    data_dir: str = "./lightning-data"  # the collector's data directory
    otlp_endpoint: str | None = setting(None, ENDPOINT_HELP, aliases=("--otlp-endpoint",))  # as the gateway's


@dataclass
class ModelSection:
    base: str = "./model"  # the weights the servers started with (a Hugging Face folder)
    served_model_name: str = "policy"
    lora_rank: int = 0  # 0: full fine-tuning and full-weight swaps; > 0: LoRA adapters and LoRA swaps
    lora_alpha: int = 16
    dtype: str = "float32"  # the trainer's weights; "bfloat16" halves memory (then widen probe_tolerance)


@dataclass
class ServerSection:
    replicas: list[str] = field(default_factory=list)  # vLLM servers: probed after every swap
    gateway: str | None = None  # swap through the gateway: no failed request, exact versions
    admin_token: str | None = None  # the gateway's --admin-token
    probe_tolerance: float = 1e-4  # max |server - trainer| logprob on the probe
    weight_push: str = (
        "files"  # "nccl": GPU-to-GPU push, full weights, direct to replicas (nccl_push.py; untested here)
    )


@dataclass
class SelectionSection:
    where: str = "true"
    reward: str = "reward"
    min_age_s: float = 30.0  # only rollouts whose last span ended this long ago (late spans, rewards)
    max_rollouts: int = 256
    min_rollouts: int = 1  # fewer available: nothing to do this run
    max_staleness: int | None = None
    # |reward| above this: the rollout is excluded like a non-finite reward (cause reward_out_of_range);
    # inf: off. 1e6 keeps every gradient far from float32's overflow (rollout_data.py says why)
    max_abs_reward: float = 1e6
    # calls without token ids (GenAI-convention spans, OpenInference's own) rebuilt from their messages
    # with the model's chat template, as on-policy (docs/training.md); off: skipped and counted
    allow_reconstructed: bool = False
    # The window behind the watermark (selection_window.py): a reward that arrives up to lookback_s
    # after the watermark passed its rollout's start is still trained on; rollouts up to max_rollout_s
    # long are read whole at the window's edge; backfill reads the whole store for this run
    lookback_s: float = 3600.0
    max_rollout_s: float = 3600.0
    backfill: bool = False


@dataclass
class CheckpointSection:
    dir: str = "./train-state"
    keep: int = 3


@dataclass
class TrainConfig:
    store: StoreSection = field(default_factory=StoreSection)
    model: ModelSection = field(default_factory=ModelSection)
    server: ServerSection = field(default_factory=ServerSection)
    selection: SelectionSection = field(default_factory=SelectionSection)
    update: UpdateConfig = field(default_factory=UpdateConfig)
    checkpoints: CheckpointSection = field(default_factory=CheckpointSection)


_SECTIONS = {
    "store": StoreSection,
    "model": ModelSection,
    "server": ServerSection,
    "selection": SelectionSection,
    "update": UpdateConfig,
    "checkpoints": CheckpointSection,
}


def add_flags(parser) -> None:
    """--config FILE, and one flag per option: --<section>-<option> (lists comma-separated); a flag
    given overrides the file, a flag not given leaves it alone."""
    from lightning_otel.core.flags import add_flags as add_settings_flags

    parser.add_argument(
        "--config", help="a TOML file with [store], [model], [server], [selection], [update], [checkpoints]"
    )
    for section, cls in _SECTIONS.items():
        add_settings_flags(parser, cls, env_prefix=None, section=section, keep_defaults=False)


def load_config(path: str | None, overrides: dict[str, str] | None = None) -> TrainConfig:
    """Defaults, then the TOML file, then flags; unknown keys are an error, not a silent no-op."""
    import dataclasses
    import tomllib

    from lightning_otel.core.flags import parse_value, value_type

    values: dict[str, dict] = {section: {} for section in _SECTIONS}
    if path:
        for section, table in tomllib.loads(Path(path).read_text()).items():
            if section not in _SECTIONS:
                raise ValueError(f"unknown section [{section}] in {path}")
            values[section].update(table)
    for key, value in (overrides or {}).items():
        if value is not None:
            section, name = key.split(".", 1)
            values[section][name] = value
    built = {}
    for section, cls in _SECTIONS.items():
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(values[section]) - names
        if unknown:
            raise ValueError(f"unknown option(s) in [{section}]: {sorted(unknown)}")
        built[section] = cls(**{k: parse_value(value_type(cls, k), v) for k, v in values[section].items()})
    return TrainConfig(**built)
