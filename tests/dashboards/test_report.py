"""`lightning-otel report`: the Markdown's numbers equal independent SQL, the PNGs are real PNGs,
--steps selects the right window, the CLI works and fails clearly.

Two stores: a small synthetic one whose every number is known (window semantics), and the
output of a real digit-sum run (`tests/digit_sum_run.py`, the `demo_run` fixture in conftest.py).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest
from helpers import local_collector
from opentelemetry import trace
from otlp_helpers import make_spans, post, request_bytes

from lightning_otel.collector import connect
from lightning_otel.core import schema
from lightning_otel.dashboards.report import ReportError, parse_steps, parse_time, write_report

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PNGS = ("reward_curve.png", "samples_per_rollout.png", "latency.png")


# --- reading the report back ------------------------------------------------------------------------


def _cells(markdown: str, label: str, table: str = "") -> list[str]:
    """The cells after the first of the first table row whose first cell is `label` (in the table whose
    header starts with `table`, if given)."""
    lines = markdown.splitlines()
    if table:
        lines = lines[next(i for i, line in enumerate(lines) if line.startswith(f"| {table} |")) :]
    for line in lines:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == label:
            return cells[1:]
    raise AssertionError(f"no table row {label!r} in:\n{markdown}")


def _count(markdown: str, label: str) -> int:
    return int(_cells(markdown, label)[0])


def _check_pngs(folder) -> None:
    from matplotlib.image import imread

    for name in PNGS:
        path = folder / name
        assert path.read_bytes()[:8] == PNG_SIGNATURE, name
        assert path.stat().st_size > 5_000, name  # a drawn figure, not an empty canvas
        height, width, channels = imread(path).shape
        assert width >= 500 and height >= 300 and channels in (3, 4), (name, width, height)


def _report(data_dir, out, *args):
    return subprocess.run(
        [sys.executable, "-m", "lightning_otel", "report", "--data-dir", str(data_dir), "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


# --- a synthetic training loop with known numbers ---------------------------------------------------

T0 = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
STEPS = 3
ROLLOUTS_PER_STEP = 4


def _ns(seconds: float) -> int:
    return int((T0.timestamp() + seconds) * 1e9)


def _step_time(step: int) -> float:
    return 100.0 * step + 50  # rollouts of step s start at 100 s * s; the step's span 50 s later


def _span(tracer, name: str, begin: float, end: float, attributes: dict, parent=None, error: bool = False):
    span = tracer.start_span(
        name,
        context=trace.set_span_in_context(parent) if parent else None,
        start_time=_ns(begin),
        attributes=attributes,
    )
    if error:
        span.set_status(trace.Status(trace.StatusCode.ERROR, "boom"))
    span.end(end_time=_ns(end))
    return span


def _build(tracer) -> None:
    """STEPS iterations of: 4 rollouts (2 LLM calls, 1 tool call, a reward) -> a train_step -> merge spans."""
    kind = schema.OPENINFERENCE_SPAN_KIND
    for step in range(1, STEPS + 1):
        for j in range(ROLLOUTS_PER_STEP):
            begin = 100.0 * step + j
            ids = {schema.ROLLOUT_ID: f"r{step}-{j}", schema.TASK_ID: f"task{j % 2}", schema.ATTEMPT: 1}
            root = tracer.start_span(
                schema.SPAN_ROLLOUT,
                start_time=_ns(begin),
                attributes={**ids, schema.ROLLOUT_ROOT: True, kind: schema.KIND_AGENT},
            )
            for k in range(2):  # 100 ms and 200 ms, served by the version the previous step produced
                _span(
                    tracer,
                    "ChatCompletion",
                    begin + k,
                    begin + k + 0.1 * (k + 1),
                    parent=root,
                    attributes={
                        **ids,
                        kind: schema.KIND_LLM,
                        schema.LLM_MODEL_NAME: "policy",
                        schema.POLICY_VERSION: str(step - 1),
                        schema.COMPLETION_TOKEN_IDS: [1, 2, 3],
                    },
                )
            _span(
                tracer,
                "add",
                begin + 0.5,
                begin + 0.6,
                parent=root,
                error=j == 0,
                attributes={**ids, kind: schema.KIND_TOOL, schema.TOOL_NAME: "add"},
            )
            _span(
                tracer,
                schema.SPAN_REWARD,
                begin + 3,
                begin + 3,
                parent=root,
                attributes={
                    **ids,
                    kind: schema.KIND_EVALUATOR,
                    schema.REWARD_NAME: schema.DEFAULT_REWARD_NAME,
                    schema.REWARD_VALUE: 0.25 * step,
                },
            )
            root.end(end_time=_ns(begin + 3))
        finished = _step_time(step)
        _span(
            tracer,
            schema.SPAN_TRAIN_STEP,
            finished,
            finished,
            attributes={
                schema.TRAIN_STEP: step,
                schema.TRAIN_VERSION: str(step),
                schema.TRAIN_ROLLOUTS: ROLLOUTS_PER_STEP,
                schema.TRAIN_SAMPLES: 5,
                schema.TRAIN_MEAN_REWARD: 0.25 * step,
                schema.TRAIN_LOSS: 0.1,
                schema.TRAIN_SWAP_SECONDS: 0.5,
                schema.TRAIN_SAMPLES_PER_ROLLOUT: [3, 1],
            },
        )
        for j in range(ROLLOUTS_PER_STEP):  # written after the step, as the trainer does: one boundary each
            cause = {schema.MERGE_CAUSE: "retokenized"} if j == 0 else {}
            _span(
                tracer,
                schema.SPAN_MERGE_BOUNDARY,
                finished + 1,
                finished + 1,
                attributes={
                    schema.MERGE_ROLLOUT: f"r{step}-{j}",
                    schema.MERGE_MERGED: j != 0,
                    schema.MERGE_CHAIN: 0,
                    schema.MERGE_PREV_SPAN: f"p{j}",
                    schema.MERGE_NEXT_SPAN: f"n{j}",
                    **cause,
                },
            )


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    with local_collector(tmp_path_factory.mktemp("report") / "data") as collector:
        assert post(collector.http_endpoint + "/v1/traces", request_bytes(make_spans(_build, "agent")))[0] == 200
        collector.flush()
        return collector.data_dir


def test_whole_store_numbers(synthetic, tmp_path):
    markdown = write_report(synthetic, tmp_path).read_text()
    assert _count(markdown, "rollouts") == STEPS * ROLLOUTS_PER_STEP
    assert _count(markdown, "LLM calls") == 2 * STEPS * ROLLOUTS_PER_STEP
    assert _count(markdown, "tool calls") == STEPS * ROLLOUTS_PER_STEP
    assert _count(markdown, "train steps") == STEPS
    assert "0.250 (step 1) -> 0.750 (step 3)" in markdown
    assert _cells(markdown, "2", "policy version") == ["4", "4", "0.750"]  # policy version 2 served step 3's rollouts
    assert "Merge rate: 75.0% of 12 boundaries" in markdown and _cells(markdown, "retokenized") == ["3"]
    assert _cells(markdown, "policy", "model")[:3] == ["24", "150.0", "200.0"]  # 100 ms and 200 ms calls
    assert _cells(markdown, "tool calls (status ERROR)") == ["3", "12", "25.0%"]
    assert "12 rollouts became 15 samples (1.25 per rollout)" in markdown  # [3, 1]: 4 rollouts, 5 samples a step
    for name in PNGS:
        assert f"]({name})" in markdown
    _check_pngs(tmp_path)


@pytest.mark.parametrize(("steps", "rollouts", "start"), [((1, 1), 4, None), ((2, 3), 8, 1), ((3, 3), 4, 2)])
def test_steps_window_is_what_the_steps_trained_on(synthetic, tmp_path, steps, rollouts, start):
    markdown = write_report(synthetic, tmp_path, steps=steps).read_text()
    assert _count(markdown, "train steps") == steps[1] - steps[0] + 1
    assert _count(markdown, "rollouts") == rollouts == ROLLOUTS_PER_STEP * (steps[1] - steps[0] + 1)
    assert f"(step {steps[0]})" in markdown and f"(step {steps[1]})" in markdown
    opened = f"step {start}'s train_step span" if start is not None else "the start of data"
    assert f"between {opened} and step {steps[1]}'s" in markdown
    # Merge spans are written after the step's span, yet belong to the step's rollouts.
    assert f"of {rollouts} boundaries" in markdown
    assert _cells(markdown, str(steps[1] - 1), "policy version") == ["4", "4", f"{0.25 * steps[1]:.3f}"]


def test_time_window(synthetic, tmp_path):
    since, until = T0 + timedelta(seconds=150), T0 + timedelta(seconds=260)  # step 1's span .. step 2's span
    markdown = write_report(synthetic, tmp_path, since=since, until=until).read_text()
    assert _count(markdown, "rollouts") == ROLLOUTS_PER_STEP  # step 2's rollouts (start 200..203 s)
    assert _count(markdown, "train steps") == 2  # steps 1 and 2 finished in it
    assert "2025-06-01 12:02:30Z to 2025-06-01 12:04:20Z" in markdown


def test_no_train_steps_falls_back_to_calls_per_rollout(synthetic, tmp_path):
    markdown = write_report(synthetic, tmp_path, since=T0, until=T0 + timedelta(seconds=140)).read_text()
    assert _count(markdown, "rollouts") == ROLLOUTS_PER_STEP and _count(markdown, "train steps") == 0
    assert "the histogram shows LLM calls per rollout instead" in markdown
    _check_pngs(tmp_path)


def test_empty_window_is_an_honest_report(synthetic, tmp_path):
    markdown = write_report(synthetic, tmp_path, since=T0 + timedelta(days=1)).read_text()
    assert _count(markdown, "rollouts") == 0 and _count(markdown, "train steps") == 0
    assert "No train steps in the window." in markdown and "No merge diagnostics" in markdown
    _check_pngs(tmp_path)  # each says 'no data'


def test_steps_not_in_the_store(synthetic, tmp_path):
    with pytest.raises(ReportError, match=r"no train steps 7\.\.9 in the store \(it has steps 1\.\.3\)"):
        write_report(synthetic, tmp_path, steps=(7, 9))
    result = _report(synthetic, tmp_path, "--steps", "7:9")
    assert result.returncode == 1 and "no train steps 7..9" in result.stderr and "Traceback" not in result.stderr


def test_empty_store(tmp_path):
    with pytest.raises(ReportError, match="no spans"):
        write_report(tmp_path / "nothing", tmp_path / "out")
    result = _report(tmp_path / "nothing", tmp_path / "out")
    assert result.returncode == 1 and "no spans in" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out" / "summary.md").exists()


# --- argument parsing -----------------------------------------------------------------------------


def test_parse_time():
    now = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
    assert parse_time("2h", now) == now - timedelta(hours=2)
    assert parse_time("1h30m ago", now) == now - timedelta(minutes=90)
    assert parse_time("45s", now) == now - timedelta(seconds=45)
    assert parse_time("2025-06-01T10:00:00Z") == datetime(2025, 6, 1, 10, tzinfo=UTC)
    assert parse_time("2025-06-01 12:00+02:00") == datetime(2025, 6, 1, 10, tzinfo=UTC)
    for bad in ("yesterday", "2h5", "-3h", "2025-13-01"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_time(bad, now)


def test_parse_steps():
    assert parse_steps("1:3") == (1, 3) and parse_steps("4") == (4, 4)
    for bad in ("3:1", "a:b", "1-3", ":3", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_steps(bad)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--since", "yesterday"], "argument --since: 'yesterday' is neither an ISO-8601 time"),
        (["--steps", "3:1"], "argument --steps: '3:1': FIRST (3) is after LAST (1)"),
        (["--steps", "1:2", "--since", "2h"], "--steps selects its own window"),
        (["--since", "1h", "--until", "2h"], "is not before --until"),
    ],
)
def test_bad_arguments_are_argparse_errors(tmp_path, args, message):
    result = _report(tmp_path, tmp_path / "out", *args)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr, result.stderr


# --- a real demo run --------------------------------------------------------------------------------


def test_demo_report_matches_sql(demo_run, tmp_path):
    conn = connect(demo_run.data_dir)
    path = write_report(demo_run.data_dir, tmp_path)
    markdown = path.read_text()
    assert path == tmp_path / "summary.md"
    one = lambda sql: conn.execute(sql).fetchone()  # noqa: E731
    assert _count(markdown, "rollouts") == one("SELECT count(*) FROM rollouts")[0] > 0
    assert _count(markdown, "LLM calls") == one("SELECT count(*) FROM llm_calls")[0] > 0
    assert _count(markdown, "tool calls") == one("SELECT count(*) FROM tool_calls")[0]
    assert _count(markdown, "train steps") == one("SELECT count(*) FROM train_steps")[0] > 0
    first, last = one("SELECT arg_min(mean_reward, step), arg_max(mean_reward, step) FROM train_steps")
    assert f"{first:.3f} (step " in markdown and f"-> {last:.3f} (step " in markdown
    boundaries, rate = one("SELECT count(*), avg(merged::INT) FROM merge_diagnostics")
    assert f"Merge rate: {100 * rate:.1f}% of {boundaries} boundaries" in markdown
    # The held-out evaluation (the demo runs its held-out pairs before the first update and at the end).
    evaluated = conn.execute(
        "SELECT version, tasks, rollouts, solved FROM reward_by_version WHERE split = 'eval'"
    ).fetchall()
    assert len(evaluated) == 2 and "Held-out evaluation" in markdown
    for version, tasks, rollouts, solved in evaluated:
        cells = _cells(markdown, version, "eval version")
        assert cells[:2] == [str(tasks), str(rollouts)] and cells[3].startswith(f"{solved:.1%} ["), cells
    for model, calls, p50, p95 in conn.execute("""SELECT model_name, count(*), quantile_cont(duration_ms, 0.5),
            quantile_cont(duration_ms, 0.95) FROM llm_calls GROUP BY 1""").fetchall():
        assert _cells(markdown, model, "model")[:3] == [str(calls), f"{p50:.1f}", f"{p95:.1f}"]
    _check_pngs(tmp_path)


def test_demo_steps_window_via_cli(demo_run, tmp_path):
    conn = connect(demo_run.data_dir)
    last = conn.execute("SELECT max(step) FROM train_steps").fetchone()[0]
    result = _report(demo_run.data_dir, tmp_path, "--steps", f"{last}:{last}")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(tmp_path / "summary.md")
    markdown = (tmp_path / "summary.md").read_text()
    # Independently: rollouts that started after the previous step's span and before this one's.
    expected = conn.execute(
        """SELECT count(*) FROM rollouts WHERE start_time <
            (SELECT max(time) FROM train_steps WHERE step = $last) AND start_time >=
            coalesce((SELECT max(time) FROM train_steps WHERE step < $last), '-infinity'::TIMESTAMPTZ)""",
        {"last": last},
    ).fetchone()[0]
    assert _count(markdown, "rollouts") == expected > 0
    assert _count(markdown, "train steps") == 1
    mean_reward, trained, merge_rate = conn.execute(
        "SELECT mean_reward, rollouts, merge_rate FROM train_steps WHERE step = ?", [last]
    ).fetchone()
    # The demo is a steady loop: the window holds exactly the rollouts the step trained on, and their
    # merge diagnostics give the merge rate the trainer reported for the step.
    assert _count(markdown, "rollouts") == trained
    assert f"Merge rate: {100 * merge_rate:.1f}% of" in markdown
    assert re.search(rf"{mean_reward:.3f} \(step {last}\) -> {mean_reward:.3f} \(step {last}\)", markdown)
    _check_pngs(tmp_path)
