"""Which tests share a pytest-xdist worker (`make test` runs `pytest -n 2 --dist loadgroup`).

Each worker is its own pytest session, so a session fixture is built once per worker that runs a test
using it. Grouping keeps the costly ones to one worker: every test using `demo_run` (a whole training
run, ~1.5 min) in one group, every test on the 32k-context vLLM (`long_context_vllm`) in another, and
otherwise one group per test file, so a module's fixtures (a gateway, a collector) start once.
`vllm_server` (~30 s to start) is the one session fixture both workers build.
"""

from __future__ import annotations

import pytest

# Session fixtures too costly to build on both workers: the group that holds every test using each.
_SHARED_FIXTURES = {"demo_run": "demo_run", "long_context_vllm": "long_context_vllm"}


def worker_group(item: pytest.Item) -> str:
    names = set(getattr(item, "fixturenames", ()))
    for fixture, group in _SHARED_FIXTURES.items():
        if fixture in names:
            return group
    return item.nodeid.split("::", 1)[0]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(worker_group(item)))
