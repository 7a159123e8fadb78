"""The hostile campaign against a collector process (tests/collector/test_collector_hostile.py): the storm of
exports, the quiet query phase, the stall phase, and reading back what the store holds.

Settings below size one CI run (a few minutes on 2 cores). HOSTILE_SEED=<n> replays a run.
"""

from __future__ import annotations

import json
import os
import random
import re
import secrets
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
from hostile_client import GrpcSender, HttpSender, Outcome, send_http, send_raw
from hostile_otlp import valid_export
from hostile_sql import Paths, Query, stall_query, write_or_peek_query
from hostile_wire import grpc_request, http_request

from lightning_otel.collector import connect

SEED = int(os.environ.get("HOSTILE_SEED") or secrets.randbits(32))
HOST = "127.0.0.1"
HTTP_REQUESTS, HTTP_THREADS = 11_500, 16  # ~9% of them valid exports: >= 10,000 hostile
# 16 senders, not 4: a few cases wait out the collector's body timeout (4 s each), and with 4 they held one
# sender for most of the storm (72 s, against 42 s with 16)
GRPC_REQUESTS = 600  # ~12% valid: >= 500 hostile
WRITE_QUERIES = 120
QUERY_TOKEN = "hostile-query-token"
# Long enough for a query to spill to disk (~2.5 s), so the temp directory is tried, and for the plain
# count over the ~1,400 small files this campaign leaves (~2.5 s on an idle 2-core machine, 4.2 s in CI).
QUERY_TIMEOUT_S = 10.0
MAX_BODY = 8 * 1024 * 1024
STALL_PHASE_S, EXPORT_EVERY_S = 15.0, 0.05
# The absence of a stall, not a timing: one 4 MB statement once held ingest for 27 s.
ACK_P99_BOUND_S = 5.0
QUERY_REPLY_BOUND_S = QUERY_TIMEOUT_S + 10.0  # parsing and planning count against the time limit
# What ingest writes under spans/: Parquet files, their rollout indexes, the day indexes
# (collector/day_index.py) and, while writing one, its hidden temporary name.
STORE_FILE = re.compile(
    r"(_schema|part-\d+-[0-9a-f]+|compact-[0-9a-f-]+)\.parquet|(part-\d+-[0-9a-f]+|compact-[0-9a-f-]+)\.rollouts"
    r"|\.(part|compact)-.+\.(parquet|rollouts)\.\d+-\d+\.tmp"
    r"|day\.(rollouts|confirmed)|\.day\.(rollouts|confirmed)\.\d+-\d+\.tmp"
)


@dataclass
class QueryOutcome:
    phase: str
    index: int
    kind: str
    code: int | None
    seconds: float
    leaked: tuple = ()  # host paths in the reply to a statement that named none
    secret: bool = False  # the canary file's content is in the reply
    reply: str = ""  # the reply's start (never of a read outside the store: it may hold what was read)


@dataclass
class Campaign:
    seed: int
    base: Path
    outcomes: list[Outcome] = field(default_factory=list)
    queries: list[QueryOutcome] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)  # ack latency of the exports beside hostile queries
    settled: bool = False  # the store stopped changing before the quiet query phase
    query_changes: list[str] = field(default_factory=list)  # store files changed while only queries ran
    appeared: list[str] = field(default_factory=list)  # paths that appeared outside the store, however briefly
    targets_written: list[str] = field(default_factory=list)
    odd_store_files: list[str] = field(default_factory=list)
    control: list = field(default_factory=list)  # (expected span count, reply code, reply) of a plain count(*)
    health_at_end: int | None = None
    alive_at_end: bool = False
    returncode: int | None = None
    wal_left: list[str] = field(default_factory=list)
    stored: dict = field(default_factory=dict)  # span id -> (rows in spans_raw, rows in spans, md5 of service)
    store_error: str = ""
    forged_rollouts: int | None = None
    log: str = ""
    summary: dict = field(default_factory=dict)


def snapshot(*roots: Path) -> dict[str, tuple]:
    """Every directory and file under `roots`: (size, mtime) of files, a marker for directories."""
    seen: dict[str, tuple] = {}
    for root in roots:
        for directory, _, names in os.walk(root):
            seen[directory] = ("dir",)
            for name in names:
                path = os.path.join(directory, name)
                try:
                    info = os.lstat(path)
                except FileNotFoundError:
                    continue
                seen[path] = (info.st_size, info.st_mtime_ns)
    return seen


def changed(before: dict, after: dict) -> list[str]:
    return sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))


class Watcher:
    """Polls directories while queries run: a spill file lives only as long as its query."""

    def __init__(self, *roots: Path) -> None:
        self.roots, self.baseline, self.appeared = roots, snapshot(*roots), set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.appeared |= set(changed(self.baseline, snapshot(*self.roots)))

    def stop(self) -> list[str]:
        self._stop.set()
        self._thread.join()
        return sorted(self.appeared | set(changed(self.baseline, snapshot(*self.roots))))


def _run_all(*jobs) -> None:
    """Run each job on a thread of its own and re-raise the first failure (a bug in the suite)."""
    with ThreadPoolExecutor(len(jobs)) as pool:
        for future in [pool.submit(job) for job in jobs]:
            future.result()


def storm(campaign: Campaign, port: int, grpc_port: int, now_ns: int) -> None:
    def http_worker(first: int) -> None:
        sender = HttpSender(HOST, port)
        for index in range(first, HTTP_REQUESTS, HTTP_THREADS):
            request = http_request(SEED, index, now_ns, MAX_BODY)
            raw = request.raw is not None
            campaign.outcomes.append(send_raw(HOST, port, request, index) if raw else send_http(sender, request, index))
        sender.close()

    def grpc_worker() -> None:
        sender = GrpcSender(f"{HOST}:{grpc_port}")
        for index in range(GRPC_REQUESTS):
            request, method, metadata = grpc_request(SEED, index, now_ns)
            campaign.outcomes.append(sender.send(method, request, metadata, index))
        sender.close()

    _run_all(*[lambda first=first: http_worker(first) for first in range(HTTP_THREADS)], grpc_worker)


def ask(sender: HttpSender, query: Query, paths: Paths, phase: str, index: int) -> QueryOutcome:
    headers = {"Authorization": f"Bearer {QUERY_TOKEN}", "Content-Type": "application/json"}
    started = time.monotonic()
    for _ in range(100):  # the door admits two queries at once; a 429 is tried again
        code, reply, _ = sender.send("POST", "/v1/query", query.payload(), headers)
        if code != 429:
            break
        time.sleep(0.2)
    text = reply.decode("utf-8", "replace")
    leaked = () if query.mentions(paths) else tuple(p for p in (paths.store, paths.cwd, paths.canary) if p in text)
    shown = "" if query.kind == "read-outside" else (text if len(text) <= 600 else text[:200] + " ... " + text[-400:])
    return QueryOutcome(phase, index, query.kind, code, time.monotonic() - started, leaked, paths.secret in text, shown)


def learn_directories(campaign: Campaign, port: int, paths: Paths) -> tuple:
    """What an attacker asks first: the directories the door may touch, in the door's own words
    (a host path, or a name such as a private URL scheme); write attempts then aim there too."""
    outcome = ask(
        HttpSender(HOST, port), Query("learn", "SELECT current_setting('allowed_directories')"), paths, "quiet", -3
    )
    campaign.queries.append(outcome)  # its reply must name no host path either
    try:
        value = json.loads(outcome.reply)["rows"][0][0]
    except (ValueError, KeyError, IndexError, TypeError):
        return ()
    return tuple(v for v in (value if isinstance(value, list) else [value]) if isinstance(v, str) and v)


def settle(roots: tuple, timeout_s: float = 30.0) -> tuple[dict, bool]:
    """Wait until conversion is done: two snapshots 0.5 s apart equal. (snapshot, whether it settled)"""
    deadline, last = time.monotonic() + timeout_s, snapshot(*roots)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = snapshot(*roots)
        if now == last:
            return now, True
        last = now
    return last, False


def quiet_queries(campaign: Campaign, port: int, paths: Paths, store: Path, outside: tuple) -> list[Query]:
    """Hostile queries with no export running: whatever changes in the store, a query changed."""
    before, campaign.settled = settle((store,))
    watcher = Watcher(*outside)
    sent: list[Query] = []
    paths.learned = learn_directories(campaign, port, paths)
    control = Query("control", "SELECT count(*) FROM spans")
    expected = connect(store).execute(control.sql).fetchone()[0]  # reads the files; writes nothing
    campaign.control.append((expected, ask(HttpSender(HOST, port, timeout_s=120), control, paths, "quiet", -1)))

    def worker(first: int) -> None:
        sender = HttpSender(HOST, port, timeout_s=120)
        for n in range(first, WRITE_QUERIES, 2):
            query = write_or_peek_query(random.Random(f"{SEED}/query/{n}"), paths, n)
            sent.append(query)
            campaign.queries.append(ask(sender, query, paths, "quiet", n))

    _run_all(lambda: worker(0), lambda: worker(1))
    campaign.control.append((expected, ask(HttpSender(HOST, port, timeout_s=120), control, paths, "quiet", -2)))
    campaign.appeared += watcher.stop()
    time.sleep(1.0)  # a write that lands just after its reply
    campaign.query_changes = changed(before, snapshot(store))
    return sent


def stall_phase(campaign: Campaign, port: int, paths: Paths, now_ns: int, outside: tuple) -> None:
    """Costly statements back to back on both query slots, while valid exports go out on a fixed
    schedule (open loop): a stalled receiver delays every export planned during the stall, and each
    latency is counted from its planned time, so p99 sees a stall however long it lasts."""
    stop, local, watcher = threading.Event(), threading.local(), Watcher(*outside)

    def query_worker(first: int) -> None:
        sender, n = HttpSender(HOST, port, timeout_s=120), first
        while not stop.is_set():
            # The first statement is the worst known one: a 4 MB nesting whose parse took 27 s.
            query = stall_query(random.Random(f"{SEED}/stall/{n}"), pick=0 if n == 0 else None)
            campaign.queries.append(ask(sender, query, paths, "stall", n))
            n += 2

    def export(index: int, planned: float) -> None:
        if not hasattr(local, "sender"):
            local.sender = HttpSender(HOST, port)
        request = valid_export(random.Random(f"{SEED}/stall-export/{index}"), now_ns, use_json=False)
        request.kind = "stall-" + request.kind
        outcome = send_http(local.sender, request, index)
        campaign.outcomes.append(outcome)
        if outcome.code is not None:
            campaign.latencies.append(time.monotonic() - planned)

    queries = [threading.Thread(target=query_worker, args=(first,), daemon=True) for first in (0, 1)]
    for thread in queries:
        thread.start()
    with ThreadPoolExecutor(16) as pool:
        start, futures = time.monotonic(), []
        for index in range(int(STALL_PHASE_S / EXPORT_EVERY_S)):
            planned = start + index * EXPORT_EVERY_S
            time.sleep(max(0.0, planned - time.monotonic()))
            futures.append(pool.submit(export, index, planned))
        stop.set()
        for future in futures:
            future.result()
    for thread in queries:
        thread.join(timeout=180)
    campaign.appeared += watcher.stop()


def read_store(campaign: Campaign, store: Path) -> None:
    """Per tracked span id: rows in spans_raw, rows in spans, md5 of the stored service name."""
    ids = sorted({span_id for outcome in campaign.outcomes for span_id in outcome.span_ids})
    try:
        conn = connect(store)
        conn.register("expected", pa.table({"span_id": ids}))
        raw = dict(
            conn.execute("SELECT span_id, count(*) FROM spans_raw JOIN expected USING (span_id) GROUP BY 1").fetchall()
        )
        dedup = conn.execute(
            "SELECT span_id, count(*), any_value(md5(coalesce(service_name, ''))) FROM spans JOIN expected USING (span_id) GROUP BY 1"
        ).fetchall()
        campaign.stored = {span_id: (raw.get(span_id, 0), count, digest) for span_id, count, digest in dedup}
        campaign.stored.update(
            {span_id: (count, 0, None) for span_id, count in raw.items() if span_id not in campaign.stored}
        )
        campaign.forged_rollouts = conn.execute(
            "SELECT count(*) FROM rollouts WHERE rollout_id LIKE 'forged-%' OR reward >= 1e9"
        ).fetchone()[0]
    except Exception as exc:
        campaign.store_error = f"{type(exc).__name__}: {exc}"[:2000]


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else float("nan")


def summarize(campaign: Campaign, seconds: dict) -> dict:
    http = [o for o in campaign.outcomes if o.channel in ("http", "raw") and not o.kind.startswith("stall-")]
    grpc_calls = [o for o in campaign.outcomes if o.channel == "grpc"]
    by_kind: dict[str, Counter] = {}
    for outcome in campaign.outcomes:
        by_kind.setdefault(f"{outcome.channel}:{outcome.kind}", Counter())[str(outcome.code)] += 1
    return {
        "seed": campaign.seed,
        "http_requests": len(http),
        "http_hostile": sum(not o.valid for o in http),
        "grpc_requests": len(grpc_calls),
        "grpc_hostile": sum(not o.valid for o in grpc_calls),
        "http_status": dict(Counter(str(o.code) for o in http).most_common()),
        "grpc_status": dict(Counter(str(o.code) for o in grpc_calls).most_common()),
        "query_status": dict(Counter(f"{q.phase}:{q.code}" for q in campaign.queries).most_common()),
        "acknowledged_tracked_spans": sum(len(o.span_ids) for o in campaign.outcomes if o.acknowledged),
        "ack_latency_s": {
            "samples": len(campaign.latencies),
            "p50": round(percentile(campaign.latencies, 0.50), 4),
            "p99": round(percentile(campaign.latencies, 0.99), 4),
            "max": round(max(campaign.latencies, default=float("nan")), 4),
        },
        "slowest_query_s": round(max((q.seconds for q in campaign.queries), default=0.0), 2),
        "phase_seconds": {k: round(v, 1) for k, v in seconds.items()},
        "by_kind": {k: dict(v) for k, v in sorted(by_kind.items())},
        "queries_by_kind": dict(sorted(Counter(f"{q.phase}:{q.kind}:{q.code}" for q in campaign.queries).items())),
    }
