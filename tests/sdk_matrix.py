"""The agent side's SDK version matrix: token ids still captured with the oldest and the newest
supported `openai` and `opentelemetry-sdk` (instrument/pyproject.toml, docs/agent-side.md).

    python tests/sdk_matrix.py          (`make test` runs it after the suite)

The newest are what `make setup` installed (the latest releases in range when .venv was made; CI
makes it fresh). The oldest are installed with `pip install --target` into overlay folders put first
on PYTHONPATH (cached in ~/.cache/lightning-otel-sdk-matrix; the first run downloads ~10 MB), and
tests/instrument/test_capture_across_sdks.py runs under each of the four pairs. Exits non-zero on any failure.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "lightning-otel-sdk-matrix"
# The oldest supported minors, each at its last patch: openai 2.8 is the oldest OpenInference's OpenAI
# instrumentor accepts; opentelemetry-sdk 1.30 is core/pyproject.toml's floor (with the packages
# released with it, and the one dependency it had that later releases dropped).
OLDEST = {
    "openai": ["openai==2.8.1"],
    "opentelemetry-sdk": [
        "opentelemetry-api==1.30.0",
        "opentelemetry-sdk==1.30.0",
        "opentelemetry-semantic-conventions==0.51b0",
        "opentelemetry-exporter-otlp-proto-http==1.30.0",
        "opentelemetry-exporter-otlp-proto-common==1.30.0",
        "opentelemetry-proto==1.30.0",
        "opentelemetry-instrumentation==0.51b0",
        "deprecated==1.2.18",
    ],
}


def overlay(name: str) -> Path:
    """A folder holding the oldest supported release of `name` (installed once, then reused)."""
    pins = hashlib.sha256(" ".join(OLDEST[name]).encode()).hexdigest()[:12]  # a new pin, a new folder
    target = CACHE / f"{name}-{pins}"
    if not (target / ".complete").exists():
        command = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-cache-dir", "--target", str(target)]
        subprocess.run([*command, *OLDEST[name]], check=True)
        (target / ".complete").touch()
    return target


def main() -> int:
    began = time.perf_counter()
    old = {name: overlay(name) for name in OLDEST}
    pairs = {
        "oldest openai, oldest opentelemetry-sdk": [old["openai"], old["opentelemetry-sdk"]],
        "oldest openai, newest opentelemetry-sdk": [old["openai"]],
        "newest openai, oldest opentelemetry-sdk": [old["opentelemetry-sdk"]],
        "newest openai, newest opentelemetry-sdk": [],
    }
    failed = []
    for label, paths in pairs.items():
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([*map(str, paths), os.environ.get("PYTHONPATH", "")])}
        command = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-s",
            "-p",
            "no:cacheprovider",
            "tests/instrument/test_capture_across_sdks.py",
        ]
        print(f"--- {label}", flush=True)
        if subprocess.run(command, cwd=HERE.parent, env=env).returncode != 0:
            failed.append(label)
    print(f"sdk matrix: {len(pairs) - len(failed)}/{len(pairs)} pairs passed in {time.perf_counter() - began:.0f} s")
    for label in failed:
        print(f"FAILED: {label}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
