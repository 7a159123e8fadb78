"""The collector under hostile input (issue 34), tried as an attacker would: a real `lightning-otel
collector` process with OTLP/HTTP, OTLP/gRPC and the SQL door open takes a seeded storm of malformed
exports with valid ones interleaved, then hostile queries, first with no exports running (any file
that changes was changed by a query), then beside a steady stream of valid exports (their ack latency
must stay bounded). tests/hostile_campaign.py runs it; the generators are hostile_wire.py,
hostile_otlp.py and hostile_sql.py (a generator with a seed, not a list).

HOSTILE_SEED=<n> replays a run: the seed is printed and every failure names it and the request's
index. One module fixture runs the campaign once; each test asserts one property of it. The summary
(counts by status code and gRPC code, ack latency p50/p99) is printed (`pytest -s`) and written as
JSON; its path is printed too.
"""

from __future__ import annotations

import json
import secrets
import time
import urllib.request

import pytest
from hostile_campaign import (
    ACK_P99_BOUND_S,
    GRPC_REQUESTS,
    HTTP_REQUESTS,
    MAX_BODY,
    QUERY_REPLY_BOUND_S,
    QUERY_TIMEOUT_S,
    QUERY_TOKEN,
    SEED,
    STORE_FILE,
    Campaign,
    percentile,
    quiet_queries,
    read_store,
    settle,
    snapshot,
    stall_phase,
    storm,
    summarize,
)
from hostile_sql import Paths

from lightning_otel.core.servers import free_port
from lightning_otel.testing.servers import CollectorProcess

REPLAY = f"replay with HOSTILE_SEED={SEED}"


def _health(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return reply.status
    except OSError:
        return None


@pytest.fixture(scope="module")
def campaign(tmp_path_factory) -> Campaign:
    base = tmp_path_factory.mktemp("hostile")
    store, cwd, canary = base / "store", base / "cwd", base / "canary"
    cwd.mkdir()
    canary.mkdir()
    secret = f"canary-{secrets.token_hex(8)}"
    (canary / "secret.txt").write_text(secret)
    run = Campaign(SEED, base)
    print(f"\nhostile suite: HOSTILE_SEED={SEED}, collector log {base / 'collector.log'}", flush=True)
    grpc_port = free_port()
    args = [
        "--grpc-port",
        str(grpc_port),
        "--query-token",
        QUERY_TOKEN,
        "--query-timeout-s",
        str(QUERY_TIMEOUT_S),
        "--max-body-bytes",
        str(MAX_BODY),
        "--http-read-timeout-s",
        "2",
        "--http-body-timeout-s",
        "4",
        # no compaction: in the quiet phase, only a query could change a store file
        "--compact-interval-s",
        "3600",
    ]
    collector = CollectorProcess(
        store, flush_interval_s=0.2, log_path=base / "collector.log", extra_args=args, startup_timeout_s=180
    )  # a loaded CI machine may take a minute to start the conversion workers
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(cwd)  # the collector's working directory is watched: DuckDB spills to ./.tmp by default
        collector.start()
    outside = (cwd, canary)
    canary_before = snapshot(canary)
    seconds, now_ns = {}, time.time_ns()
    try:
        started = time.monotonic()
        storm(run, collector.port, grpc_port, now_ns)
        seconds["storm"] = time.monotonic() - started
        settle((store,))
        part = next(
            (str(p) for p in sorted((store / "spans").rglob("part-*.parquet"))), str(store / "spans" / "none.parquet")
        )
        paths = Paths(str(store), str(store / "spans"), part, str(canary), secret, str(cwd))
        started = time.monotonic()
        sent = quiet_queries(run, collector.port, paths, store, outside)
        seconds["quiet_queries"] = time.monotonic() - started
        started = time.monotonic()
        stall_phase(run, collector.port, paths, now_ns, outside)
        seconds["stall"] = time.monotonic() - started
        run.targets_written = sorted({t for q in sent for t in q.targets if (cwd / t).exists()})
        run.appeared += [p for p in sorted(set(snapshot(canary)) - set(canary_before))]
        run.odd_store_files = [
            str(p) for p in (store / "spans").rglob("*") if p.is_file() and not STORE_FILE.fullmatch(p.name)
        ]
        run.alive_at_end = collector.process.poll() is None
        run.health_at_end = _health(collector.health_url)
    finally:
        collector.stop()
    run.returncode = collector.process.returncode
    run.wal_left = sorted(p.name for p in (store / "wal").glob("*.wal"))
    read_store(run, store)
    run.log = (base / "collector.log").read_text(errors="replace")
    run.summary = summarize(run, seconds)
    summary_path = base / "hostile_summary.json"
    summary_path.write_text(json.dumps(run.summary, indent=1))
    brief = {
        k: run.summary[k]
        for k in (
            "seed",
            "http_requests",
            "http_status",
            "grpc_requests",
            "grpc_status",
            "query_status",
            "ack_latency_s",
        )
    }
    print(f"hostile summary: {json.dumps(brief)}\nhostile summary file: {summary_path}", flush=True)
    return run


def _listing(items, limit: int = 12) -> str:
    items = list(items)
    return "\n".join(map(str, items[:limit])) + (f"\n... {len(items) - limit} more" if len(items) > limit else "")


def test_the_campaign_is_as_large_as_the_issue_asks(campaign):
    assert campaign.summary["http_hostile"] >= 10_000 and campaign.summary["grpc_hostile"] >= 500, campaign.summary
    assert campaign.summary["http_requests"] == HTTP_REQUESTS and campaign.summary["grpc_requests"] == GRPC_REQUESTS
    valid_acked = [o for o in campaign.outcomes if o.valid and o.acknowledged]
    assert len(valid_acked) >= 1000, f"only {len(valid_acked)} valid exports acknowledged; {REPLAY}"


def test_the_collector_process_survives(campaign):
    assert campaign.alive_at_end, f"the collector process exited during the campaign; {REPLAY}"
    assert campaign.health_at_end == 200
    assert campaign.returncode == 0, f"graceful stop exited {campaign.returncode}; {REPLAY}"


def test_no_reply_is_a_server_error(campaign):
    """Garbage from a client is the client's error (4xx); overload is 429/503, a stopped query 504."""
    bad = [
        o
        for o in campaign.outcomes
        if o.code in ("INTERNAL", "UNKNOWN", "DATA_LOSS") or isinstance(o.code, int) and o.code >= 500 and o.code != 503
    ]
    bad += [o for o in campaign.outcomes if any(code >= 500 and code != 503 for code in o.later_codes)]
    bad_queries = [q for q in campaign.queries if q.code is not None and q.code >= 500 and q.code not in (503, 504)]
    assert not bad and not bad_queries, f"{REPLAY}\n{_listing(bad)}\n{_listing(bad_queries)}"


def test_a_valid_export_is_acknowledged_unless_overloaded(campaign):
    refused = [
        o
        for o in campaign.outcomes
        if o.valid and o.code is not None and not o.acknowledged and o.code not in (429, 503, "UNAVAILABLE")
    ]
    assert not refused, f"{REPLAY}\n{_listing(refused)}"


def test_every_acknowledged_span_is_stored_exactly_once(campaign):
    """Each export is sent once. Acknowledged in full: every span once in `spans` and in `spans_raw`
    (no compaction ran, so no overlap), with the service name it was sent with. Partly rejected:
    exactly the accepted number of its spans, none twice. Refused: none. No reply: at most once."""
    import hashlib

    assert not campaign.store_error, campaign.store_error
    problems = []
    for o in campaign.outcomes:
        if not o.span_ids:
            continue
        counts = [campaign.stored.get(span_id, (0, 0, None)) for span_id in o.span_ids]
        raw_rows = [c[0] for c in counts]
        label = f"{o.channel}#{o.index} {o.kind} code={o.code} rejected={o.rejected} rows={raw_rows}"
        if o.acknowledged:
            if any(c[:2] != (1, 1) for c in counts):
                problems.append("acknowledged, not stored exactly once: " + label)
            elif o.service is not None and any(c[2] != hashlib.md5(o.service.encode()).hexdigest() for c in counts):
                problems.append(f"acknowledged, service name changed (sent {len(o.service)} chars): " + label)
        elif o.code in (200, "OK") and o.rejected is not None:
            if any(r > 1 for r in raw_rows) or sum(raw_rows) != len(o.span_ids) - o.rejected:
                problems.append("partly rejected, stored count differs from accepted: " + label)
        elif o.code is not None and any(raw_rows):
            problems.append("refused, yet stored: " + label)
        elif any(r > 1 for r in raw_rows):
            problems.append("no reply, stored twice: " + label)
    assert not problems, f"{len(problems)} exports; {REPLAY}\n{_listing(problems)}"
    assert not campaign.wal_left, f"WAL segments never converted: {campaign.wal_left}; {REPLAY}"


def test_no_query_changes_a_file(campaign):
    """Every check is reported, not only the first: each names a different way a query could write."""
    problems = []
    if not campaign.settled:
        problems.append("the store kept changing with no export running (a WAL segment retried forever?)")
    if campaign.query_changes:
        problems.append("store files changed while only queries ran:\n" + _listing(campaign.query_changes))
    if campaign.appeared:
        problems.append("files appeared outside the store during queries:\n" + _listing(campaign.appeared))
    if campaign.targets_written:
        problems.append("files a statement tried to write exist:\n" + _listing(campaign.targets_written))
    if campaign.odd_store_files:
        problems.append("files in the store that ingest does not write:\n" + _listing(campaign.odd_store_files))
    if campaign.forged_rollouts != 0:
        problems.append(f"{campaign.forged_rollouts} forged rollouts in SQL")
    assert not problems, f"{REPLAY}\n" + "\n".join(problems)


def test_the_query_door_still_answers_plain_queries(campaign):
    """Before and after the hostile statements, a plain count over the views is right: a door that
    refuses everything would pass every other query test here."""
    for expected, outcome in campaign.control:
        assert outcome.code == 200 and json.loads(outcome.reply)["rows"] == [[expected]], (expected, outcome)


def test_no_query_reads_outside_the_store_or_names_a_host_path(campaign):
    secret = [q for q in campaign.queries if q.secret]
    leaked = [q for q in campaign.queries if q.leaked]
    assert not secret, f"a reply holds a file from outside the store; {REPLAY}\n{_listing(secret)}"
    assert not leaked, f"replies name host paths the statement did not; {REPLAY}\n{_listing(leaked)}"


def test_exports_are_acknowledged_promptly_while_hostile_queries_run(campaign):
    latencies = campaign.latencies
    assert len(latencies) >= 200, f"{len(latencies)} samples"
    p99 = percentile(latencies, 0.99)
    assert p99 < ACK_P99_BOUND_S, (
        f"ack latency p99 {p99:.1f} s (max {max(latencies):.1f} s) beside hostile queries; {REPLAY}"
    )
    slow = [q for q in campaign.queries if q.seconds > QUERY_REPLY_BOUND_S]
    assert not slow, f"replies later than the {QUERY_TIMEOUT_S:g} s limit allows; {REPLAY}\n{_listing(slow)}"


def test_client_errors_do_not_flood_the_log(campaign):
    """Over 10,000 malformed requests: no traceback, and a log that does not grow with them."""
    lines = campaign.log.splitlines()
    assert "Traceback" not in campaign.log, _listing([line for line in lines if "Error" in line])
    assert len(lines) < 300, f"{len(lines)} log lines; {REPLAY}\n{_listing(lines[-12:])}"
