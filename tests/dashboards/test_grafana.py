"""Grafana provisioning: every panel's SQL against the views file, the views file, provisioning, JSON.

Grafana itself is not installable here, so no server runs: the tests expand the panel macros the way
Grafana does (the frontend replaces $__interval_ms; the plugin's backend, grafana-plugin-sdk-go's
sqlutil with the plugin's overrides, replaces $__timeFilter/$__timeFrom/$__timeTo with RFC 3339 UTC
strings at whole seconds) and run the SQL on the views file opened read-only, as the plugin does.
Key numbers are checked against independent computations: the Parquet files read with pyarrow, or
the collector's own connection with plain SQL and Python arithmetic.
"""

from __future__ import annotations

import json
import re
import statistics
import struct
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from repo_paths import REPO

from lightning_otel.cli import main as cli_main
from lightning_otel.collector import connect
from lightning_otel.collector.query import view_statements
from lightning_otel.collector.span_rows import SPANS_SCHEMA
from lightning_otel.collector.store import Store
from lightning_otel.core import schema
from lightning_otel.dashboards.grafana import DATASOURCE_UID, PLUGIN_ID, PROVISIONING_DIR, build
from lightning_otel.dashboards.grafana_views import ViewsFileError, write_views_file

PANELS = [panel for name in build.DASHBOARDS for panel in build.load_panels(name)]
SUPPORTED_MACROS = {"timeFilter", "timeFrom", "timeTo", "interval_ms"}
ONE_BUCKET_MS = 100 * 365 * 86_400 * 1000  # a century: the whole demo falls in one time bucket
FINE_BUCKET_MS = 10_000


def expand_macros(sql: str, start: datetime, end: datetime, interval_ms: int) -> str:
    """Panel SQL as DuckDB receives it from Grafana for the time range [start, end]."""
    sql = sql.replace("$__interval_ms", str(interval_ms))  # frontend template variable

    def rfc3339(moment: datetime) -> str:  # Go's time.RFC3339 of the UTC time: no fraction
        return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    sql = re.sub(
        r"\$__timeFilter\(([^()]*)\)",
        lambda m: f"{m[1].strip()} >= '{rfc3339(start)}' AND {m[1].strip()} <= '{rfc3339(end)}'",
        sql,
    )
    sql = re.sub(r"\$__timeFrom(\(\s*\))?", f"'{rfc3339(start)}'", sql)
    sql = re.sub(r"\$__timeTo(\(\s*\))?", f"'{rfc3339(end)}'", sql)
    assert "$" not in sql, sql
    return sql


def panel(dashboard: str, stem: str) -> build.Panel:
    return next(p for p in PANELS if p.dashboard == dashboard and p.path.stem == stem)


# --- fixtures -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def data_dir(demo_run) -> Path:
    return demo_run.data_dir


@pytest.fixture(scope="module")
def views_path(data_dir, tmp_path_factory) -> Path:
    return write_views_file(data_dir, tmp_path_factory.mktemp("grafana") / "views.duckdb")


@pytest.fixture(scope="module")
def views(views_path):
    conn = duckdb.connect(str(views_path), read_only=True)  # what the plugin opens (access_mode=READ_ONLY)
    yield conn
    conn.close()


@pytest.fixture(scope="module")
def reference(data_dir):
    return connect(data_dir)


@pytest.fixture(scope="module")
def time_range(reference) -> tuple[datetime, datetime]:
    low, high = reference.execute("SELECT epoch_us(min(start_time)), epoch_us(max(end_time)) FROM spans_raw").fetchone()

    def moment(us: int) -> datetime:
        return datetime.fromtimestamp(us / 1e6, tz=UTC)

    return moment(low) - timedelta(minutes=1), moment(high) + timedelta(minutes=1)  # macros cut to whole seconds


@pytest.fixture(scope="module")
def raw_spans(data_dir) -> list[dict]:
    """Every stored span once, read from the Parquet files without DuckDB or the views."""
    columns = [
        "trace_id",
        "span_id",
        "start_time",
        "end_time",
        "status_code",
        "is_rollout_root",
        "attributes",
        "resource_attributes",
    ]
    unique: dict[tuple, dict] = {}
    for info in Store(data_dir).files():
        for row in pq.read_table(info.path, columns=columns).to_pylist():
            unique[(row["trace_id"], row["span_id"])] = row
    return list(unique.values())


def run(views, sql_panel: build.Panel, time_range, interval_ms: int = FINE_BUCKET_MS) -> list[tuple]:
    result = views.execute(expand_macros(sql_panel.sql, *time_range, interval_ms))
    assert tuple(d[0] for d in result.description) == sql_panel.columns, sql_panel.path.name
    return result.fetchall()


# --- the panel SQL files ---------------------------------------------------------------------------


def test_panel_files_declare_and_use_only_what_the_plugin_supports():
    assert {p.dashboard for p in PANELS} == {"overview", "training"}
    for p in PANELS:
        assert re.fullmatch(r"\d\d-[a-z0-9-]+", p.path.stem), p.path
        assert set(re.findall(r"\$__(\w+)", p.sql)) <= SUPPORTED_MACROS, p.path
        assert "$__timeFilter(" in p.sql, f"{p.path}: every panel follows the dashboard's time range"
        if p.visualization == "timeseries":
            assert p.columns[0] == "time" and "$__interval_ms" in p.sql, p.path
        # attribute names come from the schema module, never spelled anew
        for key in re.findall(r"attributes\['([^']+)'\]", p.sql):
            assert key in vars(schema).values(), (
                f"{p.path}: '{key}' is not a name in core/lightning_otel/core/schema.py"
            )


@pytest.mark.parametrize("sql_panel", PANELS, ids=lambda p: f"{p.dashboard}/{p.path.stem}")
def test_panel_runs_on_the_views_file_and_follows_the_time_range(views, sql_panel, time_range):
    rows = run(views, sql_panel, time_range)
    if sql_panel.path.stem != "05-mismatch-causes" or rows:  # the demo may merge every boundary
        assert rows, f"{sql_panel.path.name}: no rows over the demo run"
    if sql_panel.visualization == "timeseries":
        times = [row[0] for row in rows]
        assert times == sorted(times) and all(t.tzinfo is not None for t in times)
    # a range before any data: nothing (the stat answers 0)
    before = (datetime(2001, 1, 1, tzinfo=UTC), datetime(2001, 1, 2, tzinfo=UTC))
    assert run(views, sql_panel, before) in ([], [(0,)])


def test_spans_and_llm_calls(views, reference, raw_spans, time_range):
    p = panel("overview", "01-spans-and-llm-calls")
    [(_, spans, calls)] = run(views, p, time_range, ONE_BUCKET_MS)
    assert spans == len(raw_spans)
    assert calls == reference.execute("SELECT count(*) FROM llm_calls").fetchone()[0] > 0
    # buckets a quarter of the spans' extent: several, however fast the demo ran (fixed 10 s buckets
    # held a whole fast run in one, a fresh-clone CI failure)
    starts = [s["start_time"] for s in raw_spans]
    fine = run(views, p, time_range, max(1, int((max(starts) - min(starts)).total_seconds() * 1000) // 4))
    assert len(fine) > 1 and sum(r[1] for r in fine) == spans and sum(r[2] for r in fine) == calls


def test_tokens(views, reference, time_range):
    [(_, prompt, completion)] = run(views, panel("overview", "02-tokens"), time_range, ONE_BUCKET_MS)
    expected = reference.execute(
        "SELECT sum(token_count_prompt), sum(token_count_completion) FROM llm_calls"
    ).fetchone()
    assert (prompt, completion) == expected and prompt > 0


def test_latency_by_model(views, reference, time_range):
    rows = run(views, panel("overview", "03-latency-by-model"), time_range, ONE_BUCKET_MS)
    durations = defaultdict(list)
    for model, duration in reference.execute(
        "SELECT coalesce(model_name, 'unknown'), duration_ms FROM llm_calls"
    ).fetchall():
        durations[model].append(duration)
    assert {row[1] for row in rows} == set(durations)
    for _, model, p50, p95 in rows:
        cuts = statistics.quantiles(durations[model], n=100, method="inclusive")  # linear, as quantile_cont
        assert p50 == pytest.approx(cuts[49]) and p95 == pytest.approx(cuts[94])


def test_error_rate(views, reference, raw_spans, time_range):
    [(_, span_rate, rollout_rate)] = run(views, panel("overview", "04-error-rate"), time_range, ONE_BUCKET_MS)
    assert span_rate == pytest.approx(sum(s["status_code"] == "ERROR" for s in raw_spans) / len(raw_spans))
    failed = [f for (f,) in reference.execute("SELECT failed FROM rollouts").fetchall()]
    assert rollout_rate == pytest.approx(sum(failed) / len(failed))


def _latest_dropped_per_process(spans: list[dict]) -> int:
    latest: dict[str | None, tuple] = {}
    for s in spans:
        attributes, resource = dict(s["attributes"] or []), dict(s["resource_attributes"] or [])
        if s["is_rollout_root"] and schema.SDK_DROPPED_SPANS in attributes:
            instance = resource.get(schema.SERVICE_INSTANCE_ID)
            candidate = (s["end_time"], int(attributes[schema.SDK_DROPPED_SPANS]))
            latest[instance] = max(latest.get(instance, candidate), candidate)
    return sum(value for _, value in latest.values())


def test_dropped_spans_on_the_demo(views, raw_spans, time_range):
    [(dropped,)] = run(views, panel("overview", "05-dropped-spans"), time_range)
    assert dropped == _latest_dropped_per_process(raw_spans)


def test_dropped_spans_sums_the_latest_count_of_each_process(tmp_path):
    """Cumulative counters: the latest per process, summed; non-root spans and duplicates ignored."""
    base = datetime(2026, 1, 1, tzinfo=UTC)

    def span(n: int, instance: str, dropped: int, root: bool = True) -> dict:
        return {
            "trace_id": f"{n:032x}",
            "span_id": f"{n:016x}",
            "name": schema.SPAN_ROLLOUT,
            "start_time": base + timedelta(seconds=n),
            "end_time": base + timedelta(seconds=n, milliseconds=500),
            "status_code": "OK",
            "is_rollout_root": root,
            "attributes": [(schema.SDK_DROPPED_SPANS, str(dropped))],
            "resource_attributes": [(schema.SERVICE_INSTANCE_ID, instance)],
        }

    rows = [span(1, "a", 3), span(2, "a", 5), span(3, "b", 2), span(4, "b", 100, root=False), span(2, "a", 5)]
    Store(tmp_path / "data").write(
        pa.Table.from_pylist(rows, schema=SPANS_SCHEMA), str(tmp_path / "data/spans/x/part-1.parquet")
    )
    conn = duckdb.connect(str(write_views_file(tmp_path / "data", tmp_path / "views.duckdb")), read_only=True)
    window = (base - timedelta(minutes=1), base + timedelta(minutes=1))
    assert run(conn, panel("overview", "05-dropped-spans"), window) == [(5 + 2,)]
    assert run(conn, panel("overview", "05-dropped-spans"), (base + timedelta(seconds=2), window[1])) == [(5 + 2,)]
    assert run(conn, panel("overview", "05-dropped-spans"), (base + timedelta(seconds=3), window[1])) == [(2,)]


def test_reward_per_step_and_per_policy_version(views, reference, time_range):
    per_step = run(views, panel("training", "01-mean-reward-per-step"), time_range)
    assert per_step == reference.execute("SELECT step, mean_reward FROM train_steps ORDER BY step").fetchall()
    assert len(per_step) >= 2
    rewards = defaultdict(list)
    for versions, reward in reference.execute(
        "SELECT policy_versions, reward FROM rollouts WHERE reward IS NOT NULL"
    ).fetchall():
        if versions and len(versions) == 1:
            rewards[versions[0]].append(reward)
    per_version = run(views, panel("training", "02-mean-reward-per-policy-version"), time_range)
    assert {v: pytest.approx(r) for v, r in per_version} == {v: statistics.fmean(r) for v, r in rewards.items()}
    assert per_version


def test_samples_per_rollout_histogram(views, reference, time_range):
    totals: Counter = Counter()
    for (histogram,) in reference.execute("SELECT samples_per_rollout FROM train_steps").fetchall():
        for k, count in enumerate(histogram or []):
            totals[str(k + 1)] += count  # element k: rollouts that became k + 1 samples
    rows = run(views, panel("training", "03-samples-per-rollout"), time_range)
    assert dict(rows) == dict(totals) and [r[0] for r in rows] == sorted(totals, key=int)


def test_merge_rate_and_mismatch_causes(views, reference, time_range):
    boundaries = reference.execute("SELECT merged, cause FROM merge_diagnostics").fetchall()
    assert boundaries, "the demo's trainer writes merge_boundary spans"
    [(_, rate)] = run(views, panel("training", "04-merge-rate"), time_range, ONE_BUCKET_MS)
    assert rate == pytest.approx(sum(m for m, _ in boundaries) / len(boundaries))
    causes = Counter(cause for merged, cause in boundaries if not merged)
    assert dict(run(views, panel("training", "05-mismatch-causes"), time_range)) == dict(causes)


@pytest.mark.parametrize(
    "stem, column",
    [
        ("06-loss", "loss"),
        ("07-clip-fraction", "clip_fraction"),
        ("08-entropy", "entropy"),
        ("09-kl", "kl"),
        ("10-swap-seconds", "swap_seconds"),
    ],
)
def test_training_metric_per_step(views, reference, time_range, stem, column):
    rows = run(views, panel("training", stem), time_range)
    assert rows == reference.execute(f"SELECT step, {column} FROM train_steps ORDER BY step").fetchall()


# --- the views file ----------------------------------------------------------------------------------


def test_views_file_holds_only_the_views_and_opens_read_only(views, views_path, reference):
    names = {re.search(r"VIEW (\w+)", s)[1] for s in view_statements("x")}
    tables = views.execute("SELECT table_name, table_type FROM information_schema.tables").fetchall()
    assert {name for name, _ in tables} == names and {kind for _, kind in tables} == {"VIEW"}
    for name in names:
        assert (
            views.execute(f"SELECT count(*) FROM {name}").fetchone()
            == reference.execute(f"SELECT count(*) FROM {name}").fetchone()
        )
    with pytest.raises(duckdb.Error, match="read-only"):
        views.execute("CREATE TABLE t (x INTEGER)")
    # DuckDB 2 writes storage version 999 by default, which the plugin's DuckDB 1.x refuses; 64 is v1.0.0
    header = views_path.read_bytes()[:20]
    assert header[8:12] == b"DUCK" and struct.unpack("<Q", header[12:20])[0] == 64
    assert sorted(p.name for p in views_path.parent.iterdir()) == [views_path.name]  # no temp file or WAL left


def test_rewriting_replaces_the_file_and_open_readers_keep_answering(data_dir, views_path, views):
    before = views_path.stat().st_ino
    write_views_file(data_dir, views_path)
    assert views_path.stat().st_ino != before  # renamed into place, not rewritten in place
    assert views.execute("SELECT count(*) FROM spans").fetchone()[0] > 0


def test_views_file_refuses_what_it_cannot_serve(tmp_path, capsys):
    out = tmp_path / "views.duckdb"
    with pytest.raises(ViewsFileError, match="no trace store yet"):
        write_views_file(tmp_path / "empty", out)
    assert cli_main(["grafana-views", "--data-dir", str(tmp_path / "empty"), "--out", str(out)]) == 2
    assert "start the collector" in capsys.readouterr().err and not out.exists()
    with pytest.raises(ViewsFileError, match="only local"):
        write_views_file("s3://bucket/prefix", out)
    # a collector that has started but not flushed: the schema file alone, views answer with no rows
    Store(tmp_path / "fresh").ensure_schema_file()
    assert cli_main(["grafana-views", "--data-dir", str(tmp_path / "fresh"), "--out", str(out)]) == 0
    conn = duckdb.connect(str(out), read_only=True)
    assert conn.execute("SELECT count(*) FROM spans").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM rollouts").fetchone() == (0,)


# --- provisioning and generated dashboards -----------------------------------------------------------


def test_datasource_provisioning_points_at_the_plugin_and_opens_read_only():
    config = yaml.safe_load((PROVISIONING_DIR / "datasources/lightning.yaml").read_text())
    assert config["apiVersion"] == 1
    [source] = config["datasources"]
    assert source["type"] == PLUGIN_ID and source["uid"] == DATASOURCE_UID
    # the plugin's settings (pkg/models/settings.go): path, initSql, maxOpenConns
    assert set(source["jsonData"]) <= {"path", "initSql", "maxOpenConns"}
    path, _, options = source["jsonData"]["path"].partition("?")
    assert path.endswith(".duckdb") and path.startswith("/")
    assert options == "access_mode=READ_ONLY"  # a duckdb-go DSN option, applied when the file is opened
    # the docker example mounts the views file's folder there (a folder: a file mount would keep the
    # replaced inode after grafana-views renames a new file into place)
    assert f":{Path(path).parent}:ro" in (REPO / "docs/grafana.md").read_text()


def test_dashboard_provider_reads_the_generated_dashboards():
    config = yaml.safe_load((PROVISIONING_DIR / "dashboards/lightning.yaml").read_text())
    assert config["apiVersion"] == 1
    [provider] = config["providers"]
    assert provider["type"] == "file"
    docs = (REPO / "docs/grafana.md").read_text()
    assert f"dashboards/grafana/dashboards:{provider['options']['path']}:ro" in docs
    assert "dashboards/grafana/provisioning:/etc/grafana/provisioning:ro" in docs


def test_dashboard_json_is_generated_from_the_sql_files():
    rendered = build.render_all()
    assert {path.name for path in rendered} == {"overview.json", "training.json"}
    for path, text in rendered.items():
        assert path.read_text() == text, f"{path} is stale: run python -m lightning_otel.dashboards.grafana.build"
    assert build.main(["--check"]) == 0
    for path in rendered:
        panels = json.loads(path.read_text())["panels"]
        assert [p["title"] for p in panels] == [p.title for p in PANELS if p.dashboard == path.stem]
        for item in panels:
            assert item["datasource"] == item["targets"][0]["datasource"] == {"type": PLUGIN_ID, "uid": DATASOURCE_UID}
            assert item["gridPos"]["x"] + item["gridPos"]["w"] <= 24


def test_docs_list_every_panel():
    docs = (REPO / "docs/grafana.md").read_text()
    for p in PANELS:
        assert f"| `{p.path.name}` | {p.title} |" in docs, f"docs/grafana.md does not list {p.dashboard}/{p.path.name}"


def test_build_rejects_a_panel_without_its_header(tmp_path):
    bad = tmp_path / "01-bad.sql"
    bad.write_text("-- Title: Something\nSELECT 1\n")
    with pytest.raises(ValueError, match="visualization, columns"):
        build.parse_panel("overview", bad)
    bad.write_text("-- Title: T\n-- Visualization: sparkline\n-- Columns: x\nSELECT 1 AS x\n")
    with pytest.raises(ValueError, match="not one of"):
        build.parse_panel("overview", bad)
