"""The npm packages the tests run, pinned, and the one routine that installs them.

Each pin set is installed once into a cache folder named after a hash of its pins (and of whether
its install scripts run): ~/.cache/lightning-otel-npm/<hash>, or $LIGHTNING_OTEL_NPM_CACHE/<hash>.
A file lock keeps parallel sessions from installing into the same folder at once; a finished install
leaves `.installed`, so later runs need no network. `node` (>= 18.19) and `npm` must be on PATH:
without them the tests fail, they do not skip.

    python tests/npm_packages.py     installs every pin set (`make test` runs it before the tests)
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PinSet:
    packages: dict[str, str]
    scripts: bool  # run install scripts: only where a package needs them (third-party code runs)
    engine_strict: bool = False  # refuse a release whose `engines` excludes this Node


# The newest OpenTelemetry JS releases whose engines accept Node 18.19+/20 (the 0.30x exporters want
# Node >= 22.15); tests/collector/test_collector_js.py.
OPENTELEMETRY_JS = PinSet(
    {
        "@opentelemetry/api": "1.9.1",
        "@opentelemetry/sdk-trace-base": "2.12.1",
        "@opentelemetry/resources": "2.12.1",
        "@opentelemetry/exporter-trace-otlp-proto": "0.223.1",
        "@opentelemetry/exporter-trace-otlp-http": "0.223.1",
        "@opentelemetry/exporter-trace-otlp-grpc": "0.223.1",
    },
    scripts=False,
    engine_strict=True,
)
# tests/end_to_end/test_codex_cli.py: its platform binary comes as an optional dependency, no script needed.
CODEX = PinSet({"@openai/codex": "0.171.0"}, scripts=False)
# tests/end_to_end/test_claude_code.py: its postinstall script puts the platform's native binary in place
# of a stub (installed with --ignore-scripts, `claude` fails with "Exec format error").
CLAUDE_CODE = PinSet({"@anthropic-ai/claude-code": "2.1.332"}, scripts=True)
ALL = {"opentelemetry-js": OPENTELEMETRY_JS, "codex": CODEX, "claude-code": CLAUDE_CODE}


def cache_root() -> Path:
    return Path(os.environ.get("LIGHTNING_OTEL_NPM_CACHE") or Path.home() / ".cache" / "lightning-otel-npm")


def folder_of(pins: PinSet) -> Path:
    described = {**pins.packages, **({"scripts": True} if pins.scripts else {})}
    return cache_root() / hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:16]


def install(pins: PinSet) -> Path:
    """The pin set's node_modules folder, installed first if it is not yet (once per pin set)."""
    for tool in ("node", "npm"):
        if not shutil.which(tool):
            raise RuntimeError(f"{tool} not found: install Node.js >= 18.19 with npm (`make node`)")
    folder = folder_of(pins)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / ".installed").exists():
            specs = [f"{name}@{version}" for name, version in pins.packages.items()]
            flags = ["--no-audit", "--no-fund", "--no-save", "--prefix", str(folder)]
            flags += [] if pins.scripts else ["--ignore-scripts"]
            flags += ["--engine-strict"] if pins.engine_strict else []
            result = subprocess.run(["npm", "install", *flags, *specs], capture_output=True, text=True, timeout=600)
            if result.returncode != 0:
                raise RuntimeError(f"npm install {' '.join(specs)} failed:\n{result.stdout}\n{result.stderr}")
            (folder / ".installed").write_text("\n".join(specs) + "\n")
    return folder / "node_modules"


if __name__ == "__main__":
    for name, pins in ALL.items():
        print(f"npm packages {name}: {install(pins)}", file=sys.stderr)
