#!/usr/bin/env bash
# One measured RL run on a lent GPU machine (training/rl/measured_run.py with
# training/recipes/rl_gpu.toml): check the image, install the carried wheels and bubblewrap, run,
# and write result.json, the curves, metrics and the log to $OUT (else runs/rl-gpu).
#
#   make rl-gpu MODEL=/path/to/model-folder [DEVICE=cuda] [UNCONFINED=1] [RL_GPU_ARGS="--set eval_tasks=16"]
#   bash training/rl/gpu_run.sh MODEL_DIR [measured_run arguments ...]
#
# How the model folder reaches the machine is the caller's choice (this script takes its path).
# Carry .whl (made by `make rl-gpu-wheels`): the packages the image lacks and bubblewrap's
# Debian package. Checkpoints stay in $RL_GPU_WORK (default /tmp/flywheel-rl-gpu), not in $OUT.
# UNCONFINED=1: no sandbox for the agent's commands (a throwaway machine without bubblewrap).
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=${1:?usage: training/rl/gpu_run.sh MODEL_DIR [measured_run arguments ...]}
shift
PY=${PY:-python3}
WHEELS=${WHEELS:-.whl}
DEVICE=${DEVICE:-cuda}
OUT_DIR=${OUT:-runs/rl-gpu}
WORK=${RL_GPU_WORK:-/tmp/flywheel-rl-gpu}
SITE=/tmp/flywheel-site
check=(--wheels "$WHEELS" --device "$DEVICE")
extra=()
if [ "${UNCONFINED:-0}" = 1 ]; then
  check+=(--unconfined)
  extra+=(--set unconfined_commands=true)
fi

echo "== the image"
"$PY" training/rl/gpu_image.py "${check[@]}"

if compgen -G "$WHEELS/*.whl" >/dev/null; then
  echo "== installing $(ls "$WHEELS"/*.whl | wc -l) carried wheels into $SITE"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "$WHEELS"/*.whl
  export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
if ! command -v bwrap >/dev/null && compgen -G "$WHEELS/bubblewrap_*.deb" >/dev/null; then
  echo "== unpacking the carried bubblewrap"
  dpkg -x "$WHEELS"/bubblewrap_*.deb /tmp/flywheel-bwrap
  export PATH="/tmp/flywheel-bwrap/usr/bin:$PATH"
fi
"$PY" -c "import training.rl.measured_run, agent.harness" || {
  echo "error: the project does not import with the carried wheels (above): run make rl-gpu-wheels again"
  exit 1
}
echo "== the sandbox (a command run the way rollouts run theirs)"
UNCONFINED=${UNCONFINED:-0} "$PY" -c "
import os, sys
from training.rl.environments import HarnessEnv
why = HarnessEnv('-', unconfined=os.environ['UNCONFINED'] == '1').ready()
print(f'error: {why}; here: make rl-gpu UNCONFINED=1' if why else 'ok')
sys.exit(1 if why else 0)"

echo "== the run (results: $OUT_DIR, checkpoints: $WORK)"
mkdir -p "$OUT_DIR"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version \
  --format=csv,noheader >"$OUT_DIR/gpu.txt" || true
PYTHONUNBUFFERED=1 "$PY" -m training.rl.measured_run --model "$MODEL" --out "$OUT_DIR" \
  --work "$WORK" --device "$DEVICE" "${extra[@]}" "$@"
