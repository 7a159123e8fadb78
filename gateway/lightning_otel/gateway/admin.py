"""Weight swaps coordinated by the gateway: no failed request, and every response's version exact.

Full weights, one replica at a time (the others keep serving): the gateway stops dispatching to the
replica (new requests wait in the gateway), waits until its requests in flight have finished, swaps
(lightning_otel.core.vllm_admin.hot_swap: validate, pause, reload, reset prefix cache, set version,
resume; rollback on failure), then dispatches again. A request is dispatched only while its
replica's version is stable, so the version recorded at dispatch is the version that serves it.

LoRA: the adapter is refused if it holds a NaN or an infinity; else it is loaded on every replica under a versioned name (`policy@7`); the gateway
then points the logical model name (`policy`) at it for new requests, atomically; requests already
running on the previous adapter finish on it, and it is unloaded once none is left. Back to the base
weights (no adapter): new requests wait in the gateway until the adapter's have finished.

Routes (bearer `--admin-token`; without one they answer 403):
    POST /admin/swap   {"mode": "full", "weights_path": DIR, "version": V, "rollback_path": DIR}
                       {"mode": "lora", "adapter_path": DIR, "version": V, "model": "policy"}  (DIR null: the base)
    GET  /admin/state
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiohttp import web

from lightning_otel.core.auth import bearer_ok
from lightning_otel.core.vllm_admin import SwapError, VLLMAdmin, hot_swap, require_finite
from lightning_otel.gateway.errors import error_response

_DRAIN_TIMEOUT_S = 600.0


def _admin_ok(request: web.Request, token: str | None) -> bool:
    return bool(token) and bearer_ok(request.headers.get("Authorization"), token)  # no admin token: no admin


async def _drained(condition: asyncio.Condition, still_busy) -> float:
    """Wait until still_busy() is false; returns the seconds waited."""
    began = time.perf_counter()
    async with condition:
        await asyncio.wait_for(condition.wait_for(lambda: not still_busy()), _DRAIN_TIMEOUT_S)
    return time.perf_counter() - began


async def swap_full(gateway, body: dict) -> dict[str, Any]:
    weights, version, rollback = body["weights_path"], str(body["version"]), body["rollback_path"]
    replicas = []
    for upstream in gateway.upstreams:
        upstream.gate.clear()  # new requests go to another replica, or wait in the gateway
        upstream.swaps += 1
        closed_ns = time.time_ns()
        try:
            waited = await _drained(gateway.idle, lambda u=upstream: u.inflight > 0)
            admin = VLLMAdmin(upstream.url, api_key=gateway.config.upstream_api_key)
            report = await asyncio.to_thread(hot_swap, admin, weights, version, rollback)
            upstream.version, upstream.version_owned = version, True
            upstream.healthy = True  # it has just answered every step of the swap
        finally:
            opened_ns = time.time_ns()
            upstream.gate.set()
        replicas.append(
            {
                "url": upstream.url,
                "drain_s": waited,
                "swap_s": report.seconds,
                "closed_ns": closed_ns,
                "opened_ns": opened_ns,
            }
        )
    return {"mode": "full", "version": version, "replicas": replicas}


async def swap_lora(gateway, body: dict) -> dict[str, Any]:
    """`adapter_path` null: `model` goes back to the base weights (a rollback past the first adapter)."""
    model, version, path = body["model"], str(body["version"]), body.get("adapter_path")
    if path is None:
        return await _lora_to_base(gateway, model, version)
    name = f"{model}@{version}"
    began = time.perf_counter()
    await asyncio.to_thread(require_finite, path)  # a NaN adapter is refused before any replica sees it
    for upstream in gateway.upstreams:
        await asyncio.to_thread(_admin(gateway, upstream).load_lora, name, path)
    previous = gateway.served.get(model)
    gateway.served[model] = (name, version)  # new requests for `model` go to the new adapter now
    _own_version(gateway, version)
    loaded = time.perf_counter() - began
    waited = await _unload_drained(gateway, previous)
    return {"mode": "lora", "version": version, "adapter": name, "load_s": loaded, "drain_s": waited}


async def _lora_to_base(gateway, model: str, version: str) -> dict[str, Any]:
    """New requests for `model` wait while the adapter's finish, then go to the base weights: a batch
    never mixes the two (see Gateway.adapter_for)."""
    held = gateway.base_held.setdefault(model, asyncio.Event())
    try:
        previous = gateway.served.pop(model, None)
        _own_version(gateway, version)
        waited = await _unload_drained(gateway, previous)
    finally:
        held.set()
        gateway.base_held.pop(model, None)
    return {"mode": "lora", "version": version, "adapter": None, "load_s": 0.0, "drain_s": waited}


def _admin(gateway, upstream) -> VLLMAdmin:
    return VLLMAdmin(upstream.url, api_key=gateway.config.upstream_api_key)


def _own_version(gateway, version: str) -> None:
    for upstream in gateway.upstreams:
        upstream.version, upstream.version_owned = version, True


async def _unload_drained(gateway, previous: tuple[str, str] | None) -> float:
    """Once no request runs on the `previous` adapter, unload it from every replica; the seconds waited."""
    if previous is None:
        return 0.0
    waited = await _drained(gateway.idle, lambda: gateway.adapter_inflight[previous[0]] > 0)
    for upstream in gateway.upstreams:
        await asyncio.to_thread(_admin(gateway, upstream).unload_lora, previous[0])
    return waited


def routes(gateway) -> list[web.RouteDef]:
    lock = asyncio.Lock()  # one swap at a time

    async def swap(request: web.Request) -> web.Response:
        if not _admin_ok(request, gateway.config.admin_token):
            return error_response(403, "admin routes need --admin-token and its bearer token", "permission_error")
        try:
            body = await request.json()
            mode = body.get("mode", "full")
            async with lock:
                result = await (swap_lora if mode == "lora" else swap_full)(gateway, body)
        except (KeyError, ValueError, TypeError) as exc:
            return error_response(400, f"bad swap request: {exc}", "invalid_request_error")
        except SwapError as exc:
            return error_response(502, str(exc), "swap_failed")
        except TimeoutError:
            return error_response(504, "requests in flight did not drain in time", "drain_timeout")
        return web.json_response(result)

    async def state(request: web.Request) -> web.Response:
        if not _admin_ok(request, gateway.config.admin_token):
            return error_response(403, "admin routes need --admin-token and its bearer token", "permission_error")
        return web.json_response(
            {
                "replicas": [
                    {"url": u.url, "version": u.version, "inflight": u.inflight, "healthy": u.healthy}
                    for u in gateway.upstreams
                ],
                "served": {model: target for model, (target, _) in gateway.served.items()},
            }
        )

    return [web.post("/admin/swap", swap), web.get("/admin/state", state)]
