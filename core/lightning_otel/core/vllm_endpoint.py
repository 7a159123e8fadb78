"""What a client of vLLM's OpenAI-compatible endpoints knows about one: is it vLLM, which weights is
it serving, how to ask it for token ids and logprobs, and how to read them back.

Shared by every agent-side integration and the gateway, so vLLM's request fields and response layout
are spelled once. Standard library only: this runs in agents.
"""

from __future__ import annotations

import http.client
import json
import logging
import operator
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from lightning_otel.core import schema
from lightning_otel.core.http_json import HttpError, get_json
from lightning_otel.core.token_encoding import attribute, pack
from lightning_otel.core.vllm_admin import WEIGHT_INFO_PATH, server_root, weight_version_of

log = logging.getLogger(__name__)

CHAT = "chat"
COMPLETIONS = "completions"
_PROBE_TIMEOUT_S = 2.0
# A server that gave no answer in time (busy, starting, unreachable) is asked again after this long:
# meanwhile its calls are not captured; a "not vLLM" that is only a timeout is never kept for good.
PROBE_RETRY_S = 10.0
_LOGPROB = operator.attrgetter("logprob")


def endpoint_kind(path: str) -> str | None:
    """'chat' for .../chat/completions, 'completions' for .../completions, else None."""
    known = _kinds.get(path, _UNKNOWN)
    if known is _UNKNOWN:
        if len(_kinds) > 1024:
            _kinds.clear()
        known = _kinds[path] = _endpoint_kind(path)
    return cast("str | None", known)  # not _UNKNOWN any more


_kinds: dict[str, str | None] = {}  # the few request paths a process uses, on every call
_UNKNOWN = object()


def _endpoint_kind(path: str) -> str | None:
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


def read_field(obj: Any, key: str) -> Any:
    """obj[key] of a dict, obj.key of an SDK object (or its pydantic extras), else None.
    Runs tens of times per model call, hence the order: plain dicts, then what an object holds in
    its __dict__ (pydantic fields live there) or in pydantic's extras (vLLM-only fields on openai's
    models), before the general cases (a pydantic model's getattr of a missing name raises inside)."""
    if type(obj) is dict:
        return obj.get(key)
    fields = getattr(obj, "__dict__", None)
    if fields is not None and key in fields:
        return fields[key]
    extra = getattr(obj, "__pydantic_extra__", None)
    if extra is not None:
        if key in extra:
            return extra[key]
        if fields is not None and not _class_has(type(obj), key):
            return None  # a pydantic model without this field, extra or property
    if isinstance(obj, Mapping):
        return obj.get(key)
    return getattr(obj, key, None)


_class_attributes: dict[tuple[type, str], bool] = {}


def _class_has(cls: type, key: str) -> bool:
    """hasattr(cls, key), remembered: on a pydantic model class a missing name raises inside its
    metaclass, and the same few (class, name) pairs are asked on every call."""
    known = _class_attributes.get((cls, key))
    if known is None:
        if len(_class_attributes) > 4096:
            _class_attributes.clear()
        known = _class_attributes[(cls, key)] = hasattr(cls, key)
    return known


def _packed(prompt_ids, completion_ids, logprobs, finish_reason) -> dict[str, Any]:
    """The schema's token attributes, packed; logprobs only when they align one to one with the ids."""
    prompt, completion, lps = (
        None if v is None else pack(code, v) for code, v in (("i", prompt_ids), ("i", completion_ids), ("d", logprobs))
    )
    return packed_attributes(prompt, completion, lps, finish_reason)


def packed_attributes(
    prompt: bytes | None, completion: bytes | None, logprobs: bytes | None, finish_reason: Any
) -> dict[str, Any]:
    """The schema's token attributes from ids already packed as little-endian int32 and logprobs as
    float64 bytes; logprobs only when they align one to one with the completion ids."""
    attributes: dict[str, Any] = {}
    if prompt is not None:
        attributes[schema.PACKED_PROMPT_TOKEN_IDS] = attribute(prompt)
    if completion is not None:
        attributes[schema.PACKED_COMPLETION_TOKEN_IDS] = attribute(completion)
        if logprobs is not None and len(logprobs) // 8 == len(completion) // 4:
            attributes[schema.PACKED_COMPLETION_LOGPROBS] = attribute(logprobs)
        elif logprobs is not None:
            log.warning(
                "vLLM returned %d logprobs for %d completion tokens; not recorded",
                len(logprobs) // 8,
                len(completion) // 4,
            )
    if finish_reason is not None:
        attributes[schema.FINISH_REASON] = str(finish_reason)
    return attributes


def _choice_logprobs(kind: str, choice: Any) -> list[float] | None:
    logprobs_obj = read_field(choice, "logprobs")
    if logprobs_obj is None:
        return None
    if kind == CHAT:
        content = read_field(logprobs_obj, "content")
        if content is None:
            return None
        if content and type(content[0]) is not dict:  # SDK objects (floats from JSON; packing checks them)
            try:
                return list(map(_LOGPROB, content))
            except AttributeError:
                pass
        return [float(read_field(entry, "logprob")) for entry in content]  # the response JSON, or anything else
    token_logprobs = read_field(logprobs_obj, "token_logprobs")
    return [float(x) for x in token_logprobs] if token_logprobs is not None else None


def first_choice(response: Any) -> Any:
    for choice in read_field(response, "choices") or []:
        if (read_field(choice, "index") or 0) == 0:
            return choice
    return None


def token_attributes(kind: str, response: Any) -> dict[str, Any]:
    """Token attributes from a non-streaming vLLM response (a dict or an SDK object), choice 0."""
    choice = first_choice(response)
    if choice is None:
        return {}
    prompt_ids = read_field(response, "prompt_token_ids") if kind == CHAT else read_field(choice, "prompt_token_ids")
    return _packed(
        prompt_ids, read_field(choice, "token_ids"), _choice_logprobs(kind, choice), read_field(choice, "finish_reason")
    )


class StreamAccumulator:
    """Assembles token ids and logprobs from a vLLM stream, chunk by chunk, in order (choice 0).
    vLLM sends prompt ids once (top level for chat, in the choice for completions) and each
    chunk's new completion ids and their logprobs."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.prompt_ids: list[int] | None = None
        self.completion_ids: list[int] = []
        self.logprobs: list[float] = []
        self.logprobs_complete = True
        self.seen_ids = False
        self.finish_reason: str | None = None

    def add(self, chunk: Any) -> None:
        if self.kind == CHAT and self.prompt_ids is None:
            self.prompt_ids = read_field(chunk, "prompt_token_ids")
        choice = first_choice(chunk)
        if choice is None:
            return
        if self.kind == COMPLETIONS and self.prompt_ids is None:
            self.prompt_ids = read_field(choice, "prompt_token_ids")
        ids = read_field(choice, "token_ids")
        if ids:
            self.seen_ids = True
            self.completion_ids.extend(int(t) for t in ids)
            logprobs = _choice_logprobs(self.kind, choice)
            if logprobs is None or len(logprobs) != len(ids):
                self.logprobs_complete = False
            else:
                self.logprobs.extend(logprobs)
        finish = read_field(choice, "finish_reason")
        if finish is not None:
            self.finish_reason = finish

    def token_counts(self) -> dict[str, int]:
        """OpenInference's token counts, from the ids the stream carried."""
        if self.prompt_ids is None or not self.seen_ids:
            return {}
        prompt, completion = len(self.prompt_ids), len(self.completion_ids)
        return {
            schema.LLM_TOKEN_COUNT_PROMPT: prompt,
            schema.LLM_TOKEN_COUNT_COMPLETION: completion,
            schema.LLM_TOKEN_COUNT_TOTAL: prompt + completion,
        }

    def attributes(self) -> dict[str, Any]:
        logprobs = self.logprobs if self.logprobs_complete else None
        return _packed(self.prompt_ids, self.completion_ids if self.seen_ids else None, logprobs, self.finish_reason)


@dataclass(frozen=True)
class _ServerInfo:
    is_vllm: bool
    has_weight_info: bool


_NOT_VLLM = _ServerInfo(is_vllm=False, has_weight_info=False)  # for now: a server that has not answered yet


class _VersionReader:
    """One vLLM server's weight version, read by a thread of its own (a dead or slow server stalls only
    that thread): every `poll_s`, and soon after any call asked for a label (at most every
    `min_gap_s`, which bounds the /weight_info load a busy agent adds). `latest` is (monotonic time
    the read that gave it was sent, version), swapped as one tuple so a reader never sees half."""

    def __init__(self, owner: VLLMEndpoints, base: str, headers: dict, version: str, read_at: float) -> None:
        self.owner, self.base, self.headers = owner, base, headers
        self.latest = (read_at, version)
        self.wake = threading.Event()
        self.lock = threading.Lock()  # guards `waiting`; never held across a read
        self.waiting: list[tuple[float, Callable[[str], None]]] = []
        self.stopped = False
        root = urllib.parse.urlsplit(server_root(base))
        host = root.hostname
        if not host:
            raise ValueError(f"no host in the vLLM URL {base!r}")
        self.path = (root.path or "") + WEIGHT_INFO_PATH
        connection = http.client.HTTPSConnection if root.scheme == "https" else http.client.HTTPConnection
        self.connect = lambda: connection(host, root.port, timeout=_PROBE_TIMEOUT_S)
        self.connection: http.client.HTTPConnection | None = None
        threading.Thread(target=self._run, name=f"lightning-otel-weight-version {base}", daemon=True).start()

    def read(self) -> str | None:
        """GET /weight_info on one kept-alive connection (a new one per read costs the agent several
        times the CPU); None when it fails or says no version, and the connection is dropped."""
        try:
            if self.connection is None:
                self.connection = self.connect()
            self.connection.request("GET", self.path, headers=self.headers)
            reply = self.connection.getresponse()
            body = reply.read()
            if reply.status == 200:
                return weight_version_of(json.loads(body))
        except (OSError, http.client.HTTPException, ValueError, KeyError, TypeError):
            pass
        if self.connection is not None:
            self.connection.close()
            self.connection = None
        return None

    def label(self, since: float, apply: Callable[[str], None]) -> None:
        with self.lock:
            self.waiting.append((since, apply))
        self.wake.set()

    def _run(self) -> None:
        owner, started = self.owner, 0.0
        while not self.stopped:
            self.wake.wait(owner.version_poll_s)
            pause = started + owner.min_gap_s - time.monotonic()
            if pause > 0:  # reads at most every min_gap_s, however many calls ask
                time.sleep(pause)
            self.wake.clear()
            started = time.monotonic()
            version = self.read()
            if version is not None:
                self.latest = (started, version)
            # a failed read releases every waiting label with the last version seen
            self._apply(started if version is not None else float("inf"))
        self._apply(float("inf"))

    def _apply(self, up_to: float) -> None:
        """Apply the labels of calls that ended at or before `up_to`."""
        with self.lock:
            ready = [w for w in self.waiting if w[0] <= up_to]
            self.waiting = [w for w in self.waiting if w[0] > up_to]
        for _, apply in ready:
            try:
                apply(self.latest[1])
            except Exception:
                log.exception("lightning_otel: could not label a span with its weight version")
        if ready:
            self.owner._settled()


class VLLMEndpoints:
    """Caches, per base URL, whether the server is vLLM (its /v1/models says owned_by 'vllm')
    and its weight version, which a background thread per server re-reads (`_VersionReader`):
    nothing on an agent's call path waits on the network after the first contact with a server.

    `label(base_url, since, apply)` labels a call exactly: `apply(version)` runs with the version
    of a /weight_info read sent after `since` (the moment the call's response arrived), on the
    reader's thread, never the caller's. vLLM's swap (pause, reload, set version, resume) holds calls
    that arrive during it until the new version is set, so such a read names the weights that
    served the call unless the swap's reload takes less than the wait for that read (at most
    `min_gap_s` plus a round trip; reloading weights takes longer)."""

    def __init__(self, version_poll_s: float = 0.2, min_gap_s: float = 0.01) -> None:
        self.version_poll_s, self.min_gap_s = version_poll_s, min_gap_s
        self._info: dict[str, _ServerInfo] = {}
        self._unanswered: dict[str, float] = {}  # base URL -> when to ask again (time.monotonic())
        self._readers: dict[str, _VersionReader] = {}
        self._lock = threading.Lock()
        self._idle = threading.Condition()

    def cached(self, base_url: str) -> _ServerInfo | None:
        """What info() found for this server, None if it was not asked yet (no network)."""
        return self._info.get(base_url.rstrip("/"))

    def info(self, base_url: str, headers: Mapping[str, str]) -> _ServerInfo:
        """Whether the server is vLLM, asked once per server (the only network I/O on a caller's
        thread: the first call to a server; async integrations run it in a worker thread)."""
        cached = self.cached(base_url)
        if cached is not None:
            return cached
        base = base_url.rstrip("/")
        if time.monotonic() < self._unanswered.get(base, 0.0):
            return _NOT_VLLM  # it did not answer a moment ago: not asked again yet
        try:
            models = get_json(base + "/models", timeout=_PROBE_TIMEOUT_S, headers=headers)
            is_vllm = any(m.get("owned_by") == "vllm" for m in models.get("data", []))
        except (OSError, ValueError, AttributeError) as exc:
            if isinstance(exc, HttpError) and exc.status is None:  # no answer: a later call asks again
                log.warning(
                    "lightning_otel: %s did not say whether it is vLLM (%s); asking again in %.0f s",
                    base,
                    exc.reason,
                    PROBE_RETRY_S,
                )
                self._unanswered[base] = time.monotonic() + PROBE_RETRY_S
                return _NOT_VLLM
            log.debug("not treating %s as vLLM: %s", base, exc)
            is_vllm = False
        read_at = time.monotonic()
        version = self._read_version(base, headers) if is_vllm else None
        info = _ServerInfo(is_vllm=is_vllm, has_weight_info=version is not None)
        with self._lock:
            self._info[base] = info
            if version is not None and base not in self._readers:
                self._readers[base] = _VersionReader(self, base, dict(headers), version, read_at)
        return info

    def _read_version(self, base: str, headers: Mapping[str, str]) -> str | None:
        try:
            return weight_version_of(
                get_json(server_root(base) + WEIGHT_INFO_PATH, timeout=_PROBE_TIMEOUT_S, headers=headers)
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None  # dev-mode routes off, or the server did not answer in time

    def label(self, base_url: str, since: float, apply: Callable[[str | None], None]) -> None:
        """Call `apply(version)` once a read sent after `since` (time.monotonic()) answered, from the
        server's reader thread; now, with None, for a server whose version is not read."""
        reader = self._readers.get(base_url.rstrip("/"))
        if reader is None:
            apply(None)
        else:
            reader.label(since, apply)

    def weight_version(self, base_url: str) -> str | None:
        """The last weight version seen for this server (None if it does not say); from memory."""
        reader = self._readers.get(base_url.rstrip("/"))
        return reader.latest[1] if reader is not None else None

    def pending(self) -> int:
        return sum(len(reader.waiting) for reader in list(self._readers.values()))

    def _settled(self) -> None:
        with self._idle:
            self._idle.notify_all()

    def settle(self, timeout_s: float = 2 * _PROBE_TIMEOUT_S + 1) -> bool:
        """Wait until every label asked for was applied (a flush does this first); False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._idle:
            while self.pending():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(min(left, 0.05))
        return True

    def forget(self) -> None:
        with self._lock:
            for reader in self._readers.values():
                reader.stopped = True
            self._info.clear()
            self._readers.clear()


ENDPOINTS = VLLMEndpoints()
