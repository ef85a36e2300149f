#!/usr/bin/env bash
# Build the four DeepInfer wheels into dist/, then install deepinfer-core,
# deepinfer-models and the platform plugin named by DEEPINFER_ACCELERATOR into
# the current Python environment (the active venv, or $PYTHON).
#
#   ./build.sh                               # cpu (default): core + models, no plugin
#   DEEPINFER_ACCELERATOR=nvidia ./build.sh  # + deepinfer-nvidia (torch/triton: your CUDA build)
#   DEEPINFER_ACCELERATOR=ascend ./build.sh  # + deepinfer-ascend (torch_npu: from your CANN install)
#
# Optional environment:
#   PYTHON=/path/to/python       interpreter of the environment to install into
#   DEEPINFER_EXTRAS=structured  extras of deepinfer-core to install (comma separated)
#   DEEPINFER_PIP_ARGS=--no-deps extra arguments for the install step (e.g. offline hosts)
#   DEEPINFER_BUILD_ONLY=1       build dist/ and stop
#
# Wheels are built from a staged copy of each package directory, so the
# working tree gets no build/ or *.egg-info litter.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$ROOT"

ACCEL="${DEEPINFER_ACCELERATOR:-cpu}"
case "$ACCEL" in
  cpu | nvidia | ascend) ;;
  *)
    echo "build.sh: DEEPINFER_ACCELERATOR must be cpu, nvidia or ascend, got '$ACCEL'" >&2
    exit 2
    ;;
esac
if [ -n "${PYTHON:-}" ]; then
  PY="$PYTHON"
elif command -v python >/dev/null 2>&1; then
  PY=python
else
  PY=python3
fi
read -r -a PIP_ARGS <<<"${DEEPINFER_PIP_ARGS:-}"
PACKAGES=(deepinfer_core deepinfer_models deepinfer_nvidia deepinfer_ascend)

pip_() { "$PY" -m pip "$@"; }

# torch before anything asks for it: a bare `torch` requirement on a machine
# without torch pulls a multi-GB CUDA build, which a cpu install must not.
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  if [ "$ACCEL" = cpu ] && [ -z "${DEEPINFER_BUILD_ONLY:-}" ]; then
    echo "build.sh: torch missing; installing the CPU build torch==2.13.0"
    pip_ install "${PIP_ARGS[@]}" "torch==2.13.0"
  fi
fi
# Wheels are built without build isolation (no index needed), so the
# environment itself must have the build backend.
if ! "$PY" -c "import setuptools, sys; sys.exit(int(setuptools.__version__.split('.')[0]) < 68)" >/dev/null 2>&1; then
  pip_ install "setuptools>=68"
fi

for pkg in "${PACKAGES[@]}"; do
  if [ ! -f "$pkg/__init__.py" ]; then
    echo "build.sh: $pkg/__init__.py is missing; setuptools would build an empty $pkg wheel" >&2
    exit 1
  fi
done

STAGE="$(mktemp -d)"
trap 'rm -rf "$STAGE"' EXIT
for pkg in "${PACKAGES[@]}"; do
  # Each pyproject finds its package one level up (where = [".."]): stage the
  # package dirs side by side, without caches, old builds or device tests.
  tar -C "$ROOT" --exclude=__pycache__ --exclude='*.egg-info' --exclude="$pkg/build" \
    --exclude="$pkg/dist" --exclude="$pkg/tests" -cf - "$pkg" | tar -C "$STAGE" -xf -
done

mkdir -p dist
rm -f dist/deepinfer_core-*.whl dist/deepinfer_models-*.whl dist/deepinfer_nvidia-*.whl dist/deepinfer_ascend-*.whl
pip_ wheel --no-deps --no-build-isolation --no-index --wheel-dir "$ROOT/dist" \
  "$STAGE/deepinfer_core" "$STAGE/deepinfer_models" "$STAGE/deepinfer_nvidia" "$STAGE/deepinfer_ascend"
ls -1 dist/deepinfer_*.whl

if [ -n "${DEEPINFER_BUILD_ONLY:-}" ]; then
  exit 0
fi

wheel_of() { ls -1 "dist/$1"-*.whl | head -n 1; }
CORE="$(wheel_of deepinfer_core)"
if [ -n "${DEEPINFER_EXTRAS:-}" ]; then
  CORE="$CORE[$DEEPINFER_EXTRAS]"
fi
WHEELS=("$CORE" "$(wheel_of deepinfer_models)")
case "$ACCEL" in
  nvidia) WHEELS+=("$(wheel_of deepinfer_nvidia)") ;;
  ascend) WHEELS+=("$(wheel_of deepinfer_ascend)") ;;
esac

# First pass resolves dependencies; the second replaces an installed copy of
# the same version, which pip would otherwise keep.
pip_ install "${PIP_ARGS[@]}" "${WHEELS[@]}"
pip_ install --no-deps --force-reinstall "${WHEELS[@]}"

# Smoke check from an empty folder, so the installed copies are used.
mkdir "$STAGE/smoke"
cd "$STAGE/smoke"
DEEPINFER_ACCELERATOR="$ACCEL" "$PY" - <<'EOF'
import os
from importlib.metadata import version

import deepinfer_core
import deepinfer_models
from deepinfer_core.platform.loader import installed_platforms

accel = os.environ["DEEPINFER_ACCELERATOR"]
platforms = installed_platforms()
if accel not in platforms:
    raise SystemExit(f"build.sh: platform {accel!r} is not among the installed platforms {sorted(platforms)}")
print(f"deepinfer-core {version('deepinfer-core')} at {os.path.dirname(deepinfer_core.__file__)}")
print(f"deepinfer-models {version('deepinfer-models')}")
print(f"installed platforms: {', '.join(sorted(platforms))}; selected by DEEPINFER_ACCELERATOR: {accel}")
EOF
