"""The `integration` marker, applied by the suite itself (no test has to remember it).

A test is integration when it starts a server or another process: its module (the test or a helper
in it), or any fixture it uses (followed through fixtures that use fixtures), calls a launcher. `make test-unit` runs
`pytest -m "not integration"`, so a test this misses would slip a server into the fast run: a test
left unmarked is therefore run with listening sockets and process spawns refused, and fails with a
message naming the launcher to add to LAUNCHERS below.
"""

from __future__ import annotations

import inspect
import re
import socket
import subprocess

import pytest

# Calls that start a server or a process, as they are spelled in tests and fixtures.
LAUNCHERS = re.compile(
    r"\b(CollectorProcess|GatewayProcess|VLLMServer|Popen|subprocess\.(run|check_call|check_output|call)"
    r"|AppRunner|TCPSite|HTTPServer|ThreadingHTTPServer|serve_forever|grpc\.(aio\.)?server|torchrun"
    r"|start_gateway|start_collector|StallServer|TcpProxy|run_example|run_demo|moto_server|ThreadedMotoServer"
    r"|launch_workers|chromium|sync_playwright|local_collector|AgentProcess|ask_agent|run_script)\b"
)


def _source(function) -> str:
    try:
        return inspect.getsource(function)
    except (OSError, TypeError):
        return ""


def starts_a_server(item: pytest.Item) -> bool:
    # The test's whole module: a launcher called from one of its helper functions counts.
    module = getattr(item, "module", None)
    if module is not None and LAUNCHERS.search(_source(module)):
        return True
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    for name in info.names_closure:
        for definition in info.name2fixturedefs.get(name, ()):
            if definition.func.__module__ == __name__:
                continue  # the guard below names what it refuses
            if LAUNCHERS.search(_source(definition.func)):
                return True
    return False


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("integration") is None and starts_a_server(item):
            item.add_marker(pytest.mark.integration)


def _refuse(what: str):
    def refused(*_args, **_kwargs):
        raise RuntimeError(
            f"a test without the integration marker {what}: add the launcher it calls to LAUNCHERS in "
            "tests/integration_marker.py so the marker follows it"
        )

    return refused


@pytest.fixture(autouse=True)
def _unit_tests_start_nothing(request, monkeypatch):
    if request.node.get_closest_marker("integration") is None:
        monkeypatch.setattr(socket.socket, "listen", _refuse("listened on a socket"))
        monkeypatch.setattr(subprocess.Popen, "__init__", _refuse("started a process"))
    yield
