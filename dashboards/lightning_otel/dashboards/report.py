"""`lightning-otel report`: PNG plots and a short Markdown summary of a time window or a training job.

    write_report(data_dir, out_dir, since=None, until=None, steps=None) -> Path to summary.md

The window (docs/report.md has the details):
- `since`/`until` (either may be None): rollouts, LLM calls and tool calls that *started* in
  [since, until); train steps whose train_step span (written as the step finishes) is in it.
- `steps=(FIRST, LAST)`: the train_steps rows numbered FIRST..LAST. The time window runs from
  the latest train_step span numbered below FIRST (the beginning of data if there is none) to
  step LAST's span: in a steady collect -> train -> collect loop, the rollouts that started in it
  are the ones steps FIRST..LAST trained on.
Merge diagnostics are those of the window's rollouts: the trainer writes them after its step, so
selecting them by time would miss the last step's.

Only the standard library is imported here: `lightning-otel --help` must work without duckdb or
matplotlib (the dashboards extra). They are imported when a report is written.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

SUMMARY = "summary.md"
REWARD_PNG, SAMPLES_PNG, LATENCY_PNG = "reward_curve.png", "samples_per_rollout.png", "latency.png"
# The latency histogram reads at most this many calls (a uniform sample); percentiles use all of them.
LATENCY_SAMPLE = 100_000


class ReportError(Exception):
    """Nothing to report on: an empty store, or train steps that are not there."""


# --- window ---------------------------------------------------------------------------------------

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_time(text: str, now: datetime | None = None) -> datetime:
    """An ISO-8601 time (naive: this machine's local time) or a duration ago: 90s, 30m, 2h, 1d, 1h30m."""
    compact = text.strip().lower().replace(" ", "").removesuffix("ago")
    parts = _DURATION_PART.findall(compact)
    if parts and "".join(n + u for n, u in parts) == compact:
        seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)
        return (now or datetime.now(UTC)) - timedelta(seconds=seconds)
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither an ISO-8601 time (2025-06-01T12:00, 2025-06-01 12:00:00+02:00) "
            "nor a duration ago (90s, 30m, 2h, 1d, 1h30m)"
        ) from None
    return moment.astimezone(UTC)  # a naive time is taken as local time


def parse_steps(text: str) -> tuple[int, int]:
    """FIRST:LAST (inclusive) or a single step N."""
    match = re.fullmatch(r"\s*(\d+)\s*(?::\s*(\d+)\s*)?", text)
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a train step range: expected FIRST:LAST (e.g. 1:3) or N")
    first, last = int(match[1]), int(match[2] if match[2] is not None else match[1])
    if first > last:
        raise argparse.ArgumentTypeError(f"{text!r}: FIRST ({first}) is after LAST ({last})")
    return first, last


@dataclasses.dataclass
class Window:
    start: datetime | None  # None: the beginning of data
    end: datetime | None  # None: the end of data
    steps: tuple[int, int] | None = None
    start_step: int | None = None  # steps mode: the step whose span opens the window (None: start of data)


def _utc(moment: datetime) -> datetime:
    return moment.astimezone(UTC) if moment.tzinfo else moment.astimezone().astimezone(UTC)


def _sql_time(moment: datetime) -> str:
    return f"TIMESTAMPTZ '{_utc(moment).isoformat()}'"


def _between(column: str, window: Window) -> str:
    bounds = []
    if window.start is not None:
        bounds.append(f"{column} >= {_sql_time(window.start)}")
    if window.end is not None:
        bounds.append(f"{column} < {_sql_time(window.end)}")
    return " AND ".join(bounds) or "true"


def _steps_window(conn, first: int, last: int) -> Window:
    end = conn.execute("SELECT max(time) FROM train_steps WHERE step BETWEEN ? AND ?", [first, last]).fetchone()[0]
    if end is None:
        known = conn.execute("SELECT min(step), max(step), count(*) FROM train_steps").fetchone()
        have = f"it has steps {known[0]}..{known[1]}" if known[2] else "it has no train steps"
        raise ReportError(f"no train steps {first}..{last} in the store ({have})")
    before = conn.execute(
        "SELECT step, time FROM train_steps WHERE step < ? ORDER BY time DESC LIMIT 1", [first]
    ).fetchone()
    if before is None:
        return Window(start=None, end=end, steps=(first, last))
    return Window(start=before[1], end=end, steps=(first, last), start_step=before[0])


def _scope(conn, window: Window) -> None:
    """Temp tables of the window's rows, so the queries below scan them instead of re-reading the store."""
    steps = f"step BETWEEN {window.steps[0]} AND {window.steps[1]}" if window.steps else _between("time", window)
    conn.execute(f"CREATE TEMP TABLE w_rollouts AS SELECT * FROM rollouts WHERE {_between('start_time', window)}")
    conn.execute(f"""CREATE TEMP TABLE w_llm_calls AS
        SELECT model_name, duration_ms, status_code FROM llm_calls WHERE {_between("start_time", window)}""")
    conn.execute(f"""CREATE TEMP TABLE w_tool_calls AS
        SELECT status_code FROM tool_calls WHERE {_between("start_time", window)}""")
    conn.execute(f"CREATE TEMP TABLE w_train_steps AS SELECT * FROM train_steps WHERE {steps}")
    # A boundary diagnosed twice (a rollout trained on again) counts once, as last diagnosed.
    conn.execute("""CREATE TEMP TABLE w_merges AS
        SELECT * FROM merge_diagnostics WHERE rollout_id IN (SELECT rollout_id FROM w_rollouts)
        QUALIFY row_number() OVER (PARTITION BY rollout_id, prev_span_id, next_span_id ORDER BY time DESC) = 1""")


# --- numbers --------------------------------------------------------------------------------------


@dataclasses.dataclass
class ReportData:
    first_time: datetime | None  # the window's first rollout start
    last_time: datetime | None  # and its last rollout end
    rollouts: int
    rewarded: int
    failed_rollouts: int
    llm_calls: int
    llm_errors: int
    tool_calls: int
    tool_errors: int
    train_steps: list[tuple]  # (step, version, rollouts, samples, mean_reward, loss, swap_seconds), by step
    samples_per_rollout: list[int]  # element k: rollouts that became k + 1 samples, summed over the steps
    calls_per_rollout: list[tuple[int, int]]  # (LLM calls, rollouts): the fallback when there are no steps
    versions: list[tuple]  # training rollouts: (label, rollouts, with reward, mean reward), by first rollout start
    # held-out evaluation (split 'eval'): (version, tasks, rollouts, mean reward, its 95% low, high,
    # solved share, its 95% low, high), by last rollout end
    evaluation: list[tuple]
    merges: int
    merged: int
    merge_causes: list[tuple[str, int]]  # failed boundaries by cause, most frequent first
    latency: list[tuple]  # (model, calls, p50 ms, p95 ms), most calls first
    latency_sample: dict[str, list[float]]  # model -> durations (ms), for the histogram


def _gather(conn) -> ReportData:
    from lightning_otel.collector.query import reward_by_version_sql

    one = lambda sql: conn.execute(sql).fetchone()  # noqa: E731
    rows = lambda sql: conn.execute(sql).fetchall()  # noqa: E731
    first_time, last_time = one("SELECT min(start_time), max(end_time) FROM w_rollouts")
    rollouts, rewarded, failed = one("SELECT count(*), count(reward), count(*) FILTER (WHERE failed) FROM w_rollouts")
    llm_calls, llm_errors = one("SELECT count(*), count(*) FILTER (WHERE status_code = 'ERROR') FROM w_llm_calls")
    tool_calls, tool_errors = one("SELECT count(*), count(*) FILTER (WHERE status_code = 'ERROR') FROM w_tool_calls")
    histogram: list[int] = []
    for (counts,) in rows("SELECT samples_per_rollout FROM w_train_steps WHERE samples_per_rollout IS NOT NULL"):
        histogram += [0] * (len(counts) - len(histogram))
        for k, count in enumerate(counts):
            histogram[k] += count or 0
    merges, merged = one("SELECT count(*), count(*) FILTER (WHERE merged) FROM w_merges")
    sample = rows(
        f"SELECT coalesce(model_name, '(unknown)'), duration_ms FROM w_llm_calls "
        f"WHERE duration_ms IS NOT NULL USING SAMPLE {LATENCY_SAMPLE} ROWS"
    )
    latency_sample: dict[str, list[float]] = {}
    for model, duration in sample:
        latency_sample.setdefault(model, []).append(duration)
    return ReportData(
        first_time=first_time,
        last_time=last_time,
        rollouts=rollouts,
        rewarded=rewarded,
        failed_rollouts=failed,
        llm_calls=llm_calls,
        llm_errors=llm_errors,
        tool_calls=tool_calls,
        tool_errors=tool_errors,
        train_steps=rows("""SELECT step, version, rollouts, samples, mean_reward, loss, swap_seconds
                            FROM w_train_steps ORDER BY step, time"""),
        samples_per_rollout=histogram,
        calls_per_rollout=rows("SELECT llm_calls, count(*) FROM w_rollouts GROUP BY 1 ORDER BY 1"),
        # A rollout whose calls were served by several versions (a swap mid-rollout) gets its own row, "1, 2".
        versions=rows("""SELECT coalesce(nullif(array_to_string(policy_versions, ', '), ''), '(none)') AS label,
                                count(*), count(reward), avg(reward)
                         FROM w_rollouts WHERE split <> 'eval' GROUP BY label ORDER BY min(start_time)"""),
        evaluation=rows(f"""SELECT version, tasks, rollouts, mean_reward, reward_low, reward_high,
                                   solved, solved_low, solved_high
                            FROM ({reward_by_version_sql("w_rollouts")}) WHERE split = 'eval' ORDER BY last_end_time"""),
        merges=merges,
        merged=merged,
        merge_causes=rows("""SELECT coalesce(cause, '(none)'), count(*) FROM w_merges WHERE NOT merged
                             GROUP BY 1 ORDER BY 2 DESC, 1"""),
        latency=rows("""SELECT coalesce(model_name, '(unknown)') AS model, count(*),
                               quantile_cont(duration_ms, 0.5), quantile_cont(duration_ms, 0.95)
                        FROM w_llm_calls GROUP BY model ORDER BY 2 DESC, model"""),
        latency_sample=latency_sample,
    )


# --- Markdown -------------------------------------------------------------------------------------


def _when(moment: datetime | None, missing: str) -> str:
    return _utc(moment).strftime("%Y-%m-%d %H:%M:%SZ") if moment is not None else missing


def _num(value: float | None, digits: int | str = 3) -> str:
    """Fixed decimals, or a format spec such as "3g" (a GRPO loss is ~1e-9: 0.0000 would hide it)."""
    if value is None:
        return "n/a"
    return f"{value:.{digits}f}" if isinstance(digits, int) else f"{value:.{digits}}"


def _rate(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "n/a"


def _table(header: list[str], rows: list[list], align: str = "") -> list[str]:
    align = align or "l" + "r" * (len(header) - 1)
    rule = ["---:" if a == "r" else "---" for a in align]
    return ["| " + " | ".join(header) + " |", "| " + " | ".join(rule) + " |"] + [
        "| " + " | ".join(str(c) for c in row) + " |" for row in rows
    ]


# Long runs: tables keep the first and last rows (the plots have them all), so the summary stays short.
_TABLE_ENDS = 6


def _ends(rows: list) -> list:
    return rows if len(rows) <= 2 * _TABLE_ENDS else rows[:_TABLE_ENDS] + rows[-_TABLE_ENDS:]


def _elided(rows: list, what: str) -> list[str]:
    hidden = len(rows) - len(_ends(rows))
    return ["", f"({hidden} {what} in the middle not shown; the plot has all)"] if hidden else []


def _markdown(data_dir: str, window: Window, data: ReportData, notes: dict[str, str]) -> str:
    if window.steps:
        title = f"steps {window.steps[0]}..{window.steps[1]}"
        opened = f"step {window.start_step}'s train_step span" if window.start_step is not None else "the start of data"
        scope = (
            f"Train steps {window.steps[0]}..{window.steps[1]}; rollouts and calls that started between "
            f"{opened} and step {window.steps[1]}'s, i.e. what these steps trained on in a steady loop."
        )
    else:
        title = "all data" if window.start is None and window.end is None else "time window"
        scope = "Rollouts, LLM and tool calls that started in the window; train steps that finished in it."
    lines = [
        f"# lightning-otel report: {title}",
        "",
        f"- Window: {_when(window.start, 'start of data')} to {_when(window.end, 'end of data')} "
        f"(first rollout {_when(data.first_time, 'none')}, last rollout end {_when(data.last_time, 'none')})",
        f"- {scope}",
        f"- Data: `{data_dir}`",
        "",
        "## Counts",
        "",
        *_table(
            ["", "count"],
            [
                ["rollouts", data.rollouts],
                ["rollouts with a reward", data.rewarded],
                ["LLM calls", data.llm_calls],
                ["tool calls", data.tool_calls],
                ["train steps", len(data.train_steps)],
            ],
        ),
        "",
        "## Reward",
        "",
    ]
    if data.train_steps:
        first, last = data.train_steps[0], data.train_steps[-1]
        lines += [
            f"Mean reward per train step: {_num(first[4])} (step {first[0]}) -> {_num(last[4])} (step {last[0]}).",
            "",
        ]
        lines += _table(
            ["step", "version", "rollouts", "samples", "mean reward", "loss", "swap s"],
            [
                [s, v, r, n, _num(m), _num(loss, "3g"), _num(swap, 2)]
                for s, v, r, n, m, loss, swap in _ends(data.train_steps)
            ],
        )
        lines += _elided(data.train_steps, "steps")
    else:
        lines.append("No train steps in the window.")
    lines += ["", "Mean reward of training rollouts by the policy version(s) that served their LLM calls:", ""]
    lines += _table(
        ["policy version", "rollouts", "with reward", "mean reward"],
        [[label, n, rewarded, _num(mean)] for label, n, rewarded, mean in _ends(data.versions)]
        or [["(no rollouts)", 0, 0, "n/a"]],
    )
    lines += _elided(data.versions, "versions")
    if data.evaluation:
        lines += ["", "Held-out evaluation (rollouts with split 'eval', never trained on), with 95% intervals:", ""]
        lines += _table(
            ["eval version", "tasks", "rollouts", "mean reward", "solved"],
            [
                [v, tasks, n, f"{_num(mean)} [{_num(low)}, {_num(high)}]", f"{solved:.1%} [{slow:.1%}, {shigh:.1%}]"]
                for v, tasks, n, mean, low, high, solved, slow, shigh in data.evaluation
            ],
        )
    lines += ["", f"![reward curve]({REWARD_PNG})", "", "## Merges and samples", ""]
    if data.merges:
        lines.append(
            f"Merge rate: {_rate(data.merged, data.merges)} of {data.merges} boundaries between consecutive "
            "LLM calls of the window's rollouts merged."
        )
        if data.merge_causes:
            lines += ["", *_table(["cause of failed merges", "boundaries"], [list(c) for c in data.merge_causes[:5]])]
    else:
        lines.append(
            "No merge diagnostics for the window's rollouts (the trainer writes them when it trains on a rollout)."
        )
    lines += ["", notes.get(SAMPLES_PNG, ""), "", f"![samples per rollout]({SAMPLES_PNG})", "", "## Latency", ""]
    lines += _table(
        ["model", "LLM calls", "p50 ms", "p95 ms"],
        [[m, n, _num(p50, 1), _num(p95, 1)] for m, n, p50, p95 in data.latency] or [["(no calls)", 0, "n/a", "n/a"]],
    )
    lines += ["", f"![LLM call latency]({LATENCY_PNG})", "", "## Errors", ""]
    lines += _table(
        ["", "errors", "of", "rate"],
        [
            ["LLM calls (status ERROR)", data.llm_errors, data.llm_calls, _rate(data.llm_errors, data.llm_calls)],
            ["tool calls (status ERROR)", data.tool_errors, data.tool_calls, _rate(data.tool_errors, data.tool_calls)],
            [
                "rollouts (root span ERROR)",
                data.failed_rollouts,
                data.rollouts,
                _rate(data.failed_rollouts, data.rollouts),
            ],
        ],
    )
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)) + "\n"


# --- entry points ---------------------------------------------------------------------------------


def write_report(
    data_dir,
    out_dir,
    since: datetime | None = None,
    until: datetime | None = None,
    steps: tuple[int, int] | None = None,
) -> Path:
    """Write summary.md and the PNGs into `out_dir` (created); returns the Markdown's path.

    Raises ReportError when the store holds no spans or the train steps asked for are not there;
    a window with no data gives an honest report of zeros and 'no data' plots.
    """
    from lightning_otel.collector import connect
    from lightning_otel.dashboards import report_plots

    if steps is not None and (since is not None or until is not None):
        raise ValueError("give either steps or since/until, not both")
    conn = connect(data_dir)
    conn.execute("SET TimeZone = 'UTC'")  # timestamps come back in UTC, as the Markdown prints them
    any_span = conn.execute("SELECT count(*) FROM (SELECT 1 FROM spans_raw LIMIT 1)").fetchone()
    if any_span is None or any_span[0] == 0:
        raise ReportError(f"no spans in {data_dir}: is it the collector's --data-dir, and has anything been exported?")
    window = _steps_window(conn, *steps) if steps is not None else Window(since, until)
    _scope(conn, window)
    data = _gather(conn)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    notes = {
        REWARD_PNG: report_plots.reward_curve(out / REWARD_PNG, data.train_steps, data.versions, data.evaluation),
        SAMPLES_PNG: report_plots.samples_per_rollout(
            out / SAMPLES_PNG, data.samples_per_rollout, data.calls_per_rollout
        ),
        LATENCY_PNG: report_plots.latency(out / LATENCY_PNG, data.latency, data.latency_sample),
    }
    path = out / SUMMARY
    path.write_text(_markdown(str(data_dir), window, data, notes))
    return path


def _cmd_report(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.steps is not None and (args.since is not None or args.until is not None):
        parser.error("--steps selects its own window: use it without --since/--until")
    if args.since is not None and args.until is not None and args.since >= args.until:
        parser.error(f"--since ({_when(args.since, '')}) is not before --until ({_when(args.until, '')})")
    try:
        path = write_report(args.data_dir, args.out, since=args.since, until=args.until, steps=args.steps)
    except ReportError as exc:
        print(f"lightning-otel report: error: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


def add_parser(sub, data_dir: str) -> None:
    p = sub.add_parser(
        "report",
        help="PNG plots and a Markdown summary of a time window or a training job",
        description="Writes summary.md, reward_curve.png, samples_per_rollout.png and latency.png into "
        "--out, and prints the Markdown's path. docs/report.md explains the window.",
    )
    p.add_argument("--data-dir", default=data_dir, help="trace store [$LIGHTNING_OTEL_DATA_DIR]")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for the report (created)")
    p.add_argument(
        "--since",
        type=parse_time,
        metavar="T",
        help="from this time: ISO-8601 (naive = local time) or a duration ago (90s, 30m, 2h, 1d)",
    )
    p.add_argument("--until", type=parse_time, metavar="T", help="up to this time (same forms as --since)")
    p.add_argument(
        "--steps",
        type=parse_steps,
        metavar="FIRST:LAST",
        help="a training job's steps FIRST..LAST and the rollouts they trained on (not with --since/--until)",
    )
    p.set_defaults(func=lambda args: _cmd_report(args, p))
