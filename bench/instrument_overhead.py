"""Added latency per call of `lightning_otel.instrument()` against the bare OpenAI client.

    python bench/instrument_overhead.py --calls 2000

Every client calls the same local vLLM look-alike (stub_vllm.py: a fixed vLLM-shaped response with
512 prompt and 32 completion token ids and their logprobs when the request asks for them, as vLLM
does, answered in well under a millisecond) and exports to a real collector. So the added latency
includes parsing the token fields instrument() asks for; `--stub-fields always` sends them to the
bare client too, leaving only the instrumentation's own work. Each mode runs in its own process, twice, interleaved so drift hits all. Modes:

  bare                   the OpenAI client, nothing instrumented
  lean                   instrument(), the default: our lean span + token capture
  lean-nocap             instrument(capture_tokens="off"): our lean span alone
  openinference          instrument(openai_spans="openinference"): OpenInference's span + our token capture
  openinference-nocap    instrument(openai_spans="openinference", capture_tokens="off")
  lean-genai             instrument(gen_ai_conventions="latest"): lean + GenAI conventions, messages as JSON parts
  lean-genai-v1.36       instrument(gen_ai_conventions="v1.36"): lean + GenAI conventions, no message content

Calls run inside one rollout (as in an agent; rollout attributes are copied onto each span). Per
mode it reports:
  - paired: within one process, calls alternate between the bare and the instrumented client;
    the median of the per-pair differences is the added latency, insensitive to drift between
    processes (the primary number);
  - separate: the median of a run of instrumented calls minus the bare process's median;
  - CPU per call (all threads: export and span finishing run in the background) minus bare's.
It also reports what opening and closing one `rollout()` costs (once per rollout, not per call).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODES = ("bare", "openinference", "openinference-nocap", "lean", "lean-nocap", "lean-genai", "lean-genai-v1.36")
CLIENT = """
import contextlib, json, statistics, sys, time, openai
pristine = openai.OpenAI.request
import lightning_otel
mode, url, calls, endpoint = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
if mode != "bare":
    spans = {} if mode.startswith("lean") else {"openai_spans": "openinference"}  # lean: the default
    if mode.startswith("lean-genai"):  # off by default
        spans["gen_ai_conventions"] = "v1.36" if mode.endswith("v1.36") else "latest"
    inst = lightning_otel.instrument(endpoint=endpoint, capture_tokens="off" if mode.endswith("nocap") else "auto", **spans)
instrumented = openai.OpenAI.request
client = openai.OpenAI(base_url=url, api_key="x")
messages = [{"role": "user", "content": "hello " * 200}]

def call():
    t = time.perf_counter()
    client.chat.completions.create(model="policy", messages=messages, max_tokens=32)
    return time.perf_counter() - t

result = {}
with lightning_otel.rollout(task_id="bench") if mode != "bare" else contextlib.nullcontext():
    for _ in range(200):
        call()  # warm up (and the vLLM probe)
    cpu = time.process_time()
    result["separate"] = [call() for _ in range(calls)]
    result["cpu_per_call"] = (time.process_time() - cpu) / calls
    if mode != "bare":
        diffs = []
        for i in range(calls):
            pair = {}
            for which in ((0, 1) if i % 2 else (1, 0)):
                openai.OpenAI.request = instrumented if which else pristine
                pair[which] = call()
            diffs.append(pair[1] - pair[0])
        openai.OpenAI.request = instrumented
        result["paired"] = diffs
if mode != "bare":
    rollouts = []
    for _ in range(1000):
        t = time.perf_counter()
        with lightning_otel.rollout(task_id="bench"):
            pass
        rollouts.append(time.perf_counter() - t)
    result["rollout"] = rollouts
    inst.flush()
print(json.dumps(result))
"""


def run(mode: str, url: str, calls: int, endpoint: str, client_path: str = "") -> dict:
    env = {k: v for k, v in os.environ.items() if k != "OTEL_SEMCONV_STABILITY_OPT_IN"}  # it would turn GenAI on
    if client_path:  # another checkout's agent side (core/ and instrument/), for a before/after in one run
        env["PYTHONPATH"] = os.pathsep.join([f"{client_path}/instrument", f"{client_path}/core"])
    out = subprocess.run(
        [sys.executable, "-c", CLIENT, mode, url, str(calls), endpoint],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of: " + ", ".join(MODES))
    parser.add_argument(
        "--stub-fields",
        choices=("asked", "always"),
        default="asked",
        help="asked (default): the look-alike returns token ids and logprobs only to requests that ask, "
        "as vLLM does, so the bare client does not parse them; always: every answer carries them, "
        "which isolates the instrumentation's own work",
    )
    parser.add_argument(
        "--baseline",
        default="",
        help="a folder with another version's core/ and instrument/ (e.g. `git archive HEAD core instrument`, with the "
        "built .so files copied in): its lean mode runs too, as lean@baseline, interleaved with the others",
    )
    args = parser.parse_args()
    began = time.perf_counter()
    modes = tuple(dict.fromkeys(["bare", *args.modes.split(",")]))  # bare is the baseline
    if not set(modes) <= set(MODES):
        parser.error(f"unknown modes: {sorted(set(modes) - set(MODES))}")
    from lightning_otel.core.servers import free_port, stop_process, wait_http_ok
    from lightning_otel.testing.servers import CollectorProcess

    port = free_port()
    stub = subprocess.Popen(
        [sys.executable, str(HERE / "stub_vllm.py"), "--port", str(port), "--fields", args.stub_fields],
        start_new_session=True,
    )
    workdir = tempfile.mkdtemp(prefix="lightning-overhead-")
    results: dict[str, dict[str, list]] = {}
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/weight_info", 30, stub, "stub")
        with CollectorProcess(Path(workdir) / "data") as collector:
            for mode in (modes + (("lean@baseline",) if args.baseline else ())) * 2:
                name, client_path = (mode.split("@")[0], args.baseline) if "@" in mode else (mode, "")
                for key, value in run(
                    name, f"http://127.0.0.1:{port}/v1", args.calls, collector.traces_endpoint, client_path
                ).items():
                    results.setdefault(mode, {}).setdefault(key, []).extend(
                        value if isinstance(value, list) else [value]
                    )
    finally:
        stop_process(stub)
    bare_median = statistics.median(results["bare"]["separate"])
    bare_cpu = statistics.mean(results["bare"]["cpu_per_call"])
    print(
        f"{'mode':>20} | added, paired (median) | added, separate (median) | added CPU per call | rollout() open+close"
    )
    for mode in modes + (("lean@baseline",) if args.baseline else ()):
        r = results[mode]
        separate = statistics.median(r["separate"]) - bare_median
        cpu = statistics.mean(r["cpu_per_call"]) - bare_cpu
        if mode == "bare":
            print(f"{mode:>20} | median call {bare_median * 1e6:.0f} us, CPU {bare_cpu * 1e6:.0f} us per call")
            continue
        print(
            f"{mode:>20} | {statistics.median(r['paired']) * 1e6:18.0f} us | {separate * 1e6:20.0f} us | "
            f"{cpu * 1e6:14.0f} us | {statistics.median(r['rollout']) * 1e6:.0f} us"
        )
    added = {mode: statistics.median(results[mode]["paired"]) for mode in results if mode != "bare"}
    for ours in ("lean", "lean-nocap", "lean@baseline"):
        if ours in added:
            line = f"{ours}: a call takes {(bare_median + added[ours]) / bare_median:.2f}x the bare call"
            if "openinference" in added:  # the goal (issue 36): <= 1/5 of OpenInference's with token capture
                line += f"; added cost {added[ours] / added['openinference']:.2f}x OpenInference's with token capture"
            print(line)
    print(f"whole run: {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
