"""The dashboard tests' fixtures: the store and dashboard of a real digit-sum run (`demo_run`), Debian's
Chromium driven by Playwright, and a page that records its requests and fails on a script error."""

from __future__ import annotations

from pathlib import Path

import pytest
from web_page import TIMEOUT_MS, Dashboard

from lightning_otel.collector import connect
from lightning_otel.dashboards.browser import CHROMIUM, CHROMIUM_ARGS


@pytest.fixture(scope="module")
def store(demo_run):
    return connect(demo_run.data_dir)


@pytest.fixture(scope="module")
def dashboard(demo_run):
    with Dashboard(demo_run.data_dir, tokenizer=demo_run.model_dir) as server:
        yield server


@pytest.fixture(scope="module")
def browser():
    from playwright import sync_api  # the dev extra

    # `make test` installs Debian's chromium; without it these tests fail, they do not skip.
    assert Path(CHROMIUM).exists(), f"no {CHROMIUM}: apt-get install chromium (`make test` does)"
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture
def page(browser):
    """A fresh page that records every request it makes; a script error fails the test."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    new_page = context.new_page()
    new_page.set_default_timeout(TIMEOUT_MS)
    new_page.requests, new_page.errors = [], []
    new_page.on("request", lambda request: new_page.requests.append(request.url))
    new_page.on("pageerror", lambda error: new_page.errors.append(str(error)))
    yield new_page
    context.close()
    assert new_page.errors == []
