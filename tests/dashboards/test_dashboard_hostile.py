"""`lightning-otel dashboard` under hostile input: a real dashboard process (query token, tokenizer,
a small store) takes a seeded stream of bad requests (tests/hostile_dashboard.py: bad paths, huge and
invalid query strings, wrong tokens and Host headers, odd methods, bodies and raw bytes, and the SQL
door's write-or-peek statements and odd `rollout_ids` sent with the right token).

HOSTILE_SEED=<n> replays a run: the seed is printed and every failure names it and the request's index.
One module fixture runs the campaign once; each test asserts one property of it.
"""

from __future__ import annotations

import json
import secrets
import signal
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from helpers import local_collector
from hostile_campaign import SEED, Watcher, changed, snapshot
from hostile_client import HttpSender, Outcome, send_raw
from hostile_dashboard import Case, dashboard_case
from hostile_sql import Paths
from otlp_helpers import make_spans, post, request_bytes

from lightning_otel.core.servers import free_port, wait_http_ok

pytestmark = pytest.mark.integration

REQUESTS, THREADS = 1500, 3
TOKEN = "hostile-dashboard-token"
REPLAY = f"replay with HOSTILE_SEED={SEED}"
WEB_DIR = Path(__file__).resolve().parents[2] / "dashboards" / "lightning_otel" / "dashboards" / "web"
ROLLOUTS = [f"hostile-r{n}" for n in range(5)]


@dataclass
class Run:
    results: list[tuple[Case, Outcome, bytes]] = field(default_factory=list)
    store_changes: list[str] = field(default_factory=list)
    appeared: list[str] = field(default_factory=list)
    targets_written: list[str] = field(default_factory=list)
    alive_at_end: bool = False
    health_at_end: int | None = None
    returncode: int | None = None
    log: str = ""
    secret: str = ""


def _tokenizer(path: Path) -> Path:
    """A small byte-level BPE tokenizer.json, as a policy model folder would hold."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(["what is 12+34? it is 46"] * 10, trainer)
    tokenizer.save(str(path))
    return path


def _store(data_dir: Path) -> None:
    from lightning_otel.core import schema

    def build(tracer):
        for n, rollout in enumerate(ROLLOUTS):
            with tracer.start_as_current_span(f"hostile-dashboard-{n}", attributes={schema.ROLLOUT_ID: rollout}):
                pass

    with local_collector(data_dir) as collector:
        assert post(collector.http_endpoint + "/v1/traces", request_bytes(make_spans(build)))[0] == 200
        collector.flush()


def _send(sender: HttpSender, host: str, port: int, case: Case, index: int) -> tuple[Outcome, bytes]:
    request = case.request
    if request.raw is not None:
        return send_raw(host, port, request, index), b""
    for _ in range(100):  # two queries at once; a 429 to a statement is tried again
        started = time.monotonic()
        code, body, error = sender.send(request.method, request.path, request.body, request.headers)
        if not (case.query is not None and code == 429):
            break
        time.sleep(0.2)
    return Outcome("http", index, request.kind, code, error, seconds=time.monotonic() - started), body


@pytest.fixture(scope="module")
def campaign(tmp_path_factory) -> Run:
    base = tmp_path_factory.mktemp("hostile-dashboard")
    store, cwd, canary = base / "store", base / "cwd", base / "canary"
    cwd.mkdir()
    canary.mkdir()
    run = Run(secret=f"canary-{secrets.token_hex(8)}")
    (canary / "secret.txt").write_text(run.secret)
    _store(store)
    part = next(str(p) for p in sorted((store / "spans").rglob("*.parquet")) if not p.name.startswith("_"))
    paths = Paths(str(store), str(store / "spans"), part, str(canary), run.secret, str(cwd))
    port, log_path = free_port(), base / "dashboard.log"
    command = [sys.executable, "-m", "lightning_otel", "dashboard", "--data-dir", str(store), "--port", str(port)]
    command += ["--query-token", TOKEN, "--tokenizer", str(_tokenizer(base / "tokenizer.json"))]
    command += ["--query-timeout-s", "3"]
    print(f"\nhostile dashboard: HOSTILE_SEED={SEED}, log {log_path}", flush=True)
    with open(log_path, "w") as log:  # the dashboard's working directory is watched: DuckDB spills to ./.tmp
        process = subprocess.Popen(command, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/health", 60, process, "dashboard")
        warm = HttpSender("127.0.0.1", port, timeout_s=120)  # the query workers' first start takes seconds
        deadline = time.monotonic() + 90
        auth = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        while warm.send("POST", "/v1/query", b'{"sql": "SELECT 1"}', auth)[0] != 200:
            assert time.monotonic() < deadline, "the dashboard's query workers never started"
        before, outside_before = snapshot(store), snapshot(canary)
        watcher = Watcher(cwd, canary)

        def worker(first: int) -> list:
            sender, done = HttpSender("127.0.0.1", port, timeout_s=60), []
            for index in range(first, REQUESTS, THREADS):
                case = dashboard_case(SEED, index, TOKEN, paths, ROLLOUTS)
                done.append((case, *_send(sender, "127.0.0.1", port, case, index)))
            sender.close()
            return done

        with ThreadPoolExecutor(THREADS) as pool:
            for results in pool.map(worker, range(THREADS)):
                run.results += results
        time.sleep(1.0)  # a write that lands just after its reply
        run.appeared = watcher.stop() + changed(outside_before, snapshot(canary))
        run.store_changes = changed(before, snapshot(store))
        run.targets_written = sorted(
            {t for case, _, _ in run.results if case.query for t in case.query.targets if (cwd / t).exists()}
        )
        run.alive_at_end = process.poll() is None
        run.health_at_end = HttpSender("127.0.0.1", port).send("GET", "/health", b"", {})[0]
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            run.returncode = process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    run.log = log_path.read_text(errors="replace")
    print("hostile dashboard:", dict(Counter(o.code for _, o, _ in run.results)), flush=True)
    return run


def _listing(items, limit: int = 12) -> str:
    items = list(items)
    return "\n".join(map(str, items[:limit])) + (f"\n... {len(items) - limit} more" if len(items) > limit else "")


def _label(case: Case, outcome: Outcome) -> str:
    request = case.request
    return f"#{outcome.index} {outcome.kind} {request.method} {request.path[:80]!r} -> {outcome.code} {outcome.error}"


def test_the_campaign_covers_every_kind(campaign):
    kinds = Counter(outcome.kind.split("-")[0] for _, outcome, _ in campaign.results)
    assert len(campaign.results) == REQUESTS
    for kind in ("path", "query", "token", "host", "method", "body", "raw", "wire", "sql", "rollouts"):
        assert kinds[kind] >= 20, (kind, kinds)
    answered = sum(1 for _, outcome, _ in campaign.results if outcome.code is not None)
    assert answered >= 0.9 * REQUESTS, f"only {answered} replies; {REPLAY}"


def test_the_dashboard_survives_and_stops_cleanly(campaign):
    assert campaign.alive_at_end, f"the dashboard exited during the campaign; {REPLAY}\n{campaign.log[-3000:]}"
    assert campaign.health_at_end == 200
    assert campaign.returncode == 0, f"SIGTERM: exit {campaign.returncode}; {REPLAY}\n{campaign.log[-3000:]}"
    assert "Traceback" not in campaign.log, f"{REPLAY}\n{campaign.log[-3000:]}"


def test_no_reply_is_a_server_error(campaign):
    """A bad request is the client's error (4xx); a statement stopped at its time limit is a 504."""
    bad = [
        _label(case, outcome)
        for case, outcome, _ in campaign.results
        if any(
            code >= 500 and not (code == 504 and case.query is not None)
            for code in (outcome.code, *outcome.later_codes)
            if code is not None
        )
    ]
    assert not bad, f"{REPLAY}\n{_listing(bad)}"


def test_each_guard_gives_its_answer(campaign):
    """Wrong token: 401; wrong Host: 403; wrong content type: 415; bad bodies: 400; odd methods: 405."""
    wrong = [
        _label(case, outcome)
        for case, outcome, _ in campaign.results
        if case.allowed is not None and outcome.code is not None and outcome.code not in case.allowed
    ]
    assert not wrong, f"{REPLAY}\n{_listing(wrong)}"


def test_get_serves_nothing_but_its_own_files(campaign):
    """No request path reaches the file system: a 200 to a GET is a web/ file, /health or /v1/config."""
    served = {p.read_bytes() for p in WEB_DIR.iterdir() if p.is_file()} | {b"ok", b""}
    odd = [
        _label(case, outcome)
        for case, outcome, body in campaign.results
        if case.request.method in ("GET", "HEAD") and outcome.code == 200 and body not in served
        if not case.request.path.startswith("/v1/config")
    ]
    assert not odd, f"{REPLAY}\n{_listing(odd)}"


def test_nothing_is_written_or_read_through_the_read_path(campaign):
    assert campaign.store_changes == [], f"{REPLAY}\n{_listing(campaign.store_changes)}"
    assert campaign.appeared == [], f"files appeared outside the store; {REPLAY}\n{_listing(campaign.appeared)}"
    assert campaign.targets_written == [], f"{REPLAY}\n{_listing(campaign.targets_written)}"
    leaked = [_label(c, o) for c, o, body in campaign.results if campaign.secret.encode() in body]
    assert not leaked, f"a reply holds the canary file's content; {REPLAY}\n{_listing(leaked)}"
    answered = [json.loads(body) for case, o, body in campaign.results if case.query is not None and o.code == 200]
    assert all(set(reply) == {"columns", "rows", "truncated"} for reply in answered)
