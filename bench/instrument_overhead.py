"""Added latency per call of `lightning_otel.instrument()` against the bare OpenAI client.

    python bench/instrument_overhead.py --calls 3000

Both clients call the same local vLLM look-alike (stub_vllm.py: a fixed vLLM-shaped response with
512 prompt and 32 completion token ids, answered in well under a millisecond), each in its own
process; the instrumented one exports to a real collector. Reports median and p90 latency per
call and the difference of medians: the cost of OpenInference's span plus our token capture.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CLIENT = """
import json, sys, time, openai
mode, url, calls = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode != "bare":
    import lightning_otel
    lightning_otel.instrument(endpoint=sys.argv[4], capture_tokens="off" if mode == "no-capture" else "auto",
                              hide_inputs=mode == "redacted", hide_outputs=mode == "redacted")
client = openai.OpenAI(base_url=url, api_key="x")
messages = [{"role": "user", "content": "hello " * 200}]
times = []
for i in range(calls + 200):
    t = time.perf_counter()
    if mode != "bare":
        with lightning_otel.rollout(task_id="bench"):
            client.chat.completions.create(model="policy", messages=messages, max_tokens=32)
    else:
        client.chat.completions.create(model="policy", messages=messages, max_tokens=32)
    if i >= 200:
        times.append(time.perf_counter() - t)
print(json.dumps(times))
"""


def run(mode: str, url: str, calls: int, endpoint: str) -> list[float]:
    out = subprocess.run([sys.executable, "-c", CLIENT, mode, url, str(calls), endpoint], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    args = parser.parse_args()
    from lightning_otel.servers import CollectorProcess, free_port, stop_process, wait_http_ok

    port = free_port()
    stub = subprocess.Popen([sys.executable, str(HERE / "stub_vllm.py"), "--port", str(port)], start_new_session=True)
    workdir = tempfile.mkdtemp(prefix="lightning-overhead-")
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/weight_info", 30, stub, "stub")
        with CollectorProcess(Path(workdir) / "data") as collector:
            results = {}
            # interleaved, so drift hits all; "no-capture" is instrument(capture_tokens="off"):
            # OpenInference's span alone, without our token capture
            # "redacted" hides prompt and completion text (OpenInference serializes much less)
            for mode in ("bare", "instrumented", "no-capture", "redacted") * 2:
                times = run(mode, f"http://127.0.0.1:{port}/v1", args.calls, collector.traces_endpoint)
                results.setdefault(mode, []).extend(times)
    finally:
        stop_process(stub)
    summary = {}
    for mode, times in results.items():
        times.sort()
        summary[mode] = {"median_us": statistics.median(times) * 1e6, "p90_us": times[int(0.9 * len(times))] * 1e6}
        print(f"{mode:>13}: median {summary[mode]['median_us']:.0f} us, p90 {summary[mode]['p90_us']:.0f} us ({len(times)} calls)")
    added = summary["instrumented"]["median_us"] - summary["bare"]["median_us"]
    capture = summary["instrumented"]["median_us"] - summary["no-capture"]["median_us"]
    print(f"added by instrument(): {added:.0f} us per call (median), of which token capture {capture:.0f} us")


if __name__ == "__main__":
    main()
