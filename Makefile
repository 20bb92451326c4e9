# ddpdoctor: every target sets itself up in .venv, so each one works on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# A CPU build of torch by default: never pull multi-GB CUDA wheels in CI.
# On a GPU node: make check TORCH_SPEC=torch TORCH_INDEX=https://download.pytorch.org/whl/cu124
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
PYTEST_ARGS ?=

.PHONY: setup check test test-fake-gpu lint bench docs clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# Where torch is missing, the index is probed once (5 s) before pip, which would otherwise retry an
# unreachable index for minutes; numpy comes with torch (without it every torch import warns).
setup: $(PY)
	@$(PY) -c "import torch" 2>/dev/null || { \
	  $(if $(TORCH_INDEX),$(PY) bench/probe_index.py "$(TORCH_INDEX)" &&) \
	  $(PY) -m pip install $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) "$(TORCH_SPEC)" numpy; }
	$(PY) -m pip install -q -e ".[test]"

check: setup
	$(VENV)/bin/ddpdoctor check

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

# The suite as if this machine had a GPU (faked at the I/O edge, see tests/fake_gpu/): finds tests that
# assume there is none. torch stays CPU-only, so anything that really launches NCCL fails.
test-fake-gpu: setup
	$(PY) -m pytest --fake-gpu $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check ddpdoctor tests bench

docs: setup
	$(PY) -m ddpdoctor.dev.docgen

bench: setup
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
