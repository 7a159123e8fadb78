"""The servers the policy is served from, as the scheduled run sees them: one object, one call per stage
of the run. `behind`: do they serve an older version than the latest commit (a crash between a
commit and its swap)? `swap_in`: swap a committed checkpoint in and probe it. `roll_back`: after a
failed swap or probe, put the previous checkpoint back.

How is fixed once, at construction, from `[server]` and `[model]`: through the gateway when there is
one (coordinated: no failed request, exact versions; lightning_otel.gateway.admin) or to each replica
directly (lightning_otel.core.vllm_admin); full weights or a LoRA adapter; as files vLLM reloads or,
with `weight_push = "nccl"`, pushed GPU to GPU (nccl_push.py). Every path refuses weights holding a
NaN or an infinity before a server sees them.

The probe: each replica's logprobs on a fixed prompt must equal the trainer's own on it within
`[server] probe_tolerance`, else the swap failed (a reload that did not take, a wrong LM head, a
server on other weights). The trainer's side of the probe is a forward pass, and a sharded model's
forward is collective: every rank calls `behind` and `swap_in`, and only the lead rank (`lead`)
talks to the servers.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from pathlib import Path

from lightning_otel.core.gateway_client import GatewayAdminClient
from lightning_otel.core.http_json import get_json
from lightning_otel.core.vllm_admin import SwapError, VLLMAdmin, hot_swap, require_finite, server_root
from lightning_otel.trainer.checkpoints import JobFailed, checkpoint_version
from lightning_otel.trainer.config import ModelSection, ServerSection
from lightning_otel.trainer.hotswap import served_max_diff
from lightning_otel.trainer.policy import PolicyTrainer, policy_tokenizer

log = logging.getLogger(__name__)
PROBE_TEXT = "What is 2 + 3? Answer with the number."
MODELS_TIMEOUT_S = 30.0  # listing a replica's models is quick; a swap may take minutes


class Replicas:
    """`[server]`'s replicas (and gateway) serving `[model]`'s policy; `lead`: this process talks to
    them (rank 0 under torchrun; the other ranks only take part in the probe's forward pass)."""

    def __init__(self, server: ServerSection, model: ModelSection, lead: bool = True) -> None:
        self.urls = list(server.replicas)
        self.gateway = GatewayAdminClient(server.gateway, server.admin_token) if server.gateway else None
        self.push = server.weight_push
        self.tolerance = server.probe_tolerance
        self.base = model.base  # the weights the servers started with: version "0"
        self.model_name = model.served_model_name
        self.lora = model.lora_rank > 0
        self.lead = lead

    @functools.cached_property
    def probe_ids(self) -> list[int]:
        """PROBE_TEXT as the policy's chat template renders a user turn (what an agent would send)."""
        tokenizer = policy_tokenizer(self.base)
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": PROBE_TEXT}], add_generation_prompt=True, tokenize=False
        )
        return tokenizer.encode(text, add_special_tokens=False)

    def weights(self, checkpoint: Path | None) -> Path:
        """What a server loads for `checkpoint`: its merged weights or its adapter; None: the base."""
        if checkpoint is None:
            return Path(self.base)
        return checkpoint / ("adapter" if self.lora else "model")

    def served_name(self, version: str) -> str:
        """The model name a request for `version` uses (LoRA: each version is its own adapter)."""
        return f"{self.model_name}@{version}" if self.lora and version != "0" else self.model_name

    def versions(self) -> set[str | None]:
        """The versions the replicas serve now (full weights: vLLM's weight version; LoRA: the newest
        adapter loaded, "0" when none is)."""
        if not self.lora:
            return {VLLMAdmin(url).weight_version() for url in self.urls}
        versions: set[str | None] = set()
        prefix = self.model_name + "@"
        for url in self.urls:
            names = [m["id"] for m in get_json(server_root(url) + "/v1/models", timeout=MODELS_TIMEOUT_S)["data"]]
            loaded = [name[len(prefix) :] for name in names if name.startswith(prefix)]
            versions.add(max(loaded, key=int) if loaded else "0")
        return versions

    def behind(self, latest: Path | None, trainer: PolicyTrainer) -> bool:
        """Whether the servers serve another version than the `latest` commit (a crash after a
        commit): the lead asks them, and every rank holding part of the trainer's model hears the
        answer (they all take part in the probe of the swap that follows)."""
        behind = self.lead and latest is not None and self.versions() != {checkpoint_version(latest)}
        if behind and latest is not None:
            log.info("servers do not serve checkpoint %s yet: swapping it in", latest.name)
        return trainer.share(behind)

    def swap_in(self, trainer: PolicyTrainer, checkpoint: Path, rollback: Path | None) -> float:
        """Swap every replica to the committed `checkpoint` (`rollback`: what a replica that fails to
        load it goes back to), then probe it against `trainer`'s model, which must hold the same
        weights. Returns the swap's seconds (0.0 on a rank that is not the lead); JobFailed when a
        replica's probe is off, SwapError when a swap fails."""
        expected = trainer.prompt_logprobs(self.probe_ids)  # sharded: every rank runs the forward
        if not self.lead:
            return 0.0
        version = checkpoint_version(checkpoint)
        began = time.perf_counter()
        if self.push == "nccl":
            from lightning_otel.trainer.nccl_push import push_weights

            for url in self.urls:
                push_weights(url, trainer.model, version)
        else:
            self.swap(self.weights(checkpoint), version, self.weights(rollback))
        seconds = time.perf_counter() - began
        self.probe(expected, version)
        return seconds

    def roll_back(self, rejected: str, previous: Path | None, failure: Exception) -> JobFailed:
        """After `failure` (a swap or a probe of version `rejected`), put every replica back on the
        `previous` commit (None: the base weights). Returns the JobFailed to raise: it says whether the
        servers are back."""
        version = checkpoint_version(previous)
        try:
            if self.lora and self.gateway is None:
                self._unload(rejected)
            if self.lora and previous is None:  # the base is served under the model's own name
                if self.gateway is not None:
                    self.gateway.swap_lora(None, version, self.model_name)
            else:
                self.swap(self.weights(previous), version, self.weights(previous))
        except Exception as rollback_failure:
            return JobFailed(f"{failure}; and restoring version {version} failed: {rollback_failure}")
        return JobFailed(f"{failure}; servers restored to version {version}")

    def _unload(self, version: str) -> None:
        """Unload a rejected adapter from every replica that loaded it. Loaded directly, an adapter
        stays under its name: it would count as served (`versions`), and the step that next takes
        its version would be "already loaded" and never reach the servers. (The gateway unloads the
        adapter it swaps away from itself.)"""
        for url in self.urls:
            with contextlib.suppress(SwapError):  # a replica that never loaded it
                VLLMAdmin(url).unload_lora(self.served_name(version))

    def swap(self, weights: Path, version: str, rollback: Path) -> None:
        """Every replica to `weights` as `version`, through the gateway when there is one."""
        if self.gateway is not None:
            if self.lora:
                self.gateway.swap_lora(weights, version, self.model_name)
            else:
                self.gateway.swap_full(weights, version, rollback)
            return
        if self.lora:
            require_finite(weights)  # hot_swap checks full weights; an adapter is checked here
        for url in self.urls:
            admin = VLLMAdmin(url)
            if self.lora:
                admin.load_lora(self.served_name(version), weights)
            else:
                hot_swap(admin, weights, version, rollback)

    def probe(self, expected: list[float], version: str) -> None:
        """Each replica's logprobs on the probe prompt must match the trainer's `expected`."""
        for url in self.urls:
            diff = served_max_diff(VLLMAdmin(url), self.served_name(version), self.probe_ids, expected)
            if not diff <= self.tolerance:
                raise JobFailed(f"{url} serves logprobs {diff:.2e} away from the trainer's for version {version}")
