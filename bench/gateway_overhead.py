"""Gateway overhead: latency p50/p99 and requests/s, calling an upstream directly vs through the gateway.

    python bench/gateway_overhead.py --requests 2000 --concurrency 8
    python bench/gateway_overhead.py --litellm /path/to/venv/bin/litellm   # also the LiteLLM proxy

Upstream: the vLLM look-alike (stub_vllm.py), so the numbers are the proxy's own cost, not a model's.
Load: --concurrency clients (asyncio + aiohttp, in a separate process) sending chat completions
with a 512-token prompt; responses carry 32 completion tokens with logprobs. The gateway exports its
spans to a real collector.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOAD = """
import asyncio, json, sys, time, aiohttp
url, requests, concurrency, token = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
headers = {"Content-Type": "application/json", "Authorization": "Bearer " + token}
body = json.dumps({"model": "policy", "messages": [{"role": "user", "content": "hello " * 500}], "max_tokens": 32})
async def main():
    latencies = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async def worker(n):
            for _ in range(n):
                t = time.perf_counter()
                async with session.post(url + "/chat/completions", data=body, headers=headers) as reply:
                    await reply.read()
                    assert reply.status == 200, reply.status
                latencies.append(time.perf_counter() - t)
        await asyncio.gather(*[worker(50) for _ in range(concurrency)])  # warm-up
        latencies.clear()
        start = time.perf_counter()
        await asyncio.gather(*[worker(requests // concurrency) for _ in range(concurrency)])
        print(json.dumps({"latencies": latencies, "seconds": time.perf_counter() - start}))
asyncio.run(main())
"""


LITELLM_KEY = "sk-lightning-bench"


def load(url: str, requests: int, concurrency: int, token: str = "x") -> dict:
    out = subprocess.run(
        [sys.executable, "-c", LOAD, url, str(requests), str(concurrency), token],
        capture_output=True,
        text=True,
        check=True,
    )
    data = json.loads(out.stdout.strip().splitlines()[-1])
    latencies = sorted(data["latencies"])
    return {
        "p50_ms": statistics.median(latencies) * 1e3,
        "p99_ms": latencies[int(0.99 * (len(latencies) - 1))] * 1e3,
        "requests_per_s": len(latencies) / data["seconds"],
    }


def litellm_proxy(binary: str, upstream: str, workdir: Path, port: int) -> subprocess.Popen:
    config = workdir / "litellm.yaml"
    config.write_text(
        textwrap.dedent(f"""
        model_list:
          - model_name: policy
            litellm_params: {{model: hosted_vllm/policy, api_base: "{upstream}/v1", api_key: x}}
    """)
    )
    env = {
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_MASTER_KEY": LITELLM_KEY,
        "PATH": str(Path(binary).parent) + ":/usr/bin:/bin",
    }
    return subprocess.Popen(
        [binary, "--config", str(config), "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument(
        "--litellm",
        metavar="BIN",
        help="also measure the LiteLLM proxy started by this `litellm` "
        "executable (pip install 'litellm[proxy]', best in a separate venv)",
    )
    args = parser.parse_args()
    from lightning_otel.core.servers import CollectorProcess, GatewayProcess, free_port, stop_process, wait_http_ok

    workdir = Path(tempfile.mkdtemp(prefix="lightning-gateway-bench-"))
    port = free_port()
    stub = subprocess.Popen([sys.executable, str(HERE / "stub_vllm.py"), "--port", str(port)], start_new_session=True)
    upstream = f"http://127.0.0.1:{port}"
    results = {}
    try:
        wait_http_ok(upstream + "/weight_info", 30, stub, "stub")
        with CollectorProcess(workdir / "data") as collector:
            with GatewayProcess([upstream], collector.traces_endpoint, log_path=workdir / "gateway.log") as gateway:
                for label, url in (("direct", upstream + "/v1"), ("gateway", gateway.url + "/v1")) * 2:
                    results.setdefault(label, []).append(load(url, args.requests, args.concurrency))
        if args.litellm:
            proxy_port = free_port()
            proxy = litellm_proxy(args.litellm, upstream, workdir, proxy_port)
            try:
                wait_http_ok(f"http://127.0.0.1:{proxy_port}/health/liveliness", 120, proxy, "LiteLLM proxy")
                results["litellm proxy"] = [
                    load(f"http://127.0.0.1:{proxy_port}/v1", args.requests, args.concurrency, LITELLM_KEY)
                ]
            finally:
                stop_process(proxy)
    finally:
        stop_process(stub)
    best = {label: min(runs, key=lambda r: r["p50_ms"]) for label, runs in results.items()}
    for label, r in best.items():
        print(f"{label:>14}: p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, {r['requests_per_s']:.0f} req/s")
    print(
        f"gateway adds {best['gateway']['p50_ms'] - best['direct']['p50_ms']:.2f} ms p50, "
        f"{best['gateway']['p99_ms'] - best['direct']['p99_ms']:.2f} ms p99 at concurrency {args.concurrency}"
    )
    if "litellm proxy" in best:
        print(
            f"LiteLLM proxy adds {best['litellm proxy']['p50_ms'] - best['direct']['p50_ms']:.2f} ms p50; "
            f"gateway req/s / LiteLLM proxy req/s = {best['gateway']['requests_per_s'] / best['litellm proxy']['requests_per_s']:.1f}"
        )


if __name__ == "__main__":
    main()
