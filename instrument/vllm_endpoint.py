"""What the agent side knows about a vLLM endpoint: is it vLLM, which weights is it serving,
how to ask it for token ids and logprobs, and how to read them back.

Shared by every integration (OpenAI SDK now; gateway and others later) so the request fields
and the response layout of vLLM are spelled once. Standard library only: this runs in agents.
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Mapping

from lightning_otel.instrument import schema
from lightning_otel.instrument.token_encoding import pack_floats, pack_ints

log = logging.getLogger(__name__)

CHAT = "chat"
COMPLETIONS = "completions"
_PROBE_TIMEOUT_S = 2.0


def endpoint_kind(path: str) -> str | None:
    """'chat' for .../chat/completions, 'completions' for .../completions, else None."""
    path = path.split("?", 1)[0].rstrip("/")
    if path.endswith("/chat/completions") or path == "chat/completions":
        return CHAT
    if path.endswith("/completions") or path == "completions":
        return COMPLETIONS
    return None


def token_request_fields(kind: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """Fields to add to a request so vLLM returns prompt/completion token ids and the chosen
    tokens' logprobs. Never lowers what the caller asked for (top_logprobs, logprobs=N)."""
    extra: dict[str, Any] = {"return_token_ids": True}
    if kind == CHAT:
        if not body.get("logprobs"):
            extra["logprobs"] = True
    elif body.get("logprobs") is None:
        extra["logprobs"] = 0  # completions: 0 = only the sampled token's logprob
    return extra


def _get(obj: Any, key: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(key)
    value = getattr(obj, key, None)
    if value is None:
        extra = getattr(obj, "model_extra", None)  # vLLM-only fields on openai's pydantic models
        if extra:
            value = extra.get(key)
    return value


def token_attributes(kind: str, response: Any) -> dict[str, Any]:
    """The schema's token attributes (packed) from a (non-streaming) vLLM response, dict or SDK
    object. Logprobs are recorded only when they align one to one with the completion ids."""
    choices = _get(response, "choices") or []
    if not choices:
        return {}
    choice = choices[0]
    if kind == CHAT:
        prompt_ids = _get(response, "prompt_token_ids")
        logprobs_obj = _get(choice, "logprobs")
        content = _get(logprobs_obj, "content") if logprobs_obj is not None else None
        logprobs = [float(_get(entry, "logprob")) for entry in content] if content else None
    else:
        prompt_ids = _get(choice, "prompt_token_ids")
        logprobs_obj = _get(choice, "logprobs")
        token_logprobs = _get(logprobs_obj, "token_logprobs") if logprobs_obj is not None else None
        logprobs = [float(x) for x in token_logprobs] if token_logprobs else None
    completion_ids = _get(choice, "token_ids")
    attributes: dict[str, Any] = {}
    if prompt_ids is not None:
        attributes[schema.PACKED_PROMPT_TOKEN_IDS] = pack_ints(prompt_ids)
    if completion_ids is not None:
        attributes[schema.PACKED_COMPLETION_TOKEN_IDS] = pack_ints(completion_ids)
        if logprobs is not None and len(logprobs) == len(completion_ids):
            attributes[schema.PACKED_COMPLETION_LOGPROBS] = pack_floats(logprobs)
        elif logprobs is not None:
            log.warning("vLLM returned %d logprobs for %d completion tokens; not recorded",
                        len(logprobs), len(completion_ids))
    finish_reason = _get(choice, "finish_reason")
    if finish_reason is not None:
        attributes[schema.FINISH_REASON] = str(finish_reason)
    return attributes


@dataclass
class _ServerInfo:
    is_vllm: bool
    has_weight_info: bool


class VLLMEndpoints:
    """Caches, per base URL, whether the server is vLLM (its /v1/models says owned_by 'vllm')
    and whether it exposes /weight_info (dev mode), and reads the current weight version."""

    def __init__(self) -> None:
        self._info: dict[str, _ServerInfo] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _fetch_json(url: str, headers: Mapping[str, str]) -> Any:
        request = urllib.request.Request(url, headers=dict(headers))
        with urllib.request.urlopen(request, timeout=_PROBE_TIMEOUT_S) as reply:  # noqa: S310 - user's URL
            return json.loads(reply.read())

    @staticmethod
    def server_root(base_url: str) -> str:
        base = base_url.rstrip("/")
        return base[: -len("/v1")] if base.endswith("/v1") else base

    def info(self, base_url: str, headers: Mapping[str, str]) -> _ServerInfo:
        base = base_url.rstrip("/")
        cached = self._info.get(base)
        if cached is not None:
            return cached
        try:
            models = self._fetch_json(base + "/models", headers)
            is_vllm = any(m.get("owned_by") == "vllm" for m in models.get("data", []))
        except (OSError, ValueError, AttributeError) as exc:
            log.debug("not treating %s as vLLM: %s", base, exc)
            is_vllm = False
        has_weight_info = False
        if is_vllm:
            try:
                self._fetch_json(self.server_root(base) + "/weight_info", headers)
                has_weight_info = True
            except (OSError, ValueError):
                has_weight_info = False  # dev-mode routes off: no policy version recorded
        info = _ServerInfo(is_vllm=is_vllm, has_weight_info=has_weight_info)
        with self._lock:
            self._info[base] = info
        return info

    def weight_version(self, base_url: str, headers: Mapping[str, str]) -> str | None:
        """The weight version the server reports now (None if it does not say)."""
        if not self.info(base_url, headers).has_weight_info:
            return None
        try:
            return str(self._fetch_json(self.server_root(base_url) + "/weight_info", headers)["weight_version"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def forget(self) -> None:
        with self._lock:
            self._info.clear()


ENDPOINTS = VLLMEndpoints()
