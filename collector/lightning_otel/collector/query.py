"""SQL over traces: `connect(data_dir)` returns a DuckDB connection with the views below.

The connection is in-memory and private to the caller: it reads the Parquet files directly, so
no reader ever takes a lock the collector needs (DuckDB file locks are per process), and any
number of processes can query while the collector writes. Views re-expand the file glob at
each query, so new data shows up without reconnecting.

Views (docs/sql.md has columns and examples):
  spans_raw  every stored row: a retried export or a compaction overlap shows twice (cheapest to read)
  spans      one row per (trace_id, span_id): retried exports and compaction overlap never show twice
  llm_spans  every LLM span (OpenInference's, or a GenAI-convention model call), with `is_wrapper`
             (a framework's span around the SDK call, or a second span of one call)
  llm_calls  one row per model call: LLM spans that are not wrappers, with token ids and logprobs,
             messages (GenAI-convention JSON parts) and `training_source`
  tool_calls TOOL spans (OpenInference's, or GenAI-convention execute_tool)
  rewards    one row per reward report
  rollouts   one row per rollout: task, split (train / eval), reward (latest 'reward'), rewards map,
             calls, times
  reward_by_version  per split and policy version: tasks, rollouts, mean reward and solved share with
             95% intervals (held-out evaluation: WHERE split = 'eval')
  train_steps  one row per optimizer step of the training job: reward, loss, clip fraction, swap time
  merge_diagnostics  one row per boundary between consecutive LLM calls, from the trainer: merged or
             not, first divergent position, classified cause
  input_diagnostics  what the trainer left out and why: one row per LLM call with tokens masked out of
             the loss (invalid behaviour logprobs), one per rollout excluded for good (non-finite
             reward, non-finite gradient, ...)

SQL from the network never runs on these connections: query_sandbox.py opens the same views with
no write path at all (no local file system, the store read through a read-only one, no temp
directory) and accepts one plain query; it runs in a query worker process (query_worker.py) within
the time limit and cap of query_limits.QueryLimiter (the collector's and the dashboard's POST /v1/query).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import TypeVar

import duckdb

from lightning_otel.collector.rollout_lookup import rollout_files
from lightning_otel.collector.span_rows import SPANS_SCHEMA
from lightning_otel.collector.store import Store
from lightning_otel.core import schema

T = TypeVar("T")


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


# Duplicates are identical copies of one span (a retried export, compaction overlap), so any copy
# will do (DISTINCT ON, a hash aggregate: over 1M spans ~0.3 s cheaper than a row_number() window
# sorted by end time), and adding columns to its key changes nothing, except that DuckDB can then
# push filters on those columns below it: a lookup by rollout id reads one rollout, not all.
_DEDUP_KEY = "trace_id, span_id, rollout_id, task_id, span_kind, service_name, start_time, name, policy_version"


_TRAIN_COLUMNS = (
    ("step", schema.TRAIN_STEP, "BIGINT"),
    ("version", schema.TRAIN_VERSION, "VARCHAR"),
    ("rollouts", schema.TRAIN_ROLLOUTS, "BIGINT"),
    ("samples", schema.TRAIN_SAMPLES, "BIGINT"),
    ("mean_reward", schema.TRAIN_MEAN_REWARD, "DOUBLE"),
    ("loss", schema.TRAIN_LOSS, "DOUBLE"),
    ("clip_fraction", schema.TRAIN_CLIP_FRACTION, "DOUBLE"),
    ("entropy", schema.TRAIN_ENTROPY, "DOUBLE"),
    ("kl", schema.TRAIN_KL, "DOUBLE"),
    ("grad_norm", schema.TRAIN_GRAD_NORM, "DOUBLE"),
    ("swap_seconds", schema.TRAIN_SWAP_SECONDS, "DOUBLE"),
    ("merge_rate", schema.TRAIN_MERGE_RATE, "DOUBLE"),
    ("masked_calls", schema.TRAIN_MASKED_CALLS, "BIGINT"),
    ("masked_tokens", schema.TRAIN_MASKED_TOKENS, "BIGINT"),
)


def _attribute(name: str) -> str:
    return f"attributes[{_literal(name)}]"


def _openinference_messages(messages: str) -> str:
    """OpenInference's flattened messages (llm.input_messages.{i}.message.role / .content /
    .tool_calls.{j}.tool_call.* / .tool_call_id) as JSON in the GenAI conventions' shape:
    [{"role", "parts": [text | tool_call | tool_call_response]}]; NULL if none were recorded."""

    def field(name: str) -> str:
        return f"attributes[{_literal(messages + '.')} || i || {_literal('.' + name)}]"

    def call(name: str) -> str:
        key = f"{_literal(messages + '.')} || i || {_literal('.' + schema.MESSAGE_TOOL_CALLS + '.')} || j"
        return f"attributes[{key} || {_literal('.' + name)}]"

    def count(pattern: str) -> str:
        return f"len(list_filter(map_keys(attributes), lambda k: k LIKE {pattern}))"

    role, content = field(schema.MESSAGE_ROLE), field(schema.MESSAGE_CONTENT)
    messages_count = count(_literal(f"{messages}.%.{schema.MESSAGE_ROLE}"))
    calls_count = count(
        f"{_literal(messages + '.')} || i || {_literal(f'.{schema.MESSAGE_TOOL_CALLS}.%.{schema.TOOL_CALL_FUNCTION_NAME}')}"
    )
    response = f"{{'type': 'tool_call_response', 'id': {field(schema.MESSAGE_TOOL_CALL_ID)}, 'response': {content}}}"
    text = (
        f"CASE WHEN {content} IS NULL THEN [] WHEN {role} = 'tool' THEN [to_json({response})]"
        f" ELSE [to_json({{'type': 'text', 'content': {content}}})] END"
    )
    tool_call = (
        f"{{'type': 'tool_call', 'id': {call(schema.TOOL_CALL_ID)}, 'name': {call(schema.TOOL_CALL_FUNCTION_NAME)},"
        f" 'arguments': {call(schema.TOOL_CALL_FUNCTION_ARGUMENTS)}}}"
    )
    parts = f"list_concat({text}, list_transform(range({calls_count}), lambda j: to_json({tool_call})))"
    first_role = _attribute(schema.message_attribute(messages, 0, schema.MESSAGE_ROLE))
    return (
        f"CASE WHEN {first_role} IS NOT NULL THEN"
        f" to_json(list_transform(range({messages_count}), lambda i: {{'role': {role}, 'parts': {parts}}})) END"
    )


def _rebuildable_parts(column: str, types: tuple[str, ...], first_role: str | None = None) -> str:
    """GenAI-convention messages JSON in `column`: valid, not empty, every message with parts, every
    part of one of `types` (what the trainer's reconstruct.gen_ai_messages renders), the first
    message's role `first_role` if given. CASE, not AND: DuckDB evaluates every operand of an AND,
    and the JSON functions raise on text that is not JSON."""
    allowed = ", ".join(_literal(t) for t in types)
    parts = f"json_extract({column}, '$[*].parts[*]')"
    kinds = f"json_extract_string({column}, '$[*].parts[*].type')"
    role = f" AND json_extract_string({column}, '$[0].role') = {_literal(first_role)}" if first_role else ""
    return (
        f"CASE WHEN json_valid({column}) THEN json_array_length({column}) > 0"
        f" AND len(json_extract({column}, '$[*].parts')) = json_array_length({column})"
        f" AND len(list_filter({kinds}, lambda t: t IN ({allowed}))) = len({parts}){role} ELSE false END"
    )


# What the trainer can do with a call (docs/sql.md, docs/training.md): 'token_ids' (captured ids and
# logprobs: trained on as served), 'messages' (no ids, but messages recorded in a shape the trainer
# rebuilds: rebuilt and marked reconstructed when the selection allows it, else skipped), 'none'
# (skipped and counted). Mirrors trainer/reconstruct.py's conditions.
def _training_source() -> str:
    first_input = _attribute(schema.message_attribute(schema.LLM_INPUT_MESSAGES, 0, schema.MESSAGE_ROLE))
    output = _attribute(schema.message_attribute(schema.LLM_OUTPUT_MESSAGES, 0, schema.MESSAGE_CONTENT))
    openinference = f"{first_input} IS NOT NULL AND {output} IS NOT NULL AND {output} <> {_literal(schema.REDACTED)}"
    gen_in, gen_out = _attribute(schema.GEN_AI_INPUT_MESSAGES), _attribute(schema.GEN_AI_OUTPUT_MESSAGES)
    gen_ai = (
        f"{first_input} IS NULL AND coalesce(({_rebuildable_parts(gen_in, ('text', 'tool_call', 'tool_call_response'))})"
        f" AND ({_rebuildable_parts(gen_out, ('text', 'tool_call'), 'assistant')}), false)"
    )
    return f"""CASE WHEN prompt_token_ids IS NOT NULL AND completion_token_ids IS NOT NULL
                         AND completion_logprobs IS NOT NULL THEN 'token_ids'
                    WHEN ({openinference}) OR ({gen_ai}) THEN 'messages'
                    ELSE 'none' END"""


def spans_raw_statement(source: str, temporary: bool = False) -> str:
    """The one view that reads `source`; every other view reads it. `temporary`: the connection's own
    (a lookup connection's, which shadows the read-only database's empty one)."""
    return f"""CREATE OR REPLACE {"TEMP " if temporary else ""}VIEW spans_raw AS SELECT * FROM {source}"""


_Z95 = 1.959963984540054  # the standard normal's 97.5% quantile: two-sided 95% intervals


def reward_by_version_sql(rollouts: str) -> str:
    """Reward per (split, policy version) over `rollouts` (the view, or a window of it with the same
    columns): rewarded rollouts one version served whole, with 95% intervals: the mean reward's normal
    one (1.96 standard errors), and Wilson's for the solved share (reward >= 1), which stays inside
    [0, 1] and is not zero-width at 0% or 100%. The `reward_by_version` view; `report` over its window."""
    z = _Z95
    wilson = (
        f"(solved + {z}^2 / (2 * rollouts) {{sign}} {z} * sqrt(solved * (1 - solved) / rollouts + {z}^2 / (4 * rollouts^2)))"
        f" / (1 + {z}^2 / rollouts)"
    )
    return f"""
        WITH scored AS (
            SELECT split, policy_versions[1] AS version, task_id, reward, (reward >= 1)::INT AS solved, end_time
            FROM {rollouts} WHERE reward IS NOT NULL AND len(policy_versions) = 1),
        totals AS (
            SELECT split, version, count(DISTINCT task_id) AS tasks, count(*) AS rollouts,
                   avg(reward) AS mean_reward, coalesce(stddev_samp(reward), 0) AS sd, avg(solved) AS solved,
                   min(end_time) AS first_end_time, max(end_time) AS last_end_time
            FROM scored GROUP BY split, version)
        SELECT split, version, tasks, rollouts, mean_reward,
               mean_reward - {z} * sd / sqrt(rollouts) AS reward_low,
               mean_reward + {z} * sd / sqrt(rollouts) AS reward_high,
               solved, {wilson.format(sign="-")} AS solved_low, {wilson.format(sign="+")} AS solved_high,
               first_end_time, last_end_time
        FROM totals"""


def _wrappers_sql() -> str:
    """(trace_id, span_id, rollout_id) of each LLM span that is a wrapper (view_statements says when)."""
    llm = _literal(schema.KIND_LLM)
    return f"""
        SELECT DISTINCT candidate.trace_id, candidate.span_id, candidate.rollout_id
        FROM (SELECT trace_id, span_id, rollout_id, start_time, end_time FROM spans_raw
              WHERE span_kind = {llm} AND completion_token_ids IS NULL) candidate
        JOIN spans_raw inner_call ON inner_call.trace_id = candidate.trace_id
        WHERE inner_call.span_kind = {llm} AND inner_call.span_id <> candidate.span_id
          AND (inner_call.start_time >= candidate.start_time AND inner_call.end_time <= candidate.end_time
               AND (inner_call.completion_token_ids IS NOT NULL
                    OR inner_call.start_time > candidate.start_time OR inner_call.end_time < candidate.end_time
                    OR inner_call.span_id > candidate.span_id)
               OR inner_call.completion_token_ids IS NOT NULL
                  AND candidate.start_time >= inner_call.start_time AND candidate.end_time <= inner_call.end_time)"""


def view_statements(source: str) -> list[str]:
    llm, tool = _literal(schema.KIND_LLM), _literal(schema.KIND_TOOL)
    primary = _literal(schema.DEFAULT_REWARD_NAME)
    return [
        spans_raw_statement(source),
        f"""CREATE OR REPLACE VIEW spans AS SELECT DISTINCT ON ({_DEDUP_KEY}) * FROM spans_raw""",
        # One model call, one row. An LLM span without token ids is a wrapper (not a call of its own)
        # when, in the same trace,
        # - its time window contains a token-bearing LLM span, or lies inside one: a framework's
        #   span around the SDK call (LangChain's ChatOpenAI, LiteLLM's completion), or a GenAI-
        #   convention client span (opentelemetry-instrumentation-openai-v2, Pydantic AI) around or
        #   inside the call instrument() or the gateway captured with ids; or
        # - its window contains another LLM span without ids (a framework's span around an
        #   instrumented SDK call, neither with ids): the innermost is the call. Of two with the
        #   same window, the one with the larger span id is the call.
        # Frameworks do not always nest the SDK span under theirs (LangChain does not), so time
        # containment decides, not parentage. GenAI-convention spans are LLM spans here: ingest gives
        # span_kind from gen_ai.operation.name (span_rows.FALLBACKS).
        # Only LLM spans without ids are candidates, and the search reads spans_raw (duplicates are
        # identical copies, so they change no answer here): a correlated EXISTS over the
        # deduplicated view cost 2+ s over 1M spans (bench/query_join.py), this ~0.3 s.
        # The wrappers are joined on rollout_id too (a span's copies share it), in two branches
        # (with a rollout id, and without: `=` never matches NULL), so that DuckDB copies a filter
        # on rollout_id into the wrapper search: one rollout's calls read its row groups, not the
        # store (tests/collector/test_store_pruning.py). A subquery per branch, not one CTE: a CTE
        # read twice is materialized whole, before any filter reaches it.
        f"""CREATE OR REPLACE VIEW llm_spans AS
            SELECT s.*, wrappers.span_id IS NOT NULL AS is_wrapper
            FROM spans s LEFT JOIN ({_wrappers_sql()}) wrappers
                 ON wrappers.trace_id = s.trace_id AND wrappers.span_id = s.span_id AND wrappers.rollout_id = s.rollout_id
            WHERE s.span_kind = {llm} AND s.rollout_id IS NOT NULL
            UNION ALL
            SELECT s.*, wrappers.span_id IS NOT NULL AS is_wrapper
            FROM spans s LEFT JOIN ({_wrappers_sql()}) wrappers
                 ON wrappers.trace_id = s.trace_id AND wrappers.span_id = s.span_id AND wrappers.rollout_id IS NULL
            WHERE s.span_kind = {llm} AND s.rollout_id IS NULL""",
        f"""CREATE OR REPLACE VIEW llm_calls AS
            SELECT trace_id, span_id, parent_span_id, rollout_id, task_id, attempt, service_name, name,
                   start_time, end_time, duration_ms, status_code, status_message, model_name,
                   policy_version, finish_reason, token_count_prompt, token_count_completion,
                   prompt_token_ids, completion_token_ids, completion_logprobs,
                   coalesce({_attribute(schema.GEN_AI_INPUT_MESSAGES)},
                            {_openinference_messages(schema.LLM_INPUT_MESSAGES)}) AS input_messages,
                   coalesce({_attribute(schema.GEN_AI_OUTPUT_MESSAGES)},
                            {_openinference_messages(schema.LLM_OUTPUT_MESSAGES)}) AS output_messages,
                   {_training_source()} AS training_source
            FROM llm_spans WHERE NOT is_wrapper""",
        f"""CREATE OR REPLACE VIEW tool_calls AS
            SELECT trace_id, span_id, parent_span_id, rollout_id, task_id, tool_name, name,
                   start_time, end_time, duration_ms, status_code, status_message,
                   coalesce({_attribute(schema.INPUT_VALUE)}, {_attribute(schema.GEN_AI_TOOL_CALL_ARGUMENTS)}) AS input,
                   coalesce({_attribute(schema.OUTPUT_VALUE)}, {_attribute(schema.GEN_AI_TOOL_CALL_RESULT)}) AS output,
                   {_attribute(schema.GEN_AI_TOOL_CALL_ID)} AS tool_call_id
            FROM spans WHERE span_kind = {tool}""",
        """CREATE OR REPLACE VIEW rewards AS
            SELECT rollout_id, task_id, reward_name AS name, reward_value AS value, start_time AS time,
                   trace_id, span_id
            FROM spans WHERE reward_name IS NOT NULL AND rollout_id IS NOT NULL""",
        f"""CREATE OR REPLACE VIEW merge_diagnostics AS
            SELECT attributes[{_literal(schema.MERGE_ROLLOUT)}] AS rollout_id,
                   start_time AS time, service_name,
                   TRY_CAST(attributes[{_literal(schema.MERGE_CHAIN)}] AS INTEGER) AS chain,
                   attributes[{_literal(schema.MERGE_PREV_SPAN)}] AS prev_span_id,
                   attributes[{_literal(schema.MERGE_NEXT_SPAN)}] AS next_span_id,
                   attributes[{_literal(schema.MERGE_MERGED)}] = 'true' AS merged,
                   TRY_CAST(attributes[{_literal(schema.MERGE_POSITION)}] AS BIGINT) AS position,
                   attributes[{_literal(schema.MERGE_CAUSE)}] AS cause,
                   attributes[{_literal(schema.MERGE_REGION)}] AS region,
                   attributes[{_literal(schema.MERGE_DETAIL)}] AS detail
            FROM spans WHERE name = {_literal(schema.SPAN_MERGE_BOUNDARY)}""",
        f"""CREATE OR REPLACE VIEW input_diagnostics AS
            SELECT attributes[{_literal(schema.INPUT_ROLLOUT)}] AS rollout_id,
                   start_time AS time, service_name,
                   attributes[{_literal(schema.INPUT_SPAN)}] AS span_id,
                   attributes[{_literal(schema.INPUT_CAUSE)}] AS cause,
                   TRY_CAST(attributes[{_literal(schema.INPUT_TOKENS)}] AS BIGINT) AS tokens,
                   coalesce(attributes[{_literal(schema.INPUT_EXCLUDED)}] = 'true', false) AS excluded,
                   attributes[{_literal(schema.INPUT_DETAIL)}] AS detail
            FROM spans WHERE name = {_literal(schema.SPAN_INPUT_DIAGNOSTIC)}""",
        f"""CREATE OR REPLACE VIEW train_steps AS
            SELECT start_time AS time, service_name,
                   {", ".join(f"TRY_CAST(attributes[{_literal(attr)}] AS {kind}) AS {column}" for column, attr, kind in _TRAIN_COLUMNS)}
                   , from_json(attributes[{_literal(schema.TRAIN_SAMPLES_PER_ROLLOUT)}], '["BIGINT"]') AS samples_per_rollout
            FROM spans WHERE name = {_literal(schema.SPAN_TRAIN_STEP)}""",
        # Grouped straight from spans_raw, not from spans, whose hash over nine key columns of every
        # span was most of the view's cost: max, min, bool_or, distinct lists and latest rewards are
        # the same over a span's identical copies, and the counts count distinct (trace_id, span_id).
        # The counts are aggregates of that one grouping, not joins to llm_calls and tool_calls:
        # DuckDB drops an aggregate no one reads but not a LEFT JOIN (its join elimination does not
        # reach into a view), and those two joins, each deduplicating its spans, were half of
        # `llm_calls JOIN rollouts` (bench/query_join.py). What stays joined is the wrapper search
        # (a wrapper's inner call may carry another rollout id or none), whose cost is its candidates'
        # scan. list_distinct(list(...)), not count(DISTINCT ...): DuckDB plans a DISTINCT aggregate
        # over a materialized copy of the spans. (tests/collector/test_rollouts_view_differential.py)
        f"""CREATE OR REPLACE VIEW rollouts AS
            SELECT m.rollout_id, m.task_id, m.attempt, m.service_name, m.trace_id, m.start_time, m.end_time,
                   date_diff('microsecond', m.start_time, m.end_time) / 1000.0 AS duration_ms,
                   coalesce(len(list_distinct(m.llm_spans)), 0) - coalesce(w.wrappers, 0) AS llm_calls,
                   coalesce(len(list_distinct(m.tool_spans)), 0) AS tool_calls,
                   r.reward, r.rewards, m.policy_versions, m.failed, m.split
            FROM (
                SELECT rollout_id,
                       max(task_id) AS task_id,
                       max(attempt) AS attempt,
                       max(service_name) AS service_name,
                       min(trace_id) FILTER (WHERE is_rollout_root) AS trace_id,
                       min(start_time) FILTER (WHERE reward_name IS NULL) AS start_time,
                       max(end_time) FILTER (WHERE reward_name IS NULL) AS end_time,
                       list(struct_pack(t := trace_id, s := span_id)) FILTER (WHERE span_kind = {llm}) AS llm_spans,
                       list(struct_pack(t := trace_id, s := span_id)) FILTER (WHERE span_kind = {tool}) AS tool_spans,
                       list_sort(list_distinct(list(policy_version) FILTER (WHERE policy_version IS NOT NULL)))
                           AS policy_versions,
                       coalesce(bool_or(is_rollout_root AND status_code = 'ERROR'), false) AS failed,
                       coalesce(max({_attribute(schema.ROLLOUT_SPLIT)}) FILTER (WHERE is_rollout_root OR span_kind = {llm}),
                                {_literal(schema.SPLIT_TRAIN)}) AS split
                FROM spans_raw WHERE rollout_id IS NOT NULL
                GROUP BY rollout_id) m
            LEFT JOIN (
                SELECT rollout_id,
                       max(value) FILTER (WHERE name = {primary}) AS reward,
                       map_from_entries(list(struct_pack(k := name, v := value) ORDER BY name)) AS rewards
                FROM (SELECT rollout_id, reward_name AS name, arg_max(reward_value, start_time) AS value
                      FROM spans_raw WHERE reward_name IS NOT NULL AND rollout_id IS NOT NULL
                      GROUP BY rollout_id, reward_name)
                GROUP BY rollout_id) r USING (rollout_id)
            LEFT JOIN (
                SELECT rollout_id, count(*) AS wrappers FROM ({_wrappers_sql()}) WHERE rollout_id IS NOT NULL
                GROUP BY rollout_id
            ) w USING (rollout_id)""",
        f"CREATE OR REPLACE VIEW reward_by_version AS {reward_by_version_sql('rollouts')}",
    ]


def _register_filesystem(conn: duckdb.DuckDBPyConnection, store: Store) -> None:
    """Object storage: DuckDB reads s3:// through an fsspec filesystem (no httpfs download needed)."""
    import fsspec

    protocol = store.uri.split("://", 1)[0]
    # Views re-list files at every query; a cached listing would miss new files or name deleted ones.
    options: dict = {"skip_instance_cache": True, "use_listings_cache": False}
    if protocol in ("s3", "s3a") and os.environ.get("AWS_ENDPOINT_URL"):
        options["endpoint_url"] = os.environ["AWS_ENDPOINT_URL"]
    conn.register_filesystem(fsspec.filesystem(protocol, **options))


def parquet_source(store: Store) -> str:
    """The table expression the views read: every Parquet file of the store, re-listed per query."""
    return f"read_parquet({_literal(store.glob())}, union_by_name = true)"


def listed_source(files: list[str]) -> str | None:
    """`files`, listed once (None: there are none)."""
    return f"read_parquet([{', '.join(map(_literal, files))}], union_by_name = true)" if files else None


def _create_views(
    conn: duckdb.DuckDBPyConnection, store: Store, since: datetime | None = None, rollout_ids: list[str] | None = None
) -> None:
    """The views, created over an empty table of the spans' shape; then `spans_raw` reads the files.
    Creating a view binds it, and binding `read_parquet` reads every file's footer: over the files,
    once per view that reads them (~0.5 s per connection over a 100-file store). A query binds its
    views again, over the files' own columns (tests/collector/test_views_binding.py). No store yet: the empty
    table (reconnect once data exists)."""
    if not store.is_local:
        _register_filesystem(conn, store)
    conn.register("_empty_spans", SPANS_SCHEMA.empty_table())
    for statement in view_statements("_empty_spans"):
        conn.execute(statement)
    if not store.has_data():
        return

    def read_files() -> None:  # binding reads the footers: a file compaction deletes meanwhile is listed again
        if rollout_ids is not None:
            source = listed_source(rollout_files(conn, store, rollout_ids, since))
        elif since is not None:
            source = listed_source(store.files_since(since))
        else:
            source = parquet_source(store)
        if source is not None:
            conn.execute(spans_raw_statement(source))

    retry_vanished_files(read_files)


def connect(
    data_dir: str | os.PathLike, since: datetime | None = None, rollout_ids: str | Iterable[str] | None = None
) -> duckdb.DuckDBPyConnection:
    """A fresh in-memory DuckDB connection with the trace views over `data_dir`'s Parquet files.

    `since` (aware datetime): the views read only the hour partitions from `since`'s hour on, listed
    once now, so a query's cost follows the window, not the store. Every span that started at or after
    `since` is there; a rollout that started before it shows only its later spans, so callers select
    rollouts that start well inside the window (the training job: trainer/selection_window.py).
    `rollout_ids` (one id or several): the views read only the files, listed once now, that can hold
    those rollouts or their traces (rollout_lookup.py), so a lookup costs what the rollouts hold. A
    query filtered on those rollout ids answers as over the whole store; other rollouts' spans may be
    there too."""
    store = Store(data_dir)
    if rollout_ids is not None:
        rollout_ids = [rollout_ids] if isinstance(rollout_ids, str) else list(rollout_ids)
        if store.is_local:
            from lightning_otel.collector.lookup_connection import lookup_connection  # it reads this module

            return lookup_connection(store, rollout_ids, since)
    conn = duckdb.connect()
    _create_views(conn, store, since, rollout_ids)
    return conn


def vanished_file(error: BaseException) -> bool:
    """DuckDB's error for a Parquet file that a query listed and could no longer open: compaction
    deletes its inputs once their grace period ends, and a query that listed them just before that
    reads them just after. The compacted file holds the same rows, so running the query again (it
    lists the files anew) gives the full answer."""
    return isinstance(error, duckdb.IOException) and "No such file or directory" in str(error)


def retry_vanished_files(run: Callable[[], T], attempts: int = 3) -> T:
    """`run()` (queries on a `connect()` connection), run again when a file it listed vanished."""
    for attempt in range(attempts):
        try:
            return run()
        except duckdb.IOException as error:
            if attempt == attempts - 1 or not vanished_file(error):
                raise
    raise AssertionError("unreachable")
