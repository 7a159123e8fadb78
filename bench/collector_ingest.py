"""Collector ingest benchmark: OTLP/protobuf bodies built before timing, posted by sender processes.

    python bench/collector_ingest.py --payload a --requests 60 --senders 4
    python bench/collector_ingest.py --payload b --requests 60 --senders 4
    python bench/collector_ingest.py --payload c --requests 20000 --senders 4   # one span per request
    python bench/collector_ingest.py --payload c --requests 20000 --senders 4 --against noop   # then a no-op receiver
    python bench/collector_ingest.py --payload a --requests 20 --micro   # the receiver's steps alone
    python bench/collector_ingest.py --payload b --target http://127.0.0.1:6006/v1/traces   # another receiver
    python bench/collector_ingest.py --payload b --token-encoding base64 --requests 20 --against phoenix \
        --phoenix-python /work/phoenix-venv/bin/python   # then Arize Phoenix, same bodies, same run

Reports acknowledged spans/s and MB/s, p50/p99 ack latency, seconds from the last ack until every
span is queryable, spans/s sustained into Parquet (first send -> all queryable), and the peak RSS of
the collector with its worker processes. Payloads are defined in lightning_otel.testing.payloads; (c) is one training
span of (b)'s shape per request, as an exporter with OpenTelemetry's SimpleSpanProcessor sends them.
With `--against phoenix`, the same bodies then go to Arize Phoenix (its own venv,
bench/phoenix_server.py), and the ratios of acknowledged and stored spans/s are printed.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import random
import shutil
import statistics
import tempfile
import time
import urllib.parse
from pathlib import Path

from lightning_otel.collector.span_rows import decode_request
from lightning_otel.testing.payloads import build_request

PAYLOADS = {"a": (1000, False), "b": (200, True), "c": (1, True)}  # spans per request, training


def variants(base: bytes, count: int, seed: int) -> list[bytes]:
    """`count` copies of a request with fresh trace/span ids (distinct spans, same shape)."""
    rng = random.Random(seed)
    request = decode_request(base)
    out = []
    for _ in range(count):
        for resource in request.resource_spans:
            for scope in resource.scope_spans:
                for span in scope.spans:
                    span.trace_id = rng.randbytes(16)
                    span.span_id = rng.randbytes(8)
        out.append(request.SerializeToString())
    return out


def sender(url: str, bodies: list[bytes], start_at: float, results) -> None:
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=300)
    while time.time() < start_at:
        time.sleep(0.001)
    records = []
    for body in bodies:
        begin = time.perf_counter()
        while True:
            connection.request("POST", parts.path, body=body, headers={"Content-Type": "application/x-protobuf"})
            reply = connection.getresponse()
            reply.read()
            if reply.status in (429, 503):  # honour backpressure like the official exporters
                time.sleep(float(reply.getheader("Retry-After", "1")))
                continue
            break
        records.append((begin, time.perf_counter(), reply.status, time.time()))
    connection.close()
    times = os.times()
    results.put((records, times.user + times.system))  # with this sender's CPU


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for task in Path(f"/proc/{pid}/task").iterdir() for c in (task / "children").read_text().split()]
    except OSError:
        return []  # gone meanwhile


def _tree(pid: int) -> list[int]:
    """The process and its live descendants."""
    pids, todo = [], [pid]
    while todo:
        current = todo.pop()
        pids.append(current)
        todo += _children(current)
    return pids


def _peak_rss_kib(pid: int) -> int:
    try:
        return next(
            int(line.split()[1])
            for line in Path(f"/proc/{pid}/status").read_text().splitlines()
            if line.startswith("VmHWM:")
        )
    except (OSError, StopIteration):
        return 0


def _cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def peak_rss_mib(pid: int) -> float:
    """VmHWM of the process and its live descendants, summed."""
    return sum(_peak_rss_kib(p) for p in _tree(pid)) / 1024


def cpu_seconds(pid: int) -> float:
    """User + system CPU of the process and its live descendants, summed (seconds)."""
    return sum(_cpu_s(p) for p in _tree(pid))


def cpu_seconds_children(pid: int) -> float:
    """cpu_seconds of the process's descendants only."""
    return sum(cpu_seconds(child) for child in _children(pid))


def parquet_rows(data_dir: Path, seen: dict[Path, int]) -> int:
    """Rows in the store's Parquet files, from their footers (each file's read once, `seen`): a
    poll that costs the collector next to nothing (a `count(*)` over the deduplicating `spans`
    view every 0.2 s took CPU from it)."""
    import pyarrow.parquet as pq

    for path in (data_dir / "spans").rglob("*.parquet"):
        if path not in seen:
            try:
                seen[path] = pq.ParquetFile(path).metadata.num_rows
            except OSError:
                continue  # compacted away meanwhile
    return sum(seen.values())


def send_all(url: str, bodies: list[bytes], senders: int) -> tuple[list[tuple], float, float]:
    """Post `bodies` from `senders` processes: (records, senders' CPU seconds, scheduled start)."""
    context = multiprocessing.get_context("fork")  # senders inherit the prebuilt bodies
    results = context.Queue()
    start_at = time.time() + 1.0
    shares = [bodies[i::senders] for i in range(senders)]
    processes = [context.Process(target=sender, args=(url, share, start_at, results)) for share in shares]
    for process in processes:
        process.start()
    sent = [results.get() for _ in processes]
    for process in processes:
        process.join()
    return [r for share_records, _ in sent for r in share_records], sum(seconds for _, seconds in sent), start_at


def ack_figures(records: list[tuple], total_spans: int, total_bytes: int) -> dict:
    send_s = max(r[1] for r in records) - min(r[0] for r in records)
    latencies = sorted((r[1] - r[0]) * 1000 for r in records)
    return {
        "non_200": sum(1 for r in records if r[2] != 200),
        "ack_requests_per_s": len(records) / send_s,
        "ack_spans_per_s": total_spans / send_s,
        "ack_mb_per_s": total_bytes / send_s / 1e6,
        "ack_p50_ms": statistics.median(latencies),
        "ack_p99_ms": latencies[int(0.99 * (len(latencies) - 1))],
    }


def measure_ours(args: argparse.Namespace, bodies: list[bytes], total_spans: int, workdir: Path) -> dict:
    from lightning_otel.collector import connect
    from lightning_otel.testing.servers import CollectorProcess

    collector = CollectorProcess(
        workdir / "data",
        flush_interval_s=1.0,
        log_path=workdir / "collector.log",
        extra_args=["--workers", str(args.workers)],
    ).start()
    try:
        pid = collector.process.pid
        cpu_before = {"receiver": cpu_seconds(pid), "workers": cpu_seconds_children(pid)}
        records, sender_cpu, start_at = send_all(collector.traces_endpoint, bodies, args.senders)
        out = ack_figures(records, total_spans, sum(len(b) for b in bodies))
        footers: dict[Path, int] = {}
        while True:  # cheap footer polls; the view's count confirms (and is timed)
            if (
                parquet_rows(collector.data_dir, footers) >= total_spans
                and connect(collector.data_dir).execute("SELECT count(*) FROM spans").fetchone()[0] >= total_spans
            ):
                break
            time.sleep(0.05)
        queryable = time.time()
        cpu = {
            "receiver": cpu_seconds(pid) - cpu_before["receiver"],
            "workers": cpu_seconds_children(pid) - cpu_before["workers"],
        }
        cpu["receiver"] -= cpu["workers"]
        cpu["senders"] = sender_cpu
        out["seconds_until_queryable_after_last_ack"] = queryable - max(r[3] for r in records)
        out["parquet_spans_per_s"] = total_spans / (queryable - start_at)
        out["collector_peak_rss_mib"] = peak_rss_mib(pid)
        for role, seconds in cpu.items():  # where the 2 cores went, per span stored
            out[f"cpu_us_per_span_{role}"] = seconds / total_spans * 1e6
        return out
    finally:
        collector.stop()


def measure_phoenix(args: argparse.Namespace, bodies: list[bytes], total_spans: int, workdir: Path) -> dict:
    """The same bodies, senders and clock against Arize Phoenix; "stored" = rows in its database."""
    from phoenix_server import PhoenixProcess

    phoenix = PhoenixProcess(args.phoenix_python, workdir / "phoenix", workdir / "phoenix.log").start()
    try:
        pid = phoenix.process.pid
        out = {"phoenix_version": phoenix.version()}
        cpu_before = cpu_seconds(pid)
        records, sender_cpu, start_at = send_all(phoenix.traces_endpoint, bodies, args.senders)
        out.update(ack_figures(records, total_spans, sum(len(b) for b in bodies)))
        deadline = time.time() + args.phoenix_timeout_s
        stored = phoenix.stored_spans()
        while stored < total_spans and time.time() < deadline and phoenix.process.poll() is None:
            time.sleep(0.5)
            stored = phoenix.stored_spans()
        done = time.time()
        out["stored_spans"] = stored  # below `spans` only if the timeout ran out
        out["seconds_until_stored_after_last_ack"] = done - max(r[3] for r in records)
        out["stored_spans_per_s"] = stored / (done - start_at)
        out["peak_rss_mib"] = peak_rss_mib(pid)
        out["cpu_us_per_span_server"] = (cpu_seconds(pid) - cpu_before) / max(stored, 1) * 1e6
        out["cpu_us_per_span_senders"] = sender_cpu / total_spans * 1e6
        return out
    finally:
        phoenix.stop()


def measure_noop(args: argparse.Namespace, bodies: list[bytes], total_spans: int, workdir: Path) -> dict:
    """The same bodies, senders and clock against bench/noop_receiver.py: acknowledgement alone."""
    import subprocess
    import sys

    from lightning_otel.core.servers import free_port, wait_http_ok

    port = free_port()
    script = Path(__file__).with_name("noop_receiver.py")
    process = subprocess.Popen([sys.executable, str(script), str(port)], stderr=subprocess.DEVNULL)
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/health", timeout_s=30, process=process, what="the no-op receiver")
        cpu_before = cpu_seconds(process.pid)
        records, sender_cpu, _ = send_all(f"http://127.0.0.1:{port}/v1/traces", bodies, args.senders)
        out = ack_figures(records, total_spans, sum(len(b) for b in bodies))
        out["cpu_us_per_request_receiver"] = (cpu_seconds(process.pid) - cpu_before) / len(bodies) * 1e6
        out["cpu_us_per_request_senders"] = sender_cpu / len(bodies) * 1e6
        return out
    finally:
        process.terminate()
        process.wait(timeout=10)


def receiver_micro(bodies: list[bytes], spans_per_request: int) -> dict:
    """CPU per request of the receiver's own steps, one thread, no server: what the quick check
    saves over the upb parse (with the id check it replaced), and isal's CRC-32 over zlib's."""
    import zlib

    from isal.isal_zlib import crc32 as isal_crc32

    from lightning_otel.collector.ingest import drop_invalid_spans
    from lightning_otel.collector.request_check import span_count

    def per_request_ms(step) -> float:
        started = time.process_time()
        for body in bodies:
            step(body)
        return (time.process_time() - started) / len(bodies) * 1e3

    assert all(span_count(body) == spans_per_request for body in bodies)
    return {
        "upb_parse_and_id_check_ms": per_request_ms(lambda body: drop_invalid_spans(decode_request(body))),
        "quick_check_ms": per_request_ms(span_count),
        "crc32_zlib_ms": per_request_ms(zlib.crc32),
        "crc32_isal_ms": per_request_ms(isal_crc32),
    }


def _print(title: str, figures: dict) -> None:
    print(title)
    for key, value in figures.items():
        print(f"  {key}: {value:,.1f}" if isinstance(value, float) else f"  {key}: {value}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--payload", choices=PAYLOADS, default="a")
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--senders", type=int, default=4)
    parser.add_argument(
        "--workers", type=int, default=2, help="collector Parquet conversion processes (the collector's default)"
    )
    parser.add_argument("--target", help="post to this URL instead of starting our collector")
    parser.add_argument(
        "--against",
        choices=("phoenix", "noop"),
        help="after our collector, the same bodies against this receiver (noop: bench/noop_receiver.py)",
    )
    parser.add_argument(
        "--phoenix-python", default="/work/phoenix-venv/bin/python", help="python of a venv with arize-phoenix"
    )
    parser.add_argument(
        "--phoenix-timeout-s", type=float, default=1800, help="longest wait for Phoenix to store everything"
    )
    parser.add_argument("--plain-arrays", action="store_true", help="(b) with OTLP int/double arrays, not packed")
    parser.add_argument("--token-encoding", choices=("bytes", "base64"), default="bytes", help="(b) packed as")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--micro", action="store_true", help="only time the receiver's steps per request (no server)")
    args = parser.parse_args()
    if args.against == "phoenix" and args.payload == "b" and args.token_encoding == "bytes" and not args.plain_arrays:
        parser.error("Phoenix drops spans with bytes attributes: use --token-encoding base64 with --against phoenix")

    spans_per_request, training = PAYLOADS[args.payload]
    from lightning_otel.core.token_encoding import set_encoding

    set_encoding(args.token_encoding)
    base = build_request(spans_per_request, training, plain_arrays=args.plain_arrays)
    bodies = variants(base, args.requests, seed=1)
    total_spans = spans_per_request * len(bodies)
    total_bytes = sum(len(b) for b in bodies)
    print(
        f"payload ({args.payload}): {len(bodies)} requests x {spans_per_request} spans, "
        f"{total_bytes / len(bodies) / 1e6:.1f} MB per request",
        flush=True,
    )
    setup = {
        "payload": args.payload,
        "requests": len(bodies),
        "spans": total_spans,
        "senders": args.senders,
        "workers": args.workers,
        "plain_arrays": args.plain_arrays,
        "token_encoding": args.token_encoding,
    }
    if args.micro:
        _print("receiver steps, CPU per request", receiver_micro(bodies, spans_per_request))
        return
    workdir = Path(tempfile.mkdtemp(prefix="lightning-bench-"))
    try:
        if args.target:
            records, _, _ = send_all(args.target, bodies, args.senders)
            out = {**setup, **ack_figures(records, total_spans, total_bytes)}
            _print("target " + args.target, out)
        else:
            out = {**setup, **measure_ours(args, bodies, total_spans, workdir)}
            _print("lightning-otel collector", out)
            if args.against == "phoenix":
                phoenix = measure_phoenix(args, bodies, total_spans, workdir)
                _print("Arize Phoenix, same bodies", phoenix)
                ratios = {
                    "ack_ratio": out["ack_spans_per_s"] / phoenix["ack_spans_per_s"],
                    "stored_ratio": out["parquet_spans_per_s"] / max(phoenix["stored_spans_per_s"], 1e-9),
                }
                _print("lightning-otel / Phoenix", ratios)
                out = {**out, "phoenix": phoenix, **ratios}
            if args.against == "noop":
                noop = measure_noop(args, bodies, total_spans, workdir)
                _print("aiohttp answering 200 to each body, nothing else (bench/noop_receiver.py), same bodies", noop)
                ratio = {"ack_ratio": out["ack_requests_per_s"] / noop["ack_requests_per_s"]}
                _print("lightning-otel / no-op receiver", ratio)
                out = {**out, "noop": noop, **ratio}
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=2))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
