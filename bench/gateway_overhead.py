"""Gateway overhead: latency p50/p99 and requests/s, calling an upstream directly vs through the gateway.

    python bench/gateway_overhead.py --requests 2000 --concurrency 8
    python bench/gateway_overhead.py --litellm /path/to/venv/bin/litellm   # also the LiteLLM proxy

Upstream: the vLLM look-alike (stub_vllm.py), so the numbers are the proxy's own cost, not a model's.
Load: --concurrency clients (asyncio + aiohttp, in a separate process) sending chat completions
with a 512-token prompt; responses carry 32 completion tokens with logprobs. The gateway exports its
spans to a real collector. Every side (direct, gateway, LiteLLM proxy) is measured alike: --runs
rounds, each running every side once in turn, and each figure is the median over the runs (with
the range).
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
    parser.add_argument("--runs", type=int, default=3, help="rounds; each measures every side once")
    parser.add_argument(
        "--litellm",
        metavar="BIN",
        help="also measure the LiteLLM proxy started by this `litellm` "
        "executable (pip install 'litellm[proxy]', best in a separate venv)",
    )
    args = parser.parse_args()
    from lightning_otel.core.servers import free_port, stop_process, wait_http_ok
    from lightning_otel.testing.servers import CollectorProcess, GatewayProcess

    workdir = Path(tempfile.mkdtemp(prefix="lightning-gateway-bench-"))
    port = free_port()
    stub = subprocess.Popen([sys.executable, str(HERE / "stub_vllm.py"), "--port", str(port)], start_new_session=True)
    upstream = f"http://127.0.0.1:{port}"
    results: dict[str, list[dict]] = {}
    proxy = None
    try:
        wait_http_ok(upstream + "/weight_info", 30, stub, "stub")
        sides = [("direct", upstream + "/v1", "x")]
        if args.litellm:
            proxy_port = free_port()
            proxy = litellm_proxy(args.litellm, upstream, workdir, proxy_port)
            wait_http_ok(f"http://127.0.0.1:{proxy_port}/health/liveliness", 120, proxy, "LiteLLM proxy")
            sides.append(("litellm proxy", f"http://127.0.0.1:{proxy_port}/v1", LITELLM_KEY))
        with CollectorProcess(workdir / "data") as collector:
            with GatewayProcess([upstream], collector.traces_endpoint, log_path=workdir / "gateway.log") as gateway:
                sides.insert(1, ("gateway", gateway.url + "/v1", "x"))
                for run in range(args.runs):
                    for label, url, token in sides:
                        results.setdefault(label, []).append(load(url, args.requests, args.concurrency, token))
                        r = results[label][-1]
                        print(
                            f"run {run + 1} {label:>14}: p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, "
                            f"{r['requests_per_s']:.0f} req/s",
                            flush=True,
                        )
    finally:
        if proxy is not None:
            stop_process(proxy)
        stop_process(stub)
    median = {label: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for label, runs in results.items()}
    print(f"median of {args.runs} runs each (range), {args.requests} requests at concurrency {args.concurrency}:")
    for label, runs in results.items():
        spans = {k: f"{min(r[k] for r in runs):.2f}-{max(r[k] for r in runs):.2f}" for k in runs[0]}
        m = median[label]
        print(
            f"{label:>14}: p50 {m['p50_ms']:.2f} ms ({spans['p50_ms']}), p99 {m['p99_ms']:.2f} ms ({spans['p99_ms']}), "
            f"{m['requests_per_s']:.0f} req/s ({spans['requests_per_s']})"
        )
    print(
        f"gateway adds {median['gateway']['p50_ms'] - median['direct']['p50_ms']:.2f} ms p50, "
        f"{median['gateway']['p99_ms'] - median['direct']['p99_ms']:.2f} ms p99"
    )
    if "litellm proxy" in median:
        print(
            f"LiteLLM proxy adds {median['litellm proxy']['p50_ms'] - median['direct']['p50_ms']:.2f} ms p50; "
            f"gateway req/s / LiteLLM proxy req/s = {median['gateway']['requests_per_s'] / median['litellm proxy']['requests_per_s']:.1f}"
        )


if __name__ == "__main__":
    main()
