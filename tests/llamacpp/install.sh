#!/usr/bin/env bash
# Build llama-cpp-python into its own virtual environment: the llama.cpp peer of
# `flywheel bench engine --peers llamacpp` (benchmarks/engine/peers.py).
#
# llama-cpp-python compiles llama.cpp from its source distribution (several minutes on 2 cores).
# The default native build (-march=native) crashed in decode on one of this project's machines
# (AVX-512, AMX), so it is built without -march=native and without AMX: AVX2, plus AVX-512 and
# its VNNI, BF16 and VBMI extensions (and AVX-VNNI) where this CPU has them. A build for another
# CPU dies with SIGILL on import (this project's machines differ), so the check below imports it
# and rebuilds when that fails, or when it was built with other flags than this CPU gets.
#
# The environment also keeps llama.cpp's `convert_hf_to_gguf.py` (with its `conversion/` package
# and `gguf-py`) from the same source, under VENV/share/llama.cpp, to export merged checkpoints to
# GGUF, and what it needs: torch (the local CPU wheel), transformers 5 (Flywheel's checkpoints
# name transformers 5's tokenizer class) and sentencepiece (imported even for BPE tokenizers).
#
# Idempotent: a working environment (CI may cache ~/.cache/flywheel/venv-llamacpp) is reused, a
# broken one rebuilt. Nothing of this repository is installed into it: the peer runner is a
# standalone script.
#
# Run:  bash tests/llamacpp/install.sh [VENV_DIR]   (default: ~/.cache/flywheel/venv-llamacpp)
# Then: flywheel bench engine --peers hf,llamacpp ...
set -euo pipefail

VENV="${1:-$HOME/.cache/flywheel/venv-llamacpp}"
PY_BOOT="${PY:-python3}"
PY="$VENV/bin/python"
PIN="llama-cpp-python==0.3.36"
SDIST="llama_cpp_python-0.3.36"
SHARE="$VENV/share/llama.cpp"
CONVERTER_DEPS=(torch==2.13.0 "transformers>=5,<6" "sentencepiece>=0.1.98,<0.3")
# Every other extension this CPU has that ggml's CPU kernels use is switched on: without VNNI
# its 4-bit dot products take the slower AVX2/AVX-512 path, and the peer would be handicapped.
FLAGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
for flag in avx512f:AVX512 avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16 \
    avx512vbmi:AVX512_VBMI avx_vnni:AVX_VNNI; do
    if grep -qw "${flag%%:*}" /proc/cpuinfo 2>/dev/null; then
        FLAGS+=" -DGGML_${flag#*:}=ON"
    else
        FLAGS+=" -DGGML_${flag#*:}=OFF"
    fi
done
FLAGS+=" -DGGML_AMX_INT8=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_BF16=OFF -DLLAVA_BUILD=OFF"
export CMAKE_ARGS="${CMAKE_ARGS:-$FLAGS}"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"

NAME=llamacpp
# shellcheck source=../install_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../install_common.sh"

# In a subshell whose stderr is dropped: a build for another CPU dies of SIGILL, and the shell's
# own "Illegal instruction" report would otherwise read like a failure of this script.
llamacpp_works() {
    [ -x "$PY" ] && [ -f "$SHARE/convert_hf_to_gguf.py" ] &&
        [ "$(cat "$VENV/cmake-args" 2>/dev/null)" = "$CMAKE_ARGS" ] && (
        "$PY" - <<'EOF'
import llama_cpp
from llama_cpp.llama_speculative import LlamaPromptLookupDecoding  # noqa: F401
assert llama_cpp.__version__ == "0.3.36", llama_cpp.__version__
llama_cpp.llama_backend_init()
EOF
        exit $? # not the subshell's last command, so it waits (and reports) itself
    ) >/dev/null 2>&1
}

converter_works() {
    "$PY" -c 'import sentencepiece, torch, transformers; assert transformers.__version__ >= "5"' \
        >/dev/null 2>&1
}

build() {
    if [ -d "$VENV" ]; then
        say "environment $VENV is missing llama_cpp, broken or built with other flags: rebuilding it"
        rm -rf "$VENV"
    fi
    say "creating $VENV with $("$PY_BOOT" --version 2>&1)"
    mkdir -p "$(dirname "$VENV")"
    "$PY_BOOT" -m venv "$VENV" || fail "could not create a virtual environment with $PY_BOOT"
    pip_ install --quiet --upgrade pip || fail "could not upgrade pip in $VENV"

    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    say "downloading the $PIN source distribution"
    pip_ download --quiet --no-deps --no-binary :all: "$PIN" -d "$work" ||
        fail "pip download $PIN failed (see pip's output above)"
    # From the local file, so pip's wheel cache never hands back a build with other CMAKE_ARGS.
    say "building $PIN (several minutes) with CMAKE_ARGS=$CMAKE_ARGS"
    pip_ install --quiet "$work/$SDIST.tar.gz" || fail "building $PIN failed (see pip's output)"

    say "keeping llama.cpp's HF -> GGUF converter in $SHARE"
    tar -xzf "$work/$SDIST.tar.gz" -C "$work" \
        "$SDIST/vendor/llama.cpp/convert_hf_to_gguf.py" \
        "$SDIST/vendor/llama.cpp/conversion" \
        "$SDIST/vendor/llama.cpp/gguf-py" \
        "$SDIST/vendor/llama.cpp/LICENSE" || fail "the source distribution has no converter"
    mkdir -p "$SHARE"
    cp -r "$work/$SDIST/vendor/llama.cpp/." "$SHARE/"
    echo "$CMAKE_ARGS" >"$VENV/cmake-args"
    llamacpp_works || fail "the built environment cannot import llama_cpp"
}

start=$(date +%s)
if llamacpp_works; then
    say "reusing working environment $VENV"
else
    build
fi
if ! converter_works; then
    say "installing ${CONVERTER_DEPS[*]} for the converter"
    pip_ install --quiet "${CONVERTER_DEPS[@]}" || fail "pip install ${CONVERTER_DEPS[*]} failed"
    converter_works || fail "the converter's dependencies do not import (see above)"
fi
say "ok: $("$PY" -c 'import llama_cpp; print("llama_cpp", llama_cpp.__version__)')"
say "done in $(($(date +%s) - start)) s"
