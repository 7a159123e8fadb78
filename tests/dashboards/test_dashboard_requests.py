"""What the dashboard's page and server exchange, against the store of a real digit-sum run: a
read-only query endpoint, a query token the page carries, no request outside 127.0.0.1, a server
module that imports only the standard library, and `rollout_ids` on the rollout page's queries (its
files, not the store), the other pages without.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.error
import urllib.request
from urllib.parse import quote, urlsplit

import pytest
from web_page import RENDERED, TIMEOUT_MS, WEB_DIR, Dashboard, open_view, value_of

from lightning_otel.collector import connect
from lightning_otel.collector.query_limits import MAX_ROLLOUT_ID_BYTES

pytestmark = pytest.mark.integration


def test_query_endpoint_is_read_only(dashboard, store):
    status, reply = dashboard.post("v1/query", {"sql": "SELECT count(*) AS n FROM llm_calls"})
    assert status == 200 and reply == {
        "columns": ["n"],
        "rows": [[store.execute("SELECT count(*) FROM llm_calls").fetchone()[0]]],
        "truncated": False,
    }
    for statement in (
        "DELETE FROM spans",
        "CREATE TABLE t AS SELECT 1",
        "COPY (SELECT 1) TO '/tmp/x.csv'",
        "SELECT 1; SELECT 2",
        "SELECT * FROM read_text('/etc/passwd')",
        "INSTALL httpfs",
    ):
        status, reply = dashboard.post("v1/query", {"sql": statement})
        assert status == 400 and reply["error"], statement
    # A cross-site form post cannot send JSON: anything else is refused before the SQL runs.
    assert dashboard.post("v1/query", {"sql": "SELECT 1"}, content_type="text/plain")[0] == 415


def test_query_token_guards_the_endpoints_and_the_page_uses_it(browser, demo_run):
    with Dashboard(demo_run.data_dir, query_token="s3cret") as server:
        assert server.post("v1/query", {"sql": "SELECT 1"})[0] == 401
        assert server.post("v1/query", {"sql": "SELECT 1"}, token="wrong")[0] == 401
        assert server.post("v1/query", {"sql": "SELECT 1 AS one"}, token="s3cret") == (
            200,
            {"columns": ["one"], "rows": [[1]], "truncated": False},
        )
        assert server.post("v1/detokenize", {"ids": [1]}, token="s3cret")[0] == 404  # started without --tokenizer
        context = browser.new_context()
        try:
            page = context.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            page.goto(server.url + "?token=s3cret#overview")
            page.wait_for_function(RENDERED)
            assert "token" not in page.url  # kept for the tab, taken out of the address
            calls = connect(demo_run.data_dir).execute("SELECT count(*) FROM llm_calls").fetchone()[0]
            assert int(value_of(page, "kpi-llm-calls")) == calls
        finally:
            context.close()


def test_the_page_makes_no_request_outside_loopback(page, dashboard, store):
    rollout_id = store.execute(
        "SELECT rollout_id FROM rollouts ORDER BY llm_calls DESC, rollout_id LIMIT 1"
    ).fetchone()[0]
    for route in ("#overview", "#training", "#rollouts", f"#rollout/{rollout_id}"):
        open_view(page, dashboard.url + route)
    assert len(page.requests) > 10
    outside = [
        url for url in page.requests if urlsplit(url).hostname != "127.0.0.1" or urlsplit(url).port != dashboard.port
    ]
    assert outside == []
    with urllib.request.urlopen(dashboard.url) as reply:
        assert "default-src 'none'" in reply.headers["Content-Security-Policy"]


def test_server_module_imports_only_the_standard_library():
    code = (
        "import sys, lightning_otel.dashboards.server as s; import argparse; "
        "p = argparse.ArgumentParser(); s.add_parser(p.add_subparsers(), 'd'); "
        "print(sorted(m for m in ('duckdb', 'tokenizers', 'pyarrow') if m in sys.modules))"
    )
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"
    )


def _query_bodies(page) -> list[dict]:
    """The JSON bodies the page posts to v1/query from now on (the list fills as it runs)."""
    bodies: list[dict] = []
    page.on(
        "request",
        lambda request: (
            bodies.append(json.loads(request.post_data or "{}"))
            if request.method == "POST" and urlsplit(request.url).path.endswith("/v1/query")
            else None
        ),
    )
    return bodies


def test_the_rollout_page_narrows_its_queries_to_the_rollout(page, dashboard, store):
    """The rollout page sends `rollout_ids: [id]` with its queries about the rollout, its spans, its
    calls and its merge diagnostics (the server then reads only the files that can hold them); every
    other page reads the whole store."""
    rollout_id = store.execute(
        "SELECT rollout_id FROM rollouts ORDER BY llm_calls DESC, rollout_id LIMIT 1"
    ).fetchone()[0]
    bodies = _query_bodies(page)
    for route in ("#overview", "#training", "#rollouts"):
        open_view(page, dashboard.url + route)
    assert len(bodies) > 5 and [b for b in bodies if "rollout_ids" in b] == []
    bodies.clear()
    open_view(page, dashboard.url + f"#rollout/{quote(rollout_id)}")
    narrowed = [b["sql"] for b in bodies if b.get("rollout_ids") == [rollout_id]]
    whole = [b["sql"] for b in bodies if "rollout_ids" not in b]
    assert len(narrowed) + len(whole) == len(bodies)
    assert sorted(re.search(r"\bFROM (\w+)", sql)[1] for sql in narrowed) == [
        "llm_calls",
        "merge_diagnostics",
        "rollouts",
        "spans",
    ]
    assert whole == []
    # An id over the server's cap, or none, is looked up over the whole store (a narrowed one would be a 400).
    for odd in ("x" * (MAX_ROLLOUT_ID_BYTES + 1), ""):
        bodies.clear()
        open_view(page, dashboard.url + f"#rollout/{odd}")
        assert "No rollout" in page.inner_text("#view") and len(bodies) == 4
        assert [b for b in bodies if "rollout_ids" in b] == []


def test_the_page_and_the_server_agree_on_the_rollout_id_cap():
    rollout_js = (WEB_DIR / "rollout.js").read_text()
    assert re.search(r"const MAX_ROLLOUT_ID_BYTES = (\d+);", rollout_js)[1] == str(MAX_ROLLOUT_ID_BYTES)
