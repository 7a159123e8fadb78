"""Capture the dashboard screenshots in this folder from a real trace store.

    python docs/screenshots/capture.py --data-dir demo-runs/tool_use/traces --tokenizer demo-runs/tool_use/sft   # after make demo

Starts `lightning-otel dashboard` on a free loopback port, opens each view in Debian's Chromium
(Playwright drives it; no browser is downloaded) and writes overview.png, training.png,
rollouts.png, rollout.png (one rollout: span tree and messages) and tokens.png (its token view)
next to this file; the rollout is one with a failed merge.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from lightning_otel.collector import connect
from lightning_otel.core.servers import free_port, wait_http_ok
from lightning_otel.dashboards.browser import CHROMIUM, CHROMIUM_ARGS

HERE = Path(__file__).resolve().parent
VIEWPORT = {"width": 1400, "height": 900}


def failed_merge_rollout(data_dir: Path) -> str:
    """A rollout whose first failed boundary has the most calls around it: the richest token view."""
    row = (
        connect(data_dir)
        .execute("""
        SELECT d.rollout_id FROM merge_diagnostics d JOIN rollouts r USING (rollout_id)
        WHERE NOT d.merged ORDER BY r.llm_calls DESC, d.cause DESC, r.reward DESC NULLS LAST, d.rollout_id LIMIT 1""")
        .fetchone()
    )
    if row is None:
        raise SystemExit("no failed merge in this store: the token screenshot needs one")
    return row[0]


def capture(data_dir: Path, tokenizer: Path | None, out: Path) -> None:
    from playwright.sync_api import sync_playwright

    port = free_port()
    command = [sys.executable, "-m", "lightning_otel", "dashboard", "--data-dir", str(data_dir), "--port", str(port)]
    server = subprocess.Popen(command + (["--tokenizer", str(tokenizer)] if tokenizer else []))
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/health", 60, server, "dashboard")
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport=VIEWPORT)
            base = f"http://127.0.0.1:{port}/"

            def show(route: str, name: str, scroll_to: str = "") -> None:
                page.goto(base + route)
                page.wait_for_selector("#view[data-ready=true]", timeout=120_000)
                if scroll_to:
                    page.evaluate("id => document.getElementById(id).scrollIntoView()", scroll_to)
                page.screenshot(path=str(out / name))
                print(f"wrote {out / name}")

            show("#overview", "overview.png")
            show("#training", "training.png")
            show("#rollouts", "rollouts.png")
            rollout = failed_merge_rollout(data_dir)
            show(f"#rollout/{rollout}", "rollout.png")
            # The token view is below the timeline and the messages: scrolled to the top of the window.
            show(f"#rollout/{rollout}", "tokens.png", scroll_to="tokens")
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=Path("demo-runs/digit_sum/traces"), help="the demo's store")
    parser.add_argument(
        "--tokenizer", type=Path, default=Path("demo-runs/digit_sum/sft"), help="model folder with tokenizer.json"
    )
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args()
    capture(args.data_dir, args.tokenizer if args.tokenizer and args.tokenizer.exists() else None, args.out)


if __name__ == "__main__":
    main()
