"""Seeded hostile statements for the collector's POST /v1/query, for tests/collector/test_collector_hostile.py.

Three kinds: `write_or_peek_query` tries to change a file (COPY, EXPLAIN ANALYZE, ATTACH, EXPORT, profiling
output, spilling), read one outside the store, or learn a host path; `stall_query` is costly to parse,
plan or run (deep nesting, huge statements, cross joins); `rollout_ids_query` sends the body's optional
`rollout_ids` (the views narrowed to rollouts) with odd values on both sides of the door's caps, beside
plain reads and write-or-peek statements (tests/collector/test_query_door.py, hostile_dashboard.py).
A query's `targets` are the paths it tries to write: none may exist afterwards. `mentions_paths` tells
whether the statement itself names a host path (an error may then echo it back; a reply to any other
statement must name none). `allowed`: the replies it may get (None: any that is not a server error).
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass

from lightning_otel.collector.query_limits import MAX_ROLLOUT_ID_BYTES, MAX_ROLLOUT_IDS

SPILL_EVERY = 40  # one statement in this many spills (each holds a query slot for the whole time limit)


@dataclass
class Paths:
    store: str  # the collector's --data-dir
    spans: str  # the store's Parquet root (the sandbox's allowed directory)
    part_file: str  # an existing Parquet file of the store (a query must not overwrite it)
    canary: str  # a directory outside the store, with a secret file in it
    secret: str  # the secret file's content (no reply may contain it)
    cwd: str  # the collector's working directory (DuckDB's default temp directory is cwd/.tmp)
    learned: tuple = ()  # directories the door itself named (its allowed_directories): attackers ask first


NO_FIELD = object()  # a body without "rollout_ids"


@dataclass
class Query:
    kind: str
    sql: str | None  # None: `body` is sent as is
    body: bytes | None = None
    targets: tuple = ()
    headers: dict | None = None
    rollout_ids: object = NO_FIELD  # the body's "rollout_ids", any JSON value
    allowed: frozenset | None = None

    def payload(self) -> bytes:
        if self.sql is None:
            return self.body or b""
        fields = (
            {"sql": self.sql} if self.rollout_ids is NO_FIELD else {"sql": self.sql, "rollout_ids": self.rollout_ids}
        )
        return json.dumps(fields).encode()

    def mentions(self, paths: Paths) -> bool:
        text = self.sql if self.sql is not None else (self.body or b"").decode("utf-8", "replace")
        if self.rollout_ids is not NO_FIELD:
            text += str(self.rollout_ids)
        return any(p in text for p in (paths.store, paths.canary, paths.cwd))


# A rollout with reward 1e9 that the trainer would train on, if it landed in the store.
_FORGED = (
    "SELECT 'forged-{n}' AS rollout_id, 'reward' AS reward_name, 1e9 AS reward_value, 'ffffffffffffffffffffffffffffffff'"
    " AS trace_id, 'ffffffffffffffff' AS span_id, TIMESTAMP '2026-01-01' AS start_time"
)


def _wrap(rng: random.Random, statement: str) -> str:
    """The statement as is, or behind EXPLAIN (ANALYZE), odd case, comments, or a second statement."""
    how = rng.randrange(8)
    if how == 0:
        return "EXPLAIN ANALYZE " + statement
    if how == 1:
        return "EXPLAIN " + statement
    if how == 2:
        return "explain\t/* x */ analyze\n" + statement.lower()
    if how == 3:
        return "SELECT 1; " + statement
    if how == 4:
        return f"/* {rng.randbytes(4).hex()} */ {statement} -- tail"
    if how == 5:
        return f"EXPLAIN (ANALYZE, FORMAT json) {statement}"
    return statement


def write_or_peek_query(rng: random.Random, paths: Paths, n: int) -> Query:
    """A statement that, run, would write a file or reveal something outside the store."""
    targets = [
        f"{paths.spans}/forged-{n}.parquet",
        f"{paths.spans}/service=forged/date=2026-01-01/hour=00/part-forged-{n}.parquet",
        f"{paths.canary}/written-{n}.csv",
        f"{paths.cwd}/.tmp/forged-{n}",
        f"{paths.store}/wal/000000000001-forged{n}.wal",
        f"forged-relative-{n}.parquet",  # relative to the collector's working directory
        *(f"{prefix.rstrip('/')}/forged-learned-{n}.parquet" for prefix in paths.learned),
    ]
    learned = [t for t in targets if "forged-learned" in t]
    target = rng.choice(learned if learned and rng.random() < 0.5 else targets)
    pick = 11 if n % SPILL_EVERY == SPILL_EVERY - 1 else rng.choice([i for i in range(14) if i != 11])
    if pick == 0:
        fmt = rng.choice(["(FORMAT parquet)", "(FORMAT csv)", "(FORMAT json)", ""])
        return Query(
            "copy-forged-rollout", _wrap(rng, f"COPY ({_FORGED.format(n=n)}) TO '{target}' {fmt}"), targets=(target,)
        )
    if pick == 1:  # erase acknowledged spans by overwriting a store file with nothing
        part = paths.part_file
        if paths.learned and rng.random() < 0.5:  # the same file, named the way the door names the store
            part = paths.learned[0].rstrip("/") + "/" + os.path.relpath(part, paths.spans)
        sql = f"COPY (SELECT * FROM spans_raw WHERE false) TO '{part}' (FORMAT parquet)"
        return Query("copy-over-store-file", _wrap(rng, sql))
    if pick == 2:
        attach = rng.choice(
            [f"ATTACH '{target}.db' AS x", f"ATTACH '{target}.db' AS x (READ_ONLY)", "ATTACH ':memory:' AS m"]
        )
        return Query("attach", _wrap(rng, attach), targets=(target + ".db",))
    if pick == 3:
        return Query("export-database", _wrap(rng, f"EXPORT DATABASE '{target}'"), targets=(target,))
    if pick == 4:  # profiling writes its report to a file of the caller's choosing
        sql = rng.choice(
            [
                f"PRAGMA profiling_output='{target}'",
                f"SET profiling_output='{target}'",
                "PRAGMA enable_profiling='json'",
                f"SELECT * FROM pragma_profiling_output('{target}')",
            ]
        )
        return Query("profiling", _wrap(rng, sql), targets=(target,))
    if pick == 5:
        sql = rng.choice(
            [
                "SET enable_external_access=true",
                "SET allowed_directories=['/']",
                f"SET temp_directory='{paths.canary}'",
                "RESET lock_configuration",
                "SET lock_configuration=false",
                "SET memory_limit='100TB'",
                "PRAGMA threads=64",
            ]
        )
        return Query("settings", _wrap(rng, sql))
    if pick == 6:
        sql = rng.choice(
            [
                "INSTALL httpfs",
                "LOAD httpfs",
                "FORCE INSTALL json",
                "INSTALL '/tmp/evil.duckdb_extension'",
                "LOAD parquet",
            ]
        )
        return Query("extensions", _wrap(rng, sql))
    if pick == 7:
        sql = rng.choice(
            [
                "CREATE TABLE t AS SELECT 1",
                "CREATE OR REPLACE VIEW spans AS SELECT 1",
                "DROP VIEW spans_raw",
                "INSERT INTO spans_raw SELECT * FROM spans_raw",
                "CHECKPOINT",
                "VACUUM",
                "CREATE MACRO m() AS 1",
                "CREATE SECRET s (TYPE s3, KEY_ID 'x', SECRET 'y')",
                "DETACH memory",
                "USE system",
            ]
        )
        return Query("ddl", _wrap(rng, sql))
    if pick == 8:  # read files outside the store
        source = rng.choice(
            [f"{paths.canary}/secret.txt", "/etc/passwd", "/proc/self/environ", "/proc/self/cmdline", f"{paths.cwd}/*"]
        )
        reader = rng.choice(
            ["read_text", "read_blob", "read_csv", "read_json_auto", "glob", "sniff_csv", "read_parquet"]
        )
        return Query("read-outside", f"SELECT * FROM {reader}('{source}')")
    if pick == 9:  # settings and catalog functions that name host paths
        sql = rng.choice(
            [
                "SELECT current_setting('allowed_directories')",
                "SELECT current_setting('temp_directory')",
                "SELECT * FROM duckdb_settings()",
                "SELECT current_setting('home_directory')",
                "SELECT current_setting('extension_directory')",
                "SELECT * FROM duckdb_temporary_files()",
                "SELECT getenv('HOME')",
                "SELECT * FROM duckdb_databases()",
                "SELECT current_setting('secret_directory')",
            ]
        )
        return Query("path-reveal", sql)
    if pick == 10:  # the same, where no path is written in the statement at all
        sql = rng.choice(
            [
                "SELECT * FROM glob('*')",
                "SELECT * FROM glob('**/*.parquet')",
                "SELECT * FROM read_text('*')",
                "SELECT * FROM glob('../*')",
                "SELECT file FROM glob('.tmp/*')",
            ]
        )
        return Query("relative-glob", sql)
    if pick == 11:  # sorts ~4 GB: spills to DuckDB's temp directory within ~2.5 s unless it is off
        return Query(
            "spill",
            "SELECT s FROM (SELECT repeat('x', 4000) || i AS s FROM range(1000000) t(i)) ORDER BY s OFFSET 999999",
        )
    if pick == 12:  # statements hidden where a read-only check might not look
        sql = rng.choice(
            [
                f"SELECT * FROM query('COPY (SELECT 1) TO ''{target}''')",
                f"WITH x AS (SELECT 1) COPY x TO '{target}'",
                f"SELECT 1 /*; COPY (SELECT 1) TO '{target}' */",
                f"PIVOT (SELECT 1 AS a) ON a; COPY (SELECT 1) TO '{target}'",
                f"CALL pragma_copy('{target}')",
                f"EXPLAIN ANALYZE EXPLAIN ANALYZE COPY (SELECT 1) TO '{target}'",
            ]
        )
        return Query("hidden-statement", sql, targets=(target,))
    body = rng.choice(
        [
            b'{"sql": "SELECT \'\\ud800\'"}',
            b'{"sql": "SELECT 1 AS \\"\\udfff\\""}',
            b'{"sql": "SELECT \'\\u0000\'"}',
            b'{"sql": 1}',
            b'{"sql": ["SELECT 1"]}',
            b'{"sql": null}',
            b"{}",
            b"[]",
            b"not json",
            b'{"sql": "SELECT 1", "sql": "COPY x TO \'y\'"}',
            b"\xff\xfe" + rng.randbytes(30),
            ('{"sql": "SELECT \'' + "\u202e\u0301" * 5000 + "'\"}").encode(),
            b'{"sql": "\\ud83d"}',
        ]
    )
    return Query("odd-body", None, body=body)


def stall_query(rng: random.Random, pick: int | None = None) -> Query:
    """A statement costly to parse, plan or run; the query time limit must bound all of it.
    `pick` 0 is the costliest: a 4 MB nesting, whose parse once held ingest for 27 s (DuckDB 1.x parses
    400k levels in ~3 s, and the time grows faster than the depth)."""
    pick = rng.randrange(6) if pick is None else pick
    if pick <= 1:  # parsing such nesting takes seconds (superlinear in depth)
        depth = 2_000_000 if pick == 0 else rng.choice([400_000, 700_000, 1_000_000])
        return Query(f"nested-parens-{depth}", "SELECT " + "(" * depth + "1" + ")" * depth)
    if pick == 2:
        return Query("union-chain", "SELECT 1" + " UNION ALL SELECT 1" * rng.choice([5000, 20_000]))
    if pick == 3:
        return Query(
            "in-list", "SELECT 1 WHERE 1 IN (" + ", ".join(str(i) for i in range(rng.choice([100_000, 400_000]))) + ")"
        )
    if pick == 4:
        return Query(
            "cross-join", "SELECT count(*) FROM range(100000000) a, range(100000000) b WHERE a.range + b.range = -1"
        )
    return Query(
        "store-join",
        "SELECT count(*) FROM spans_raw a, spans_raw b, spans_raw c WHERE a.name || b.name = c.name || 'x'",
    )


def _odd_id(rng: random.Random, paths: Paths, n: int) -> str:
    """One non-empty rollout id within the door's cap: text a lookup must treat as data, never as SQL
    or a path."""
    return rng.choice(
        [
            "\x00",
            "a\x00b",
            "'",
            "''",
            "\\",
            "' OR 1=1 --",
            "r1' OR rollout_id IS NOT NULL --",
            f"'); COPY (SELECT 1) TO '{paths.canary}/written-{n}.csv'; --",
            "x' UNION SELECT * FROM read_text('/etc/passwd') --",
            "*",
            "**/*.parquet",
            "%",
            "?",
            "$1",
            "../../../etc/passwd",
            f"{paths.spans}/_schema.parquet",
            "tracestore://spans/_schema.parquet",
            "NULL",
            " ",
            "\n\t\r",
            "\u202e\u0301",
            "\U0001f600",
            "é" * (MAX_ROLLOUT_ID_BYTES // 2),  # exactly at the cap in UTF-8
            "x" * MAX_ROLLOUT_ID_BYTES,
            rng.randbytes(16).hex(),
        ]
    )


def rollout_ids_value(rng: random.Random, paths: Paths, n: int, known: Sequence[str] = ()) -> tuple[object, bool]:
    """A value for the body's "rollout_ids", and whether the door must accept it (a list of 1 to
    MAX_ROLLOUT_IDS non-empty strings of valid Unicode, each at most MAX_ROLLOUT_ID_BYTES in UTF-8).
    `known`: rollout ids the store holds."""
    real = list(known) or ["r1"]
    valid = [
        lambda: [rng.choice(real)],
        lambda: rng.sample(real, rng.randint(1, min(len(real), MAX_ROLLOUT_IDS))),
        lambda: [rng.choice(real)] * rng.randint(2, MAX_ROLLOUT_IDS),  # duplicates
        lambda: [_odd_id(rng, paths, n) for _ in range(rng.randint(1, 5))],
        lambda: [_odd_id(rng, paths, n), rng.choice(real)],
        lambda: [f"r{i}" for i in range(MAX_ROLLOUT_IDS)],  # at the cap
    ]
    invalid = [
        lambda: rng.choice([None, True, 0, -1, 1.5, float("nan"), "r1", "", {"0": "r1"}, {}]),
        lambda: [],
        lambda: rng.choice([[None], [1], [True], [["r1"]], [{"id": "r1"}], [real[0], 2], [1e400]]),
        lambda: [""] if rng.random() < 0.5 else [real[0], ""],
        lambda: [f"r{i}" for i in range(rng.choice([MAX_ROLLOUT_IDS + 1, 1000, 20_000]))],  # too many
        lambda: [rng.choice(real)] * (MAX_ROLLOUT_IDS + 1),  # too many, all the same
        lambda: [
            rng.choice(
                [
                    "x" * (MAX_ROLLOUT_ID_BYTES + 1),
                    "é" * (MAX_ROLLOUT_ID_BYTES // 2 + 1),
                    "\U0001f600" * (MAX_ROLLOUT_ID_BYTES // 4 + 1),
                    "y" * rng.choice([10_000, 200_000]),
                ]
            )
        ],
        lambda: [rng.choice(["\ud800", "a\udfff", "\ud83d"])],  # lone surrogates: JSON can say them, UTF-8 cannot
    ]
    if rng.random() < 0.5:
        return rng.choice(valid)(), True
    return rng.choice(invalid)(), False


_NARROW_READS = [
    "SELECT count(DISTINCT rollout_id) AS rollouts, count(*) AS spans FROM spans",
    "SELECT rollout_id, task_id, llm_calls, reward FROM rollouts ORDER BY rollout_id",
    "SELECT count(*) FROM llm_calls",
    "SELECT count(*) FROM merge_diagnostics",
    "SELECT name, rollout_id FROM spans_raw ORDER BY name LIMIT 50",
]


def rollout_ids_query(rng: random.Random, paths: Paths, n: int, known: Sequence[str] = ()) -> Query:
    """POST /v1/query with `rollout_ids`: an odd or valid value beside a plain read (a 200 when the
    value is valid) or a write-or-peek statement (whatever the value, nothing may be written), or a raw
    body that says the field oddly. An invalid value is a 400 before any SQL runs."""
    value, valid = rollout_ids_value(rng, paths, n, known)
    in_id = f"{paths.canary}/written-{n}.csv"  # what an id that smuggles a COPY would write
    pick = rng.random()
    if pick < 0.1:
        real = json.dumps((list(known) or ["r1"])[:1]).encode()
        body = rng.choice(
            [
                b'{"sql": "SELECT 1", "rollout_ids": ' + real + b', "rollout_ids": 5}',  # the last one counts
                b'{"rollout_ids": ' + real + b"}",  # no sql
                b'{"sql": "SELECT 1", "rollout_ids": NaN}',
                b'{"sql": "SELECT 1", "rollout_ids": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
                b'{"sql": "SELECT 1", "rollout_ids": ["\\ud800"]}',
                b'{"sql": "SELECT 1", "rollout_ids": "' + b"r" * 5000 + b'"}',
            ]
        )
        return Query("rollouts-raw-body", None, body=body, allowed=frozenset({400}))
    plain = frozenset({200 if valid else 400})
    if pick < 0.2:  # a file by its host path: the narrowed views' connection must read no more than the sandbox
        source = rng.choice(
            [f"{paths.canary}/secret.txt", paths.part_file, f"{paths.spans}/**/*.parquet", "/etc/passwd"]
        )
        reader = rng.choice(["read_text", "read_blob", "read_parquet", "read_csv", "glob"])
        sql = f"SELECT * FROM {reader}('{source}')"
        return Query("rollouts-read-outside", sql, targets=(in_id,), rollout_ids=value, allowed=frozenset({400}))
    if pick < 0.5:
        return Query("rollouts-read", rng.choice(_NARROW_READS), targets=(in_id,), rollout_ids=value, allowed=plain)
    query = write_or_peek_query(rng, paths, n)
    if query.sql is None:  # an odd body of its own: the field goes with a plain statement instead
        return Query("rollouts-read", "SELECT 1", targets=(in_id,), rollout_ids=value, allowed=plain)
    query.kind = "rollouts-" + query.kind
    query.targets += (in_id,)
    query.rollout_ids = value
    query.allowed = None if valid else frozenset({400})
    return query
